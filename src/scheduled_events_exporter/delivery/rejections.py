"""Whether a sink refuses what it is given (pure): the local signal of a collector that answers
every request with a permanent error.

Such a sink delivers nothing, yet it never looks stuck: each refused record goes to the
dead-letter file at once and its queue stays empty. Its own metric
(``export.failures{signal=dead_letter}``) travels to that same refusing collector. So the worker
notes every record's fate here, and ``/readyz`` calls the sink failing while the last
:data:`STREAK` records were all dead-lettered, or more than :data:`SHARE` of those in the last
:data:`WINDOW` seconds (at least :data:`STREAK` of them).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

#: Dead-lettered records in a row that make a sink failing.
STREAK = 5
#: Or: this share of the records that left the queue in the window, at least STREAK of them.
SHARE = 0.5
WINDOW = 600.0


@dataclass
class Rejections:
    """The recent fate of one sink's records (times are monotonic seconds)."""

    streak: int = 0
    last_status: str = ""
    #: (time, dead-lettered?) per record, the window's worth.
    recent: deque[tuple[float, bool]] = field(default_factory=deque)

    def delivered(self, count: int, now: float) -> None:
        """``count`` records were accepted."""
        self.streak = 0
        self.recent.extend((now, False) for _ in range(count))
        self._trim(now)

    def dead_lettered(self, status: str, now: float) -> None:
        """One record was refused for good (``status``: what the peer answered)."""
        self.streak += 1
        self.last_status = status
        self.recent.append((now, True))
        self._trim(now)

    def verdict(self, now: float) -> str:
        """Why the sink counts as failing, or ``""``."""
        self._trim(now)
        if self.streak >= STREAK:
            return (f"the last {self.streak} records were dead-lettered "
                    f"({self.last_status or 'refused'})")
        dead = sum(1 for _, refused in self.recent if refused)
        if dead >= STREAK and dead > SHARE * len(self.recent):
            return (f"{dead} of the last {len(self.recent)} records in {WINDOW / 60:.0f} min "
                    f"were dead-lettered ({self.last_status or 'refused'})")
        return ""

    def _trim(self, now: float) -> None:
        while self.recent and self.recent[0][0] < now - WINDOW:
            self.recent.popleft()
        while len(self.recent) > 10_000:  # a bound whatever the rate
            self.recent.popleft()
