"""The request bound and the dead-letter watch, pure (delivery/bound.py, rejections.py): when a
refusal proves size, how the bound grows back, when a sink counts as refusing what it is given."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduled_events_exporter.delivery import bound as bound_module
from scheduled_events_exporter.delivery.bound import CEILING_MEMORY, GROW_AFTER, RequestBound
from scheduled_events_exporter.delivery.rejections import STREAK, Rejections

MAX = 4 * 1024 * 1024


def test_a_refusal_without_a_reason_proves_size_only_above_what_passed() -> None:
    bound = RequestBound(MAX)
    assert not bound.proves_size(10_000), "nothing passed yet: busy, not too large"
    bound.accepted(50_000, 0.0)
    assert not bound.proves_size(50_000) and not bound.proves_size(20_000)
    assert bound.proves_size(50_001)


def test_an_unproven_halving_grows_back_to_the_maximum() -> None:
    bound = RequestBound(MAX)
    bound.halve(MAX, 0.0, proven=False)
    bound.halve(MAX, 0.0, proven=False)
    assert bound.current == MAX // 4
    for step in range(10 * GROW_AFTER):
        bound.accepted(bound.current, float(step))
    assert bound.current == MAX


def test_a_proven_size_keeps_the_bound_while_it_is_remembered() -> None:
    bound = RequestBound(MAX)
    bound.halve(1_000_000, 0.0, proven=True)
    for step in range(20):
        bound.accepted(bound.current, float(step))
    assert bound.current == 500_000, "the limit was probed again"
    for step in range(10 * GROW_AFTER):  # remembered no longer: grows back
        bound.accepted(bound.current, CEILING_MEMORY + step)
    assert bound.current == MAX


@given(st.lists(st.tuples(st.sampled_from(["ok", "halve", "proven"]),
                          st.integers(1, 2 * MAX)), max_size=60))
def test_the_bound_stays_between_one_byte_and_its_maximum(steps: list[tuple[str, int]]) -> None:
    bound = RequestBound(MAX)
    for now, (what, size) in enumerate(steps):
        if what == "ok":
            bound.accepted(size, float(now))
        else:
            before = bound.current
            after = bound.halve(size, float(now), proven=what == "proven")
            assert after <= max(1, before // 2) or after <= max(1, size // 2)
        assert 1 <= bound.current <= MAX


def test_a_streak_of_dead_letters_makes_a_sink_refusing_until_a_delivery() -> None:
    watch = Rejections()
    for _ in range(STREAK - 1):
        watch.dead_lettered("HTTP 400")
        assert watch.verdict() == ""
    watch.dead_lettered("HTTP 400")
    assert watch.verdict() == (
        f"the last {STREAK} records were dead-lettered (HTTP 400); failing until the sink "
        "delivers a record (a new one, or a dead letter once redelivered) or the exporter "
        "restarts")
    watch.delivered(0)
    assert watch.verdict(), "nothing delivered: still refusing"
    watch.delivered(3)
    assert watch.verdict() == ""


def test_a_halving_is_whole_bytes_and_never_below_one() -> None:
    bound = RequestBound(MAX)
    assert bound.halve(5, 0.0, proven=False) == 2 and bound.current == 2
    assert isinstance(bound.current, int)
    assert bound.halve(3, 0.0, proven=False) == 1
    assert bound.halve(1, 0.0, proven=False) == 1
    # Half of the bound when the refused request was larger than it.
    bound = RequestBound(MAX)
    bound.halve(1000, 0.0, proven=False)
    assert bound.halve(4000, 0.0, proven=False) == 250


def test_growing_back_counts_accepted_requests_from_the_last_halving(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bound_module, "GROW_AFTER", 3)
    bound = RequestBound(MAX)
    bound.halve(MAX, 0.0, proven=False)
    bound.accepted(10, 1.0)
    bound.accepted(10, 2.0)
    bound.halve(MAX // 2, 3.0, proven=False)  # the count starts again
    assert bound.current == MAX // 4
    bound.accepted(10, 4.0)
    bound.accepted(10, 5.0)
    assert bound.current == MAX // 4
    bound.accepted(10, 6.0)
    assert bound.current == MAX // 2
    bound.accepted(10, 7.0)
    bound.accepted(10, 8.0)
    assert bound.current == MAX // 2, "the count starts again after growing"
    bound.accepted(10, 9.0)
    assert bound.current == MAX


def test_each_accepted_request_doubles_a_halved_bound_and_a_given_bound_is_kept() -> None:
    bound = RequestBound(MAX)
    bound.halve(MAX // 2, 0.0, proven=False)
    assert bound.current == MAX // 4
    bound.accepted(10, 1.0)
    assert bound.current == MAX // 2
    assert RequestBound(MAX, current=1).current == 1
    assert RequestBound(MAX, current=0).current == MAX


def test_a_proven_limit_is_remembered_for_exactly_its_time() -> None:
    bound = RequestBound(MAX)
    bound.halve(MAX, 5.0, proven=True)
    bound.accepted(10, 5.0 + CEILING_MEMORY - 0.001)
    assert bound.current == MAX // 2
    bound.accepted(10, 5.0 + CEILING_MEMORY)
    assert bound.current == MAX


def test_the_smallest_accepted_request_counts_for_proof() -> None:
    bound = RequestBound(MAX)
    bound.accepted(1, 0.0)
    assert bound.proves_size(2) and not bound.proves_size(1)


def test_a_streak_without_a_status_says_refused() -> None:
    watch = Rejections()
    for _ in range(STREAK):
        watch.dead_lettered("")
    assert watch.verdict().startswith(
        f"the last {STREAK} records were dead-lettered (refused); failing until")


def test_a_delivery_ends_the_streak() -> None:
    watch = Rejections()
    watch.delivered(20)
    for _ in range(STREAK - 1):
        watch.dead_lettered("HTTP 400")
    watch.delivered(1)
    watch.dead_lettered("HTTP 400")
    assert watch.verdict() == ""
