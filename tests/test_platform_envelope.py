"""Reading the platform's record (pure): every documented shape (tests/fixtures/platform/, each
with its source in the README there), the variants between them, and every hostile input an
external queue can hold: each is read, or refused with the reason, never raised."""

from __future__ import annotations

import base64
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduled_events_exporter.model import ArmScope
from scheduled_events_exporter.platform_feed.arm import instance_for, scope_of
from scheduled_events_exporter.platform_feed.envelope import (
    MAX_BODY,
    NOT_AN_EVENT,
    NOT_JSON,
    TOO_LARGE,
    UNKNOWN_SCHEMA,
    Accepted,
    Refused,
    read_message,
    read_row,
)

FIXTURES = Path(__file__).parent / "fixtures" / "platform"
SUB = "0b6f1a2c-3d4e-4f50-8a9b-1c2d3e4f5a6b"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def accepted(body: str) -> Accepted:
    read = read_message(body)
    assert isinstance(read, Accepted), read
    return read


def test_every_fixture_is_named_in_the_readme_with_its_source() -> None:
    readme = (FIXTURES / "README.md").read_text()
    for path in FIXTURES.glob("*.json"):
        assert f"`{path.name}`" in readme, path.name


def test_the_learn_sample_a_scale_sets_freeze_started() -> None:
    (change,) = accepted(fixture("learn-sample-vmss-freeze-started.json")).changes
    event = change.event
    assert (event.event_id, event.status, event.event_type) == (
        "6f0a2b3c-4d5e-4f60-8a7b-9c0d1e2f3a4b", "Started", "Freeze")
    assert event.resources == ("webvmss_1", "webvmss_2") and event.duration == 5
    assert event.not_before == datetime(2026, 5, 12, 8, 15, tzinfo=timezone.utc)
    assert change.changed_at == datetime(2026, 5, 12, 8, 15, 2, 123456, tzinfo=timezone.utc)
    assert change.delivery_id == "5b1e7c4a-2f0d-4e8a-9c61-0d3f9a7b2e10"
    assert change.scope.kind == "virtualMachineScaleSets" and change.scope.name == "webvmss"
    instance = instance_for(change)
    assert instance.vm_name == "webvmss_1,webvmss_2" and instance.scale_set_name == "webvmss"
    assert instance.resource_id == (f"/subscriptions/{SUB}/resourceGroups/fleet-rg/providers/"
                                    "Microsoft.Compute/virtualMachineScaleSets/webvmss")
    assert (instance.subscription_id, instance.resource_group, instance.region) == (
        SUB, "fleet-rg", "eastus")


def test_the_capture_prefers_the_platforms_time_of_the_change() -> None:
    (change,) = accepted(fixture("capture-vm-freeze-completed.json")).changes
    assert change.event.status == "Completed" and change.event.not_before is None
    assert change.event.not_before_raw == "" and change.event.duration == -1
    assert change.changed_at == datetime(2026, 5, 12, 9, 1, 13, 267575, tzinfo=timezone.utc)
    assert change.scope.kind == "virtualMachines" and change.scope.name == "db_vm_001"
    assert instance_for(change).vm_name == "db_vm_001"


def test_the_older_batch_form_with_an_idmapping_alias() -> None:
    (change,) = accepted(fixture("streamliner-batch-user-reboot-started.json")).changes
    assert change.event.source == "User" and change.event.status == "Started"
    assert change.scope == ArmScope(vm_id="9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c6b")
    assert change.changed_at == datetime(2026, 5, 12, 10, 2, 27, 586958, tzinfo=timezone.utc)
    assert instance_for(change).vm_id == "9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c6b"


def test_the_field_tables_event_type_on_an_availability_set() -> None:
    (change,) = accepted(
        fixture("field-table-type-availability-set-reboot-scheduled.json")).changes
    assert change.scope.kind == "availabilitySets" and change.event.duration == 0
    assert instance_for(change).vm_name == "legacy_vm_a,legacy_vm_b"


def test_cloudevents_and_an_upper_case_event_id() -> None:
    (change,) = accepted(fixture("cloudevents-vm-reboot-canceled.json")).changes
    assert change.event.status == "Canceled"
    assert change.event.event_id == "9C0D1E2F-3A4B-4C5D-8E6F-7A8B9C0D1E2F"  # kept as sent
    assert change.delivery_id == "8b9c0d1e-2f3a-4b4c-9d5e-6f7a8b9c0d1e"


def test_resource_graph_rows() -> None:
    rows = json.loads(fixture("resource-graph-page.json"))["data"]
    changes = [read_row(row) for row in rows]
    assert [c.event.status for c in changes] == ["Scheduled", "Completed"]  # type: ignore[union-attr]
    assert all(c.changed_at is None and c.delivery_id == "" for c in changes)  # type: ignore[union-attr]
    assert read_row({"type": "microsoft.compute/virtualmachines"}) == Refused(
        UNKNOWN_SCHEMA, "row type 'microsoft.compute/virtualmachines', expected "
        "microsoft.maintenance/scheduledevents")
    assert isinstance(read_row([]), Refused)
    no_id = {**rows[0], "properties": {k: v for k, v in rows[0]["properties"].items()
                                       if k != "EventId"}}
    assert read_row(no_id).event.event_id == rows[0]["name"]  # type: ignore[union-attr]


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.json")
                                        if "resource-graph" not in p.name))
def test_a_base64_body_reads_as_the_plain_one(name: str) -> None:
    plain = fixture(name)
    assert accepted(base64.b64encode(plain.encode()).decode()) == accepted(plain)
    # With a byte-order mark and surrounding blanks, as some writers leave them.
    marked = base64.b64encode(b"\xef\xbb\xbf" + plain.encode()).decode()
    assert accepted(f"  {marked}\n") == accepted(plain)


def test_an_array_of_events_and_either_type_name_in_any_case() -> None:
    event = json.loads(fixture("learn-sample-vmss-freeze-started.json"))
    other = {**event, "id": "second", "eventType": "MICROSOFT.MAINTENANCE/SCHEDULEDEVENTS/WRITE"}
    read = accepted(json.dumps([event, other]))
    assert [c.delivery_id for c in read.changes] == [event["id"], "second"]


def test_the_envelopes_time_when_no_operational_time() -> None:
    event = json.loads(fixture("capture-vm-freeze-completed.json"))
    del event["data"]["operationalInfo"]
    event["eventTime"] = "2026-05-12T09:05:00Z"
    (change,) = accepted(json.dumps(event)).changes
    assert change.changed_at == datetime(2026, 5, 12, 9, 5, tzinfo=timezone.utc)
    event["eventTime"] = "not a time"
    (change,) = accepted(json.dumps(event)).changes
    assert change.changed_at is None  # the tracker then uses the time it was read


def test_not_before_empty_iso_or_unreadable() -> None:
    event = json.loads(fixture("learn-sample-vmss-freeze-started.json"))
    props = event["data"]["resourceInfo"]["properties"]
    for text, parsed, raw in (("", None, ""), ("2026-05-12T08:15:00Z",
                                               datetime(2026, 5, 12, 8, 15, tzinfo=timezone.utc),
                                               ""), ("soon", None, "soon")):
        props["NotBefore"] = text
        (change,) = accepted(json.dumps(event)).changes
        assert (change.event.not_before, change.event.not_before_raw) == (parsed, raw)


def sample() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(fixture("learn-sample-vmss-freeze-started.json"))
    return data


@pytest.mark.parametrize(("body", "kind", "says"), [
    ("", NOT_JSON, "an empty message"),
    ("hello", NOT_JSON, "nor base64 of JSON"),
    (base64.b64encode(b"\xff\xfe not text").decode(), NOT_JSON, "nor base64 of JSON"),
    (base64.b64encode(b"plain words").decode(), NOT_JSON, "base64 of something that is not"),
    ("{not json", NOT_JSON, "neither JSON"),
    ("[" * 50_000, NOT_JSON, "nested too deeply"),
    ("[]", NOT_AN_EVENT, "an empty array"),
    ("42", NOT_AN_EVENT, "expected an event object, got int"),
    ('{"hello": 1}', NOT_AN_EVENT, "neither eventType"),
    (json.dumps({**sample(), "eventType": "Microsoft.Storage.BlobCreated"}), UNKNOWN_SCHEMA,
     "event type 'Microsoft.Storage.BlobCreated'"),
    (json.dumps({"specversion": "0.3", "type": "x"}), UNKNOWN_SCHEMA, "specversion '0.3'"),
    (json.dumps({**sample(), "data": {"other": 1}}), UNKNOWN_SCHEMA, "neither resourceInfo"),
    (json.dumps({**sample(), "data": []}), NOT_AN_EVENT, "data to be an object"),
    (json.dumps({**sample(), "data": {"resourceInfo": {"properties": {"EventStatus": "x"}}}}),
     NOT_AN_EVENT, "missing EventId"),
    (json.dumps({**sample(), "data": {"resources": [{"x": 1}]}}), UNKNOWN_SCHEMA,
     "no armResource"),
    ("x" * (MAX_BODY + 1), TOO_LARGE, "expected at most"),
    (json.dumps([sample()] * 65), TOO_LARGE, "65 events"),
])
def test_what_is_refused_and_why(body: str, kind: str, says: str) -> None:
    read = read_message(body)
    assert isinstance(read, Refused) and read.kind == kind and says in read.reason, read
    assert len(read.reason) <= 500


def test_lone_surrogates_are_replaced_everywhere() -> None:
    event = sample()
    event["data"]["resourceInfo"]["location"] = "\ud800east"
    event["data"]["resourceInfo"]["properties"]["Description"] = "a\udc00b"
    event["id"] = "id\ud83d"
    text = json.dumps(event)  # escaped as \\ud800: what a hostile queue may hold
    (change,) = accepted(text).changes
    for value in (change.region, change.event.description, change.delivery_id):
        value.encode("utf-8")  # never raises
        assert "\ufffd" in value


def test_arm_ids_of_every_form() -> None:
    assert scope_of("") == ArmScope() and scope_of("x" * 2000) == ArmScope()
    assert scope_of("not/an/arm/id") == ArmScope()
    vm = scope_of(f"/subscriptions/{SUB}/resourcegroups/rg/providers/microsoft.compute/"
                  "virtualmachines/vm1/providers/microsoft.maintenance/scheduledevents/e")
    assert (vm.kind, vm.name, vm.resource_group, vm.subscription_id) == (
        "virtualMachines", "vm1", "rg", SUB)
    other = scope_of(f"/subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Compute/"
                     "virtualMachineScaleSets")  # cut short: no name
    assert other.kind == "" and other.subscription_id == SUB


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(max_size=300), st.binary(max_size=300).map(
    lambda b: base64.b64encode(b).decode())))
def test_any_text_is_read_or_refused_never_raised(body: str) -> None:
    assert isinstance(read_message(body), (Accepted, Refused))


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                    | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=20)
PROPERTY_NAMES = ["EventId", "EventStatus", "EventType", "EventSource", "Resources", "NotBefore",
                  "DurationInSeconds", "Description", "ResourceType"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(PROPERTY_NAMES), JSON, max_size=9),
       st.dictionaries(st.sampled_from(["id", "eventTime", "subject", "topic", "dataVersion"]),
                       JSON, max_size=5),
       st.booleans(), st.booleans())
def test_any_shape_under_a_real_envelope_is_read_or_refused(
        properties: dict[str, Any], envelope: dict[str, Any], cloud: bool,
        encoded: bool) -> None:
    """The documented envelope with anything in its fields: each result is either a change
    whose text is valid Unicode and bounded, or a refusal with a reason."""
    event = sample()
    event["data"]["resourceInfo"]["properties"].update(properties)
    event.update(envelope)
    if cloud:
        event = {"specversion": "1.0", "type": event["eventType"], "id": event.get("id"),
                 "time": event.get("eventTime"), "data": event["data"]}
    body = json.dumps(event)
    read = read_message(base64.b64encode(body.encode()).decode() if encoded else body)
    if isinstance(read, Refused):
        assert read.reason and read.kind in (NOT_AN_EVENT, NOT_JSON, TOO_LARGE, UNKNOWN_SCHEMA)
        return
    (change,) = read.changes
    for text in (change.event.event_id, change.event.description, change.delivery_id,
                 change.region, *change.event.resources):
        text.encode("utf-8")
    assert len(change.delivery_id) <= 256 and len(change.event.event_id) <= 256
    instance_for(change).vm_name.encode("utf-8")
