"""A metric reader that exports when the metrics changed, and otherwise on a heartbeat.

Most of an exporter's life is idle: the SDK's ``PeriodicExportingMetricReader`` on its own
would export the same "nothing happened" snapshot every interval, and would still leave a
change waiting up to a whole interval. This reader is that SDK reader with no interval of its
own (collection, aggregation, temporality and one export at a time stay the SDK's) and a
thread that calls its public ``collect``

* soon after :meth:`OnChangeMetricReader.metrics_changed` (the poll loop calls it, without
  blocking, after a poll that produced transitions or changed the pending set), but never
  sooner than ``min_gap`` after the previous export, so a document changing every second costs
  one export per ``min_gap``, not one per poll;
* otherwise ``heartbeat`` seconds after the previous export, so consumers can tell a silent
  exporter from an idle one (alerts on silence must allow more than one heartbeat).

Exports run on this reader's thread, never on the poll loop's (shutdown makes the last one).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter, PeriodicExportingMetricReader

log = logging.getLogger(__name__)

#: Shortest time between two exports caused by changes (a change waits at most this long).
MIN_GAP = 2.0


@dataclass
class Cadence:
    """When the next export is due (pure: times are given, monotonic seconds).

    An export is due ``heartbeat`` seconds after the previous one; after :meth:`change`, as
    soon as ``min_gap`` has passed since the previous one (at once after a quiet spell).
    """

    heartbeat: float
    min_gap: float
    next_heartbeat: float
    last_export: float = -float("inf")
    changed: bool = False

    @classmethod
    def starting(cls, now: float, heartbeat: float, min_gap: float) -> Cadence:
        """The cadence of a reader started at ``now`` (its first heartbeat one period on)."""
        return cls(heartbeat, min_gap, now + heartbeat)

    def change(self) -> None:
        """The metrics changed: export soon."""
        self.changed = True

    def due(self) -> float:
        """The time of the next export."""
        if self.changed:
            return min(self.next_heartbeat, self.last_export + self.min_gap)
        return self.next_heartbeat

    def take(self, now: float) -> bool:
        """Whether an export is due at ``now``; if so, the change it answers is consumed (a
        change during the export asks for another)."""
        if now < self.due():
            return False
        self.changed = False
        return True

    def exported(self, at: float) -> None:
        """An export ended at ``at``: the next heartbeat is one period later."""
        self.last_export = at
        self.next_heartbeat = at + self.heartbeat


class OnChangeMetricReader(PeriodicExportingMetricReader):
    """Export on :meth:`metrics_changed` (rate-limited by ``min_gap``) or every ``heartbeat``.

    The SDK's periodic reader with an infinite interval (documented: it then never collects on
    its own) does the exporting: the temporality the exporter prefers, one export at a time.
    This class adds the thread that decides when, through the public ``collect``.
    """

    def __init__(self, exporter: MetricExporter, *, heartbeat: float, min_gap: float = MIN_GAP,
                 export_timeout: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if heartbeat <= 0 or min_gap < 0:
            raise ValueError(f"heartbeat > 0 and min_gap >= 0 expected, got {heartbeat}, {min_gap}")
        super().__init__(exporter, export_interval_millis=math.inf,
                         export_timeout_millis=export_timeout * 1000)
        self.exporter = exporter
        self._timeout_ms = export_timeout * 1000
        self._clock = clock
        self._cond = threading.Condition()
        self._stopping = False
        self._cadence = Cadence.starting(clock(), heartbeat, min_gap)
        self._thread = threading.Thread(target=self._run, name="metrics-reader", daemon=True)
        self._thread.start()

    def metrics_changed(self) -> None:
        """Ask for an export soon (within ``min_gap``). Returns at once; safe from any thread."""
        with self._cond:
            self._cadence.change()
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self._cadence.take(now := self._clock()):
                    self._cond.wait(self._cadence.due() - now)
                if self._stopping:
                    return
            self._collect_now(self._timeout_ms)
            with self._cond:
                self._cadence.exported(self._clock())

    def _collect_now(self, timeout_ms: float) -> None:
        try:
            self.collect(timeout_millis=timeout_ms)
        except Exception as exc:  # neither the heartbeat nor shutdown may die of it
            log.warning("metric collection failed: %s", str(exc).splitlines()[0][:200]
                        if str(exc) else type(exc).__name__)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        """Stop the thread, make one last export (latest counters), shut the exporter down."""
        ends = time.monotonic() + timeout_millis / 1000
        with self._cond:
            if self._stopping:
                return
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=max(0.0, ends - time.monotonic()))
        left_ms = max(0.0, ends - time.monotonic()) * 1000
        if left_ms > 0 and not self._thread.is_alive():  # else an export is stuck: skip ours
            # Our exporters send once within the timeout they are given: the last export
            # takes what is left and no more (a stop must fit the container's).
            self._collect_now(left_ms)
        super().shutdown(timeout_millis=max(0.0, ends - time.monotonic()) * 1000)
