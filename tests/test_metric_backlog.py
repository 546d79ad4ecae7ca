"""Delta counts survive refusals: the bounded backlog of refused delta batches
(sinks/metric_backlog.py, pure), and the metric exporter that keeps and resends them
(sinks/otlp.py) against a real HTTP server whose answers the test sets. The process test with
the exporter and the scripted collector is
tests/test_otlp_conformance.py::test_delta_metrics_refused_for_8_s_add_up_to_every_transition.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Metric,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from scheduled_events_exporter.config import load_config
from scheduled_events_exporter.delivery.pause import Pause
from scheduled_events_exporter.otlp_settings import OtlpTarget
from scheduled_events_exporter.sinks.metric_backlog import KeptBatch, MetricBacklog
from scheduled_events_exporter.sinks.otlp import (
    TEMPORALITIES,
    OtlpMetricExporter,
    OtlpSink,
    authority,
)
from tests.test_otlp_transport import Server, serve

# --- The backlog (pure) ------------------------------------------------------------------------


def batch(n: int, size: int = 10, points: int = 1) -> KeptBatch:
    return KeptBatch(bytes([n % 256]) * size, points, start=n * 10, end=n * 10 + 10)


def test_batches_come_back_oldest_first() -> None:
    backlog = MetricBacklog(max_batches=10, max_bytes=1000)
    for n in range(3):
        assert backlog.keep(batch(n, points=n + 1)) == []
    assert (len(backlog), backlog.bytes, backlog.points) == (3, 30, 6)
    assert [backlog.sent().start for _ in range(3)] == [0, 10, 20]
    assert backlog.first() is None and (len(backlog), backlog.bytes) == (0, 0)


def test_past_the_batch_bound_the_oldest_are_dropped_and_returned() -> None:
    backlog = MetricBacklog(max_batches=3, max_bytes=1000)
    for n in range(3):
        backlog.keep(batch(n))
    dropped = backlog.keep(batch(3))
    assert [b.start for b in dropped] == [0]
    assert [b.start for b in (backlog.sent(), backlog.sent(), backlog.sent())] == [10, 20, 30]


def test_past_the_byte_bound_the_oldest_are_dropped_but_the_newest_always_stays() -> None:
    backlog = MetricBacklog(max_batches=100, max_bytes=25)
    backlog.keep(batch(0))
    backlog.keep(batch(1))
    assert [b.start for b in backlog.keep(batch(2))] == [0]  # 30 bytes > 25
    assert backlog.bytes == 20
    huge = batch(3, size=100)
    assert [b.start for b in backlog.keep(huge)] == [10, 20]
    assert (len(backlog), backlog.first()) == (1, huge)


def test_bounds_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        MetricBacklog(max_batches=0)
    with pytest.raises(ValueError, match="at least 1"):
        MetricBacklog(max_bytes=0)


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(min_value=1, max_value=60), max_size=50),
       max_batches=st.integers(min_value=1, max_value=8),
       max_bytes=st.integers(min_value=1, max_value=200))
def test_within_the_bounds_oldest_dropped_first_the_newest_always_kept(
        sizes: list[int], max_batches: int, max_bytes: int) -> None:
    backlog = MetricBacklog(max_batches, max_bytes)
    dropped: list[KeptBatch] = []
    for n, size in enumerate(sizes):
        dropped += backlog.keep(batch(n, size))
        assert len(backlog) <= max_batches
        assert backlog.bytes <= max_bytes or len(backlog) == 1
        assert backlog.first() is not None
    kept = [backlog.sent() for _ in range(len(backlog))]
    assert backlog.bytes == 0
    # What was dropped and what is kept are the input, in order: the oldest went first.
    assert [b.start for b in dropped + kept] == [n * 10 for n in range(len(sizes))]
    if sizes:
        assert kept[-1].start == (len(sizes) - 1) * 10


# --- The exporter against a real HTTP server ---------------------------------------------------

RESOURCE = Resource.create({"service.name": "test"})
SCOPE = InstrumentationScope("scheduled_events_exporter")
SECOND = 1_000_000_000


def collected(window: int, transitions: int, temporality: AggregationTemporality
              ) -> MetricsData:
    """What the SDK hands an export: a counter of ``transitions`` over the ``window``-th
    second, and a gauge (never kept: the next collection reads it again)."""
    start = (0 if temporality is AggregationTemporality.CUMULATIVE else window) * SECOND
    counter = Metric("azure.scheduled_events.transitions", "", "{transition}", Sum(
        [NumberDataPoint({"transition": "scheduled"}, start, (window + 1) * SECOND,
                         transitions)], temporality, True))
    gauge = Metric("azure.scheduled_events.pending", "", "{event}", Gauge(
        [NumberDataPoint({}, 0, (window + 1) * SECOND, 1)]))
    return MetricsData([ResourceMetrics(RESOURCE, [ScopeMetrics(SCOPE, [counter, gauge], "")],
                                        "")])


def sent(server: Server) -> list[tuple[str, int, int, int]]:
    """(metric, start second, end second, value) of every point the server was sent."""
    out = []
    for seen in server.seen:
        request = ExportMetricsServiceRequest()
        request.ParseFromString(seen.body)
        for resource in request.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    data = metric.sum if metric.HasField("sum") else metric.gauge
                    out += [(metric.name.rsplit(".", 1)[1], p.start_time_unix_nano // SECOND,
                             p.time_unix_nano // SECOND, p.as_int) for p in data.data_points]
    return out


@pytest.fixture
def http() -> Iterator[Server]:
    yield from serve()


def exporter(server: Server, preference: str, failures: list[tuple[str, str, int]],
             backlog: MetricBacklog | None = None) -> OtlpMetricExporter:
    return OtlpMetricExporter(
        OtlpTarget("metrics", endpoint=f"http://127.0.0.1:{server.port}/v1/metrics",
                   timeout=5.0), "otlp", lambda *f: failures.append(f),
        temporality=TEMPORALITIES[preference], backlog=backlog)


DELTA = AggregationTemporality.DELTA
CUMULATIVE = AggregationTemporality.CUMULATIVE


def test_delta_points_refused_are_sent_first_with_their_own_windows(
        http: Server, caplog: pytest.LogCaptureFixture) -> None:
    http.replies += [(503, {}, b""), (503, {}, b"")]  # two exports refused, then accepted
    failures: list[tuple[str, str, int]] = []
    metrics = exporter(http, "delta", failures)
    try:
        with caplog.at_level(logging.INFO):
            assert metrics.export(collected(0, 2, DELTA)) is MetricExportResult.FAILURE
            # The second export tries the kept batch first; refused, it is kept too.
            assert metrics.export(collected(1, 1, DELTA)) is MetricExportResult.FAILURE
            assert metrics.export(collected(2, 0, DELTA)) is MetricExportResult.SUCCESS
    finally:
        metrics.shutdown()
    points = sent(http)
    accepted = points[-4:]  # the two kept batches (delta only), then the whole export
    assert accepted == [("transitions", 0, 1, 2), ("transitions", 1, 2, 1),
                        ("transitions", 2, 3, 0), ("pending", 0, 3, 1)], points
    assert len(http.seen) == 5  # refused: the first export, the kept batch; then 3 accepted
    assert failures == [("otlp", "metrics", 1)] * 2
    said = [r.getMessage() for r in caplog.records]
    assert any("the delta points are kept" in m for m in said), said
    assert any("2 kept delta batches (2 data points) delivered in order" in m for m in said)


def test_cumulative_points_are_not_kept_the_next_export_reads_them_again(
        http: Server, caplog: pytest.LogCaptureFixture) -> None:
    http.replies.append((503, {}, b""))
    failures: list[tuple[str, str, int]] = []
    metrics = exporter(http, "cumulative", failures)
    try:
        assert metrics.export(collected(0, 2, CUMULATIVE)) is MetricExportResult.FAILURE
        assert metrics.export(collected(1, 3, CUMULATIVE)) is MetricExportResult.SUCCESS
    finally:
        metrics.shutdown()
    assert len(http.seen) == 2, "only the new export, which holds the total"
    assert sent(http)[-2:] == [("transitions", 0, 2, 3), ("pending", 0, 2, 1)]
    line = next(r.getMessage() for r in caplog.records if "metric export failed" in
                r.getMessage())
    assert "cumulative metrics and gauges are read again" in line
    assert "delta" not in line


def test_a_delta_batch_refused_for_good_is_dropped_and_counted_not_resent(http: Server) -> None:
    http.replies.append((400, {}, b"bad"))
    failures: list[tuple[str, str, int]] = []
    metrics = exporter(http, "delta", failures)
    try:
        assert metrics.export(collected(0, 2, DELTA)) is MetricExportResult.FAILURE
        assert metrics.export(collected(1, 1, DELTA)) is MetricExportResult.SUCCESS
    finally:
        metrics.shutdown()
    assert len(http.seen) == 2, "the refused batch is not sent again"
    assert ("otlp", "metrics_dropped", 1) in failures


def test_past_the_bound_the_oldest_delta_batches_are_dropped_counted_and_said_once(
        http: Server, caplog: pytest.LogCaptureFixture) -> None:
    # The collector refusing 5 exports in a row, at most 2 batches kept.
    http.replies += [(503, {}, b"")] * 9
    failures: list[tuple[str, str, int]] = []
    metrics = exporter(http, "delta", failures, MetricBacklog(max_batches=2))
    try:
        for window in range(5):
            assert metrics.export(collected(window, 1, DELTA)) is MetricExportResult.FAILURE
        http.replies.clear()
        assert metrics.export(collected(5, 1, DELTA)) is MetricExportResult.SUCCESS
    finally:
        metrics.shutdown()
    kept = [p for p in sent(http)[-4:] if p[0] == "transitions"]
    assert kept == [("transitions", 3, 4, 1), ("transitions", 4, 5, 1),
                    ("transitions", 5, 6, 1)]
    assert [f for f in failures if f[1] == "metrics_dropped"] == [("otlp", "metrics_dropped",
                                                                   1)] * 3
    lines = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "1 delta metric batches (1 data points, 1970-01-01T00:00:00Z to " in lines[0]
    assert 'signal="metrics_dropped"' in lines[0]


def test_nothing_is_sent_while_the_shared_pause_lasts_and_the_batch_waits(http: Server) -> None:
    now = [100.0]
    pause = Pause(lambda: now[0])
    failures: list[tuple[str, str, int]] = []
    metrics = OtlpMetricExporter(
        OtlpTarget("metrics", endpoint=f"http://127.0.0.1:{http.port}/v1/metrics",
                   timeout=5.0), "otlp", lambda *f: failures.append(f),
        temporality=TEMPORALITIES["delta"], clock=lambda: now[0], pause=pause)
    try:
        pause.hold(8)  # asked by the collector, of the logs of the same endpoint, say
        assert metrics.export(collected(0, 2, DELTA)) is MetricExportResult.FAILURE
        assert http.seen == []
        now[0] += 8
        assert metrics.export(collected(1, 1, DELTA)) is MetricExportResult.SUCCESS
    finally:
        metrics.shutdown()
    assert [p for p in sent(http) if p[0] == "transitions"] == [
        ("transitions", 0, 1, 2), ("transitions", 1, 2, 1)]


def test_kept_batches_left_at_shutdown_are_said(http: Server,
                                                caplog: pytest.LogCaptureFixture) -> None:
    http.replies.append((503, {}, b""))
    metrics = exporter(http, "delta", [])
    metrics.export(collected(0, 2, DELTA))
    metrics.shutdown()
    assert any("1 kept delta metric batches (1 data points) were not delivered before the "
               "stop" in r.getMessage() for r in caplog.records)


# --- One pause per collector -------------------------------------------------------------------

def target(signal: str, endpoint: str, insecure: bool = True) -> OtlpTarget:
    return OtlpTarget(signal, endpoint=endpoint, insecure=insecure)


@pytest.mark.parametrize(("logs", "metrics", "same"), [
    ("http://Collector:4318/v1/logs", "http://collector:4318/v1/metrics", True),
    ("http://collector/v1/logs", "http://collector:80/v1/metrics", True),
    ("https://collector/v1/logs", "https://collector:443/v1/metrics", True),
    ("http://collector:4318/v1/logs", "http://collector:4317/v1/metrics", False),
    ("http://collector:4318/v1/logs", "https://collector:4318/v1/metrics", False),
    ("http://a:4318/v1/logs", "http://b:4318/v1/metrics", False),
    ("collector:4317", "http://collector:4317", True),  # gRPC without a scheme, insecure
    ("unix:/run/otel.sock", "unix:/run/otel.sock", True),
    ("unix:/run/otel.sock", "unix:/run/other.sock", False),
])
def test_the_signals_share_a_pause_when_they_go_to_the_same_authority(
        logs: str, metrics: str, same: bool) -> None:
    assert (authority(target("logs", logs)) == authority(target("metrics", metrics))) is same


@pytest.mark.parametrize(("metrics", "shared"), [
    ("http://127.0.0.1:4318/v1/metrics", True),
    ("http://127.0.0.1:4319/v1/metrics", False),
])
def test_the_sink_gives_both_signals_one_pause_per_collector(
        tmp_path: Path, metrics: str, shared: bool) -> None:
    # Each signal's pause is set by its own answers; metric exports also wait out the logs'
    # pause of the same collector, never the other way round (docs/decisions.md).
    config = load_config({"SEE_SINKS": "otlp", "SEE_STATE_DIR": str(tmp_path),
                          "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "http://127.0.0.1:4318/v1/logs",
                          "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": metrics})
    sink = OtlpSink(config, lambda *_: None)
    try:
        assert isinstance(sink._logs_pause, Pause) and isinstance(sink._metrics_pause, Pause)
        assert sink._logs_pause is not sink._metrics_pause
        (reader,) = sink.metric_readers()
        exporter = reader.exporter
        assert isinstance(exporter, OtlpMetricExporter)
        assert (sink._logs_pause in exporter._also) is shared
        assert sink._worker._pause is sink._logs_pause
    finally:
        for reader in sink.metric_readers():
            reader.shutdown()
        sink.shutdown(1)

