"""The on-change metric reader: exports soon after a change, otherwise on the heartbeat, on its
own thread; the caller never waits for an export."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

from scheduled_events_exporter.sinks.on_change_reader import OnChangeMetricReader
from tests.exporter_process import wait_until


class Recorder(MetricExporter):
    """Remembers when each export happened and on which thread; can be made slow."""

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__()
        self.times: list[float] = []
        self.threads: list[str] = []
        self.values: list[int] = []
        self.delay = delay
        self.shut = False
        self.entered = threading.Event()

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs: Any) -> MetricExportResult:
        self.entered.set()
        time.sleep(self.delay)
        self.times.append(time.monotonic())
        self.threads.append(threading.current_thread().name)
        points = [p.value for rm in metrics_data.resource_metrics for sm in rm.scope_metrics
                  for m in sm.metrics for p in m.data.data_points]
        self.values.append(int(sum(points)))
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.shut = True


@pytest.fixture
def make() -> Iterator[Any]:
    providers: list[MeterProvider] = []

    def build(exporter: Recorder, heartbeat: float, min_gap: float) -> tuple[
            OnChangeMetricReader, Any]:
        reader = OnChangeMetricReader(exporter, heartbeat=heartbeat, min_gap=min_gap)
        provider = MeterProvider(metric_readers=[reader])
        providers.append(provider)
        counter = provider.get_meter("t").create_counter("c")
        return reader, counter

    yield build
    for provider in providers:
        provider.shutdown(timeout_millis=2000)


def test_change_is_exported_at_once_and_heartbeat_follows(make: Any) -> None:
    exporter = Recorder()
    reader, counter = make(exporter, heartbeat=1.0, min_gap=0.3)
    counter.add(5)
    told = time.monotonic()
    reader.metrics_changed()
    wait_until(lambda: len(exporter.times) >= 1, 2, "the on-change export")
    assert exporter.times[0] - told < 0.2  # the first change after a quiet time: no gap
    assert exporter.values[0] == 5 and exporter.threads[0] == "metrics-reader"
    wait_until(lambda: len(exporter.times) >= 3, 4, "two heartbeats")
    gaps = [b - a for a, b in zip(exporter.times, exporter.times[1:], strict=False)]
    assert all(0.9 < g < 1.4 for g in gaps[:2]), gaps


def test_a_burst_of_changes_is_rate_limited_by_the_gap(make: Any) -> None:
    exporter = Recorder()
    reader, counter = make(exporter, heartbeat=60.0, min_gap=0.5)
    start = time.monotonic()
    for _ in range(20):  # a document changing at every poll, compressed
        counter.add(1)
        reader.metrics_changed()
        time.sleep(0.02)
    wait_until(lambda: exporter.values and exporter.values[-1] == 20, 3, "the last change")
    elapsed = exporter.times[-1] - start
    assert len(exporter.times) <= 2 + int(elapsed / 0.5)  # at most one export per gap
    gaps = [b - a for a, b in zip(exporter.times, exporter.times[1:], strict=False)]
    assert all(g >= 0.45 for g in gaps), gaps


def test_metrics_changed_never_waits_for_a_slow_export(make: Any) -> None:
    exporter = Recorder(delay=1.0)  # a collector that takes a second to answer
    reader, counter = make(exporter, heartbeat=60.0, min_gap=0.0)
    counter.add(1)  # a reader exports nothing while no instrument has data
    reader.metrics_changed()
    time.sleep(0.1)  # (the assertion below holds whether or not the export began yet)
    began = time.monotonic()
    for _ in range(100):
        reader.metrics_changed()
    assert time.monotonic() - began < 0.05
    wait_until(lambda: len(exporter.times) >= 2, 5, "the export after the slow one")


def test_shutdown_exports_once_more_and_stops(make: Any) -> None:
    exporter = Recorder()
    reader, counter = make(exporter, heartbeat=60.0, min_gap=0.0)
    counter.add(7)
    reader.shutdown(timeout_millis=2000)
    assert exporter.values == [7] and exporter.shut
    reader.metrics_changed()  # after shutdown: ignored, no thread to wake
    time.sleep(0.2)
    assert exporter.values == [7]


@pytest.mark.parametrize(("heartbeat", "gap"), [(0, 1), (-1, 1), (1, -0.5)])
def test_bad_settings_are_refused(heartbeat: float, gap: float) -> None:
    with pytest.raises(ValueError, match="heartbeat"):
        OnChangeMetricReader(Recorder(), heartbeat=heartbeat, min_gap=gap)


def test_shutdown_does_not_wait_past_its_timeout_for_a_stuck_export(make: Any) -> None:
    exporter = Recorder(delay=3.0)  # a collector that hangs
    reader, counter = make(exporter, heartbeat=60.0, min_gap=0.0)
    counter.add(1)
    reader.metrics_changed()
    assert exporter.entered.wait(5)  # the reader thread is inside the 3 s export
    began = time.monotonic()
    reader.shutdown(timeout_millis=500)
    assert time.monotonic() - began < 1.5 and exporter.shut
