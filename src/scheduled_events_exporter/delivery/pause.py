"""A peer's pause: the one clock that says when the next request may go to it.

A collector that answers 429 with ``Retry-After``, or ``UNAVAILABLE`` with ``RetryInfo``, asks
for a pause; so does our own backoff after a failure. A pause is a *deadline*: until it passes,
nothing is sent to that peer, whatever arrives in the meantime (a new record, a metric export).
Before this was one object, the worker's wait ended on any new record and a requested 8 s pause
became 3 s (docs/otlp-conformance.md, "Throttling").

One :class:`Pause` per peer, shared by everything that sends to it (a sink's delivery worker
and, when both signals go to the same endpoint, its metric exporter), so there is one clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

#: The longest a peer's requested delay (Retry-After, RetryInfo) is believed; a longer one is
#: waited for this long, then the request is tried again. The one cap of the OTLP and Event
#: Hubs routes (the transports hand the delay over as the peer said it).
RETRY_AFTER_CAP = 60.0


class Pause:
    """When the next request to one peer may go (monotonic seconds)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._until = -float("inf")
        # The seconds the peer asked for, when the deadline in force is that request (0 when
        # it is our own backoff): what a stop that could not wait for it says.
        self._asked = 0.0

    def hold(self, seconds: float, *, asked: bool = False) -> float:
        """Send nothing for ``seconds`` from now (at most :data:`RETRY_AFTER_CAP`); a longer
        pause already running is kept. ``asked``: the peer asked for this pause (Retry-After,
        RetryInfo), rather than our backoff chose it. Returns the deadline."""
        with self._lock:
            held = min(max(0.0, seconds), RETRY_AFTER_CAP)
            until = self._clock() + held
            if until > self._until:
                self._until = until
                self._asked = held if asked else 0.0
            return self._until

    def asked(self) -> float:
        """The seconds the peer asked for, while the pause in force is that request; 0 when it
        is our backoff, or no pause runs."""
        with self._lock:
            return self._asked if self._until > self._clock() else 0.0

    def remaining(self) -> float:
        """Seconds until requests may go again (0 when they may now)."""
        with self._lock:
            until = self._until
        return max(0.0, until - self._clock())

    @property
    def until(self) -> float:
        """The deadline (monotonic seconds; minus infinity when none was ever set)."""
        with self._lock:
            return self._until
