"""The poll loop: IMDS client → parser → tracker → records → sinks, on a monotonic schedule.

One thread, one request at a time (polls never overlap), next poll due one interval after the
previous one was *due* (no drift); after a failure the retry delay replaces the cadence until a
good document comes back. Everything that could block (sink I/O) happens on the sinks' workers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Protocol

from scheduled_events_exporter import failpoints
from scheduled_events_exporter.config import Config
from scheduled_events_exporter.imds import ImdsClient, PollResult, retry_delay
from scheduled_events_exporter.model import (
    Anomaly,
    InstanceInfo,
    Outcome,
    ScheduledEvent,
    Transition,
)
from scheduled_events_exporter.records import TransitionRecord, make_record
from scheduled_events_exporter.streak import Streak
from scheduled_events_exporter.telemetry import GaugeSnapshot, Telemetry
from scheduled_events_exporter.tracker import Evidence, TrackerState, note_unchanged, track

log = logging.getLogger(__name__)


#: Seconds between reminders that IMDS has not answered since the start.
SILENCE_LOG_EVERY = 30.0


class Submitter(Protocol):
    """Anything records are handed to after each poll (every sink, the diagnostic log)."""

    def submit(self, records: Sequence[TransitionRecord]) -> None:
        """Take records without blocking on I/O."""
        ...


class Committer(Protocol):
    """Persists the tracker state (and the records it produced) before they are handed over."""

    def commit(
        self,
        state: TrackerState,
        records: tuple[TransitionRecord, ...],
        seq: int,
        *,
        changed: bool,
    ) -> None:
        """Save when ``changed``; otherwise at most a periodic freshness update."""
        ...


class Redelivery(Protocol):
    """A redeliver request the start could not carry out (``delivery.start.PendingRequest``):
    tried again between polls, by the thread that owns the sequence numbers."""

    def retry(self, seq: int, now: datetime) -> int:
        """Try again if due, numbering after ``seq``; returns the last number taken."""
        ...


class ApprovalQueue(Protocol):
    """The approval worker as the poll loop sees it (``approval_worker.Approver``): offer each good
    document, collect finished decisions. Both return at once; hooks and POSTs run elsewhere."""

    def offer(self, events: Sequence[ScheduledEvent], incarnation: int) -> None:
        """Queue the latest document's events for a decision."""
        ...

    def drain(self) -> list[Transition]:
        """Approval transitions decided since the last call, in order."""
        ...

    def approved_ids(self) -> frozenset[str]:
        """EventIds whose approval IMDS accepted (evidence that they ran)."""
        ...


@dataclass(frozen=True, slots=True)
class Clock:
    """Injected time sources: wall time for the tracker, monotonic time for scheduling."""

    wall: Callable[[], datetime] = lambda: datetime.now(timezone.utc)
    monotonic: Callable[[], float] = time.monotonic


def next_due(previous_due: float, now: float, interval: float) -> float:
    """The next tick of the cadence after ``previous_due`` that is not in the past.

    Skipping missed ticks (rather than firing them back to back) keeps the 5 req/s IMDS budget
    and the phase of the schedule after a slow poll.
    """
    due = previous_due + interval
    if due <= now:
        due += ((now - due) // interval + 1) * interval
    return due


class Poller:
    """Owns the tracker state and drives one poll at a time."""

    def __init__(
        self,
        config: Config,
        client: ImdsClient,
        sinks: Sequence[Submitter],
        telemetry: Telemetry,
        *,
        instance: InstanceInfo,
        state: TrackerState | None = None,
        clock: Clock | None = None,
        seq: int = 0,
        commit: Committer | None = None,
        approver: ApprovalQueue | None = None,
        metrics_changed: Callable[[], None] | None = None,
        boot_id: str | None = None,
        pending_request: Redelivery | None = None,
    ) -> None:
        self.config = config
        self.client = client
        self.sinks = list(sinks)
        self.telemetry = telemetry
        self.instance = instance
        self.state = state or TrackerState()
        self.clock = clock or Clock()
        self.seq = seq
        self._commit = commit
        self._pending_request = pending_request
        self.approver = approver
        #: Told (non-blocking) after a poll that changed the metrics; sinks export on their
        #: own threads, so the next poll is never delayed by a collector.
        self._metrics_changed = metrics_changed
        #: The host's boot id (read once at start: it cannot change while this process runs).
        self.boot_id = boot_id
        # What is said once per streak (streak.py): failed polls (also their backoff), the
        # outcome of the requests, IMDS silent since the start, polls that crashed, the
        # repairs of one document incarnation.
        mono = lambda: self.clock.monotonic()  # noqa: E731 (the clock may be swapped in tests)
        self._failures = Streak(clock=mono)
        self._outcomes = Streak(clock=mono)
        self._silence = Streak(clock=mono)
        self._crashes = Streak(repeat_count=60, clock=mono)
        self._repaired = Streak(clock=mono)
        #: Monotonic time by which the next poll must have ended (liveness reads it).
        self.next_tick_deadline: float | None = None
        self.last_outcome: str | None = None
        self.last_good_monotonic: float | None = None
        self.ticks = 0
        self.last_tick_monotonic: float | None = None

    def set_instance(self, instance: InstanceInfo) -> None:
        """Adopt instance metadata that arrived late (one reference swap; the loop reads it)."""
        self.instance = instance

    def poll_once(self) -> tuple[PollResult, tuple[TransitionRecord, ...]]:
        """Fetch, parse, track and hand over one document. Never raises for IMDS trouble."""
        result = self.client.fetch_events()
        now_mono = self.clock.monotonic()
        self.ticks += 1
        self.last_tick_monotonic = now_mono
        self.telemetry.record_request(result.outcome, result.status, result.duration)
        # Known to /readyz before the log says it: a reader of the log finds it there too.
        self.last_outcome = result.outcome.value
        self._log_outcome(result)
        self._log_silence(result, now_mono)
        transitions: tuple[Transition, ...] = ()
        changed = False
        state = self.state
        if result.outcome is Outcome.OK and result.document is not None:
            self._note_anomalies(result.document.incarnation, result.document.anomalies)
            new_state, transitions = track(
                self.state, result.document, self.clock.wall(),
                gap_threshold=self.config.gap_threshold, evidence=self._evidence(),
            )
            changed = bool(transitions) or new_state.incarnation != self.state.incarnation
            state = new_state
        elif result.outcome is Outcome.NOT_MODIFIED:
            state = note_unchanged(self.state, self.clock.wall(), self._evidence())
        if self.approver is not None:
            # Decisions finished since the last poll ship with this one (the poll thread owns
            # seq), ahead of the document's own: an approval precedes the start it causes.
            transitions = (*self.approver.drain(), *transitions)
        # The new state is adopted only once its records are committed: a poll that fails on
        # the way (a bug, a disk error) leaves the old state, so the next one re-derives them.
        records = self._ship(transitions, state, changed=changed or bool(transitions),
                             good=result.outcome.good)
        # The first good document after a start is news too (the exporter is up and knows the
        # pending set), even when a restored state makes it look unchanged.
        first_good = result.outcome.good and self.last_good_monotonic is None
        if result.outcome.good:
            self.last_good_monotonic = now_mono
            self._failures.clear()
            self.telemetry.publish(
                GaugeSnapshot(
                    events=tuple(k.event for k in self.state.events.values()),
                    unannounced=frozenset(i for i, k in self.state.events.items() if k.unannounced),
                    vm_name=self.instance.vm_name,
                    incarnation=self.state.incarnation,
                    last_good_monotonic=now_mono,
                )
            )
            # Approval needs the real VM name (a scale-set instance name is not the host name).
            if self.approver is not None and result.document is not None and self.instance.vm_id:
                self.approver.offer(result.document.events, result.document.incarnation)
        else:
            self._failures.hit()
        if (changed or records or first_good) and self._metrics_changed is not None:
            self._metrics_changed()
        return result, records

    def _evidence(self) -> Evidence:
        approved = self.approver.approved_ids() if self.approver is not None else frozenset()
        return Evidence(approved=approved, boot_id=self.boot_id, vm_name=self.instance.vm_name)

    def _note_anomalies(self, incarnation: int, anomalies: Sequence[Anomaly]) -> None:
        # Once per incarnation: IMDS serves the same document every second until it changes.
        if not anomalies or not self._repaired.hit(incarnation):
            return
        for anomaly in anomalies:
            self.telemetry.record_anomaly(anomaly.kind)
            log.warning("IMDS document incarnation %d repaired (%s): %s; the other events "
                        "are tracked as usual", incarnation, anomaly.kind, anomaly.detail)

    def _ship(self, transitions: tuple[Transition, ...], state: TrackerState, *, changed: bool,
              good: bool) -> tuple[TransitionRecord, ...]:
        """Commit the state (with the records as its outbox), then hand the records over."""
        instance = self.instance
        records = tuple(
            make_record(t, instance, seq=self.seq + i) for i, t in enumerate(transitions, 1)
        )
        self.seq += len(records)
        if records:
            failpoints.hit("before_commit")
        # Commit first: once the state says "seen", the records must already be durable
        # (they ride in the state file's outbox until the spools have them).
        if self._commit is not None and (changed or good):
            self._commit.commit(state, records, self.seq, changed=changed)
        self.state = state
        if records:
            failpoints.hit("after_commit")
            # Hand over in the same poll that saw the change: this is the detection delay.
            for sink in self.sinks:
                sink.submit(records)
            failpoints.hit("after_spool")
            for record in records:
                self.telemetry.record_transition(record)
        return records

    def finish(self) -> None:
        """The last step of the poll thread: ship the approval decisions that finished after
        the last poll and commit the state once more (its "last good document" fresh, so the
        next start measures its observation gap from here). Only this thread writes ``seq``
        and ``state`` and commits them, so nothing older can be written last."""
        drained = tuple(self.approver.drain()) if self.approver is not None else ()
        self._ship(drained, self.state, changed=True, good=False)

    def run(self, stop: threading.Event) -> None:
        """Poll until ``stop`` is set, then :meth:`finish` (a poll under way when ``stop`` is
        set completes first: its records are committed and handed over, never half)."""
        try:
            self._loop(stop)
        finally:
            try:
                self.finish()
            except Exception:  # the state of the last good poll is on disk already
                log.exception("the final state commit failed; the last poll's commit stands")

    def _loop(self, stop: threading.Event) -> None:
        interval = self.config.poll_interval
        due = self.clock.monotonic()
        while not stop.is_set():
            self.next_tick_deadline = max(due, self.clock.monotonic()) + self._request_budget()
            try:
                result, _ = self.poll_once()
            except Exception:
                # Nothing may end polling silently: a bug met by one document costs that poll,
                # not the exporter's watch. The state was not replaced, so nothing is lost.
                if self._crashes.hit():
                    log.exception("poll failed unexpectedly (%d in a row); polling continues",
                                  self._crashes.count)
                due = self.clock.monotonic() + max(interval, 1.0)
                self.next_tick_deadline = due + self._request_budget()
                stop.wait(max(0.0, due - self.clock.monotonic()))
                continue
            self._crashes.clear()
            if self._pending_request is not None:
                # Between two polls: the request numbers its records after this poll's.
                self.seq = self._pending_request.retry(self.seq, self.clock.wall())
            now = self.clock.monotonic()
            if result.outcome.good:
                due = next_due(due, now, interval)
            else:
                due = now + retry_delay(result, self._failures.count, interval)
            # The wait for the next poll (a backoff may last a minute) is part of the deadline.
            self.next_tick_deadline = due + self._request_budget()
            stop.wait(max(0.0, due - self.clock.monotonic()))

    def _request_budget(self) -> float:
        """Longest a poll may take: the request's timeout (long until IMDS first answered)
        plus slack for parsing, committing and handing over."""
        first = self.last_good_monotonic is None
        timeout = self.config.imds_first_timeout if first else self.config.imds_timeout
        return timeout + 10.0

    def _log_silence(self, result: PollResult, now: float) -> None:
        # Off Azure the default endpoint never answers: say so at a steady pace rather than
        # once, so a user watching the log is not left with minutes of silence.
        if result.outcome.good or self.last_good_monotonic is not None:
            return
        if result.outcome is Outcome.API_VERSION_REFUSED:
            return  # IMDS did answer; its own error line said what to do
        first = self._silence.current is None  # the outcome line just said it
        if not self._silence.hit(repeat_after=SILENCE_LOG_EVERY) or first:
            return
        run = self._silence.current
        log.warning(
            "IMDS at %s has not given a document since the start %.0f s ago (last: %s: %s). "
            "On an Azure VM it can take up to 2 minutes to enable itself; off Azure, "
            "'scheduled-events-exporter demo' runs against a simulated IMDS.",
            self.config.imds_endpoint, now - (run.since if run else now),
            result.outcome.value, result.error or "no detail")

    def _log_outcome(self, result: PollResult) -> None:
        # Once per outcome change, not once per second: a 410 minute is one line, not sixty.
        # 200 and 304 are both "good" and alternate constantly, so they count as one outcome.
        key = "good" if result.outcome.good else result.outcome.value
        previous = self._outcomes.current
        if not self._outcomes.hit(key):
            return
        if result.outcome.good:
            if previous is None:
                log.info("IMDS answered: first document received")
            else:
                log.info("IMDS answering again after %s", previous.key)
        elif result.outcome is Outcome.GONE:
            # The documentation says about a minute after start; on real VMs it has lasted
            # 2-3 minutes. Readiness says when it lasts too long; the log says it once.
            log.info("IMDS answered 410 Gone (normal while the service enables itself: a "
                     "minute or two, seen up to 3 after a start); retrying every few seconds")
        elif result.outcome is Outcome.API_VERSION_REFUSED:
            log.error("%s", result.error)
        else:
            log.warning("IMDS request failed (%s): %s", result.outcome.value, result.error)


def with_vm_name(instance: InstanceInfo, fallback: str) -> InstanceInfo:
    """Use ``fallback`` (the host name) as VM name until instance metadata tells the truth."""
    return instance if instance.vm_name else replace(instance, vm_name=fallback)
