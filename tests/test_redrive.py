"""``redeliver`` in-process (delivery/redrive.py), on real files: which letters a plan takes and
why it skips the others, the sequence numbers and spools :func:`apply` gives them, the marks it
writes back, and a request left for the next start. tests/test_overload.py runs the command
against a real exporter and collector; these tests pin each rule on its own."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import pytest

from scheduled_events_exporter.codec import encode_record
from scheduled_events_exporter.delivery import dead_letter as letters
from scheduled_events_exporter.delivery import redrive
from scheduled_events_exporter.delivery.dead_letter import DeadLetter, DeadLetterFile
from scheduled_events_exporter.delivery.redrive import Letter, Selection
from scheduled_events_exporter.delivery.spool import Spool
from scheduled_events_exporter.model import InstanceInfo, ScheduledEvent, Transition, TransitionKind
from scheduled_events_exporter.records import TransitionRecord

AT = datetime(2026, 11, 27, 10, tzinfo=timezone.utc)
NOW = datetime(2026, 11, 28, 8, 30, 15, 250000, tzinfo=timezone.utc)


def record(seq: int) -> TransitionRecord:
    event = ScheduledEvent(f"E{seq}", "Scheduled", "Reboot", resources=("vm",))
    return TransitionRecord(Transition(TransitionKind.SCHEDULED, AT, seq, event),
                            InstanceInfo(vm_name="vm"), f"rid-{seq}", True, "0.1.0", seq)


def letter(seq: int, sink: str = "otlp", time: str = "2026-11-27T10:00:00.000Z",
           status: str = "HTTP 400", stored: object = True) -> DeadLetter:
    """The letter of ``record(seq)`` refused by ``sink`` (``stored``: the record as stored,
    ``True`` for the record's own)."""
    return DeadLetter(time=time, sink=sink, status=status, reason=f"rid-{seq} refused",
                      event_id=f"E{seq}", transition="scheduled", record_id=f"rid-{seq}",
                      seq=seq, payload={"sent": seq},
                      record=encode_record(record(seq)) if stored is True else stored)


def lines_of(path: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def spooled(directory: Path, sink: str) -> list[TransitionRecord]:
    return Spool(directory / "spool", sink).load()


def test_a_plan_takes_every_letter_of_both_files_in_the_order_they_were_written(
        tmp_path: Path) -> None:
    (tmp_path / "dead-letter.jsonl.1").write_bytes(letter(1).to_json() + letter(2).to_json())
    # Damage and a line that is not an object are not letters, yet they count as lines (the
    # marks are written back by line number); a torn last letter is not a line.
    (tmp_path / "dead-letter.jsonl").write_bytes(
        b"{damaged\n" + b"[1, 2]\n" + letter(3, "eventhubs", status="message_too_large").to_json()
        + letter(4).to_json()[:50])
    chosen = redrive.plan(tmp_path, Selection())
    assert chosen.skipped == ()
    assert [t.record for t in chosen.taken] == [record(1), record(2), record(3)]
    assert [t.letter for t in chosen.taken] == [
        Letter(tmp_path / "dead-letter.jsonl.1", 0, "otlp", "HTTP 400",
               "2026-11-27T10:00:00.000Z", "E1", "scheduled", "rid-1"),
        Letter(tmp_path / "dead-letter.jsonl.1", 1, "otlp", "HTTP 400",
               "2026-11-27T10:00:00.000Z", "E2", "scheduled", "rid-2"),
        Letter(tmp_path / "dead-letter.jsonl", 2, "eventhubs", "message_too_large",
               "2026-11-27T10:00:00.000Z", "E3", "scheduled", "rid-3"),
    ]
    assert redrive.letter_files(tmp_path) == [tmp_path / "dead-letter.jsonl.1",
                                              tmp_path / "dead-letter.jsonl"]


def test_no_dead_letter_file_is_an_empty_plan(tmp_path: Path) -> None:
    assert redrive.plan(tmp_path, Selection()) == redrive.Plan((), ())
    assert redrive.apply(tmp_path, redrive.Plan((), ()), NOW) == []
    assert list(tmp_path.iterdir()) == [], "an empty plan wrote something"


def test_fields_of_another_type_read_as_empty(tmp_path: Path) -> None:
    data = json.loads(letter(1).to_json())
    data.update(event_id=17, time=None)
    (tmp_path / "dead-letter.jsonl").write_text(json.dumps(data) + "\n")
    [taken] = redrive.plan(tmp_path, Selection()).taken
    assert (taken.letter.event_id, taken.letter.time, taken.letter.sink) == ("", "", "otlp")


@pytest.mark.parametrize(("selection", "wanted"), [
    (Selection(), [1, 2, 3, 4]),
    (Selection(sink="otlp"), [1, 3, 4]),
    (Selection(sink="eventhubs"), [2]),
    (Selection(event_id="E3"), [3]),
    (Selection(sink="eventhubs", event_id="E3"), []),
    # At or after: the letter written at that very millisecond is taken.
    (Selection(since=datetime(2026, 11, 27, 11, tzinfo=timezone.utc)), [2, 3]),
    (Selection(since=datetime(2026, 11, 27, 11, 0, 0, 1000, tzinfo=timezone.utc)), [3]),
    (Selection(sink="otlp", since=datetime(2026, 11, 27, 11, tzinfo=timezone.utc)), [3]),
])
def test_a_selection_takes_the_letters_it_names(tmp_path: Path, selection: Selection,
                                                wanted: list[int]) -> None:
    dead = DeadLetterFile(tmp_path)
    dead.append(letter(1, time="2026-11-27T10:59:59.999Z"))
    dead.append(letter(2, "eventhubs", time="2026-11-27T11:00:00.000Z"))
    dead.append(letter(3, time="2026-11-27T12:00:00.000Z"))
    dead.append(letter(4, time="not a time"))  # taken only when no time is asked for
    chosen = redrive.plan(tmp_path, selection)
    assert [t.record.seq for t in chosen.taken] == wanted
    assert chosen.skipped == ()


def test_a_letter_that_cannot_be_put_back_is_skipped_with_its_reason(tmp_path: Path) -> None:
    future = encode_record(record(4))
    future["transition"]["kind"] = "superseded" + "s" * 300
    marked = json.loads(letter(1).to_json())
    marked["redelivered"] = {"time": "2026-11-27T12:00:00.000Z", "seq": 9}
    spool_line = {"seq": 7, "record": encode_record(record(7))}
    dead = tmp_path / "dead-letter.jsonl"
    dead.write_bytes(
        json.dumps(marked).encode() + b"\n"
        + letter(2, "kafka").to_json()
        + letter(3, stored=None).to_json()  # a release before redeliver wrote it
        + letter(4, stored=future).to_json()
        # A spool line this release could not read at the time: its record is in the payload.
        + letters.unreadable("otlp", 7, spool_line, "then unknown").to_json()
        + letters.unreadable("otlp", 8, "{torn", "line 1 is not JSON").to_json()
        # Only an unreadable entry's payload is the record as stored.
        + letter(5, stored=None).to_json().replace(b'"payload":{"sent":5}',
                                                   b'"payload":' + json.dumps(spool_line).encode()))
    chosen = redrive.plan(tmp_path, Selection())
    assert [t.record for t in chosen.taken] == [record(7)]
    assert chosen.taken[0].letter.status == "unreadable"
    reasons = [(s.letter.line, s.reason) for s in chosen.skipped]
    assert reasons[:3] == [
        (0, "already redelivered"),
        (1, "names no sink this release has ('kafka')"),
        (2, "written by a release before redeliver: it holds the record as sent, not as stored"),
    ]
    assert reasons[3][0] == 3 and reasons[3][1].startswith("this release cannot read it either (")
    assert "superseded" in reasons[3][1] and reasons[3][1].endswith(")")
    assert len(reasons[3][1]) == len("this release cannot read it either ()") + 200
    assert reasons[4:] == [
        (5, "written by a release before redeliver: it holds the record as sent, not as stored"),
        (6, "written by a release before redeliver: it holds the record as sent, not as stored"),
    ]


def test_apply_numbers_after_everything_the_directory_used_and_marks_the_letters(
        tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text(json.dumps({"schema": 1, "seq": 20}))
    spools = tmp_path / "spool"
    spools.mkdir()
    (spools / "eventhubs.log").write_bytes(b"")
    (spools / "eventhubs.ack").write_text("30")  # delivered up to 30 before
    # A spool of no sink this release has is not ours to number after.
    (spools / "kafka.log").write_text(json.dumps({"seq": 99, "record": encode_record(record(99))})
                                      + "\n")
    dead = DeadLetterFile(tmp_path)
    dead.append(letter(1))
    dead.append(letter(2, "eventhubs"))
    dead.append(letter(3, "console"))
    dead.append(letter(4))
    before = (tmp_path / "dead-letter.jsonl").read_bytes().splitlines(keepends=True)
    chosen = redrive.plan(tmp_path, Selection())
    chosen = redrive.Plan(tuple(t for t in chosen.taken if t.record.seq != 3), ())
    done = redrive.apply(tmp_path, chosen, NOW)
    assert [(t.record.seq, seq) for t, seq in done] == [(1, 31), (2, 32), (4, 33)]
    assert [(r.record_id, r.seq) for r in spooled(tmp_path, "otlp")] == [("rid-1", 31),
                                                                        ("rid-4", 33)]
    assert [(r.record_id, r.seq) for r in spooled(tmp_path, "eventhubs")] == [("rid-2", 32)]
    # The record as it was, but for its new sequence number.
    assert spooled(tmp_path, "otlp")[0].transition == record(1).transition
    assert not (spools / "console.log").exists()
    after = (tmp_path / "dead-letter.jsonl").read_bytes().splitlines(keepends=True)
    assert after[2] == before[2], "a letter not in the plan was rewritten"
    for number, seq in ((0, 31), (1, 32), (3, 33)):
        data = json.loads(after[number])
        assert data.pop("redelivered") == {"time": "2026-11-28T08:30:15.250Z", "seq": seq}
        assert data == json.loads(before[number])
    assert after[0].endswith(b"}\n") and b", " not in after[0]
    again = redrive.plan(tmp_path, Selection())
    assert [t.record.seq for t in again.taken] == [3]
    assert [s.reason for s in again.skipped] == ["already redelivered"] * 3


def test_apply_numbers_after_the_state_file_and_every_spool(tmp_path: Path) -> None:
    DeadLetterFile(tmp_path).append(letter(1))
    (tmp_path / "state.json").write_text(json.dumps({"schema": 1, "seq": 50}))
    done = redrive.apply(tmp_path, redrive.plan(tmp_path, Selection()), NOW)
    assert [seq for _, seq in done] == [51]
    # A spool of a sink the plan does not name counts too.
    DeadLetterFile(tmp_path).append(letter(2))
    (tmp_path / "spool" / "console.ack").write_text("70")
    (tmp_path / "spool" / "console.log").write_bytes(b"")
    done = redrive.apply(tmp_path, redrive.plan(tmp_path, Selection()), NOW)
    assert [seq for _, seq in done] == [71]


def test_apply_numbers_after_the_spools_pending_lines(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool", "otlp")
    spool.append([record(40), record(41)])
    (tmp_path / "spool" / "otlp.log").open("ab").write(b'{"seq":42,"rec')  # a torn append
    DeadLetterFile(tmp_path).append(letter(1))
    done = redrive.apply(tmp_path, redrive.plan(tmp_path, Selection()), NOW)
    assert [seq for _, seq in done] == [42]
    assert [(r.record_id, r.seq) for r in spooled(tmp_path, "otlp")] == [
        ("rid-40", 40), ("rid-41", 41), ("rid-1", 42)]


def test_marking_keeps_the_letters_as_written_and_drops_a_torn_last_one(
        tmp_path: Path) -> None:
    first = replace(letter(1), reason="attribute ü refused")
    path = tmp_path / "dead-letter.jsonl"
    path.write_bytes(first.to_json() + letter(2).to_json()[:30])
    redrive.apply(tmp_path, redrive.plan(tmp_path, Selection()), NOW)
    content = path.read_bytes()
    assert content.endswith(b"}\n") and content.count(b"\n") == 1
    assert "ü".encode() in content and json.loads(content)["redelivered"]["seq"] == 1


def test_a_letter_in_the_older_file_is_marked_there(tmp_path: Path) -> None:
    (tmp_path / "dead-letter.jsonl.1").write_bytes(letter(1).to_json() + letter(2).to_json())
    DeadLetterFile(tmp_path).append(letter(3))
    chosen = redrive.plan(tmp_path, Selection(event_id="E2"))
    redrive.apply(tmp_path, chosen, NOW)
    older = lines_of(tmp_path / "dead-letter.jsonl.1")
    assert ["redelivered" in x for x in older] == [False, True]
    assert ["redelivered" in x for x in lines_of(tmp_path / "dead-letter.jsonl")] == [False]


@pytest.mark.parametrize("state", [None, b"{not json", b"[1]", b'{"seq": true}', b'{"seq": "7"}',
                                   b'{"schema": 1}'])
def test_a_state_file_without_a_sequence_number_counts_as_zero(tmp_path: Path,
                                                                state: bytes | None) -> None:
    if state is not None:
        (tmp_path / "state.json").write_bytes(state)
    DeadLetterFile(tmp_path).append(letter(5))
    done = redrive.apply(tmp_path, redrive.plan(tmp_path, Selection()), NOW)
    assert [seq for _, seq in done] == [1]


def test_a_request_is_carried_out_at_the_next_start_and_removed(tmp_path: Path) -> None:
    dead = DeadLetterFile(tmp_path)
    dead.append(letter(1, time="2026-11-27T09:00:00.000Z"))
    dead.append(letter(2, time="2026-11-27T11:00:00.000Z"))
    dead.append(letter(3, "eventhubs", time="2026-11-27T11:00:00.000Z"))
    dead.append(letter(4, time="2026-11-27T11:00:00.000Z"))
    dead.append(letter(5, time="2026-11-27T12:00:00.000Z"))
    since = datetime(2026, 11, 27, 10, tzinfo=timezone.utc)
    path = redrive.request(tmp_path, Selection("otlp", None, since), NOW)
    assert path == tmp_path / "redeliver-request.json"
    assert path.read_bytes() == (b'{"sink":"otlp","event_id":null,"since":"2026-11-27T10:00:00'
                                 b'.000Z","requested_at":"2026-11-28T08:30:15.250Z"}\n')
    result = redrive.perform_request(tmp_path, NOW)
    assert result is not None
    chosen, done = result
    assert [t.record.seq for t in chosen.taken] == [2, 4, 5]
    assert [s for _, s in done] == [1, 2, 3]
    assert not path.exists()
    assert redrive.perform_request(tmp_path, NOW) is None
    redrive.request(tmp_path, Selection(event_id="E3"), NOW)
    assert json.loads(path.read_text()) == {"sink": None, "event_id": "E3", "since": None,
                                            "requested_at": "2026-11-28T08:30:15.250Z"}
    result = redrive.perform_request(tmp_path, NOW)
    assert result is not None and [t.record.seq for t in result[0].taken] == [3]
    # Fields that are not text select nothing: any letter not put back yet.
    path.write_text(json.dumps({"sink": 3, "event_id": 7, "since": None}))
    result = redrive.perform_request(tmp_path, NOW)
    assert result is not None
    assert [t.record.seq for t in result[0].taken] == [1]
    assert [s.reason for s in result[0].skipped] == ["already redelivered"] * 4


@pytest.mark.parametrize(("content", "why"), [
    (b"{not json", "expected the JSON redeliver --at-next-start writes"),
    (b"[]", "expected a JSON object"),
    (b'{"since": "yesterday"}', "since 'yesterday' is not an RFC 3339 time"),
])
def test_a_request_this_release_cannot_read_is_refused_and_left(tmp_path: Path, content: bytes,
                                                                 why: str) -> None:
    DeadLetterFile(tmp_path).append(letter(1))
    path = tmp_path / "redeliver-request.json"
    path.write_bytes(content)
    with pytest.raises(ValueError) as caught:
        redrive.perform_request(tmp_path, NOW)
    assert str(caught.value).startswith(f"{path}: ") and why in str(caught.value)
    assert path.read_bytes() == content
    assert not (tmp_path / "spool").exists()
