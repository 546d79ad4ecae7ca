"""Names identical on every route: one exporter exports OTLP (to a real collector, rotel) and
serves the Prometheus scrape at once; the OTLP metrics translated by the OpenTelemetry
Collector's Prometheus rules (prometheus/otlptranslator, ``UnderscoreEscapingWithSuffixes``,
the default of the Collector's prometheus and prometheusremotewrite exporters) must give exactly
the sample names and label names the scrape shows."""

from __future__ import annotations

import re
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from scheduled_events_exporter.simulator import Simulator
from scheduled_events_exporter.telemetry import METRICS
from tests.exporter_process import ExporterProcess, clean_env, free_port
from tests.peers.rotel import ReceivedMetric, RotelReceiver

#: otlptranslator's unit words (the subset our instruments can use, plus its common ones).
UNIT_WORDS = {"s": "seconds", "ms": "milliseconds", "By": "bytes", "%": "percent", "1": "",
              "d": "days", "h": "hours", "min": "minutes"}


def collector_family(metric: ReceivedMetric) -> str:
    """The metric name the Collector's translator renders (without histogram sample suffixes):
    name tokens split on anything but [A-Za-z0-9:], unit annotations ``{...}`` dropped, the unit
    word appended unless already a token, ``_total`` for monotonic sums, ``_ratio`` for gauges of
    unit ``1``."""
    tokens = [t for t in re.split(r"[^A-Za-z0-9:]+", metric.name) if t]
    unit = re.sub(r"\{[^}]*\}", "", metric.unit)
    word = UNIT_WORDS.get(unit, unit)
    if word and word not in tokens:
        tokens.append(word)
    if metric.kind == "Sum" and metric.is_monotonic:
        tokens = [t for t in tokens if t != "total"] + ["total"]
    if metric.kind == "Gauge" and metric.unit == "1":
        tokens = [t for t in tokens if t != "ratio"] + ["ratio"]
    return "_".join(tokens)


def collector_label(key: str) -> str:
    """otlptranslator's label rule: every invalid character becomes ``_``; a leading digit gets
    ``key_``."""
    label = re.sub(r"[^A-Za-z0-9_]", "_", key)
    return "key_" + label if label[:1].isdigit() else label


def collector_samples(metrics: list[ReceivedMetric]) -> dict[str, set[frozenset[str]]]:
    """{sample name: {label-name sets}} the Collector route would give."""
    out: dict[str, set[frozenset[str]]] = {}
    for metric in metrics:
        family = collector_family(metric)
        names = ([f"{family}_bucket", f"{family}_sum", f"{family}_count"]
                 if metric.kind == "Histogram" else [family])
        for point in metric.points:
            labels = frozenset(collector_label(k) for k in point.attributes)
            for name in names:
                out.setdefault(name, set()).add(labels | ({"le"} if name.endswith("_bucket")
                                                          else frozenset()))
    return out


def scrape_samples(text: str) -> dict[str, set[frozenset[str]]]:
    """{sample name: {label-name sets}} of a scrape, scope labels (``otel_scope_*``) aside."""
    out: dict[str, set[frozenset[str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "target_info":
                continue
            labels = frozenset(k for k in sample.labels if not k.startswith("otel_scope_"))
            out.setdefault(sample.name, set()).add(labels)
    return out


@pytest.fixture(scope="module")
def both_routes() -> tuple[list[ReceivedMetric], str]:
    """(the last OTLP export of each instrument, a scrape) of one exporter after every instrument
    has a point: a pending Reboot (per-event gauges, notice), a dry-run approval, a logs endpoint
    nobody listens on (export failures)."""
    wanted = {name for name, _, _ in METRICS}
    with Simulator(vm_name="vm-names") as sim, RotelReceiver() as rotel:
        reboot = [{"EventId": "NAMES-1", "EventStatus": "Scheduled", "EventType": "Reboot",
                         "ResourceType": "VirtualMachine", "Resources": ["vm-names"],
                         "NotBefore": "Mon, 11 Apr 2099 22:26:58 GMT", "Description": "",
                         "EventSource": "User", "DurationInSeconds": 30}]
        port = free_port()
        env = clean_env(
            SEE_IMDS_ENDPOINT=sim.url, SEE_SINKS="otlp", SEE_STATE_DIR="", SEE_HEALTH_ADDR="",
            SEE_POLL_INTERVAL="0.5", SEE_APPROVE="user", SEE_APPROVE_DRY_RUN="true",
            OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=f"{rotel.http_endpoint}/v1/metrics",
            OTEL_EXPORTER_OTLP_LOGS_ENDPOINT=f"http://127.0.0.1:{free_port()}/v1/logs",
            OTEL_EXPORTER_OTLP_TIMEOUT="1", OTEL_METRIC_EXPORT_INTERVAL="1000",
            OTEL_METRICS_EXPORTER="otlp,prometheus", OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
            OTEL_EXPORTER_PROMETHEUS_PORT=str(port),
        )
        with ExporterProcess(env) as proc:
            # Appearing while watched: its notice is counted (a first sight's is not).
            proc.wait_for(lambda: "first document received" in proc.stderr(), 30, "a poll")
            sim.set_events(reboot)
            rotel.wait_for_metric("azure.scheduled_events.export.failures", timeout=60)
            assert proc.wait_until(lambda: wanted <= {m.name for m in rotel.metrics}, 30)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
            proc.terminate()
        latest = {m.name: m for m in rotel.metrics if m.name in wanted}
        return list(latest.values()), text


def test_every_instrument_reached_both_routes(both_routes: tuple[list[ReceivedMetric], str]
                                              ) -> None:
    metrics, text = both_routes
    assert {m.name for m in metrics} == {name for name, _, _ in METRICS}
    assert len(scrape_samples(text)) >= len(METRICS)


def test_scrape_names_equal_the_collector_translation(
        both_routes: tuple[list[ReceivedMetric], str]) -> None:
    metrics, text = both_routes
    collector = collector_samples(metrics)
    scrape = scrape_samples(text)
    assert set(scrape) == set(collector), (sorted(set(scrape) ^ set(collector)))
    for name in collector:
        # Label names per series; the values differ between two moments, the names must not.
        assert scrape[name] == collector[name], name
    assert "azure_scheduled_events_document_incarnation_ratio" in scrape
    assert "azure_scheduled_events_time_to_not_before_seconds" in scrape
    assert "azure_scheduled_events_transitions_total" in scrape


def test_scrape_has_scope_labels_and_target_info(
        both_routes: tuple[list[ReceivedMetric], str]) -> None:
    metrics, text = both_routes
    families = list(text_string_to_metric_families(text))
    (info,) = [s for f in families for s in f.samples if s.name == "target_info"]
    resource = metrics[0].resource
    # The Collector turns service.name / service.instance.id into job / instance and the rest into
    # target_info labels; the scrape keeps them all on target_info (Prometheus sets job/instance).
    assert set(info.labels) == {collector_label(k) for k in resource}
    assert info.labels["service_name"] == "azure-scheduled-events-exporter"
    for family in families:
        for sample in family.samples:
            if sample.name != "target_info":
                assert sample.labels["otel_scope_name"] == "scheduled_events_exporter", sample


def test_metrics_exporter_without_otlp_sends_records_but_no_otlp_metrics() -> None:
    # OTEL_METRICS_EXPORTER=prometheus with SEE_SINKS=otlp: log records over OTLP, metrics only on
    # the scrape (the OTLP metric reader is not created).
    with Simulator(vm_name="vm-names") as sim, RotelReceiver() as rotel:
        sim.set_events([{"EventId": "NAMES-2", "EventStatus": "Scheduled", "EventType": "Freeze",
                         "ResourceType": "VirtualMachine", "Resources": ["vm-names"],
                         "NotBefore": "Mon, 11 Apr 2099 22:26:58 GMT", "Description": "",
                         "EventSource": "Platform", "DurationInSeconds": 5}])
        port = free_port()
        env = clean_env(
            SEE_IMDS_ENDPOINT=sim.url, SEE_SINKS="otlp", SEE_STATE_DIR="", SEE_HEALTH_ADDR="",
            SEE_POLL_INTERVAL="0.5", OTEL_EXPORTER_OTLP_ENDPOINT=rotel.http_endpoint,
            OTEL_METRIC_EXPORT_INTERVAL="1000", OTEL_METRICS_EXPORTER="prometheus",
            OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1", OTEL_EXPORTER_PROMETHEUS_PORT=str(port),
        )
        url = f"http://127.0.0.1:{port}/metrics"

        def polls() -> float:
            with urllib.request.urlopen(url, timeout=5) as r:
                families = text_string_to_metric_families(r.read().decode())
            return sum(s.value for f in families for s in f.samples
                       if s.name == "azure_scheduled_events_imds_requests_total")

        with ExporterProcess(env) as proc:
            rotel.wait_for_logs(lambda log: log.event_name.endswith(".scheduled"), timeout=30)
            # Three metric export intervals (1 s) after the record: 6 more polls at 0.5 s.
            start = polls()
            assert proc.wait_until(lambda: polls() >= start + 6, 30)
            assert proc.terminate() == 0
        assert rotel.metrics == []
