"""Poll loop pieces: the schedule, retry delays, and the same-poll hand-over to the sinks."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduled_events_exporter.config import load_config
from scheduled_events_exporter.imds import ImdsClient, PollResult, retry_delay
from scheduled_events_exporter.model import InstanceInfo, Outcome
from scheduled_events_exporter.poller import Poller, next_due
from scheduled_events_exporter.records import TransitionRecord
from scheduled_events_exporter.simulator import Simulator
from scheduled_events_exporter.telemetry import Telemetry
from tests.exporter_process import free_port, wait_until


@given(st.floats(0, 1e6), st.floats(0, 1e4), st.floats(0.2, 60))
def test_next_due_is_on_the_cadence_and_never_in_the_past(
    prev: float, late: float, interval: float
) -> None:
    now = prev + late
    due = next_due(prev, now, interval)
    assert due > now - 1e-9
    assert due - now <= interval + 1e-6
    ticks = (due - prev) / interval
    assert abs(ticks - round(ticks)) < 1e-6  # still on the original phase: no drift


def test_next_due_on_time_is_one_interval_later() -> None:
    assert next_due(10.0, 10.3, 1.0) == 11.0
    assert next_due(10.0, 12.5, 1.0) == 13.0  # missed ticks are skipped, not replayed


@pytest.mark.parametrize(
    ("outcome", "retry_after", "cap"),
    [
        (Outcome.GONE, None, 5.0),
        (Outcome.SERVER_ERROR, None, 30.0),
        (Outcome.TIMEOUT, None, 30.0),
        (Outcome.THROTTLED, 7.0, 60.0),
    ],
)
def test_retry_delay_grows_capped_with_jitter(
    outcome: Outcome, retry_after: float | None, cap: float
) -> None:
    result = PollResult(outcome, 0.01, retry_after=retry_after)
    low = [retry_delay(result, n, 1.0, rand=lambda: 0.0) for n in range(1, 12)]
    high = [retry_delay(result, n, 1.0, rand=lambda: 1.0) for n in range(1, 12)]
    assert low == sorted(low) and high == sorted(high)
    assert max(high) == cap
    assert all(lo <= hi for lo, hi in zip(low, high, strict=True))
    if retry_after is not None:
        assert min(low) >= retry_after
    assert min(low) >= 1.0  # never faster than the poll interval


class RecordingSink:
    """Remembers what was handed over, and when (by poll count)."""

    def __init__(self, poller_ref: list[Poller]) -> None:
        self.received: list[tuple[int, TransitionRecord]] = []
        self._poller_ref = poller_ref

    def submit(self, records: Sequence[TransitionRecord]) -> None:
        ticks = self._poller_ref[0].ticks
        self.received.extend((ticks, r) for r in records)


def test_transition_is_handed_to_sinks_in_the_same_poll_that_saw_it(
    sim: Simulator, tmp_path: Path
) -> None:
    config = load_config({"SEE_IMDS_ENDPOINT": sim.url, "SEE_STATE_DIR": str(tmp_path)})
    client = ImdsClient(sim.url, first_timeout=5, timeout=5)
    ref: list[Poller] = []
    sink = RecordingSink(ref)
    poller = Poller(config, client, [sink], Telemetry(), instance=InstanceInfo(vm_name="vm-test"))
    ref.append(poller)
    poller.poll_once()
    event = {
        "EventId": "E1",
        "EventStatus": "Scheduled",
        "EventType": "Reboot",
        "Resources": ["vm-test"],
        "NotBefore": "Mon, 11 Apr 2099 22:26:58 GMT",
        "DurationInSeconds": -1,
        "EventSource": "User",
    }
    for status, not_before in (("Scheduled", event["NotBefore"]), ("Started", "")):
        sim.set_events([{**event, "EventStatus": status, "NotBefore": not_before}])
        tick_before = poller.ticks
        result, records = poller.poll_once()
        assert result.outcome is Outcome.OK and len(records) == 1
        # Handed over inside the poll that fetched the document, not on a later tick or timer.
        assert sink.received[-1] == (tick_before + 1, records[0])
    sim.set_events([])
    _, records = poller.poll_once()
    assert [r.transition.kind.value for _, r in sink.received] == [
        "scheduled",
        "started",
        "completed",
    ]
    assert [r.seq for _, r in sink.received] == [1, 2, 3]
    client.close()


def test_unchanged_document_is_a_304_and_emits_nothing(sim: Simulator, tmp_path: Path) -> None:
    config = load_config({"SEE_IMDS_ENDPOINT": sim.url, "SEE_STATE_DIR": str(tmp_path)})
    client = ImdsClient(sim.url, first_timeout=5, timeout=5)
    ref: list[Poller] = []
    sink = RecordingSink(ref)
    poller = Poller(config, client, [sink], Telemetry(), instance=InstanceInfo(vm_name="vm-test"))
    ref.append(poller)
    outcomes = [poller.poll_once()[0].outcome for _ in range(3)]
    assert outcomes == [Outcome.OK, Outcome.NOT_MODIFIED, Outcome.NOT_MODIFIED]
    assert sink.received == []
    assert [r.header("If-None-Match") is not None for r in sim.requests[-3:]] == [False, True, True]
    client.close()


def test_metrics_changed_after_a_changing_poll_only(sim: Simulator, tmp_path: Path) -> None:
    config = load_config({"SEE_IMDS_ENDPOINT": sim.url, "SEE_STATE_DIR": str(tmp_path)})
    client = ImdsClient(sim.url, first_timeout=5, timeout=5)
    told: list[int] = []
    ref: list[Poller] = []
    poller = Poller(config, client, [RecordingSink(ref)], Telemetry(),
                    instance=InstanceInfo(vm_name="vm-test"),
                    metrics_changed=lambda: told.append(poller.ticks))
    ref.append(poller)
    poller.poll_once()  # the first document: the pending set becomes known
    assert told == [1]
    poller.poll_once()  # 304: nothing changed, the heartbeat covers it
    assert told == [1]
    event = {"EventId": "E1", "EventStatus": "Scheduled", "EventType": "Freeze",
             "Resources": ["vm-test"], "NotBefore": "Mon, 11 Apr 2099 22:26:58 GMT",
             "DurationInSeconds": 5, "EventSource": "Platform"}
    sim.set_events([event])
    poller.poll_once()  # a transition: told in the same poll, after the gauges were published
    assert told == [1, 3]
    assert [e.event_id for e in poller.telemetry.snapshot.events] == ["E1"]
    sim.set_events([event], incarnation=sim.incarnation + 1)
    poller.poll_once()  # same events, higher incarnation: the incarnation gauge changed
    assert told == [1, 3, 4]
    poller.poll_once()
    assert told == [1, 3, 4]
    client.close()


def test_the_liveness_deadline_covers_the_backoff_wait(tmp_path: Path) -> None:
    """While IMDS refuses connections the loop waits out a backoff (here the 20 s interval,
    longer than the request budget of 1 s + 10 s); the deadline it publishes for /healthz must
    lie beyond that wait, or liveness would report a stall during an ordinary outage."""
    port = free_port()
    config = load_config({"SEE_IMDS_ENDPOINT": f"http://127.0.0.1:{port}",
                          "SEE_STATE_DIR": "", "SEE_POLL_INTERVAL": "20",
                          "SEE_IMDS_FIRST_TIMEOUT": "1", "SEE_IMDS_TIMEOUT": "1"})
    client = ImdsClient(config.imds_endpoint, first_timeout=1, timeout=1)
    poller = Poller(config, client, [], Telemetry(), instance=InstanceInfo(vm_name="vm-test"))
    stop = threading.Event()
    thread = threading.Thread(target=poller.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_until(lambda: poller.ticks >= 1, 10, "the first (failed) poll")
        watch_until = time.monotonic() + 13  # past the old deadline (start + 11 s)
        while time.monotonic() < watch_until:
            published = poller.next_tick_deadline
            assert published is not None and published > time.monotonic(), \
                "the deadline passed while the loop waited for its next poll"
            stop.wait(0.1)
        assert poller.ticks == 1  # still in the backoff wait: the check covered it
    finally:
        stop.set()
        thread.join(5)
