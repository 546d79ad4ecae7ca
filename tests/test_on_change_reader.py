"""The on-change metric reader: exports soon after a change, otherwise on the heartbeat (the
schedule is tested as a pure function of given times), on its own thread; the caller never
waits for an export."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

from scheduled_events_exporter.sinks.on_change_reader import Cadence, OnChangeMetricReader
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


# --- the schedule, on given times (pure) ------------------------------------------------------

def schedule(cadence: Cadence, changes: list[float], until: float, step: float = 0.1
             ) -> list[float]:
    """The times the reader's loop would export at, walking the clock in ``step`` seconds."""
    exports, now, pending = [], 0.0, sorted(changes)
    while now <= until:
        while pending and pending[0] <= now:
            pending.pop(0)
            cadence.change()
        if cadence.take(now):
            exports.append(round(now, 3))
            cadence.exported(now)
        now = round(now + step, 3)
    return exports


def test_idle_exports_are_one_heartbeat_apart() -> None:
    assert schedule(Cadence.starting(0.0, heartbeat=60, min_gap=2), [], 200) == [60, 120, 180]


def test_a_change_after_a_quiet_spell_is_exported_at_once_and_moves_the_heartbeat() -> None:
    exports = schedule(Cadence.starting(0.0, heartbeat=60, min_gap=2), [30.0], 150)
    assert exports == [30, 90, 150]


def test_a_burst_of_changes_costs_one_export_per_gap() -> None:
    changes = [10 + 0.5 * i for i in range(20)]  # a document changing every half second
    exports = schedule(Cadence.starting(0.0, heartbeat=60, min_gap=2), changes, 40)
    # One export per 2 s gap; the last change (19.5) answered at 20, then the heartbeat.
    assert exports == [10, 12, 14, 16, 18, 20]


def test_a_change_just_after_an_export_waits_for_the_gap_not_the_heartbeat() -> None:
    assert schedule(Cadence.starting(0.0, heartbeat=60, min_gap=2), [60.5], 130) == [
        60, 62, 122]


# --- the thread ---------------------------------------------------------------------------------

def test_a_change_is_exported_on_the_readers_own_thread(make: Any) -> None:
    exporter = Recorder()
    reader, counter = make(exporter, heartbeat=3600.0, min_gap=0.3)
    counter.add(5)
    reader.metrics_changed()
    wait_until(lambda: len(exporter.times) >= 1, 5, "the on-change export")
    assert exporter.values[0] == 5 and exporter.threads[0] == "metrics-reader"


def test_metrics_changed_never_waits_for_a_slow_export(make: Any) -> None:
    exporter = Recorder(delay=1.0)  # a collector that takes a second to answer
    reader, counter = make(exporter, heartbeat=3600.0, min_gap=0.0)
    counter.add(1)  # a reader exports nothing while no instrument has data
    reader.metrics_changed()
    assert exporter.entered.wait(5)  # the reader thread is inside the slow export now
    began = time.monotonic()
    for _ in range(100):
        reader.metrics_changed()
    assert time.monotonic() - began < 0.5  # 100 calls, none waiting for the 1 s export
    wait_until(lambda: len(exporter.times) >= 2, 5, "the export the changes asked for")


def test_shutdown_exports_once_more_and_stops(make: Any) -> None:
    exporter = Recorder()
    reader, counter = make(exporter, heartbeat=3600.0, min_gap=0.0)
    counter.add(7)
    reader.shutdown(timeout_millis=2000)  # joins the reader's thread
    assert exporter.values == [7] and exporter.shut
    reader.metrics_changed()  # after shutdown: nothing to wake, nothing exported
    reader.shutdown(timeout_millis=2000)
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
