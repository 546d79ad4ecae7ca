"""Configuration from environment variables only, validated once at start.

Every problem is reported on its own line naming the variable, the value seen and what is
expected (:class:`ConfigError`); the CLI turns that into exit code 2. Secrets never leave this
module unredacted: :meth:`Config.describe` is what ``check-config`` prints.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TypeVar
from urllib.parse import SplitResult, urlsplit

from scheduled_events_exporter import api_versions, otlp_settings
from scheduled_events_exporter.approval import ApprovalConfig, parse_approval_config
from scheduled_events_exporter.boot import DEFAULT_BOOT_ID_FILE
from scheduled_events_exporter.otlp_settings import OtlpTarget
from scheduled_events_exporter.platforms.files import FILES
from scheduled_events_exporter.redact import REDACTED, is_secret_name, scrub, shown

SINK_NAMES = ("otlp", "eventhubs", "console")
#: OTEL_METRICS_EXPORTER values we implement (OTel SDK environment variable specification).
METRICS_EXPORTER_NAMES = ("otlp", "prometheus", "none")
#: Variables whose values are secrets (never printed, logged or put in health output).
SECRET_VARIABLES = frozenset({"SEE_EVENTHUB_CONNECTION_STRING", *otlp_settings.SECRETS})
_OTEL_SHOWN_PREFIXES = (
    "OTEL_EXPORTER_OTLP_",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_METRIC_EXPORT_",
    "OTEL_BLRP_",
    "OTEL_METRICS_EXPORTER",
    "OTEL_EXPORTER_PROMETHEUS_",
)
_MAX_VALUE = 4096

T = TypeVar("T")


DEFAULT_LOGS_TARGET = OtlpTarget("logs")
DEFAULT_METRICS_TARGET = OtlpTarget("metrics", endpoint="http://localhost:4318/v1/metrics")


class ConfigError(Exception):
    """One or more invalid settings; ``problems`` holds one line per setting."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


@dataclass(frozen=True, slots=True)
class Config:
    """The validated, effective configuration."""

    imds_endpoint: str = "http://169.254.169.254"
    poll_interval: float = 1.0
    imds_first_timeout: float = 130.0
    imds_timeout: float = 5.0
    #: The Scheduled Events ``api-version`` sent with every request (SEE_IMDS_API_VERSION).
    imds_api_version: str = api_versions.DEFAULT
    sinks: tuple[str, ...] = ("console",)
    state_dir: Path | None = None
    staleness_limit: float = 30.0
    #: Downstream checks that also decide /readyz (SEE_READINESS_INCLUDES: sinks, storage).
    readiness_includes: frozenset[str] = frozenset()
    health_addr: tuple[str, int] | None = ("0.0.0.0", 8080)
    shutdown_timeout: float = 10.0
    spool_max_records: int = 10_000
    #: Per-sink bound of undelivered records in bytes (SEE_SPOOL_MAX_BYTES).
    spool_max_bytes: int = 16 * 1024 * 1024
    eventhub_connection_string: str = ""
    eventhub_namespace: str = ""
    eventhub_name: str = ""
    #: Longest one Event Hubs SDK call may take before its client is abandoned.
    eventhub_send_timeout: float = 60.0
    #: Hub for metric snapshots (same namespace and credential); empty: the transitions hub.
    eventhub_metrics_name: str = ""
    #: Seconds between Event Hubs metric snapshots while nothing changes.
    eventhub_heartbeat: float = 300.0
    #: Where and how the OTLP sink sends records and metrics (OTEL_EXPORTER_OTLP_*).
    otlp_logs: OtlpTarget = DEFAULT_LOGS_TARGET
    otlp_metrics: OtlpTarget = DEFAULT_METRICS_TARGET
    #: OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE: cumulative, delta or lowmemory.
    metrics_temporality: str = "cumulative"
    #: Seconds between OTLP metric exports while nothing changes (OTel default 60 s).
    metric_export_interval: float = 60.0
    log_level: str = "INFO"
    approval: ApprovalConfig | None = None
    #: OTEL_METRICS_EXPORTER as given ("otlp", "prometheus"; () for none); None: follow SEE_SINKS.
    metrics_exporters_set: tuple[str, ...] | None = None
    #: Where the Prometheus scrape endpoint listens (OTEL_EXPORTER_PROMETHEUS_HOST / _PORT).
    prometheus_addr: tuple[str, int] = ("0.0.0.0", 9464)
    #: Where the host's boot id is read (SEE_BOOT_ID_FILE; empty: never claim a reboot).
    boot_id_file: Path | None = DEFAULT_BOOT_ID_FILE
    #: False when SEE_BOOT_ID_FILE is set empty; with no file, Windows uses the boot instant.
    boot_evidence: bool = True
    #: Replay only (SEE_CLOCK_START): the wall clock starts here and runs at real speed, so a
    #: recorded document sequence meets the NotBefore times it was captured with.
    clock_start: datetime | None = None
    #: Settings that are valid but probably wrong (printed by run and check-config).
    warnings: tuple[str, ...] = ()

    @property
    def metrics_exporters(self) -> tuple[str, ...]:
        """The OTel metric exporters in effect: as set, else ``otlp`` when that sink is on."""
        if self.metrics_exporters_set is not None:
            return self.metrics_exporters_set
        return ("otlp",) if "otlp" in self.sinks else ()

    @property
    def otlp_protocol(self) -> str:
        """The log records' OTLP protocol (``http/protobuf`` or ``grpc``)."""
        return self.otlp_logs.protocol

    @property
    def gap_threshold(self) -> float:
        """No good document for longer than this is an observation gap (docs/lifecycle.md: 3
        intervals)."""
        return 3 * self.poll_interval

    def _boot_source(self) -> str:
        if self.boot_id_file is not None:
            return str(self.boot_id_file)
        if self.boot_evidence and sys.platform == "win32":
            return "(unset: the boot instant, from the tick count)"
        return "disabled"

    def describe(self, env: Mapping[str, str]) -> list[str]:
        """Human-readable effective configuration, secrets redacted (for ``check-config``)."""
        health = f"{self.health_addr[0]}:{self.health_addr[1]}" if self.health_addr else "disabled"
        lines = [
            f"SEE_IMDS_ENDPOINT={self.imds_endpoint}",
            f"SEE_POLL_INTERVAL={self.poll_interval:g}",
            f"SEE_IMDS_FIRST_TIMEOUT={self.imds_first_timeout:g}",
            f"SEE_IMDS_TIMEOUT={self.imds_timeout:g}",
            f"SEE_IMDS_API_VERSION={self.imds_api_version}",
            f"SEE_SINKS={','.join(self.sinks)}",
            f"SEE_STATE_DIR={self.state_dir or 'disabled'}",
            f"SEE_STALENESS_LIMIT={self.staleness_limit:g}",
            "SEE_READINESS_INCLUDES="
            f"{','.join(sorted(self.readiness_includes)) or '(none: IMDS only)'}",
            f"SEE_HEALTH_ADDR={health}",
            f"SEE_SHUTDOWN_TIMEOUT={self.shutdown_timeout:g}",
            f"SEE_SPOOL_MAX_RECORDS={self.spool_max_records}",
            f"SEE_SPOOL_MAX_BYTES={self.spool_max_bytes}",
            f"SEE_LOG_LEVEL={self.log_level}",
            f"SEE_BOOT_ID_FILE={self._boot_source()}",
        ]
        if "eventhubs" in self.sinks:
            if self.eventhub_connection_string:
                lines.append(f"SEE_EVENTHUB_CONNECTION_STRING={REDACTED}")
            else:
                lines.append(f"SEE_EVENTHUB_NAMESPACE={self.eventhub_namespace}")
                lines.append(f"SEE_EVENTHUB_NAME={self.eventhub_name}")
            lines.append(f"SEE_EVENTHUB_SEND_TIMEOUT={self.eventhub_send_timeout:g}")
            lines.append("SEE_EVENTHUB_METRICS_NAME="
                         f"{self.eventhub_metrics_name or '(the transitions hub)'}")
            lines.append(f"SEE_EVENTHUB_HEARTBEAT={self.eventhub_heartbeat:g}")
        lines.extend(self.approval.describe() if self.approval else ["SEE_APPROVE= (off)"])
        # Effective values of the OTel metric exporter settings when left to their defaults.
        defaults = {"OTEL_METRICS_EXPORTER": ",".join(self.metrics_exporters) or "none"}
        if "prometheus" in self.metrics_exporters:
            defaults["OTEL_EXPORTER_PROMETHEUS_HOST"] = self.prometheus_addr[0]
            defaults["OTEL_EXPORTER_PROMETHEUS_PORT"] = str(self.prometheus_addr[1])
        if "otlp" in self.sinks:
            # The SDK's own defaults, so a user sees where records go without reading its code.
            defaults["OTEL_EXPORTER_OTLP_PROTOCOL"] = self.otlp_protocol
            defaults["OTEL_EXPORTER_OTLP_ENDPOINT"] = (
                "http://localhost:4317" if self.otlp_protocol == "grpc"
                else "http://localhost:4318")
        if "otlp" in self.metrics_exporters:
            defaults["OTEL_METRIC_EXPORT_INTERVAL"] = f"{self.metric_export_interval * 1000:g}"
        lines.extend(f"{k}={v} (default)" for k, v in defaults.items() if k not in env)
        for key in sorted(env):
            if key.startswith(_OTEL_SHOWN_PREFIXES):
                value = REDACTED if key in SECRET_VARIABLES else shown(key, env[key])
                lines.append(f"{key}={value}")
        return lines


def default_state_dir(env: Mapping[str, str], *, windows: bool = sys.platform == "win32"
                      ) -> Path:
    """``%ProgramData%\\scheduled-events-exporter`` on Windows, else
    ``$XDG_STATE_HOME/scheduled-events-exporter`` (the container image sets SEE_STATE_DIR)."""
    if windows:
        # (os.environ's keys are upper case on Windows; a mapping given by hand may not be.)
        base = next((v for k, v in env.items() if k.upper() == "PROGRAMDATA" and v),
                    r"C:\ProgramData")
        return Path(base) / "scheduled-events-exporter"
    base = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "scheduled-events-exporter"


def load_config(env: Mapping[str, str] | None = None, *, create: bool = True) -> Config:
    """Read and validate the configuration; raises :class:`ConfigError` listing every problem.

    ``create=False`` (``check-config``) only checks that the state directory could be created
    and written, and leaves the file system as it was.
    """
    env = dict(os.environ if env is None else env)
    problems: list[str] = []

    def get(name: str, parse: Callable[[str], T], default: T, expected: str) -> T:
        raw = env.get(name)
        if raw is None or raw.strip() == "":
            return default
        printable = (REDACTED if name in SECRET_VARIABLES or is_secret_name(name)
                     else _show(raw))
        if len(raw) > _MAX_VALUE:
            problems.append(f"{name}={printable}: expected {expected}, got a {len(raw)}-byte "
                            "value")
            return default
        try:
            return parse(raw.strip())
        except Detailed as exc:
            problems.append(f"{name}={printable}: expected {expected} ({exc})")
            return default
        except (ValueError, OverflowError):
            problems.append(f"{name}={printable}: expected {expected}")
            return default

    def seconds(low: float, high: float) -> Callable[[str], float]:
        def parse(text: str) -> float:
            value = float(text)
            if not math.isfinite(value) or not low <= value <= high:
                raise ValueError(text)
            return value

        return parse

    endpoint = get(
        "SEE_IMDS_ENDPOINT",
        _parse_endpoint,
        "http://169.254.169.254",
        "an http:// URL with host and optional port, no path (e.g. http://169.254.169.254)",
    )
    interval = get(
        "SEE_POLL_INTERVAL",
        seconds(0.2, 3600.0),
        1.0,
        "seconds between polls, a number from 0.2 to 3600 (IMDS allows 5 requests/s)",
    )
    first_timeout = get(
        "SEE_IMDS_FIRST_TIMEOUT", seconds(1.0, 600.0), 130.0, "seconds, a number from 1 to 600"
    )
    timeout = get("SEE_IMDS_TIMEOUT", seconds(0.1, 60.0), 5.0, "seconds, a number from 0.1 to 60")
    no_warnings: list[str] = []
    api_version, version_warnings = get(
        "SEE_IMDS_API_VERSION", _parse_api_version, (api_versions.DEFAULT, no_warnings),
        f"a Scheduled Events api-version, a date from {api_versions.OLDEST} on (default "
        f"{api_versions.DEFAULT})")
    staleness = get(
        "SEE_STALENESS_LIMIT", seconds(1.0, 86400.0), 30.0, "seconds, a number from 1 to 86400"
    )
    shutdown = get(
        "SEE_SHUTDOWN_TIMEOUT", seconds(0.0, 600.0), 10.0, "seconds, a number from 0 to 600"
    )
    spool_max = get(
        "SEE_SPOOL_MAX_RECORDS",
        _bounded_int(1, 10_000_000),
        10_000,
        "an integer from 1 to 10000000",
    )
    spool_max_bytes = get(
        "SEE_SPOOL_MAX_BYTES",
        _bounded_int(65_536, 1 << 30),
        16 * 1024 * 1024,
        "bytes, an integer from 65536 to 1073741824",
    )
    readiness_includes = get(
        "SEE_READINESS_INCLUDES", _parse_readiness_includes, frozenset[str](),
        "a comma-separated list of sinks, storage (what else may make /readyz fail), or none")
    health: tuple[str, int] | None = get(
        "SEE_HEALTH_ADDR",
        parse_addr,
        ("0.0.0.0", 8080),
        "HOST:PORT with a port from 0 to 65535, or empty to disable",
    )
    if "SEE_HEALTH_ADDR" in env and env["SEE_HEALTH_ADDR"].strip() == "":
        health = None
    log_level = get("SEE_LOG_LEVEL", _parse_level, "INFO", "one of debug, info, warning, error")

    connection_string = env.get("SEE_EVENTHUB_CONNECTION_STRING", "").strip()
    namespace = env.get("SEE_EVENTHUB_NAMESPACE", "").strip()
    hub = env.get("SEE_EVENTHUB_NAME", "").strip()
    sinks = get(
        "SEE_SINKS",
        _parse_sinks,
        _implicit_sinks(env, connection_string, namespace),
        "a comma-separated list of otlp, eventhubs, console without repeats",
    )
    send_timeout = get("SEE_EVENTHUB_SEND_TIMEOUT", seconds(1.0, 600.0), 60.0,
                       "seconds, a number from 1 to 600")
    heartbeat = get("SEE_EVENTHUB_HEARTBEAT", seconds(10.0, 86400.0), 300.0,
                    "seconds between idle metric snapshots, a number from 10 to 86400")
    metrics_hub = get("SEE_EVENTHUB_METRICS_NAME", _parse_hub_name, "",
                      "an event hub name (1-256 letters, digits, '.', '-', '_'; starting and "
                      "ending with a letter or digit)")
    if "eventhubs" in sinks:
        problems.extend(_check_eventhubs(connection_string, namespace, hub))
        problems.extend(_check_eventhubs_library(sinks, need_identity=not connection_string))

    otlp_logs, logs_problems = otlp_settings.otlp_target(env, "logs",
                                                          check_files="otlp" in sinks)
    otlp_metrics, metrics_problems = otlp_settings.otlp_target(env, "metrics",
                                                                check_files="otlp" in sinks)
    # A variable both signals read (the general ones) is reported once.
    problems.extend(dict.fromkeys([*logs_problems, *metrics_problems]))
    metrics_temporality, temporality_problems = otlp_settings.temporality(env)
    problems.extend(temporality_problems)
    metric_interval_ms = get(
        "OTEL_METRIC_EXPORT_INTERVAL",
        _bounded_int(1000, 86_400_000),
        60_000,
        "milliseconds, an integer from 1000 to 86400000",
    )
    metrics_exporters: tuple[str, ...] | None = get(
        "OTEL_METRICS_EXPORTER",
        _parse_metrics_exporters,
        None,
        "a comma-separated list of otlp, prometheus without repeats, or none",
    )
    if metrics_exporters and "otlp" in metrics_exporters and "otlp" not in sinks:
        problems.append(
            f"OTEL_METRICS_EXPORTER={_show(env.get('OTEL_METRICS_EXPORTER', ''))}: otlp metrics "
            f"need the otlp sink, expected SEE_SINKS to include otlp "
            f"(SEE_SINKS is {','.join(sinks)})"
        )
    prometheus_host = get(
        "OTEL_EXPORTER_PROMETHEUS_HOST",
        _parse_host,
        "0.0.0.0",
        "a host name or IP address to listen on (e.g. 0.0.0.0, 127.0.0.1, ::)",
    )
    prometheus_port = get(
        "OTEL_EXPORTER_PROMETHEUS_PORT",
        _bounded_int(0, 65535),
        9464,
        "a TCP port, an integer from 0 to 65535",
    )

    state_dir: Path | None = None
    raw_state = env.get("SEE_STATE_DIR")
    if raw_state is None or raw_state.strip():
        state_dir = Path(raw_state.strip()) if raw_state else default_state_dir(env)
        problem = _check_writable(state_dir) if create else _could_write(state_dir)
        if problem:
            problems.append(f"SEE_STATE_DIR={_show(str(state_dir))}: {problem}")

    clock_start = get("SEE_CLOCK_START", _parse_instant, None,
                      "an RFC 3339 time with a zone, e.g. 2021-07-22T04:36:00Z (replay only)")
    raw_boot = env.get("SEE_BOOT_ID_FILE")
    boot_id_file = DEFAULT_BOOT_ID_FILE if raw_boot is None else (
        Path(raw_boot.strip()) if raw_boot.strip() else None)
    boot_evidence = raw_boot is None or bool(raw_boot.strip())

    if env.get("OTEL_EXPORTER_PROMETHEUS_PORT") is not None and \
            not env["OTEL_EXPORTER_PROMETHEUS_PORT"].strip():
        problems.append("OTEL_EXPORTER_PROMETHEUS_PORT='': expected a TCP port, an integer from "
                        "0 to 65535 (unset it for the default 9464)")
    if (metrics_exporters is not None and "prometheus" in metrics_exporters and health
            and health[1] != 0 and health[1] == prometheus_port):
        problems.append(f"OTEL_EXPORTER_PROMETHEUS_PORT={prometheus_port}: expected a port other "
                        f"than SEE_HEALTH_ADDR's ({health[0]}:{health[1]}); both servers cannot "
                        "listen on one port")
    problems.extend(_check_resource_attributes(env.get("OTEL_RESOURCE_ATTRIBUTES", "")))
    warnings = [*version_warnings,
                *(_otlp_port_warnings(env, otlp_logs.protocol) if "otlp" in sinks else [])]

    approval, approval_problems = parse_approval_config(env)
    problems.extend(approval_problems)
    if problems:
        raise ConfigError(problems)
    return Config(
        imds_endpoint=endpoint,
        poll_interval=interval,
        imds_first_timeout=first_timeout,
        imds_timeout=timeout,
        imds_api_version=api_version,
        sinks=sinks,
        state_dir=state_dir,
        staleness_limit=staleness,
        readiness_includes=readiness_includes,
        health_addr=health,
        shutdown_timeout=shutdown,
        spool_max_records=spool_max,
        spool_max_bytes=spool_max_bytes,
        eventhub_connection_string=connection_string,
        eventhub_namespace=namespace,
        eventhub_name=hub,
        eventhub_send_timeout=send_timeout,
        eventhub_metrics_name=metrics_hub,
        eventhub_heartbeat=heartbeat,
        otlp_logs=otlp_logs,
        otlp_metrics=otlp_metrics,
        metrics_temporality=metrics_temporality,
        metric_export_interval=metric_interval_ms / 1000.0,
        log_level=log_level,
        approval=approval,
        metrics_exporters_set=metrics_exporters,
        prometheus_addr=(prometheus_host, prometheus_port),
        boot_id_file=boot_id_file,
        boot_evidence=boot_evidence,
        clock_start=clock_start,
        warnings=tuple(warnings),
    )


class Detailed(ValueError):
    """A parse error whose message says what exactly is wrong (shown after the expectation)."""


def _port_of(parts: SplitResult) -> int | None:
    try:
        return parts.port
    except ValueError:
        raise Detailed(f"the port must be a number from 1 to 65535, got "
                       f"{parts.netloc.rpartition(':')[2]!r}") from None


def _show(raw: str) -> str:
    text = scrub(raw[:200])
    text = text if len(text) <= 80 else text[:77] + "..."
    return repr(text)


def _bounded_int(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise ValueError(text)
        return value

    return parse


_HUB_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,254}[A-Za-z0-9])?")


def _parse_hub_name(text: str) -> str:
    """Event Hubs entity naming rules (letters, digits, '.', '-', '_'; 1-256 characters)."""
    if not _HUB_NAME.fullmatch(text):
        raise ValueError(text)
    return text


def _parse_api_version(text: str) -> tuple[str, list[str]]:
    try:
        return api_versions.check(text)
    except ValueError as exc:
        raise Detailed(str(exc)) from None


def _parse_endpoint(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/"):
        raise ValueError(text)
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(text)
    _port_of(parts)
    return f"http://{parts.netloc}"


def _parse_url(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(text)
    _port_of(parts)
    return text


def parse_addr(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:port``, ``:port`` for every interface); ``ValueError`` if not."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(text)
    return host.strip("[]") or "0.0.0.0", int(port)


def _parse_instant(text: str) -> datetime:
    moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    if moment.tzinfo is None:
        raise ValueError("no time zone")
    return moment.astimezone(timezone.utc)


def _check_resource_attributes(raw: str) -> list[str]:
    """``key=value,key=value`` (values percent-encoded), as the OTel SDK parses it."""
    if not raw.strip():
        return []
    for item in raw.split(","):
        key, sep, _ = item.partition("=")
        if not sep or not key.strip():
            return [f"OTEL_RESOURCE_ATTRIBUTES={_show(raw)}: expected key=value pairs separated "
                    f"by commas, got {_show(item)}"]
    return []


def _otlp_port_warnings(env: Mapping[str, str], protocol: str) -> list[str]:
    """The conventional OTLP ports are 4317 (gRPC) and 4318 (http): the other one is a likely
    mix-up that fails only at the first export."""
    warnings = []
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
                 "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):
        try:
            parts = urlsplit(env.get(name, "").strip())
            port = parts.port
        except ValueError:
            continue
        path = parts.path.rstrip("/")
        if protocol == "grpc" and path:
            warnings.append(f"{name} has a path ({path!r}) that gRPC ignores: only the host and "
                            "port are used")
        elif name == "OTEL_EXPORTER_OTLP_ENDPOINT" and path.endswith(("/v1/logs",
                                                                      "/v1/metrics")):
            warnings.append(f"{name} ends in {path[path.rindex('/v1/'):]}, but the SDK appends "
                            "/v1/logs and /v1/metrics to it (a signal's full URL goes in "
                            "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT / ..._METRICS_ENDPOINT)")
        if protocol == "grpc" and port == 4318:
            warnings.append(f"{name} uses port 4318, the OTLP/http port, with "
                            "OTEL_EXPORTER_OTLP_PROTOCOL=grpc (gRPC listens on 4317)")
        elif protocol != "grpc" and port == 4317:
            warnings.append(f"{name} uses port 4317, the OTLP/gRPC port, with the "
                            "http/protobuf protocol (http listens on 4318; or set "
                            "OTEL_EXPORTER_OTLP_PROTOCOL=grpc)")
    return warnings


def _parse_level(text: str) -> str:
    level = text.upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ValueError(text)
    return level


def _parse_sinks(text: str) -> tuple[str, ...]:
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    if not names or len(set(names)) != len(names) or any(n not in SINK_NAMES for n in names):
        raise ValueError(text)
    return tuple(names)


#: What SEE_READINESS_INCLUDES may name: the downstream checks that may also decide /readyz.
READINESS_CHECKS = ("sinks", "storage")


def _parse_readiness_includes(text: str) -> frozenset[str]:
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    if names == ["none"]:
        return frozenset()
    if not names or len(set(names)) != len(names) or any(
            n not in READINESS_CHECKS for n in names):
        raise ValueError(text)
    return frozenset(names)


def _parse_metrics_exporters(text: str) -> tuple[str, ...]:
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    if not names or len(set(names)) != len(names) or any(
        n not in METRICS_EXPORTER_NAMES for n in names
    ):
        raise ValueError(text)
    if "none" in names:
        if len(names) > 1:  # "none" beside an exporter is a contradiction, not a preference
            raise ValueError(text)
        return ()
    return tuple(names)


def _parse_host(text: str) -> str:
    host = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    if not _HOST_NAME.fullmatch(host) or len(host) > 253:
        raise ValueError(text)
    return host


_HOST_NAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                        r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?")


def _implicit_sinks(
    env: Mapping[str, str], connection_string: str, namespace: str
) -> tuple[str, ...]:
    """docs/semantics.md#sinks: console unless something else is configured."""
    sinks: list[str] = []
    if any(
        env.get(k, "").strip()
        for k in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT")
    ):
        sinks.append("otlp")
    if connection_string or namespace:
        sinks.append("eventhubs")
    return tuple(sinks) or ("console",)


def _check_eventhubs(connection_string: str, namespace: str, hub: str) -> list[str]:
    if connection_string:
        fields = dict(part.split("=", 1) for part in connection_string.split(";") if "=" in part)
        if not fields.get("Endpoint", "").startswith("sb://"):
            return [
                f"SEE_EVENTHUB_CONNECTION_STRING={REDACTED}: expected "
                "'Endpoint=sb://...;SharedAccessKeyName=...;SharedAccessKey=...;EntityPath=...'"
            ]
        if not (fields.get("EntityPath") or hub):
            return [
                "SEE_EVENTHUB_NAME: expected the hub name (the connection string has no EntityPath)"
            ]
        return []
    problems = []
    if not namespace or "." not in namespace or "/" in namespace:
        problems.append(
            f"SEE_EVENTHUB_NAMESPACE={_show(namespace)}: expected the fully "
            "qualified namespace, e.g. mynamespace.servicebus.windows.net "
            "(or set SEE_EVENTHUB_CONNECTION_STRING)"
        )
    if not hub:
        problems.append("SEE_EVENTHUB_NAME='': expected the event hub name")
    return problems


def _check_eventhubs_library(sinks: tuple[str, ...], *, need_identity: bool) -> list[str]:
    """The Event Hubs sink's packages are regular dependencies, but a trimmed install (or an
    old one made without them) must fail as a configuration error, not with a traceback."""
    missing = []
    try:
        import azure.eventhub
    except ImportError:
        missing.append("azure-eventhub==5.15.1")
    if need_identity:
        try:
            import azure.identity  # noqa: F401
        except ImportError:
            missing.append("azure-identity==1.27.0")
    if not missing:
        return []
    names = " and ".join(m.split("=")[0] for m in missing)
    return [f"SEE_SINKS={','.join(sinks)!r}: the eventhubs sink needs {names}, which "
            f"{'are' if len(missing) > 1 else 'is'} not installed; expected "
            f"{'them' if len(missing) > 1 else 'it'} installed "
            f"(pip install {' '.join(repr(m) for m in missing)}) or eventhubs removed from "
            "SEE_SINKS"]


def _could_write(path: Path) -> str:
    """Whether ``path`` is (or could be created as) a writable directory, touching nothing."""
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        return f"expected a writable directory ({probe} is not a directory)"
    if not os.access(probe, os.W_OK | os.X_OK):
        what = "is not writable" if probe == path else f"cannot be created in {probe}"
        return f"expected a writable directory (it {what})"
    return ""


def _check_writable(path: Path) -> str:
    problem = FILES.check_dir(path)
    if problem:
        return problem
    try:
        FILES.make_dirs(path)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".probe-"):
            pass
    except OSError as exc:
        return f"expected a writable directory ({exc.strerror or exc})"
    return ""
