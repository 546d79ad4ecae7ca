"""The delivery worker every sink uses: an ordered, bounded queue drained by one thread.

Records are delivered in order and acknowledged only when the sink's ``deliver`` returns; a
failure keeps them queued and retries with capped exponential backoff. The SDK's own
``BatchLogRecordProcessor`` cannot do this: it drops a batch whose export failed and reports
nothing, which would lose exactly the record an SRE needs after an outage.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import Resource

from scheduled_events_exporter import failpoints
from scheduled_events_exporter.config import Config
from scheduled_events_exporter.records import TransitionRecord
from scheduled_events_exporter.sinks.base import (
    ExtraMetrics,
    FailureCounter,
    SinkStatus,
    open_spool,
)
from scheduled_events_exporter.spool import Spool

log = logging.getLogger(__name__)

MAX_BATCH = 256
BACKOFF_START = 0.5
BACKOFF_CAP = 30.0


class DeliveryError(Exception):
    """A sink could not deliver a batch; the message is safe to log (no secrets)."""


@dataclass(frozen=True, slots=True)
class _Queued:
    seq: int
    record: TransitionRecord
    enqueued: float


class DeliveryWorker:
    """Drains submitted records into ``deliver`` on a daemon thread."""

    def __init__(
        self,
        name: str,
        deliver: Callable[[Sequence[TransitionRecord]], None],
        count_failure: FailureCounter,
        *,
        max_records: int,
        spool: Spool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self._deliver = deliver
        self._count_failure = count_failure
        self._max = max_records
        self._clock = clock
        self._spool = spool
        self._queue: deque[_Queued] = deque()
        self._cond = threading.Condition()
        self._seq = 0
        self._stopping = False
        self._failures = 0
        self._last_error = ""
        self._dropped = 0
        self._thread = threading.Thread(target=self._run, name=f"sink-{name}", daemon=True)

    def start(self) -> None:
        """Load what the spool still holds from before a restart, then start the thread."""
        if self._spool is not None:
            waiting = self._spool.load()
            if waiting:
                log.info(
                    "sink %s: %d undelivered records from before the restart",
                    self.name,
                    len(waiting),
                )
            self._enqueue(waiting, durable=False)
            # Records up to here were delivered before the restart: never queue them again.
            self._seq = max(self._seq, self._spool.last_seq)
        self._thread.start()

    def submit(self, records: Sequence[TransitionRecord]) -> None:
        """Queue records without blocking on I/O; past the bound the oldest are dropped, counted."""
        self._enqueue(records, durable=True)

    def _enqueue(self, records: Sequence[TransitionRecord], *, durable: bool) -> None:
        # Idempotent by sequence number: the start-up outbox repair may offer records again.
        records = [r for r in records if r.seq > self._seq]
        if not records:
            return
        if durable and self._spool is not None:
            try:
                self._spool.append(records)
            except OSError as exc:
                # Still delivered from memory; only a crash before delivery could lose them.
                log.error(
                    "sink %s: cannot write the spool (%s); holding records in memory",
                    self.name,
                    exc,
                )
                self._count_failure(self.name, "spool", 1)
        now = self._clock()
        dropped: list[_Queued] = []
        with self._cond:
            for record in records:
                self._seq = record.seq
                self._queue.append(_Queued(record.seq, record, now))
            while len(self._queue) > self._max:
                dropped.append(self._queue.popleft())
            self._dropped += len(dropped)
            self._cond.notify_all()
        if dropped:
            self._ack(dropped[-1].seq)
            log.error(
                "sink %s: spool full (%d records), dropped the %d oldest",
                self.name,
                self._max,
                len(dropped),
            )
            self._count_failure(self.name, "logs", len(dropped))

    def _ack(self, seq: int) -> None:
        if self._spool is None:
            return
        try:
            self._spool.ack(seq)
        except OSError as exc:  # the records were delivered; a stale cursor only repeats them
            log.error("sink %s: cannot record delivery in the spool (%s)", self.name, exc)

    def flush(self, timeout: float) -> bool:
        """Wait until everything submitted so far is delivered (or ``timeout`` passes)."""
        deadline = self._clock() + timeout
        with self._cond:
            target = self._seq
            while self._queue and self._queue[0].seq <= target:
                remaining = deadline - self._clock()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    def stop(self, timeout: float) -> bool:
        """Deliver what is queued within ``timeout``, then stop. True if nothing was left."""
        delivered = self.flush(timeout)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=0.5)
        return delivered

    def status(self) -> SinkStatus:
        """Pending count, oldest wait and failure streak."""
        with self._cond:
            oldest = self._clock() - self._queue[0].enqueued if self._queue else 0.0
            return SinkStatus(
                self.name,
                len(self._queue),
                oldest,
                self._failures,
                self._last_error,
                self._dropped,
                self._seq,
            )

    def _run(self) -> None:
        backoff = BACKOFF_START
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                batch = [q for _, q in zip(range(MAX_BATCH), self._queue, strict=False)]
            try:
                self._deliver([q.record for q in batch])
            except Exception as exc:  # any sink failure must keep the records, never kill us
                message = (
                    str(exc) if isinstance(exc, DeliveryError) else f"{type(exc).__name__}: {exc}"
                )
                with self._cond:
                    self._failures += 1
                    first = self._failures == 1
                    self._last_error = message[:300]
                if first:
                    log.error("sink %s: delivery failed, will retry: %s", self.name, message[:300])
                self._count_failure(self.name, "logs", 1)
                with self._cond:
                    # Full jitter keeps a fleet that lost its collector together from retrying
                    # in lockstep; the wait ends early on stop.
                    self._cond.wait(backoff * (0.5 + random.random() / 2))
                    if self._stopping:
                        return
                backoff = min(backoff * 2, BACKOFF_CAP)
                continue
            backoff = BACKOFF_START
            last = batch[-1].seq
            failpoints.hit("after_deliver")
            self._ack(last)
            with self._cond:
                while self._queue and self._queue[0].seq <= last:
                    self._queue.popleft()
                if self._failures:
                    log.warning(
                        "sink %s: delivering again after %d failed attempts",
                        self.name,
                        self._failures,
                    )
                self._failures = 0
                self._last_error = ""
                self._cond.notify_all()


class WorkerSink:
    """Base of the sinks: everything but ``_deliver`` goes through one :class:`DeliveryWorker`.

    Subclasses set ``name``, implement ``_deliver`` (raise on failure; the worker retries) and
    may add metric readers or a ``_close`` step.
    """

    name = ""

    def __init__(self, config: Config, count_failure: FailureCounter) -> None:
        self._resource = Resource.create({})
        self._extra_metrics: ExtraMetrics = list
        self._worker = DeliveryWorker(self.name, self._deliver, count_failure,
                                      max_records=config.spool_max_records,
                                      spool=open_spool(config, self.name))

    def metric_readers(self) -> Sequence[MetricReader]:
        """No metrics unless the sink adds a reader."""
        return ()

    def start(self, resource: Resource, extra_metrics: ExtraMetrics = list) -> None:
        """Start the worker; ``resource`` describes this VM, ``extra_metrics`` adds metrics
        built at export time to this sink's metric exports."""
        self._resource = resource
        self._extra_metrics = extra_metrics
        self._worker.start()

    def submit(self, records: Sequence[TransitionRecord]) -> None:
        """Queue records for delivery (durably when a spool is configured)."""
        self._worker.submit(records)

    def flush(self, timeout: float) -> bool:
        """Wait until queued records are delivered."""
        return self._worker.flush(timeout)

    def shutdown(self, timeout: float) -> bool:
        """Deliver what is queued within ``timeout``, then release the sink's resources."""
        done = self._worker.stop(timeout)
        self._close()
        return done

    def status(self) -> SinkStatus:
        """Delivery health."""
        return self._worker.status()

    def _deliver(self, records: Sequence[TransitionRecord]) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        """Release clients and exporters after the worker stopped."""
