"""The state file and the spool as other releases write them (docs/semantics.md,
"Compatibility"), on real files: a newer schema refuses to start without touching the file, a
pre-release schema and a file that is not JSON are moved away, damage inside a readable file
costs only the damaged part (a tracker entry is kept unread and written back, the outbox always
loads), unknown fields are named and ignored; a spool line
this release cannot read is handed over to be dead-lettered and leaves the log only once it was
taken, a torn last line is skipped, and the ack cursor reads either form."""

from __future__ import annotations

import json
import logging
import tempfile
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduled_events_exporter.codec import encode_record
from scheduled_events_exporter.delivery.spool import Spool, UnreadableLine
from scheduled_events_exporter.model import (
    Document,
    InstanceInfo,
    ScheduledEvent,
    Transition,
    TransitionKind,
)
from scheduled_events_exporter.records import TransitionRecord
from scheduled_events_exporter.state import (
    SCHEMA_VERSION,
    NewerStateFile,
    PersistedState,
    StateCommitter,
    StateStore,
)
from scheduled_events_exporter.tracker import KnownEvent, TrackerState, track

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


def test_a_tracker_entry_missing_a_field_without_default_is_left_out_not_the_state(
        tmp_path: Path) -> None:
    store = saved(tmp_path)
    data = json.loads(store.path.read_text())
    del data["tracker"]["events"][0][1]["first_seen"]
    store.path.write_text(json.dumps(data))
    loaded = store.load()
    assert loaded is not None and not list(tmp_path.glob("state.json.corrupt-*"))
    assert loaded.tracker.events == {} and loaded.outbox == (record(9),)
    [kept] = loaded.tracker.unreadable_events
    assert kept.key == "E1" and "missing ['first_seen']" in kept.reason


# A tracker entry this release cannot read: left out of tracking, said once,
# written back as it was; the rest of the state loads (docs/semantics.md, "Compatibility").

def known(event_id: str, duration: int = -1) -> KnownEvent:
    return KnownEvent(ScheduledEvent(event_id, "Scheduled", "Reboot", duration=duration),
                      AT, AT)


def three_events(tmp_path: Path) -> StateStore:
    store = StateStore(tmp_path)
    store.save(PersistedState(
        TrackerState(events={e: known(e) for e in ("E1", "E2", "E3")}, incarnation=3,
                     last_good=AT), seq=11, outbox=(record(10), record(11)), approvals=("E3",)))
    return store


def damage(store: StateStore, index: int, *path: str | int, value: object) -> list[object]:
    """Set a field of tracker entry ``index`` (path inside its [key, value] pair); returns
    the damaged pair as written."""
    data = json.loads(store.path.read_text())
    parent = data["tracker"]["events"][index]
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    store.path.write_text(json.dumps(data))
    return list(data["tracker"]["events"][index])


def said(caplog: pytest.LogCaptureFixture, what: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if what in r.getMessage()]


def test_a_tracker_entry_of_another_type_is_left_out_said_once_and_written_back(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The issue's case: one entry's duration written as a string."""
    store = three_events(tmp_path)
    bad = damage(store, 1, 1, "event", "duration", value="30")
    with caplog.at_level(logging.INFO):
        loaded = store.load()
        assert loaded is not None, "the state was moved away"
        assert not list(tmp_path.glob("state.json.corrupt-*"))
        assert list(loaded.tracker.events) == ["E1", "E3"]
        assert loaded.tracker.events["E1"] == known("E1")
        assert (loaded.seq, loaded.approvals, loaded.tracker.incarnation) == (11, ("E3",), 3)
        assert loaded.outbox == (record(10), record(11)) and loaded.unreadable == ()
        [item] = loaded.tracker.unreadable_events
        assert (item.key, item.raw) == ("E2", bad)
        # Saved again and again (as the committer does at every change), the entry is in the
        # file as it was, after the tracked ones, and said only at the load.
        for _ in range(3):
            store.save(loaded)
            events = json.loads(store.path.read_text())["tracker"]["events"]
            assert [pair[0] for pair in events] == ["E1", "E3", "E2"] and events[2] == bad
    [line] = said(caplog, "cannot be read")
    assert "'E2'" in line and "events[1].event.duration: expected int, got str" in line
    assert [r.levelname for r in caplog.records if "cannot be read" in r.getMessage()] == [
        "ERROR"]
    # The next start reads the same, and says it again (once per start).
    caplog.clear()
    again = store.load()
    assert again is not None and list(again.tracker.events) == ["E1", "E3"]
    assert [u.raw for u in again.tracker.unreadable_events] == [bad]
    assert len(said(caplog, "cannot be read")) == 1


def doc(*event_ids: str, incarnation: int) -> Document:
    return Document(incarnation, tuple(ScheduledEvent(e, "Scheduled", "Reboot")
                                       for e in event_ids))


def test_the_kept_entry_rides_along_every_commit_until_imds_lists_its_event_again(
        tmp_path: Path) -> None:
    """Through the tracker and the committer as the poll loop runs them: the kept entry is
    written back at every commit while its EventId is not in the document; once it is, the
    event is tracked afresh (reported as new: this release could not read what it knew) and
    the entry read from the document wins; the kept one is gone from the file for good."""
    store = three_events(tmp_path)
    bad = damage(store, 1, 1, "first_seen", value="yesterday")
    loaded = store.load()
    assert loaded is not None
    committer = StateCommitter(store, lambda *_: None)
    state, seq = replace(loaded.tracker, interrupted=True), loaded.seq
    later = AT + timedelta(minutes=1)
    state, transitions = track(state, doc("E1", "E3", incarnation=4), later, gap_threshold=60)
    assert transitions == ()  # the others are known: nothing reported again
    committer.commit(state, (), seq, changed=True)
    events = json.loads(store.path.read_text())["tracker"]["events"]
    assert [pair[0] for pair in events] == ["E1", "E3", "E2"] and events[2] == bad
    state, transitions = track(state, doc("E1", "E2", "E3", incarnation=5),
                               later + timedelta(seconds=1), gap_threshold=60)
    assert [(t.kind, t.event.event_id if t.event else None) for t in transitions] == [
        (TransitionKind.SCHEDULED, "E2")]
    assert state.unreadable_events == ()
    committer.commit(state, (), seq, changed=True)
    pairs = json.loads(store.path.read_text())["tracker"]["events"]
    events = dict(pairs)
    assert sorted(p[0] for p in pairs) == ["E1", "E2", "E3"]
    assert events["E2"]["event"]["duration"] == -1
    assert events["E2"]["first_seen"] != "yesterday"
    # The event ends: its fresh entry goes, and the damaged one does not come back.
    state, transitions = track(state, doc("E1", "E3", incarnation=6),
                               later + timedelta(seconds=2), gap_threshold=60)
    assert [t.event.event_id for t in transitions if t.event] == ["E2"]
    committer.commit(state, (), seq, changed=True)
    reloaded = store.load()
    assert reloaded is not None and list(reloaded.tracker.events) == ["E1", "E3"]
    assert reloaded.tracker.unreadable_events == ()


def test_a_damaged_entry_beside_a_readable_one_for_the_same_event_id_is_not_kept(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = three_events(tmp_path)
    data = json.loads(store.path.read_text())
    twin = json.loads(json.dumps(data["tracker"]["events"][0]))
    twin[1]["unannounced"] = "no"
    data["tracker"]["events"].append(twin)
    store.path.write_text(json.dumps(data))
    loaded = store.load()
    assert loaded is not None and list(loaded.tracker.events) == ["E1", "E2", "E3"]
    assert loaded.tracker.unreadable_events == ()
    [line] = said(caplog, "cannot be read")
    assert "'E1'" in line and "only that one is kept" in line


def test_a_tracker_that_cannot_be_read_at_all_keeps_the_outbox_and_a_copy(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Not an entry but the tracker itself (a field of another type): this start knows no
    events, but what was committed is not lost: the outbox, seq and approvals load, and the
    file stays in place (a crash before the next save still finds the outbox), a copy kept."""
    store = three_events(tmp_path)
    data = json.loads(store.path.read_text())
    data["tracker"]["incarnation"] = "3"
    store.path.write_text(json.dumps(data))
    before = store.path.read_bytes()
    loaded = store.load()
    assert loaded is not None
    assert loaded.tracker == TrackerState() and loaded.outbox == (record(10), record(11))
    assert (loaded.seq, loaded.approvals) == (11, ("E3",))
    assert store.path.read_bytes() == before
    [copy] = tmp_path.glob("state.json.corrupt-*")
    assert copy.read_bytes() == before
    [line] = said(caplog, "its tracker cannot be read")
    assert "state.incarnation: expected int, got str" in line and copy.name in line


@pytest.mark.parametrize("tracker", ["missing", [], {"events": {"E1": {}}}])
def test_a_tracker_of_another_shape_still_leaves_the_outbox(tmp_path: Path,
                                                            tracker: object) -> None:
    store = three_events(tmp_path)
    data = json.loads(store.path.read_text())
    if tracker == "missing":
        del data["tracker"]
    else:
        data["tracker"] = tracker
    store.path.write_text(json.dumps(data))
    loaded = store.load()
    assert loaded is not None and loaded.outbox == (record(10), record(11))
    assert loaded.tracker == TrackerState()


@pytest.mark.parametrize("seq", ["11", -1, None, True, 1.5])
def test_an_unreadable_seq_is_taken_from_the_outbox(tmp_path: Path, seq: object,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    store = three_events(tmp_path)
    data = json.loads(store.path.read_text())
    data["seq"] = seq
    store.path.write_text(json.dumps(data))
    loaded = store.load()
    assert loaded is not None and not list(tmp_path.glob("state.json.corrupt-*"))
    assert loaded.seq == 11 and list(loaded.tracker.events) == ["E1", "E2", "E3"]
    assert said(caplog, "is not a sequence number")


def test_an_approval_that_is_not_an_event_id_is_left_out(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = three_events(tmp_path)
    data = json.loads(store.path.read_text())
    data["approvals"] = ["E3", 7, None, "E1"]
    store.path.write_text(json.dumps(data))
    loaded = store.load()
    assert loaded is not None and loaded.approvals == ("E3", "E1")
    assert list(loaded.tracker.events) == ["E1", "E2", "E3"]
    [line] = said(caplog, "approvals that are not EventIds")
    assert "approvals[1]: int, approvals[2]: NoneType" in line
    data["approvals"] = {"E3": True}
    store.path.write_text(json.dumps(data))
    loaded = store.load()
    assert loaded is not None and loaded.approvals == () and loaded.outbox
    assert not list(tmp_path.glob("state.json.corrupt-*"))


def test_an_outbox_that_is_not_a_list_is_one_entry_to_dead_letter(tmp_path: Path) -> None:
    store = three_events(tmp_path)
    data = json.loads(store.path.read_text())
    data["outbox"] = {"10": data["outbox"][0]}
    store.path.write_text(json.dumps(data))
    loaded = store.load()
    assert loaded is not None and loaded.outbox == () and loaded.seq == 11
    [entry] = loaded.unreadable
    assert entry.seq is None and entry.content == {"seq": None, "record": data["outbox"]}
    assert "outbox: expected a list of records, got dict" in entry.reason
    assert list(loaded.tracker.events) == ["E1", "E2", "E3"]


JSON = st.recursive(st.none() | st.booleans() | st.integers(-5, 10**12) | st.floats(
    allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=3), max_leaves=6)


def paths(value: object, prefix: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    """Every place inside ``value`` (each object field, each list item, nested)."""
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += paths(item, (*prefix, index))
    return found


#: Memory-backed where there is one: each example saves the state (fsyncs) three times.
SHM = "/dev/shm" if Path("/dev/shm").is_dir() else None


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(count=st.integers(1, 5), outbox=st.integers(0, 3), approvals=st.lists(st.text(max_size=6),
       max_size=3), data=st.data())
def test_a_single_damaged_field_in_one_entry_never_costs_the_rest(
        count: int, outbox: int, approvals: list[str], data: st.DataObject) -> None:
    """Any one field of any one tracker entry replaced by any JSON value (or removed): the file
    is never moved or copied away, every other entry, the outbox, seq and approvals load as
    saved, and the damaged entry is either read or kept, and then written back as it was."""
    ids = [f"EVT-{i}-7f3a" for i in range(count)]
    tracker = TrackerState(
        events={e: KnownEvent(ScheduledEvent(e, "Scheduled", "Freeze", "VirtualMachine",
                                             ("vm",), AT, "", "x", "Platform", 5), AT, AT, True)
                for e in ids}, incarnation=7, last_good=AT, boot_id="b")
    committed = tuple(record(20 + i) for i in range(outbox))
    index = data.draw(st.integers(0, count - 1), label="entry")
    with tempfile.TemporaryDirectory(dir=SHM) as tmp:
        root = Path(tmp)
        store = StateStore(root)
        store.save(PersistedState(tracker, seq=30, outbox=committed,
                                  approvals=tuple(approvals)))
        text = json.loads(store.path.read_text())
        pair = text["tracker"]["events"][index]
        where = data.draw(st.sampled_from(paths(pair)), label="field")
        parent = pair
        for key in where[:-1]:
            parent = parent[key]
        if data.draw(st.booleans(), label="remove") and isinstance(parent, dict):
            del parent[where[-1]]
        else:
            parent[where[-1]] = data.draw(JSON, label="value")
        store.path.write_text(json.dumps(text))
        damaged = json.loads(json.dumps(pair))

        loaded = store.load()
        assert loaded is not None
        assert sorted(p.name for p in root.iterdir() if p.name.startswith("state.json")) == [
            "state.json"]
        assert loaded.outbox == committed and loaded.seq == 30
        assert loaded.approvals == tuple(approvals)
        others = [e for i, e in enumerate(ids) if i != index]
        assert all(loaded.tracker.events.get(e) == tracker.events[e] for e in others)
        assert loaded.tracker.incarnation == 7
        kept = [u.raw for u in loaded.tracker.unreadable_events]
        assert kept in ([], [damaged])
        assert kept or len(loaded.tracker.events) == count  # read, then (under its key)
        store.save(loaded)
        written = json.loads(store.path.read_text())["tracker"]["events"]
        assert not kept or written[-1] == damaged
        again = store.load()
        assert again is not None and again.tracker == loaded.tracker


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
