"""The delivery worker every sink uses: an ordered, bounded queue drained by one thread.

Records are delivered in order and acknowledged only when the sink's ``deliver`` returns. What
happens on a failure depends on its :class:`FailureKind` (the OpenTelemetry Collector's rule:
transient errors are retried, permanent ones are not):

* transient (429, 502-504, other 5xx, timeouts, connection refused, the hub's retriable errors,
  a refusal that gives no reason): the records stay queued and are retried after a capped
  exponential backoff with jitter, or after the pause the peer asked for if longer; nothing is
  lost;
* configuration (401/403 authentication, 404 endpoint): retried the same way, logged as an
  error at the start of the streak and every few minutes, and ``/readyz`` fails at once;
* permanent (other 4xx, a message too large for the hub): a batch is re-sent one record at a
  time to find the culprit; a record rejected on its own goes to the dead-letter file
  (:mod:`.dead_letter`), is counted and logged, and the worker goes on with the next one;
* too large, on proof (OTLP's 413, gRPC's own "message larger than max", or a refusal without a
  reason of a request larger than any the peer accepted, :mod:`.bound`): after a backoff the
  worker halves the bytes it puts in one request; the bound grows back after successes. A
  record refused alone with proof of its size (413, "larger than max") is tried once more after
  a backoff, then dead-lettered, so nothing behind it waits; one refused alone on inference only
  is retried as busy (a long overload refuses every halving of a burst too).

Every wait is a deadline on the peer's :class:`~.pause.Pause` (one clock, one cap of
:data:`~.pause.RETRY_AFTER_CAP`, shared with the sink's metric exports): until it passes nothing
is sent, for any record, a new one included; only a stop ends the wait early. This worker is the
only retry path.

The SDK's own ``BatchLogRecordProcessor`` cannot do this: it drops a batch whose export failed
and reports nothing, which would lose exactly the record an SRE needs after an outage.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from scheduled_events_exporter import failpoints
from scheduled_events_exporter.codec import UnreadableLine
from scheduled_events_exporter.delivery import dead_letter as letters
from scheduled_events_exporter.delivery.bound import GROW_AFTER, RequestBound
from scheduled_events_exporter.delivery.dead_letter import DeadLetterFile
from scheduled_events_exporter.delivery.outcome import (
    DeliveryError,
    FailureCounter,
    FailureKind,
    SinkStatus,
)
from scheduled_events_exporter.delivery.pause import Pause
from scheduled_events_exporter.delivery.rejections import Rejections
from scheduled_events_exporter.delivery.spool import Spool
from scheduled_events_exporter.records import (
    TransitionRecord,
    approximate_size,
    to_columns,
)
from scheduled_events_exporter.streak import Streak

log = logging.getLogger(__name__)

MAX_BATCH = 256
#: Bytes one export may carry (approximate_size): a few huge records go one at a time.
MAX_BATCH_BYTES = 4 * 1024 * 1024
BACKOFF_START = 0.5
BACKOFF_CAP = 30.0
#: A configuration error (authentication, endpoint) is logged again this often while it lasts.
CONFIG_ERROR_REPEAT = 300.0
#: An idle worker whose spool or dead-letter file could not be written looks again this often.
STORAGE_RETRY = 5.0


@dataclass(frozen=True, slots=True)
class _Queued:
    seq: int
    record: TransitionRecord
    enqueued: float
    #: Approximate bytes it holds (memory and spool line), see ``records.approximate_size``.
    size: int = 0


class DeliveryWorker:
    """Drains submitted records into ``deliver`` on a daemon thread.

    ``payload`` renders a record as the sink would send it, for the dead-letter file.
    """

    def __init__(
        self,
        name: str,
        deliver: Callable[[Sequence[TransitionRecord]], None],
        count_failure: FailureCounter,
        *,
        max_records: int,
        max_bytes: int = 1 << 62,
        spool: Spool | None = None,
        dead_letter: DeadLetterFile | None = None,
        payload: Callable[[TransitionRecord], object] = to_columns,
        clock: Callable[[], float] = time.monotonic,
        backoff: tuple[float, float] = (BACKOFF_START, BACKOFF_CAP),
        pause: Pause | None = None,
    ) -> None:
        """``pause``: the peer's pause, shared with whatever else sends to it (one is made
        when none is given)."""
        self.name = name
        #: (first, longest) wait between two attempts after a failure.
        self._backoff = backoff
        self._deliver = deliver
        self._count_failure = count_failure
        self._max = max_records
        self._max_bytes = max_bytes
        self._bytes = 0
        self._clock = clock
        self._pause = pause if pause is not None else Pause(clock)
        self._bound = RequestBound(MAX_BATCH_BYTES)
        self._rejections = Rejections()
        self._spool = spool
        self._dead_letter = dead_letter
        self._payload = payload
        self._queue: deque[_Queued] = deque()
        self._cond = threading.Condition()
        self._seq = 0
        self._stopping = False
        # Failed deliveries in a row (said at the first), and the configuration errors among
        # them (said again every CONFIG_ERROR_REPEAT seconds while they last): streak.py.
        self._failing = Streak(clock=clock)
        self._misconfigured = Streak(clock=clock)
        self._last_error = ""
        self._config_error = ""
        self._dropped = 0
        # When the oldest record dropped since the last delivery was queued: a spool that
        # overflows must not make a sink that delivers nothing look as if its backlog were new.
        self._dropped_since: float | None = None
        self._dead_lettered = 0
        # Set while queued records are missing from the spool (its disk was full or read-only);
        # the next successful append writes them too.
        self._spool_behind = False
        self._spool_lock = threading.Lock()
        # Highest sequence number delivered or dropped: what the ack cursor should say.
        self._acked_wanted = 0
        self._thread = threading.Thread(target=self._run, name=f"sink-{name}", daemon=True)

    def start(self) -> None:
        """Load what the spool still holds from before a restart, then start the thread."""
        if self._spool is not None:
            waiting = self._spool.load(self._reject_unreadable)
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

    def recover(self, outbox: Sequence[TransitionRecord],
                unreadable: Sequence[UnreadableLine] = ()) -> None:
        """After :meth:`start`, what the state file's outbox holds: records committed just
        before a crash may not have reached the spool (appended now, idempotent by sequence
        number), and entries this release cannot read go to the dead-letter file unless this
        sink's spool already has their sequence number (its own copy is handled there)."""
        for line in unreadable:
            if line.seq is not None and line.seq <= self._seq:
                continue
            try:
                self._reject_unreadable(line, "the state file's outbox")
            except OSError as exc:  # the watch said why; the entry is at least in this line
                log.error("sink %s: outbox entry (seq %s) not kept (%s): %s", self.name,
                          line.seq, exc, letters.unreadable(self.name, line.seq, line.content,
                                                            line.reason).to_json().decode()
                          .rstrip()[:65536])
        self._enqueue(outbox, durable=True)

    def _enqueue(self, records: Sequence[TransitionRecord], *, durable: bool) -> None:
        # Idempotent by sequence number: the start-up outbox repair may offer records again.
        records = [r for r in records if r.seq > self._seq]
        if not records:
            return
        if durable:
            # Still delivered from memory if this fails; only a crash before delivery, while
            # the disk stays unwritable, could lose them.
            self._write_spool(records)
        now = self._clock()
        dropped: list[_Queued] = []
        with self._cond:
            for record in records:
                self._seq = record.seq
                size = approximate_size(record)
                self._queue.append(_Queued(record.seq, record, now, size))
                self._bytes += size
            # Bounded by count and by bytes (one IMDS-controlled 4 MB event changing every poll
            # must not grow memory and disk without end); the newest record always stays.
            while len(self._queue) > 1 and (len(self._queue) > self._max
                                            or self._bytes > self._max_bytes):
                oldest = self._queue.popleft()
                self._bytes -= oldest.size
                dropped.append(oldest)
            self._dropped += len(dropped)
            if dropped and self._dropped_since is None:
                self._dropped_since = dropped[0].enqueued
            self._cond.notify_all()
        if dropped:
            self._ack(dropped[-1].seq)
            log.error(
                "sink %s: spool full (%d records or %d bytes at most), dropped the %d oldest",
                self.name,
                self._max,
                self._max_bytes,
                len(dropped),
            )
            self._count_failure(self.name, "logs", len(dropped))

    def _write_spool(self, records: Sequence[TransitionRecord]) -> None:
        """Append ``records`` to the spool, and any queued ones a failed append left out."""
        if self._spool is None:
            return
        with self._spool_lock:
            if not records and not self._spool_behind:
                return
            behind: list[TransitionRecord] = []
            if self._spool_behind:
                with self._cond:
                    behind = [q.record for q in self._queue]
            try:
                # The spool skips what it already has (by sequence number), so order is kept.
                self._spool.append([*behind, *records])
            except OSError:  # logged once per streak by the spool's watch
                self._spool_behind = True
                self._count_failure(self.name, "spool", 1)
                return
            self._spool_behind = False

    def _ack(self, seq: int) -> None:
        self._acked_wanted = max(self._acked_wanted, seq)
        if self._spool is None:
            return
        # Logged once per streak by the spool's watch; a stale cursor only repeats records.
        with contextlib.suppress(OSError):
            self._spool.ack(seq)

    def flush(self, timeout: float) -> bool:
        """Wait until everything submitted so far is delivered (or ``timeout`` passes)."""
        deadline = self._clock() + timeout
        with self._cond:
            # The worker looks at its pause again (a wake-up never shortens a pause: the
            # worker checks the deadline each time; a test clock may have moved past it).
            self._cond.notify_all()
            target = self._seq
            while self._queue and self._queue[0].seq <= target:
                remaining = deadline - self._clock()
                # Nothing may go before the peer's pause ends: no use waiting past it.
                if remaining <= 0 or self._pause.remaining() >= remaining:
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
        """Pending count, oldest wait, failure streak, dead letters and unwritable files."""
        faults = tuple(
            f for f in (
                self._spool.fault if self._spool else None,
                self._dead_letter.fault if self._dead_letter else None,
            ) if f is not None
        )
        with self._cond:
            since = [self._queue[0].enqueued] if self._queue else []
            if since and self._dropped_since is not None:
                since.append(self._dropped_since)
            oldest = self._clock() - min(since) if since else 0.0
            return SinkStatus(
                self.name,
                len(self._queue),
                oldest,
                self._failing.count,
                self._last_error,
                self._dropped,
                self._seq,
                dead_lettered=self._dead_lettered,
                config_error=self._config_error,
                write_faults=faults,
                rejecting=self._rejections.verdict(),
                request_bytes=self._bound.current,
                max_request_bytes=self._bound.maximum,
                paused_for=self._pause.remaining() if self._queue else 0.0,
                # (An int read, no lock: the spool's appends run on the submitting thread.)
                spooled_seq=self._spool.last_seq if self._spool is not None else self._seq,
            )

    def _run(self) -> None:
        first_wait, longest_wait = self._backoff
        backoff = first_wait
        # While records up to this sequence number are in the queue, send them one at a time:
        # a batch containing them was rejected permanently and the culprit is not known yet.
        isolate_until = 0
        # A record refused for its size on its own once already: the next refusal, after a
        # backoff, dead-letters it.
        refused_alone: int | None = None
        # In this streak of failures the peer refused, without a reason, a request no larger
        # than one it accepted: it is busy, and a larger request refused meanwhile (the
        # records queued during the overload) proves nothing about size.
        busy = False
        while True:
            with self._cond:
                while not self._stopping:
                    if not self._queue:
                        if self._storage_faulty():  # idle, but a file to repair: look again
                            self._cond.wait(STORAGE_RETRY)
                            break
                        self._cond.wait()
                        continue
                    left = self._pause.remaining()
                    if left <= 0:
                        break
                    # A deadline: a new record (notify) does not end it, a stop does.
                    self._cond.wait(left)
                if self._stopping:
                    return
                size = 1 if self._queue and self._queue[0].seq <= isolate_until else MAX_BATCH
                batch: list[_Queued] = []
                held = 0
                for queued in self._queue:  # by count and by bytes: encoding copies a batch
                    if batch and (len(batch) >= size
                                  or held + queued.size > self._bound.current):
                        break
                    batch.append(queued)
                    held += queued.size
            if self._storage_faulty():
                self._repair_storage()  # the disk may be writable again
            if not batch:
                continue
            try:
                self._deliver([q.record for q in batch])
            except Exception as exc:  # any sink failure must keep the records, never kill us
                error = exc if isinstance(exc, DeliveryError) else DeliveryError(
                    f"{type(exc).__name__}: {exc}")
                kind, proven = error.kind, error.kind is FailureKind.TOO_LARGE
                if kind is FailureKind.EXHAUSTED:
                    busy = busy or not self._bound.proves_size(held)
                    kind = FailureKind.TRANSIENT if busy else FailureKind.TOO_LARGE
                if kind is FailureKind.PERMANENT:
                    if len(batch) > 1:
                        isolate_until = batch[-1].seq
                        log.warning("sink %s: a batch of %d records was rejected (%s); "
                                    "sending them one at a time to find the culprit",
                                    self.name, len(batch), error.status or error)
                    else:
                        self._reject(batch[0], error)
                    continue
                if kind is FailureKind.TOO_LARGE and len(batch) > 1:
                    bound = self._bound.halve(held, self._clock(), proven)
                    log.warning("sink %s: a request of %d records (about %d bytes) was refused "
                                "for its size (%s); after a pause, at most about %d bytes per "
                                "request (growing back after %d accepted in a row)", self.name,
                                len(batch), held, error.status or error, bound, GROW_AFTER)
                elif kind is FailureKind.TOO_LARGE and (not proven
                                                         or self._bound.largest_accepted >= held):
                    # Alone, and only our inference says size (a busy collector refuses the
                    # halved requests of a burst just the same), or no larger than what passed
                    # before: never dead-lettered for that; retried as busy.
                    self._note_failure(error)
                elif kind is FailureKind.TOO_LARGE and refused_alone == batch[0].seq:
                    refused_alone = None
                    self._reject(batch[0], error)
                    continue
                elif kind is FailureKind.TOO_LARGE:
                    refused_alone = batch[0].seq
                    log.warning("sink %s: the record of seq %d (about %d bytes) was refused "
                                "for its size on its own (%s); trying it once more after a "
                                "pause before it goes to the dead-letter file", self.name,
                                batch[0].seq, held, error.status or error)
                else:
                    self._note_failure(error)
                requested = error.retry_after or 0.0
                # A failed export leaves reference cycles (exception, traceback, frames) that
                # hold its encoded request; the cyclic GC counts objects, not bytes, so with a
                # few huge records they would pile up for minutes. Failures are rare and slow.
                del error, exc
                gc.collect()
                # Full jitter keeps a fleet that lost its collector together from retrying in
                # lockstep; a peer that said how long to wait is believed (capped by Pause).
                self._pause.hold(max(backoff * (0.5 + random.random() / 2), requested))
                backoff = min(backoff * 2, longest_wait)
                continue
            backoff = first_wait
            refused_alone = None
            busy = False
            self._bound.accepted(held, self._clock())
            with self._cond:
                self._rejections.delivered(len(batch))
            last = batch[-1].seq
            failpoints.hit("after_deliver")
            self._ack(last)
            self._done(last)

    def _storage_faulty(self) -> bool:
        spool_faulty = self._spool is not None and (self._spool_behind or bool(self._spool.fault))
        return spool_faulty or bool(self._dead_letter and self._dead_letter.fault)

    def _repair_storage(self) -> None:
        """Retry what a full or read-only disk refused: the records the spool is missing, then
        a plain write of the ack cursor (so the fault clears even when nothing waits)."""
        if self._spool is not None:
            if self._spool_behind:
                self._write_spool(())
            if not self._spool_behind and self._spool.fault is not None:
                with contextlib.suppress(OSError):  # still failing: the watch keeps the fault
                    self._spool.probe(self._acked_wanted)
        if self._dead_letter is not None:
            self._dead_letter.probe()

    def _done(self, last: int) -> None:
        """Records up to ``last`` left the queue (delivered or dead-lettered)."""
        with self._cond:
            while self._queue and self._queue[0].seq <= last:
                self._bytes -= self._queue.popleft().size
            self._dropped_since = None
            ended = self._failing.clear()
            if ended is not None:
                log.warning("sink %s: delivering again after %d failed attempts", self.name,
                            ended.count)
            self._misconfigured.clear()
            self._last_error = ""
            self._config_error = ""
            self._cond.notify_all()

    def _note_failure(self, error: DeliveryError) -> None:
        message = str(error)[:300]
        config = error.kind is FailureKind.CONFIG
        with self._cond:
            first = self._failing.hit()
            self._last_error = message
            self._config_error = message if config else ""
            loud = config and self._misconfigured.hit(repeat_after=CONFIG_ERROR_REPEAT)
        if loud:
            log.error("sink %s: %s; nothing will be delivered until this is fixed "
                      "(records are kept and retried)", self.name, message)
        elif first:
            log.error("sink %s: delivery failed, will retry: %s", self.name, message)
        self._count_failure(self.name, "logs", 1)

    def _reject(self, queued: _Queued, error: DeliveryError) -> None:
        """Dead-letter one record the sink will never accept, and go on with the next."""
        record = queued.record
        letter = letters.rejected(self.name, record, error.status or "rejected", str(error),
                                      self._payload)
        where = f"not kept (SEE_STATE_DIR is disabled): {letter.to_json().decode().rstrip()}"
        if self._dead_letter is not None:
            try:
                self._dead_letter.append(letter)
                where = f"moved to {self._dead_letter.path}"
            except OSError:  # the watch logged why; the record is at least in this log line
                where = ("not kept (dead-letter file unwritable): "
                         f"{letter.to_json().decode().rstrip()}")
        log.error("sink %s: %s rejected the record of EventId %s (%s, RecordId %s, about %d "
                  "bytes) permanently: %s; %s; continuing with the next record",
                  self.name, error.status or "the sink", letter.event_id or "(none)",
                  letter.transition, record.record_id, queued.size, str(error)[:300], where)
        self._count_dead_letter()
        with self._cond:
            self._rejections.dead_lettered(error.status or "rejected")
        self._ack(queued.seq)
        self._done(queued.seq)

    def _reject_unreadable(self, line: UnreadableLine, source: str = "the spool") -> None:
        """Dead-letter an entry of ``source`` this release cannot read (written by another
        release, or damaged): kept for a person, never dropped. ``OSError`` when it cannot be
        kept."""
        if self._dead_letter is None:
            raise OSError("no dead-letter file (SEE_STATE_DIR is disabled)")
        letter = letters.unreadable(self.name, line.seq, line.content, line.reason, source)
        self._dead_letter.append(letter)  # OSError: logged by its watch; the line stays
        log.error("sink %s: %s holds an entry (seq %s, EventId %s) this release cannot read "
                  "(%s); moved to %s", self.name, source, letter.seq,
                  letter.event_id or "unknown", line.reason[:300], self._dead_letter.path)
        self._count_dead_letter()

    def _count_dead_letter(self) -> None:
        with self._cond:
            self._dead_lettered += 1
        self._count_failure(self.name, "dead_letter", 1)
