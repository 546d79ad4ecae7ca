"""The scrape endpoint in-process (real HTTP on loopback, the SDK reader, a real MeterProvider) and
its configuration: OTEL_METRICS_EXPORTER, OTEL_EXPORTER_PROMETHEUS_HOST / _PORT."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from scheduled_events_exporter.config import ConfigError, load_config
from scheduled_events_exporter.model import ScheduledEvent
from scheduled_events_exporter.scrape import ScrapeEndpoint
from scheduled_events_exporter.telemetry import GaugeSnapshot, Telemetry
from tests.exporter_process import ExporterProcess, clean_env

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def endpoint() -> Iterator[tuple[ScrapeEndpoint, Telemetry]]:
    scrape = ScrapeEndpoint("127.0.0.1", 0)
    telemetry = Telemetry(readers=scrape.metric_readers(), wall=lambda: NOW,
                          monotonic=lambda: 100.0)
    scrape.start(telemetry.per_event_metrics)
    try:
        yield scrape, telemetry
    finally:
        scrape.stop()
        telemetry.shutdown(1)


def scrape(endpoint: ScrapeEndpoint, path: str = "/metrics") -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{endpoint.port}{path}", timeout=5) as r:
        return str(r.read().decode())


def samples(text: str) -> dict[str, list[dict[str, str]]]:
    out: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(dict(sample.labels, value=str(sample.value)))
    return out


def freeze(event_id: str, minutes: int) -> ScheduledEvent:
    return ScheduledEvent(event_id, "Scheduled", event_type="Freeze", resources=("vm",),
                          not_before=NOW + timedelta(minutes=minutes), source="Platform",
                          duration=5)


def test_per_event_series_exist_exactly_while_pending(
        endpoint: tuple[ScrapeEndpoint, Telemetry]) -> None:
    scrape_endpoint, telemetry = endpoint
    telemetry.publish(GaugeSnapshot(events=(freeze("E1", 10), freeze("E2", 20)), vm_name="vm",
                                    incarnation=3, last_good_monotonic=99.0))
    first = samples(scrape(scrape_endpoint))
    countdown = {s["azure_scheduled_event_id"]: float(s["value"])
                 for s in first["azure_scheduled_events_time_to_not_before_seconds"]}
    assert countdown == {"E1": 600.0, "E2": 1200.0}
    assert [s["value"] for s in first["azure_scheduled_events_impact_duration_seconds"]] == [
        "5.0", "5.0"]
    assert first["azure_scheduled_events_imds_staleness_seconds"][0]["value"] == "1.0"
    assert first["azure_scheduled_events_document_incarnation_ratio"][0]["value"] == "3.0"
    telemetry.publish(GaugeSnapshot(events=(freeze("E2", 20),), vm_name="vm", incarnation=4,
                                    last_good_monotonic=99.5))
    second = samples(scrape(scrape_endpoint))
    assert [s["azure_scheduled_event_id"]
            for s in second["azure_scheduled_events_time_to_not_before_seconds"]] == ["E2"]
    telemetry.publish(GaugeSnapshot(vm_name="vm", incarnation=5, last_good_monotonic=99.5))
    third = samples(scrape(scrape_endpoint))
    assert "azure_scheduled_events_time_to_not_before_seconds" not in third
    assert "azure_scheduled_events_impact_duration_seconds" not in third
    assert [s["value"] for s in third["azure_scheduled_events_pending"]] == ["0.0"]


def test_concurrent_scrapes_each_get_one_complete_copy(
        endpoint: tuple[ScrapeEndpoint, Telemetry]) -> None:
    # Two Prometheus replicas scraping at once (HA pairs do): each answer is whole, no errors.
    scrape_endpoint, telemetry = endpoint
    telemetry.publish(GaugeSnapshot(events=(freeze("E1", 10),), vm_name="vm", incarnation=1,
                                    last_good_monotonic=99.0))
    results: list[str] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            for _ in range(10):
                results.append(scrape(scrape_endpoint))
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors and len(results) == 40
    for text in results:
        got = samples(text)
        assert len(got["azure_scheduled_events_time_to_not_before_seconds"]) == 1
        assert len(got["target_info"]) == 1


def test_only_the_metrics_path(endpoint: tuple[ScrapeEndpoint, Telemetry]) -> None:
    with pytest.raises(urllib.error.HTTPError) as info:
        scrape(endpoint[0], "/other")
    assert info.value.code == 404


def test_busy_port_is_a_clear_error() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(OSError) as info:
            ScrapeEndpoint("127.0.0.1", port)
    message = str(info.value)
    assert f"OTEL_EXPORTER_PROMETHEUS_PORT={port}" in message
    assert "in use" in message.lower()


def test_unusable_host_is_a_clear_error() -> None:
    with pytest.raises(OSError) as info:
        ScrapeEndpoint("no-such-host.invalid", 0)
    assert str(info.value).startswith("OTEL_EXPORTER_PROMETHEUS_HOST=no-such-host.invalid: ")


def test_busy_port_fails_the_process_naming_the_variable(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        env = clean_env(SEE_IMDS_ENDPOINT="http://127.0.0.1:9", SEE_STATE_DIR="",
                        SEE_HEALTH_ADDR="", OTEL_METRICS_EXPORTER="prometheus",
                        OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
                        OTEL_EXPORTER_PROMETHEUS_PORT=str(port))
        with ExporterProcess(env) as proc:
            proc.wait_for_output_end(30)
            assert proc.proc.wait(10) == 1
    assert f"OTEL_EXPORTER_PROMETHEUS_PORT={port}" in proc.stderr()
    assert "cannot start" in proc.stderr()


# --------------------------------------------------------------------------------- configuration


def load(tmp_path: Path, **values: str) -> tuple[tuple[str, ...], tuple[str, int]]:
    config = load_config({"SEE_STATE_DIR": "", **values})
    return config.metrics_exporters, config.prometheus_addr


def test_default_follows_the_sinks(tmp_path: Path) -> None:
    assert load(tmp_path) == ((), ("0.0.0.0", 9464))
    assert load(tmp_path, SEE_SINKS="otlp")[0] == ("otlp",)
    assert load(tmp_path, SEE_SINKS="console,eventhubs",
                SEE_EVENTHUB_CONNECTION_STRING="Endpoint=sb://x/;EntityPath=h")[0] == ()


@pytest.mark.parametrize(("value", "sinks", "expected"), [
    ("prometheus", "console", ("prometheus",)),
    (" Prometheus , otlp ", "otlp", ("prometheus", "otlp")),
    ("otlp", "otlp", ("otlp",)),
    ("none", "otlp", ()),
])
def test_valid_metrics_exporters(tmp_path: Path, value: str, sinks: str,
                                 expected: tuple[str, ...]) -> None:
    assert load(tmp_path, OTEL_METRICS_EXPORTER=value, SEE_SINKS=sinks)[0] == expected


@pytest.mark.parametrize(("name", "value"), [
    ("OTEL_METRICS_EXPORTER", "prom"),
    ("OTEL_METRICS_EXPORTER", "prometheus,prometheus"),
    ("OTEL_METRICS_EXPORTER", "none,prometheus"),
    ("OTEL_METRICS_EXPORTER", "console"),
    ("OTEL_METRICS_EXPORTER", ",,"),
    ("OTEL_METRICS_EXPORTER", "otlp"),  # without the otlp sink
    ("OTEL_METRICS_EXPORTER", "prometheus" * 500),
    ("OTEL_EXPORTER_PROMETHEUS_PORT", "70000"),
    ("OTEL_EXPORTER_PROMETHEUS_PORT", "-1"),
    ("OTEL_EXPORTER_PROMETHEUS_PORT", "9464.5"),
    ("OTEL_EXPORTER_PROMETHEUS_PORT", "http"),
    ("OTEL_EXPORTER_PROMETHEUS_HOST", "a b"),
    ("OTEL_EXPORTER_PROMETHEUS_HOST", "http://x/"),
    ("OTEL_EXPORTER_PROMETHEUS_HOST", "user@host"),
])
def test_invalid_values_name_the_variable(tmp_path: Path, name: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, **{name: value})
    (problem,) = info.value.problems
    assert problem.startswith(f"{name}="), problem
    assert "expected" in problem


@given(st.text(alphabet="otlpromehus,n xX", max_size=40))
def test_metrics_exporter_parsing_never_crashes(value: str) -> None:
    try:
        exporters = load_config({"SEE_STATE_DIR": "", "SEE_SINKS": "otlp",
                                 "OTEL_METRICS_EXPORTER": value}).metrics_exporters
    except ConfigError as exc:
        assert [p.split("=", 1)[0] for p in exc.problems] == ["OTEL_METRICS_EXPORTER"]
        return
    assert len(set(exporters)) == len(exporters)
    assert set(exporters) <= {"otlp", "prometheus"}
    if value.strip(" ,") == "":
        assert exporters == ("otlp",)  # unset/empty: follows SEE_SINKS


def test_host_forms(tmp_path: Path) -> None:
    assert load(tmp_path, OTEL_EXPORTER_PROMETHEUS_HOST="[::1]",
                OTEL_EXPORTER_PROMETHEUS_PORT="0")[1] == ("::1", 0)
    assert load(tmp_path, OTEL_EXPORTER_PROMETHEUS_HOST="localhost")[1] == ("localhost", 9464)


def test_bad_value_exits_2_naming_the_variable() -> None:
    env = clean_env(SEE_STATE_DIR="", OTEL_METRICS_EXPORTER="prometheus",
                    OTEL_EXPORTER_PROMETHEUS_PORT="99999")
    result = subprocess.run([sys.executable, "-m", "scheduled_events_exporter", "run"], env=env,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert "OTEL_EXPORTER_PROMETHEUS_PORT='99999': expected a TCP port" in result.stderr


def test_check_config_shows_the_effective_scrape_settings() -> None:
    env = clean_env(SEE_STATE_DIR="", OTEL_METRICS_EXPORTER="prometheus")
    result = subprocess.run([sys.executable, "-m", "scheduled_events_exporter", "check-config"],
                            env=env, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert "OTEL_METRICS_EXPORTER=prometheus" in result.stdout
    assert "OTEL_EXPORTER_PROMETHEUS_HOST=0.0.0.0 (default)" in result.stdout
    assert "OTEL_EXPORTER_PROMETHEUS_PORT=9464 (default)" in result.stdout
