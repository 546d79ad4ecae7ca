"""The refusal rule (delivery/refusal.py), pure: what each answer a peer can give implies after
each history of answers, as a table; and the two promises it must keep over any run of answers,
as properties: a record that the peer refuses while it takes others is settled within a bound,
and a peer that refuses everything without a reason that convicts a record never has anything
dead-lettered.

The answers are the real ones, read by the OTLP sink's own classifier (sinks/otlp_errors.py):
an HTTP status with or without ``Retry-After``, a gRPC status with or without ``RetryInfo``,
gRPC's own "larger than max", no answer at all, a partial success and an answer too large to
read (both accepted)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduled_events_exporter.delivery.outcome import FailureKind
from scheduled_events_exporter.delivery.refusal import (
    MOST_REQUESTS,
    SUSPECT_AFTER,
    Act,
    Answer,
    History,
    Request,
    Shape,
    Why,
    decide,
    next_request,
)
from scheduled_events_exporter.sinks.otlp_errors import answer_kind, beyond_the_specification
from scheduled_events_exporter.sinks.otlp_transport import Answer as Reply

#: Every answer, as the transports report it, and the class the table is written for.
ANSWERS: dict[str, tuple[Reply, str]] = {
    "HTTP 200": (Reply(True, 200), "accept"),
    "HTTP 200 partial success": (Reply(True, 200, rejected=2, detail="2 dropped"), "accept"),
    "HTTP 200 answer too large to read": (Reply(True, 200, unread=True), "accept"),
    "gRPC OK": (Reply(True, "OK"), "accept"),
    "HTTP 400": (Reply(False, 400), "permanent"),
    "gRPC INVALID_ARGUMENT": (Reply(False, "INVALID_ARGUMENT"), "permanent"),
    "HTTP 401": (Reply(False, 401), "config"),
    "HTTP 403": (Reply(False, 403), "config"),
    "HTTP 404": (Reply(False, 404), "config"),
    "gRPC UNAUTHENTICATED": (Reply(False, "UNAUTHENTICATED"), "config"),
    "HTTP 413": (Reply(False, 413), "size"),
    "gRPC larger than max": (Reply(False, "RESOURCE_EXHAUSTED",
                                   detail="Received message larger than max (9 vs. 4)"), "size"),
    "HTTP 429": (Reply(False, 429), "transient"),
    "HTTP 429 Retry-After": (Reply(False, 429, retry_after=8.0), "transient"),
    "HTTP 503": (Reply(False, 503), "transient"),
    "HTTP 503 Retry-After": (Reply(False, 503, retry_after=8.0), "transient"),
    "HTTP 500": (Reply(False, 500), "retried anyway"),
    "gRPC INTERNAL": (Reply(False, "INTERNAL"), "retried anyway"),
    "no answer": (Reply(False, None, detail="connection refused"), "transient"),
    "gRPC UNAVAILABLE": (Reply(False, "UNAVAILABLE"), "transient"),
    "gRPC UNAVAILABLE RetryInfo": (Reply(False, "UNAVAILABLE", retry_after=8.0), "transient"),
    "gRPC RESOURCE_EXHAUSTED RetryInfo": (Reply(False, "RESOURCE_EXHAUSTED", retry_after=8.0),
                                          "transient"),
    "gRPC RESOURCE_EXHAUSTED": (Reply(False, "RESOURCE_EXHAUSTED"), "exhausted"),
}

BATCH = Request(5, 9, 5, 5000)
ALONE = Request(5, 5, 1, 1000)
PROBE = Request(6, 6, 1, 1000, probe=True)


@dataclass(frozen=True)
class Case:
    """A history, whether a refusal without a reason would prove size (the peer accepted
    smaller requests and none this large), and the requests asked about."""

    history: History
    proves_size: bool
    requests: tuple[tuple[str, Request], ...]


HISTORIES: dict[str, Case] = {
    "first request": Case(History(), False, (("batch", BATCH), ("alone", ALONE))),
    "after a larger one was accepted": Case(History(), False,
                                            (("batch", BATCH), ("alone", ALONE))),
    "after smaller ones were accepted": Case(History(), True,
                                             (("batch", BATCH), ("alone", ALONE))),
    "within a busy streak": Case(History(head=5, refusals=1, busy=True), True,
                                 (("batch", BATCH), ("alone", ALONE))),
    "after a limit change": Case(History(proven=((5, 1),)), False,
                                 (("batch", BATCH), ("alone", ALONE))),
    "after two refusals": Case(History(head=5, refusals=2), False,
                               (("batch", BATCH), ("alone", ALONE))),
    "isolating a refused batch": Case(History(isolate_until=9), False, (("alone", ALONE),)),
    "probing behind a suspect": Case(History(head=5, refusals=3, suspect=5), False,
                                     (("probe", PROBE),)),
    "confirming after the probe passed": Case(
        History(head=5, refusals=3, suspect=5, confirming=True, ahead=frozenset({6})), False,
        (("alone", ALONE),)),
}

D, DA, DL, ISO, H, R = (Act.DELIVERED, Act.DELIVERED_AHEAD, Act.DEAD_LETTER, Act.ISOLATE,
                        Act.HALVE, Act.RETRY)
#: What a first request of each shape implies, per answer class.
PLAIN = {
    ("batch", "accept"): (D, Why.ACCEPTED),
    ("batch", "config"): (R, Why.CONFIGURATION),
    ("batch", "permanent"): (ISO, Why.REFUSED_FOR_GOOD),
    ("batch", "size"): (H, Why.PROVEN_SIZE),
    ("batch", "transient"): (R, Why.UNEXPLAINED),
    ("batch", "retried anyway"): (R, Why.UNEXPLAINED),
    ("batch", "exhausted"): (R, Why.UNEXPLAINED),
    ("alone", "accept"): (D, Why.ACCEPTED),
    ("alone", "config"): (R, Why.CONFIGURATION),
    ("alone", "permanent"): (DL, Why.REFUSED_FOR_GOOD),
    ("alone", "size"): (R, Why.PROVEN_SIZE),
    ("alone", "transient"): (R, Why.UNEXPLAINED),
    ("alone", "retried anyway"): (R, Why.UNEXPLAINED),
    ("alone", "exhausted"): (R, Why.UNEXPLAINED),
}
#: Where a history changes that, and only there.
EXPECTED: dict[str, dict[tuple[str, str], tuple[Act, Why]]] = {
    "first request": PLAIN,
    # What passed before does not change a refusal with proof: a proxy that limits the
    # compressed body, or a limit that dropped, refuses less than what passed.
    "after a larger one was accepted": PLAIN,
    "after smaller ones were accepted": {**PLAIN, ("batch", "exhausted"): (H, Why.INFERRED_SIZE)},
    "within a busy streak": PLAIN,
    "after a limit change": {**PLAIN, ("alone", "size"): (DL, Why.PROVEN_SIZE_AGAIN)},
    # Only a refusal the protocol calls final (retried anyway) counts against the record: an
    # answer it calls retryable is about the collector, never the record.
    "after two refusals": {**PLAIN, ("batch", "retried anyway"): (R, Why.NARROWED),
                           ("batch", "exhausted"): (R, Why.NARROWED),
                           ("alone", "retried anyway"): (R, Why.SUSPECTED),
                           ("alone", "exhausted"): (R, Why.SUSPECTED)},
    "isolating a refused batch": PLAIN,
    "probing behind a suspect": {
        ("probe", "accept"): (DA, Why.PROBE_PASSED),
        ("probe", "config"): (R, Why.CONFIGURATION),
        ("probe", "permanent"): (DL, Why.REFUSED_FOR_GOOD),
        ("probe", "size"): (R, Why.PROVEN_SIZE),
        ("probe", "transient"): (R, Why.BUSY),
        ("probe", "retried anyway"): (R, Why.BUSY),
        ("probe", "exhausted"): (R, Why.BUSY)},
    "confirming after the probe passed": {
        ("alone", "accept"): (D, Why.ACCEPTED),
        ("alone", "config"): (R, Why.CONFIGURATION),
        ("alone", "permanent"): (DL, Why.REFUSED_FOR_GOOD),
        ("alone", "size"): (DL, Why.PROVEN_SIZE_AGAIN),
        ("alone", "transient"): (R, Why.UNEXPLAINED),
        ("alone", "retried anyway"): (DL, Why.CONVICTED),
        ("alone", "exhausted"): (DL, Why.CONVICTED)},
}

TABLE = [(answer, history, shape) for answer in ANSWERS for history, case in HISTORIES.items()
         for shape, _ in case.requests]


def kind_of(reply: Reply) -> FailureKind | None:
    return None if reply.ok else answer_kind(reply)


def test_every_answer_class_has_a_row_for_every_history_and_shape() -> None:
    classes = {cls for _, cls in ANSWERS.values()}
    for history, case in HISTORIES.items():
        assert {(s, c) for s, _ in case.requests for c in classes} <= set(EXPECTED[history])
    assert len(TABLE) == 23 * 15  # 23 answers; 9 histories, 15 request shapes among them


@pytest.mark.parametrize(("answer", "history", "shape"), TABLE)
def test_decide(answer: str, history: str, shape: str) -> None:
    reply, cls = ANSWERS[answer]
    case = HISTORIES[history]
    request = dict(case.requests)[shape]
    decision = decide(case.history, request, Answer(kind_of(reply), case.proves_size,
                                                    beyond_the_specification(reply)))
    assert (decision.act, decision.why) == EXPECTED[history][(shape, cls)]
    # A pause comes before the next request after every refusal that leaves the records
    # where they were, and never after a delivery or a step that settles or narrows.
    assert decision.pause == (decision.act in (Act.RETRY, Act.HALVE))
    if decision.act is Act.HALVE:
        assert decision.proven == (cls == "size")


def test_a_probe_that_passes_is_settled_ahead_and_the_suspect_goes_next() -> None:
    history = HISTORIES["probing behind a suspect"].history
    decision = decide(history, PROBE, Answer(None))
    assert decision.history.ahead == {6} and decision.history.confirming
    assert next_request(decision.history, [5, 6, 7]) == Shape(5, alone=True)
    settled = decide(decision.history, ALONE, Answer(FailureKind.EXHAUSTED, suspicious=True))
    assert settled.act is Act.DEAD_LETTER
    # The head is settled; what the refusals were about goes with it, the probe stays settled.
    assert settled.history == History(ahead=frozenset({6}), busy=True)
    assert next_request(settled.history, [6, 7]) == Shape(7, alone=False)


def test_a_refused_probe_means_busy_and_the_count_starts_again() -> None:
    history = HISTORIES["probing behind a suspect"].history
    decision = decide(history, PROBE, Answer(FailureKind.EXHAUSTED, suspicious=True))
    assert decision.history.suspect == 0 and decision.history.refusals == 0
    assert next_request(decision.history, [5, 6]) == Shape(5, alone=False)


def test_the_next_request_is_shaped_by_the_history() -> None:
    assert next_request(History(), []) is None
    assert next_request(History(), [3, 4]) == Shape(3, alone=False)
    assert next_request(History(isolate_until=3), [3, 4]) == Shape(3, alone=True)
    assert next_request(History(isolate_until=3), [4, 5]) == Shape(4, alone=False)
    assert next_request(History(head=3, refusals=SUSPECT_AFTER), [3, 4]) == Shape(3, alone=True)
    assert next_request(History(head=3, refusals=SUSPECT_AFTER - 1), [3, 4]) == Shape(3, False)
    assert next_request(History(suspect=3), [3, 4]) == Shape(4, alone=True, probe=True)
    assert next_request(History(suspect=3), [3]) == Shape(3, alone=True)  # nothing behind it
    assert next_request(History(suspect=3, ahead=frozenset({4})), [3, 4, 5]) == Shape(
        5, alone=True, probe=True)


# --- the promises, over any run of answers ---------------------------------------------------
#: (kind, retried although the protocol calls it final): every refusal but a configuration
#: error, and, for a record the collector refuses, none the protocol calls retryable (those are
#: about the collector: a record refused only so waits as long as they last, by design).
REFUSALS = [(FailureKind.PERMANENT, False), (FailureKind.TOO_LARGE, False),
            (FailureKind.EXHAUSTED, True), (FailureKind.TRANSIENT, True)]
UNEXPLAINED = [(FailureKind.TRANSIENT, False), (FailureKind.TRANSIENT, True),
               (FailureKind.EXHAUSTED, True)]


@dataclass
class Run:
    """A queue driven by the rule alone: the bound is a record count, halved and doubled."""

    waiting: list[int]
    history: History = field(default_factory=History)
    bound: int = 256
    largest: int = 0
    settled: list[int] | None = None
    lettered: list[int] | None = None
    carried: dict[int, int] | None = None
    halvings: int = 0

    def __post_init__(self) -> None:
        self.settled, self.lettered, self.carried = [], [], {}

    def request(self) -> Request | None:
        shape = next_request(self.history, self.waiting)
        if shape is None:
            return None
        start = self.waiting.index(shape.first)
        chosen = [s for s in self.waiting[start:] if s not in self.history.ahead]
        chosen = chosen[:1] if shape.alone else chosen[:self.bound]
        return Request(chosen[0], chosen[-1], len(chosen), len(chosen) * 100, shape.probe)

    def step(self, answer: tuple[FailureKind, bool] | None) -> None:
        kind, suspicious = answer if answer is not None else (None, False)
        request = self.request()
        assert request is not None
        seqs = [s for s in self.waiting if request.first <= s <= request.last
                and s not in self.history.ahead]
        assert self.carried is not None and self.settled is not None
        assert self.lettered is not None
        for seq in seqs:
            self.carried[seq] = self.carried.get(seq, 0) + 1
        proves = 0 < self.largest < request.size
        decision = decide(self.history, request, Answer(kind, proves, suspicious))
        self.history = decision.history
        if decision.act is Act.DELIVERED:
            self.largest = max(self.largest, request.size)
            self.bound = min(256, self.bound * 2)
            self._settle(request.last)
        elif decision.act is Act.DELIVERED_AHEAD:
            self.largest = max(self.largest, request.size)
        elif decision.act is Act.DEAD_LETTER:
            self.lettered.append(request.first)
            if not request.probe:
                self._settle(request.first)
        elif decision.act is Act.HALVE:
            self.bound = max(1, min(self.bound, request.count) // 2)
            self.halvings += 1

    def _settle(self, last: int) -> None:
        assert self.settled is not None
        through = last
        for seq in self.waiting:
            if seq > last and seq in self.history.ahead:
                through = seq
            elif seq > last:
                break
        self.settled.extend(s for s in self.waiting if s <= through)
        self.waiting = [s for s in self.waiting if s > through]
        self.history = replace(self.history,
                               ahead=frozenset(s for s in self.history.ahead if s > through))


@settings(max_examples=300, deadline=None)
@given(culprit=st.integers(1, 40), behind=st.integers(1, 40),
       refusals=st.lists(st.sampled_from(REFUSALS), min_size=1, max_size=40))
def test_a_record_refused_while_the_peer_takes_others_is_settled_within_the_bound(
        culprit: int, behind: int, refusals: list[tuple[FailureKind, bool]]) -> None:
    # The peer refuses every request that carries the culprit (each time with the next answer
    # of the list, the last one repeated) and takes every other.
    run = Run(list(range(culprit, culprit + behind + 1)))
    answers = iter(refusals)
    last = refusals[-1]
    steps = 0
    while culprit in run.waiting and culprit not in (run.lettered or ()):
        request = run.request()
        assert request is not None
        carries = request.first <= culprit <= request.last and culprit not in run.history.ahead
        run.step(next(answers, last) if carries else None)
        steps += 1
        assert steps < 200, "no progress"
    assert run.carried is not None
    # At most the refusals that convict nothing (as a batch, then alone) and one after the
    # probe, or the tries a proven size gets; besides those, one request per halving (each
    # halves the request, so at most 8 from 256 records).
    assert run.halvings <= 8
    assert run.carried[culprit] - run.halvings <= MOST_REQUESTS, run.carried[culprit]
    while run.waiting:
        run.step(None if run.waiting[0] != culprit else last)
    assert set(run.settled or ()) >= set(range(culprit + 1, culprit + behind + 1))


@settings(max_examples=300, deadline=None)
@given(backlog=st.integers(1, 30),
       refusals=st.lists(st.sampled_from(UNEXPLAINED), min_size=1, max_size=200))
def test_a_peer_that_refuses_everything_without_reason_gets_nothing_dead_lettered(
        backlog: int, refusals: list[tuple[FailureKind, bool]]) -> None:
    # Two minutes of refusals is about 200 requests at the shortest backoff; however long,
    # nothing is dead-lettered, and afterwards everything is delivered in order.
    run = Run(list(range(1, backlog + 1)))
    run.largest = 10**9  # the peer took larger requests before: sizes prove nothing
    for kind in refusals:
        run.step(kind)
    assert run.lettered == [] and run.settled == []
    while run.waiting:
        run.step(None)
    assert run.settled == list(range(1, backlog + 1))


def test_a_suspect_with_nothing_behind_it_gets_its_two_tries_with_proof_of_size() -> None:
    # Nothing to probe with: the suspect goes alone again, and a 413 is its first proof, not
    # a conviction (the probe's evidence is missing): one more try, then the letter.
    history = History(head=5, refusals=SUSPECT_AFTER, suspect=5)
    assert next_request(history, [5]) == Shape(5, alone=True)
    first = decide(history, Request(5, 5, 1, 900), Answer(FailureKind.TOO_LARGE))
    assert (first.act, first.why) == (Act.RETRY, Why.PROVEN_SIZE)
    second = decide(first.history, Request(5, 5, 1, 900), Answer(FailureKind.TOO_LARGE))
    assert (second.act, second.why) == (Act.DEAD_LETTER, Why.PROVEN_SIZE_AGAIN)


def test_a_proof_of_size_counts_towards_suspicion_for_its_own_record_only() -> None:
    # Refusals of another record do not add up with this one's: its count starts at one.
    other = decide(History(head=4, refusals=2), Request(5, 5, 1, 900),
                   Answer(FailureKind.TOO_LARGE))
    assert (other.history.head, other.history.refusals, other.history.suspect) == (5, 1, 0)
    # Its own refusals do, one each: the third makes it the suspect.
    own = decide(History(head=5, refusals=1), Request(5, 5, 1, 900),
                 Answer(FailureKind.TOO_LARGE))
    assert (own.history.head, own.history.refusals, own.history.suspect) == (5, 2, 0)
    third = decide(History(head=5, refusals=2), Request(5, 5, 1, 900),
                   Answer(FailureKind.TOO_LARGE))
    assert (third.history.refusals, third.history.suspect) == (3, 5)


def test_the_proofs_remembered_are_this_records_and_the_latest_others() -> None:
    # Two at most (the suspect's and its probe's): older ones are settled and forgotten.
    history = History(proven=((2, 1), (3, 1), (4, 1)))
    decision = decide(history, Request(5, 5, 1, 900), Answer(FailureKind.TOO_LARGE))
    assert decision.history.proven == ((4, 1), (5, 1))


def test_a_probe_refused_for_good_is_settled_ahead_and_the_next_record_probes() -> None:
    history = HISTORIES["probing behind a suspect"].history
    decision = decide(history, PROBE, Answer(FailureKind.PERMANENT))
    assert (decision.act, decision.why) == (Act.DEAD_LETTER, Why.REFUSED_FOR_GOOD)
    # The suspect's question is still open: the record behind the probe asks it.
    assert decision.history.ahead == {6} and decision.history.suspect == 5
    assert next_request(decision.history, [5, 6, 7]) == Shape(7, alone=True, probe=True)


def test_a_refused_probe_gives_the_count_back_to_the_suspect() -> None:
    history = HISTORIES["probing behind a suspect"].history
    decision = decide(history, PROBE, Answer(FailureKind.EXHAUSTED, suspicious=True))
    assert (decision.history.head, decision.history.confirming) == (5, False)


def test_a_suspicious_refusal_counts_for_its_own_record_only() -> None:
    other = decide(History(head=4, refusals=2), ALONE,
                   Answer(FailureKind.EXHAUSTED, suspicious=True))
    assert (other.history.head, other.history.refusals, other.history.suspect) == (5, 1, 0)


def test_a_batch_of_two_refused_the_third_time_is_narrowed_not_suspected() -> None:
    decision = decide(History(head=5, refusals=SUSPECT_AFTER - 1), Request(5, 6, 2, 2000),
                      Answer(FailureKind.EXHAUSTED, suspicious=True))
    assert (decision.why, decision.history.suspect) == (Why.NARROWED, 0)


def test_an_acceptance_keeps_what_was_settled_ahead() -> None:
    decision = decide(History(head=5, refusals=1, ahead=frozenset({6})), ALONE, Answer(None))
    assert decision.act is Act.DELIVERED
    assert decision.history == History(ahead=frozenset({6}))
