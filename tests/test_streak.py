"""Saying a run of the same trouble once (streak.py, pure, on an injected clock)."""

from __future__ import annotations

from scheduled_events_exporter.streak import Run, Streak


def test_the_first_occurrence_is_said_then_nothing_until_it_ends() -> None:
    now = [100.0]
    streak = Streak(clock=lambda: now[0])
    assert streak.current is None and streak.count == 0 and streak.clear() is None
    assert streak.hit() is True
    now[0] = 105.0
    assert [streak.hit() for _ in range(50)] == [False] * 50
    assert streak.count == 51
    assert streak.clear() == Run(True, 51, 100.0)  # said once, with how long it lasted
    assert streak.clear() is None
    assert streak.hit() is True  # a new streak is said again


def test_another_key_is_another_streak() -> None:
    streak = Streak(clock=lambda: 0.0)
    assert [streak.hit("410"), streak.hit("410"), streak.hit("timeout"), streak.hit("410")] == [
        True, False, True, True]
    assert streak.current == Run("410", 1, 0.0)


def test_a_lasting_streak_is_said_again_every_n_occurrences_or_after_a_while() -> None:
    counted = Streak(repeat_count=60, clock=lambda: 0.0)
    said = [i for i in range(1, 181) if counted.hit()]
    assert said == [1, 60, 120, 180]
    now = [0.0]
    timed = Streak(clock=lambda: now[0])
    times = []
    for second in range(0, 700, 10):
        now[0] = float(second)
        if timed.hit(repeat_after=300.0):
            times.append(second)
    assert times == [0, 300, 600]
    # Without repeat_after a hit never repeats, whatever the time.
    now[0] = 10_000.0
    assert timed.hit() is False
