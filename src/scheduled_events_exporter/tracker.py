"""Lifecycle tracker (docs/lifecycle.md): a pure function of (previous state, new document, now).

IMDS has no Completed or Cancelled status: an event simply disappears. The tracker remembers what
it has seen and turns each change of the document into transitions. No I/O and no clock reads:
``now`` is an argument, so every rule is unit-testable and replaying the same inputs yields the
same outputs.

The platform's own record (the ``platform`` command) goes through the same tracker with its own
rules (:func:`track_platform`): one change of one event at a time, never backwards, its
terminal statuses taken as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TypeVar

from scheduled_events_exporter.model import (
    ITEMS_OF,
    STATUS_CANCELED,
    STATUS_STARTED,
    Basis,
    Document,
    FieldChange,
    PlatformChange,
    ScheduledEvent,
    Transition,
    TransitionKind,
    UnknownFields,
    UnreadableItem,
)

#: Fields whose change (with an unchanged status) is an ``updated`` transition, by IMDS name.
UPDATE_FIELDS: tuple[str, ...] = (
    "NotBefore",
    "DurationInSeconds",
    "Resources",
    "EventType",
    "Description",
)

FieldValue = str | int | list[str] | None

#: Status reported after a removal (not an IMDS value: IMDS just drops the event; "Completed"
#: is also the platform's word).
STATUS_COMPLETED = "Completed"
STATUS_CANCELLED = "Cancelled"
STATUS_UNKNOWN = "Unknown"

_T = TypeVar("_T")

#: Event types whose run reboots (or moves) this VM: a changed boot id proves they ran.
REBOOTING_TYPES = frozenset({"reboot", "redeploy"})


@dataclass(frozen=True, slots=True)
class KnownEvent:
    """An event the tracker has seen and not yet seen end."""

    event: ScheduledEvent
    first_seen: datetime
    status_since: datetime
    #: First seen already Started while the exporter watched continuously (a real surprise).
    unannounced: bool = False
    unknown_fields: UnknownFields = field(default=(), compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class TrackerState:
    """Everything the tracker needs to remember between documents.

    ``events`` keeps insertion order (first sight), which orders removals deterministically.
    It is never mutated: :func:`track` builds a new mapping.
    """

    events: Mapping[str, KnownEvent] = field(default_factory=dict)
    incarnation: int | None = None
    #: When the last good document (200 or 304) was seen; ``None`` before the first one.
    last_good: datetime | None = None
    #: The watch was interrupted (the exporter restarted) since ``last_good``, however briefly.
    interrupted: bool = False
    #: The host's boot id when the state was last updated (``None``: unknown).
    boot_id: str | None = None
    unknown_fields: UnknownFields = field(default=(), compare=False, repr=False)
    #: Entries of ``events`` in the state file that this release cannot read (damage): not
    #: tracked, written back as they were after the tracked ones (codec.py). One is forgotten
    #: once a document lists its EventId again: the event is then tracked afresh, and the
    #: entry read from this document wins (docs/semantics.md#compatibility).
    unreadable_events: tuple[UnreadableItem, ...] = field(default=(), repr=False,
                                                          metadata={ITEMS_OF: "events"})


@dataclass(frozen=True, slots=True)
class Evidence:
    """What the exporter knows beyond the document, handed to :func:`track` (no I/O here).

    ``approved``: EventIds whose approval IMDS accepted (the exporter's own, remembered in the
    state file). ``boot_id``: the host's boot identity now (``None`` when unreadable).
    ``vm_name``: this VM, to tell whether a pending Reboot or Redeploy was its own.
    """

    approved: frozenset[str] = frozenset()
    boot_id: str | None = None
    vm_name: str = ""


def field_value(event: ScheduledEvent, name: str) -> FieldValue:
    """An event field by its IMDS name, in the JSON form used for ``changes``."""
    match name:
        case "NotBefore":
            if event.not_before is not None:
                return event.not_before.strftime("%Y-%m-%dT%H:%M:%SZ")
            return event.not_before_raw or None
        case "DurationInSeconds":
            return event.duration
        case "Resources":
            return list(event.resources)
        case "EventType":
            return event.event_type
        case "Description":
            return event.description
        case "EventStatus":
            return event.status
    raise KeyError(f"unknown event field {name!r}")


def observation_gap(state: TrackerState, now: datetime, gap_threshold: float) -> float | None:
    """Seconds without a good document, when longer than ``gap_threshold`` or interrupted."""
    if state.last_good is None:
        return None
    gap = (now - state.last_good).total_seconds()
    return gap if state.interrupted or gap > gap_threshold else None


def note_unchanged(
    state: TrackerState, now: datetime, evidence: Evidence | None = None
) -> TrackerState:
    """Record a good but unchanged document (HTTP 304): only the freshness moves.

    The watch is continuous again from here, so the boot id is the current one too: a later
    change of it means a reboot after this document.
    """
    boot_id = evidence.boot_id if evidence is not None and evidence.boot_id else state.boot_id
    return replace(state, last_good=now, interrupted=False, boot_id=boot_id)


def discontinuity(state: TrackerState, incarnation: int, gap: float | None) -> Basis | None:
    """Why the exporter cannot claim it saw every document up to ``incarnation`` (``None``: it
    can: a previous document, no observation gap, the incarnation advanced by at most one)."""
    if state.incarnation is None or state.last_good is None:
        return Basis.FIRST_DOCUMENT
    if incarnation < state.incarnation:
        return Basis.DOCUMENT_RESET
    if incarnation > state.incarnation + 1:
        return Basis.MISSED_DOCUMENTS
    if gap is not None:
        return Basis.OBSERVATION_GAP
    return None


def track(
    state: TrackerState,
    document: Document,
    now: datetime,
    *,
    gap_threshold: float,
    evidence: Evidence | None = None,
) -> tuple[TrackerState, tuple[Transition, ...]]:
    """Compare ``document`` with ``state`` and return the new state and the transitions.

    Order inside one document (docs/lifecycle.md): ``document_reset`` first (it explains what
    follows),
    then removals, status changes, updates and appearances, each in document (or first-seen)
    order. An event changes at most once per document: a status change carries the new values
    of the other fields rather than adding an ``updated`` beside it.

    Ends and first sights are judged by ``evidence`` (docs/lifecycle.md): an event leaving the
    document is ``cancelled`` only when nothing was missed, and ``outcome_unknown`` when the
    evidence proves neither ending.
    """
    evidence = evidence or Evidence()
    gap = observation_gap(state, now, gap_threshold)
    incarnation = document.incarnation
    gap_basis = discontinuity(state, incarnation, gap)
    rebooted = bool(state.boot_id and evidence.boot_id and state.boot_id != evidence.boot_id)

    make = _Maker(now=now, incarnation=incarnation, gap=gap)

    resets: list[Transition] = []
    if state.incarnation is not None and incarnation < state.incarnation:
        resets.append(
            make(TransitionKind.DOCUMENT_RESET, None, previous_incarnation=state.incarnation)
        )

    current = {e.event_id: e for e in document.events}
    removals: list[Transition] = []
    for event_id, known in state.events.items():
        if event_id not in current:
            removals.append(_removal(known, now, make, evidence, gap_basis, rebooted))

    status_changes: list[Transition] = []
    updates: list[Transition] = []
    appearances: list[Transition] = []
    new_events: dict[str, KnownEvent] = {}
    for event in document.events:
        known_or_none = state.events.get(event.event_id)
        if known_or_none is None:
            appearance = _appearance(event, now, make, gap_basis)
            new_events[event.event_id] = KnownEvent(event, first_seen=now, status_since=now,
                                                    unannounced=bool(appearance.unannounced))
            appearances.append(appearance)
            continue
        known = known_or_none
        old = known.event
        if event == old:
            new_events[event.event_id] = known
            continue
        elapsed = (now - known.status_since).total_seconds()
        if event.status != old.status and event.is_started:
            status_changes.append(
                make(
                    TransitionKind.STARTED,
                    event,
                    previous_status=old.status,
                    unannounced=False,
                    elapsed=elapsed,
                )
            )
            # replace: what a newer release kept on the entry survives (docs/semantics.md);
            # the event itself is this document's, as this release reads it.
            new_events[event.event_id] = replace(known, event=event, status_since=now)
            continue
        changes = _changes(old, event)
        status_since = known.status_since if event.status == old.status else now
        new_events[event.event_id] = replace(known, event=event, status_since=status_since)
        if changes:
            updates.append(
                make(TransitionKind.UPDATED, event, previous_status=old.status, changes=changes)
            )

    new_state = replace(state, events=new_events, incarnation=incarnation, last_good=now,
                        interrupted=False, boot_id=evidence.boot_id or state.boot_id,
                        unreadable_events=tuple(u for u in state.unreadable_events
                                                if u.key not in current))
    transitions = (*resets, *removals, *status_changes, *updates, *appearances)
    return new_state, transitions


def _changes(old: ScheduledEvent, new: ScheduledEvent) -> tuple[FieldChange, ...]:
    names = UPDATE_FIELDS if old.status == new.status else ("EventStatus", *UPDATE_FIELDS)
    out: list[FieldChange] = []
    for name in names:
        before, after = field_value(old, name), field_value(new, name)
        if before != after:
            out.append(FieldChange(name, before, after))
    return tuple(out)


def _removal(
    known: KnownEvent,
    now: datetime,
    make: _Maker,
    evidence: Evidence,
    gap_basis: Basis | None,
    rebooted: bool,
) -> Transition:
    """The verdict on an event that left the document, with the evidence it rests on."""
    event = known.event
    elapsed = (now - known.status_since).total_seconds()

    def end(kind: TransitionKind, status: str, basis: Basis,
            observed_start: bool | None = None) -> Transition:
        # The record shows the status *after* the transition; IMDS has no word for it, we do.
        return make(kind, replace(event, status=status), previous_status=event.status,
                    observed_start=observed_start, elapsed=elapsed, outcome_basis=basis)

    if event.is_started:
        return end(TransitionKind.COMPLETED, STATUS_COMPLETED, Basis.OBSERVED_START, True)
    if event.event_id in evidence.approved:
        return end(TransitionKind.COMPLETED, STATUS_COMPLETED, Basis.APPROVAL_ACCEPTED, False)
    if (rebooted and event.event_type.casefold() in REBOOTING_TYPES
            and event.affects(evidence.vm_name)):
        return end(TransitionKind.COMPLETED, STATUS_COMPLETED, Basis.HOST_REBOOTED, False)
    if event.not_before is not None and event.not_before <= now:
        return end(TransitionKind.COMPLETED, STATUS_COMPLETED, Basis.NOT_BEFORE_PASSED, False)
    if gap_basis is None and not rebooted and event.not_before is not None:
        return end(TransitionKind.CANCELLED, STATUS_CANCELLED, Basis.CONSECUTIVE_ABSENCE)
    # Documents were missed (or NotBefore is unknown): it may have run or been cancelled in
    # between, and guessing either would corrupt the cancellation and notice statistics.
    return end(TransitionKind.OUTCOME_UNKNOWN, STATUS_UNKNOWN, gap_basis or Basis.NO_NOT_BEFORE)


def _appearance(
    event: ScheduledEvent, now: datetime, make: _Maker, gap_basis: Basis | None
) -> Transition:
    if event.is_started:
        if event.is_user_initiated:
            # A user's operation on a VM whose scheduled events policy approves it
            # automatically (userInitiatedReboot / userInitiatedRedeploy automaticallyApprove)
            # never goes through Scheduled: Started is its announcement, nothing was missed.
            return make(TransitionKind.STARTED, event, unannounced=False,
                        outcome_basis=Basis.USER_INITIATED)
        # Unannounced only if the exporter was watching: after a fresh start or a gap it is
        # just the first sight of an event that may well have been Scheduled meanwhile.
        return make(TransitionKind.STARTED, event, unannounced=gap_basis is None,
                    outcome_basis=gap_basis or Basis.CONTINUOUS_WATCH)
    notice = (event.not_before - now).total_seconds() if event.not_before is not None else None
    # The basis says whether the notice is the whole notice: after a start or a gap the event
    # may have been Scheduled for a while already, and the notice is only what was left.
    return make(TransitionKind.SCHEDULED, event, notice=notice,
                outcome_basis=gap_basis or Basis.CONTINUOUS_WATCH)


@dataclass(frozen=True, slots=True)
class _Maker:
    """Builds transitions that share the document's time, incarnation and observation gap."""

    now: datetime
    incarnation: int
    gap: float | None

    def __call__(
        self,
        kind: TransitionKind,
        event: ScheduledEvent | None,
        *,
        previous_status: str | None = None,
        notice: float | None = None,
        unannounced: bool | None = None,
        observed_start: bool | None = None,
        elapsed: float | None = None,
        changes: tuple[FieldChange, ...] = (),
        previous_incarnation: int | None = None,
        outcome_basis: Basis | None = None,
    ) -> Transition:
        return Transition(
            kind=kind,
            at=self.now,
            incarnation=self.incarnation,
            event=event,
            previous_status=previous_status,
            notice=notice,
            unannounced=unannounced,
            observed_start=observed_start,
            elapsed=elapsed,
            changes=changes,
            observation_gap=self.gap,
            previous_incarnation=previous_incarnation,
            outcome_basis=outcome_basis.value if outcome_basis is not None else None,
        )


# --- the platform's own record (docs/lifecycle.md, "The platform's record") ---

#: What the platform command remembers beyond pending events, so that a repeated delivery or a
#: late message makes no second record: an ended event, and an Event Grid delivery id, for
#: ``PLATFORM_MEMORY_SECONDS`` (Event Grid retries for 24 h, a queue message lives 7 days by
#: default) and at most ``PLATFORM_MEMORY_ENTRIES`` of each (the oldest forgotten first).
PLATFORM_MEMORY_SECONDS = 8 * 86400.0
PLATFORM_MEMORY_ENTRIES = 20_000
#: A pending event the platform said nothing more of for this long is given up on
#: (``outcome_unknown``): the longest documented notice is 7 days (degraded hardware).
PLATFORM_PENDING_SECONDS = 14 * 86400.0

#: Why :func:`track_platform` made no record of a change.
DUPLICATE_DELIVERY = "duplicate_delivery"
ALREADY_SEEN = "already_seen"
OLDER_THAN_KNOWN = "older_than_known"
AFTER_ITS_END = "after_its_end"


@dataclass(frozen=True, slots=True)
class EndedEvent:
    """An event the platform recorded as ended: its final status and when it was noted."""

    status: str
    at: datetime
    unknown_fields: UnknownFields = field(default=(), compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class PlatformState:
    """What the platform command remembers: pending events by EventId (compared
    case-insensitively, so keyed by its casefold), ended events and Event Grid delivery ids
    seen, both in the order they were noted (bounded: :func:`expire_platform`)."""

    events: Mapping[str, KnownEvent] = field(default_factory=dict)
    ended: Mapping[str, EndedEvent] = field(default_factory=dict)
    deliveries: Mapping[str, datetime] = field(default_factory=dict)
    unknown_fields: UnknownFields = field(default=(), compare=False, repr=False)


def platform_rank(status: str) -> int:
    """Where a status stands in an event's life: Scheduled (and any status the platform may
    add) 0, Started 1, Completed or Canceled 2. An event never moves to a lower rank."""
    folded = status.casefold()
    if folded == STATUS_STARTED.casefold():
        return 1
    if folded in (STATUS_COMPLETED.casefold(), STATUS_CANCELED.casefold(), "cancelled"):
        return 2
    return 0


def track_platform(state: PlatformState, change: PlatformChange, now: datetime
                   ) -> tuple[PlatformState, tuple[Transition, ...], str]:
    """The platform's rules for one change: the new state, its transitions, and when it makes
    none the reason (:data:`DUPLICATE_DELIVERY`, :data:`ALREADY_SEEN`,
    :data:`OLDER_THAN_KNOWN`, :data:`AFTER_ITS_END`).

    A delivery id seen before, or an EventId already at this status (the dedup rule; a status
    of the same rank counts as this status), makes no record; nor does a status below the one
    known (the queue does not keep order: a Scheduled
    read after its Started is late, not a step back), nor anything after an end. Completed and
    Canceled are terminal, with ``outcome_basis`` ``platform_record``; an auto-approved user
    event goes Started → Completed without ever being Scheduled. A transition's time is the
    platform's time of the change when the record has one, else ``now``.
    """
    if change.delivery_id and change.delivery_id in state.deliveries:
        return state, (), DUPLICATE_DELIVERY
    deliveries = dict(state.deliveries)
    if change.delivery_id:
        deliveries[change.delivery_id] = now
    state = replace(state, deliveries=deliveries)
    event = change.event
    key = event.event_id.casefold()
    if key in state.ended:
        return state, (), AFTER_ITS_END
    at = change.changed_at or now
    make = _Maker(now=at, incarnation=0, gap=None)
    basis = Basis.PLATFORM_RECORD
    known = state.events.get(key)
    rank = platform_rank(event.status)
    events = dict(state.events)
    if known is not None:
        old_rank = platform_rank(known.event.status)
        if rank < old_rank:
            return state, (), OLDER_THAN_KNOWN
        if rank == old_rank:
            # The same status again (the dedup rule), or a status the platform may add beside
            # Scheduled: at most one record per (EventId, status), so no going back and forth.
            return state, (), ALREADY_SEEN
    previous = known.event.status if known is not None else None
    elapsed = (at - known.status_since).total_seconds() if known is not None else None
    if rank == 2:
        events.pop(key, None)
        ended = {**state.ended, key: EndedEvent(event.status, now)}
        cancelled = event.status.casefold() != STATUS_COMPLETED.casefold()
        kind = TransitionKind.CANCELLED if cancelled else TransitionKind.COMPLETED
        observed = None if cancelled else bool(known is not None and known.event.is_started)
        transition = make(kind, event, previous_status=previous, observed_start=observed,
                          elapsed=elapsed, outcome_basis=basis)
        return replace(state, events=events, ended=ended), (transition,), ""
    if known is None:
        events[key] = KnownEvent(event, first_seen=at, status_since=at)
        if rank == 1:
            # Started first: a user's operation approved automatically never had a Scheduled;
            # otherwise its Scheduled was not read (yet): never called unannounced here.
            first = Basis.USER_INITIATED if event.is_user_initiated else basis
            transition = make(TransitionKind.STARTED, event, unannounced=False,
                              outcome_basis=first)
        else:
            # The whole notice when the platform says when it was scheduled; a Resource Graph
            # row does not, and a notice from whenever it was read would be a guess.
            notice = (None if change.changed_at is None or event.not_before is None
                      else (event.not_before - change.changed_at).total_seconds())
            transition = make(TransitionKind.SCHEDULED, event, notice=notice,
                              outcome_basis=basis)
        return replace(state, events=events), (transition,), ""
    assert known is not None
    events[key] = replace(known, event=event, status_since=at)
    transition = make(TransitionKind.STARTED, event, previous_status=previous,
                      unannounced=False, elapsed=elapsed, outcome_basis=basis)
    return replace(state, events=events), (transition,), ""


def expire_platform(state: PlatformState, now: datetime,
                    memory: float = PLATFORM_MEMORY_SECONDS,
                    entries: int = PLATFORM_MEMORY_ENTRIES,
                    pending: float = PLATFORM_PENDING_SECONDS,
                    ) -> tuple[PlatformState, tuple[Transition, ...]]:
    """Keep the platform command's memory bounded: ended events and delivery ids older than
    ``memory`` seconds, or beyond ``entries`` of each, are forgotten (the oldest first); a
    pending event with no news for ``pending`` seconds ends as ``outcome_unknown``
    (``observation_gap``: the platform's record said nothing more)."""
    def recent(items: Mapping[str, _T], when: Callable[[_T], datetime]) -> dict[str, _T]:
        kept = [(k, v) for k, v in items.items() if (now - when(v)).total_seconds() <= memory]
        return dict(kept[-entries:]) if entries > 0 else {}

    ended = recent(state.ended, lambda e: e.at)
    deliveries = recent(state.deliveries, lambda at: at)
    events = dict(state.events)
    transitions: list[Transition] = []
    for key, known in state.events.items():
        if (now - known.status_since).total_seconds() > pending:
            del events[key]
            ended[key] = EndedEvent(STATUS_UNKNOWN, now)
            transitions.append(_Maker(now=now, incarnation=0, gap=None)(
                TransitionKind.OUTCOME_UNKNOWN, replace(known.event, status=STATUS_UNKNOWN),
                previous_status=known.event.status,
                elapsed=(now - known.status_since).total_seconds(),
                outcome_basis=Basis.OBSERVATION_GAP))
    if (len(ended), len(deliveries), len(events)) == (
            len(state.ended), len(state.deliveries), len(state.events)):
        return state, ()
    return replace(state, events=events, ended=ended, deliveries=deliveries), tuple(transitions)
