"""The delivery worker is the one place a peer's requested delay is capped and waited for
(``pause.RETRY_AFTER_CAP``): a ``Retry-After``/``RetryInfo`` beyond it is waited for as long
as the cap, then the request is tried again. The transports hand the delay over uncapped
(tests/test_otlp_transport.py); the scripted-peer tests show the waits end to end
(tests/test_otlp_conformance.py)."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from scheduled_events_exporter.delivery import pause
from scheduled_events_exporter.delivery.outcome import DeliveryError
from scheduled_events_exporter.delivery.worker import DeliveryWorker
from scheduled_events_exporter.records import TransitionRecord
from tests.test_delivery_wait import record


def attempt_times(fail: Callable[[int], DeliveryError | None], backoff: tuple[float, float],
                  timeout: float) -> list[float]:
    """When a worker tried to deliver one record; ``fail(n)`` is the error of the n-th attempt
    (1-based), ``None`` once it succeeds."""
    attempts: list[float] = []
    done = threading.Event()

    def deliver(records: Sequence[TransitionRecord]) -> None:
        attempts.append(time.monotonic())
        error = fail(len(attempts))
        if error is not None:
            raise error
        done.set()

    worker = DeliveryWorker("otlp", deliver, lambda *_: None, max_records=10, backoff=backoff)
    worker.start()
    try:
        worker.submit([record(1)])
        assert done.wait(timeout), "never delivered"
    finally:
        worker.stop(2)
    return attempts


@pytest.mark.parametrize(("asked", "least", "most"), [
    (3600.0, 0.9, 2.5),  # beyond the cap: the cap
    (0.6, 0.55, 1.0),  # within it: as asked
])
def test_a_requested_delay_is_waited_for_up_to_the_one_cap(
        monkeypatch: pytest.MonkeyPatch, asked: float, least: float, most: float) -> None:
    monkeypatch.setattr(pause, "RETRY_AFTER_CAP", 1.0)
    # The worker's own backoff is made negligible, so the wait is the peer's delay alone.
    attempts = attempt_times(
        lambda n: DeliveryError("throttled", status="HTTP 429", retry_after=asked)
        if n == 1 else None, backoff=(0.01, 0.01), timeout=10)
    gap = attempts[1] - attempts[0]
    assert least <= gap <= most, gap


def test_without_a_requested_delay_the_wait_doubles_to_its_cap_with_jitter() -> None:
    # The exporter specification, "Retry": exponential back-off with jitter. Each wait is
    # drawn from [b/2, b] ("equal jitter" on the worker's scale), b doubling up to the cap.
    attempts = attempt_times(lambda n: DeliveryError("collector unreachable") if n < 7 else None,
                             backoff=(0.08, 0.32), timeout=20)
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    for gap, ceiling in zip(gaps, [0.08, 0.16, 0.32, 0.32, 0.32, 0.32], strict=True):
        # Lower bound exact; the upper one leaves room for a loaded machine.
        assert ceiling / 2 - 0.005 <= gap <= ceiling + 0.25, (gaps, ceiling)
    assert len({round(g, 3) for g in gaps[2:]}) > 1, f"no jitter: {gaps}"


def test_a_metric_export_is_not_sent_while_the_collectors_pause_lasts() -> None:
    # Metrics are not retried (the next export reads them again), but the exporter throttles
    # itself all the same: no export inside the pause a collector asked for.
    from opentelemetry.sdk.metrics.export import MetricExportResult, MetricsData

    from scheduled_events_exporter.otlp_settings import OtlpTarget
    from scheduled_events_exporter.sinks.otlp import OtlpMetricExporter
    from tests.test_otlp_transport import serve

    now = [100.0]
    failures: list[tuple[str, str, int]] = []
    for server in serve():
        server.replies.append((429, {"Retry-After": "3600"}, b""))
        exporter = OtlpMetricExporter(
            OtlpTarget("metrics", endpoint=f"http://127.0.0.1:{server.port}/v1/metrics",
                       timeout=5.0), "otlp", lambda *f: failures.append(f),
            clock=lambda: now[0])
        empty = MetricsData(resource_metrics=[])
        try:
            assert exporter.export(empty) is MetricExportResult.FAILURE  # the 429
            now[0] += 30
            assert exporter.export(empty) is MetricExportResult.FAILURE  # paused: not sent
            assert len(server.seen) == 1
            now[0] += pause.RETRY_AFTER_CAP  # the pause, capped once, is over
            assert exporter.export(empty) is MetricExportResult.SUCCESS
            assert len(server.seen) == 2
        finally:
            exporter.shutdown()
    assert failures == [("otlp", "metrics", 1)] * 2


def test_a_long_overload_never_dead_letters_what_only_inference_called_too_large(
        tmp_path: Path) -> None:
    # After one small accepted record, a burst of larger ones meets RESOURCE_EXHAUSTED without
    # RetryInfo (a busy collector) for 40 attempts: the halvings reach single records, each
    # larger than anything accepted, which are retried as busy and delivered, never
    # dead-lettered (BENCHMARKS.md, "A burst under a 2 s overload": they were, in a 2-minute
    # overload).
    from datetime import datetime, timezone

    from scheduled_events_exporter.delivery.dead_letter import DeadLetterFile
    from scheduled_events_exporter.delivery.outcome import FailureKind
    from scheduled_events_exporter.model import (
        InstanceInfo,
        ScheduledEvent,
        Transition,
        TransitionKind,
    )
    from scheduled_events_exporter.records import make_record

    def big(seq: int) -> TransitionRecord:
        event = ScheduledEvent(f"B{seq}", "Scheduled", "Freeze", "VirtualMachine",
                               tuple(f"vm-{i:04d}-" + "x" * 100 for i in range(100)))
        return make_record(Transition(TransitionKind.SCHEDULED,
                                      datetime(2026, 11, 27, tzinfo=timezone.utc), seq, event),
                           InstanceInfo(vm_name="vm"), seq)

    attempts: list[int] = []
    delivered: list[int] = []

    def deliver(records: Sequence[TransitionRecord]) -> None:
        attempts.append(len(records))
        if records[0].seq > 1 and len(attempts) <= 41:
            raise DeliveryError("busy", FailureKind.EXHAUSTED, "gRPC RESOURCE_EXHAUSTED")
        delivered.extend(r.seq for r in records)

    letters = DeadLetterFile(tmp_path)
    worker = DeliveryWorker("otlp", deliver, lambda *_: None, max_records=100,
                            dead_letter=letters, backoff=(0.001, 0.002))
    worker.start()
    try:
        worker.submit([record(1)])
        assert worker.flush(10)
        worker.submit([big(seq) for seq in range(2, 10)])
        assert worker.flush(30), "never delivered"
    finally:
        worker.stop(2)
    assert delivered == list(range(1, 10))
    assert not letters.path.exists(), letters.path.read_text()
    assert 1 in attempts[1:41], f"the halvings never reached a single record: {attempts}"
