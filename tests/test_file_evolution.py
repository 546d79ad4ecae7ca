"""The state file and the spool as other releases write them (docs/semantics.md,
"Compatibility"), on real files: a newer schema refuses to start without touching the file, a
pre-release schema and damage are set aside, unknown fields are named and ignored; a spool line
this release cannot read is handed over to be dead-lettered and leaves the log only once it was
taken, a torn last line is skipped, and the ack cursor reads either form."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from pathlib import Path

import pytest

from scheduled_events_exporter.codec import encode_record
from scheduled_events_exporter.delivery.spool import Spool, UnreadableLine
from scheduled_events_exporter.model import InstanceInfo, ScheduledEvent, Transition, TransitionKind
from scheduled_events_exporter.records import TransitionRecord
from scheduled_events_exporter.state import (
    SCHEMA_VERSION,
    NewerStateFile,
    PersistedState,
    StateStore,
)
from scheduled_events_exporter.tracker import KnownEvent, TrackerState

AT = datetime(2026, 1, 1, tzinfo=timezone.utc)


def record(seq: int) -> TransitionRecord:
    return TransitionRecord(
        Transition(TransitionKind.SCHEDULED, AT, 1, ScheduledEvent(f"E{seq}", "Scheduled")),
        InstanceInfo(vm_name="vm"), f"rid-{seq}", True, "0.1.0", seq)


def line(seq: int, **extra: object) -> str:
    return json.dumps({"seq": seq, "record": encode_record(record(seq)), **extra}) + "\n"


def saved(tmp_path: Path) -> StateStore:
    store = StateStore(tmp_path)
    known = KnownEvent(ScheduledEvent("E1", "Scheduled"), AT, AT)
    store.save(PersistedState(TrackerState(events={"E1": known}, incarnation=3), seq=9,
                              outbox=(record(9),), approvals=("E1",)))
    return store


def test_a_newer_schema_refuses_to_start_and_leaves_the_file_alone(tmp_path: Path) -> None:
    store = saved(tmp_path)
    data = json.loads(store.path.read_text())
    data["schema"] = SCHEMA_VERSION + 1
    store.path.write_text(json.dumps(data))
    before = store.path.read_bytes()
    with pytest.raises(NewerStateFile, match=rf"schema {SCHEMA_VERSION + 1}, written by a newer "
                                             r"release; this release reads schemas 2 to 2"):
        store.load()
    assert store.path.read_bytes() == before
    assert not list(tmp_path.glob("state.json.corrupt-*"))


@pytest.mark.parametrize("schema", [1, 0, "2", None, True])
def test_a_pre_release_or_malformed_schema_is_set_aside(tmp_path: Path, schema: object) -> None:
    store = saved(tmp_path)
    data = json.loads(store.path.read_text())
    data["schema"] = schema
    store.path.write_text(json.dumps(data))
    assert store.load() is None
    assert list(tmp_path.glob("state.json.corrupt-*"))


def test_unknown_fields_in_the_state_file_are_named_once_and_kept(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = saved(tmp_path)
    expected = store.load()
    data = json.loads(store.path.read_text())
    data["next"] = 1
    data["tracker"]["events"][0][1]["event"]["priority"] = "high"
    data["outbox"][0]["transition"]["reason"] = "x"
    store.path.write_text(json.dumps(data))
    with caplog.at_level(logging.INFO):
        assert store.load() == expected
    said = [r.getMessage() for r in caplog.records if "does not know" in r.getMessage()]
    assert len(said) == 1
    assert "ScheduledEvent.priority, Transition.reason, state.next" in said[0]
    # Saved again by this release (as the committer does, with the loaded top-level fields),
    # the file holds them where the newer release put them.
    loaded = store.load()
    assert loaded is not None
    store.save(loaded)
    again = json.loads(store.path.read_text())
    assert again["next"] == 1
    assert again["tracker"]["events"][0][1]["event"]["priority"] == "high"
    assert again["outbox"][0]["transition"]["reason"] == "x"


def test_an_outbox_record_this_release_cannot_read_does_not_set_the_state_aside(
        tmp_path: Path) -> None:
    store = saved(tmp_path)
    data = json.loads(store.path.read_text())
    future = json.loads(json.dumps(data["outbox"][0]))
    future["seq"], future["record_id"] = 10, "rid-10"
    future["transition"]["kind"] = "superseded"
    data["outbox"].append(future)
    data["outbox"].append(encode_record(record(11)))
    store.path.write_text(json.dumps(data))
    loaded = store.load()
    assert loaded is not None, "the state was set aside"
    assert not list(tmp_path.glob("state.json.corrupt-*"))
    assert [r.seq for r in loaded.outbox] == [9, 11]
    [entry] = loaded.unreadable
    assert entry.seq == 10 and "superseded" in entry.reason and "outbox entry 1" in entry.reason
    assert entry.content == {"seq": 10, "record": future}
    assert loaded.tracker.incarnation == 3


def test_fields_an_older_release_did_not_write_take_their_defaults(tmp_path: Path) -> None:
    store = saved(tmp_path)
    data = json.loads(store.path.read_text())
    del data["approvals"], data["outbox"], data["tracker"]["boot_id"]
    del data["tracker"]["events"][0][1]["unannounced"]
    store.path.write_text(json.dumps(data))
    loaded = store.load()
    assert loaded is not None and loaded.approvals == () and loaded.outbox == ()
    assert loaded.tracker.boot_id is None and not loaded.tracker.events["E1"].unannounced


def test_a_missing_field_without_default_is_damage_and_set_aside(tmp_path: Path) -> None:
    store = saved(tmp_path)
    data = json.loads(store.path.read_text())
    del data["tracker"]["events"][0][1]["first_seen"]
    store.path.write_text(json.dumps(data))
    assert store.load() is None
    assert list(tmp_path.glob("state.json.corrupt-*"))


def spool_with(tmp_path: Path, text: str, ack: str | None = None) -> Spool:
    (tmp_path / "otlp.log").write_text(text)
    if ack is not None:
        (tmp_path / "otlp.ack").write_text(ack)
    return Spool(tmp_path, "otlp")


def test_a_line_this_release_cannot_read_is_handed_over_and_then_leaves_the_log(
        tmp_path: Path) -> None:
    future = json.loads(line(2))
    future["record"]["transition"]["kind"] = "superseded"
    spool = spool_with(tmp_path, line(1) + json.dumps(future) + "\n" + "{garbage\n" + line(3))
    taken: list[UnreadableLine] = []
    assert [r.seq for r in spool.load(taken.append)] == [1, 3]
    assert [(u.seq, u.content == future) for u in taken] == [(2, True), (None, False)]
    assert "superseded" in taken[0].reason and taken[1].content == "{garbage"
    assert "line 3 is not JSON" in taken[1].reason
    assert spool.last_seq == 3
    # The log keeps exactly the readable lines; the next start offers nothing again.
    assert (tmp_path / "otlp.log").read_text() == line(1) + line(3)
    again: list[UnreadableLine] = []
    assert [r.seq for r in Spool(tmp_path, "otlp").load(again.append)] == [1, 3]
    assert again == []


def test_a_line_that_could_not_be_kept_stays_in_the_log(tmp_path: Path) -> None:
    future = json.loads(line(2))
    future["record"]["transition"]["kind"] = "superseded"
    text = line(1) + json.dumps(future) + "\n"
    spool = spool_with(tmp_path, text)

    def full_disk(_: UnreadableLine) -> None:
        raise OSError(28, "No space left on device")

    assert [r.seq for r in spool.load(full_disk)] == [1]
    assert (tmp_path / "otlp.log").read_text() == text


def test_only_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    torn = line(2)[:40]
    spool = spool_with(tmp_path, line(1) + torn)
    taken: list[UnreadableLine] = []
    assert [r.seq for r in spool.load(taken.append)] == [1]
    assert taken == []


@pytest.mark.parametrize("cut", [1, 40, len(line(2)) - 2])
def test_a_torn_tail_is_cut_off_before_the_next_append(tmp_path: Path, cut: int) -> None:
    """A power cut in the middle of an append, then the next record: it must not land after
    the fragment (the merged line would be dead-lettered at the next start, and the record
    with it)."""
    spool = spool_with(tmp_path, line(1) + line(2)[:cut])
    assert [r.seq for r in spool.load()] == [1]
    assert (tmp_path / "otlp.log").read_text() == line(1), "the torn tail is still there"
    # The outbox repair offers seq 2 again, and the next poll seq 3.
    assert [r.seq for r in spool.append([record(2), record(3)])] == [2, 3]
    taken: list[UnreadableLine] = []
    assert [r.seq for r in Spool(tmp_path, "otlp").load(taken.append)] == [1, 2, 3]
    assert taken == []


def test_a_tail_that_only_lost_its_newline_is_completed(tmp_path: Path) -> None:
    spool = spool_with(tmp_path, line(1) + line(2).rstrip("\n"))
    assert [r.seq for r in spool.load()] == [1, 2]
    spool.append([record(3)])
    assert [r.seq for r in Spool(tmp_path, "otlp").load()] == [1, 2, 3]


def test_an_append_before_any_load_cuts_the_tail_too(tmp_path: Path) -> None:
    spool = spool_with(tmp_path, line(1) + line(2)[:30])
    spool.append([record(2)])
    assert [r.seq for r in Spool(tmp_path, "otlp").load()] == [1, 2]


def test_compaction_keeps_a_line_it_cannot_parse(tmp_path: Path) -> None:
    """An unreadable line the dead-letter file could not take stays in the log however much is
    delivered around it: emptying or compacting the log must not drop it."""
    text = line(1) + "{not ours\n" + line(2)
    spool = spool_with(tmp_path, text)

    def full_disk(_: UnreadableLine) -> None:
        raise OSError(28, "No space left on device")

    assert [r.seq for r in spool.load(full_disk)] == [1, 2]
    spool.append([record(3)])
    spool.ack(3)  # everything readable is delivered
    assert "{not ours" in (tmp_path / "otlp.log").read_text()
    taken: list[UnreadableLine] = []
    assert Spool(tmp_path, "otlp").load(taken.append) == []
    assert [u.content for u in taken] == ["{not ours"]


def test_compaction_past_the_bound_keeps_a_line_it_cannot_parse(tmp_path: Path) -> None:
    text = line(1) + "{not ours\n" + line(2) + line(3)
    (tmp_path / "otlp.log").write_text(text)
    spool = Spool(tmp_path, "otlp", compact_bytes=10)

    def full_disk(_: UnreadableLine) -> None:
        raise OSError(28, "No space left on device")

    spool.load(full_disk)
    spool.ack(2)
    assert (tmp_path / "otlp.log").read_text() == "{not ours\n" + line(3)


def test_lines_already_acknowledged_are_not_even_decoded(tmp_path: Path) -> None:
    future = json.loads(line(1))
    future["record"]["transition"]["kind"] = "superseded"
    spool = spool_with(tmp_path, json.dumps(future) + "\n" + line(2), ack="1")
    taken: list[UnreadableLine] = []
    assert [r.seq for r in spool.load(taken.append)] == [2]
    assert taken == []


def test_unknown_fields_in_spool_lines_are_kept_with_the_record(tmp_path: Path) -> None:
    data = json.loads(line(1, written_by="0.2.0"))
    data["record"]["transition"]["why"] = "new"
    spool = spool_with(tmp_path, json.dumps(data) + "\n")
    [loaded] = spool.load()
    assert loaded == record(1)  # equal: what another release added is never compared
    assert loaded.transition.unknown_fields == (("why", "new"),)
    # Written again (a redelivery, another spool), the record carries them.
    assert encode_record(loaded)["transition"]["why"] == "new"


@pytest.mark.parametrize(("text", "acked"), [("7", 7), ("7\n", 7), ('{"seq": 7, "at": 1}', 7),
                                             ("", 0), ("-3", 0), ('{"seq": "7"}', 0),
                                             ("garbage", 0)])
def test_the_ack_cursor_reads_an_integer_or_an_object(tmp_path: Path, text: str,
                                                      acked: int) -> None:
    assert spool_with(tmp_path, "", ack=text).acked == acked
