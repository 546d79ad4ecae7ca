"""A queue message's body, or a Resource Graph row → the platform's changes it carries, or the
reason it is refused (pure; tests/fixtures/platform/README.md names the source of every form).

What the platform sends, as the documentation and captured payloads show it (they disagree, so
every form is accepted):

* the body is the event as JSON, or that JSON in base64 (as Azure Functions' queue bindings
  expect it); one event, or an array of them (Event Grid's batch form);
* the Event Grid schema (``eventType``, ``eventTime``, ``id``, ``subject``, ``data``) or
  CloudEvents 1.0 (``specversion``, ``type``, ``time``, ``id``, ``source``, ``data``);
* the event type ``Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted``
  (the sample) or ``microsoft.maintenance/scheduledevents/write`` (the field table; an older
  sample writes ``Write``), in any letter case;
* the event in ``data.resourceInfo`` (``id``, ``name``, ``location``, ``properties``: the IMDS
  event's own fields), or in ``data.resources[].armResource`` (the older sample's batch, each
  with its ``resourceEventTime``);
* the platform's time of the change: ``data.operationalInfo.resourceEventTime`` (a capture),
  else the envelope's ``eventTime`` (``time``).

Anything else is refused with a reason, never guessed: a body that is not JSON (``not_json``),
JSON that is no event (``not_an_event``), an event of another type or schema
(``unknown_schema``), a body larger than a Storage queue message can be (``too_large``).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from datetime import datetime

from scheduled_events_exporter.model import PlatformChange
from scheduled_events_exporter.parser import excerpt, parse_event, parse_not_before
from scheduled_events_exporter.platform_feed.arm import scope_of

#: A Storage queue message is at most 64 KiB; its base64 form a third more.
MAX_BODY = 96 * 1024
#: Events in one message, and events in one event's ``data.resources`` (a sample has one).
MAX_EVENTS = 64
#: The two event types the documentation names, by their casefold.
EVENT_TYPES = frozenset(t.casefold() for t in (
    "Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted",
    "microsoft.maintenance/scheduledevents/write",
))
#: The resource type of a scheduled event (Resource Graph's ``type``), casefolded.
RESOURCE_TYPE = "microsoft.maintenance/scheduledevents"
CLOUDEVENTS_VERSION = "1.0"
_SURROGATE = re.compile("[\ud800-\udfff]")
#: Why a message is refused (the dead letter's ``status``).
NOT_JSON = "not_json"
NOT_AN_EVENT = "not_an_event"
UNKNOWN_SCHEMA = "unknown_schema"
TOO_LARGE = "too_large"


@dataclass(frozen=True, slots=True)
class Refused:
    """Why a body (or a row) carries nothing the exporter can read."""

    kind: str
    reason: str


@dataclass(frozen=True, slots=True)
class Accepted:
    """The changes a body carries, in its order."""

    changes: tuple[PlatformChange, ...]


class _Refusal(ValueError):
    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind


def read_message(body: str) -> Accepted | Refused:
    """A queue message's text (as the Storage service holds it) → its changes, or why not."""
    try:
        return Accepted(tuple(_changes(_json(body))))
    except _Refusal as refusal:
        return Refused(refusal.kind, str(refusal)[:500])


def read_row(row: object) -> PlatformChange | Refused:
    """A Resource Graph ``maintenanceresources`` row (``id``, ``name``, ``type``, ``location``,
    ``properties``, ...) → its change (no delivery id, no time of change: Resource Graph keeps
    only each event's latest status), or why not."""
    try:
        if not isinstance(row, dict):
            raise _Refusal(NOT_AN_EVENT, f"expected a row object, got {_kind(row)}")
        kind = _text(row, "type")
        if kind.casefold() != RESOURCE_TYPE:
            raise _Refusal(UNKNOWN_SCHEMA, f"row type {kind[:100]!r}, expected {RESOURCE_TYPE}")
        (change,) = _resources(row, changed_at=None, delivery_id="")
        return change
    except _Refusal as refusal:
        return Refused(refusal.kind, str(refusal)[:500])


def _json(body: str) -> object:
    if len(body) > MAX_BODY:
        raise _Refusal(TOO_LARGE, f"{len(body)} characters, expected at most {MAX_BODY}")
    text = body.strip()
    if not text:
        raise _Refusal(NOT_JSON, "an empty message, expected an event as JSON")
    try:
        return _loads(text)
    except ValueError as not_json:
        # Base64, as a queue binding writes it (strict: other text is neither).
        try:
            decoded = base64.b64decode(text, validate=True).decode("utf-8-sig").strip()
        except (binascii.Error, ValueError):
            raise _Refusal(NOT_JSON, f"neither JSON ({not_json}) nor base64 of JSON: starts "
                                     f"{excerpt(body.encode('utf-8', 'replace'))!r}") from None
    try:
        return _loads(decoded)
    except ValueError as exc:
        raise _Refusal(NOT_JSON, f"base64 of something that is not JSON ({exc}): starts "
                                 f"{excerpt(decoded.encode('utf-8', 'replace'))!r}") from None


def _loads(text: str) -> object:
    try:
        return json.loads(text)
    except RecursionError:
        raise _Refusal(NOT_JSON, "JSON nested too deeply") from None


def _changes(data: object) -> list[PlatformChange]:
    envelopes = data if isinstance(data, list) else [data]
    if not envelopes:
        raise _Refusal(NOT_AN_EVENT, "an empty array, expected one event or more")
    if len(envelopes) > MAX_EVENTS:
        raise _Refusal(TOO_LARGE, f"{len(envelopes)} events, expected at most {MAX_EVENTS}")
    out: list[PlatformChange] = []
    for index, envelope in enumerate(envelopes):
        try:
            out.extend(_envelope(envelope))
        except _Refusal as refusal:
            where = f"event [{index}]: " if isinstance(data, list) else ""
            raise _Refusal(refusal.kind, f"{where}{refusal}") from None
    return out


def _envelope(envelope: object) -> list[PlatformChange]:
    if not isinstance(envelope, dict):
        raise _Refusal(NOT_AN_EVENT, f"expected an event object, got {_kind(envelope)}")
    if "specversion" in envelope:
        version = envelope["specversion"]
        if version != CLOUDEVENTS_VERSION:
            raise _Refusal(UNKNOWN_SCHEMA, f"CloudEvents specversion {str(version)[:20]!r}, "
                                           f"expected {CLOUDEVENTS_VERSION!r}")
        kind_key, time_key = "type", "time"
    elif "eventType" in envelope:
        kind_key, time_key = "eventType", "eventTime"
    else:
        raise _Refusal(NOT_AN_EVENT, "an object with neither eventType (Event Grid schema) nor "
                                     "specversion (CloudEvents), keys "
                                     f"{sorted(str(k)[:40] for k in envelope)[:10]}")
    kind = _text(envelope, kind_key)
    if kind.casefold() not in EVENT_TYPES:
        raise _Refusal(UNKNOWN_SCHEMA, f"event type {kind[:200]!r}, expected "
                                       "Microsoft.ResourceNotifications.MaintenanceResources."
                                       "ScheduledEventEmitted or microsoft.maintenance/"
                                       "scheduledevents/write")
    data = envelope.get("data")
    if not isinstance(data, dict):
        raise _Refusal(NOT_AN_EVENT, f"expected data to be an object, got {_kind(data)}")
    delivery = _text(envelope, "id")[:256]
    when = parse_not_before(_text(envelope, time_key)[:64])
    info = data.get("resourceInfo")
    if isinstance(info, dict):
        operational = data.get("operationalInfo")
        changed = (parse_not_before(_text(operational, "resourceEventTime")[:64])
                   if isinstance(operational, dict) else None)
        return _resources(info, changed or when, delivery, subject=_text(envelope, "subject"))
    batch = data.get("resources")
    if not isinstance(batch, list) or not batch:
        raise _Refusal(UNKNOWN_SCHEMA, "data has neither resourceInfo nor resources[], keys "
                                       f"{sorted(str(k)[:40] for k in data)[:10]}")
    if len(batch) > MAX_EVENTS:
        raise _Refusal(TOO_LARGE, f"{len(batch)} resources, expected at most {MAX_EVENTS}")
    out: list[PlatformChange] = []
    for index, item in enumerate(batch):
        arm = item.get("armResource") if isinstance(item, dict) else None
        if not isinstance(arm, dict):
            raise _Refusal(UNKNOWN_SCHEMA, f"data.resources[{index}] has no armResource object")
        assert isinstance(item, dict)
        changed = parse_not_before(_text(item, "resourceEventTime")[:64])
        # One delivery carrying several events: each is its own, under the delivery's id.
        out.extend(_resources(arm, changed or when,
                              f"{delivery}#{index}" if delivery and len(batch) > 1 else delivery))
    return out


def _resources(info: dict[str, object], changed_at: datetime | None, delivery_id: str,
               subject: str = "") -> list[PlatformChange]:
    properties = info.get("properties")
    if not isinstance(properties, dict):
        raise _Refusal(NOT_AN_EVENT, f"expected properties to be an object, got "
                                     f"{_kind(properties)}")
    if "EventId" not in properties and isinstance(info.get("name"), str):
        properties = {**properties, "EventId": info["name"]}  # Resource Graph: name is it
    try:
        event = parse_event(properties)
    except ValueError as exc:
        raise _Refusal(NOT_AN_EVENT, f"properties: {exc}") from None
    resource_id = _text(info, "id") or subject
    return [PlatformChange(event, changed_at, delivery_id=delivery_id,
                           scope=scope_of(resource_id), region=_text(info, "location")[:64])]


def _text(holder: dict[str, object], key: str) -> str:
    """A string field, its lone surrogates (JSON's ``\\ud800``: text no encoder takes, which
    would fail the record later, in a hash, a protobuf or a log line) replaced by U+FFFD."""
    value = holder.get(key)
    return _SURROGATE.sub("\ufffd", value) if isinstance(value, str) else ""


def _kind(value: object) -> str:
    return "nothing" if value is None else type(value).__name__
