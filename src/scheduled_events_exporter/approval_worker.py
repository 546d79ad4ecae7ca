"""The approval worker (docs/semantics.md#approval-opt-in): hook (:mod:`.hook`), then ``POST
StartRequests``, on its own
thread.

The poll thread only calls :meth:`Approver.offer` (keep the latest document, O(1)) and
:meth:`Approver.drain` (take finished records): a slow hook or retried POST never delays a poll.
Only the latest document is kept (events that left it are gone from the work), and one worker
means an event is never handled twice at once.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Final

import urllib3
from urllib3.exceptions import HTTPError
from urllib3.exceptions import TimeoutError as Urllib3Timeout

from scheduled_events_exporter import api_versions
from scheduled_events_exporter.approval_rules import (
    ApprovalConfig,
    Decision,
    ReportOnce,
    decide,
)
from scheduled_events_exporter.hook import run_hook
from scheduled_events_exporter.imds import events_path
from scheduled_events_exporter.model import STATUS_SCHEDULED, ScheduledEvent, Transition
from scheduled_events_exporter.model import TransitionKind as Kind
from scheduled_events_exporter.records import for_log

log = logging.getLogger(__name__)

_POST_HEADERS: Final = {"Metadata": "true", "Content-Type": "application/json"}
#: Waits before the 2nd, 3rd and 4th POST (docs/semantics.md#approval-opt-in: retried up to 3
#: times with backoff).
RETRY_DELAYS: Final = (1.0, 2.0, 4.0)
#: Successful approvals remembered (and persisted): years of events for one VM, a few KB.
MAX_APPROVED: Final = 1000


@dataclass(frozen=True, slots=True)
class PostResult:
    """How one approval POST ended: an HTTP status, or ``None`` with the network error.

    IMDS answers 200 for a valid EventId, even one another VM approved already.
    """

    status: int | None
    error: str = ""

    @property
    def ok(self) -> bool:
        """A 2xx answer."""
        return self.status is not None and 200 <= self.status < 300

    def describe(self) -> str:
        """``HTTP 500: {...}`` or the network error."""
        if self.status is None:
            return self.error
        return f"HTTP {self.status}: {self.error}" if self.error else f"HTTP {self.status}"


@dataclass(frozen=True, slots=True)
class _Offer:
    events: tuple[ScheduledEvent, ...]
    incarnation: int
    seq: int


class Approver:
    """Approves events on this VM per :class:`ApprovalConfig`; the worker starts at once.

    Thread-safe: :meth:`offer`, :meth:`drain`, :meth:`approved_ids` may be
    called from any thread and never wait for a hook or a POST. ``on_outcome`` is called on
    the worker thread with each outcome label (:data:`~approval_rules.Outcome`) as it is reported.
    """

    def __init__(
        self,
        config: ApprovalConfig,
        *,
        endpoint: str,
        timeout: float,
        vm_name: Callable[[], str],
        already_approved: Iterable[str],
        clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
        on_outcome: Callable[[str], None] | None = None,
        retry_delays: Sequence[float] = RETRY_DELAYS,
        api_version: str = api_versions.DEFAULT,
    ) -> None:
        self._config = config
        self._path = events_path(api_version)
        self._timeout = timeout
        self._vm_name = vm_name
        self._clock = clock
        self._on_outcome = on_outcome
        self._retry_delays = tuple(retry_delays)
        # Our own connection: a POST waiting on IMDS must never hold the poller's.
        self._pool = urllib3.connection_from_url(endpoint, maxsize=1, block=False,
                                                 retries=False, timeout=timeout)
        self._cond = threading.Condition()
        self._stopping = threading.Event()
        self._latest: _Offer | None = None
        self._handled = 0  # seq of the last offer fully handled
        self._results: list[Transition] = []
        # Insertion-ordered, so the oldest approvals are the ones forgotten past MAX_APPROVED.
        self._approved: dict[str, None] = dict.fromkeys(list(already_approved)[-MAX_APPROVED:])
        # Worker-only state (no lock): what was reported, and events given up on.
        self._reported = ReportOnce()
        self._finished: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="approver", daemon=True)
        self._thread.start()

    def offer(self, events: Sequence[ScheduledEvent], incarnation: int) -> None:
        """Hand over the events of a good document (replaces any not yet looked at)."""
        with self._cond:
            seq = self._latest.seq + 1 if self._latest else 1
            self._latest = _Offer(tuple(events), incarnation, seq)
            self._cond.notify_all()

    def drain(self) -> list[Transition]:
        """The ``approved``/``approval_skipped`` transitions since the last call (each once)."""
        with self._cond:
            results, self._results = self._results, []
        return results

    def approved_ids(self) -> frozenset[str]:
        """EventIds approved successfully (including ``already_approved``), for the state file."""
        with self._cond:
            return frozenset(self._approved)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every offer so far is fully handled (hook, POSTs); False on timeout."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self._latest is None or self._handled == self._latest.seq, timeout
            )

    def stop(self, timeout: float) -> None:
        """Stop the worker: a running hook is killed, a retry wait cut short; returns within
        ``timeout`` (a POST already on the wire ends within the request timeout)."""
        self._stopping.set()
        with self._cond:  # wake the worker if it waits for a document
            self._cond.notify_all()
        self._thread.join(timeout)
        self._pool.close()

    def _next(self, seen: int) -> _Offer | None:
        """The latest offer once it differs from ``seen``; None when stopping."""
        with self._cond:
            self._cond.wait_for(lambda: self._stopping.is_set() or (
                self._latest is not None and self._latest.seq != seen))
            return None if self._stopping.is_set() else self._latest

    def _run(self) -> None:
        seen = 0
        while (offer := self._next(seen)) is not None:
            seen = offer.seq
            try:
                again = self._handle(offer)
            except Exception:  # a bug here must not end approvals for the process lifetime
                log.exception("approval worker: unexpected error; waiting for the next document")
                again = False
            with self._cond:
                if again:
                    seen = 0  # the hook or POST took time: look at the latest document again
                elif self._latest is not None and self._latest.seq == offer.seq:
                    self._handled = offer.seq
                    self._cond.notify_all()

    def _handle(self, offer: _Offer) -> bool:
        """Decide on every event; report skips; approve at most one. True if it approved (or
        tried to), so the caller re-reads the latest document before the next."""
        present = {e.event_id for e in offer.events}
        self._reported.retain(present)
        self._finished &= present
        vm_name = self._vm_name()
        for event in offer.events:
            if self._stopping.is_set():
                return False
            if event.event_id in self._finished:
                continue
            decision = decide(event, vm_name=vm_name, config=self._config,
                              already_approved=self._approved)
            if decision is None:
                continue
            if decision.action == "skip":
                if self._reported.first(event.event_id, decision.reason):
                    self._report(Kind.APPROVAL_SKIPPED, event, offer, None,
                                 f"{decision.reason}: {decision.detail}", decision.reason)
                continue
            self._approve(event, decision, offer)
            return True
        return False

    def _approve(self, event: ScheduledEvent, decision: Decision, offer: _Offer) -> None:
        event_id = event.event_id
        detail = f"rule {decision.rule}"
        if self._config.hook:
            hook = run_hook(self._config.hook, event, self._config.hook_timeout,
                            cancel=self._stopping)
            if self._stopping.is_set():
                return  # shutting down: not the hook's fault, and nobody drains any more
            if not hook.ok:
                log.warning("approval hook for %s failed: %s%s", for_log(event_id),
                            hook.describe(),
                            f"; output: {hook.output[-500:]}" if hook.output else "")
                self._finished.add(event_id)
                self._report(Kind.APPROVAL_SKIPPED, event, offer, None,
                             f"hook_failed: {hook.describe()} ({detail})", "hook_failed")
                return
            detail += f"; hook exit 0 after {hook.duration:.1f} s"
            if not self._still_scheduled(event_id):
                # Approved elsewhere, started at NotBefore, or cancelled while we prepared:
                # there is nothing left to approve and the tracker reports what happened.
                log.info("event %s is no longer Scheduled after the hook; not approving",
                         for_log(event_id))
                return
        last = PostResult(None)
        attempts = 1 + len(self._retry_delays)
        for attempt in range(1, attempts + 1):
            last = self._post(event_id)
            if last.ok:
                with self._cond:
                    self._approved[event_id] = None
                    while len(self._approved) > MAX_APPROVED:
                        del self._approved[next(iter(self._approved))]
                detail += f"; attempt {attempt}" if attempt > 1 else ""
                self._report(Kind.APPROVED, event, offer, last.status, detail, "approved")
                return
            log.warning("approval POST for %s failed (%s), attempt %d of %d", for_log(event_id),
                        last.describe(), attempt, attempts)
            if attempt == attempts:
                break
            if self._stopping.wait(self._retry_delays[attempt - 1]):
                return
            if not self._still_scheduled(event_id):
                detail += "; not retried: the event is no longer Scheduled"
                break
        self._finished.add(event_id)
        self._report(Kind.APPROVAL_SKIPPED, event, offer, last.status,
                     f"post_failed: {last.describe()} after {attempt} attempt"
                     f"{'s' if attempt > 1 else ''} ({detail})", "post_failed")

    def _still_scheduled(self, event_id: str) -> bool:
        with self._cond:
            latest = self._latest
        events = latest.events if latest else ()
        return any(e.event_id == event_id and e.status == STATUS_SCHEDULED for e in events)

    def _post(self, event_id: str) -> PostResult:
        body = json.dumps({"StartRequests": [{"EventId": event_id}]}, separators=(",", ":"))
        try:
            # No redirects (an IMDS that redirects is not IMDS), no urllib3 retries (ours are
            # reported and bounded), never a proxy (urllib3 does not read HTTP_PROXY).
            response = self._pool.urlopen(
                "POST", self._path, body=body.encode(), headers=_POST_HEADERS, redirect=False,
                retries=False, preload_content=False,
                timeout=urllib3.Timeout(connect=min(self._timeout, 5.0), read=self._timeout))
            try:
                data = response.read(513)
                if len(data) <= 512:
                    response.drain_conn()
                else:
                    response.close()  # an unread rest would poison the next request
            finally:
                response.release_conn()
        except Urllib3Timeout:
            return PostResult(None, f"no answer in {self._timeout:g} s")
        except (HTTPError, OSError) as exc:
            return PostResult(None, f"connection error: {str(exc)[:200] or type(exc).__name__}")
        text = data[:200].decode("utf-8", errors="replace").strip()
        return PostResult(response.status, "" if 200 <= response.status < 300 else text)

    def _report(self, kind: Kind, event: ScheduledEvent, offer: _Offer,
                status: int | None, reason: str, outcome: str) -> None:
        label = None if kind is Kind.APPROVED else outcome  # the bare reason word
        transition = Transition(kind=kind, at=self._clock(), incarnation=offer.incarnation,
                                event=event, approval_status=status, approval_reason=label,
                                approval_detail=reason.removeprefix(f"{outcome}: ") or None)
        with self._cond:
            self._results.append(transition)
        if self._on_outcome is not None:
            try:
                self._on_outcome(outcome)
            except Exception:  # a metrics hiccup must not lose the record or stop the worker
                log.exception("approval outcome callback failed")
