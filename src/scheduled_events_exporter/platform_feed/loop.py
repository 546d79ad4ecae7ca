"""The platform command's loop: receive → read → track → commit → spool → delete, at least once.

One thread. A message is deleted only once the records it made are in every sink's spool
(``SinkStatus.spooled_seq``); until then it stays invisible for its visibility timeout and then
comes back, and the state committed with its records (the delivery id, the event's status)
makes its second reading produce nothing. The crash points of that path, and what each leaves
(docs/semantics.md, "The platform's record"):

1. after the receive, before the commit: nothing was written; the message comes back and is
   read as new (the same records, the same ids: ``records.record_id``);
2. after the commit, before the spool append: the records are in the state file's outbox,
   spooled at the next start (as the sidecar's); the message comes back and makes nothing;
3. after the spool append, before the delete: the records are in the spools; the message comes
   back and makes nothing, and is deleted then;
4. after the delete: the spools deliver what they hold (a repeat only between a delivery and
   its acknowledgement, with the same ``RecordId``).

A message that cannot be read, or was received more than ``max_dequeue`` times, is appended to
the dead-letter file (fsynced) and then deleted; a crash between the two letters it once more
when it comes back. The state is committed only when nothing earlier is missing from a spool,
so a commit never replaces an outbox whose records a spool still lacks.
"""

from __future__ import annotations

import logging
import random
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from scheduled_events_exporter import failpoints
from scheduled_events_exporter.delivery import dead_letter as letters
from scheduled_events_exporter.delivery.dead_letter import DeadLetterFile
from scheduled_events_exporter.delivery.outcome import SinkStatus
from scheduled_events_exporter.model import InstanceInfo, Observer, PlatformChange, Transition
from scheduled_events_exporter.platform_feed.arm import instance_for
from scheduled_events_exporter.platform_feed.envelope import Refused, read_message, read_row
from scheduled_events_exporter.platform_feed.queue import Message, QueueError
from scheduled_events_exporter.platform_feed.resource_graph import (
    ATTEMPTS,
    CONNECT_TIMEOUT,
    MAX_WAIT,
    READ_TIMEOUT,
    GraphError,
)
from scheduled_events_exporter.poller import Clock, Redelivery, Submitter
from scheduled_events_exporter.records import TransitionRecord, make_record
from scheduled_events_exporter.state import PersistedState, StateStore
from scheduled_events_exporter.streak import Streak
from scheduled_events_exporter.telemetry import GaugeSnapshot, Telemetry
from scheduled_events_exporter.tracker import (
    PlatformState,
    TrackerState,
    expire_platform,
    track_platform,
)

log = logging.getLogger(__name__)

#: The dead letters' ``sink`` for messages the command could not read.
SOURCE = "platform-queue"
DEQUEUED_TOO_OFTEN = "dequeued_too_often"
#: Messages asked for per receive (the service's most).
BATCH = 32
#: The longest wait after a failed receive (a throttled account, an unreachable endpoint), and
#: after one that will not pass by itself (a refused credential, a missing queue).
MAX_BACKOFF = 60.0
LASTING_BACKOFF = 300.0
#: While a spool lacks committed records (a full disk), how often the loop looks again.
SPOOL_RETRY = 1.0
#: Rows of a backfill shipped together (one commit, one spool append).
BACKFILL_CHUNK = 1000


class Queue(Protocol):
    """The queue as the loop uses it (``queue.StorageQueue``)."""

    def receive(self, count: int, visibility_timeout: int) -> list[Message]:
        """Up to ``count`` messages."""
        ...

    def delete(self, message: Message) -> bool:
        """Delete it; False when it is no longer there under its receipt."""
        ...


class Spooled(Protocol):
    """A sink as the loop sees it: records handed over, and how far its spool holds them."""

    name: str

    def submit(self, records: Sequence[TransitionRecord]) -> None:
        """Append to the spool and queue for delivery."""
        ...

    def status(self) -> SinkStatus:
        """``spooled_seq`` among the rest."""
        ...


class Rows(Protocol):
    """Resource Graph as the backfill reads it (``resource_graph.ResourceGraph``)."""

    def rows(self) -> Iterable[object]:
        """Every row, page after page."""
        ...

    def close(self) -> None:
        """Release the connections."""
        ...


@dataclass(frozen=True, slots=True)
class LoopSettings:
    """How the loop reads the queue (from SEE_PLATFORM_*)."""

    poll_interval: float = 5.0
    visibility_timeout: int = 120
    max_dequeue: int = 10


class PlatformLoop:
    """Owns the platform's state and drives one receive at a time."""

    def __init__(self, settings: LoopSettings, queue: Queue, sinks: Sequence[Spooled],
                 telemetry: Telemetry, store: StateStore, dead_letter: DeadLetterFile, *,
                 state: PlatformState, seq: int, clock: Clock,
                 observers: Sequence[Submitter] = (),
                 graph: Callable[[], Rows] | None = None,
                 metrics_changed: Callable[[], None] | None = None,
                 unknown_fields: tuple[tuple[str, object], ...] = (),
                 outbox: tuple[TransitionRecord, ...] = (),
                 pending_request: Redelivery | None = None) -> None:
        """``outbox``: the loaded state file's (kept in every commit until every spool has
        it); ``pending_request``: a redeliver request the start could not carry out, tried
        again here, where the sequence numbers are taken."""
        self.settings = settings
        self.queue = queue
        self.sinks = list(sinks)
        self.observers = list(observers)
        self.telemetry = telemetry
        self.store = store
        self.dead_letter = dead_letter
        self.state = state
        self.seq = seq
        self.clock = clock
        self._graph = graph
        self._metrics_changed = metrics_changed
        self._unknown = unknown_fields
        #: Committed records some spool may still lack (they ride in every commit's outbox).
        self._unspooled: tuple[TransitionRecord, ...] = outbox
        self._pending_request = pending_request
        #: Messages whose records are committed, to delete once every spool has them.
        self._awaiting: list[Message] = []
        mono = clock.monotonic
        self._failures = Streak(clock=mono)
        self._behind = Streak(clock=mono)
        self.skipped: Counter[str] = Counter()
        # Health (read by the probes' thread).
        self.last_tick_monotonic: float | None = None
        self.next_tick_deadline: float | None = None
        self.last_good_monotonic: float | None = None
        self.last_outcome: str | None = None

    # --- the loop ---

    def run(self, stop: threading.Event, *, backfill: bool = False, once: bool = False) -> None:
        """Backfill first when asked, then read the queue until ``stop`` (``once``: only the
        backfill, then return)."""
        try:
            if backfill:
                self.backfill(stop)
            if not once:
                self._loop(stop)
        except Exception:  # a bug: said, and the thread's end shows in /healthz
            log.exception("the platform loop failed; what it committed is kept")
            raise

    def _loop(self, stop: threading.Event) -> None:
        backoff = 1.0
        while not stop.is_set():
            now = self.clock.monotonic()
            self.last_tick_monotonic = now
            wait = self.settings.poll_interval
            self.next_tick_deadline = now + wait + MAX_BACKOFF + 40.0
            if self._pending_request is not None:
                self.seq = self._pending_request.retry(self.seq, self.clock.wall())
            if self._awaiting and not self._durable():
                self._note_behind()
                stop.wait(SPOOL_RETRY)
                continue
            try:
                self._delete_awaiting()
                batch = self.queue.receive(BATCH, self.settings.visibility_timeout)
            except QueueError as exc:
                self.last_outcome = exc.outcome
                if self._failures.hit():
                    log.warning("platform queue: %s (%s); retrying with backoff%s", exc.outcome,
                                exc, ": this will not pass by waiting, fix it" if exc.lasting
                                else "")
                delay = min(backoff, LASTING_BACKOFF if exc.lasting else MAX_BACKOFF)
                backoff = min(backoff * 2, LASTING_BACKOFF)
                self.next_tick_deadline = self.clock.monotonic() + delay + 40.0
                stop.wait(delay * (0.5 + random.random() / 2))
                continue
            backoff = 1.0
            ended = self._failures.clear()
            if ended is not None:
                log.info("platform queue: answering again after %d failed attempts",
                         ended.count)
            self.last_outcome = "ok"
            self.last_good_monotonic = self.clock.monotonic()
            if batch:
                self.process(batch)
            if len(batch) < BATCH:
                stop.wait(wait)

    def process(self, batch: Sequence[Message]) -> None:
        """Read, track, commit, spool and (once every spool has the records) delete."""
        now = self.clock.wall()
        state = self.state
        transitions: list[tuple[Transition, InstanceInfo]] = []
        refused: list[tuple[Message, str, str]] = []
        done: list[Message] = []
        for message in batch:
            if message.dequeue_count > self.settings.max_dequeue:
                refused.append((message, DEQUEUED_TOO_OFTEN,
                                f"received {message.dequeue_count} times, more than "
                                f"SEE_PLATFORM_MAX_DEQUEUE={self.settings.max_dequeue}: it "
                                "kept failing, so it goes to the dead-letter file unread"))
                continue
            read = read_message(message.content)
            if isinstance(read, Refused):
                refused.append((message, read.kind, read.reason))
                continue
            for change in read.changes:
                state = self._track(state, change, now, transitions)
            done.append(message)
        for message, kind, reason in refused:
            if self._letter(message, kind, reason):
                done.append(message)
        if self.commit(state, transitions):
            self._awaiting.extend(done)
            if self._durable():
                self._delete_awaiting()

    def backfill(self, stop: threading.Event) -> None:
        """Read Resource Graph once and record what is new to the state (its latest status
        of each event); a failure is said and the queue goes on."""
        if self._graph is None:
            return
        graph = self._graph()
        log.info("Resource Graph backfill: reading maintenanceresources (latest status of "
                 "each scheduled event)")
        rows = refused = 0
        transitions: list[tuple[Transition, InstanceInfo]] = []
        state = self.state
        # /healthz: a page may wait out throttling several times before it comes.
        page_budget = ATTEMPTS * (MAX_WAIT + CONNECT_TIMEOUT + READ_TIMEOUT)
        self.next_tick_deadline = self.clock.monotonic() + page_budget
        try:
            for row in graph.rows():
                if stop.is_set():
                    break
                self.last_tick_monotonic = self.clock.monotonic()
                self.next_tick_deadline = self.last_tick_monotonic + page_budget
                rows += 1
                change = read_row(row)
                if isinstance(change, Refused):
                    refused += 1
                    continue
                state = self._track(state, change, self.clock.wall(), transitions)
                if len(transitions) >= BACKFILL_CHUNK:
                    if not self.commit(state, transitions):
                        return
                    state, transitions = self.state, []
        except GraphError as exc:
            log.warning("Resource Graph backfill stopped after %d rows: %s", rows, exc)
        finally:
            graph.close()
        made = len(transitions)
        if self.commit(state, transitions):
            log.info("Resource Graph backfill: %d rows read (%d not scheduled events), %d new "
                     "records in its last part", rows, refused, made)

    def _track(self, state: PlatformState, change: PlatformChange, now: datetime,
               out: list[tuple[Transition, InstanceInfo]]) -> PlatformState:
        state, made, why = track_platform(state, change, now)
        if why:
            self.skipped[why] += 1
            log.debug("platform record of EventId %s (%s) makes no record: %s",
                      change.event.event_id[:64], change.event.status[:32], why)
        instance = instance_for(change)
        out.extend((t, instance) for t in made)
        return state

    # --- durability ---

    def commit(self, state: PlatformState,
               transitions: Sequence[tuple[Transition, InstanceInfo]]) -> bool:
        """Commit ``state`` with the records of ``transitions`` (and the bounded memory's own
        ends), then hand them to the spools. False when the state file could not be written:
        nothing was adopted, and the messages come back to be read again."""
        state, expired = expire_platform(state, self.clock.wall())
        pairs = [*transitions,
                 *((t, InstanceInfo(vm_name=",".join(t.event.resources) if t.event else ""))
                   for t in expired)]
        records = tuple(make_record(t, instance, seq=self.seq + i, observer=Observer.PLATFORM)
                        for i, (t, instance) in enumerate(pairs, 1))
        if not records and state == self.state:
            return True
        if records:
            failpoints.hit("before_commit")
        seq = self.seq + len(records)
        try:
            self.store.save(PersistedState(tracker=TrackerState(), seq=seq,
                                           outbox=(*self._unspooled, *records),
                                           platform=state, unknown_fields=self._unknown))
        except OSError:  # said once per streak by the store's watch
            self.telemetry.record_export_failure("state", "state", 1)
            return False
        self.state, self.seq = state, seq
        if records:
            failpoints.hit("after_commit")
            for sink in (*self.sinks, *self.observers):
                sink.submit(records)
            failpoints.hit("after_spool")
            self._unspooled = (*self._unspooled, *records)
            for record in records:
                self.telemetry.record_transition(record)
        if self._durable():
            self._unspooled = ()
        self.telemetry.publish(GaugeSnapshot(
            events=tuple(k.event for k in self.state.events.values())))
        if records and self._metrics_changed is not None:
            self._metrics_changed()
        return True

    def _durable(self) -> bool:
        """Every record committed so far is in every sink's spool."""
        return all(sink.status().spooled_seq >= self.seq for sink in self.sinks)

    def _delete_awaiting(self) -> None:
        """Delete the messages whose records every spool holds (raises QueueError; those not
        yet deleted stay for the next try, or come back and are read as seen)."""
        behind = self._behind.clear()
        if behind is not None:
            log.info("platform: every spool holds the committed records again")
        while self._awaiting:
            message = self._awaiting[0]
            failpoints.hit("before_delete")
            self.queue.delete(message)
            self._awaiting.pop(0)

    def _letter(self, message: Message, kind: str, reason: str) -> bool:
        """Set a message aside in the dead-letter file (fsynced); False when that failed (it
        is then not deleted, and comes back)."""
        letter = letters.refused_message(SOURCE, kind, reason, message.id, message.content)
        try:
            self.dead_letter.append(letter)
        except OSError as exc:
            log.error("platform queue: message %s could not be dead-lettered (%s); it stays in "
                      "the queue and comes back", message.id, exc)
            return False
        log.warning("platform queue: message %s moved to %s (%s): %s", message.id,
                    self.dead_letter.path, kind, reason[:300])
        self.telemetry.record_export_failure(SOURCE, "dead_letter", 1)
        return True

    def _note_behind(self) -> None:
        self.last_outcome = "spool_behind"
        if self._behind.hit():
            log.warning("platform: a sink's spool lacks committed records (its disk?); the "
                        "queue is not read and no message is deleted until it has them")
