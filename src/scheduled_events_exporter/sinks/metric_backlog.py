"""Delta metric batches the collector has not accepted yet: oldest first, bounded (pure).

With delta temporality the SDK starts its sums and histograms afresh at every collection, so
the points of an export the collector refused are the only record of their window's counts.
The metric exporter keeps them here, serialized as they were built (each point with its own
start and end), and sends them in order before anything newer once the collector accepts
again. Cumulative points and gauges are never kept: the next collection reads them again.

Memory is bounded by :data:`MAX_BATCHES` and :data:`MAX_BYTES` (serialized bytes, which is
what a batch holds here). Past either, the oldest batches are dropped (their counts are lost,
and the caller counts their points and says so); the newest batch always stays, whatever its
size. Nothing here survives a restart: metrics are not spooled.

Used from the metric reader's export only, which the SDK runs one at a time.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

#: Batches kept at most: a day of exports at the default 60 s heartbeat, or 48 minutes of
#: exports every 2 s (the shortest gap between exports caused by changes).
MAX_BATCHES = 1440
#: Serialized bytes kept at most. A delta batch of this exporter measured 1.4-2.2 KB, about
#: 1 KB of it the resource (the IMDS request counter and duration histogram change at every
#: poll; transitions, notices, failures, approvals when they happen), so the batch bound comes
#: first, near 3 MB; this one holds when a large resource or many label values make batches
#: larger.
MAX_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class KeptBatch:
    """One refused export's delta points, serialized as built."""

    #: A serialized ``ExportMetricsServiceRequest``.
    body: bytes
    #: Data points it holds, and the window they cover (Unix nanoseconds).
    points: int
    start: int
    end: int


class MetricBacklog:
    """Kept batches, oldest first, within ``max_batches`` and ``max_bytes``."""

    def __init__(self, max_batches: int = MAX_BATCHES, max_bytes: int = MAX_BYTES) -> None:
        if max_batches < 1 or max_bytes < 1:
            raise ValueError(f"bounds of at least 1 expected, got {max_batches} batches and "
                             f"{max_bytes} bytes")
        self.max_batches = max_batches
        self.max_bytes = max_bytes
        self._batches: deque[KeptBatch] = deque()
        self._bytes = 0

    def keep(self, batch: KeptBatch) -> list[KeptBatch]:
        """Add ``batch`` after the others; returns the oldest batches dropped to stay within
        the bounds (never ``batch`` itself)."""
        self._batches.append(batch)
        self._bytes += len(batch.body)
        dropped = []
        while len(self._batches) > 1 and (len(self._batches) > self.max_batches
                                          or self._bytes > self.max_bytes):
            dropped.append(self._pop())
        return dropped

    def first(self) -> KeptBatch | None:
        """The oldest batch, the next to send; ``None`` when none is kept."""
        return self._batches[0] if self._batches else None

    def sent(self) -> KeptBatch:
        """Forget the oldest batch (accepted, or refused for good); returns it."""
        return self._pop()

    def _pop(self) -> KeptBatch:
        batch = self._batches.popleft()
        self._bytes -= len(batch.body)
        return batch

    def __len__(self) -> int:
        return len(self._batches)

    @property
    def bytes(self) -> int:
        """Serialized bytes kept."""
        return self._bytes

    @property
    def points(self) -> int:
        """Data points kept."""
        return sum(batch.points for batch in self._batches)
