"""Domain values shared by the parser, the tracker and the telemetry mapping.

Everything here is a frozen dataclass or an enum: values cross module boundaries, never dicts.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

#: Fields of a value that a newer release wrote and this one does not know, as (name, JSON
#: value) pairs in the order read. They ride along so that writing the value back to a file
#: keeps them (protobuf's rule for unknown fields; codec.py, docs/semantics.md#compatibility).
#: Never compared, hashed or shown: two values that differ only here are equal.
UnknownFields = tuple[tuple[str, Any], ...]

#: The metadata key of a field that holds the unreadable items of another field of the same
#: value (``field(metadata={ITEMS_OF: "events"})``): codec.py reads that collection item by
#: item, keeps each item it cannot read here, and writes them back after the others.
ITEMS_OF: Final = "unreadable_items_of"


@dataclass(frozen=True, slots=True)
class UnreadableItem:
    """One item of a collection in a file (a tracker entry) that this release cannot read:
    damage, such as a field of another type. It is left out of the value, and kept as it was,
    to be written back where it was read (docs/semantics.md#compatibility), so a release that
    can read it finds it again."""

    #: The item as read (JSON): for a mapping, its ``[key, value]`` pair (or whatever stood
    #: there instead).
    raw: Any
    #: What was expected, what was seen, and where (not compared: where moves as the item is
    #: written back after the others).
    reason: str = field(compare=False)
    #: A mapping item's key when it could be read (the tracker's: an EventId).
    key: str | None = None


#: EventStatus values the platform documents; anything else is kept verbatim (docs/lifecycle.md).
STATUS_SCHEDULED = "Scheduled"
STATUS_STARTED = "Started"
#: The platform's own record (Event Grid, Resource Graph) also says how an event ended; IMDS
#: never does. "Canceled" with one "l", as the platform spells it.
STATUS_COMPLETED = "Completed"
STATUS_CANCELED = "Canceled"


@dataclass(frozen=True, slots=True)
class ScheduledEvent:
    """One entry of the IMDS ``Events`` array, as received (times parsed, defaults applied)."""

    event_id: str
    status: str
    event_type: str = ""
    resource_type: str = ""
    resources: tuple[str, ...] = ()
    #: Parsed NotBefore in UTC; ``None`` when empty or unparseable.
    not_before: datetime | None = None
    #: NotBefore text as received when it could not be parsed (else empty).
    not_before_raw: str = ""
    description: str = ""
    source: str = ""
    #: DurationInSeconds as sent: -1 unknown, 0 no impact.
    duration: int = -1
    unknown_fields: UnknownFields = field(default=(), compare=False, repr=False)

    @property
    def is_started(self) -> bool:
        """True for ``Started``; every other status (known or not) is treated like ``Scheduled``."""
        return self.status == STATUS_STARTED

    @property
    def is_user_initiated(self) -> bool:
        """EventSource ``User``: a reboot or redeploy someone asked for (portal, API, CLI)."""
        return self.source.casefold() == "user"

    def affects(self, vm_name: str) -> bool:
        """Whether ``vm_name`` is among Resources (Azure names compare case-insensitively)."""
        if not vm_name:
            return False
        wanted = vm_name.casefold()
        return any(r.casefold() == wanted for r in self.resources)


@dataclass(frozen=True, slots=True)
class Anomaly:
    """Something odd the parser repaired instead of refusing the whole document.

    ``kind`` is a fixed word (the metric attribute): ``duplicate_event_id`` or
    ``invalid_unicode``; ``detail`` is a short human description for the log.
    """

    kind: str
    detail: str


@dataclass(frozen=True, slots=True)
class Document:
    """A parsed Scheduled Events document."""

    incarnation: int
    events: tuple[ScheduledEvent, ...] = ()
    #: What the parser repaired (an EventId listed twice, text that was not valid Unicode).
    anomalies: tuple[Anomaly, ...] = ()


class _StrEnum(str, enum.Enum):
    """``enum.StrEnum`` (3.11+) for Python 3.10: members are their values as strings."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Outcome(_StrEnum):
    """How one IMDS request ended; the value is the ``outcome`` metric attribute."""

    OK = "ok"
    NOT_MODIFIED = "not_modified"
    GONE = "gone"
    THROTTLED = "throttled"
    SERVER_ERROR = "server_error"
    CLIENT_ERROR = "client_error"
    #: HTTP 400 listing the versions IMDS serves (``newest-versions``): ours is not one.
    API_VERSION_REFUSED = "api_version_refused"
    INVALID_DOCUMENT = "invalid_document"
    TIMEOUT = "timeout"
    CONNECTION_ERROR = "connection_error"

    @property
    def good(self) -> bool:
        """A good document arrived (fresh or unchanged)."""
        return self in (Outcome.OK, Outcome.NOT_MODIFIED)


class TransitionKind(_StrEnum):
    """Transition names exactly as docs/lifecycle.md spells them."""

    SCHEDULED = "scheduled"
    STARTED = "started"
    UPDATED = "updated"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    #: The event left the document and the evidence proves neither completion nor cancellation.
    OUTCOME_UNKNOWN = "outcome_unknown"
    APPROVED = "approved"
    APPROVAL_SKIPPED = "approval_skipped"
    DOCUMENT_RESET = "document_reset"

    @property
    def is_end(self) -> bool:
        """An end of an event: completed, cancelled or outcome unknown."""
        return self in (TransitionKind.COMPLETED, TransitionKind.CANCELLED,
                        TransitionKind.OUTCOME_UNKNOWN)


class Basis(_StrEnum):
    """The evidence behind a verdict (``outcome_basis``; docs/lifecycle.md has the table).

    On an end of an event it says why it is completed, cancelled or unknown; on a ``started``
    first seen already Started it says why it is (or is not) unannounced; on a ``scheduled``
    whether its notice is the whole notice (``continuous_watch``) or only what was left when
    the exporter first looked.
    """

    #: The exporter saw the event Started before it left the document.
    OBSERVED_START = "observed_start"
    #: IMDS accepted the exporter's own approval (StartRequests) of the event.
    APPROVAL_ACCEPTED = "approval_accepted"
    #: The host's boot id changed while a Reboot or Redeploy of this VM was pending.
    HOST_REBOOTED = "host_rebooted"
    #: The event left the document after its NotBefore.
    NOT_BEFORE_PASSED = "not_before_passed"
    #: Gone before its NotBefore between two consecutive documents watched without a gap.
    CONSECUTIVE_ABSENCE = "consecutive_absence"
    #: The incarnation advanced by more than one: documents were missed.
    MISSED_DOCUMENTS = "missed_documents"
    #: No good document for longer than the gap threshold, or the exporter was not running.
    OBSERVATION_GAP = "observation_gap"
    #: The incarnation went backwards (IMDS reset, redeploy to a new host).
    DOCUMENT_RESET = "document_reset"
    #: The first document this exporter saw (fresh start, no state): nothing was watched before.
    FIRST_DOCUMENT = "first_document"
    #: Gone before any usable NotBefore: neither "before" nor "after" it can be shown.
    NO_NOT_BEFORE = "no_not_before"
    #: Watched continuously with consecutive incarnations (what an unannounced start needs).
    CONTINUOUS_WATCH = "continuous_watch"
    #: A user's reboot or redeploy first seen Started: the VM approves those automatically when
    #: its scheduled events policy says so, and then the platform creates no Scheduled event.
    USER_INITIATED = "user_initiated"
    #: The platform's own record said so (EventStatus Completed or Canceled in Event Grid or
    #: Resource Graph): no inference, the ending as Azure recorded it.
    PLATFORM_RECORD = "platform_record"


class Observer(_StrEnum):
    """Who made a record (``azure.scheduled_event.observer``, the ``Observer`` column): the
    sidecar watching IMDS on the VM, or the platform's own record read by the ``platform``
    command (Event Grid through a Storage queue, Resource Graph)."""

    IMDS = "imds"
    PLATFORM = "platform"


#: The platform's documented minimum notice per event type, in seconds (Terminate: 5 min,
#: configurable up to 15). Real notice has been shorter (a Freeze with 5 min 19 s).
DOCUMENTED_MINIMUM_NOTICE: Final = {"Freeze": 900.0, "Reboot": 900.0, "Redeploy": 600.0,
                                    "Terminate": 300.0, "Preempt": 30.0}


@dataclass(frozen=True, slots=True)
class FieldChange:
    """One changed field of an ``updated`` transition (IMDS field name, old and new JSON values)."""

    name: str
    old: str | int | list[str] | None
    new: str | int | list[str] | None
    unknown_fields: UnknownFields = field(default=(), compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Transition:
    """One change the tracker derived from a document.

    ``event`` is the event as it is after the transition (for removals: as it was last seen);
    it is ``None`` only for ``document_reset``.
    """

    kind: TransitionKind
    at: datetime
    incarnation: int
    event: ScheduledEvent | None = None
    previous_status: str | None = None
    notice: float | None = None
    unannounced: bool | None = None
    observed_start: bool | None = None
    elapsed: float | None = None
    changes: tuple[FieldChange, ...] = ()
    observation_gap: float | None = None
    previous_incarnation: int | None = None
    #: The evidence of the verdict (a :class:`Basis` value) on ends and first-sight starts.
    outcome_basis: str | None = None
    #: For approval records (docs/semantics.md#approval-opt-in): HTTP status or skip reason.
    approval_status: int | None = None
    approval_reason: str | None = None
    #: Human detail of an approval decision (hook exit, POST answer, matching rule).
    approval_detail: str | None = None
    unknown_fields: UnknownFields = field(default=(), compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class InstanceInfo:
    """What the instance metadata says about this VM (empty strings when unknown)."""

    vm_name: str = ""
    vm_id: str = ""
    resource_id: str = ""
    subscription_id: str = ""
    resource_group: str = ""
    region: str = ""
    zone: str = ""
    scale_set_name: str = ""
    vm_size: str = ""
    unknown_fields: UnknownFields = field(default=(), compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class ArmScope:
    """What a scheduled event's ARM id says about where it happened: the resource the event
    belongs to (a VM, a scale set or an availability set), read from
    ``.../providers/Microsoft.Compute/<kind>/<name>/providers/microsoft.maintenance/
    scheduledevents/<EventId>``. Empty strings where the id does not say."""

    #: ``virtualMachines``, ``virtualMachineScaleSets``, ``availabilitySets`` (ARM's spelling
    #: whatever the id's case), or the type as written when it is another one; empty when
    #: the id names no Compute resource (an idmapping alias).
    kind: str = ""
    #: The ARM id of that resource, as written (without the scheduled event's part).
    resource_id: str = ""
    subscription_id: str = ""
    resource_group: str = ""
    name: str = ""
    #: The VM's or scale set's id when the id is an idmapping alias on it (no name then).
    vm_id: str = ""
    unknown_fields: UnknownFields = field(default=(), compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class PlatformChange:
    """One status change of one event as the platform recorded it (an Event Grid event, or a
    Resource Graph row), parsed: the tracker's input for the ``platform`` command."""

    #: The event as the platform describes it (``status`` may be Completed or Canceled).
    event: ScheduledEvent
    #: The platform's time of the change: ``data.operationalInfo.resourceEventTime`` when
    #: present, else the envelope's ``eventTime`` (``None``: a Resource Graph row, which has
    #: no documented time of its last change).
    changed_at: datetime | None
    #: Event Grid's id of this delivery (the same on a repeated delivery); empty for Resource
    #: Graph.
    delivery_id: str = ""
    scope: ArmScope = field(default_factory=ArmScope)
    #: The event's region (``data.resourceInfo.location``), empty when not given.
    region: str = ""
    unknown_fields: UnknownFields = field(default=(), compare=False, repr=False)
