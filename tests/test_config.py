"""Configuration: defaults, every invalid value on its own line, secrets never shown."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scheduled_events_exporter import extras, otlp_settings
from scheduled_events_exporter.approval_rules import ApprovalConfig
from scheduled_events_exporter.config import (
    SECRET_VARIABLES,
    SETTINGS,
    Config,
    ConfigError,
    load_config,
)
from scheduled_events_exporter.platform_settings import PlatformSettings
from scheduled_events_exporter.redact import is_secret_name

#: Whether the eventhubs extra is installed: these are pure tests, also run on core installs
#: (.ci/other-pythons.sh), where an Event Hubs configuration is refused for the missing extra
#: (tests/test_missing_extras.py and tests/test_core_install.py check that line).
EVENTHUBS = not extras.missing(extras.EVENTHUBS)
needs_eventhubs = pytest.mark.skipif(not EVENTHUBS, reason="a core install: the eventhubs "
                                     "extra is not installed")


def env(tmp_path: Path, **values: str) -> dict[str, str]:
    return {"SEE_STATE_DIR": str(tmp_path / "state"), **values}


def test_defaults(tmp_path: Path) -> None:
    config = load_config(env(tmp_path))
    assert config.imds_endpoint == "http://169.254.169.254"
    assert config.poll_interval == 1.0 and config.imds_first_timeout == 130.0
    assert config.imds_timeout == 5.0 and config.sinks == ("console",)
    assert config.health_addr == ("0.0.0.0", 8080) and config.staleness_limit == 30.0
    assert config.otlp_protocol == "http/protobuf" and config.metric_export_interval == 60.0
    assert config.eventhub_heartbeat == 300.0 and config.eventhub_metrics_name == ""
    assert config.gap_threshold == 3.0


def test_eventhub_metrics_hub_and_heartbeat(tmp_path: Path) -> None:
    config = load_config(env(tmp_path, SEE_EVENTHUB_HEARTBEAT="600",
                             SEE_EVENTHUB_METRICS_NAME="see-metrics_1.x"))
    assert config.eventhub_heartbeat == 600.0
    assert config.eventhub_metrics_name == "see-metrics_1.x"


@pytest.mark.parametrize("value", ["0", "9.9", "86401", "nan", "inf", "5m", "-300", "1e400"])
def test_eventhub_heartbeat_is_validated(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env(tmp_path, SEE_EVENTHUB_HEARTBEAT=value))
    assert info.value.problems == [
        f"SEE_EVENTHUB_HEARTBEAT={value!r}: expected seconds between idle metric snapshots, "
        "a number from 10 to 86400"
    ]


@pytest.mark.parametrize("value", ["-metrics", "metrics-", "a b", "hub/x", "h\u00fcb",
                                   "x" * 257, "hub;EntityPath=other", "../hub"])
def test_eventhub_metrics_name_is_validated(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env(tmp_path, SEE_EVENTHUB_METRICS_NAME=value))
    [problem] = info.value.problems
    assert problem.startswith("SEE_EVENTHUB_METRICS_NAME=")
    assert "expected an event hub name" in problem


def test_implicit_sinks_follow_what_is_configured(tmp_path: Path) -> None:
    config = load_config(env(tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT="http://collector:4318"))
    assert config.sinks == ("otlp",)
    config = load_config(env(tmp_path, SEE_SINKS="otlp, console"))
    assert config.sinks == ("otlp", "console")


def test_every_problem_is_reported_on_its_own_line(tmp_path: Path) -> None:
    bad = env(
        tmp_path,
        SEE_POLL_INTERVAL="fast",
        SEE_IMDS_ENDPOINT="ftp://x/y",
        SEE_SINKS="otlp,kafka",
        SEE_HEALTH_ADDR="nonsense",
        SEE_SPOOL_MAX_RECORDS="-1",
        OTEL_EXPORTER_OTLP_PROTOCOL="http/json",
        OTEL_METRIC_EXPORT_INTERVAL="nan",
        SEE_STALENESS_LIMIT="inf",
    )
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    problems = info.value.problems
    assert len(problems) == 8
    for name in (
        "SEE_POLL_INTERVAL='fast'",
        "SEE_IMDS_ENDPOINT='ftp://x/y'",
        "SEE_SINKS='otlp,kafka'",
        "SEE_HEALTH_ADDR='nonsense'",
        "SEE_SPOOL_MAX_RECORDS='-1'",
        "OTEL_EXPORTER_OTLP_PROTOCOL='http/json'",
        "OTEL_METRIC_EXPORT_INTERVAL='nan'",
        "SEE_STALENESS_LIMIT='inf'",
    ):
        assert any(p.startswith(name + ": expected") for p in problems), name


@pytest.mark.parametrize("value", ["0", "-1", "0.1", "1e9", "", "  "])
def test_poll_interval_bounds(tmp_path: Path, value: str) -> None:
    if not value.strip():
        assert load_config(env(tmp_path, SEE_POLL_INTERVAL=value)).poll_interval == 1.0
        return
    with pytest.raises(ConfigError, match=r"from 0\.2 to 3600"):
        load_config(env(tmp_path, SEE_POLL_INTERVAL=value))


def test_oversized_and_hostile_values(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env(tmp_path, SEE_POLL_INTERVAL="1" * 100_000, SEE_SINKS="\x00console"))
    assert len(info.value.problems) == 2
    assert all(len(p) < 300 for p in info.value.problems)


def test_unwritable_state_dir_is_a_configuration_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match=r"SEE_STATE_DIR=.*expected a writable directory"):
        load_config({"SEE_STATE_DIR": str(blocker / "sub")})


@needs_eventhubs
def test_eventhubs_needs_credentials_and_never_shows_secrets(tmp_path: Path) -> None:
    secret = "Endpoint=nope;SharedAccessKey=TOPSECRET"
    with pytest.raises(ConfigError) as info:
        load_config(env(tmp_path, SEE_SINKS="eventhubs", SEE_EVENTHUB_CONNECTION_STRING=secret))
    assert "TOPSECRET" not in str(info.value)
    with pytest.raises(ConfigError) as info:
        load_config(env(tmp_path, SEE_SINKS="eventhubs", SEE_EVENTHUB_NAMESPACE="ns"))
    assert len(info.value.problems) == 2


@needs_eventhubs
def test_what_a_connection_string_makes_of_the_other_hub_settings_is_said(
        tmp_path: Path) -> None:
    scoped = ("Endpoint=sb://x.servicebus.windows.net/;SharedAccessKeyName=k;"
              "SharedAccessKey=TOPSECRET;EntityPath=hub1")
    config = load_config(env(tmp_path, SEE_SINKS="eventhubs", SEE_EVENTHUB_CONNECTION_STRING=scoped,
                             SEE_EVENTHUB_NAME="hub2", SEE_EVENTHUB_METRICS_NAME="hub1",
                             SEE_EVENTHUB_NAMESPACE="other.servicebus.windows.net"))
    assert config.warnings == (
        "SEE_EVENTHUB_NAMESPACE='other.servicebus.windows.net' is ignored: "
        "SEE_EVENTHUB_CONNECTION_STRING is set and names the namespace "
        "(x.servicebus.windows.net); set one of them",
        "SEE_EVENTHUB_NAME='hub2' is not the connection string's EntityPath ('hub1'): a key "
        "scoped to that hub is refused for 'hub2'; expected a namespace-level key")
    assert "SEE_EVENTHUB_NAME=hub2" in config.describe({})
    same = load_config(env(tmp_path, SEE_SINKS="eventhubs", SEE_EVENTHUB_CONNECTION_STRING=scoped,
                           SEE_EVENTHUB_NAME="hub1"))
    assert same.warnings == ()
    alone = load_config(env(tmp_path, SEE_SINKS="eventhubs", SEE_EVENTHUB_CONNECTION_STRING=scoped))
    assert "SEE_EVENTHUB_NAME=hub1 (the connection string's EntityPath)" in alone.describe({})
    assert "TOPSECRET" not in "".join(alone.describe({})) + "".join(config.warnings)


def _cli(args: list[str], extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SEE_", "OTEL_"))}
    return subprocess.run(
        [sys.executable, "-m", "scheduled_events_exporter", *args],
        env={**clean, **extra},
        capture_output=True,
        text=True,
        timeout=60,
    )


@needs_eventhubs
def test_check_config_redacts_secrets(tmp_path: Path) -> None:
    result = _cli(
        ["check-config"],
        env(
            tmp_path,
            SEE_SINKS="otlp,eventhubs",
            SEE_EVENTHUB_CONNECTION_STRING="Endpoint=sb://x.servicebus.windows.net/;"
            "SharedAccessKeyName=k;SharedAccessKey=TOPSECRET;EntityPath=hub",
            OTEL_EXPORTER_OTLP_HEADERS="authorization=Bearer TOPSECRET",
            OTEL_EXPORTER_OTLP_ENDPOINT="http://collector:4318",
        ),
    )
    assert result.returncode == 0, result.stderr
    assert "TOPSECRET" not in result.stdout + result.stderr
    assert "SEE_EVENTHUB_CONNECTION_STRING=<redacted>" in result.stdout
    assert "OTEL_EXPORTER_OTLP_HEADERS=<redacted>" in result.stdout
    assert "SEE_SINKS=otlp,eventhubs" in result.stdout


def test_run_with_bad_config_exits_2_with_one_line_per_problem(tmp_path: Path) -> None:
    result = _cli(["run"], env(tmp_path, SEE_POLL_INTERVAL="x", SEE_SINKS="nope"))
    assert result.returncode == 2
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("configuration error:")]
    assert len(lines) == 2


@pytest.mark.parametrize(("value", "expected"), [
    (None, frozenset()), ("none", frozenset()), ("sinks", {"sinks"}),
    (" Storage , sinks ", {"sinks", "storage"}),
])
def test_readiness_includes_only_what_is_named(tmp_path: Path, value: str | None,
                                               expected: set[str]) -> None:
    settings = {} if value is None else {"SEE_READINESS_INCLUDES": value}
    assert load_config(env(tmp_path, **settings)).readiness_includes == expected


@pytest.mark.parametrize("value", ["imds", "sinks,sinks", "none,sinks", "collector", ","])
def test_readiness_includes_refuses_anything_else(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env(tmp_path, SEE_READINESS_INCLUDES=value))
    (problem,) = info.value.problems
    assert problem.startswith(f"SEE_READINESS_INCLUDES={value!r}: expected a comma-separated "
                              "list of sinks, storage"), problem


# --- the table of settings is the one source ----------------------------------------------------

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_variables() -> list[str]:
    """The variables the README's "Configuration" table names, in its order."""
    section = README.read_text().split("\n## Configuration\n", 1)[1].split("\n### ", 1)[0]
    return re.findall(r"^\| `([A-Z0-9_]+)` \|", section, re.M)


def test_the_readme_table_names_exactly_the_settings_in_their_order() -> None:
    assert readme_variables() == [row.name for row in SETTINGS]


def test_every_field_a_row_fills_exists() -> None:
    fields = {f.name for f in dataclasses.fields(Config)}
    approval = {f"approval.{f.name}" for f in dataclasses.fields(ApprovalConfig)}
    approval |= {f"platform.{f.name}" for f in dataclasses.fields(PlatformSettings)}
    # The two Prometheus rows make one field, prometheus_addr.
    for row in SETTINGS:
        assert not row.field or row.field in fields | approval | {
            "prometheus_host", "prometheus_port"}, row
    assert len({row.name for row in SETTINGS}) == len(SETTINGS)


def test_secrets_are_the_secret_rows_and_every_secret_looking_name_is_one() -> None:
    assert {n for row in SETTINGS if row.secret for n in row.names} == SECRET_VARIABLES
    assert {"SEE_EVENTHUB_CONNECTION_STRING", "OTEL_EXPORTER_OTLP_HEADERS",
            "OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY"} <= SECRET_VARIABLES
    for row in SETTINGS:
        assert row.secret == any(is_secret_name(n) for n in row.names), row.name


class Recording(dict[str, str]):
    """An environment that notes every variable asked for."""

    def __init__(self, values: dict[str, str]) -> None:
        super().__init__(values)
        self.asked: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        self.asked.add(key)
        return super().get(key, default)


def test_otlp_settings_reads_exactly_the_otlp_rows_the_table_does_not_parse() -> None:
    env = Recording({})
    for signal in ("logs", "metrics"):
        otlp_settings.otlp_target(env, signal)
    otlp_settings.temporality(env)
    otlp_settings.histogram_aggregation(env)
    otlp_settings.endpoint_warnings(env, {"logs": "grpc", "metrics": "grpc"})
    rows = {n for row in SETTINGS if row.name.startswith("OTEL_EXPORTER_OTLP_")
            for n in row.names}
    assert env.asked == rows
    # ... and those rows are checked there alone (a wrong value is one line, not two).
    assert all(row.parse is None for row in SETTINGS if row.name.startswith(
        "OTEL_EXPORTER_OTLP_"))


def full_environment(tmp_path: Path) -> dict[str, str]:
    """Every variable of the table set to a valid value that makes it matter (the eventhubs
    sink on, where its extra is installed)."""
    pem = tmp_path / "x.pem"
    pem.write_text("not checked beyond being readable")
    return env(
        tmp_path,
        SEE_IMDS_ENDPOINT="http://127.0.0.1:8999", SEE_POLL_INTERVAL="2",
        SEE_IMDS_FIRST_TIMEOUT="60", SEE_IMDS_TIMEOUT="3", SEE_IMDS_API_VERSION="2020-07-01",
        SEE_SINKS="otlp,eventhubs,console" if EVENTHUBS else "otlp,console",
        SEE_STALENESS_LIMIT="40",
        SEE_READINESS_INCLUDES="sinks", SEE_HEALTH_ADDR="127.0.0.1:8081",
        SEE_SHUTDOWN_TIMEOUT="5", SEE_SPOOL_MAX_RECORDS="100", SEE_SPOOL_MAX_BYTES="65536",
        SEE_EVENTHUB_NAMESPACE="ns.servicebus.windows.net", SEE_EVENTHUB_NAME="hub",
        SEE_EVENTHUB_METRICS_NAME="metrics", SEE_EVENTHUB_HEARTBEAT="600",
        SEE_EVENTHUB_SEND_TIMEOUT="30", SEE_BOOT_ID_FILE="/nonexistent/boot_id",
        SEE_CLOCK_START="2021-07-22T04:36:00Z", SEE_LOG_LEVEL="debug", SEE_APPROVE="user",
        SEE_APPROVE_MULTI="any", SEE_APPROVE_DRY_RUN="true",
        SEE_APPROVE_HOOK=json.dumps([sys.executable, "-c", "pass"]),
        SEE_APPROVE_HOOK_TIMEOUT="30", SEE_APPROVE_HOOK_ENV="MY_TOOL_HOME",
        OTEL_METRICS_EXPORTER="otlp,prometheus", OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
        OTEL_EXPORTER_PROMETHEUS_PORT="9465", OTEL_METRIC_EXPORT_INTERVAL="30000",
        OTEL_EXPORTER_OTLP_ENDPOINT="http://collector:4318",
        OTEL_EXPORTER_OTLP_LOGS_ENDPOINT="http://collector:4318/v1/logs",
        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
        OTEL_EXPORTER_OTLP_HEADERS="authorization=Bearer TOPSECRET",
        OTEL_EXPORTER_OTLP_TIMEOUT="5", OTEL_EXPORTER_OTLP_COMPRESSION="gzip",
        OTEL_EXPORTER_OTLP_CERTIFICATE=str(pem), OTEL_EXPORTER_OTLP_CLIENT_KEY=str(pem),
        OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE=str(pem), OTEL_EXPORTER_OTLP_INSECURE="false",
        OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE="delta",
        OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION="base2_exponential_bucket_histogram",
        OTEL_SERVICE_NAME="svc", OTEL_RESOURCE_ATTRIBUTES="team=sre",
        SEE_PLATFORM_QUEUE_URL="https://acct.queue.core.windows.net/scheduled-events",
        SEE_PLATFORM_POLL_INTERVAL="2", SEE_PLATFORM_VISIBILITY_TIMEOUT="60",
        SEE_PLATFORM_MAX_DEQUEUE="5", SEE_PLATFORM_BACKFILL="start",
        SEE_PLATFORM_SUBSCRIPTIONS="0b6f1a2c-3d4e-4f50-8a9b-1c2d3e4f5a6b",
        SEE_PLATFORM_RESOURCE_GRAPH_ENDPOINT="https://management.usgovcloudapi.net")

#: The platform queue's other way in (a connection string and a name) is not set beside its
#: URL: one or the other.
_OTHER_QUEUE_WAY = {"SEE_PLATFORM_QUEUE_CONNECTION_STRING", "SEE_PLATFORM_QUEUE_NAME"}


def test_describe_lists_every_non_secret_row_in_the_table_order(tmp_path: Path) -> None:
    values = full_environment(tmp_path)
    assert set(values) - {"OTEL_EXPORTER_OTLP_LOGS_ENDPOINT"} == {
        row.name for row in SETTINGS} - {"SEE_EVENTHUB_CONNECTION_STRING", *_OTHER_QUEUE_WAY}
    lines = load_config(values, create=False).describe(values)
    named = [line.split("=", 1)[0] for line in lines]
    # Every non-secret row, and the per-signal spelling set; the connection string is not
    # (a namespace is the credential here).
    # (Where the eventhubs extra is missing, the sink is off and its rows are not described.)
    expected = [n for row in SETTINGS for n in row.names if (n in values or (
        not row.secret and n == row.name)) and (EVENTHUBS or not n.startswith("SEE_EVENTHUB_"))
        and n not in _OTHER_QUEUE_WAY]
    assert named == expected
    assert "OTEL_EXPORTER_OTLP_HEADERS=<redacted>" in lines
    assert "OTEL_EXPORTER_OTLP_CLIENT_KEY=<redacted>" in lines
    assert "TOPSECRET" not in "\n".join(lines)


def test_every_bounded_row_refuses_an_oversized_value_in_one_line(tmp_path: Path) -> None:
    values = full_environment(tmp_path)
    for row in SETTINGS:
        if row.parse is None or not row.bounded:
            continue
        with pytest.raises(ConfigError) as info:
            load_config({**values, row.name: "x" * 5000}, create=False)
        (problem,) = info.value.problems
        assert problem.startswith(f"{row.name}=") and "5000-byte value" in problem, problem
        assert len(problem) < 400
