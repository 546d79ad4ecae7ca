"""Configuration: defaults, every invalid value on its own line, secrets never shown."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scheduled_events_exporter.config import ConfigError, load_config


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


def test_eventhubs_needs_credentials_and_never_shows_secrets(tmp_path: Path) -> None:
    secret = "Endpoint=nope;SharedAccessKey=TOPSECRET"
    with pytest.raises(ConfigError) as info:
        load_config(env(tmp_path, SEE_SINKS="eventhubs", SEE_EVENTHUB_CONNECTION_STRING=secret))
    assert "TOPSECRET" not in str(info.value)
    with pytest.raises(ConfigError) as info:
        load_config(env(tmp_path, SEE_SINKS="eventhubs", SEE_EVENTHUB_NAMESPACE="ns"))
    assert len(info.value.problems) == 2


def _cli(args: list[str], extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SEE_", "OTEL_"))}
    return subprocess.run(
        [sys.executable, "-m", "scheduled_events_exporter", *args],
        env={**clean, **extra},
        capture_output=True,
        text=True,
        timeout=60,
    )


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
