"""The spool's rules one at a time (delivery/spool.py), on real files: which lines it can read
and what it says of those it cannot, the ack cursor it writes below a line it still holds, when
the log is emptied or compacted, the line format, a torn tail cut or completed, and a write that
fails. tests/test_file_evolution.py covers other releases' lines, tests/test_crash_points.py and
tests/test_durable_core_stateful.py the spool inside the durable core."""

from __future__ import annotations

import errno
import json
import logging
from datetime import datetime, timezone
from pathlib import Path

import pytest

from scheduled_events_exporter.codec import UnreadableLine, encode_record
from scheduled_events_exporter.delivery import spool as spool_module
from scheduled_events_exporter.delivery.spool import Spool
from scheduled_events_exporter.model import InstanceInfo, ScheduledEvent, Transition, TransitionKind
from scheduled_events_exporter.platforms.durable import DiskStep, set_step_hook
from scheduled_events_exporter.records import TransitionRecord
from tests.crashdisk import full_after, step_hook

AT = datetime(2026, 11, 27, tzinfo=timezone.utc)


def record(seq: int) -> TransitionRecord:
    return TransitionRecord(
        Transition(TransitionKind.SCHEDULED, AT, 1, ScheduledEvent(f"E{seq}", "Scheduled")),
        InstanceInfo(vm_name="vm"), f"rid-{seq}", True, "0.1.0", seq)


def line(seq: int) -> bytes:
    """A spool line exactly as this release writes it."""
    return json.dumps({"seq": seq, "record": encode_record(record(seq))},
                      separators=(",", ":")).encode() + b"\n"


def spool_with(tmp_path: Path, content: bytes, ack: str | None = None,
               compact_bytes: int = spool_module.COMPACT_BYTES) -> Spool:
    (tmp_path / "otlp.log").write_bytes(content)
    if ack is not None:
        (tmp_path / "otlp.ack").write_text(ack)
    return Spool(tmp_path, "otlp", compact_bytes=compact_bytes)


def log_of(tmp_path: Path) -> bytes:
    return (tmp_path / "otlp.log").read_bytes()


def refuse(_: UnreadableLine) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_lines_are_compact_json_one_per_record(tmp_path: Path) -> None:
    spool = Spool(tmp_path, "otlp")
    assert spool.append([record(1), record(2)]) == [record(1), record(2)]
    assert log_of(tmp_path) == line(1) + line(2)
    assert spool.append([record(2)]) == [], "appended twice"
    assert spool.last_seq == 2


def test_lines_without_a_usable_sequence_number_are_handed_over_in_place(
        tmp_path: Path) -> None:
    bad_utf8 = b"\xff{not json " + b"x" * 5000 + b"  \n"
    others = [b"{not json  \n", b"{not jsonX\n", b"[1, 2]\n", b'{"seq": true}\n',
              b'{"seq": "7"}\n', b'{"seq": -1}\n', b'{"record": {}}\n']
    spool = spool_with(tmp_path, line(1) + bad_utf8 + b"".join(others) + line(2))
    taken: list[UnreadableLine] = []
    assert [r.seq for r in spool.load(taken.append)] == [1, 2]
    assert taken[0] == UnreadableLine(
        None, ("\ufffd{not json " + "x" * 5000 + "  ")[:4096], "line 2 is not JSON")
    expected = 'line {}: expected an object with a sequence number "seq", got {}'
    assert [(u.seq, u.content, u.reason) for u in taken[1:]] == [
        # The line as it was, but for its newline.
        (None, "{not json  ", "line 3 is not JSON"), (None, "{not jsonX", "line 4 is not JSON"),
        (None, [1, 2], expected.format(5, "list")),
        (None, {"seq": True}, expected.format(6, "dict")),
        (None, {"seq": "7"}, expected.format(7, "dict")),
        (None, {"seq": -1}, expected.format(8, "dict")),
        (None, {"record": {}}, expected.format(9, "dict")),
    ]
    # Each line taken leaves the log; the others stay exactly as they were.
    assert log_of(tmp_path) == line(1) + line(2)


def test_a_record_this_release_cannot_decode_is_handed_over_with_why(tmp_path: Path) -> None:
    broken = json.loads(line(2))
    broken["record"]["transition"]["kind"] = "y" * 900
    spool = spool_with(tmp_path, line(1) + json.dumps(broken).encode() + b"\n")
    taken: list[UnreadableLine] = []
    assert [r.seq for r in spool.load(taken.append)] == [1]
    [what] = taken
    assert (what.seq, what.content) == (2, broken)
    # The decoder's words, cut to 500 characters (the value quoted in them can be megabytes).
    assert what.reason.startswith("record.transition.kind: expected one of [")
    assert len(what.reason) == 500


def test_sequence_number_zero_is_below_every_cursor(tmp_path: Path) -> None:
    spool = spool_with(tmp_path, b'{"seq": 0, "record": "never decoded"}\n' + line(1))
    taken: list[UnreadableLine] = []
    assert [r.seq for r in spool.load(taken.append)] == [1]
    assert taken == []


def test_a_second_load_returns_what_the_first_read(tmp_path: Path) -> None:
    spool = spool_with(tmp_path, line(1) + line(2))
    first = spool.load()
    # Read once, at start: what is appended since is the worker's queue, not the start's.
    spool.append([record(3)])
    assert spool.load() == first == [record(1), record(2)]


def test_an_acknowledgement_not_past_the_cursor_touches_nothing(tmp_path: Path) -> None:
    spool = spool_with(tmp_path, line(1) + line(2) + line(3))
    spool.load()
    spool.ack(2)
    taken: list[DiskStep] = []
    previous = set_step_hook(taken.append)
    try:
        spool.ack(2)
        spool.ack(1)
    finally:
        set_step_hook(previous)
    assert taken == []
    assert (tmp_path / "otlp.ack").read_text() == "2"


def test_unknown_fields_are_named_once_per_load(tmp_path: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    data = json.loads(line(1))
    data["record"]["transition"]["why"] = "new"
    data["record"]["instance"]["rack"] = 7
    spool = spool_with(tmp_path, json.dumps(data).encode() + b"\n" + line(2))
    with caplog.at_level(logging.INFO, logger=spool_module.__name__):
        spool.load()
    assert caplog.messages == ["spool otlp: keeping fields this release does not know (a newer "
                               "release wrote them): InstanceInfo.rack, Transition.why"]


@pytest.mark.parametrize(("cursor", "acked"), [
    ("[7]", 0), ('{"seq": 0}', 0), ('{"seq": -2}', 0), ('{"seq": 7}', 7), ("0", 0)])
def test_the_cursor_reads_what_it_can(tmp_path: Path, cursor: str, acked: int) -> None:
    assert spool_with(tmp_path, b"", ack=cursor).acked == acked


def test_an_unreadable_cursor_redelivers_from_the_start_and_says_why(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=spool_module.__name__):
        spool = spool_with(tmp_path, line(1), ack="[" + "7" * 60 + "]")
    assert spool.acked == 0 and spool.load() == [record(1)]
    assert caplog.messages == [
        "spool otlp: ack cursor unreadable (expected an integer or an object with \"seq\", got "
        f"{('[' + '7' * 60 + ']')[:40]!r}); redelivering from the start"]


def test_the_cursor_stays_below_a_line_still_held(tmp_path: Path) -> None:
    """A line the dead-letter file could not take keeps its place: the cursor on disk stays
    below it whatever is acknowledged, so the next start offers it again."""
    future = json.loads(line(1))
    future["record"]["transition"]["kind"] = "superseded"
    held = json.dumps(future).encode() + b"\n"
    spool = spool_with(tmp_path, held + line(2) + line(3))
    assert [r.seq for r in spool.load(refuse)] == [2, 3]
    spool.ack(2)
    assert (tmp_path / "otlp.ack").read_text() == "0"
    assert spool.acked == 2
    spool.ack(3)
    assert (tmp_path / "otlp.ack").read_text() == "0"
    # Everything readable was delivered: only the held line is left.
    assert log_of(tmp_path) == held
    taken: list[UnreadableLine] = []
    assert Spool(tmp_path, "otlp").load(taken.append) == []
    assert [u.seq for u in taken] == [1]
    assert log_of(tmp_path) == b""


def test_the_cursor_passes_a_held_line_only_up_to_it(tmp_path: Path) -> None:
    future = json.loads(line(3))
    future["record"]["transition"]["kind"] = "superseded"
    held = json.dumps(future).encode() + b"\n"
    spool = spool_with(tmp_path, line(1) + line(2) + held + line(4) + line(5), ack="0")
    spool.load(refuse)
    spool.ack(4)
    assert (tmp_path / "otlp.ack").read_text() == "2"


def test_a_held_line_without_a_sequence_number_holds_the_cursor_back_at_nothing(
        tmp_path: Path) -> None:
    spool = spool_with(tmp_path, line(1) + b"{damaged\n" + line(2))
    spool.load(refuse)
    spool.ack(1)
    assert (tmp_path / "otlp.ack").read_text() == "1"
    spool.ack(2)
    assert (tmp_path / "otlp.ack").read_text() == "2"
    assert log_of(tmp_path) == b"{damaged\n"


def test_an_acknowledgement_of_everything_empties_the_log(tmp_path: Path) -> None:
    spool = spool_with(tmp_path, line(1) + line(2))
    spool.load()
    spool.ack(1)
    assert log_of(tmp_path) == line(1) + line(2), "compacted below the bound"
    spool.ack(2)
    assert log_of(tmp_path) == b"" and (tmp_path / "otlp.ack").read_text() == "2"
    spool.append([record(3)])
    assert log_of(tmp_path) == line(3)


def test_the_log_is_compacted_only_past_its_bound(tmp_path: Path) -> None:
    content = line(1) + line(2) + line(3)
    spool = spool_with(tmp_path, content, compact_bytes=len(content))
    spool.load()
    spool.ack(1)  # exactly at the bound: left alone
    assert log_of(tmp_path) == content
    spool.append([record(4)])
    spool.ack(2)  # past it: only what is pending stays
    assert log_of(tmp_path) == line(3) + line(4)


def test_a_write_failure_names_the_file_that_failed(tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    spool = spool_with(tmp_path, line(1) + line(2))
    spool.load()
    (tmp_path / "otlp.ack").mkdir()  # the cursor cannot be replaced
    with caplog.at_level(logging.ERROR), pytest.raises(OSError):
        spool.ack(1)
    assert spool.fault is not None and spool.fault.file == str(tmp_path / "otlp.ack")
    assert caplog.messages == [
        f"cannot write the spool of sink otlp {tmp_path / 'otlp.ack'} ({spool.fault.error}); "
        "its records are held in memory (a crash now would lose them); retrying until it is "
        "writable again"]
    (tmp_path / "otlp.ack").rmdir()
    spool.ack(1)
    assert spool.fault is None and (tmp_path / "otlp.ack").read_text() == "1"


def test_after_an_append_that_failed_and_could_not_be_cut_back_the_next_cuts_first(
        tmp_path: Path) -> None:
    spool = Spool(tmp_path, "otlp")
    spool.append([record(1)])
    log = tmp_path / "otlp.log"
    # The disk is full after 7 bytes, then read-only: the cut back fails too.
    with step_hook(full_after(7, read_only=True)), pytest.raises(OSError):
        spool.append([record(2)])
    assert log.read_bytes() == line(1) + line(2)[:7]
    spool.append([record(2)])
    assert log.read_bytes() == line(1) + line(2)


CUT = ("spool otlp: cut off the last {} bytes, a line a crash left unfinished (its append "
       "never returned; its records are appended again from the state file)")
COMPLETED = "spool otlp: its last line had lost its newline in a crash; completed it"


@pytest.mark.parametrize(("tail", "kept", "said"), [
    (line(2)[:-1], line(2), COMPLETED),  # only its newline was lost
    (b'{"seq": 0}', b'{"seq": 0}\n', COMPLETED),
    (b'{"seq": -1}', b"", CUT.format(11)), (b'{"seq": "2"}', b"", CUT.format(12)),
    (b'{"seq": true}', b"", CUT.format(13)), (b"[2]", b"", CUT.format(3)),
    (b'{"other": 2}', b"", CUT.format(12)), (b'{"seq', b"", CUT.format(5)),
])
def test_a_torn_tail_is_completed_only_when_it_is_a_line_of_ours(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, tail: bytes, kept: bytes,
        said: str) -> None:
    spool = spool_with(tmp_path, line(1) + tail)
    with caplog.at_level(logging.WARNING, logger=spool_module.__name__):
        spool.append([record(3)])
    assert log_of(tmp_path) == line(1) + kept + line(3)
    assert caplog.messages == [said]


def test_a_torn_tail_that_cannot_be_cut_is_not_read_as_a_line(tmp_path: Path) -> None:
    def read_only(step: DiskStep) -> None:
        if step.kind == "truncate":
            raise OSError(errno.EROFS, "Read-only file system")

    spool = spool_with(tmp_path, line(1) + b"x" + line(2)[1:30])
    taken: list[UnreadableLine] = []
    previous = set_step_hook(read_only)
    try:
        assert spool.load(taken.append) == [record(1)]
    finally:
        set_step_hook(previous)
    assert taken == []
    assert spool.fault is not None and spool.fault.file == str(tmp_path / "otlp.log")


def test_without_a_taker_an_unreadable_line_stays(tmp_path: Path) -> None:
    content = line(1) + b"{damaged\n" + line(2)
    spool = spool_with(tmp_path, content)
    assert spool.load() == [record(1), record(2)]
    assert log_of(tmp_path) == content


def test_the_lines_taken_before_the_dead_letter_file_failed_leave_the_log(
        tmp_path: Path) -> None:
    spool = spool_with(tmp_path, b"{first\n" + line(1) + b"{second\n")
    taken: list[object] = []

    def full_after_one(what: UnreadableLine) -> None:
        if taken:
            raise OSError(errno.ENOSPC, "No space left on device")
        taken.append(what.content)

    assert spool.load(full_after_one) == [record(1)]
    assert taken == ["{first"]
    assert log_of(tmp_path) == line(1) + b"{second\n"


def test_an_ack_cursor_that_cannot_be_read_redelivers_from_the_start(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "otlp.ack").mkdir()
    with caplog.at_level(logging.WARNING, logger=spool_module.__name__):
        spool = spool_with(tmp_path, line(1))
    assert spool.acked == 0 and spool.load() == [record(1)]
    [message] = caplog.messages
    assert message.startswith("spool otlp: ack cursor unreadable ([Errno ")
    assert message.endswith(f"'{tmp_path / 'otlp.ack'}'); redelivering from the start")
