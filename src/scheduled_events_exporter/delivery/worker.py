"""The delivery worker every sink uses: an ordered, bounded queue drained by one thread.

Records are delivered in order and acknowledged only when the sink's ``deliver`` returns, or
once their dead letter is durable. Each attempt is three steps (:meth:`DeliveryWorker.step`):
the sink's adapter *classifies* the answer into a :class:`FailureKind` (and whether it is one
the protocol calls final but we retry), :func:`.refusal.decide` *decides* from it and the
answers before it (pure, table-tested), and the worker *acts*:

* transient or configuration refusals: the records stay queued and are retried after a capped
  exponential backoff with jitter, or after the pause the peer asked for if longer; a
  configuration error is logged at the start of the streak and every few minutes, and
  ``/readyz`` fails at once;
* permanent refusals: a batch is re-sent one record at a time to find the culprit; a record
  rejected on its own goes to the dead-letter file (:mod:`.dead_letter`), is counted and
  logged, and the worker goes on with the next one. When the file cannot take its letter, the
  record stays in the spool (the cursor below it) until it can;
* too large, on proof or inferred (:mod:`.bound`): the request is halved after a backoff, the
  bound grows back after successes; a record refused alone with proof is tried once more, then
  dead-lettered, whatever passed before;
* a record refused again and again with an answer that may be about it: the record behind it
  probes the peer (:mod:`.refusal` says how, and the bound on the requests a record gets).

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
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace

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
from scheduled_events_exporter.delivery.refusal import (
    Act,
    Answer,
    Decision,
    History,
    Request,
    Why,
    decide,
    next_request,
)
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
#: A refused request at least this large is collected at once (see ``step``).
GC_AFTER_BYTES = 256 * 1024


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
        #: What the answers so far imply (:mod:`.refusal`); the worker's thread only.
        self._history = History()
        self._backoff_now = backoff[0]
        #: Letters of records refused for good that the dead-letter file could not take yet
        #: (seq → letter): the records stay in the spool (the ack cursor below them) until
        #: their letters are written.
        self._unlettered: dict[int, letters.DeadLetter] = {}
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
        self._opened = False
        self._thread = threading.Thread(target=self._run, name=f"sink-{name}", daemon=True)

    def start(self) -> None:
        """:meth:`open`, then start the thread (once: a second call does nothing)."""
        if self._thread.ident is not None:
            return
        self.open()
        self._thread.start()

    def open(self) -> None:
        """Load what the spool still holds from before a restart (once). Without the thread
        (:meth:`start`), :meth:`step` delivers: a test drives the worker one attempt at a
        time."""
        if self._opened:
            return
        self._opened = True
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

    def submit(self, records: Sequence[TransitionRecord]) -> None:
        """Queue records without blocking on I/O; past the bound the oldest are dropped, counted."""
        self._enqueue(records, durable=True)

    def recover(self, outbox: Sequence[TransitionRecord],
                unreadable: Sequence[UnreadableLine] = ()) -> list[UnreadableLine]:
        """After :meth:`start`, what the state file's outbox holds: records committed just
        before a crash may not have reached the spool (appended now, idempotent by sequence
        number), and entries this release cannot read go to the dead-letter file unless this
        sink's spool already has their sequence number (its own copy is handled there).
        Returns the entries whose letters could not be written: the state file keeps them."""
        kept = []
        for line in unreadable:
            if line.seq is not None and line.seq <= self._seq:
                continue
            try:
                self._reject_unreadable(line, "the state file's outbox")
            except OSError as exc:
                if self._dead_letter is None:  # no state file either: the entry is in the line
                    log.error("sink %s: outbox entry (seq %s) not kept (%s): %s", self.name,
                              line.seq, exc, letters.unreadable(
                                  self.name, line.seq, line.content, line.reason
                              ).to_json().decode().rstrip()[:65536])
                    continue
                # The watch said why; the state file keeps the entry until a start can.
                log.error("sink %s: outbox entry (seq %s) not dead-lettered yet (the "
                          "dead-letter file cannot be written): the state file keeps it "
                          "until a start can", self.name, line.seq)
                kept.append(line)
        self._enqueue(outbox, durable=True)
        return kept

    # --- records put back by redeliver (delivery/redrive.py's Target) -------------------------
    @property
    def last_seq(self) -> int:
        """The highest sequence number this sink was given."""
        with self._cond:
            return self._seq

    def append_durably(self, records: Sequence[TransitionRecord]) -> None:
        """Append ``records`` to the spool (fsynced) without queueing them yet; first the
        records a disk fault kept out of it, so the spool never gets a number above one it
        still lacks. ``OSError`` when it cannot (none of ``records`` is then in the spool)."""
        if self._spool is None:
            raise OSError("no spool: SEE_STATE_DIR is empty")
        try:
            with self._spool_lock:
                if self._spool_behind:
                    with self._cond:
                        behind = [q.record for q in self._queue]
                    self._spool.append(behind)  # OSError: still behind; nothing else written
                    self._spool_behind = False
                self._spool.append(records)
        except OSError:
            with self._cond:
                self._cond.notify_all()  # an idle worker starts looking at the fault
            raise

    def unappend(self, seqs: Collection[int]) -> None:
        """Take back lines :meth:`append_durably` wrote (a put-back that could not finish)."""
        if self._spool is not None:
            with self._spool_lock:
                self._spool.remove(seqs)

    def enqueue(self, records: Sequence[TransitionRecord]) -> None:
        """Queue records :meth:`append_durably` made durable."""
        self._enqueue(records, durable=False)

    def settled_seq(self) -> int:
        """Every record given to this sink up to this sequence number is durable in its spool,
        or delivered, or dropped and counted: the state file's outbox need not keep them."""
        with self._cond:
            given = self._seq
        settled = given
        if self._spool is not None and self._spool_behind:
            settled = max(self._spool.last_seq, self._acked_wanted)
        # A record refused for good whose letter is not written may be nowhere else.
        return min([settled, *(seq - 1 for seq in self._unlettered)])

    def storage_faulty(self) -> bool:
        """Whether a file of this sink (spool, dead-letter file) cannot be written now."""
        return self._storage_faulty()

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
                letters_waiting=len(self._unlettered),
                letters_removed=(self._dead_letter.removed_of(self.name)
                                 if self._dead_letter is not None else 0),
                pause_asked=self._pause.asked() if self._queue else 0.0,
                # (An int read, no lock: the spool's appends run on the submitting thread.)
                spooled_seq=self._spool.last_seq if self._spool is not None else self._seq,
            )

    def _run(self) -> None:
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
            self.step()

    def step(self) -> bool:
        """One attempt, if one is due now: repair what a disk fault left, send the next request
        (its shape: :func:`.refusal.next_request`), read the answer, decide
        (:func:`.refusal.decide`) and act. False when nothing was sent (nothing waits, or the
        peer's pause lasts). The worker's thread calls it; a test may call it instead of
        starting the thread."""
        if self._storage_faulty():
            self._repair_storage()  # the disk may be writable again
        with self._cond:
            if self._pause.remaining() > 0:
                return False
            shape = next_request(self._history, [q.seq for q in self._queue])
            if shape is None:
                return False
            batch: list[_Queued] = []
            held = 0
            for queued in self._queue:  # by count and by bytes: encoding copies a batch
                if queued.seq < shape.first or queued.seq in self._history.ahead:
                    continue
                if batch and (shape.alone or len(batch) >= MAX_BATCH
                              or held + queued.size > self._bound.current):
                    break
                batch.append(queued)
                held += queued.size
        request = Request(batch[0].seq, batch[-1].seq, len(batch), held, shape.probe)
        try:
            self._deliver([q.record for q in batch])
        except Exception as exc:  # any sink failure must keep the records, never kill us
            error = exc if isinstance(exc, DeliveryError) else DeliveryError(
                f"{type(exc).__name__}: {exc}")
            del exc
            self._act(batch, request, error, decide(
                self._history, request, Answer(error.kind, self._bound.proves_size(held),
                                               error.suspicious)))
            # A failed export leaves reference cycles (exception, traceback, frames) that
            # hold its encoded request; the cyclic GC counts objects, not bytes, so with a
            # few huge records they would pile up for minutes. Small requests are left to the
            # GC's own pace: a full collection costs tens of milliseconds in a large heap.
            del error
            if held >= GC_AFTER_BYTES:
                gc.collect()
            return True
        self._act(batch, request, None, decide(self._history, request, Answer(None)))
        return True

    def _act(self, batch: list[_Queued], request: Request, error: DeliveryError | None,
             decision: Decision) -> None:
        """Do what ``decision`` says with the records of ``batch``."""
        act, why = decision.act, decision.why
        before = self._history
        self._history = decision.history
        if act is Act.DELIVERED or act is Act.DELIVERED_AHEAD:
            self._backoff_now = self._backoff[0]
            self._bound.accepted(request.size, self._clock())
            with self._cond:
                self._rejections.delivered(len(batch))
            if act is Act.DELIVERED_AHEAD:
                log.warning("sink %s: the record of seq %d, sent alone ahead of seq %d, was "
                            "accepted: seq %d is tried once more, and goes to the dead-letter "
                            "file if it is refused again", self.name, request.first,
                            before.suspect, before.suspect)
                return
            failpoints.hit("after_deliver")
            self._settle(request.last)
            return
        assert error is not None
        status = error.status or str(error)
        if act is Act.DEAD_LETTER:
            queued = batch[0]
            if why is Why.CONVICTED:
                error = DeliveryError(
                    f"{error} (refused {before.refusals} times in a row, then again after the "
                    "record behind it was accepted: this record is the cause)", error.kind,
                    error.status)
            self._reject(queued, error, ahead=request.probe)
            return
        if act is Act.ISOLATE:
            log.warning("sink %s: a batch of %d records was rejected (%s); sending them one "
                        "at a time to find the culprit", self.name, request.count, status)
            return
        if act is Act.HALVE:
            bound = self._bound.halve(request.size, self._clock(), decision.proven)
            log.warning("sink %s: a request of %d records (about %d bytes) was refused for its "
                        "size (%s); after a pause, at most about %d bytes per request (growing "
                        "back after %d accepted in a row)", self.name, request.count,
                        request.size, status, bound, GROW_AFTER)
        elif why is Why.PROVEN_SIZE:
            log.warning("sink %s: the record of seq %d (about %d bytes) was refused for its "
                        "size on its own (%s); trying it once more after a pause before it "
                        "goes to the dead-letter file", self.name, request.first,
                        request.size, status)
        else:
            self._note_failure(error)
            if why is Why.NARROWED:
                log.warning("sink %s: requests led by the record of seq %d were refused %d "
                            "times in a row (%s); sending it alone", self.name,
                            request.first, decision.history.refusals, status)
            elif why is Why.SUSPECTED:
                log.warning("sink %s: the record of seq %d was refused on its own too (%s); "
                            "the record behind it goes alone first, to tell a record the peer "
                            "refuses from a peer that is busy", self.name, request.first,
                            status)
            elif why is Why.BUSY:
                log.warning("sink %s: the record of seq %d, sent alone ahead of seq %d, was "
                            "refused too (%s): the peer is busy, nothing is dead-lettered; "
                            "retrying in order", self.name, request.first, before.suspect,
                            status)
        if decision.pause:
            # Full jitter keeps a fleet that lost its collector together from retrying in
            # lockstep; a peer that said how long to wait is believed (capped by Pause).
            backoff = self._backoff_now
            jittered = backoff * (0.5 + random.random() / 2)
            requested = error.retry_after or 0.0
            self._pause.hold(max(jittered, requested), asked=requested > jittered)
            self._backoff_now = min(backoff * 2, self._backoff[1])

    def _storage_faulty(self) -> bool:
        spool_faulty = self._spool is not None and (self._spool_behind or bool(self._spool.fault))
        return (spool_faulty or bool(self._unlettered)
                or bool(self._dead_letter and self._dead_letter.fault))

    def _repair_storage(self) -> None:
        """Retry what a full or read-only disk refused: the records the spool is missing, the
        letters the dead-letter file could not take, then a plain write of the ack cursor (so
        the fault clears even when nothing waits)."""
        if self._spool is not None:
            if self._spool_behind:
                self._write_spool(())
            if not self._spool_behind and self._spool.fault is not None:
                with contextlib.suppress(OSError):  # still failing: the watch keeps the fault
                    self._spool.probe(self._acked_wanted)
        if self._dead_letter is not None:
            if self._unlettered:  # the letters themselves tell: a probe could pass beside them
                self._write_unlettered()
            else:
                self._dead_letter.probe()

    def _write_unlettered(self) -> None:
        """The letters a fault kept back, in order; each record leaves the spool once its
        letter is durable."""
        assert self._dead_letter is not None
        for seq, letter in sorted(self._unlettered.items()):
            try:
                self._append_letter(letter)
            except OSError:
                return  # the watch keeps the fault; the next repair tries again
            del self._unlettered[seq]
            log.warning("sink %s: the letter of the record of seq %d (RecordId %s) is written "
                        "now (%s); the record leaves the spool", self.name, seq,
                        letter.record_id, self._dead_letter.path)
            if self._spool is not None:
                with contextlib.suppress(OSError):  # the cursor catches up at the next ack
                    self._spool.release(seq)

    def _append_letter(self, letter: letters.DeadLetter) -> None:
        """Append ``letter``, and say and count what the file's bound removed to take it."""
        assert self._dead_letter is not None
        removed = self._dead_letter.append(letter)
        if removed is None:
            return
        for sink, count in sorted(removed.by_sink.items()):
            self._count_failure(sink, "dead_letter_dropped", count)
        log.error("dead-letter file: its bound (%d files of %d bytes) was reached: removed "
                  "%s, the oldest file, with %d letters (%d of them never redelivered; sinks: "
                  "%s); they are gone, and redeliver cannot bring them back (the newer files "
                  "are kept)",
                  letters.GENERATIONS, letters.MAX_BYTES, removed.path.name, removed.letters,
                  removed.unredelivered,
                  ", ".join(f"{k} {v}" for k, v in sorted(removed.by_sink.items())) or "none")

    def _settle(self, last: int) -> None:
        """Records through ``last`` are settled (delivered, or dead-lettered), and so are the
        records settled ahead right behind it: acknowledge them and let them go."""
        with self._cond:
            through = last
            for queued in self._queue:
                if queued.seq <= last:
                    continue
                if queued.seq not in self._history.ahead:
                    break
                through = queued.seq
        ahead = frozenset(s for s in self._history.ahead if s > through)
        if ahead != self._history.ahead:
            self._history = replace(self._history, ahead=ahead)
        self._ack(through)
        self._done(through)

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

    def _reject(self, queued: _Queued, error: DeliveryError, *, ahead: bool = False) -> None:
        """Dead-letter one record the sink will never accept, and go on with the next
        (``ahead``: it was sent ahead of a suspect, which stays first in line). When the
        dead-letter file cannot take the letter, the record stays in the spool until it can."""
        record = queued.record
        letter = letters.rejected(self.name, record, error.status or "rejected", str(error),
                                      self._payload)
        where = f"not kept (SEE_STATE_DIR is disabled): {letter.to_json().decode().rstrip()}"
        if self._dead_letter is not None:
            try:
                self._append_letter(letter)
                where = f"moved to {self._dead_letter.path}"
            except OSError:  # the watch logged why
                assert self._spool is not None  # both live under the state directory
                self._spool.hold(queued.seq)
                self._unlettered[queued.seq] = letter
                where = ("kept in the spool until the dead-letter file can take its letter "
                         "(it cannot be written now)")
        log.error("sink %s: %s rejected the record of EventId %s (%s, RecordId %s, about %d "
                  "bytes) permanently: %s; %s; continuing with the next record",
                  self.name, error.status or "the sink", letter.event_id or "(none)",
                  letter.transition, record.record_id, queued.size, str(error)[:300], where)
        self._count_dead_letter()
        with self._cond:
            self._rejections.dead_lettered(error.status or "rejected")
        if not ahead:
            self._settle(queued.seq)

    def _reject_unreadable(self, line: UnreadableLine, source: str = "the spool") -> None:
        """Dead-letter an entry of ``source`` this release cannot read (written by another
        release, or damaged): kept for a person, never dropped. ``OSError`` when it cannot be
        kept."""
        if self._dead_letter is None:
            raise OSError("no dead-letter file (SEE_STATE_DIR is disabled)")
        letter = letters.unreadable(self.name, line.seq, line.content, line.reason, source)
        self._append_letter(letter)  # OSError: logged by its watch; the line stays
        log.error("sink %s: %s holds an entry (seq %s, EventId %s) this release cannot read "
                  "(%s); moved to %s", self.name, source, letter.seq,
                  letter.event_id or "unknown", line.reason[:300], self._dead_letter.path)
        self._count_dead_letter()

    def _count_dead_letter(self) -> None:
        with self._cond:
            self._dead_lettered += 1
        self._count_failure(self.name, "dead_letter", 1)
