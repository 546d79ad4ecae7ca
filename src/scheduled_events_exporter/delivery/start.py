"""The exporter's start, in the one order that keeps every committed record, and the owner of
the sequence numbers until the poll thread takes them over.

Sequence numbers order each sink's spool, and a spool skips a record whose number is not above
its last one (that is how the outbox repair and a repeated append stay idempotent). So no
number may be taken below one a spool already holds, and no record may take a number before
the records committed earlier reach the spools: a letter put back ahead of an outbox record
made the spool skip the outbox record for good. :func:`begin` therefore runs, with the state
directory's lock held:

1. each sink's spool is read (a torn tail cut, lines this release cannot read dead-lettered);
   the sinks' threads start only after :func:`begin` (the caller starts them), so nothing is
   delivered, and acknowledged, while the start decides what waits where;
2. the state file's outbox is appended to each spool that lacks it (records committed just
   before a crash); a spool that cannot be written keeps them in memory, and the state file
   keeps them in its outbox until it can (:class:`~scheduled_events_exporter.state.
   StateCommitter`);
3. the last number taken is the highest of the state file's, its outbox's and every spool's,
   configured or not (a sink left out of ``SEE_SINKS`` keeps its spool for when it returns);
4. then, and only then, a ``redeliver --at-next-start`` request takes the numbers after it
   (:func:`.redrive.perform_request`). If it cannot be carried out (a disk fault, a request this
   release cannot read), the start goes on: the request stays, ``/readyz`` says so, and the
   poll thread tries it again (:class:`PendingRequest`) once the storage works; at the latest
   the next start does.

From then on the poll thread owns the numbers (``Poller.seq``), and a pending request takes its
numbers there, between two polls.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from scheduled_events_exporter.codec import UnreadableLine
from scheduled_events_exporter.delivery import redrive
from scheduled_events_exporter.delivery.worker import DeliveryWorker
from scheduled_events_exporter.state import PersistedState
from scheduled_events_exporter.streak import Streak
from scheduled_events_exporter.write_faults import WriteFault

log = logging.getLogger(__name__)

#: How soon a pending redeliver request is tried again while the storage looks writable; the
#: wait doubles after each failure, up to :data:`REQUEST_RETRY_CAP`.
REQUEST_RETRY = 10.0
REQUEST_RETRY_CAP = 300.0


@dataclass(frozen=True, slots=True)
class Begun:
    """What the start leaves the poll thread: the last sequence number taken, and a redeliver
    request that could not be carried out yet (or ``None``)."""

    seq: int
    pending: PendingRequest | None
    #: Outbox entries this release cannot read that some sink could not dead-letter: the
    #: state file keeps them for the next start.
    unlettered: tuple[UnreadableLine, ...] = ()


def begin(directory: Path | None, persisted: PersistedState | None,
          workers: Sequence[DeliveryWorker], now: datetime,
          monotonic: Callable[[], float] = time.monotonic) -> Begun:
    """Run the start in order (module docstring); ``workers``: every configured sink's, not
    started yet (the caller starts them afterwards)."""
    outbox = persisted.outbox if persisted else ()
    unreadable = persisted.unreadable if persisted else ()
    unlettered: list[UnreadableLine] = []
    for worker in workers:
        worker.open()  # its thread starts last: nothing is delivered while the start runs
        if outbox or unreadable:
            # Repair a crash between committing the state and spooling its records.
            unlettered.extend(e for e in worker.recover(outbox, unreadable)
                              if e not in unlettered)
    seq = max([persisted.seq if persisted else 0, *(r.seq for r in outbox),
               *(w.status().last_seq for w in workers)])
    pending = None
    if directory is not None:
        seq = max(seq, redrive.last_spooled(directory / "spool",
                                            exclude={w.name for w in workers}))
        pending = PendingRequest(directory, workers, monotonic)
        seq = pending.attempt(seq, now)
    return Begun(seq, pending if pending is not None and pending.waiting else None,
                 tuple(unlettered))


class PendingRequest:
    """A ``redeliver --at-next-start`` request: carried out by :func:`begin`, or, when it
    could not be, tried again by the poll thread (:meth:`retry`), which owns the numbers."""

    def __init__(self, directory: Path, workers: Sequence[DeliveryWorker],
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.directory = directory
        self.path = directory / redrive.REQUEST_FILE
        self._workers = {w.name: w for w in workers}
        self._monotonic = monotonic
        #: Set while a request waits: why it could not be carried out, and since when.
        self.fault: WriteFault | None = None
        #: A request this release cannot read waits for a person, not for the disk.
        self._unreadable = False
        self._next_try = -float("inf")
        self._failing = Streak(clock=monotonic)
        self.waiting = False

    def attempt(self, seq: int, now: datetime) -> int:
        """Carry the request out now, numbering after ``seq``; returns the last number taken
        (``seq`` when nothing was put back). Never raises: a failure is said, counted on the
        request's fault, and the request stays."""
        try:
            done = redrive.perform_request(self.directory, now, after=seq,
                                           targets=self._workers)
        except ValueError as exc:
            self._unreadable = True
            self._failed(f"{exc}; fix or delete it")
            return seq
        except OSError as exc:
            self._failed(f"{exc}; it is tried again once the storage can be written, and at "
                         "the next start")
            return seq
        if done is None:
            self.waiting = False
            self.fault = None
            return seq
        chosen, applied = done
        for item, number in applied:
            log.info("redelivered from the dead-letter file: %s %s EventId %s %s RecordId %s "
                     "(spool seq %d)", item.letter.sink, item.letter.status,
                     item.letter.event_id or "-", item.letter.transition,
                     item.letter.record_id, number)
        for skip in chosen.skipped:
            if skip.reason != redrive.ALREADY:
                log.warning("redeliver: skipped RecordId %s of sink %s: %s",
                            skip.letter.record_id or "-", skip.letter.sink, skip.reason)
        ended = self._failing.clear()
        log.info("redeliver request carried out%s: %d records put back, %d skipped (%d of "
                 "them redelivered before)",
                 f" after {ended.count} failed attempts" if ended is not None else "",
                 len(applied), len(chosen.skipped), chosen.redelivered_before)
        self.waiting = False
        self.fault = None
        return max([seq, *(number for _, number in applied)])

    def retry(self, seq: int, now: datetime) -> int:
        """From the poll thread, between polls: try a waiting request again when it is due
        (all or none, so a try on a disk still failing changes nothing); returns the last
        number taken."""
        if not self.waiting or self._unreadable or self._monotonic() < self._next_try:
            return seq
        return self.attempt(seq, now)

    def _failed(self, why: str) -> None:
        now = self._monotonic()
        self.waiting = True
        self._next_try = now + min(REQUEST_RETRY * 2 ** self._failing.count,
                                   REQUEST_RETRY_CAP)
        first = self._failing.hit()
        failures = self.fault.failures + 1 if self.fault else 1
        since = self.fault.since if self.fault else now
        self.fault = WriteFault(str(self.path), f"redeliver request not carried out: {why}",
                                since, failures)
        if first:
            log.error("the redeliver request %s could not be carried out: %s; the exporter "
                      "runs meanwhile", self.path, why)
