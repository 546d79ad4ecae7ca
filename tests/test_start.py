"""The start's single rules, in process (delivery/start.py): what the crash-point enumeration
(tests/test_start_crash_points.py) does not reach. An outbox entry this release cannot read
goes to every sink's dead-letter file, or stays with the state file, listed once, when a letter
cannot be written; a redeliver request that cannot be carried out waits, is tried again on its
backoff by the poll thread, and says when it is done."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import pytest

from scheduled_events_exporter.codec import encode_record, encode_state
from scheduled_events_exporter.delivery import redrive, start
from scheduled_events_exporter.delivery.dead_letter import DeadLetter, DeadLetterFile
from scheduled_events_exporter.delivery.redrive import Selection
from scheduled_events_exporter.delivery.spool import Spool
from scheduled_events_exporter.delivery.worker import DeliveryWorker
from scheduled_events_exporter.records import TransitionRecord
from scheduled_events_exporter.state import StateStore
from scheduled_events_exporter.tracker import TrackerState
from tests.test_redrive_crash_points import letter, record

NOW = datetime(2026, 11, 28, 8, 30, tzinfo=timezone.utc)
SINKS = ("console", "otlp")
#: An outbox entry this release cannot read: its record has no field it knows.
UNREADABLE = {"seq": 7, "transition": "from a newer release"}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def workers(root: Path) -> list[DeliveryWorker]:
    def deliver(records: Sequence[TransitionRecord]) -> None:
        raise OSError("not started in these tests")
    return [DeliveryWorker(sink, deliver, lambda *_: None, max_records=1000,
                           spool=Spool(root / "spool", sink), dead_letter=DeadLetterFile(root),
                           backoff=(0.001, 0.001)) for sink in SINKS]


def write_state(root: Path, outbox: list[object], seq: int) -> None:
    (root / "spool").mkdir(parents=True, exist_ok=True)
    state = {"schema": 2, "seq": seq, "outbox": outbox,
             "tracker": encode_state(TrackerState()), "approvals": []}
    (root / "state.json").write_text(json.dumps(state))


def test_an_unreadable_outbox_entry_goes_to_every_sinks_dead_letter_file(tmp_path: Path) -> None:
    write_state(tmp_path, [encode_record(record(6)), UNREADABLE], 7)
    persisted = StateStore(tmp_path).load()
    assert persisted is not None and [u.seq for u in persisted.unreadable] == [7]
    begun = start.begin(tmp_path, persisted, workers(tmp_path), NOW)
    assert begun.unlettered == () and begun.seq == 7
    letters = [json.loads(x) for x in (tmp_path / "dead-letter.jsonl").read_bytes().splitlines()]
    assert sorted(x["sink"] for x in letters) == list(SINKS)
    [entry] = persisted.unreadable
    assert all(x["seq"] == 7 and x["payload"] == entry.content for x in letters), letters
    for sink in SINKS:  # the readable record reached both spools
        assert [r.record_id for r in Spool(tmp_path / "spool", sink).load()] == ["rid-6"]


def test_an_outbox_entry_no_sink_could_letter_stays_with_the_state_file_once(
        tmp_path: Path) -> None:
    write_state(tmp_path, [UNREADABLE], 7)
    (tmp_path / "dead-letter.jsonl").mkdir()  # appending to it fails (as root too)
    persisted = StateStore(tmp_path).load()
    assert persisted is not None
    begun = start.begin(tmp_path, persisted, workers(tmp_path), NOW)
    # Both sinks failed to letter it; the state file keeps it, once.
    assert begun.unlettered == persisted.unreadable and len(begun.unlettered) == 1


def test_a_request_that_cannot_be_carried_out_waits_and_is_tried_on_its_backoff(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write_state(tmp_path, [], 5)
    letters = tmp_path / "dead-letter.jsonl"
    # A letter from before redeliver (the payload as sent, no record) is skipped, and said.
    bare = DeadLetter(time="2026-11-27T10:00:00.000Z", sink="otlp", status="HTTP 400",
                      reason="refused", event_id="E93", transition="scheduled",
                      record_id="rid-93", seq=93, payload={"sent": 93}).to_json()
    letters.write_bytes(letter(90, "otlp") + bare)
    redrive.request(tmp_path, Selection(), NOW)
    letters.rename(tmp_path / "aside")
    letters.mkdir()  # the dead-letter file cannot be read: the request cannot be carried out
    clock = Clock()
    caplog.set_level(logging.INFO, logger="scheduled_events_exporter.delivery.start")
    begun = start.begin(tmp_path, StateStore(tmp_path).load(), workers(tmp_path), NOW,
                        monotonic=clock)
    pending = begun.pending
    assert pending is not None and pending.waiting and begun.seq == 5
    assert pending.fault is not None and pending.fault.failures == 1
    assert pending.fault.file == str(tmp_path / redrive.REQUEST_FILE)
    assert pending.fault.error.startswith("redeliver request not carried out: ")
    assert pending.fault.error.endswith(f"Is a directory: '{letters}'; it is tried again once "
                                        "the storage can be written, and at the next start"
                                        ), pending.fault.error
    since = pending.fault.since
    assert since == clock.now
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [e.getMessage() for e in errors] == [
        f"the redeliver request {tmp_path / redrive.REQUEST_FILE} could not be carried out: "
        f"[Errno 21] Is a directory: '{letters}'; it is tried again once the storage can be "
        "written, and at the next start; the exporter runs meanwhile"]

    # Not due yet: nothing is tried (the fault's count does not move).
    clock.now += start.REQUEST_RETRY - 0.5
    assert pending.retry(5, NOW) == 5 and pending.fault.failures == 1
    # Due, and failing again: the next try waits twice as long, and no second ERROR line.
    clock.now += 0.5
    assert pending.retry(5, NOW) == 5 and pending.fault.failures == 2
    clock.now += 2 * start.REQUEST_RETRY - 0.5
    assert pending.retry(5, NOW) == 5 and pending.fault.failures == 2
    assert pending.fault.since == since  # the streak's first failure
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 1

    # The storage works again: the next due try carries it out, numbering after seq.
    letters.rmdir()
    (tmp_path / "aside").rename(letters)
    clock.now += 0.5
    # From the poll thread, whose numbers may be ahead of every file (records held in memory).
    assert pending.retry(20, NOW) == 21
    assert not pending.waiting and pending.fault is None
    assert not (tmp_path / redrive.REQUEST_FILE).exists()
    said = [r.getMessage() for r in caplog.records if r.levelno < logging.ERROR]
    assert said == [
        "redelivered from the dead-letter file: otlp HTTP 400 EventId E90 scheduled RecordId "
        "rid-90 (spool seq 21)",
        "redeliver: skipped RecordId rid-93 of sink otlp: written by a release before "
        "redeliver: it holds the record as sent, not as stored",
        "redeliver request carried out after 2 failed attempts: 1 records put back, 1 skipped "
        "(0 of them redelivered before)"], said
    assert [r.seq for r in Spool(tmp_path / "spool", "otlp").load()] == [21]
    # Nothing waiting: later calls do nothing.
    clock.now += 1000
    assert pending.retry(9, NOW) == 9


def test_an_unreadable_request_waits_for_a_hand_and_is_not_tried_again(tmp_path: Path) -> None:
    write_state(tmp_path, [], 5)
    (tmp_path / redrive.REQUEST_FILE).write_text("{not json")
    clock = Clock()
    begun = start.begin(tmp_path, StateStore(tmp_path).load(), workers(tmp_path), NOW,
                        monotonic=clock)
    pending = begun.pending
    assert pending is not None and pending.fault is not None
    assert pending.fault.error.endswith("; fix or delete it"), pending.fault.error
    clock.now += 10 * start.REQUEST_RETRY_CAP
    assert pending.retry(5, NOW) == 5 and pending.fault.failures == 1 and pending.waiting


def waiting_request(root: Path, seq: int) -> tuple[start.PendingRequest, Clock]:
    """A start whose redeliver request cannot be carried out (the dead-letter file cannot be
    read), on a clock of the test's."""
    write_state(root, [], seq)
    (root / "dead-letter.jsonl").mkdir()
    redrive.request(root, Selection(), NOW)
    clock = Clock()
    begun = start.begin(root, StateStore(root).load(), workers(root), NOW, monotonic=clock)
    assert begun.pending is not None and begun.pending.waiting
    assert begun.pending.fault is not None and begun.pending.fault.failures == 1
    return begun.pending, clock


def test_a_request_deleted_while_it_waits_is_no_longer_waited_for(tmp_path: Path) -> None:
    pending, clock = waiting_request(tmp_path, 5)
    (tmp_path / redrive.REQUEST_FILE).unlink()
    clock.now += start.REQUEST_RETRY
    assert pending.retry(5, NOW) == 5
    assert not pending.waiting and pending.fault is None


def test_the_backoff_stops_growing_at_its_cap(tmp_path: Path) -> None:
    pending, clock = waiting_request(tmp_path, 1)
    assert pending.fault is not None
    waits = []
    for _ in range(8):
        before = pending.fault.failures
        waited = 0.0
        while pending.fault.failures == before:
            clock.now += 1.0
            waited += 1.0
            pending.retry(1, NOW)
        waits.append(waited)
    assert waits == [10, 20, 40, 80, 160, 300, 300, 300]


def test_numbers_follow_the_state_file_and_every_spool_configured_or_not(tmp_path: Path) -> None:
    write_state(tmp_path, [], 7)
    # A sink left out of SEE_SINKS keeps its spool, with a higher number, for when it returns.
    line = {"seq": 12, "record": encode_record(record(12))}
    (tmp_path / "spool" / "eventhubs.log").write_text(json.dumps(line) + "\n")
    begun = start.begin(tmp_path, StateStore(tmp_path).load(), workers(tmp_path), NOW)
    assert begun.seq == 12 and begun.pending is None
    (tmp_path / "spool" / "eventhubs.log").unlink()
    begun = start.begin(tmp_path, StateStore(tmp_path).load(), workers(tmp_path), NOW)
    assert begun.seq == 7 and begun.pending is None


def test_without_a_state_directory_nothing_is_numbered_or_pending(tmp_path: Path) -> None:
    def deliver(records: Sequence[TransitionRecord]) -> None:
        raise OSError("not started in these tests")
    memory_only = [DeliveryWorker(sink, deliver, lambda *_: None, max_records=1000)
                   for sink in SINKS]
    assert start.begin(None, None, memory_only, NOW) == start.Begun(0, None)


def test_a_request_carried_out_at_once_says_so_without_failures(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write_state(tmp_path, [], 5)
    (tmp_path / "dead-letter.jsonl").write_bytes(letter(90, "otlp"))
    redrive.request(tmp_path, Selection(), NOW)
    caplog.set_level(logging.INFO, logger="scheduled_events_exporter.delivery.start")
    begun = start.begin(tmp_path, StateStore(tmp_path).load(), workers(tmp_path), NOW)
    assert begun.seq == 6 and begun.pending is None
    assert caplog.records[-1].getMessage() == (
        "redeliver request carried out: 1 records put back, 0 skipped (0 of them redelivered "
        "before)")
