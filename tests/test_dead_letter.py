"""The dead-letter file's lines, as a person and ``redeliver`` read them (delivery/dead_letter.py,
docs/semantics.md#reliability), on real files: every field of a refused record's letter and of
an unreadable entry's, the rendering that cannot fail, the rotation at its bound, the torn tail
mended before the next letter, and a disk that refuses the file."""

from __future__ import annotations

import json
import logging
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from scheduled_events_exporter.codec import decode_record, encode_record
from scheduled_events_exporter.delivery import dead_letter as letters
from scheduled_events_exporter.delivery.dead_letter import DeadLetter, DeadLetterFile
from scheduled_events_exporter.model import InstanceInfo, ScheduledEvent, Transition, TransitionKind
from scheduled_events_exporter.records import TransitionRecord, to_columns
from scheduled_events_exporter.write_faults import describe_os_error
from tests.crashdisk import full_after, step_hook

AT = datetime(2026, 11, 27, 10, tzinfo=timezone.utc)
RFC3339_MS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
KEYS = ["time", "sink", "status", "reason", "event_id", "transition", "record_id", "seq",
        "payload"]


def record(seq: int, *, event: bool = True) -> TransitionRecord:
    happened = ScheduledEvent(f"E{seq}", "Scheduled", "Reboot", resources=("vm",))
    return TransitionRecord(
        Transition(TransitionKind.SCHEDULED, AT, seq, happened if event else None),
        InstanceInfo(vm_name="vm"), f"rid-{seq}", True, "0.1.0", seq)


def written(path: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]


def test_a_refused_record_is_kept_whole_with_why_it_was_refused(tmp_path: Path) -> None:
    before = datetime.now(timezone.utc) - timedelta(milliseconds=1)
    reason = "attribute ü refused: " + "x" * 600
    letter = letters.rejected("otlp", record(7), "HTTP 400", reason,
                              lambda r: {"sent": r.record_id, "at": AT})
    DeadLetterFile(tmp_path).append(letter)
    raw = (tmp_path / "dead-letter.jsonl").read_bytes()
    after = datetime.now(timezone.utc)
    assert raw.endswith(b"}\n") and raw.count(b"\n") == 1
    [data] = written(tmp_path / "dead-letter.jsonl")
    assert list(data) == [*KEYS, "record"]
    time = str(data["time"])
    assert RFC3339_MS.fullmatch(time), time
    assert before <= datetime.fromisoformat(time.replace("Z", "+00:00")) <= after
    assert {k: data[k] for k in KEYS[1:]} == {
        "sink": "otlp", "status": "HTTP 400", "reason": reason[:500], "event_id": "E7",
        "transition": "scheduled", "record_id": "rid-7", "seq": 7,
        # What the payload cannot say in JSON is written as text, not lost.
        "payload": {"sent": "rid-7", "at": str(AT)}}
    assert data["record"] == encode_record(record(7))
    assert decode_record(data["record"]) == record(7)
    # One compact line, UTF-8 as it was (what a person greps for), not \u escapes.
    assert "ü".encode() in raw and b'": ' not in raw and b'", "' not in raw


def test_a_payload_that_cannot_be_rendered_leaves_the_records_columns(tmp_path: Path) -> None:
    def unrenderable(_: TransitionRecord) -> object:
        raise ValueError("no encoder for " + "y" * 400)

    letter = letters.rejected("eventhubs", record(8, event=False), "message_too_large",
                              "too large", unrenderable)
    assert letter.payload == {"unrenderable": ("ValueError: no encoder for " + "y" * 400)[:300],
                              "columns": to_columns(record(8, event=False))}
    assert (letter.event_id, letter.transition, letter.status) == ("", "scheduled",
                                                                   "message_too_large")
    assert letter.record == encode_record(record(8, event=False))


def test_an_unreadable_entry_is_kept_as_it_was_with_what_can_be_read_of_it(
        tmp_path: Path) -> None:
    line = {"seq": 5, "record": {"transition": {"kind": "superseded",
                                                "event": {"event_id": "E5"}},
                                 "record_id": "rid-5"}}
    reason = "kind unknown " + "z" * 600
    letter = letters.unreadable("otlp", 5, line, reason, "the state file's outbox")
    before = datetime.now(timezone.utc) - timedelta(milliseconds=1)
    DeadLetterFile(tmp_path).append(letter)
    [data] = written(tmp_path / "dead-letter.jsonl")
    assert list(data) == KEYS, "an unreadable entry has no record as stored"
    assert RFC3339_MS.fullmatch(str(data["time"]))
    assert datetime.fromisoformat(str(data["time"]).replace("Z", "+00:00")) <= (
        datetime.now(timezone.utc))
    assert before - timedelta(seconds=5) <= datetime.fromisoformat(
        str(data["time"]).replace("Z", "+00:00"))
    assert {k: data[k] for k in KEYS[1:]} == {
        "sink": "otlp", "status": "unreadable",
        "reason": ("the state file's outbox holds an entry this release cannot read: "
                   + reason)[:500],
        "event_id": "E5", "transition": "superseded", "record_id": "rid-5", "seq": 5,
        "payload": line}


@pytest.mark.parametrize("content", [
    "{torn", ["a", "list"], {"record": "text"}, {"record": {"transition": ["x"]}},
    {"record": {"transition": {"event": 5, "kind": 3}, "record_id": 9}},
    {"record": {"transition": {"event": {"event_id": None}}}},
])
def test_an_unreadable_entry_of_any_shape_is_kept(content: object) -> None:
    letter = letters.unreadable("console", None, content, "line 3 is not JSON")
    assert (letter.sink, letter.status, letter.event_id, letter.transition, letter.record_id,
            letter.seq, letter.payload, letter.record) == (
        "console", "unreadable", "", "", "", -1, content, None)
    assert letter.reason == "the spool holds an entry this release cannot read: line 3 is not JSON"


def test_the_file_rotates_only_past_its_bound(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    first = letters.unreadable("otlp", 1, "a", "r")
    second = letters.unreadable("otlp", 2, "b", "r")
    third = letters.unreadable("otlp", 3, "c", "r")
    (tmp_path / "dead-letter.jsonl.1").write_text("older\n")
    # Exactly full after the second letter: not past the bound yet.
    monkeypatch.setattr(letters, "MAX_BYTES", len(first.to_json()) + len(second.to_json()))
    dead = DeadLetterFile(tmp_path)
    dead.append(first)
    dead.append(second)
    assert [x["seq"] for x in written(dead.path)] == [1, 2]
    assert (tmp_path / "dead-letter.jsonl.1").read_text() == "older\n"
    dead.append(third)
    assert [x["seq"] for x in written(tmp_path / "dead-letter.jsonl.1")] == [1, 2]
    assert [x["seq"] for x in written(dead.path)] == [3]


def test_a_first_letter_as_large_as_the_bound_starts_the_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = letters.unreadable("otlp", 1, "a", "r")
    monkeypatch.setattr(letters, "MAX_BYTES", len(first.to_json()))
    DeadLetterFile(tmp_path).append(first)
    assert [x["seq"] for x in written(tmp_path / "dead-letter.jsonl")] == [1]
    assert not (tmp_path / "dead-letter.jsonl.1").exists()


@pytest.mark.parametrize(("tail", "done", "kept"), [
    (b'{"time":"2026', "cut", [1, 3]),
    (json.dumps({"seq": 2}).encode(), "completed", [1, 2, 3]),
])
def test_a_letter_a_crash_cut_short_is_mended_before_the_next(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, tail: bytes, done: str,
        kept: list[int]) -> None:
    path = tmp_path / "dead-letter.jsonl"
    path.write_bytes(letters.unreadable("otlp", 1, "a", "r").to_json() + tail)
    dead = DeadLetterFile(tmp_path)
    with caplog.at_level(logging.WARNING, logger=letters.__name__):
        dead.append(letters.unreadable("otlp", 3, "c", "r"))
    assert [x["seq"] for x in written(path)] == kept
    assert caplog.messages == [f"dead-letter file {path}: {done} the last {len(tail)} bytes, "
                               "a letter a crash left unfinished"]


def test_a_file_that_cannot_be_written_is_reported_until_it_can(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # A file where the state directory should be: every write under it fails, as root too,
    # where a read-only mode would not stop us.
    state = tmp_path / "state"
    state.write_text("not a directory")
    dead = DeadLetterFile(state)
    with caplog.at_level(logging.ERROR), pytest.raises(OSError) as caught:
        dead.append(letters.unreadable("otlp", 1, "a", "r"))
    error = describe_os_error(caught.value)
    assert dead.fault is not None
    assert (dead.fault.file, dead.fault.error) == (str(state / "dead-letter.jsonl"), error)
    assert caplog.messages == [
        f"cannot write the dead-letter file {state / 'dead-letter.jsonl'} ({error}); the "
        "rejected record is kept in its spool until it can be; retrying until it is writable "
        "again"]
    dead.probe()  # still failing: no exception, the fault stays
    assert dead.fault is not None
    state.unlink()
    state.mkdir()
    dead.probe()
    assert dead.fault is None
    assert list(state.iterdir()) == [], "the probe left its file behind"
    dead.append(letters.unreadable("otlp", 2, "b", "r"))
    assert [x["seq"] for x in written(dead.path)] == [2]


def test_a_probe_without_a_fault_writes_nothing(tmp_path: Path) -> None:
    DeadLetterFile(tmp_path).probe()
    assert list(tmp_path.iterdir()) == []


def test_to_json_leaves_out_only_a_missing_record() -> None:
    letter = DeadLetter("t", "otlp", "s", "r", "E", "k", "rid", 1, {"p": 1}, record={"r": 2})
    assert json.loads(letter.to_json())["record"] == {"r": 2}
    assert "record" not in json.loads(DeadLetter("t", "otlp", "s", "r", "E", "k", "rid", 1,
                                                 None).to_json())


def test_after_an_append_that_failed_and_could_not_be_cut_back_the_next_cuts_first(
        tmp_path: Path) -> None:
    dead = DeadLetterFile(tmp_path)
    dead.append(letters.unreadable("otlp", 1, "a", "r"))
    path = tmp_path / "dead-letter.jsonl"
    # The disk is full after 7 bytes, then read-only: the cut back fails too.
    with step_hook(full_after(7, read_only=True)), pytest.raises(OSError):
        dead.append(letters.unreadable("otlp", 2, "b", "r"))
    dead.append(letters.unreadable("otlp", 3, "c", "r"))
    assert [x["seq"] for x in written(path)] == [1, 3]
