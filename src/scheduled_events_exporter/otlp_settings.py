"""Where and how each OTLP signal is sent: the standard ``OTEL_EXPORTER_OTLP_*`` variables.

The OTLP route sends its own requests (:mod:`.sinks.otlp_transport`), so these variables are
read here, once, as the OpenTelemetry specification and the Python SDK read them:

* a per-signal variable (``OTEL_EXPORTER_OTLP_LOGS_*``, ``..._METRICS_*``) wins over the
  general one;
* ``..._ENDPOINT``: over http/protobuf the general endpoint is a base URL to which
  ``/v1/logs`` or ``/v1/metrics`` is appended, a per-signal one is the full URL; over gRPC
  only the host and port count (``https://`` turns TLS on, ``http://`` off, no scheme:
  ``..._INSECURE`` decides), or a target in gRPC's own naming (``unix:``, ``unix://``,
  ``dns:``, ``ipv4:``, ``ipv6:``, ``unix-abstract:``), passed to the gRPC client as written
  (``..._INSECURE`` decides TLS);
* ``..._HEADERS``: ``key=value`` pairs separated by commas, in the W3C Baggage form the
  specification names: a key is an HTTP token, a value is percent-decoded and must then be
  printable ASCII (no control character: it becomes an HTTP header or gRPC metadata value);
* ``..._TIMEOUT``: seconds, as the Python SDK reads it (the specification says milliseconds;
  a value of 1000 or more is refused with a line saying it looks like milliseconds);
* ``..._COMPRESSION``: ``gzip`` or ``none``; ``..._CERTIFICATE``, ``..._CLIENT_KEY``,
  ``..._CLIENT_CERTIFICATE``: PEM files for TLS;
* ``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE``: ``cumulative`` (default), ``delta`` or
  ``lowmemory``;
* ``OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION``: ``explicit_bucket_histogram``
  (default: the exporter's advised bucket boundaries) or ``base2_exponential_bucket_histogram``.

Pure: a mapping of variables in, values or one problem line per variable out (and warnings
about endpoints that look like a mix-up). :data:`.config.SETTINGS` has a row for each variable
read here, and no parser for it: these are checked here alone.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final
from urllib.parse import unquote, urlsplit

PROTOCOLS: Final = ("http/protobuf", "grpc")
SIGNALS: Final = ("logs", "metrics")
COMPRESSIONS: Final = ("gzip", "none")
TEMPORALITIES: Final = ("cumulative", "delta", "lowmemory")
HISTOGRAM_AGGREGATIONS: Final = ("explicit_bucket_histogram", "base2_exponential_bucket_histogram")
DEFAULT_TIMEOUT: Final = 10.0
_DEFAULT_ENDPOINT = {"http/protobuf": "http://localhost:4318", "grpc": "http://localhost:4317"}
#: gRPC name-resolver schemes (gRPC's doc/naming.md): such a target goes to the client as is.
GRPC_SCHEMES: Final = ("unix", "unix-abstract", "dns", "ipv4", "ipv6")
#: RFC 9110 ``tchar``: what a header name (and a W3C Baggage key) is made of.
_TCHAR: Final = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz"
                          "ABCDEFGHIJKLMNOPQRSTUVWXYZ")


@dataclass(frozen=True, slots=True)
class OtlpTarget:
    """Where one signal goes and how."""

    signal: str
    protocol: str = "http/protobuf"
    #: http/protobuf: the full URL of the signal; gRPC: the URL whose host and port count.
    endpoint: str = "http://localhost:4318/v1/logs"
    headers: tuple[tuple[str, str], ...] = ()
    timeout: float = DEFAULT_TIMEOUT
    gzip: bool = False
    certificate: str = ""
    client_key: str = ""
    client_certificate: str = ""
    #: gRPC: plaintext (``http://``, or no scheme with ``..._INSECURE=true``) or TLS.
    insecure: bool = True

    @property
    def grpc_target(self) -> str:
        """The target for a gRPC channel: ``host:port`` of a URL, or a target in gRPC's own
        naming (``unix:/path``, ``dns:///host:port``) as written."""
        if grpc_scheme(self.endpoint):
            return self.endpoint
        parts = urlsplit(self.endpoint if "//" in self.endpoint else f"//{self.endpoint}")
        return parts.netloc or self.endpoint


def grpc_scheme(endpoint: str) -> str:
    """The gRPC naming scheme ``endpoint`` starts with (``unix``, ``dns``, ...), else ``""``."""
    scheme, sep, _ = endpoint.partition(":")
    return scheme.lower() if sep and scheme.lower() in GRPC_SCHEMES else ""


def _pick(env: Mapping[str, str], signal: str, key: str) -> tuple[str, str]:
    """(variable, value) of the per-signal variable if set, else of the general one."""
    for name in (f"OTEL_EXPORTER_OTLP_{signal.upper()}_{key}", f"OTEL_EXPORTER_OTLP_{key}"):
        value = env.get(name, "").strip()
        if value:
            return name, value
    return f"OTEL_EXPORTER_OTLP_{key}", ""


def protocol_variable(env: Mapping[str, str], signal: str) -> str:
    """The variable that decides ``signal``'s protocol: its own if set, else the general one."""
    return _pick(env, signal, "PROTOCOL")[0]


class HeaderError(ValueError):
    """Malformed ``..._HEADERS`` items, one message each (``problems``); each names the key (if
    any), never a value."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


#: ``%`` not followed by two hex digits: the specification's percent-encoding has no such form.
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def parse_headers(text: str) -> tuple[tuple[str, str], ...]:
    """``k=v,k2=v2`` as the specification reads it (W3C Baggage without properties): keys are
    HTTP tokens, values percent-decoded and then printable ASCII. :class:`HeaderError` lists
    every bad item by its key, never by its value (a header value is a secret); a key given
    twice is one too (which value was meant cannot be told)."""
    headers: list[tuple[str, str]] = []
    problems: list[str] = []
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key = unquote(key.strip())
        if not sep or not key:
            problems.append(f"expected key=value pairs separated by commas, got an item without "
                            f"{'=' if not sep else 'a key'} ({len(item)} characters; not shown, "
                            "it may hold the secret)")
            continue
        if not set(key) <= _TCHAR:
            problems.append(f"header key {key[:60]!r}: expected an HTTP token (letters, digits "
                            "and !#$%&'*+-.^_`|~; no spaces or separators)")
            continue
        if _BAD_ESCAPE.search(value):
            problems.append(f"the value of header {key.lower()!r} has a '%' not followed by two "
                            "hex digits: expected percent-encoding (%25 for a literal '%'; the "
                            "value is a secret and not shown)")
            continue
        decoded = unquote(value.strip())
        if any(not " " <= ch <= "~" for ch in decoded):
            problems.append(f"the value of header {key.lower()!r} holds a control or non-ASCII "
                            "character once percent-decoded: expected printable ASCII (the value "
                            "is a secret and not shown)")
            continue
        if any(known == key.lower() for known, _ in headers):
            problems.append(f"header key {key.lower()!r} is given twice: expected each key once")
            continue
        headers.append((key.lower(), decoded))
    if problems:
        raise HeaderError(problems)
    return tuple(headers)


def _grpc_metadata_problems(headers: tuple[tuple[str, str], ...]) -> list[str]:
    """gRPC metadata takes fewer keys than HTTP (gRPC's PROTOCOL-HTTP2: ``0-9 a-z _ - .``);
    ``-bin`` keys carry bytes and ``grpc-`` ones are gRPC's own. Refused at start, since gRPC
    would refuse every call (``INTERNAL``, or a ``TypeError``)."""
    allowed = frozenset("0123456789abcdefghijklmnopqrstuvwxyz_-.")
    problems = []
    for key, _ in headers:
        if not set(key) <= allowed:
            problems.append(f"header key {key[:60]!r}: expected only letters, digits, '-', "
                            "'_' and '.' over gRPC (metadata keys)")
        elif key.endswith("-bin") or key.startswith("grpc-"):
            problems.append(f"header key {key[:60]!r}: a '-bin' or 'grpc-' key cannot be "
                            "set from the environment over gRPC")
    return problems


def otlp_target(env: Mapping[str, str], signal: str, *, check_files: bool = True
                ) -> tuple[OtlpTarget, list[str]]:
    """The target of ``signal`` (``logs`` or ``metrics``) and the problems found
    (``check_files``: whether the TLS files must be readable, when the sink is on)."""
    problems: list[str] = []
    name, protocol = _pick(env, signal, "PROTOCOL")
    if protocol and protocol not in PROTOCOLS:
        problems.append(f"{name}={protocol!r}: expected one of {', '.join(PROTOCOLS)}")
    protocol = protocol if protocol in PROTOCOLS else "http/protobuf"

    own = env.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT", "").strip()
    name, base = _pick(env, signal, "ENDPOINT")
    endpoint = own or base or _DEFAULT_ENDPOINT[protocol]
    naming = grpc_scheme(endpoint) if protocol == "grpc" else ""
    parts = urlsplit(endpoint if "//" in endpoint or naming else f"//{endpoint}")
    try:
        port_ok = parts.port is None or 0 < parts.port < 65536
    except ValueError:
        port_ok = False
    if naming:
        # gRPC's own naming: the client resolves it; only an empty name is refused here.
        if not endpoint.partition(":")[2].strip("/"):
            problems.append(f"{name}={endpoint[:80]!r}: expected a name after {naming}: "
                            f"(e.g. unix:///run/otel.sock, dns:///collector:4317)")
    elif not parts.hostname or parts.scheme not in ("http", "https", "") or not port_ok or (
            protocol == "http/protobuf" and not parts.scheme):
        grpc_forms = (", host:port, or a gRPC target (unix:, dns:)" if protocol == "grpc"
                      else "")
        problems.append(f"{name}={endpoint[:80]!r}: expected an http:// or https:// URL "
                        f"with a host (and a port){grpc_forms}")
    if protocol == "http/protobuf" and not own:
        endpoint = f"{endpoint.rstrip('/')}/v1/{signal}"

    name, raw = _pick(env, signal, "HEADERS")
    headers: tuple[tuple[str, str], ...] = ()
    try:
        headers = parse_headers(raw)
    except HeaderError as exc:
        problems.extend(f"{name}: {problem}" for problem in exc.problems)
    if protocol == "grpc":
        problems.extend(f"{name}: {problem}" for problem in _grpc_metadata_problems(headers))

    name, raw = _pick(env, signal, "TIMEOUT")
    timeout = DEFAULT_TIMEOUT
    if raw:
        try:
            timeout = float(raw)
        except ValueError:
            timeout = math.nan
        if not (math.isfinite(timeout) and 0.001 <= timeout <= 600):
            # The specification's unit is milliseconds, the Python SDK's (and ours) seconds:
            # 10000 is most likely the specification's 10 s, not 2.8 hours.
            hint = (f"; {raw[:40]} looks like milliseconds (the specification's unit): "
                    f"write {timeout / 1000:g} for {timeout / 1000:g} s"
                    if math.isfinite(timeout) and timeout >= 1000 else "")
            problems.append(f"{name}={raw[:40]!r}: expected a timeout in seconds (the Python "
                            f"SDK's unit), from 0.001 to 600{hint}")
            timeout = DEFAULT_TIMEOUT

    name, raw = _pick(env, signal, "COMPRESSION")
    if raw and raw.lower() not in COMPRESSIONS:
        problems.append(f"{name}={raw[:40]!r}: expected gzip or none")
    gzip = raw.lower() == "gzip"

    files = {}
    for key in ("CERTIFICATE", "CLIENT_KEY", "CLIENT_CERTIFICATE"):
        name, path = _pick(env, signal, key)
        if path and check_files and not os.access(path, os.R_OK):
            shown = "" if "KEY" in key else f"={path[:80]!r}"
            problems.append(f"{name}{shown}: expected a readable PEM file "
                            f"({'no such file' if not os.path.exists(path) else 'unreadable'})")
        files[key] = path

    name, raw = _pick(env, signal, "INSECURE")
    insecure = parts.scheme == "http" or (
        (not parts.scheme or bool(naming)) and raw.lower() == "true")
    if raw and raw.lower() not in ("true", "false"):
        problems.append(f"{name}={raw[:40]!r}: expected true or false")

    return OtlpTarget(signal, protocol, endpoint, headers, timeout, gzip, files["CERTIFICATE"],
                      files["CLIENT_KEY"], files["CLIENT_CERTIFICATE"], insecure), problems


def temporality(env: Mapping[str, str]) -> tuple[str, list[str]]:
    """``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE`` and its problem, if any."""
    name = "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE"
    raw = env.get(name, "").strip().lower()
    if raw and raw not in TEMPORALITIES:
        return "cumulative", [f"{name}={raw[:40]!r}: expected cumulative, delta or lowmemory"]
    return raw or "cumulative", []


def histogram_aggregation(env: Mapping[str, str]) -> tuple[str, list[str]]:
    """``OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION`` and its problem, if any.

    The SDK's OTLP exporters log a warning nobody sees for another value and send explicit
    buckets; here it is refused at start like every other malformed OTLP variable, since a user
    who asked for exponential histograms would otherwise learn it only from a dashboard."""
    name = "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION"
    raw = env.get(name, "").strip().lower()
    if raw and raw not in HISTOGRAM_AGGREGATIONS:
        return HISTOGRAM_AGGREGATIONS[0], [
            f"{name}={raw[:60]!r}: expected {' or '.join(HISTOGRAM_AGGREGATIONS)}"]
    return raw or HISTOGRAM_AGGREGATIONS[0], []


def endpoint_warnings(env: Mapping[str, str], protocols: Mapping[str, str]) -> list[str]:
    """The conventional OTLP ports are 4317 (gRPC) and 4318 (http): the other one is a likely
    mix-up that fails only at the first export. ``protocols``: each signal's protocol; a
    signal's endpoint is checked against its own, the general one against each signal's."""
    warnings: list[str] = []
    for name, signals in (("OTEL_EXPORTER_OTLP_ENDPOINT", tuple(protocols)),
                          ("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", ("logs",)),
                          ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", ("metrics",))):
        raw = env.get(name, "").strip()
        for protocol in dict.fromkeys(protocols[s] for s in signals if s in protocols):
            warnings.extend(_endpoint_warnings(name, raw, protocol))
            warnings.extend(_tls_warnings(env, name, raw, protocol))
    return list(dict.fromkeys(warnings))


def _tls_warnings(env: Mapping[str, str], name: str, raw: str, protocol: str) -> list[str]:
    """Where TLS is decided by something the user may not expect: a gRPC target without
    http/https (a unix socket most of all) uses TLS unless ..._INSECURE=true, the
    specification's default; and an https:// endpoint uses TLS whatever ..._INSECURE says."""
    insecure_name = name.replace("_ENDPOINT", "_INSECURE")
    value = env.get(insecure_name, "").strip() or env.get("OTEL_EXPORTER_OTLP_INSECURE", "").strip()
    shown = insecure_name if env.get(insecure_name, "").strip() else "OTEL_EXPORTER_OTLP_INSECURE"
    if protocol == "grpc" and grpc_scheme(raw) in ("unix", "unix-abstract") \
            and value.lower() != "true":
        return [f"{name} is a unix socket, and the gRPC channel uses TLS unless {insecure_name}="
                "true (the specification's default for a target without http:// or https://); "
                "a collector on a local socket usually speaks plaintext"]
    if raw.lower().startswith("https://") and value.lower() == "true":
        return [f"{shown}=true has no effect on {name}: its https:// scheme decides, and TLS is "
                "used (http:// for plaintext)"]
    return []


def _endpoint_warnings(name: str, raw: str, protocol: str) -> list[str]:
    if not raw or (protocol == "grpc" and grpc_scheme(raw)):
        return []
    try:  # gRPC also takes host:port without a scheme
        parts = urlsplit(raw if "//" in raw or protocol != "grpc" else f"//{raw}")
        port = parts.port
    except ValueError:
        return []
    warnings = []
    path = parts.path.rstrip("/")
    if protocol == "grpc" and path:
        warnings.append(f"{name} has a path ({path!r}) that gRPC ignores: only the host and "
                        "port are used")
    elif name == "OTEL_EXPORTER_OTLP_ENDPOINT" and path.endswith(("/v1/logs", "/v1/metrics")):
        warnings.append(f"{name} ends in {path[path.rindex('/v1/'):]}, but the SDK appends "
                        "/v1/logs and /v1/metrics to it (a signal's full URL goes in "
                        "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT / ..._METRICS_ENDPOINT)")
    if protocol == "grpc" and port == 4318:
        warnings.append(f"{name} uses port 4318, the OTLP/http port, with the grpc protocol "
                        "(gRPC listens on 4317)")
    elif protocol != "grpc" and port == 4317:
        warnings.append(f"{name} uses port 4317, the OTLP/gRPC port, with the "
                        "http/protobuf protocol (http listens on 4318; or set "
                        "OTEL_EXPORTER_OTLP_PROTOCOL=grpc)")
    return warnings
