"""Transition → record: the one place that names the fields every sink ships.

A :class:`TransitionRecord` carries a transition together with the VM it was seen on and a stable
id. Two renderings come out of it: :func:`to_columns` (the flat docs/semantics.md#sinks object
used by the console
and Event Hubs sinks, one key per ``AzureScheduledEvents_CL`` column) and :func:`to_attributes`
(the docs/semantics.md#records OpenTelemetry log attributes). :data:`COLUMNS` declares the table
schema; tests derive
the Log Analytics table and the KQL checks from it, so a renamed field breaks them.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

from scheduled_events_exporter import __version__
from scheduled_events_exporter.model import (
    DOCUMENTED_MINIMUM_NOTICE,
    Basis,
    InstanceInfo,
    Observer,
    Transition,
    TransitionKind,
    UnknownFields,
)

#: ``AzureScheduledEvents_CL`` columns in order, with their Log Analytics types.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("TimeGenerated", "datetime"),
    ("Transition", "string"),
    ("EventId", "string"),
    ("EventType", "string"),
    ("EventStatus", "string"),
    ("PreviousStatus", "string"),
    ("EventSource", "string"),
    ("ResourceType", "string"),
    ("Resources", "dynamic"),
    ("AffectsSelf", "boolean"),
    ("NotBefore", "datetime"),
    ("DurationInSeconds", "int"),
    ("Description", "string"),
    ("DocumentIncarnation", "int"),
    ("NoticeSeconds", "real"),
    ("Unannounced", "boolean"),
    ("ObservedStart", "boolean"),
    ("ElapsedSeconds", "real"),
    ("Changes", "dynamic"),
    ("ObservationGapSeconds", "real"),
    ("OutcomeBasis", "string"),
    ("ApprovalStatus", "int"),
    ("ApprovalReason", "string"),
    ("VmId", "string"),
    ("VmName", "string"),
    ("ResourceId", "string"),
    ("SubscriptionId", "string"),
    ("ResourceGroup", "string"),
    ("Region", "string"),
    ("Zone", "string"),
    ("ScaleSetName", "string"),
    ("RecordId", "string"),
    ("ExporterVersion", "string"),
    # Which observer made the record: "imds" (this sidecar) or "platform" (Azure's own record,
    # read by the platform command). Last, so that tables created before it only gain a column.
    ("Observer", "string"),
)

_UID_NAMESPACE = uuid.UUID("6f6c3c1e-7a0b-4b8e-9a51-2f5d8f0c9e11")

ColumnValue = str | int | float | bool | list[str] | dict[str, object] | None


@dataclass(frozen=True, slots=True)
class TransitionRecord:
    """A transition as shipped: the transition, the VM that saw it and its stable id."""

    transition: Transition
    instance: InstanceInfo
    record_id: str
    affects_self: bool
    exporter_version: str = __version__
    #: Position in the exporter's record stream (spool order); 0 when not spooled.
    seq: int = 0
    #: Who made it (an :class:`~.model.Observer` value). Files written before the platform
    #: command existed lack it: their records were all the sidecar's.
    observer: str = Observer.IMDS.value
    unknown_fields: UnknownFields = field(default=(), compare=False, repr=False)

    @property
    def is_platform(self) -> bool:
        """Made from the platform's own record (the ``platform`` command)."""
        return self.observer == Observer.PLATFORM.value

    @property
    def event_name(self) -> str:
        """The OTel ``event_name``: ``azure.scheduled_event.<transition>``."""
        return f"azure.scheduled_event.{self.transition.kind.value}"


def rfc3339(moment: datetime) -> str:
    """UTC RFC 3339 with millisecond precision and a ``Z`` suffix."""
    utc = moment.astimezone(timezone.utc)
    # Not strftime("%Y"): glibc writes year 999 as "999", which RFC 3339 does not allow.
    return (f"{utc.year:04d}-{utc.month:02d}-{utc.day:02d}T{utc.hour:02d}:{utc.minute:02d}:"
            f"{utc.second:02d}.{utc.microsecond // 1000:03d}Z")


def record_id(transition: Transition, vm_key: str,
              observer: Observer = Observer.IMDS) -> str:
    """A deterministic id for a transition.

    Replaying the same document against the same state (after a crash before the state was
    persisted) yields the same id, so consumers can de-duplicate at-least-once deliveries. The
    platform's record of an event gets ids of its own: its EventId case-insensitively and the
    status, whatever VM or message carried it (a message read again makes the same id).
    """
    event_id = transition.event.event_id if transition.event else ""
    status = transition.event.status if transition.event else ""
    changes = ";".join(f"{c.name}={c.old!r}>{c.new!r}" for c in transition.changes)
    if observer is Observer.PLATFORM:
        key = "|".join((observer.value, event_id.casefold(), transition.kind.value,
                        status.casefold(), changes))
        return str(uuid.uuid5(_UID_NAMESPACE, key))
    key = "|".join(
        (
            vm_key,
            event_id,
            transition.kind.value,
            str(transition.incarnation),
            str(transition.previous_incarnation),
            status,
            changes,
            str(transition.approval_status),
            transition.approval_reason or "",
        )
    )
    return str(uuid.uuid5(_UID_NAMESPACE, key))


def make_record(transition: Transition, instance: InstanceInfo, seq: int = 0,
                observer: Observer = Observer.IMDS) -> TransitionRecord:
    """Wrap a transition for the sinks. A platform record's "self" is the VM or VMs it names
    (``instance.vm_name``: the instance names in Resources, comma-separated)."""
    event = transition.event
    names = instance.vm_name.split(",") if observer is Observer.PLATFORM else [instance.vm_name]
    return TransitionRecord(
        transition=transition,
        instance=instance,
        record_id=record_id(transition, instance.vm_id or instance.vm_name, observer),
        affects_self=bool(event and any(event.affects(name) for name in names)),
        seq=seq,
        observer=observer.value,
    )


#: Resources named in a record's one-line body; the attributes and columns carry all of them.
BODY_RESOURCES = 10
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
#: Longest IMDS-derived text in one diagnostic log line (the record itself keeps everything).
LOG_TEXT_LIMIT = 300


def for_log(text: str, limit: int = LOG_TEXT_LIMIT) -> str:
    """IMDS-controlled text made safe for a one-line text log: control characters (a forged
    newline, terminal escapes) become ``?`` and the length is capped, saying how much was cut."""
    clean = _CONTROL.sub("?", text)
    if len(clean) <= limit:
        return clean
    return f"{clean[:limit]}...[{len(clean) - limit} more characters]"


def approximate_size(record: TransitionRecord) -> int:
    """Roughly the bytes a record takes on the wire and in the spool: its IMDS text (the part
    IMDS controls, up to megabytes) plus a fixed allowance for the rest."""
    t = record.transition
    e = t.event
    text = 0
    if e is not None:
        text = (len(e.event_id) + len(e.status) + len(e.event_type) + len(e.resource_type)
                + len(e.description) + len(e.source) + len(e.not_before_raw)
                + sum(len(r) + 3 for r in e.resources))
    text += sum(len(str(c.old)) + len(str(c.new)) for c in t.changes)
    return 1024 + text


def changes_object(transition: Transition) -> dict[str, object]:
    """``{field: [old, new]}`` for an ``updated`` transition."""
    return {c.name: [c.old, c.new] for c in transition.changes}


def body(record: TransitionRecord) -> str:
    """The one-line human summary used as the log body."""
    t = record.transition
    e = t.event
    if e is None:
        return (
            f"Scheduled events document reset: incarnation {t.previous_incarnation} -> "
            f"{t.incarnation}"
        )
    shown = [for_log(r, 64) for r in e.resources[:BODY_RESOURCES]]
    more = len(e.resources) - len(shown)
    who = (", ".join(shown) + (f" and {more} more" if more > 0 else "")) or "no listed resources"
    kind = e.event_type or "Event"
    impact = f"{e.duration} s impact" if e.duration >= 0 else "impact duration unknown"
    when = f"not before {rfc3339(e.not_before)[:19]}Z" if e.not_before else "no NotBefore"
    if record.is_platform and t.kind.is_end:
        said = {TransitionKind.COMPLETED: "completed", TransitionKind.CANCELLED: "canceled"}
        verdict = said.get(t.kind, "given up on: no news from the platform's record")
        return f"{kind} {verdict} for {who} (the platform's record: {e.status})"
    match t.kind:
        case TransitionKind.SCHEDULED:
            return f"{kind} scheduled for {who} {when} ({impact}{_short_notice(t)})"
        case TransitionKind.STARTED if t.outcome_basis == Basis.USER_INITIATED:
            return (f"{kind} started for {who} ({impact}; user-initiated and approved "
                    f"automatically, so never Scheduled)")
        case TransitionKind.STARTED if record.is_platform:
            return f"{kind} started for {who} ({impact}; the platform's record)"
        case TransitionKind.STARTED:
            how = " unannounced" if t.unannounced else ""
            first = (f" (first seen already started: {t.outcome_basis})"
                     if t.outcome_basis and not t.unannounced else "")
            return f"{kind} started{how} for {who} ({impact}){first}"
        case TransitionKind.UPDATED:
            fields = ", ".join(c.name for c in t.changes)
            return f"{kind} for {who} updated: {fields}"
        case TransitionKind.COMPLETED if t.observed_start and t.elapsed is not None:
            # Started lasts the platform's whole window (minutes), not the pause itself.
            pause = (f"the {e.duration} s impact" if e.duration >= 0
                     else "an impact of unknown length")
            return (f"{kind} completed for {who} (Started for {_span(t.elapsed)}: the "
                    f"platform's window around {pause})")
        case TransitionKind.COMPLETED:
            seen = "" if t.observed_start else f" (start not observed; {t.outcome_basis})"
            return f"{kind} completed for {who}{seen}"
        case TransitionKind.OUTCOME_UNKNOWN:
            return (f"{kind} for {who} left the document, outcome unknown "
                    f"({t.outcome_basis}; was {when})")
        case TransitionKind.CANCELLED:
            return f"{kind} cancelled for {who} (was {when})"
        case TransitionKind.APPROVED:
            return f"{kind} for {who} approved (HTTP {t.approval_status})"
        case _:
            return f"{kind} for {who}: approval skipped ({t.approval_reason})"


def _short_notice(t: Transition) -> str:
    """``; notice 5 min 19 s, below the documented 15 min`` when a watched event got less
    notice than the platform documents for its type (else empty)."""
    minimum = DOCUMENTED_MINIMUM_NOTICE.get(t.event.event_type) if t.event else None
    if (minimum is None or t.notice is None or t.notice >= minimum
            or t.outcome_basis not in (Basis.CONTINUOUS_WATCH, Basis.PLATFORM_RECORD)):
        return ""
    return f"; notice {_span(max(t.notice, 0.0))}, below the documented {_span(minimum)}"


def _span(seconds: float) -> str:
    """``45 s``, ``5 min 19 s``, ``15 min``, ``2 h 5 min``."""
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{hours} h"] * bool(hours) + [f"{minutes} min"] * bool(minutes)
    if secs or not parts:
        parts.append(f"{secs} s")
    return " ".join(parts[:2])


def to_columns(record: TransitionRecord) -> dict[str, ColumnValue]:
    """The flat docs/semantics.md#sinks object: exactly the :data:`COLUMNS` keys, typed values,
    nulls kept."""
    t = record.transition
    e = t.event
    inst = record.instance
    out: dict[str, ColumnValue] = {
        "TimeGenerated": rfc3339(t.at),
        "Transition": t.kind.value,
        "EventId": e.event_id if e else None,
        "EventType": e.event_type if e else None,
        "EventStatus": e.status if e else None,
        "PreviousStatus": t.previous_status,
        "EventSource": e.source if e else None,
        "ResourceType": e.resource_type if e else None,
        "Resources": list(e.resources) if e else None,
        "AffectsSelf": record.affects_self,
        "NotBefore": rfc3339(e.not_before) if e and e.not_before else None,
        "DurationInSeconds": e.duration if e else None,
        "Description": e.description if e else None,
        "DocumentIncarnation": t.incarnation,
        "NoticeSeconds": t.notice,
        "Unannounced": t.unannounced,
        "ObservedStart": t.observed_start,
        "ElapsedSeconds": t.elapsed,
        "Changes": changes_object(t) if t.changes else None,
        "ObservationGapSeconds": t.observation_gap,
        "OutcomeBasis": t.outcome_basis,
        "ApprovalStatus": t.approval_status,
        "ApprovalReason": t.approval_reason,
        "VmId": inst.vm_id,
        "VmName": inst.vm_name,
        "ResourceId": inst.resource_id,
        "SubscriptionId": inst.subscription_id,
        "ResourceGroup": inst.resource_group,
        "Region": inst.region,
        "Zone": inst.zone,
        "ScaleSetName": inst.scale_set_name,
        "RecordId": record.record_id,
        "ExporterVersion": record.exporter_version,
        "Observer": record.observer,
    }
    if record.is_platform:
        out["DocumentIncarnation"] = None  # the platform's record has no IMDS document
    return out


AttributeValue = str | bool | int | float | Sequence[str]


def to_attributes(record: TransitionRecord) -> Mapping[str, AttributeValue]:
    """The docs/semantics.md#records log attributes (absent rather than null when a value does not
    apply)."""
    t = record.transition
    e = t.event
    p = "azure.scheduled_event."
    attrs: dict[str, AttributeValue] = {
        p + "transition": t.kind.value,
        p + "observer": record.observer,
        "log.record.uid": record.record_id,
    }
    if not record.is_platform:  # the platform's record has no IMDS document
        attrs[p + "document_incarnation"] = t.incarnation
    if e is not None:
        attrs.update(
            {
                p + "id": e.event_id,
                p + "type": e.event_type,
                p + "status": e.status,
                p + "source": e.source,
                p + "resource_type": e.resource_type,
                p + "resources": list(e.resources),
                p + "affects_self": record.affects_self,
                p + "duration": e.duration,
                p + "description": e.description,
            }
        )
        if e.not_before is not None:
            attrs[p + "not_before"] = rfc3339(e.not_before)
        if e.not_before_raw:
            attrs[p + "not_before_raw"] = e.not_before_raw
    optional: dict[str, AttributeValue | None] = {
        p + "previous_status": t.previous_status,
        p + "notice": t.notice,
        p + "unannounced": t.unannounced,
        p + "observed_start": t.observed_start,
        p + "elapsed": t.elapsed,
        p + "observation_gap": t.observation_gap,
        p + "previous_incarnation": t.previous_incarnation,
        p + "outcome_basis": t.outcome_basis,
        p + "approval.http_status": t.approval_status,
        p + "approval.reason": t.approval_reason,
        p + "approval.detail": t.approval_detail,
    }
    attrs.update({k: v for k, v in optional.items() if v is not None})
    if t.changes:
        attrs[p + "changes"] = json.dumps(changes_object(t), sort_keys=True)
    return attrs
