"""Transition → record (pure): the docs/semantics.md#sinks columns, the docs/semantics.md#records
attributes, stable ids, bodies."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from scheduled_events_exporter.model import (
    FieldChange,
    InstanceInfo,
    ScheduledEvent,
    Transition,
    TransitionKind,
)
from scheduled_events_exporter.records import (
    COLUMNS,
    body,
    make_record,
    rfc3339,
    to_attributes,
    to_columns,
)

AT = datetime(2022, 4, 11, 22, 11, 58, 123456, tzinfo=timezone.utc)
NOT_BEFORE = datetime(2022, 4, 11, 22, 26, 58, tzinfo=timezone.utc)
VM = InstanceInfo(vm_name="WestNO_0", vm_id="b1a3f3c0-0000-4000-8000-000000000001",
                  region="norwayeast")
FREEZE = ScheduledEvent("602d9444-d2cd-49c7-8624-8643e7171297", "Scheduled", "Freeze",
                        "VirtualMachine", ("WestNO_0", "WestNO_1"), NOT_BEFORE,
                        source="Platform", duration=5)

# Log Analytics column type → the Python types a JSON value of that column may have.
PY_TYPES: dict[str, tuple[type, ...]] = {
    "datetime": (str,), "string": (str,), "dynamic": (list, dict), "boolean": (bool,),
    "int": (int,), "real": (float, int),
}


def scheduled(**kw: object) -> Transition:
    return Transition(TransitionKind.SCHEDULED, AT, 2, FREEZE, notice=900.0, **kw)  # type: ignore[arg-type]


def test_columns_are_exactly_the_table_columns_in_order_with_their_types() -> None:
    columns = to_columns(make_record(scheduled(), VM, seq=7))
    assert list(columns) == [name for name, _ in COLUMNS]
    for name, kind in COLUMNS:
        value = columns[name]
        assert value is None or isinstance(value, PY_TYPES[kind]), (name, kind, value)
        assert not (kind == "int" and isinstance(value, bool)), name
    assert columns["TimeGenerated"] == "2022-04-11T22:11:58.123Z"
    assert columns["NotBefore"] == "2022-04-11T22:26:58.000Z"
    assert columns["AffectsSelf"] is True
    assert columns["Resources"] == ["WestNO_0", "WestNO_1"]
    assert json.loads(json.dumps(columns)) == columns


def test_attributes_follow_spec_4_and_leave_out_what_does_not_apply() -> None:
    attrs = to_attributes(make_record(scheduled(), VM))
    p = "azure.scheduled_event."
    assert attrs[p + "id"] == FREEZE.event_id
    assert attrs[p + "transition"] == "scheduled"
    assert attrs[p + "not_before"] == "2022-04-11T22:26:58.000Z"
    assert attrs[p + "notice"] == 900.0
    assert attrs[p + "duration"] == 5
    for absent in ("previous_status", "unannounced", "observed_start", "observation_gap",
                   "changes", "not_before_raw"):
        assert p + absent not in attrs
    assert isinstance(attrs["log.record.uid"], str)


def test_changes_are_a_json_object_of_old_and_new_values() -> None:
    later = NOT_BEFORE + timedelta(minutes=10)
    change = FieldChange("NotBefore", "Mon, 11 Apr 2022 22:26:58 GMT",
                         "Mon, 11 Apr 2022 22:36:58 GMT")
    t = Transition(TransitionKind.UPDATED, AT, 3,
                   ScheduledEvent(FREEZE.event_id, "Scheduled", "Freeze", not_before=later),
                   previous_status="Scheduled", changes=(change,))
    record = make_record(t, VM)
    assert to_columns(record)["Changes"] == {"NotBefore": [change.old, change.new]}
    assert json.loads(str(to_attributes(record)["azure.scheduled_event.changes"])) == {
        "NotBefore": [change.old, change.new]}


def test_body_is_the_spec_example() -> None:
    assert body(make_record(scheduled(), VM)) == (
        "Freeze scheduled for WestNO_0, WestNO_1 not before 2022-04-11T22:26:58Z (5 s impact)")


def test_document_reset_has_no_event_columns() -> None:
    t = Transition(TransitionKind.DOCUMENT_RESET, AT, 1, previous_incarnation=9)
    columns = to_columns(make_record(t, VM))
    assert columns["EventId"] is None and columns["Transition"] == "document_reset"
    assert body(make_record(t, VM)) == "Scheduled events document reset: incarnation 9 -> 1"


@given(st.datetimes(min_value=datetime(2, 1, 1), max_value=datetime(9998, 12, 31),
                    timezones=st.sampled_from([timezone.utc, timezone(timedelta(hours=-7)),
                                               timezone(timedelta(hours=5, minutes=30))])))
def test_rfc3339_is_utc_with_milliseconds(moment: datetime) -> None:
    text = rfc3339(moment)
    assert len(text) == 24 and text.endswith("Z")
    parsed = datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
    assert abs(parsed - moment) < timedelta(milliseconds=1)


@given(st.sampled_from(list(TransitionKind)), st.integers(0, 10**6), st.text(max_size=20))
def test_record_id_is_stable_and_names_the_vm(kind: TransitionKind, incarnation: int,
                                              vm: str) -> None:
    t = Transition(kind, AT, incarnation, FREEZE)
    one = make_record(t, InstanceInfo(vm_name=vm, vm_id=vm))
    again = make_record(Transition(kind, AT + timedelta(hours=1), incarnation, FREEZE),
                        InstanceInfo(vm_name=vm, vm_id=vm))
    other_vm = make_record(t, InstanceInfo(vm_name=vm + "x", vm_id=vm + "x"))
    # Same transition seen again (a replay after a crash): same id, whatever the clock says.
    assert one.record_id == again.record_id
    assert one.record_id != other_vm.record_id


def test_values_imds_may_add_reach_the_record_unchanged_and_ends_name_their_basis() -> None:
    """A new EventType and an advisory status go from the document's bytes through the tracker
    to the columns and attributes verbatim; the end of that event says on what evidence."""
    from scheduled_events_exporter.parser import parse_document
    from scheduled_events_exporter.tracker import TrackerState, track

    def doc(incarnation: int, events: list[dict[str, object]]) -> bytes:
        return json.dumps({"DocumentIncarnation": incarnation, "Events": events}).encode()

    spot = {"EventId": "E-1", "EventType": "SpotRebalanceRecommendation",
            "EventStatus": "Advisory", "ResourceType": "VirtualMachine",
            "Resources": ["WestNO_0"], "NotBefore": "", "EventSource": "Platform",
            "DurationInSeconds": -1, "Description": "capacity is tight", "Extra": {"x": 1}}
    state, first = track(TrackerState(), parse_document(doc(5, [spot])), AT, gap_threshold=3)
    _, gone = track(state, parse_document(doc(6, [])), AT + timedelta(seconds=1),
                    gap_threshold=3)
    (appeared,) = first
    columns = to_columns(make_record(appeared, VM))
    attrs = to_attributes(make_record(appeared, VM))
    assert (columns["Transition"], columns["EventType"], columns["EventStatus"]) == (
        "scheduled", "SpotRebalanceRecommendation", "Advisory")
    p = "azure.scheduled_event."
    assert (attrs[p + "type"], attrs[p + "status"]) == ("SpotRebalanceRecommendation", "Advisory")
    (end,) = gone
    end_columns = to_columns(make_record(end, VM))
    end_attrs = to_attributes(make_record(end, VM))
    # No NotBefore: neither "before" nor "after" it can be shown, so no verdict is claimed.
    assert (end_columns["Transition"], end_columns["OutcomeBasis"]) == (
        "outcome_unknown", "no_not_before")
    assert end_attrs[p + "outcome_basis"] == "no_not_before"
    assert end_columns["EventType"] == "SpotRebalanceRecommendation"
    assert end_columns["PreviousStatus"] == "Advisory"


def test_a_user_initiated_start_says_why_it_was_never_scheduled() -> None:
    from dataclasses import replace

    from scheduled_events_exporter.telemetry import severity

    reboot = replace(FREEZE, status="Started", event_type="Reboot", source="User",
                     not_before=None, duration=-1)
    record = make_record(Transition(TransitionKind.STARTED, AT, 3, reboot, unannounced=False,
                                    outcome_basis="user_initiated"), VM)
    assert body(record) == ("Reboot started for WestNO_0, WestNO_1 (impact duration unknown; "
                            "user-initiated and approved automatically, so never Scheduled)")
    columns = to_columns(record)
    assert columns["Unannounced"] is False and columns["OutcomeBasis"] == "user_initiated"
    assert severity(record)[1] == "WARN"  # an ordinary start, not the unannounced ERROR
