"""The state file's and the spool's JSON form (codec.py), derived from the dataclasses: every
value survives the round trip; every field is read strictly (a mistyped field, or a missing one
that has no default, names itself); and the form evolves (a field a newer release added is
ignored and named, a field an older release did not write takes its default)."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduled_events_exporter.codec import (
    decode,
    decode_record,
    decode_state,
    encode_record,
    encode_state,
)
from scheduled_events_exporter.model import (
    FieldChange,
    InstanceInfo,
    ScheduledEvent,
    Transition,
    TransitionKind,
    UnreadableItem,
)
from scheduled_events_exporter.records import TransitionRecord
from scheduled_events_exporter.tracker import KnownEvent, TrackerState

text = st.text(max_size=12)
moments = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1),
                       timezones=st.just(timezone.utc))
events = st.builds(
    ScheduledEvent, event_id=text, status=text, event_type=text, resource_type=text,
    resources=st.tuples(text) | st.tuples(text, text) | st.just(()),
    not_before=st.none() | moments, not_before_raw=text, description=text, source=text,
    duration=st.integers(-1, 10**6))
json_values = st.none() | text | st.integers(-10**9, 10**9) | st.lists(text, max_size=3)
transitions = st.builds(
    Transition, kind=st.sampled_from(TransitionKind), at=moments,
    incarnation=st.integers(0, 10**6), event=st.none() | events,
    previous_status=st.none() | text, notice=st.none() | st.floats(-1e6, 1e6),
    unannounced=st.none() | st.booleans(), observed_start=st.none() | st.booleans(),
    elapsed=st.none() | st.floats(0, 1e6),
    changes=st.lists(st.builds(FieldChange, name=text, old=json_values, new=json_values),
                     max_size=3).map(tuple),
    observation_gap=st.none() | st.floats(0, 1e6), previous_incarnation=st.none() |
    st.integers(0, 10**6), outcome_basis=st.none() | text,
    approval_status=st.none() | st.integers(100, 599), approval_reason=st.none() | text,
    approval_detail=st.none() | text)
records = st.builds(TransitionRecord, transition=transitions,
                    instance=st.builds(InstanceInfo, vm_name=text, vm_id=text, region=text),
                    record_id=text, affects_self=st.booleans(), exporter_version=text,
                    seq=st.integers(0, 10**9))
states = st.builds(
    TrackerState,
    events=st.lists(st.builds(KnownEvent, event=events, first_seen=moments,
                              status_since=moments, unannounced=st.booleans()), max_size=4)
    .map(lambda known: {k.event.event_id: k for k in known}),
    incarnation=st.none() | st.integers(0, 10**6), last_good=st.none() | moments,
    interrupted=st.booleans(), boot_id=st.none() | text)


@given(records)
def test_every_record_survives_the_round_trip_through_json(record: TransitionRecord) -> None:
    assert decode_record(json.loads(json.dumps(encode_record(record)))) == record


@given(states)
def test_every_state_survives_the_round_trip_in_first_seen_order(state: TrackerState) -> None:
    back = decode_state(json.loads(json.dumps(encode_state(state))))
    assert back == state and list(back.events) == list(state.events)


AT = datetime(2026, 1, 1, tzinfo=timezone.utc)
RECORD = TransitionRecord(
    Transition(TransitionKind.UPDATED, AT, 3, ScheduledEvent("E1", "Scheduled", "Freeze",
                                                             resources=("vm",)),
               elapsed=2.0, changes=(FieldChange("NotBefore", "a", "b"),)),
    InstanceInfo(vm_name="vm"), "rid", True, "0.1.0", 7)


def broken(path: list[Any], value: Any = dataclasses.MISSING) -> dict[str, Any]:
    """The encoded RECORD with the field at ``path`` set to ``value`` (or removed)."""
    data = copy.deepcopy(encode_record(RECORD))
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    if value is dataclasses.MISSING:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return data


@pytest.mark.parametrize(("path", "value", "says"), [
    (["record_id"], dataclasses.MISSING, "record: expected the fields .* missing "
     "['record_id'] (which have no default)"),
    (["transition", "event", "event_id"], dataclasses.MISSING, "record.transition.event: "
     "expected the fields"),
    (["seq"], True, "record.seq: expected int, got bool"),
    (["seq"], "7", "record.seq: expected int, got str"),
    (["affects_self"], 1, "record.affects_self: expected bool"),
    (["record_id"], None, "record.record_id: expected str"),
    (["transition", "kind"], "finished", "record.transition.kind: expected one of"),
    (["transition", "at"], "2026-01-01T00:00:00", "record.transition.at: expected a time "
     "with a UTC offset"),
    (["transition", "elapsed"], "2", "record.transition.elapsed: expected a number, got str"),
    (["transition", "incarnation"], 3.5, "record.transition.incarnation: expected int"),
    (["transition", "event", "resources"], "vm", "record.transition.event.resources: "
     "expected list"),
    (["transition", "event", "resources"], [1], "record.transition.event.resources[0]: "
     "expected str"),
    (["transition", "event", "duration"], None, "record.transition.event.duration"),
    (["transition", "changes"], [{"name": "x", "old": {}, "new": 1}],
     "record.transition.changes[0].old"),
    (["instance", "vm_name"], 5, "record.instance.vm_name: expected str"),
], ids=lambda v: ".".join(map(str, v)) if isinstance(v, list) and all(
    isinstance(x, str) for x in v) else None)
def test_every_field_is_read_strictly(path: list[str], value: Any, says: str) -> None:
    pattern = says.replace("|", r"\|").replace("[", r"\[").replace("(which", r"\(which")
    with pytest.raises(ValueError, match=pattern.replace("default)", r"default\)")):
        decode_record(broken(path, value))


def test_a_field_a_newer_release_added_is_ignored_and_named() -> None:
    data = encode_record(RECORD)
    data["transition"]["surprise"] = {"any": ["shape"]}
    data["instance"]["host_kind"] = 1
    ignored: set[str] = set()
    assert decode_record(data, ignored) == RECORD
    assert ignored == {"Transition.surprise", "InstanceInfo.host_kind"}


def test_a_field_an_older_release_did_not_write_takes_its_default() -> None:
    data = encode_record(RECORD)
    for name in ("elapsed", "changes", "approval_detail"):
        del data["transition"][name]
    del data["exporter_version"]
    back = decode_record(data)
    assert back.transition.elapsed is None and back.transition.changes == ()
    assert back.exporter_version == dataclasses.fields(TransitionRecord)[4].default
    assert back.transition.event == RECORD.transition.event


def test_an_unknown_field_still_has_its_known_neighbours_read_strictly() -> None:
    data = encode_record(RECORD)
    data["transition"]["surprise"] = 1
    data["transition"]["incarnation"] = "3"
    with pytest.raises(ValueError, match=r"record.transition.incarnation: expected int"):
        decode_record(data)


def test_a_mapping_keeps_its_order_and_keeps_what_is_not_a_pair_unread() -> None:
    known = {i: KnownEvent(ScheduledEvent(i, "Scheduled"), AT, AT + timedelta(seconds=1))
             for i in ("B", "A", "C")}
    encoded = encode_state(TrackerState(events=known, incarnation=4))
    assert [pair[0] for pair in encoded["events"]] == ["B", "A", "C"]
    encoded["events"][1] = ["A"]
    back = decode(TrackerState, encoded, "state")
    assert list(back.events) == ["B", "C"]
    assert back.unreadable_events == (
        UnreadableItem(["A"], "events[1]: expected a [key, value] pair", None),)


def test_a_tracker_entry_of_another_type_is_kept_as_it_was_and_written_back_after() -> None:
    """The tracker reads its entries one by one (model.ITEMS_OF): one this release cannot read
    is left out, with its key and the reason, and written back unchanged after the others."""
    known = {i: KnownEvent(ScheduledEvent(i, "Scheduled"), AT, AT) for i in ("B", "A", "C")}
    encoded = encode_state(TrackerState(events=known, incarnation=4))
    bad = copy.deepcopy(encoded["events"][1])
    bad[1]["event"]["duration"] = "30"
    bad[1]["later"] = {"kept": True}  # a newer release's field inside it: kept too
    encoded["events"][1] = bad
    ignored: set[str] = set()
    back = decode_state(json.loads(json.dumps(encoded)), ignored)
    assert list(back.events) == ["B", "C"] and back.incarnation == 4
    assert back.unreadable_events == (
        UnreadableItem(bad, "events[1].event.duration: expected int, got str", "A"),)
    again = encode_state(back)
    assert again["events"] == [encoded["events"][0], encoded["events"][2], bad]
    # Read again (now the last entry), it is the same entry: nothing is lost however often
    # it is written back.
    [item] = decode_state(json.loads(json.dumps(again))).unreadable_events
    assert (item.raw, item.key) == (bad, "A") and item.reason.startswith("events[2].event.")


@pytest.mark.parametrize("raw", [["A", {"event": 1}], [7, {}], "A", None, ["A", {}, 3]])
def test_every_shape_of_an_unreadable_entry_is_kept(raw: Any) -> None:
    encoded = encode_state(TrackerState(incarnation=1))
    encoded["events"] = [raw]
    back = decode_state(json.loads(json.dumps(encoded)))
    assert back.events == {} and [u.raw for u in back.unreadable_events] == [raw]
    assert back.unreadable_events[0].key == ("A" if raw == ["A", {"event": 1}] else None)
    assert encode_state(back)["events"] == [raw]


def test_a_tracker_whose_events_are_not_a_list_is_refused() -> None:
    encoded = encode_state(TrackerState(incarnation=1))
    encoded["events"] = {"A": 1}
    with pytest.raises(ValueError, match=r"state.events: expected list, got dict"):
        decode_state(encoded)


@dataclasses.dataclass(frozen=True)
class _Strict:
    table: Mapping[str, int] = dataclasses.field(default_factory=dict)


def test_a_mapping_without_a_field_for_its_unreadable_items_refuses_what_is_not_pairs() -> None:
    with pytest.raises(ValueError, match=r"strict.table\[1\]: expected a \[key, value\] pair"):
        decode(_Strict, {"table": [["a", 1], ["b"]]}, "strict")
    assert decode(_Strict, {"table": [["a", 1]]}) == _Strict({"a": 1})
