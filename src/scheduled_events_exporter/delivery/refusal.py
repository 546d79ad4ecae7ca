"""What a peer's answer to one request implies for the records, given the answers before it
(pure): the delivery worker's *decide* step, between reading the answer (the sinks' adapters
classify it into a :class:`~.outcome.FailureKind`) and acting on it (:mod:`.worker`).

The rule must always make progress. A record the peer refuses on its own, for good, must not
hold every record behind it, and a peer that refuses everything for a while (an overload, a
quota) must not have its records dead-lettered. Both answer the same way to one request; they
differ in what happens to the *other* records. So:

* accepted: delivered;
* permanent (HTTP 400, gRPC ``INVALID_ARGUMENT``): a batch is sent again one record at a time
  to find the culprit; a record refused alone is dead-lettered;
* refused for its size with proof (HTTP 413, gRPC's own "larger than max"), or without a
  reason but larger than anything the peer accepted (:mod:`.bound`) outside a busy streak: a
  batch is halved; a record refused alone with proof is tried once more after a pause, then
  dead-lettered, whatever larger request passed before (a proxy that limits the *compressed*
  body, or a limit that dropped, refuses a record smaller than what passed);
* refused in a way the peer's protocol calls retryable (429, 502-504, ``UNAVAILABLE``, any
  answer with ``Retry-After`` or ``RetryInfo``) or not answered at all: the peer is busy or
  away, whatever it was sent. Retried after a pause, in order, for as long as it lasts;
* refused in a way the protocol calls final but that we retry all the same, because busy
  collectors answer it too (``RESOURCE_EXHAUSTED`` without ``RetryInfo``, a 500, gRPC
  ``INTERNAL``): retried after a pause, but it may be about the record. When the requests led
  by one record were refused so :data:`SUSPECT_AFTER` times in a row, that record is sent
  alone; refused alone again, it is *suspect*, and the record behind it is sent alone, ahead of
  it (the *probe*). If the probe is refused too (in any way that convicts nothing), the peer is
  busy: nothing is dead-lettered, the count starts again, however long the overload lasts. If
  the probe passes, the suspect is tried once more at once, and refused again it is the cause:
  it is dead-lettered, and the records behind it flow;
* configuration (401, 403, 404): retried, never counted against a record: it refuses every one.

The bound: while the peer accepts other records, a record is delivered or dead-lettered after
at most :data:`MOST_REQUESTS` refused requests that carry it, besides the halvings of a batch
refused for its size (each halves the request: at most 8 from a full batch of 256), each after
a pause of at most the backoff cap (30 s) or the peer's capped ``Retry-After`` (60 s); while the
peer refuses everything, nothing is dead-lettered but what it refuses for good.

A probe that passes is delivered before the suspect: the one case where a sink receives two
records out of order, and, should the exporter crash before the suspect is settled, the one
where the probe is delivered again (the ack cursor cannot pass the suspect).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, replace

from scheduled_events_exporter.delivery.outcome import FailureKind

#: Refusals in a row, without a reason that convicts the record, of requests led by one record
#: before it is sent alone, and (counting on) before the record behind it probes the peer.
SUSPECT_AFTER = 3
#: Refusals of a record alone with proof of its size before it is dead-lettered.
PROVEN_TRIES = 2
#: Refused requests that carry one record, at most, before it is delivered or dead-lettered
#: while the peer takes other records, besides the halvings of a batch refused for its size
#: (each halves the request): the refusals that make it suspect (as part of a batch, then
#: alone), then one more after a probe passed; a proven size takes fewer.
MOST_REQUESTS = SUSPECT_AFTER + 2


@dataclass(frozen=True, slots=True)
class Request:
    """What one request carried: the sequence numbers of its first and last records, how many,
    and about how many bytes; ``probe``: the record behind a suspect, sent alone ahead of it."""

    first: int
    last: int
    count: int
    size: int
    probe: bool = False


@dataclass(frozen=True, slots=True)
class Answer:
    """What the peer's answer came to: ``kind`` ``None`` when it accepted the request;
    ``proves_size``: the peer accepted smaller requests before and none this large (what makes a
    refusal without a reason evidence of size)."""

    kind: FailureKind | None
    proves_size: bool = False
    #: A refusal the peer's protocol calls final, retried by us all the same (``EXHAUSTED``;
    #: a 500): one that may be about the record. Any other refusal without a reason (busy,
    #: unavailable, throttled, no answer) is about the peer, and never makes a record suspect.
    suspicious: bool = False


@dataclass(frozen=True, slots=True)
class History:
    """What the answers so far imply (one per sink; a delivery resets most of it)."""

    #: Send one record at a time through this sequence number (a batch was refused for good).
    isolate_until: int = 0
    #: The record the refusals in ``refusals`` are about (the first of the refused requests).
    head: int = 0
    #: Refusals in a row of requests led by ``head``, without a reason that convicts it.
    refusals: int = 0
    #: Refused alone with proof of its size: (sequence number, times).
    proven: tuple[tuple[int, int], ...] = ()
    #: A record refused alone :data:`SUSPECT_AFTER` times: the one behind it probes the peer.
    suspect: int = 0
    #: The probe passed: the suspect is tried once more, and refused it is the cause.
    confirming: bool = False
    #: Records settled (delivered or dead-lettered) ahead of the suspect.
    ahead: frozenset[int] = frozenset()
    #: In this streak of refusals the peer refused, without a reason, a request no larger than
    #: one it accepted: it is busy, and a larger request refused meanwhile proves no size.
    busy: bool = False

    def times_proven(self, seq: int) -> int:
        """How often ``seq`` was refused alone with proof of its size."""
        return next((n for s, n in self.proven if s == seq), 0)


class Act(enum.Enum):
    """What the worker does with the request's records."""

    #: Delivered: acknowledge through the request's last record (and what was settled ahead).
    DELIVERED = "delivered"
    #: The probe passed: settled ahead of the suspect; the suspect goes next, at once.
    DELIVERED_AHEAD = "delivered_ahead"
    #: Dead-letter the request's one record and go on with the next, at once.
    DEAD_LETTER = "dead_letter"
    #: Send the request's records again one at a time, at once (a culprit is among them).
    ISOLATE = "isolate"
    #: Halve the bytes one request may carry, then send again after a pause.
    HALVE = "halve"
    #: Send again after a pause (and count the failure).
    RETRY = "retry"


class Why(enum.Enum):
    """The reason behind a decision, for the log line the worker writes."""

    ACCEPTED = "accepted"
    REFUSED_FOR_GOOD = "refused for good"
    PROVEN_SIZE = "refused for its size"
    PROVEN_SIZE_AGAIN = "refused for its size again"
    INFERRED_SIZE = "refused without a reason, larger than any accepted"
    CONFIGURATION = "configuration"
    UNEXPLAINED = "refused without a reason that convicts it"
    NARROWED = "sent alone from now on"
    SUSPECTED = "suspect: the record behind it goes alone first"
    BUSY = "the probe was refused too: the peer is busy"
    PROBE_PASSED = "the probe passed"
    CONVICTED = "refused again after the probe passed"


@dataclass(frozen=True, slots=True)
class Decision:
    """The act, the history it leaves, whether a pause (backoff, or the peer's requested delay)
    comes before the next request, and why."""

    act: Act
    history: History
    pause: bool
    why: Why
    #: With ``HALVE``: whether the answer proved the size (a real limit is remembered).
    proven: bool = False


def decide(history: History, request: Request, answer: Answer) -> Decision:
    """What ``answer`` to ``request`` implies, after ``history``."""
    kind = answer.kind
    if kind is None:
        return _accepted(history, request)
    if kind is FailureKind.CONFIG:
        return Decision(Act.RETRY, history, True, Why.CONFIGURATION)
    if kind is FailureKind.PERMANENT:
        return _permanent(history, request)
    busy = history.busy or (kind is FailureKind.EXHAUSTED and not answer.proves_size)
    history = replace(history, busy=busy)
    if kind is FailureKind.TOO_LARGE or (kind is FailureKind.EXHAUSTED and not busy):
        proven = kind is FailureKind.TOO_LARGE
        if request.count > 1:
            return Decision(Act.HALVE, history, True,
                            Why.PROVEN_SIZE if proven else Why.INFERRED_SIZE, proven)
        if proven:
            return _proven_alone(history, request)
    return _unexplained(history, request, answer)


def _accepted(history: History, request: Request) -> Decision:
    if request.probe:
        ahead = history.ahead | {request.first}
        return Decision(Act.DELIVERED_AHEAD, replace(history, ahead=ahead, confirming=True),
                        False, Why.PROBE_PASSED)
    # The streak ends; one at a time goes on through what a refusal for good isolated, and
    # records settled ahead stay settled until the worker passes them.
    return Decision(Act.DELIVERED,
                    History(isolate_until=history.isolate_until, ahead=history.ahead),
                    False, Why.ACCEPTED)


def _permanent(history: History, request: Request) -> Decision:
    if request.count > 1:
        return Decision(Act.ISOLATE, replace(history, isolate_until=request.last), False,
                        Why.REFUSED_FOR_GOOD)
    return _dead_letter(history, request, Why.REFUSED_FOR_GOOD)


def _proven_alone(history: History, request: Request) -> Decision:
    times = history.times_proven(request.first) + 1
    if times >= PROVEN_TRIES or (history.confirming and request.first == history.suspect):
        return _dead_letter(history, request, Why.PROVEN_SIZE_AGAIN)
    # Two are remembered at most: the suspect's and its probe's (older ones are settled).
    proven = (*[(s, n) for s, n in history.proven if s != request.first][-1:],
              (request.first, times))
    history = replace(history, proven=proven)
    if not request.probe:
        # A refusal alone all the same: it counts towards suspicion, so a record that mixes
        # answers is not tried longer than one that repeats itself.
        refusals = history.refusals + 1 if history.head == request.first else 1
        history = replace(history, head=request.first, refusals=refusals,
                          suspect=request.first if refusals >= SUSPECT_AFTER
                          else history.suspect)
    return Decision(Act.RETRY, history, True, Why.PROVEN_SIZE)


def _unexplained(history: History, request: Request, answer: Answer) -> Decision:
    if request.probe:
        # The record behind the suspect is refused just the same: the peer refuses whatever
        # it gets, so the suspect is not the cause. The count starts again.
        return Decision(Act.RETRY, replace(history, head=history.suspect, refusals=0,
                                           suspect=0, confirming=False), True, Why.BUSY)
    if not answer.suspicious:
        return Decision(Act.RETRY, history, True, Why.UNEXPLAINED)
    if history.confirming and request.first == history.suspect:
        return _dead_letter(history, request, Why.CONVICTED)
    refusals = history.refusals + 1 if history.head == request.first else 1
    history = replace(history, head=request.first, refusals=refusals)
    if refusals < SUSPECT_AFTER:
        return Decision(Act.RETRY, history, True, Why.UNEXPLAINED)
    if request.count > 1:
        return Decision(Act.RETRY, history, True, Why.NARROWED)
    return Decision(Act.RETRY, replace(history, suspect=request.first), True, Why.SUSPECTED)


def _dead_letter(history: History, request: Request, why: Why) -> Decision:
    if request.probe:
        # The probe itself is refused for good: settled ahead; the suspect's question is still
        # open, and the next record behind probes.
        return Decision(Act.DEAD_LETTER, replace(history, ahead=history.ahead | {request.first}),
                        False, why)
    # The head is settled: what the refusals were about is gone with it.
    return Decision(Act.DEAD_LETTER,
                    History(isolate_until=history.isolate_until, ahead=history.ahead,
                            busy=history.busy),
                    False, why)


@dataclass(frozen=True, slots=True)
class Shape:
    """What the next request carries: from ``first``, one record (``alone``) or as many as
    the bounds allow; ``probe``: ``first`` is the record behind the suspect."""

    first: int
    alone: bool
    probe: bool = False


def next_request(history: History, waiting: Sequence[int]) -> Shape | None:
    """The next request's shape, given the sequence numbers ``waiting`` in the queue, in
    order (those settled ahead are skipped); ``None`` when nothing waits."""
    pending = [seq for seq in waiting if seq not in history.ahead]
    if not pending:
        return None
    head = pending[0]
    if history.suspect == head and not history.confirming and len(pending) > 1:
        return Shape(pending[1], alone=True, probe=True)
    alone = (head <= history.isolate_until or history.suspect == head
             or (history.head == head and history.refusals >= SUSPECT_AFTER))
    return Shape(head, alone=alone)
