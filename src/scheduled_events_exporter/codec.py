"""Domain values ↔ JSON-ready objects, for the state file and the spool.

Decoding is strict: a value that does not have the expected shape raises ``ValueError`` naming
the field, so a damaged file is detected (and set aside) instead of half-loaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from scheduled_events_exporter.model import (
    FieldChange,
    InstanceInfo,
    ScheduledEvent,
    Transition,
    TransitionKind,
)
from scheduled_events_exporter.records import TransitionRecord
from scheduled_events_exporter.tracker import KnownEvent, TrackerState

Json = dict[str, Any]


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _parse_time(value: object, name: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{name}: expected an ISO time string, got {type(value).__name__}")
    moment = datetime.fromisoformat(value)
    if moment.tzinfo is None:
        raise ValueError(f"{name}: expected a time with a UTC offset, got {value!r}")
    return moment


def _req_time(value: object, name: str) -> datetime:
    moment = _parse_time(value, name)
    if moment is None:
        raise ValueError(f"{name}: missing")
    return moment


def _get(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = data.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise ValueError(f"{where}.{key}: expected {kind}, got {type(value).__name__}")
    return value


def encode_event(event: ScheduledEvent) -> Json:
    """A :class:`ScheduledEvent` as a JSON object."""
    return {
        "id": event.event_id,
        "status": event.status,
        "type": event.event_type,
        "resource_type": event.resource_type,
        "resources": list(event.resources),
        "not_before": _time(event.not_before),
        "not_before_raw": event.not_before_raw,
        "description": event.description,
        "source": event.source,
        "duration": event.duration,
    }


def decode_event(data: Mapping[str, Any]) -> ScheduledEvent:
    """Inverse of :func:`encode_event`."""
    resources = _get(data, "resources", list, "event")
    if not all(isinstance(r, str) for r in resources):
        raise ValueError("event.resources: expected strings")
    return ScheduledEvent(
        event_id=_get(data, "id", str, "event"),
        status=_get(data, "status", str, "event"),
        event_type=_get(data, "type", str, "event"),
        resource_type=_get(data, "resource_type", str, "event"),
        resources=tuple(resources),
        not_before=_parse_time(data.get("not_before"), "event.not_before"),
        not_before_raw=_get(data, "not_before_raw", str, "event"),
        description=_get(data, "description", str, "event"),
        source=_get(data, "source", str, "event"),
        duration=_get(data, "duration", int, "event"),
    )


def encode_state(state: TrackerState) -> Json:
    """A :class:`TrackerState` as a JSON object (events in first-seen order)."""
    return {
        "incarnation": state.incarnation,
        "last_good": _time(state.last_good),
        "boot_id": state.boot_id,
        "events": [
            {
                "event": encode_event(k.event),
                "first_seen": _time(k.first_seen),
                "status_since": _time(k.status_since),
                **({"unannounced": True} if k.unannounced else {}),
            }
            for k in state.events.values()
        ],
    }


def decode_state(data: Mapping[str, Any]) -> TrackerState:
    """Inverse of :func:`encode_state`."""
    incarnation = data.get("incarnation")
    if incarnation is not None and (
        not isinstance(incarnation, int) or isinstance(incarnation, bool)
    ):
        raise ValueError("state.incarnation: expected an integer")
    events: dict[str, KnownEvent] = {}
    for item in _get(data, "events", list, "state"):
        if not isinstance(item, dict):
            raise ValueError("state.events: expected objects")
        event = decode_event(_get(item, "event", dict, "state.events[]"))
        events[event.event_id] = KnownEvent(
            event,
            first_seen=_req_time(item.get("first_seen"), "first_seen"),
            status_since=_req_time(item.get("status_since"), "status_since"),
            unannounced=item.get("unannounced") is True,
        )
    return TrackerState(
        events=events,
        incarnation=incarnation,
        last_good=_parse_time(data.get("last_good"), "state.last_good"),
        boot_id=_optional_str(data.get("boot_id"), "state.boot_id"),
    )


def _optional_str(value: object, name: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise ValueError(f"{name}: expected a string or null, got {type(value).__name__}")


def encode_record(record: TransitionRecord) -> Json:
    """A :class:`TransitionRecord` as a JSON object (lossless)."""
    t = record.transition
    return {
        "kind": t.kind.value,
        "at": _time(t.at),
        "incarnation": t.incarnation,
        "event": encode_event(t.event) if t.event else None,
        "previous_status": t.previous_status,
        "notice": t.notice,
        "unannounced": t.unannounced,
        "observed_start": t.observed_start,
        "elapsed": t.elapsed,
        "changes": [[c.name, c.old, c.new] for c in t.changes],
        "observation_gap": t.observation_gap,
        "previous_incarnation": t.previous_incarnation,
        "outcome_basis": t.outcome_basis,
        "approval_status": t.approval_status,
        "approval_reason": t.approval_reason,
        "approval_detail": t.approval_detail,
        "instance": {
            "vm_name": record.instance.vm_name,
            "vm_id": record.instance.vm_id,
            "resource_id": record.instance.resource_id,
            "subscription_id": record.instance.subscription_id,
            "resource_group": record.instance.resource_group,
            "region": record.instance.region,
            "zone": record.instance.zone,
            "scale_set_name": record.instance.scale_set_name,
            "vm_size": record.instance.vm_size,
        },
        "record_id": record.record_id,
        "affects_self": record.affects_self,
        "exporter_version": record.exporter_version,
        "seq": record.seq,
    }


def decode_record(data: Mapping[str, Any]) -> TransitionRecord:
    """Inverse of :func:`encode_record`."""
    event_data = data.get("event")
    instance = _get(data, "instance", dict, "record")
    changes = tuple(FieldChange(str(n), o, v) for n, o, v in _get(data, "changes", list, "record"))
    transition = Transition(
        kind=TransitionKind(_get(data, "kind", str, "record")),
        at=_req_time(data.get("at"), "record.at"),
        incarnation=_get(data, "incarnation", int, "record"),
        event=decode_event(event_data) if isinstance(event_data, dict) else None,
        previous_status=data.get("previous_status"),
        notice=data.get("notice"),
        unannounced=data.get("unannounced"),
        observed_start=data.get("observed_start"),
        elapsed=data.get("elapsed"),
        changes=changes,
        observation_gap=data.get("observation_gap"),
        previous_incarnation=data.get("previous_incarnation"),
        outcome_basis=data.get("outcome_basis"),
        approval_status=data.get("approval_status"),
        approval_reason=data.get("approval_reason"),
        approval_detail=data.get("approval_detail"),
    )
    return TransitionRecord(
        transition=transition,
        instance=InstanceInfo(
            **{k: str(v) for k, v in instance.items() if k in InstanceInfo.__dataclass_fields__}
        ),
        record_id=_get(data, "record_id", str, "record"),
        affects_self=bool(data.get("affects_self")),
        exporter_version=str(data.get("exporter_version", "")),
        seq=int(data.get("seq") or 0),
    )
