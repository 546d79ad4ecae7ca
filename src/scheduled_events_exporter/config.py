"""Configuration from environment variables only, validated once at start.

:data:`SETTINGS` is the one table of the variables: each row names a variable, the field it
fills, the parser of its text, what a valid value is (the phrase of its problem line), whether it
is a secret, and the value ``check-config`` shows. Reading (:func:`load_config`), the description
(:meth:`Config.describe`), ``run --help`` and the list of secrets all derive from it; what
involves several settings follows it as a short list of explicit checks (:func:`_checks`).

Every problem is reported on its own line naming the variable, the value seen and what is
expected (:class:`ConfigError`); the CLI turns that into exit code 2. Secrets never leave this
module unredacted.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import math
import os
import re
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Final
from urllib.parse import SplitResult, urlsplit

from scheduled_events_exporter import api_versions, extras, otlp_settings, platform_settings
from scheduled_events_exporter.approval_rules import (
    RULES_EXPECTED,
    ApprovalConfig,
    Rule,
    parse_rules,
)
from scheduled_events_exporter.boot import DEFAULT_BOOT_ID_FILE
from scheduled_events_exporter.otlp_settings import OtlpTarget
from scheduled_events_exporter.platform_settings import PlatformSettings
from scheduled_events_exporter.platforms.files import FILES
from scheduled_events_exporter.platforms.shell import SHELL, Command
from scheduled_events_exporter.redact import REDACTED, is_secret_name, scrub, shown

#: What SEE_READINESS_INCLUDES may name: the downstream checks that may also decide /readyz.
READINESS_CHECKS = ("sinks", "storage")
#: Longest value read; more is a mistake, and the problem line must stay one short line.
_MAX_VALUE = 4096

DEFAULT_LOGS_TARGET = OtlpTarget("logs")
DEFAULT_METRICS_TARGET = OtlpTarget("metrics", endpoint="http://localhost:4318/v1/metrics")
DEFAULT_PLATFORM = PlatformSettings()

class ConfigError(Exception):
    """One or more invalid settings; ``problems`` holds one line per setting."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


@dataclass(frozen=True, slots=True)
class Config:
    """The validated, effective configuration; a field's default is its variable's default."""

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
    #: OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION: explicit_bucket_histogram or
    #: base2_exponential_bucket_histogram (OTLP metrics only; Prometheus keeps explicit buckets).
    metrics_histogram_aggregation: str = "explicit_bucket_histogram"
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
    #: The platform command's settings (SEE_PLATFORM_*; docs/semantics.md, "The platform's record").
    platform: PlatformSettings = DEFAULT_PLATFORM
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

    def describe(self, env: Mapping[str, str]) -> list[str]:
        """Every setting as ``NAME=value`` lines in the order of :data:`SETTINGS`, secrets
        redacted (for ``check-config``). A row shown as given (:attr:`Setting.as_given`) prints
        the text of each spelling that is set, or its effective default marked ``(default)``."""
        lines = []
        for row in SETTINGS:
            value = row.shown(self)
            if not row.as_given:
                if value is not None:
                    lines.append(f"{row.name}={REDACTED if row.secret else value}")
                continue
            if value is not None and row.name not in env:
                lines.append(f"{row.name}={value} (default)")
            lines.extend(f"{name}={REDACTED if row.secret else shown(name, env[name])}"
                         for name in row.names if name in env)
        return lines


@dataclass(frozen=True, slots=True)
class Setting:
    """One row of :data:`SETTINGS`: a variable and everything the exporter says about it."""

    name: str
    #: The :class:`Config` field it fills (``approval.x``: :class:`ApprovalConfig`'s), whose
    #: default is the variable's. Empty: another reader takes it (the OpenTelemetry SDK, the
    #: hook runner, :mod:`.otlp_settings`), which makes check-config show it as given.
    field: str = ""
    #: Stripped, non-blank text to value; raises ValueError (or :class:`Detailed`,
    #: :class:`Refused`). None: checked where it is read, never twice (:mod:`.otlp_settings`).
    parse: Callable[[str], Any] | None = None
    #: What a valid value is: ``NAME='text': expected <this>``.
    expected: str = ""
    secret: bool = False
    #: Whether check-config shows a line, and its value (default: the field's).
    when: Callable[[Config], object] = lambda config: True
    show: Callable[[Config], str] | None = None
    #: Set but blank turns it off (the field becomes None) instead of meaning the default.
    blank_disables: bool = False
    #: The default when it depends on other variables.
    default_from: Callable[[Mapping[str, str]], Any] | None = None
    #: The variables it means nothing without, each with the hint of its problem line.
    needs: tuple[tuple[str, str], ...] = ()
    #: Also read per signal (OTEL_EXPORTER_OTLP_LOGS_..., ..._METRICS_...), which wins.
    per_signal: bool = False
    #: Longer than :data:`_MAX_VALUE` is a problem (False: its reader takes any length).
    bounded: bool = True

    @property
    def names(self) -> tuple[str, ...]:
        """Its spellings: the name, then the per-signal ones."""
        key = self.name.removeprefix("OTEL_EXPORTER_OTLP_")
        return (self.name, *(f"OTEL_EXPORTER_OTLP_{s.upper()}_{key}"
                             for s in otlp_settings.SIGNALS if self.per_signal))

    @property
    def as_given(self) -> bool:
        """check-config shows the text as given: OTEL_* in the spelling the user wrote (the
        specification defines them), and what we keep no value of."""
        return self.name.startswith("OTEL_") or not self.field

    def shown(self, config: Config) -> str | None:
        """What check-config shows for it; for a row shown as given, its default in effect."""
        if not self.when(config):
            return None
        if self.show is not None:
            return self.show(config)
        holder: object = config
        if self.field.startswith("approval."):
            holder = config.approval
        elif self.field.startswith("platform."):
            holder = config.platform
        if self.as_given or holder is None:
            return None
        value = getattr(holder, self.field.split(".")[-1])
        if isinstance(value, (bool, float)):
            return str(value).lower() if isinstance(value, bool) else f"{value:g}"
        return ",".join(value) if isinstance(value, tuple) else str(value)


class Detailed(ValueError):
    """A parse error whose message says what exactly is wrong (shown after the expectation)."""


class Refused(ValueError):
    """A parse error that says what was expected itself: each argument is the text of one
    problem line after ``NAME='value': `` (several items of one value may be wrong)."""


def _number(kind: type[float], low: float, high: float, what: str = "", note: str = ""
            ) -> tuple[Callable[[str], float], str]:
    """A parser of a number of ``kind`` (``float``, ``int``) from ``low`` to ``high``, and the
    phrase that says so (``<what>a number from <low> to <high><note>``)."""
    def parse(text: str) -> float:
        value = kind(text)
        if not (math.isfinite(value) and low <= value <= high):
            raise ValueError(text)
        return value

    noun = "an integer" if kind is int else "a number"
    return parse, f"{what}{noun} from {low} to {high}{note}"


def _seconds(low: float, high: float, what: str = "seconds, ", note: str = ""
             ) -> tuple[Callable[[str], float], str]:
    return _number(float, low, high, what, note)


_PORT = _number(int, 0, 65535, "a TCP port, ")


def _choice(*names: str) -> Callable[[str], str]:
    """One of ``names``, in any case; the value is its spelling there."""
    def parse(text: str) -> str:
        for name in names:
            if name.lower() == text.lower():
                return name
        raise ValueError(text)

    return parse


def _words(allowed: tuple[str, ...], *, none: bool = False) -> Callable[[str], tuple[str, ...]]:
    """A comma list of ``allowed`` names, lower case, each once; ``none`` alone: empty."""
    def parse(text: str) -> tuple[str, ...]:
        names = [n.strip().lower() for n in text.split(",") if n.strip()]
        if none and names == ["none"]:
            return ()
        if not names or len(set(names)) != len(names) or any(n not in allowed for n in names):
            raise ValueError(text)
        return tuple(names)

    return parse


def _matching(pattern: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if not re.fullmatch(pattern, text):
            raise ValueError(text)
        return text

    return parse


def _port_of(parts: SplitResult) -> int | None:
    try:
        return parts.port
    except ValueError:
        raise Detailed(f"the port must be a number from 1 to 65535, got "
                       f"{parts.netloc.rpartition(':')[2]!r}") from None


def _endpoint(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/") or \
            parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(text)
    _port_of(parts)
    return f"http://{parts.netloc}"


def parse_addr(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:port``, ``:port`` for every interface); ``ValueError`` if not."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(text)
    return host.strip("[]") or "0.0.0.0", int(port)


_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"


def _host(text: str) -> str:
    host = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        return _matching(rf"(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*\.?")(host)


def _api_version(text: str) -> str:
    try:
        return api_versions.check(text)[0]
    except ValueError as exc:
        raise Detailed(str(exc)) from None


def _instant(text: str) -> datetime:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        raise ValueError("no time zone")
    return moment.astimezone(timezone.utc)


def _rules(text: str) -> tuple[Rule, ...]:
    rules, wrong = parse_rules(text)
    if wrong:
        raise Refused(*wrong)
    return rules


_EXEC_FORM = ('expected a JSON array of strings, the program first (e.g. '
              '["/hooks/drain", "--grace", "60"])')


def _hook(text: str) -> Command:
    """A command line, or the exec form: a JSON array of one or more non-empty strings (as
    Docker's ``["executable", "param"]``), run without a shell; checked at start rather than
    at the first maintenance event."""
    command: Command = text
    if text.startswith("["):
        try:
            argv = json.loads(text)
        except ValueError as exc:
            raise Refused(f"{_EXEC_FORM}; it is not JSON ({exc.args[0] if exc.args else exc})"
                          ) from None
        if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
            raise Refused(_EXEC_FORM)
        if not argv[0] or any("\0" in a for a in argv):
            raise Refused(f"{_EXEC_FORM}, with a program name and no NUL character")
        command = tuple(argv)
    problem = SHELL.check(command)
    if problem:
        raise Refused(problem)
    return command


_PAIRS = "key=value pairs separated by commas"


def _pairs(text: str) -> str:
    """``key=value,key=value`` (values percent-encoded), as the OTel SDK parses it."""
    for item in text.split(","):
        key, sep, _ = item.partition("=")
        if not sep or not key.strip():
            raise Refused(f"expected {_PAIRS}, got {_show(item)}")
    return text


def _implicit_sinks(env: Mapping[str, str]) -> tuple[str, ...]:
    """docs/semantics.md#sinks: console unless something else is configured."""
    sinks = [sink for sink, names in (
        ("otlp", ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT")),
        ("eventhubs", ("SEE_EVENTHUB_CONNECTION_STRING", "SEE_EVENTHUB_NAMESPACE")),
    ) if any(env.get(n, "").strip() for n in names)]
    return tuple(sinks) or ("console",)


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


def _boot_source(config: Config) -> str:
    if config.boot_id_file is not None:
        return str(config.boot_id_file)
    if config.boot_evidence and sys.platform == "win32":
        return "(unset: the boot instant, from the tick count)"
    return "disabled"


def _hook_text(config: Config) -> str:
    hook = config.approval.hook if config.approval else ""
    return scrub(json.dumps(list(hook)) if isinstance(hook, tuple) else hook)


def _eventhubs(config: Config) -> bool:
    return "eventhubs" in config.sinks


def _otlp_metrics(config: Config) -> bool:
    return "otlp" in config.metrics_exporters


def _platform(config: Config) -> bool:
    return config.platform.configured


def _hook_set(config: Config) -> bool:
    return bool(config.approval and config.approval.hook)


_CONNECTION_STRING = ("'Endpoint=sb://...;SharedAccessKeyName=...;SharedAccessKey=...;"
                      "EntityPath=...'")
_NAMESPACE = "the fully qualified namespace, e.g. mynamespace.servicebus.windows.net"
_APPROVAL_ON = ("SEE_APPROVE", "set SEE_APPROVE to enable approval, or unset this")
_OTLP = "OTEL_EXPORTER_OTLP_"
_NAME = r"\s*(?:[A-Za-z_][A-Za-z0-9_]*)?\s*"  # of an environment variable, or nothing

#: Every variable the exporter reads, in the README's order ("Configuration").
SETTINGS: Final[tuple[Setting, ...]] = (
    Setting("SEE_IMDS_ENDPOINT", "imds_endpoint", _endpoint,
            "an http:// URL with host and optional port, no path (e.g. http://169.254.169.254)"),
    Setting("SEE_POLL_INTERVAL", "poll_interval",
            *_seconds(0.2, 3600, "seconds between polls, ", " (IMDS allows 5 requests/s)")),
    Setting("SEE_IMDS_FIRST_TIMEOUT", "imds_first_timeout", *_seconds(1, 600)),
    Setting("SEE_IMDS_TIMEOUT", "imds_timeout", *_seconds(0.1, 60)),
    Setting("SEE_IMDS_API_VERSION", "imds_api_version", _api_version, "a Scheduled Events "
            f"api-version, a date from {api_versions.OLDEST} on (default {api_versions.DEFAULT})"),
    Setting("SEE_SINKS", "sinks", _words(("otlp", "eventhubs", "console")), "a comma-separated "
            "list of otlp, eventhubs, console without repeats", default_from=_implicit_sinks),
    Setting("SEE_STATE_DIR", "state_dir", Path, "a directory, or empty to disable",
            show=lambda c: str(c.state_dir or "disabled"), blank_disables=True,
            default_from=default_state_dir),
    Setting("SEE_STALENESS_LIMIT", "staleness_limit", *_seconds(1, 86400)),
    Setting("SEE_READINESS_INCLUDES", "readiness_includes",
            lambda text: frozenset(_words(READINESS_CHECKS, none=True)(text)),
            "a comma-separated list of sinks, storage (what else may make /readyz fail), or none",
            show=lambda c: ",".join(sorted(c.readiness_includes)) or "(none: IMDS only)"),
    Setting("SEE_HEALTH_ADDR", "health_addr", parse_addr,
            "HOST:PORT with a port from 0 to 65535, or empty to disable", blank_disables=True,
            show=lambda c: "{}:{}".format(*c.health_addr) if c.health_addr else "disabled"),
    Setting("SEE_SHUTDOWN_TIMEOUT", "shutdown_timeout", *_seconds(0, 600)),
    Setting("SEE_SPOOL_MAX_RECORDS", "spool_max_records", *_number(int, 1, 10_000_000)),
    Setting("SEE_SPOOL_MAX_BYTES", "spool_max_bytes", *_number(int, 65_536, 1 << 30, "bytes, ")),
    Setting("SEE_EVENTHUB_CONNECTION_STRING", "eventhub_connection_string", str,
            _CONNECTION_STRING, secret=True,
            when=lambda c: _eventhubs(c) and c.eventhub_connection_string),
    Setting("SEE_EVENTHUB_NAMESPACE", "eventhub_namespace", str, _NAMESPACE,
            when=lambda c: _eventhubs(c) and not c.eventhub_connection_string),
    Setting("SEE_EVENTHUB_NAME", "eventhub_name", str, "the event hub name",
            when=lambda c: _eventhubs(c) and bool(
                c.eventhub_name or not c.eventhub_connection_string
                or _connection_fields(c).get("EntityPath")),
            show=lambda c: c.eventhub_name or
            f"{_connection_fields(c).get('EntityPath', '')} (the connection string's EntityPath)"),
    Setting("SEE_EVENTHUB_METRICS_NAME", "eventhub_metrics_name",
            _matching(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,254}[A-Za-z0-9])?"),  # Event Hubs' rules
            "an event hub name (1-256 letters, digits, '.', '-', '_'; starting and ending with "
            "a letter or digit)", when=_eventhubs,
            show=lambda c: c.eventhub_metrics_name or "(the transitions hub)"),
    Setting("SEE_EVENTHUB_HEARTBEAT", "eventhub_heartbeat",
            *_seconds(10, 86400, "seconds between idle metric snapshots, "), when=_eventhubs),
    Setting("SEE_EVENTHUB_SEND_TIMEOUT", "eventhub_send_timeout", *_seconds(1, 600),
            when=_eventhubs),
    Setting("SEE_BOOT_ID_FILE", "boot_id_file", Path, "a file, or empty to disable",
            show=_boot_source, blank_disables=True),
    Setting("SEE_CLOCK_START", "clock_start", _instant,
            "an RFC 3339 time with a zone, e.g. 2021-07-22T04:36:00Z (replay only)",
            when=lambda c: c.clock_start,
            show=lambda c: c.clock_start.isoformat() if c.clock_start else ""),
    Setting("SEE_LOG_LEVEL", "log_level", _choice("DEBUG", "INFO", "WARNING", "ERROR"),
            "one of debug, info, warning, error"),
    # The platform command's (docs/semantics.md, "The platform's record"); run reads none.
    Setting("SEE_PLATFORM_QUEUE_URL", "platform.queue_url", platform_settings.queue_url,
            platform_settings.QUEUE_URL_EXPECTED, when=_platform),
    Setting("SEE_PLATFORM_QUEUE_CONNECTION_STRING", "platform.queue_connection_string", str,
            "a Storage connection string (AccountName and AccountKey, or a SAS)", secret=True,
            when=lambda c: bool(c.platform.queue_connection_string)),
    Setting("SEE_PLATFORM_QUEUE_NAME", "platform.queue_name", platform_settings.queue_name,
            platform_settings.QUEUE_NAME_EXPECTED, when=lambda c: bool(c.platform.queue_name)),
    Setting("SEE_PLATFORM_POLL_INTERVAL", "platform.poll_interval",
            *_seconds(0.1, 3600, "seconds between receives from an empty queue, "),
            when=_platform),
    Setting("SEE_PLATFORM_VISIBILITY_TIMEOUT", "platform.visibility_timeout",
            *_number(int, 1, 3600, "seconds a received message stays invisible, "),
            when=_platform),
    Setting("SEE_PLATFORM_MAX_DEQUEUE", "platform.max_dequeue",
            *_number(int, 1, 1000, "receives before a message is dead-lettered unread, "),
            when=_platform),
    Setting("SEE_PLATFORM_BACKFILL", "platform.backfill",
            _choice(*platform_settings.BACKFILL_CHOICES),
            "off, or start (read Resource Graph once at every start)", when=_platform),
    Setting("SEE_PLATFORM_SUBSCRIPTIONS", "platform.subscriptions",
            platform_settings.subscriptions,
            "a comma-separated list of subscription ids (GUIDs) for Resource Graph",
            when=lambda c: bool(c.platform.subscriptions)),
    Setting("SEE_PLATFORM_RESOURCE_GRAPH_ENDPOINT", "platform.graph_endpoint",
            platform_settings.graph_endpoint,
            "an https:// URL without a path (http:// only to a loopback stand-in)",
            when=lambda c: c.platform.graph_endpoint != platform_settings.GRAPH_ENDPOINT),
    Setting("SEE_APPROVE", "approval.rules", _rules, RULES_EXPECTED, show=lambda c: ",".join(
        r.text for r in c.approval.rules) if c.approval else " (off)"),
    Setting("SEE_APPROVE_MULTI", "approval.multi", _choice("leader", "any"), "leader or any",
            needs=(_APPROVAL_ON,)),
    Setting("SEE_APPROVE_DRY_RUN", "approval.dry_run",
            lambda text: _choice("true", "1", "yes", "false", "0", "no")(text)
            in ("true", "1", "yes"), "true or false (or 1/0, yes/no)", needs=(_APPROVAL_ON,)),
    Setting("SEE_APPROVE_HOOK", "approval.hook", _hook,
            "a command line, or a JSON array of strings (the exec form)", when=_hook_set,
            show=_hook_text, needs=(_APPROVAL_ON,)),
    Setting("SEE_APPROVE_HOOK_TIMEOUT", "approval.hook_timeout", *_seconds(1, 3600),
            when=_hook_set,
            needs=(_APPROVAL_ON, ("SEE_APPROVE_HOOK", "there is no hook to time out"))),
    # The hook runner reads it when it starts a hook (hook.py); checked here, at start.
    Setting("SEE_APPROVE_HOOK_ENV", "", _matching(rf"{_NAME}(?:,{_NAME})*"),
            "a comma list of environment variable names the hook may inherit",
            needs=(_APPROVAL_ON,)),
    Setting("OTEL_METRICS_EXPORTER", "metrics_exporters_set",
            _words(("otlp", "prometheus"), none=True),
            "a comma-separated list of otlp, prometheus without repeats, or none",
            show=lambda c: ",".join(c.metrics_exporters) or "none"),
    Setting("OTEL_EXPORTER_PROMETHEUS_HOST", "prometheus_host", _host,
            "a host name or IP address to listen on (e.g. 0.0.0.0, 127.0.0.1, ::)",
            when=lambda c: "prometheus" in c.metrics_exporters,
            show=lambda c: c.prometheus_addr[0]),
    Setting("OTEL_EXPORTER_PROMETHEUS_PORT", "prometheus_port", *_PORT,
            when=lambda c: "prometheus" in c.metrics_exporters,
            show=lambda c: str(c.prometheus_addr[1])),
    Setting("OTEL_METRIC_EXPORT_INTERVAL", "metric_export_interval",
            lambda text: _number(int, 1000, 86_400_000)[0](text) / 1000.0,
            "milliseconds, an integer from 1000 to 86400000",
            when=_otlp_metrics,
            show=lambda c: f"{c.metric_export_interval * 1000:g}"),
    # Read and checked per signal by otlp_settings (our own OTLP requests); the defaults shown
    # are the specification's, so a user sees where records go.
    Setting(f"{_OTLP}ENDPOINT", per_signal=True, when=lambda c: "otlp" in c.sinks,
            show=lambda c: f"http://localhost:{4317 if c.otlp_protocol == 'grpc' else 4318}"),
    Setting(f"{_OTLP}PROTOCOL", per_signal=True, when=lambda c: "otlp" in c.sinks,
            show=lambda c: c.otlp_protocol),
    Setting(f"{_OTLP}HEADERS", per_signal=True, secret=True),
    # Seconds, as the Python SDK reads it (the specification says milliseconds; 1000 or more
    # is refused as probably milliseconds): otlp_settings.
    Setting(f"{_OTLP}TIMEOUT", per_signal=True),
    Setting(f"{_OTLP}COMPRESSION", per_signal=True),
    Setting(f"{_OTLP}CERTIFICATE", per_signal=True),
    Setting(f"{_OTLP}CLIENT_KEY", per_signal=True, secret=True),
    Setting(f"{_OTLP}CLIENT_CERTIFICATE", per_signal=True),
    Setting(f"{_OTLP}INSECURE", per_signal=True),
    # Read and checked by otlp_settings too. Shown, defaults included, whenever the otlp sink
    # sends metrics: which rules file and dashboard setting a route needs follows from them
    # (docs/consumption.md, "Pick a route").
    Setting(f"{_OTLP}METRICS_TEMPORALITY_PREFERENCE", when=_otlp_metrics,
            show=lambda c: c.metrics_temporality),
    Setting(f"{_OTLP}METRICS_DEFAULT_HISTOGRAM_AGGREGATION", when=_otlp_metrics,
            show=lambda c: c.metrics_histogram_aggregation),
    # The SDK's resource detector reads these two. It drops a pair without '=' with a warning
    # nobody sees (the SDK's logger is not ours): a missing attribute would only be noticed
    # when a dashboard or an alert that groups by it misses this VM, so that much is checked.
    Setting("OTEL_SERVICE_NAME"),
    Setting("OTEL_RESOURCE_ATTRIBUTES", "", _pairs, _PAIRS, bounded=False),
)
#: Variables whose values are secrets (never printed, logged or put in health output).
SECRET_VARIABLES = frozenset(name for row in SETTINGS if row.secret for name in row.names)


def _show(raw: str) -> str:
    text = scrub(raw[:200])
    text = text if len(text) <= 80 else text[:77] + "..."
    return repr(text)


def _variable_of(problem: str) -> str:
    """The variable a problem line names (``NAME=value: ...`` or ``NAME: ...``)."""
    return problem.split("=", 1)[0].split(":", 1)[0]


_UNSET: Final = object()


def _read(row: Setting, env: Mapping[str, str], problems: list[str]) -> Any:
    """The value of ``row`` in ``env``; ``_UNSET`` when unset, blank or wrong (a wrong one adds
    its problem lines), so the field keeps its default."""
    raw = env.get(row.name)
    if raw is None or not raw.strip():
        return None if raw is not None and row.blank_disables else _UNSET
    if row.parse is None:
        return _UNSET
    printable = REDACTED if row.secret or is_secret_name(row.name) else _show(raw)
    wrong = [f"expected only together with {name} ({why})"
             for name, why in row.needs if not env.get(name, "").strip()][:1]
    if len(raw) > _MAX_VALUE and row.bounded:
        wrong = [f"expected {row.expected}, got a {len(raw)}-byte value"]
    if not wrong:
        try:
            return row.parse(raw.strip())
        except Refused as exc:
            wrong = list(exc.args)
        except Detailed as exc:
            wrong = [f"expected {row.expected} ({exc})"]
        except (ValueError, OverflowError):
            wrong = [f"expected {row.expected}"]
    problems.extend(f"{row.name}={printable}: {text}" for text in wrong)
    return _UNSET


def load_config(env: Mapping[str, str] | None = None, *, create: bool = True,
                command: str = "run") -> Config:
    """Read and validate the configuration; raises :class:`ConfigError` listing every problem.

    ``create=False`` (``check-config``) checks that the state directory could be created
    and written, and leaves the file system as it was. ``command`` ``platform`` also asks
    for what the platform command needs (a queue, a state directory, its extra).
    """
    env = dict(os.environ if env is None else env)
    problems: list[str] = []
    values: dict[str, Any] = {}
    for row in SETTINGS:
        value = _read(row, env, problems)
        if value is _UNSET and row.default_from is not None:
            value = row.default_from(env)
        if value is not _UNSET and row.field:
            values[row.field] = value
    approval = {k.removeprefix("approval."): values.pop(k) for k in [*values]
                if k.startswith("approval.")}
    platform = {k.removeprefix("platform."): values.pop(k) for k in [*values]
                if k.startswith("platform.")}
    host, port = Config().prometheus_addr
    scrape = (values.pop("prometheus_host", host), values.pop("prometheus_port", port))
    config = Config(**values, prometheus_addr=scrape, platform=PlatformSettings(**platform),
                    approval=ApprovalConfig(**approval) if "rules" in approval else None,
                    boot_evidence=env.get("SEE_BOOT_ID_FILE", "unset").strip() != "")
    config, more_problems = _checks(config, env, create=create)
    if command == "platform":
        more_problems.extend(_check_platform(config))
    # A refused value is not checked again with its default in its place: one line each.
    refused = {_variable_of(p) for p in problems}
    problems.extend(p for p in more_problems if _variable_of(p) not in refused)
    if problems:
        raise ConfigError(problems)
    return config


def _checks(config: Config, env: Mapping[str, str], *, create: bool
            ) -> tuple[Config, list[str]]:
    """What involves more than one setting, or the world outside: the configuration completed
    (OTLP targets, warnings) and the problems found."""
    problems: list[str] = []
    sinks = config.sinks
    if "eventhubs" in sinks:
        problems.extend(_check_eventhubs(config))
        problems.extend(_check_eventhubs_library(
            sinks, need_identity=not config.eventhub_connection_string))
    (logs, logs_problems), (metrics, metrics_problems) = (
        otlp_settings.otlp_target(env, signal, check_files="otlp" in sinks)
        for signal in ("logs", "metrics"))
    # A variable both signals read (the general ones) is reported once.
    problems.extend(dict.fromkeys([*logs_problems, *metrics_problems]))
    if "otlp" in sinks:
        problems.extend(_check_grpc_library(
            env, [logs, *([metrics] if "otlp" in config.metrics_exporters else [])]))
    temporality, temporality_problems = otlp_settings.temporality(env)
    problems.extend(temporality_problems)
    aggregation, aggregation_problems = otlp_settings.histogram_aggregation(env)
    problems.extend(aggregation_problems)
    if "otlp" in (config.metrics_exporters_set or ()) and "otlp" not in sinks:
        problems.append(
            f"OTEL_METRICS_EXPORTER={_show(env['OTEL_METRICS_EXPORTER'])}: otlp metrics need the "
            f"otlp sink, expected SEE_SINKS to include otlp (SEE_SINKS is {','.join(sinks)})")
    if env.get("OTEL_EXPORTER_PROMETHEUS_PORT", "unset").strip() == "":
        problems.append(f"OTEL_EXPORTER_PROMETHEUS_PORT='': expected {_PORT[1]} (unset it for "
                        "the default 9464)")
    health, scrape_port = config.health_addr, config.prometheus_addr[1]
    if "prometheus" in config.metrics_exporters and health and health[1] != 0 and \
            health[1] == scrape_port:
        problems.append(f"OTEL_EXPORTER_PROMETHEUS_PORT={scrape_port}: expected a port other "
                        f"than SEE_HEALTH_ADDR's ({health[0]}:{health[1]}); both servers cannot "
                        "listen on one port")
    if config.state_dir is not None:
        problem = (_check_writable if create else _could_write)(config.state_dir)
        if problem:
            problems.append(f"SEE_STATE_DIR={_show(str(config.state_dir))}: {problem}")
    approve = [row.name for row in SETTINGS if row.name.startswith("SEE_APPROVE")]
    problems.extend(f"{name}={_show(env[name])}: expected one of {', '.join(approve)} (unknown "
                    "approval setting)" for name in sorted(env)
                    if name.startswith("SEE_APPROVE_") and name not in approve
                    and env[name].strip())
    warnings = api_versions.check(config.imds_api_version)[1]
    warnings.extend(_unknown_names(env))
    warnings.extend(_without_effect(config, env))
    if "eventhubs" in sinks:
        warnings.extend(_eventhubs_warnings(config))
    if "otlp" in sinks:
        protocols = {"logs": logs.protocol}
        if "otlp" in config.metrics_exporters:
            protocols["metrics"] = metrics.protocol
        warnings.extend(otlp_settings.endpoint_warnings(env, protocols))
    return replace(config, otlp_logs=logs, otlp_metrics=metrics,
                   metrics_temporality=temporality, metrics_histogram_aggregation=aggregation,
                   warnings=tuple(warnings)), problems


#: Variables of these prefixes are the exporter's or its OTLP and metrics configuration: one it
#: does not read is most likely a misspelling, which would otherwise change nothing unsaid.
_OWN_PREFIXES = ("SEE_", "OTEL_EXPORTER_OTLP_", "OTEL_METRIC")
#: Read elsewhere, or the specification's for a signal the exporter does not send (a shared
#: environment may well set them): no warning. SEE_APPROVE_* has its own (an error).
_NOT_OURS = ("SEE_EVENT_", "SEE_FAILPOINT", "SEE_APPROVE_", "OTEL_EXPORTER_OTLP_TRACES_")


def known_names() -> frozenset[str]:
    """Every variable name the exporter reads (each spelling of :data:`SETTINGS`)."""
    return frozenset(name for row in SETTINGS for name in row.names)


def _unknown_names(env: Mapping[str, str]) -> list[str]:
    """One warning per set SEE_*, OTEL_EXPORTER_OTLP_* or OTEL_METRIC* variable the exporter
    does not read, with the closest name it does read. Names only: a value may be a secret."""
    import difflib

    known = known_names()
    warnings = []
    for name in sorted(env):
        if not name.startswith(_OWN_PREFIXES) or name.startswith(_NOT_OURS) or name in known:
            continue
        # 0.85: a letter or two off (SEE_POLL_INTERVALL 0.97, ..._ENDPIONT 0.96), not another
        # specification variable the exporter does not read (OTEL_METRIC_EXPORT_TIMEOUT 0.81).
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.85)
        hint = f"did you mean {close[0]}?" if close else "unset it"
        warnings.append(f"{name} is set, but the exporter reads no variable of that name: it has "
                        f"no effect; {hint} (run --help lists the variables)")
    return warnings


def _without_effect(config: Config, env: Mapping[str, str]) -> list[str]:
    """Settings that are valid but do nothing as the others are set: a sink's settings while
    SEE_SINKS does not select it, and OTEL_METRICS_EXPORTER leaving out the otlp sink's
    metrics. Each names both variables, never a value (credentials among them)."""
    sinks = ",".join(config.sinks)
    warnings = []
    for sink, prefix in (("eventhubs", "SEE_EVENTHUB_"), ("otlp", _OTLP)):
        if sink in config.sinks:
            continue
        names = sorted(n for row in SETTINGS for n in row.names
                       if n.startswith(prefix) and env.get(n, "").strip())
        if names:
            warnings.append(f"{', '.join(names)} {'is' if len(names) == 1 else 'are'} set, but "
                            f"SEE_SINKS={sinks} does not include {sink}: nothing is sent there; "
                            f"expected {sink} in SEE_SINKS, or "
                            f"{'it' if len(names) == 1 else 'them'} unset")
    chosen = config.metrics_exporters_set
    if "otlp" in config.sinks and chosen and "otlp" not in chosen:
        warnings.append(f"OTEL_METRICS_EXPORTER={','.join(chosen)} leaves out otlp while "
                        f"SEE_SINKS={sinks} includes it: the otlp sink sends log records only, "
                        f"no metrics; expected OTEL_METRICS_EXPORTER=otlp,{','.join(chosen)} to "
                        "send metrics both ways")
    return warnings


def _check_eventhubs(config: Config) -> list[str]:
    """A connection string to a hub (its EntityPath or SEE_EVENTHUB_NAME), or a namespace and a
    hub name."""
    hub, namespace = config.eventhub_name, config.eventhub_namespace
    if config.eventhub_connection_string:
        fields = _connection_fields(config)
        if not fields.get("Endpoint", "").startswith("sb://"):
            return [f"SEE_EVENTHUB_CONNECTION_STRING={REDACTED}: expected {_CONNECTION_STRING}"]
        return [] if fields.get("EntityPath") or hub else [
            "SEE_EVENTHUB_NAME: expected the hub name (the connection string has no EntityPath)"]
    problems = []
    if not namespace or "." not in namespace or "/" in namespace:
        problems.append(f"SEE_EVENTHUB_NAMESPACE={_show(namespace)}: expected {_NAMESPACE} (or "
                        "set SEE_EVENTHUB_CONNECTION_STRING)")
    if not hub:
        problems.append("SEE_EVENTHUB_NAME='': expected the event hub name")
    return problems


def _connection_fields(config: Config) -> dict[str, str]:
    """The ``key=value`` fields of the Event Hubs connection string (the key among them: never
    shown)."""
    return dict(part.split("=", 1) for part in config.eventhub_connection_string.split(";")
                if "=" in part)


def _eventhubs_warnings(config: Config) -> list[str]:
    """What a connection string makes of the other Event Hubs settings, said before a send is
    refused: the hub name replaces its EntityPath (azure-eventhub), a namespace is ignored."""
    if not config.eventhub_connection_string:
        return []
    fields = _connection_fields(config)
    entity = fields.get("EntityPath", "")
    warnings = []
    if config.eventhub_namespace:
        used = urlsplit(fields.get("Endpoint", "")).hostname or "its Endpoint"
        warnings.append(f"SEE_EVENTHUB_NAMESPACE={_show(config.eventhub_namespace)} is ignored: "
                        f"SEE_EVENTHUB_CONNECTION_STRING is set and names the namespace "
                        f"({used}); set one of them")
    for name, hub in (("SEE_EVENTHUB_NAME", config.eventhub_name),
                      ("SEE_EVENTHUB_METRICS_NAME", config.eventhub_metrics_name)):
        if entity and hub and hub != entity:
            warnings.append(f"{name}={_show(hub)} is not the connection string's EntityPath "
                            f"({_show(entity)}): a key scoped to that hub is refused for "
                            f"{_show(hub)}; expected a namespace-level key")
    return warnings


def _check_eventhubs_library(sinks: tuple[str, ...], *, need_identity: bool) -> list[str]:
    """The Event Hubs sink's packages come with the eventhubs extra: an install without it (the
    core, the slim image) refuses the sink as a configuration error, not with a traceback.
    azure-identity is needed only without a connection string (managed identity)."""
    modules = ("azure.eventhub", "azure.identity") if need_identity else ("azure.eventhub",)
    absent = extras.missing(extras.EVENTHUBS, modules)
    if not absent:
        return []
    return [extras.problem(f"SEE_SINKS={','.join(sinks)!r}", "the eventhubs sink",
                           extras.EVENTHUBS, absent, "eventhubs removed from SEE_SINKS")]


def _check_grpc_library(env: Mapping[str, str], targets: list[OtlpTarget]) -> list[str]:
    """OTLP over gRPC comes with the grpc extra: a signal sent over gRPC by an install without
    it is refused in one line naming the variable that chose gRPC."""
    chosen = list(dict.fromkeys(otlp_settings.protocol_variable(env, target.signal)
                                for target in targets if target.protocol == "grpc"))
    absent = extras.missing(extras.GRPC) if chosen else []
    if not absent:
        return []
    return [extras.problem(", ".join(f"{name}='grpc'" for name in chosen), "OTLP over gRPC",
                           extras.GRPC, absent,
                           f"{' and '.join(chosen)}=http/protobuf (the collector's port 4318)")]


def extras_outside_core(config: Config, env: Mapping[str, str]) -> list[str]:
    """check-config's warnings for the routes of ``config`` that need an extra whose packages
    are installed (:func:`extras.outside_core`): they work here, and a fresh install that does
    not name the extra refuses them. Not said at every start of ``run``: nothing can tell an
    install that named the extra from one that did not, so the service's log would repeat it
    for every correct install too."""
    warnings = []
    if "eventhubs" in config.sinks:
        modules = (("azure.eventhub",) if config.eventhub_connection_string
                   else ("azure.eventhub", "azure.identity"))
        present = [d for m, d in extras.EVENTHUBS.modules
                   if m in modules and not extras.missing(extras.EVENTHUBS, (m,))]
        if present:
            warnings.append(extras.outside_core(f"SEE_SINKS={','.join(config.sinks)!r}",
                                                "the eventhubs sink", extras.EVENTHUBS,
                                                present))
    targets = [config.otlp_logs,
               *([config.otlp_metrics] if "otlp" in config.metrics_exporters else [])]
    chosen = list(dict.fromkeys(otlp_settings.protocol_variable(env, t.signal)
                                for t in targets if t.protocol == "grpc"))
    if "otlp" in config.sinks and chosen and not extras.missing(extras.GRPC):
        warnings.append(extras.outside_core(", ".join(f"{name}='grpc'" for name in chosen),
                                            "OTLP over gRPC", extras.GRPC, ["grpcio"]))
    return [w for w in warnings if w]


def _check_platform(config: Config) -> list[str]:
    """What the platform command needs: one queue (a URL, or a connection string and a
    name), a state directory (a message is deleted only once its records are in every
    sink's spool: no spool, no delete), and the platform extra."""
    settings = config.platform
    problems = []
    if settings.queue_url and (settings.queue_connection_string or settings.queue_name):
        problems.append("SEE_PLATFORM_QUEUE_URL: expected either it or "
                        "SEE_PLATFORM_QUEUE_CONNECTION_STRING with SEE_PLATFORM_QUEUE_NAME, "
                        "not both")
    elif not settings.queue_url and not (settings.queue_connection_string
                                         and settings.queue_name):
        named = settings.queue_connection_string or settings.queue_name
        missing = [name for name, value in (
            ("SEE_PLATFORM_QUEUE_CONNECTION_STRING", settings.queue_connection_string),
            ("SEE_PLATFORM_QUEUE_NAME", settings.queue_name)) if not value]
        problems.append(f"{missing[0] if named else 'SEE_PLATFORM_QUEUE_URL'}: "
                        "expected the queue Event Grid delivers to: SEE_PLATFORM_QUEUE_URL "
                        "(managed identity), or SEE_PLATFORM_QUEUE_CONNECTION_STRING and "
                        "SEE_PLATFORM_QUEUE_NAME")
    if config.state_dir is None:
        problems.append("SEE_STATE_DIR='': expected a directory: the platform command deletes "
                        "a queue message only once its records are in every sink's spool, "
                        "which lives there")
    modules = (("azure.storage.queue", "azure.identity")
               if settings.queue_url or settings.backfill == "start"
               else ("azure.storage.queue",))
    absent = extras.missing(extras.PLATFORM, modules)
    if absent:
        problems.append(extras.problem("the platform command", "reading the platform's record",
                                       extras.PLATFORM, absent,
                                       "the sidecar's run command alone"))
    return problems


def _could_write(path: Path) -> str:
    """Whether ``path`` is (or could be created as) a writable directory, leaving nothing behind.

    It is tried, not asked: ``os.access`` says yes to root in read-only places such as /proc,
    where ``run`` then fails."""
    created: list[Path] = []
    probe = path
    try:
        # (exists() raises, rather than says no, where a parent may not be searched: a
        # non-root user before systemd's 0700 /var/lib/private, which run reports as a problem.)
        while not probe.exists() and probe.parent != probe:
            created.append(probe)
            probe = probe.parent
    except OSError as exc:
        return f"expected a writable directory ({exc.strerror or exc})"
    try:
        return _check_writable(path)
    finally:
        for made in created:  # deepest first; what existed before is not touched
            with contextlib.suppress(OSError):
                made.rmdir()


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
