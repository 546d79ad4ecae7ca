"""Say a run of the same trouble once, not once per occurrence.

An exporter polls every second and retries every few: a collector that is down, a full disk or
an IMDS answering 410 would otherwise write the same line sixty times a minute. Every place
that reports a condition that can last (IMDS outcomes, a sink's failures, a metric export, a
file that cannot be written, a poll that crashes) keeps one :class:`Streak`: the first
occurrence is said, the streak's end is said with how long it lasted, and a condition that
needs attention while it lasts is said again now and then.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Run:
    """A streak as it stands, or as it ended: what it was, how often, since when."""

    key: Hashable
    count: int
    #: Monotonic time of its first occurrence.
    since: float


class Streak:
    """Consecutive occurrences of a condition (``key`` tells conditions apart).

    :meth:`hit` is true for the first occurrence of a streak, for the first occurrence of a
    different ``key`` (a new streak), and again when the streak lasts: every ``repeat_count``
    occurrences, or ``repeat_after`` seconds after it was last said. :meth:`clear` ends the
    streak and returns it, once. Thread-safe.
    """

    def __init__(self, *, repeat_count: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._repeat_count = repeat_count
        self._clock = clock
        self._lock = threading.Lock()
        self._run: Run | None = None
        self._said = 0.0

    def hit(self, key: Hashable = True, *, repeat_after: float | None = None) -> bool:
        """Count one occurrence; True when it should be said now."""
        now = self._clock()
        with self._lock:
            run = self._run
            if run is None or run.key != key:
                self._run, self._said = Run(key, 1, now), now
                return True
            self._run = run = Run(key, run.count + 1, run.since)
            due = (self._repeat_count is not None and run.count % self._repeat_count == 0) or (
                repeat_after is not None and now - self._said >= repeat_after)
            if due:
                self._said = now
            return due

    def clear(self) -> Run | None:
        """End the streak: the run that ended (said once), or None if there was none."""
        with self._lock:
            run, self._run = self._run, None
        return run

    @property
    def current(self) -> Run | None:
        """The streak under way, if any."""
        return self._run

    @property
    def count(self) -> int:
        """Occurrences so far in the streak under way (0 without one)."""
        run = self._run
        return run.count if run is not None else 0
