"""How many bytes one request to a peer may carry, learned from its answers (pure).

A collector that refuses a request for its size gets smaller ones: the bound is halved. But a
refusal is proof of size only when it says so (HTTP 413, gRPC's own "message larger than max"),
or when the collector refuses a request larger than one it has accepted before; a refusal that
says neither (gRPC ``RESOURCE_EXHAUSTED`` without ``RetryInfo``: a memory limiter, a quota) may
just mean "busy", and is retried as it is. After an overload the bound grows back: it doubles
after every :data:`GROW_AFTER` accepted requests, up to its maximum, so a two-second overload
does not leave every later request carrying one record until the next restart. After a refusal
with proof of size (a real limit, which is configuration, not weather) the bound stays where the
halving put it for :data:`CEILING_MEMORY` seconds, so the limit is learnt once rather than
probed again every few requests.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Accepted requests in a row after which a halved bound doubles again: every one, as the
#: halving was inferred (an overload, most often) or its proof is no longer remembered.
GROW_AFTER = 1
#: How long a refusal with proof of size keeps the bound from growing (seconds).
CEILING_MEMORY = 600.0


@dataclass
class RequestBound:
    """The current bound (bytes, ``records.approximate_size``) of one peer's requests."""

    maximum: int
    current: int = 0
    #: The largest request the peer accepted (0: none yet).
    largest_accepted: int = 0
    successes: int = 0
    #: Until when (monotonic seconds) a refusal with proof of size keeps the bound as it is.
    frozen_until: float = -float("inf")

    def __post_init__(self) -> None:
        if self.current <= 0:
            self.current = self.maximum

    def accepted(self, size: int, now: float) -> None:
        """A request of ``size`` bytes passed; every :data:`GROW_AFTER` in a row double a
        halved bound (not while a refusal with proof of size is remembered)."""
        self.largest_accepted = max(self.largest_accepted, size)
        if self.current >= self.maximum or now < self.frozen_until:
            return
        self.successes += 1
        if self.successes >= GROW_AFTER:
            self.current = min(self.maximum, self.current * 2)
            self.successes = 0

    def halve(self, size: int, now: float, proven: bool) -> int:
        """A request of ``size`` bytes was refused for its size (``proven``: the answer said
        so, rather than our inference from sizes that passed): from now on at most half of it
        (or of the bound, if smaller). Returns the new bound."""
        self.current = max(1, min(self.current, size) // 2)
        self.successes = 0
        if proven:
            self.frozen_until = now + CEILING_MEMORY
        return self.current

    def proves_size(self, size: int) -> bool:
        """Whether a refusal that gives no reason, of a request of ``size`` bytes, shows that
        it is too large: the peer accepted a smaller request before, and none this large."""
        return 0 < self.largest_accepted < size
