"""How long a sink has waited, as ``/readyz`` judges it: records dropped at the spool's bound
still count, so a sink that delivers nothing while a flood overflows its spool is failing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduled_events_exporter.delivery.outcome import DeliveryError
from scheduled_events_exporter.delivery.worker import DeliveryWorker
from scheduled_events_exporter.model import InstanceInfo, ScheduledEvent, Transition, TransitionKind
from scheduled_events_exporter.records import TransitionRecord, make_record

VM = InstanceInfo(vm_name="vm-test")
AT = datetime(2026, 11, 25, tzinfo=timezone.utc)


def record(seq: int) -> TransitionRecord:
    event = ScheduledEvent(f"E{seq}", "Scheduled", "Freeze", "VirtualMachine", ("vm-test",),
                           None, source="Platform", duration=5)
    return make_record(Transition(TransitionKind.SCHEDULED, AT, seq, event), VM, seq)


class Collector:
    """Refuses every batch until told to accept (a collector that is down, then back)."""

    def __init__(self) -> None:
        self.up = False
        self.delivered: list[int] = []
        self.attempted = threading.Event()

    def __call__(self, records: Sequence[TransitionRecord]) -> None:
        self.attempted.set()
        if not self.up:
            raise DeliveryError("collector unreachable")
        self.delivered.extend(r.seq for r in records)


@contextmanager
def worker_on(collector: Collector, now: list[float], max_records: int
              ) -> Iterator[DeliveryWorker]:
    """A started worker on a test clock (``now[0]``), stopped with the collector up again
    (its stop waits on that same frozen clock, so it must be able to drain: the clock moves past
    any pause the worker's backoff set, which is a deadline on that clock too)."""
    worker = DeliveryWorker("otlp", collector, lambda *_: None, max_records=max_records,
                            clock=lambda: now[0])
    worker.start()
    try:
        yield worker
    finally:
        collector.up = True
        drain(worker, now)
        worker.stop(10)


def drain(worker: DeliveryWorker, now: list[float]) -> None:
    """Let the test clock run until the worker delivered everything: its backoff is a pause on
    that clock, a deadline a frozen clock never reaches."""
    deadline = time.monotonic() + 10
    while worker.status().pending:
        assert time.monotonic() < deadline, "the worker never drained"
        now[0] += 1.0
        worker.flush(0)  # wakes the worker to look at its pause again
        time.sleep(0.005)


def test_records_dropped_at_the_bound_keep_counting_as_waiting() -> None:
    now = [0.0]
    collector = Collector()
    with worker_on(collector, now, max_records=2) as worker:
        worker.submit([record(1)])
        assert collector.attempted.wait(5)
        for seq in range(2, 8):  # one new record every 10 s; only the newest 2 stay queued
            now[0] += 10.0
            worker.submit([record(seq)])
        status = worker.status()
        assert status.dropped == 5 and status.pending == 2
        # Record 1 was queued 60 s ago and nothing was delivered since.
        assert status.oldest_wait == 60.0

        collector.up = True
        drain(worker, now)
        assert worker.status().oldest_wait == 0.0
        # A new backlog after a delivery is as old as its own oldest record.
        collector.up = False
        now[0] += 10.0
        worker.submit([record(8)])
        now[0] += 5.0
        assert worker.status().oldest_wait == 5.0


def test_without_drops_the_oldest_queued_record_sets_the_wait() -> None:
    now = [100.0]
    collector = Collector()
    with worker_on(collector, now, max_records=10) as worker:
        worker.submit([record(1)])
        now[0] += 5.0
        worker.submit([record(2)])
        now[0] += 5.0
        assert worker.status().oldest_wait == 10.0 and worker.status().dropped == 0


def test_a_peer_that_says_retry_after_is_waited_for_before_the_next_attempt() -> None:
    # The worker's own first backoff is 0.25-0.5 s; the collector asks for 1.5 s.
    attempts: list[float] = []

    def deliver(records: Sequence[TransitionRecord]) -> None:
        attempts.append(time.monotonic())
        if len(attempts) == 1:
            raise DeliveryError("busy", retry_after=1.5)

    worker = DeliveryWorker("otlp", deliver, lambda *_: None, max_records=10)
    worker.start()
    try:
        worker.submit([record(1)])
        assert worker.flush(10), "delivered after the wait"
    finally:
        worker.stop(5)
    assert len(attempts) == 2 and attempts[1] - attempts[0] >= 1.45, attempts


class Scripted:
    """A collector whose availability follows a script, one entry per delivery attempt
    (True: up), then up for good; it keeps every record it accepted, in arrival order."""

    def __init__(self, script: list[bool]) -> None:
        self.script = list(script)
        self.accepted: list[int] = []

    def __call__(self, records: Sequence[TransitionRecord]) -> None:
        if self.script and not self.script.pop(0):
            raise DeliveryError("collector unreachable")
        self.accepted.extend(r.seq for r in records)


@settings(max_examples=40, deadline=None)
@given(script=st.lists(st.booleans(), max_size=40),
       bursts=st.lists(st.integers(min_value=1, max_value=30), min_size=1, max_size=6))
def test_an_outage_of_any_shape_loses_nothing_and_repeats_nothing(script: list[bool],
                                                                  bursts: list[int]) -> None:
    # The invariant of the process test (tests/test_outage.py), for every pattern of
    # failures: each record once, in order, whenever it was submitted. Waits are scaled down.
    collector = Scripted(script)
    worker = DeliveryWorker("otlp", collector, lambda *_: None, max_records=10_000,
                            backoff=(0.0005, 0.002))
    worker.start()
    seq = 0
    try:
        for size in bursts:
            worker.submit([record(s) for s in range(seq + 1, seq + size + 1)])
            seq += size
        assert worker.flush(30), "not delivered"
    finally:
        worker.stop(5)
    assert collector.accepted == list(range(1, seq + 1))
