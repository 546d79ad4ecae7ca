"""Lifecycle tracker: a table of documented sequences plus hypothesis properties."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduled_events_exporter.model import (
    Document,
    ScheduledEvent,
    TransitionKind,
    UnreadableItem,
)
from scheduled_events_exporter.tracker import Evidence, TrackerState, note_unchanged, track
from tests.budget import examples

T0 = datetime(2022, 4, 11, 22, 0, 0, tzinfo=timezone.utc)
NB = datetime(2022, 4, 11, 22, 26, 58, tzinfo=timezone.utc)
GAP = 3.0
K = TransitionKind


def ev(event_id: str = "C7061BAC", status: str = "Scheduled", **kw: object) -> ScheduledEvent:
    base = ScheduledEvent(
        event_id=event_id,
        status=status,
        event_type="Freeze",
        resource_type="VirtualMachine",
        resources=("WestNO_0", "WestNO_1"),
        not_before=NB,
        description="Live migration",
        source="Platform",
        duration=5,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def run(docs: list[tuple[float, int, list[ScheduledEvent]]], state: TrackerState | None = None):
    """Feed (seconds after T0, incarnation, events) documents; return all transitions."""
    state = state or TrackerState()
    out = []
    for offset, inc, events in docs:
        state, transitions = track(
            state, Document(inc, tuple(events)), T0 + timedelta(seconds=offset), gap_threshold=GAP
        )
        out.extend(transitions)
    return state, out


def kinds(transitions) -> list[str]:
    return [t.kind.value for t in transitions]


def test_documented_live_migration_sequence() -> None:
    started = ev(status="Started", not_before=None)
    state, out = run([(0, 1, []), (1, 2, [ev()]), (2, 3, [started]), (3, 4, [])])
    assert kinds(out) == ["scheduled", "started", "completed"]
    scheduled, start, done = out
    assert scheduled.notice == pytest.approx((NB - (T0 + timedelta(seconds=1))).total_seconds())
    assert scheduled.previous_status is None and scheduled.observation_gap is None
    assert start.previous_status == "Scheduled" and start.unannounced is False
    assert start.elapsed == pytest.approx(1.0)
    assert start.changes == ()  # NotBefore going empty is part of starting, not an update
    assert done.observed_start is True and done.previous_status == "Started"
    assert done.event is not None and done.event.status == "Completed"
    assert done.elapsed == pytest.approx(1.0)
    assert state.events == {} and state.incarnation == 4


def test_hardware_failure_is_unannounced_start() -> None:
    reboot = ev("HW", status="Started", event_type="Reboot", not_before=None, duration=-1)
    _, out = run([(0, 1, []), (1, 2, [reboot]), (2, 3, [])])
    assert kinds(out) == ["started", "completed"]
    assert out[0].unannounced is True and out[0].previous_status is None
    assert out[1].observed_start is True


def test_cancellation_before_not_before() -> None:
    _, out = run([(0, 1, [ev()]), (1, 2, [])])
    assert kinds(out) == ["scheduled", "cancelled"]
    assert out[1].outcome_basis == "consecutive_absence"
    assert out[1].event is not None and out[1].event.status == "Cancelled"
    assert out[1].previous_status == "Scheduled" and out[1].elapsed == pytest.approx(1)


def test_scheduled_gone_after_not_before_is_completed_unobserved() -> None:
    early = ev(not_before=T0 + timedelta(seconds=5))
    _, out = run([(0, 1, [early]), (6, 2, [])])
    assert kinds(out) == ["scheduled", "completed"]
    assert out[1].observed_start is False


def test_scheduled_without_not_before_disappearing_is_unknown() -> None:
    # Neither "before NotBefore" (cancelled) nor "after it" (completed) can be shown.
    _, out = run([(0, 1, [ev(not_before=None)]), (1, 2, [])])
    assert kinds(out) == ["scheduled", "outcome_unknown"]
    assert out[0].notice is None and out[1].outcome_basis == "no_not_before"
    assert out[1].event is not None and out[1].event.status == "Unknown"


def test_reschedule_is_an_update_with_old_and_new() -> None:
    later = NB + timedelta(hours=1)
    _, out = run([(0, 1, [ev()]), (1, 2, [ev(not_before=later)])])
    assert kinds(out) == ["scheduled", "updated"]
    (change,) = out[1].changes
    assert (change.name, change.old, change.new) == (
        "NotBefore",
        "2022-04-11T22:26:58Z",
        "2022-04-11T23:26:58Z",
    )


def test_status_going_back_is_an_update_listing_it() -> None:
    started = ev(status="Started", not_before=None)
    _, out = run([(0, 1, [ev()]), (1, 2, [started]), (2, 3, [ev()])])
    assert kinds(out) == ["scheduled", "started", "updated"]
    names = [c.name for c in out[2].changes]
    assert names[0] == "EventStatus" and "NotBefore" in names


def test_unknown_status_is_kept_and_treated_like_scheduled() -> None:
    odd = ev(status="Pending")
    _, out = run([(0, 1, [odd]), (1, 2, [])])
    assert kinds(out) == ["scheduled", "cancelled"]
    assert out[0].event is not None and out[0].event.status == "Pending"


def test_several_events_order_removals_status_updates_appearances() -> None:
    a, b, c, d = ev("A"), ev("B"), ev("C"), ev("D")
    first = [a, b, c]
    second = [replace(b, status="Started"), replace(c, duration=9), d]
    _, out = run([(0, 1, first), (1, 2, second)])
    assert kinds(out)[3:] == ["cancelled", "started", "updated", "scheduled"]
    assert [t.event.event_id for t in out[3:] if t.event] == ["A", "B", "C", "D"]


def test_peer_only_event_is_tracked_like_any_other() -> None:
    peer = ev("P", resources=("WestNO_1",))
    _, out = run([(0, 1, [peer]), (1, 2, [])])
    assert kinds(out) == ["scheduled", "cancelled"]
    assert out[0].event is not None and not out[0].event.affects("WestNO_0")
    assert out[0].event.affects("westno_1")  # Azure names compare case-insensitively


def test_new_incarnation_identical_list_emits_nothing() -> None:
    state, out = run([(0, 1, [ev()]), (1, 2, [ev()]), (2, 7, [ev()])])
    assert kinds(out) == ["scheduled"]
    assert state.incarnation == 7


def test_incarnation_reset_is_reported_once_then_removals() -> None:
    _, out = run([(0, 5, [ev()]), (1, 1, []), (2, 1, []), (3, 2, [])])
    assert kinds(out) == ["scheduled", "document_reset", "outcome_unknown"]
    assert out[2].outcome_basis == "document_reset"
    reset = out[1]
    assert reset.event is None and reset.previous_incarnation == 5 and reset.incarnation == 1


def test_observation_gap_marks_every_transition_of_that_document() -> None:
    state, _ = run([(0, 1, [ev("A"), ev("B")])])
    state, out = run([(60, 2, [ev("B", status="Started", not_before=None)])], state)
    assert kinds(out) == ["outcome_unknown", "started"]
    assert all(t.observation_gap == pytest.approx(60.0) for t in out)
    assert out[0].outcome_basis == "observation_gap"


def test_unchanged_document_keeps_the_watch_continuous() -> None:
    state, _ = run([(0, 1, [ev()])])
    for second in range(1, 10):
        state = note_unchanged(state, T0 + timedelta(seconds=second))
    _, out = run([(10, 2, [])], state)
    assert out[0].observation_gap is None


def test_unparseable_not_before_counts_as_unknown() -> None:
    odd = ev(not_before=None, not_before_raw="soon-ish")
    _, out = run([(0, 1, [odd]), (1, 2, [])])
    assert kinds(out) == ["scheduled", "outcome_unknown"]
    assert out[0].event is not None and out[0].event.not_before_raw == "soon-ish"


# --- properties ---

ids = st.sampled_from(["A", "B", "C", "D", "E"])
statuses = st.sampled_from(["Scheduled", "Started", "Weird"])
events = st.builds(
    lambda i, s, nb, d, src: ev(
        i, status=s, not_before=None if nb is None else T0 + timedelta(seconds=nb), duration=d,
        source=src,
    ),
    ids,
    statuses,
    st.one_of(st.none(), st.integers(-100, 1000)),
    st.integers(-1, 30),
    st.sampled_from(["Platform", "User", "user", ""]),
)
documents = st.lists(
    st.tuples(st.integers(-3, 5), st.lists(events, max_size=5, unique_by=lambda e: e.event_id)),
    max_size=12,
)


def _feed(docs):
    state, out, offset, inc = TrackerState(), [], 0.0, 0
    for step, (inc_delta, evs) in enumerate(docs):
        offset += 1 + step % 7
        inc = max(0, inc + inc_delta)
        state, ts = track(
            state, Document(inc, tuple(evs)), T0 + timedelta(seconds=offset), gap_threshold=GAP
        )
        out.extend(ts)
    return state, out, offset


@settings(max_examples=examples(300), deadline=None)
@given(documents)
def test_every_event_ends_in_exactly_one_terminal_transition(docs) -> None:
    state, out, _ = _feed([*docs, (1, [])])
    assert state.events == {}
    # Each appearance is closed by exactly one terminal transition before it may reappear.
    open_ids: set[str] = set()
    for t in out:
        if t.event is None:
            continue
        eid = t.event.event_id
        if t.kind.is_end:
            assert eid in open_ids
            open_ids.remove(eid)
        elif t.kind in (K.SCHEDULED,) or (t.kind is K.STARTED and t.previous_status is None):
            assert eid not in open_ids
            open_ids.add(eid)
        else:
            assert eid in open_ids
    assert open_ids == set()


@settings(max_examples=examples(200), deadline=None)
@given(documents)
def test_transitions_are_a_function_of_the_inputs(docs) -> None:
    assert _feed(docs)[1] == _feed(docs)[1]


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(events, max_size=5, unique_by=lambda e: e.event_id), st.integers(0, 5))
def test_identical_events_list_emits_nothing(evs, bump) -> None:
    state, _ = track(TrackerState(), Document(3, tuple(evs)), T0, gap_threshold=GAP)
    _, again = track(
        state, Document(3 + bump, tuple(evs)), T0 + timedelta(seconds=1), gap_threshold=GAP
    )
    assert again == ()


@settings(max_examples=examples(200), deadline=None)
@given(documents)
def test_at_most_one_transition_per_event_per_document(docs) -> None:
    state, offset, inc = TrackerState(), 0.0, 0
    for inc_delta, evs in docs:
        offset += 1
        inc = max(0, inc + inc_delta)
        state, ts = track(
            state, Document(inc, tuple(evs)), T0 + timedelta(seconds=offset), gap_threshold=GAP
        )
        ids_seen = [t.event.event_id for t in ts if t.event]
        assert len(ids_seen) == len(set(ids_seen))
        assert [t.kind for t in ts].count(K.DOCUMENT_RESET) <= 1


# --- verdicts rest on evidence (docs/lifecycle.md) ---


def test_gap_in_incarnations_before_not_before_is_unknown_not_cancelled() -> None:
    _, out = run([(0, 5, [ev()]), (1, 7, [])])
    assert kinds(out) == ["scheduled", "outcome_unknown"]
    assert out[1].outcome_basis == "missed_documents"
    assert out[1].event is not None and out[1].event.status == "Unknown"


def test_consecutive_incarnations_before_not_before_is_cancelled() -> None:
    _, out = run([(0, 5, [ev()]), (1, 6, [])])
    assert kinds(out) == ["scheduled", "cancelled"]
    assert out[1].outcome_basis == "consecutive_absence"


def test_an_accepted_approval_then_the_event_gone_is_completed() -> None:
    reboot = ev("R", event_type="Reboot", resources=("vm1",), source="User")
    state, _ = run([(0, 2, [reboot])])
    state, out = track(state, Document(4, ()), T0 + timedelta(seconds=30), gap_threshold=GAP,
                       evidence=Evidence(approved=frozenset({"R"})))
    assert kinds(out) == ["completed"]
    assert out[0].outcome_basis == "approval_accepted" and out[0].observed_start is False


def test_a_changed_boot_id_with_a_reboot_of_this_vm_pending_is_completed() -> None:
    reboot = ev("R", event_type="Reboot", resources=("vm1",))
    state, _ = track(TrackerState(), Document(2, (reboot,)), T0, gap_threshold=GAP,
                     evidence=Evidence(boot_id="boot-a", vm_name="vm1"))
    assert state.boot_id == "boot-a"
    # The exporter died with its VM and comes back (state restored, interrupted) to incarnation 4.
    restored = replace(state, interrupted=True)
    _, out = track(restored, Document(4, ()), T0 + timedelta(seconds=90), gap_threshold=GAP,
                   evidence=Evidence(boot_id="boot-b", vm_name="VM1"))
    assert kinds(out) == ["completed"] and out[0].outcome_basis == "host_rebooted"
    # The same reboot of another VM proves nothing about this one.
    _, other = track(restored, Document(4, ()), T0 + timedelta(seconds=90), gap_threshold=GAP,
                     evidence=Evidence(boot_id="boot-b", vm_name="vm2"))
    assert kinds(other) == ["outcome_unknown"]


def test_a_fresh_start_into_a_started_event_is_not_unannounced() -> None:
    started = ev("HW", status="Started", event_type="Reboot", not_before=None)
    _, out = run([(0, 9, [started])])
    assert kinds(out) == ["started"]
    assert out[0].unannounced is False and out[0].outcome_basis == "first_document"


def test_a_started_event_after_a_gap_is_not_unannounced() -> None:
    started = ev("HW", status="Started", event_type="Reboot", not_before=None)
    _, out = run([(0, 1, []), (1, 3, [started])])
    assert out[0].unannounced is False and out[0].outcome_basis == "missed_documents"
    _, out = run([(0, 1, []), (30, 2, [started])])
    assert out[0].unannounced is False and out[0].outcome_basis == "observation_gap"


def test_a_watched_first_sight_as_started_is_unannounced() -> None:
    started = ev("HW", status="Started", event_type="Reboot", not_before=None)
    _, out = run([(0, 1, []), (1, 2, [started])])
    assert out[0].unannounced is True and out[0].outcome_basis == "continuous_watch"


def test_an_automatically_approved_user_reboot_is_not_unannounced() -> None:
    # userInitiatedReboot automaticallyApprove: the platform creates no Scheduled event.
    reboot = ev("USR", status="Started", event_type="Reboot", not_before=None, duration=-1,
                source="User")
    _, out = run([(0, 1, []), (1, 2, [reboot]), (2, 3, [])])
    assert kinds(out) == ["started", "completed"]
    assert out[0].unannounced is False and out[0].outcome_basis == "user_initiated"
    assert out[1].observed_start is True and out[1].outcome_basis == "observed_start"
    # Also after a gap or at a fresh start: the reason it was never Scheduled is the same.
    _, out = run([(0, 1, []), (30, 2, [reboot])])
    assert out[0].outcome_basis == "user_initiated" and out[0].observation_gap == 30.0
    _, out = run([(0, 9, [replace(reboot, source="user", event_type="Redeploy")])])
    assert out[0].unannounced is False and out[0].outcome_basis == "user_initiated"


def test_a_watched_platform_redeploy_first_seen_started_stays_unannounced() -> None:
    # The documented shape of a host hardware failure.
    redeploy = ev("HW", status="Started", event_type="Redeploy", not_before=None, duration=-1)
    _, out = run([(0, 1, []), (1, 2, [redeploy])])
    assert out[0].unannounced is True and out[0].outcome_basis == "continuous_watch"


def _feed_with_evidence(docs):
    state, out, offset, inc = TrackerState(), [], 0.0, 0
    for step, (inc_delta, evs) in enumerate(docs):
        offset += 1 + step % 7
        previous, inc = inc, max(0, inc + inc_delta)
        state, ts = track(state, Document(inc, tuple(evs)), T0 + timedelta(seconds=offset),
                          gap_threshold=GAP)
        out.extend((t, inc - previous, step % 7) for t in ts)
    return out


@settings(max_examples=examples(300), deadline=None)
@given(documents)
def test_no_sequence_with_a_gap_ever_yields_cancelled(docs) -> None:
    for t, inc_delta, pause in _feed_with_evidence([*docs, (1, [])]):
        if t.kind is K.CANCELLED:
            # offset advances by 1 + step % 7 seconds: more than GAP is an observation gap.
            assert inc_delta in (0, 1) and 1 + pause <= GAP and t.observation_gap is None


@settings(max_examples=examples(300), deadline=None)
@given(documents)
def test_every_end_carries_a_basis(docs) -> None:
    for t, _, _ in _feed_with_evidence([*docs, (1, [])]):
        if t.kind.is_end:
            assert t.outcome_basis
        if t.kind is K.STARTED and t.previous_status is None:
            assert t.outcome_basis and t.unannounced is (t.outcome_basis == "continuous_watch")
            assert t.event is not None
            # A user's operation first seen Started is never a surprise, watched or not.
            assert (t.outcome_basis == "user_initiated") is t.event.is_user_initiated


# --- properties with every kind of evidence: approvals, reboots, restarts ---

steps = st.tuples(
    st.integers(-2, 3),  # incarnation delta
    st.lists(st.builds(lambda e, t, r: replace(e, event_type=t, resources=r), events,
                       st.sampled_from(["Freeze", "Reboot", "Redeploy",
                                        "SpotRebalanceRecommendation"]),
                       st.sampled_from([("vm1",), ("vm2",), ("vm2", "VM1")])),
             max_size=4, unique_by=lambda e: e.event_id),
    st.sampled_from([1.0, 2.0, 10.0]),  # seconds since the previous document
    st.booleans(),  # the exporter restarted just before this document
    st.booleans(),  # the host rebooted just before this document
    st.frozensets(ids, max_size=2),  # EventIds whose approval IMDS accepted by now
)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(steps, max_size=10))
def test_cancelled_only_on_watched_consecutive_unapproved_absence_before_not_before(seq) -> None:
    state, at, boot, approved = TrackerState(), T0, 0, frozenset[str]()
    for inc_delta, evs, pause, restarted, rebooted, newly_approved in [*seq, (1, [], 1.0, False,
                                                                               False, frozenset())]:
        at += timedelta(seconds=pause)
        boot += rebooted
        approved |= newly_approved
        if restarted or rebooted:  # a reboot restarts the exporter too
            state = replace(state, interrupted=True)
        previous = state
        inc = max(0, (state.incarnation or 0) + inc_delta)
        evidence = Evidence(approved=approved, boot_id=f"boot-{boot}", vm_name="vm1")
        state, out = track(state, Document(inc, tuple(evs)), at, gap_threshold=GAP,
                           evidence=evidence)
        for t in out:
            assert t.event is not None or t.kind is K.DOCUMENT_RESET
            if t.kind.is_end:
                assert t.outcome_basis, t
            if t.kind is K.CANCELLED:
                assert previous.incarnation is not None and inc - previous.incarnation in (0, 1)
                assert pause <= GAP and not restarted and not rebooted
                assert t.observation_gap is None and t.event is not None
                assert t.event.event_id not in approved
                assert t.event.not_before is not None and t.event.not_before > at
                assert t.outcome_basis == "consecutive_absence"
            if t.kind is K.STARTED and t.previous_status is None and t.unannounced:
                assert previous.last_good is not None and not (restarted or rebooted)
                assert inc - (previous.incarnation or 0) in (0, 1) and pause <= GAP
            if t.outcome_basis == "host_rebooted":
                assert rebooted and t.event is not None
                assert t.event.event_type in ("Reboot", "Redeploy")
                assert "vm1" in {r.casefold() for r in t.event.resources}


def test_an_unreadable_entry_is_forgotten_once_a_document_lists_its_event_again() -> None:
    """The state file kept entries this release could not read (docs/semantics.md,
    "Compatibility"): they ride along every state the tracker makes until a document lists
    their EventId; then the event is tracked afresh and the kept entry is gone for good."""
    kept = (UnreadableItem(["A", {"event": 1}], "events[0].event: expected an object", "A"),
            UnreadableItem([7, {}], "events[1]: expected str, got int", None))
    state = TrackerState(incarnation=1, last_good=T0, unreadable_events=kept)
    state = note_unchanged(state, T0 + timedelta(seconds=1))
    assert state.unreadable_events == kept
    state, _ = track(state, Document(2, (ev("B"),)), T0 + timedelta(seconds=2), gap_threshold=60)
    assert state.unreadable_events == kept
    state, out = track(state, Document(3, (ev("A"), ev("B"))), T0 + timedelta(seconds=3),
                       gap_threshold=60)
    assert [(t.kind, t.event.event_id if t.event else "") for t in out] == [
        (TransitionKind.SCHEDULED, "A")]
    assert state.unreadable_events == kept[1:] and set(state.events) == {"A", "B"}
    state, _ = track(state, Document(4, (ev("B"),)), T0 + timedelta(seconds=4), gap_threshold=60)
    assert state.unreadable_events == kept[1:] and set(state.events) == {"B"}
