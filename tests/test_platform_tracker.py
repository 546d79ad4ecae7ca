"""The tracker's platform rules (pure, ``now`` injected): the platform's record of an event
becomes the same transitions as the sidecar's, never backwards, terminal statuses taken as
they are, and a repeat (same delivery id, or the same EventId at the same status) makes no
second record. Then the records those transitions make (observer, columns, ids) and the state
file that keeps the platform's memory."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduled_events_exporter.model import (
    Basis,
    InstanceInfo,
    Observer,
    PlatformChange,
    ScheduledEvent,
    TransitionKind,
)
from scheduled_events_exporter.records import COLUMNS, make_record, to_attributes, to_columns
from scheduled_events_exporter.state import PersistedState, StateStore
from scheduled_events_exporter.tracker import (
    AFTER_ITS_END,
    ALREADY_SEEN,
    DUPLICATE_DELIVERY,
    OLDER_THAN_KNOWN,
    PlatformState,
    TrackerState,
    expire_platform,
    platform_rank,
    track_platform,
)

T0 = datetime(2026, 5, 12, 8, 0, tzinfo=timezone.utc)
ID = "3da1b9aa-5204-4335-8c33-c54e315dcffe"
NOT_BEFORE = T0 + timedelta(minutes=15)


def change(status: str, *, minutes: float = 0, delivery: str = "", event_id: str = ID,
           event_type: str = "Freeze", source: str = "Platform",
           timed: bool = True) -> PlatformChange:
    event = ScheduledEvent(event_id, status, event_type, "VirtualMachine", ("myvmss_1",),
                           NOT_BEFORE if status == "Scheduled" else None, source=source,
                           duration=5)
    return PlatformChange(event, T0 + timedelta(minutes=minutes) if timed else None,
                          delivery_id=delivery or f"delivery-{status}-{minutes}")


def feed(*changes: PlatformChange, state: PlatformState | None = None
         ) -> tuple[PlatformState, list[tuple[str, str]], list[str]]:
    """(final state, [(transition, status)...], [reason of each change that made none])."""
    state = state or PlatformState()
    made: list[tuple[str, str]] = []
    skipped: list[str] = []
    for i, item in enumerate(changes):
        state, transitions, why = track_platform(state, item, T0 + timedelta(hours=1, seconds=i))
        made.extend((t.kind.value, t.event.status if t.event else "") for t in transitions)
        if why:
            skipped.append(why)
    return state, made, skipped


def test_a_freeze_scheduled_started_completed() -> None:
    state, made, skipped = feed(change("Scheduled"), change("Started", minutes=16),
                                change("Completed", minutes=18))
    assert made == [("scheduled", "Scheduled"), ("started", "Started"),
                    ("completed", "Completed")]
    assert skipped == [] and not state.events and set(state.ended) == {ID}


def test_the_transitions_carry_the_platforms_times_and_basis() -> None:
    state = PlatformState()
    state, (scheduled,), _ = track_platform(state, change("Scheduled"), T0 + timedelta(hours=2))
    assert scheduled.at == T0 and scheduled.notice == 900.0
    assert scheduled.outcome_basis == Basis.PLATFORM_RECORD
    state, (started,), _ = track_platform(state, change("Started", minutes=16), T0)
    assert started.previous_status == "Scheduled" and started.elapsed == 960.0
    assert started.unannounced is False
    _, (completed,), _ = track_platform(state, change("Completed", minutes=18), T0)
    assert completed.kind is TransitionKind.COMPLETED and completed.observed_start is True
    assert completed.outcome_basis == Basis.PLATFORM_RECORD and completed.elapsed == 120.0


def test_a_reboot_scheduled_then_canceled() -> None:
    state, made, _ = feed(change("Scheduled", event_type="Reboot"),
                          change("Canceled", minutes=3, event_type="Reboot"))
    assert made == [("scheduled", "Scheduled"), ("cancelled", "Canceled")]
    assert state.ended[ID].status == "Canceled"


def test_an_auto_approved_user_reboot_goes_started_then_completed() -> None:
    state = PlatformState()
    state, (started,), _ = track_platform(
        state, change("Started", event_type="Reboot", source="User"), T0)
    assert started.kind is TransitionKind.STARTED
    assert started.outcome_basis == Basis.USER_INITIATED and started.unannounced is False
    _, (completed,), _ = track_platform(
        state, change("Completed", minutes=2, event_type="Reboot", source="User"), T0)
    assert completed.kind is TransitionKind.COMPLETED and completed.observed_start is True


def test_a_repeated_delivery_and_a_repeated_status_make_no_second_record() -> None:
    first = change("Scheduled", delivery="same-id")
    again = replace(first, delivery_id="another-id")  # Event Grid retried with a new id?
    _, made, skipped = feed(first, first, again)
    assert made == [("scheduled", "Scheduled")]
    assert skipped == [DUPLICATE_DELIVERY, ALREADY_SEEN]


def test_the_event_id_is_compared_case_insensitively() -> None:
    _, made, skipped = feed(change("Scheduled"),
                            change("Scheduled", event_id=ID.upper(), delivery="upper"),
                            change("Started", minutes=16, event_id=ID.upper()))
    assert made == [("scheduled", "Scheduled"), ("started", "Started")]
    assert skipped == [ALREADY_SEEN]


def test_never_backwards_a_late_scheduled_is_ignored() -> None:
    """A Storage queue keeps no order: Started may be read before its Scheduled."""
    _, made, skipped = feed(change("Started", minutes=16), change("Scheduled"))
    assert made == [("started", "Started")]
    assert skipped == [OLDER_THAN_KNOWN]


def test_nothing_after_an_end_not_even_another_end() -> None:
    _, made, skipped = feed(change("Completed"), change("Started", minutes=1),
                            change("Canceled", minutes=2), change("Completed", minutes=3))
    assert made == [("completed", "Completed")]
    assert skipped == [AFTER_ITS_END] * 3


def test_an_end_first_seen_has_no_previous_status() -> None:
    _, (completed,), _ = track_platform(PlatformState(), change("Completed"), T0)
    assert completed.previous_status is None and completed.observed_start is False


def test_a_resource_graph_row_has_no_time_so_its_notice_is_unknown() -> None:
    now = T0 + timedelta(minutes=5)
    _, (scheduled,), _ = track_platform(PlatformState(), change("Scheduled", timed=False), now)
    assert scheduled.at == now and scheduled.notice is None


def test_another_status_of_the_same_rank_makes_no_record() -> None:
    """One the platform may add beside Scheduled: no going back and forth between them."""
    _, made, skipped = feed(change("Scheduled"), change("Postponed", minutes=1))
    assert made == [("scheduled", "Scheduled")] and skipped == [ALREADY_SEEN]


def test_ranks() -> None:
    assert [platform_rank(s) for s in ("Scheduled", "Started", "Completed", "Canceled",
                                       "cancelled", "STARTED", "Something")] == [0, 1, 2, 2, 2,
                                                                                 1, 0]


def test_memory_is_bounded_by_age_and_count_and_stale_pending_events_end_unknown() -> None:
    state, _, _ = feed(*(change("Completed", event_id=f"e{i}", delivery=f"d{i}")
                         for i in range(5)), change("Scheduled", event_id="pending"))
    trimmed, ends = expire_platform(state, T0 + timedelta(hours=2), entries=3)
    assert list(trimmed.ended) == ["e2", "e3", "e4"] and len(trimmed.deliveries) == 3
    assert ends == ()
    later = T0 + timedelta(days=15)
    gone, ends = expire_platform(state, later)
    assert not gone.events and set(gone.ended) == {"pending"} and not gone.deliveries
    (unknown,) = ends
    assert unknown.kind is TransitionKind.OUTCOME_UNKNOWN
    assert unknown.outcome_basis == Basis.OBSERVATION_GAP
    same, ends = expire_platform(trimmed, T0 + timedelta(hours=2), entries=3)
    assert same is trimmed and ends == ()


STATUSES = st.sampled_from(["Scheduled", "Started", "Completed", "Canceled", "Other"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(STATUSES, st.sampled_from([ID, ID.upper(), "other-event"]),
                          st.sampled_from(["a", "b", "c", "d"])), max_size=12))
def test_any_order_of_deliveries_makes_at_most_one_record_per_event_and_status_never_back(
        deliveries: list[tuple[str, str, str]]) -> None:
    state = PlatformState()
    seen: dict[str, list[tuple[str, int]]] = {}
    for i, (status, event_id, delivery) in enumerate(deliveries):
        item = change(status, event_id=event_id, delivery=f"{delivery}{status}{event_id}",
                      minutes=i)
        state, transitions, _ = track_platform(state, item, T0)
        for t in transitions:
            assert t.event is not None
            seen.setdefault(t.event.event_id.casefold(), []).append(
                (t.event.status.casefold(), platform_rank(t.event.status)))
    for history in seen.values():
        statuses = [s for s, _ in history]
        assert len(statuses) == len(set(statuses))  # one record per (EventId, status)
        ranks = [r for _, r in history]
        assert ranks == sorted(ranks) and ranks.count(2) <= 1  # never back; one end


def platform_record(status: str = "Completed") -> object:
    _, (t,), _ = track_platform(PlatformState(), change(status), T0)
    vm = InstanceInfo(vm_name="myvmss_1,myvmss_2", resource_id="/subscriptions/s/rg/x",
                      subscription_id="s", resource_group="rg", scale_set_name="myvmss")
    return make_record(t, vm, seq=3, observer=Observer.PLATFORM)


def test_a_platform_record_says_its_observer_in_every_form() -> None:
    record = platform_record()
    columns = to_columns(record)  # type: ignore[arg-type]
    assert list(columns) == [name for name, _ in COLUMNS] and list(columns)[-1] == "Observer"
    assert columns["Observer"] == "platform" and columns["DocumentIncarnation"] is None
    assert columns["OutcomeBasis"] == "platform_record" and columns["AffectsSelf"] is True
    attributes = to_attributes(record)  # type: ignore[arg-type]
    assert attributes["azure.scheduled_event.observer"] == "platform"
    assert "azure.scheduled_event.document_incarnation" not in attributes


def test_the_sidecars_records_say_imds_and_keep_their_ids() -> None:
    _, (t,), _ = track_platform(PlatformState(), change("Scheduled"), T0)
    vm = InstanceInfo(vm_name="myvmss_1", vm_id="vm-1")
    imds = make_record(t, vm)
    assert imds.observer == "imds" and to_columns(imds)["Observer"] == "imds"
    assert to_attributes(imds)["azure.scheduled_event.observer"] == "imds"
    platform = make_record(t, vm, observer=Observer.PLATFORM)
    assert platform.record_id != imds.record_id
    # The platform's id does not depend on the VM or the EventId's case: the same change read
    # again (another message, another letter case) is the same record.
    upper = replace(t, event=replace(t.event, event_id=ID.upper()))  # type: ignore[arg-type]
    assert make_record(upper, InstanceInfo(), observer=Observer.PLATFORM).record_id == \
        platform.record_id


def test_the_state_file_keeps_the_platforms_memory(tmp_path: Path) -> None:
    state, _, _ = feed(change("Scheduled"), change("Completed", event_id="gone"))
    store = StateStore(tmp_path)
    store.save(PersistedState(tracker=TrackerState(), seq=4, platform=state))
    loaded = store.load()
    assert loaded is not None and loaded.platform == state and loaded.seq == 4
    assert list(loaded.platform.deliveries) == list(state.deliveries)
    store.save(PersistedState(tracker=TrackerState()))
    again = store.load()
    assert again is not None and again.platform is None
