"""The delivery worker's rules one at a time (delivery/worker.py), in-process, on real spool and
dead-letter files: what it sends after each kind of refusal (split a batch refused for good,
halve a request refused for its size, a refusal without a reason: busy or too large, a record
refused alone twice), how it counts and says each failure, what ``status()`` (``/readyz``)
reports, the outbox handed over at start, the bounds of its queue, a spool or dead-letter file
that cannot be written and is repaired while idle, and how ``flush``/``stop`` end.

The peer is the worker's ``deliver`` callable, scripted per attempt: the protocol adapters in
``sinks/`` turn a collector's answer into exactly these ``DeliveryError``s (tests/
test_failure_classes.py); the process tests (tests/test_overload.py, tests/test_outage.py) run
the same paths against real collectors."""

from __future__ import annotations

import errno
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import TypeVar

import pytest

from scheduled_events_exporter.codec import UnreadableLine, encode_record
from scheduled_events_exporter.delivery import worker as worker_module
from scheduled_events_exporter.delivery.dead_letter import DeadLetterFile
from scheduled_events_exporter.delivery.outcome import DeliveryError, FailureKind, SinkStatus
from scheduled_events_exporter.delivery.pause import Pause
from scheduled_events_exporter.delivery.spool import Spool
from scheduled_events_exporter.delivery.worker import MAX_BATCH_BYTES, DeliveryWorker
from scheduled_events_exporter.model import InstanceInfo, ScheduledEvent, Transition, TransitionKind
from scheduled_events_exporter.platforms.durable import DiskStep, set_step_hook
from scheduled_events_exporter.records import TransitionRecord, approximate_size

AT = datetime(2026, 11, 27, tzinfo=timezone.utc)
LOGGER = worker_module.__name__
T = TypeVar("T")


def record(seq: int, text: str = "", *, event: bool = True) -> TransitionRecord:
    """Sequence numbers 1-9 give records of one size (the ids have one digit)."""
    happened = ScheduledEvent(f"E{seq}", "Scheduled", "Reboot", resources=("vm",),
                              description=text)
    return TransitionRecord(
        Transition(TransitionKind.SCHEDULED, AT, seq, happened if event else None),
        InstanceInfo(vm_name="vm"), f"rid-{seq}", True, "0.1.0", seq)


S = approximate_size(record(1))
Answer = Callable[[int, list[int]], "DeliveryError | Exception | None"]


class Peer:
    """The sink: ``answer(attempt, seqs)`` says what each attempt gets (``None``: accepted)."""

    def __init__(self, answer: Answer | None = None) -> None:
        self.answer: Answer = answer or (lambda n, seqs: None)
        self.attempts: list[list[int]] = []
        self.accepted: list[int] = []

    def __call__(self, records: Sequence[TransitionRecord]) -> None:
        seqs = [r.seq for r in records]
        self.attempts.append(seqs)
        error = self.answer(len(self.attempts), seqs)
        if error is not None:
            raise error
        self.accepted.extend(seqs)


class Rig:
    """A worker on a peer, with its spool and dead-letter file under ``root`` (if given), the
    failures it counts, and a test clock (``now``) when ``fake_clock``."""

    def __init__(self, root: Path | None = None, answer: Answer | None = None, *,
                 fake_clock: bool = False, backoff: tuple[float, float] = (0.001, 0.001),
                 max_records: int = 1000, max_bytes: int = 1 << 62, shared_pause: bool = False,
                 dead_letter: bool = True, spool: bool = True) -> None:
        self.peer = Peer(answer)
        self.failures: list[tuple[str, str, int]] = []
        self.now = 0.0
        #: Added to the test clock at every reading (at the end: lets a stop's flush finish).
        self.tick = 0.0
        clock = self.clock if fake_clock else time.monotonic
        #: A pause shared with another sender to the same peer (the metric exporter).
        self.pause = Pause(clock) if shared_pause else None
        self.letters = DeadLetterFile(root) if root is not None and dead_letter else None
        self.spool = Spool(root / "spool", "otlp") if root is not None and spool else None
        self.worker = DeliveryWorker(
            "otlp", self.peer, lambda *f: self.failures.append(f), max_records=max_records,
            max_bytes=max_bytes, spool=self.spool, dead_letter=self.letters,
            payload=lambda r: {"sent": r.record_id}, backoff=backoff, pause=self.pause,
            clock=clock)

    def clock(self) -> float:
        self.now += self.tick
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the test clock and wake the worker to look at its pause again."""
        self.now += seconds
        self.worker.flush(0)

    @contextmanager
    def running(self) -> Iterator[DeliveryWorker]:
        self.worker.start()
        try:
            yield self.worker
        finally:
            self.tick = 1.0
            self.worker.stop(5)

    def drain(self) -> None:
        assert within(20, lambda: self.worker.flush(15)), "not delivered"


def within(seconds: float, call: Callable[[], T]) -> T:
    """``call()``'s result; a failure (not a hang) when it does not return within ``seconds``."""
    out: list[T] = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"did not return within {seconds} s"
    assert out, "raised"
    return out[0]


def wait_until(condition: Callable[[], object], what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s"
        time.sleep(0.002)


def said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def letters_in(root: Path) -> list[dict[str, object]]:
    path = root / "dead-letter.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def held_until(release: threading.Event, seconds: float) -> Answer:
    """A peer that answers (accepts) only once ``release`` is set (or after ``seconds``)."""

    def answer(n: int, seqs: list[int]) -> None:
        release.wait(seconds)

    return answer


def permanent(message: str, status: str = "HTTP 400") -> DeliveryError:
    return DeliveryError(message, FailureKind.PERMANENT, status)


# --- what is sent after each kind of refusal --------------------------------------------------

def test_a_batch_refused_for_good_is_split_to_find_the_culprit(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rig: Rig

    def answer(n: int, seqs: list[int]) -> DeliveryError | None:
        if n == 1:  # queued while the batch is being split: sent together afterwards
            rig.worker.submit([record(6), record(7)])
        return permanent("rid-3: attribute too long") if 3 in seqs else None

    rig = Rig(tmp_path, answer)
    rig.worker.submit([record(s) for s in range(1, 6)])  # before the start: one batch
    with caplog.at_level(logging.WARNING, logger=LOGGER), rig.running():
        rig.drain()
    assert rig.peer.attempts == [[1, 2, 3, 4, 5], [1], [2], [3], [4], [5], [6, 7]]
    assert rig.peer.accepted == [1, 2, 4, 5, 6, 7]
    [letter] = letters_in(tmp_path)
    assert {k: letter[k] for k in ("sink", "status", "reason", "record_id", "seq", "payload",
                                   "record")} == {
        "sink": "otlp", "status": "HTTP 400", "reason": "rid-3: attribute too long",
        "record_id": "rid-3", "seq": 3, "payload": {"sent": "rid-3"},
        "record": encode_record(record(3))}
    assert rig.failures == [("otlp", "dead_letter", 1)]
    assert said(caplog) == [
        "sink otlp: a batch of 5 records was rejected (HTTP 400); sending them one at a time "
        "to find the culprit",
        f"sink otlp: HTTP 400 rejected the record of EventId E3 (scheduled, RecordId rid-3, about "
        f"{S} bytes) permanently: rid-3: attribute too long; moved to "
        f"{tmp_path / 'dead-letter.jsonl'}; continuing with the next record"]
    status = rig.worker.status()
    assert (status.dead_lettered, status.pending, status.consecutive_failures) == (1, 0, 0)
    assert (tmp_path / "spool" / "otlp.ack").read_text() == "7"
    assert (tmp_path / "spool" / "otlp.log").read_bytes() == b""


def test_a_batch_of_two_refused_for_good_is_split_too(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    why = "no: " + "n" * 400
    rig = Rig(tmp_path, lambda n, seqs: permanent(why) if 2 in seqs else None)
    rig.worker.submit([record(1), record(2)])
    with caplog.at_level(logging.ERROR, logger=LOGGER), rig.running():
        rig.drain()
    assert rig.peer.attempts == [[1, 2], [1], [2]]
    assert [(x["record_id"], x["reason"]) for x in letters_in(tmp_path)] == [("rid-2", why)]
    [message] = said(caplog)
    assert f"permanently: {why[:300]}; moved to" in message


def test_a_record_delivered_between_refusals_ends_the_streak(tmp_path: Path) -> None:
    rig = Rig(tmp_path, lambda n, seqs: permanent("no") if seqs[0] % 2 else None)
    with rig.running():
        for seq in (1, 2, 3):  # refused, delivered, refused: never two refused in a row
            rig.worker.submit([record(seq)])
            rig.drain()
        assert rig.worker.status().rejecting == ""
        rig.worker.submit([record(5)])
        rig.drain()
        assert rig.worker.status().rejecting.startswith(
            "the last 2 records were dead-lettered (HTTP 400); failing until the sink "
            "delivers a record")
    assert rig.peer.accepted == [2]


def test_a_refusal_without_a_status_or_an_event_is_named_as_such(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rig = Rig(tmp_path, lambda n, seqs: DeliveryError("refused", FailureKind.PERMANENT))
    rig.worker.submit([record(s, event=False) for s in range(1, 6)])
    with caplog.at_level(logging.ERROR, logger=LOGGER), rig.running():
        rig.drain()
        status = rig.worker.status()
    assert [x["status"] for x in letters_in(tmp_path)] == ["rejected"] * 5
    assert status.rejecting.startswith(
        "the last 5 records were dead-lettered (rejected); failing until")
    assert status.dead_lettered == 5
    assert said(caplog)[0] == (
        f"sink otlp: the sink rejected the record of EventId (none) (scheduled, RecordId rid-1, "
        f"about {approximate_size(record(1, event=False))} bytes) permanently: refused; moved "
        f"to {tmp_path / 'dead-letter.jsonl'}; continuing with the next record")
    assert rig.failures == [("otlp", "dead_letter", 1)] * 5


def too_large_above(limit: int, status: str = "HTTP 413",
                    kind: FailureKind = FailureKind.TOO_LARGE) -> Answer:
    """A peer that refuses every request of more than ``limit`` bytes."""

    def answer(n: int, seqs: list[int]) -> DeliveryError | None:
        if sum(approximate_size(record(s)) for s in seqs) > limit:
            return DeliveryError("too large", kind, status)
        return None

    return answer


def test_a_request_refused_for_its_size_is_halved_and_kept_small_while_remembered(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rig = Rig(tmp_path, too_large_above(5 * S // 2))
    rig.worker.submit([record(s) for s in range(1, 7)])
    with caplog.at_level(logging.WARNING, logger=LOGGER), rig.running():
        rig.drain()
        status = rig.worker.status()
    # Halved to 3 records, then to one and a half: one at a time, and no growing back within
    # the ten minutes a proven limit is remembered.
    assert rig.peer.attempts == [[1, 2, 3, 4, 5, 6], [1, 2, 3], [1], [2], [3], [4], [5], [6]]
    assert (status.request_bytes, status.max_request_bytes) == (3 * S // 2, MAX_BATCH_BYTES)
    assert rig.failures == [] and letters_in(tmp_path) == []
    assert said(caplog) == [
        f"sink otlp: a request of 6 records (about {6 * S} bytes) was refused for its size "
        f"(HTTP 413); after a pause, at most about {3 * S} bytes per request (growing back "
        "after 1 accepted in a row)",
        f"sink otlp: a request of 3 records (about {3 * S} bytes) was refused for its size "
        f"(HTTP 413); after a pause, at most about {3 * S // 2} bytes per request (growing back "
        "after 1 accepted in a row)"]


def test_a_refusal_without_a_reason_above_what_passed_halves_and_grows_back(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rig = Rig(tmp_path, too_large_above(5 * S // 2, "gRPC RESOURCE_EXHAUSTED",
                                        FailureKind.EXHAUSTED))
    rig.worker.submit([record(1)])
    with caplog.at_level(logging.WARNING, logger=LOGGER), rig.running():
        rig.drain()
        rig.worker.submit([record(s) for s in range(2, 6)])
        rig.drain()
        status = rig.worker.status()
    # 4 records refused after 1 passed: too large (inferred), halved to 2; each accepted
    # request doubles the bound again.
    assert rig.peer.attempts == [[1], [2, 3, 4, 5], [2, 3], [4, 5]]
    assert status.request_bytes == 8 * S
    assert rig.failures == []
    assert said(caplog) == [
        f"sink otlp: a request of 4 records (about {4 * S} bytes) was refused for its size "
        f"(gRPC RESOURCE_EXHAUSTED); after a pause, at most about {2 * S} bytes per request "
        "(growing back after 1 accepted in a row)"]


def test_a_refusal_without_a_reason_is_busy_for_the_rest_of_its_streak(tmp_path: Path) -> None:
    rig: Rig

    def answer(n: int, seqs: list[int]) -> DeliveryError | None:
        if n == 2:  # a request no larger than one that passed: busy
            rig.worker.submit([record(3), record(4)])
        if n in (2, 3):  # and a larger one refused in the same streak proves nothing
            return DeliveryError("busy", FailureKind.EXHAUSTED, "gRPC RESOURCE_EXHAUSTED")
        return None

    rig = Rig(tmp_path, answer)
    rig.worker.submit([record(1)])
    with rig.running():
        rig.drain()
        rig.worker.submit([record(2)])
        rig.drain()
        status = rig.worker.status()
    assert rig.peer.attempts == [[1], [2], [2, 3, 4], [2, 3, 4]]
    assert status.request_bytes == MAX_BATCH_BYTES
    assert rig.failures == [("otlp", "logs", 1)] * 2


def test_a_record_refused_alone_for_its_size_is_tried_once_more_then_dead_lettered(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    big = record(2, "x" * 4000)
    size = approximate_size(big)

    def answer(n: int, seqs: list[int]) -> DeliveryError | None:
        return DeliveryError("too large", FailureKind.TOO_LARGE, "HTTP 413") if 2 in seqs \
            else None

    rig = Rig(tmp_path, answer)
    rig.worker.submit([record(1), big, record(3)])
    with caplog.at_level(logging.WARNING, logger=LOGGER), rig.running():
        rig.drain()
    assert rig.peer.attempts == [[1, 2, 3], [1], [2], [2], [3]]
    assert [x["record_id"] for x in letters_in(tmp_path)] == ["rid-2"]
    assert rig.failures == [("otlp", "dead_letter", 1)]
    held = 2 * S + size
    assert said(caplog) == [
        f"sink otlp: a request of 3 records (about {held} bytes) was refused for its size "
        f"(HTTP 413); after a pause, at most about {held // 2} bytes per request (growing back "
        "after 1 accepted in a row)",
        f"sink otlp: the record of seq 2 (about {size} bytes) was refused for its size on its "
        "own (HTTP 413); trying it once more after a pause before it goes to the dead-letter "
        "file",
        f"sink otlp: HTTP 413 rejected the record of EventId E2 (scheduled, RecordId rid-2, "
        f"about {size} bytes) permanently: too large; moved to {tmp_path / 'dead-letter.jsonl'}; "
        "continuing with the next record"]


def test_a_record_refused_alone_with_proof_is_dead_lettered_whatever_passed_before(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # A proxy that limits the compressed body (or a limit that dropped) refuses a record no
    # larger than requests it accepted: the proof is the answer, not the sizes that passed.
    big = record(1, "x" * 4000)
    rig = Rig(tmp_path, lambda n, seqs: DeliveryError("too large", FailureKind.TOO_LARGE,
                                                      "HTTP 413") if 2 in seqs else None)
    rig.worker.submit([big])
    with caplog.at_level(logging.WARNING, logger=LOGGER), rig.running():
        rig.drain()
        rig.worker.submit([record(2), record(3)])
        rig.drain()
    assert approximate_size(big) > 2 * S
    assert rig.peer.attempts == [[1], [2, 3], [2], [2], [3]]
    assert [x["record_id"] for x in letters_in(tmp_path)] == ["rid-2"]
    assert rig.peer.accepted == [1, 3]
    assert rig.failures == [("otlp", "dead_letter", 1)]


def test_a_limit_that_drops_halves_the_requests_and_letters_only_what_alone_is_over_it(
        tmp_path: Path) -> None:
    # The collector took 3 records at once, then its limit dropped below one large record:
    # the requests are halved to what passes, the large record is tried twice on its own and
    # dead-lettered, and every record behind it is delivered, in order.
    limit = [10 * S]
    big = record(6, "x" * 3000)

    def answer(n: int, seqs: list[int]) -> DeliveryError | None:
        size = sum(approximate_size(big if s == 6 else record(s)) for s in seqs)
        return DeliveryError("too large", FailureKind.TOO_LARGE, "HTTP 413") \
            if size > limit[0] else None

    rig = Rig(tmp_path, answer)
    rig.worker.submit([record(1), record(2), record(3)])
    with rig.running():
        rig.drain()
        limit[0] = 3 * S // 2
        rig.worker.submit([record(4), record(5), big, record(7), record(8)])
        rig.drain()
    assert rig.peer.accepted == [1, 2, 3, 4, 5, 7, 8]
    assert [x["record_id"] for x in letters_in(tmp_path)] == ["rid-6"]
    assert rig.peer.attempts.count([6]) == 2


def test_a_record_refused_alone_with_proof_once_and_then_accepted_is_delivered(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rig = Rig(tmp_path, lambda n, seqs: DeliveryError("too large", FailureKind.TOO_LARGE,
                                                      "HTTP 413") if n == 2 else None)
    rig.worker.submit([record(1)])
    with caplog.at_level(logging.WARNING, logger=LOGGER), rig.running():
        rig.drain()
        rig.worker.submit([record(2)])
        rig.drain()
    assert rig.peer.attempts == [[1], [2], [2]]
    assert letters_in(tmp_path) == []
    assert rig.failures == []
    assert said(caplog) == [
        f"sink otlp: the record of seq 2 (about {S} bytes) was refused for its size on its own "
        "(HTTP 413); trying it once more after a pause before it goes to the dead-letter file"]


def test_any_failure_keeps_the_records_and_is_counted_once_per_attempt(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A sink may raise anything (a bug, a library's own error): the records stay, the error
    is named, and a second streak of failures is handled as the first."""
    checked = threading.Event()
    statuses: list[SinkStatus] = []
    rig: Rig
    boom = "boom " + "z" * 400

    def answer(n: int, seqs: list[int]) -> Exception | None:
        if n == 1:
            return RuntimeError(boom)
        if n == 2:
            statuses.append(rig.worker.status())  # while retrying
            checked.set()
        if n == 3:
            return DeliveryError("collector unreachable")
        return None

    rig = Rig(tmp_path, answer)
    rig.worker.submit([record(1)])
    with caplog.at_level(logging.WARNING, logger=LOGGER), rig.running():
        rig.drain()
        rig.worker.submit([record(2)])
        rig.drain()
        after = rig.worker.status()
    assert checked.is_set()
    assert rig.peer.attempts == [[1], [1], [2], [2]]
    [during] = statuses
    assert (during.consecutive_failures, during.last_error, during.config_error,
            during.pending) == (1, f"RuntimeError: {boom}"[:300], "", 1)
    assert (after.consecutive_failures, after.last_error, after.pending) == (0, "", 0)
    assert rig.failures == [("otlp", "logs", 1)] * 2
    assert said(caplog) == [
        f"sink otlp: delivery failed, will retry: {f'RuntimeError: {boom}'[:300]}",
        "sink otlp: delivering again after 1 failed attempts",
        "sink otlp: delivery failed, will retry: collector unreachable",
        "sink otlp: delivering again after 1 failed attempts"]


def test_a_configuration_error_is_said_loudly_again_every_five_minutes(
        caplog: pytest.LogCaptureFixture) -> None:
    up = threading.Event()
    unauthorized = "HTTP 401: the collector refused the credentials " + "c" * 300
    rig = Rig(None, lambda n, seqs: None if up.is_set() else DeliveryError(
        unauthorized, FailureKind.CONFIG, "HTTP 401"), fake_clock=True, backoff=(1.0, 1.0))
    loud = (f"sink otlp: {unauthorized[:300]}; nothing will be delivered until this is fixed "
            "(records are kept and retried)")
    with caplog.at_level(logging.WARNING, logger=LOGGER), rig.running():
        rig.worker.submit([record(1)])
        wait_until(lambda: len(rig.peer.attempts) == 1, "the first attempt")
        wait_until(failed(rig, 1), "the failure noted")
        status = rig.worker.status()
        assert (status.config_error, status.last_error) == (unauthorized[:300],
                                                            unauthorized[:300])
        assert 0.5 <= status.paused_for <= 1.0
        assert said(caplog) == [loud]
        rig.advance(2.0)
        wait_until(failed(rig, 2), "the second attempt")
        assert said(caplog) == [loud], "said again within five minutes"
        rig.advance(300.0)
        wait_until(failed(rig, 3), "the third attempt")
        assert said(caplog) == [loud, loud]
        up.set()
        rig.advance(2.0)
        wait_until(lambda: rig.peer.accepted == [1], "delivered once fixed")
        wait_until(lambda: rig.worker.status().consecutive_failures == 0, "the streak ended")
        status = rig.worker.status()
        assert (status.config_error, status.last_error) == ("", "")
    assert said(caplog)[2:] == ["sink otlp: delivering again after 3 failed attempts"]
    assert rig.failures == [("otlp", "logs", 1)] * 3


def failed(rig: Rig, attempts: int) -> Callable[[], bool]:
    """The worker noted failure number ``attempts`` and set the pause after it."""
    return lambda: (rig.worker.status().consecutive_failures == attempts
                    and rig.worker.status().paused_for > 0)


def test_the_wait_between_attempts_doubles_to_its_cap_within_equal_jitter() -> None:
    up = threading.Event()
    rig = Rig(None, lambda n, seqs: None if up.is_set() else DeliveryError("down"),
              fake_clock=True, backoff=(1.0, 16.0))
    waits: list[float] = []
    with rig.running():
        rig.worker.submit([record(1)])
        for attempt in range(1, 8):
            wait_until(failed(rig, attempt), f"attempt {attempt}")
            waits.append(rig.worker.status().paused_for)
            if attempt < 7:
                rig.advance(waits[-1])
        up.set()
        rig.advance(waits[-1])
        rig.drain()
    for wait, ceiling in zip(waits, [1, 2, 4, 8, 16, 16, 16], strict=True):
        assert ceiling / 2 <= wait <= ceiling, (waits, ceiling)


def test_a_pause_shared_with_another_sender_holds_new_records_too() -> None:
    """The metric exporter was told to wait (Retry-After): the logs to the same peer wait as
    well, even a record that arrives while the worker is idle."""
    rig = Rig(None, fake_clock=True, shared_pause=True)
    sent_at: list[float] = []

    def answer(n: int, seqs: list[int]) -> None:
        sent_at.append(rig.now)

    rig.peer.answer = answer
    assert rig.pause is not None
    with rig.running():
        rig.pause.hold(30.0)
        assert rig.worker.status().paused_for == 0.0, "an idle sink waits for nothing"
        rig.worker.submit([record(1)])
        assert rig.worker.status().paused_for == 30.0
        # Nothing may go before the pause ends. The test clock stands still meanwhile, so a
        # worker that ignored the pause would send now, at 0 (a window for it to do so).
        time.sleep(0.2)
        assert rig.peer.attempts == []
        rig.advance(30.0)
        wait_until(lambda: rig.peer.accepted == [1], "sent once the pause ended")
    assert sent_at == [30.0]


def test_the_workers_own_backoff_is_the_shared_pause() -> None:
    rig = Rig(None, lambda n, seqs: DeliveryError("down", retry_after=20.0) if n == 1 else None,
              shared_pause=True)
    assert rig.pause is not None
    with rig.running():
        rig.worker.submit([record(1)])
        wait_until(failed(rig, 1), "the failure")
        assert 19.0 <= rig.pause.remaining() <= 20.0
        assert rig.worker.status().paused_for > 19.0
        assert not within(5, lambda: rig.worker.flush(10)), "flushed past the pause"


# --- status ---------------------------------------------------------------------------------

def test_a_new_worker_reports_nothing_wrong() -> None:
    rig = Rig(None)
    assert rig.worker.status() == SinkStatus(
        "otlp", 0, 0.0, 0, "", 0, 0, dead_lettered=0, config_error="", write_faults=(),
        rejecting="", request_bytes=MAX_BATCH_BYTES, max_request_bytes=MAX_BATCH_BYTES,
        paused_for=0.0)
    with rig.running():
        threads = [t for t in threading.enumerate() if t.name == "sink-otlp"]
        assert threads and all(t.daemon for t in threads), "it would keep the process alive"
        rig.worker.submit([record(1)])
        rig.drain()
        assert rig.worker.status().last_seq == 1


# --- the queue's bounds ----------------------------------------------------------------------

def down_for_a_long_time(rig: Rig) -> None:
    rig.peer.answer = lambda n, seqs: DeliveryError("down", retry_after=60.0)


def test_past_its_count_the_oldest_records_are_dropped_counted_and_acknowledged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rig = Rig(tmp_path, max_records=3, fake_clock=True)
    down_for_a_long_time(rig)
    with caplog.at_level(logging.ERROR, logger=LOGGER), rig.running():
        rig.worker.submit([record(s) for s in range(1, 6)])
        wait_until(failed(rig, 1), "the first attempt")
        status = rig.worker.status()
        assert (status.dropped, status.pending) == (2, 3)
        # The dropped are acknowledged: the next start does not send them after all.
        assert (tmp_path / "spool" / "otlp.ack").read_text() == "2"
        rig.peer.answer = lambda n, seqs: None
        rig.advance(61.0)
        rig.drain()
    assert rig.peer.accepted == [3, 4, 5]
    assert ("otlp", "logs", 2) in rig.failures
    assert (f"sink otlp: spool full (3 records or {1 << 62} bytes at most), dropped the 2 "
            "oldest") in said(caplog)


def test_one_record_is_the_smallest_queue() -> None:
    rig = Rig(None, max_records=1, fake_clock=True)
    down_for_a_long_time(rig)
    with rig.running():
        rig.worker.submit([record(1), record(2)])
        wait_until(failed(rig, 1), "the first attempt")
        assert (rig.worker.status().pending, rig.worker.status().dropped) == (1, 1)
        rig.peer.answer = lambda n, seqs: None
        rig.advance(61.0)
        rig.drain()
    assert rig.peer.accepted == [2]


def test_past_its_bytes_the_oldest_are_dropped_but_the_newest_always_stays() -> None:
    rig = Rig(None, max_bytes=2 * S, fake_clock=True)
    down_for_a_long_time(rig)
    big = record(4, "x" * 5000)
    with rig.running():
        rig.worker.submit([record(1), record(2)])  # exactly at the bound: kept
        wait_until(failed(rig, 1), "the first attempt")
        assert (rig.worker.status().pending, rig.worker.status().dropped) == (2, 0)
        rig.worker.submit([record(3)])
        assert (rig.worker.status().pending, rig.worker.status().dropped) == (2, 1)
        rig.worker.submit([big])  # larger than the bound alone
        assert (rig.worker.status().pending, rig.worker.status().dropped) == (1, 3)
        rig.peer.answer = lambda n, seqs: None
        rig.advance(61.0)
        rig.drain()
        assert rig.peer.accepted == [4]
        # Delivered records leave the byte count: two fit again.
        rig.peer.answer = lambda n, seqs: DeliveryError("down", retry_after=60.0) \
            if n == 3 else None
        rig.worker.submit([record(5), record(6)])
        wait_until(failed(rig, 1), "the refusal")
        assert (rig.worker.status().pending, rig.worker.status().dropped) == (2, 3)
        rig.advance(61.0)
        rig.drain()
    assert rig.peer.accepted == [4, 5, 6]


# --- the spool and the outbox ------------------------------------------------------------------

def test_submitted_records_are_spooled_before_they_are_sent(tmp_path: Path) -> None:
    release = threading.Event()
    rig = Rig(tmp_path, held_until(release, 10))
    log = tmp_path / "spool" / "otlp.log"
    with rig.running():
        rig.worker.submit([record(1)])
        wait_until(lambda: rig.peer.attempts, "the attempt")
        assert [json.loads(x)["seq"] for x in log.read_text().splitlines()] == [1]
        release.set()
        rig.drain()


def test_at_start_the_spool_is_sent_and_the_outbox_spooled_and_its_unreadable_lettered(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    earlier = Spool(tmp_path / "spool", "otlp")
    earlier.append([record(1), record(2)])
    release = threading.Event()
    rig = Rig(tmp_path, held_until(release, 10))
    why4 = "kind 'superseded' unknown " + "w" * 400
    entry = {"transition": {"kind": "superseded", "event": {"event_id": "E4"}},
             "record_id": "rid-4"}
    unreadable = [UnreadableLine(None, "{junk", "not JSON"),
                  UnreadableLine(1, {"record_id": "rid-1"}, "spooled already"),
                  UnreadableLine(2, {"record_id": "rid-2"}, "spooled already"),
                  UnreadableLine(4, {"record": entry}, why4)]
    with caplog.at_level(logging.INFO, logger=LOGGER), rig.running():
        rig.worker.recover([record(2), record(3)], unreadable)
        wait_until(lambda: rig.peer.attempts, "the attempt")
        # The outbox's record 3 is in the spool before it is sent.
        log = tmp_path / "spool" / "otlp.log"
        assert [json.loads(x)["seq"] for x in log.read_text().splitlines()] == [1, 2, 3]
        release.set()
        rig.drain()
    assert rig.peer.attempts == [[1, 2], [3]]
    letters = letters_in(tmp_path)
    assert [(x["sink"], x["seq"], x["record_id"], x["event_id"]) for x in letters] == [
        ("otlp", -1, "", ""), ("otlp", 4, "rid-4", "E4")]
    assert letters[1]["reason"] == ("the state file's outbox holds an entry this release "
                                    f"cannot read: {why4}")[:500]
    assert rig.failures == [("otlp", "dead_letter", 1)] * 2
    path = tmp_path / "dead-letter.jsonl"
    assert said(caplog) == [
        "sink otlp: 2 undelivered records from before the restart",
        "sink otlp: the state file's outbox holds an entry (seq -1, EventId unknown) this "
        f"release cannot read (not JSON); moved to {path}",
        "sink otlp: the state file's outbox holds an entry (seq 4, EventId E4) this release "
        f"cannot read ({why4[:300]}); moved to {path}"]


def test_a_spool_line_this_release_cannot_read_is_lettered_at_start(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    future = encode_record(record(2))
    future["transition"]["kind"] = "superseded"
    (tmp_path / "spool").mkdir()
    (tmp_path / "spool" / "otlp.log").write_text(
        json.dumps({"seq": 2, "record": future}) + "\n")
    rig = Rig(tmp_path)
    with caplog.at_level(logging.ERROR, logger=LOGGER), rig.running():
        pass
    [letter] = letters_in(tmp_path)
    assert str(letter["reason"]).startswith("the spool holds an entry this release cannot read: "
                                            "record.transition.kind: expected one of")
    [message] = said(caplog)
    assert message.startswith("sink otlp: the spool holds an entry (seq 2, EventId E2) this "
                              "release cannot read (record.transition.kind: expected one of")
    assert message.endswith(f"); moved to {tmp_path / 'dead-letter.jsonl'}")
    assert rig.failures == [("otlp", "dead_letter", 1)]


def test_without_a_dead_letter_file_an_entry_is_kept_in_the_log_line(
        caplog: pytest.LogCaptureFixture) -> None:
    rig = Rig(None, lambda n, seqs: permanent("rid-1 refused"))
    huge = {"record": {"record_id": "rid-5"}, "padding": "p" * 70_000}
    with caplog.at_level(logging.ERROR, logger=LOGGER), rig.running():
        rig.worker.recover([], [UnreadableLine(5, huge, "why5"),
                                UnreadableLine(6, {"record": {"record_id": "rid-6"}}, "why6")])
        rig.worker.submit([record(1)])
        rig.drain()
    long, short, refused = said(caplog)
    assert not any("\n" in m for m in (long, short, refused))
    head = ("sink otlp: outbox entry (seq {}) not kept (no dead-letter file (SEE_STATE_DIR is "
            "disabled)): ")
    assert long.startswith(head.format(5)) and short.startswith(head.format(6))
    kept = long[len(head.format(5)):]
    assert len(kept) == 65536, "cut at 64 KiB"
    assert kept.startswith('{"time":"') and '"sink":"otlp","status":"unreadable"' in kept
    assert '"record_id":"rid-5","seq":5,"payload":{"record":' in kept
    letter = json.loads(short[len(head.format(6)):])
    assert {k: letter[k] for k in ("sink", "status", "reason", "record_id", "seq",
                                   "payload")} == {
        "sink": "otlp", "status": "unreadable",
        "reason": "the spool holds an entry this release cannot read: why6",
        "record_id": "rid-6", "seq": 6, "payload": {"record": {"record_id": "rid-6"}}}
    head = ("sink otlp: HTTP 400 rejected the record of EventId E1 (scheduled, RecordId rid-1, "
            f"about {S} bytes) permanently: rid-1 refused; not kept (SEE_STATE_DIR is "
            "disabled): ")
    tail = "; continuing with the next record"
    assert refused.startswith(head) and refused.endswith(tail)
    letter = json.loads(refused[len(head):-len(tail)])
    assert {k: letter[k] for k in ("sink", "status", "record_id", "payload", "record")} == {
        "sink": "otlp", "status": "HTTP 400", "record_id": "rid-1",
        "payload": {"sent": "rid-1"}, "record": encode_record(record(1))}


# --- files that cannot be written --------------------------------------------------------------

@pytest.fixture
def quick_repairs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_module, "STORAGE_RETRY", 0.01)


def test_a_record_whose_letter_cannot_be_written_stays_in_the_spool_until_it_can(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, quick_repairs: None) -> None:
    (tmp_path / "dead-letter.jsonl").mkdir()  # cannot be appended to
    rig = Rig(tmp_path, lambda n, seqs: permanent("refused") if 1 in seqs else None)
    spooled = tmp_path / "spool" / "otlp.log"
    with caplog.at_level(logging.WARNING, logger=LOGGER), rig.running():
        rig.worker.submit([record(1), record(2), record(3)])
        rig.drain()
        # The records behind it flow; the refused one waits in the spool, the cursor below it.
        assert rig.peer.accepted == [2, 3]
        status = rig.worker.status()
        assert status.letters_waiting == 1
        [fault] = status.write_faults
        assert fault.file == str(tmp_path / "dead-letter.jsonl")
        assert [json.loads(x)["seq"] for x in spooled.read_text().splitlines()] == [1]
        assert (tmp_path / "spool" / "otlp.ack").read_text() == "0"
        (tmp_path / "dead-letter.jsonl").rmdir()
        # Idle: nothing else to send, yet the letter is written and the record leaves.
        wait_until(lambda: rig.worker.status().letters_waiting == 0, "the letter")
        assert rig.worker.status().write_faults == ()
    assert [x["record_id"] for x in letters_in(tmp_path)] == ["rid-1"]
    assert spooled.read_text() == ""
    assert (tmp_path / "spool" / "otlp.ack").read_text() == "3"
    assert rig.failures == [("otlp", "dead_letter", 1)]
    messages = said(caplog)
    assert "sending them one at a time" in messages[0]
    assert "kept in the spool until the dead-letter file can take its letter" in messages[1]
    assert messages[2:] == [
        "sink otlp: the letter of the record of seq 1 (RecordId rid-1) is written now "
        f"({tmp_path / 'dead-letter.jsonl'}); the record leaves the spool"]


def test_a_record_held_for_its_letter_is_sent_again_after_a_restart(
        tmp_path: Path, quick_repairs: None) -> None:
    (tmp_path / "dead-letter.jsonl").mkdir()
    rig = Rig(tmp_path, lambda n, seqs: permanent("refused") if 1 in seqs else None)
    with rig.running():
        rig.worker.submit([record(1), record(2)])
        rig.drain()
    assert rig.peer.attempts == [[1, 2], [1], [2]]
    # A stop (or a crash) now: the next start finds the refused record in the spool, and can
    # letter it this time; the one delivered behind it is not sent again.
    (tmp_path / "dead-letter.jsonl").rmdir()
    again = Rig(tmp_path, lambda n, seqs: permanent("refused") if 1 in seqs else None)
    with again.running():
        again.drain()
    assert again.peer.attempts == [[1]]
    assert [x["record_id"] for x in letters_in(tmp_path)] == ["rid-1"]


def test_an_unwritable_ack_cursor_is_repaired_idle_and_never_passes_what_was_sent(
        tmp_path: Path, quick_repairs: None) -> None:
    rig = Rig(tmp_path)
    ack = tmp_path / "spool" / "otlp.ack"
    with rig.running():
        ack.mkdir()  # the cursor cannot be replaced
        rig.worker.submit([record(1)])
        rig.drain()
        [fault] = rig.worker.status().write_faults
        assert fault.file == str(ack)
        # Tried again while idle, and still failing: the fault stays, on the same file.
        wait_until(lambda: rig.worker.status().write_faults[0].failures >= 3, "the retries")
        assert rig.worker.status().write_faults[0].file == str(ack)
        ack.rmdir()
        wait_until(lambda: rig.worker.status().write_faults == (), "the repair")
        assert ack.read_text() == "1"
        rig.worker.submit([record(2)])
        rig.drain()
    assert rig.peer.accepted == [1, 2]


def test_a_probe_at_start_does_not_move_the_cursor(tmp_path: Path, quick_repairs: None) -> None:
    """A torn tail that cannot be cut at start (the disk went read-only) is a fault; the probe
    that finds the disk writable again must leave the cursor where it was, below the records
    not yet sent (else the next start would take them for delivered)."""
    Spool(tmp_path / "spool", "otlp").append([record(1)])
    log = tmp_path / "spool" / "otlp.log"
    with log.open("ab") as handle:
        handle.write(b'{"seq":2,"rec')
    failing = [True]

    def read_only(step: DiskStep) -> None:
        if failing[0] and step.kind == "truncate":
            raise OSError(errno.EROFS, "Read-only file system")

    release = threading.Event()
    rig = Rig(tmp_path, held_until(release, 10))
    previous = set_step_hook(read_only)
    try:
        with rig.running():
            failing[0] = False
            wait_until(lambda: rig.peer.attempts == [[1]], "record 1 sent")
            # The repair before the attempt wrote the cursor: still below record 1.
            assert rig.worker.status().write_faults == ()
            assert (tmp_path / "spool" / "otlp.ack").read_text() == "0"
            assert json.loads(log.read_text().splitlines()[0])["seq"] == 1
            release.set()
            rig.drain()
    finally:
        set_step_hook(previous)
    assert (tmp_path / "spool" / "otlp.ack").read_text() == "1"


def test_records_a_full_spool_could_not_take_are_written_once_it_can(
        tmp_path: Path) -> None:
    log = tmp_path / "spool" / "otlp.log"
    rig = Rig(tmp_path, fake_clock=True)
    down_for_a_long_time(rig)
    with rig.running():
        log.parent.mkdir(parents=True, exist_ok=True)
        log.unlink(missing_ok=True)
        log.mkdir()  # appends fail
        rig.worker.submit([record(1), record(2)])
        assert rig.failures[0] == ("otlp", "spool", 1)
        wait_until(failed(rig, 1), "the first attempt")
        [fault] = rig.worker.status().write_faults
        assert fault.file == str(log)
        log.rmdir()
        rig.advance(61.0)  # the next attempt writes what the spool is missing first
        wait_until(lambda: rig.worker.status().write_faults == (), "the repair")
        assert [json.loads(x)["seq"] for x in log.read_text().splitlines()] == [1, 2]
        wait_until(failed(rig, 2), "the second attempt")
        rig.peer.answer = lambda n, seqs: None
        rig.advance(61.0)
        rig.drain()
    assert rig.peer.accepted == [1, 2]
    assert set(rig.failures) == {("otlp", "spool", 1), ("otlp", "logs", 1)}


# --- how flush and stop end --------------------------------------------------------------------

def test_a_flush_ends_at_its_timeout_when_nothing_can_be_sent() -> None:
    rig = Rig(None, lambda n, seqs: DeliveryError("down"))
    with rig.running():
        rig.worker.submit([record(1)])
        assert within(5, lambda: rig.worker.flush(0.2)) is False


def test_a_flush_does_not_wait_for_a_pause_that_outlasts_it() -> None:
    rig = Rig(None, lambda n, seqs: DeliveryError("busy", retry_after=5.0) if n == 1 else None,
              fake_clock=True)
    with rig.running():
        rig.worker.submit([record(1)])
        wait_until(failed(rig, 1), "the refusal")
        assert rig.worker.status().paused_for == 5.0
        assert within(5, lambda: rig.worker.flush(5.0)) is False
        rig.advance(5.0)
        rig.drain()


def test_a_short_flush_waits_for_the_delivery_under_way() -> None:
    release = threading.Event()
    rig = Rig(None, held_until(release, 10), fake_clock=True)
    with rig.running():
        rig.worker.submit([record(1)])
        wait_until(lambda: rig.peer.attempts, "the attempt")
        result: list[bool] = []
        flusher = threading.Thread(target=lambda: result.append(rig.worker.flush(0.5)))
        flusher.start()
        release.set()
        flusher.join(10)
        assert result == [True]


def test_a_stop_ends_even_when_the_peer_never_answers() -> None:
    release = threading.Event()
    rig = Rig(None, held_until(release, 30))
    rig.worker.start()
    try:
        rig.worker.submit([record(1)])
        wait_until(lambda: rig.peer.attempts, "the attempt")
        assert within(5, lambda: rig.worker.stop(0.1)) is False
    finally:
        release.set()
    other = Rig(None)
    other.worker.start()
    other.worker.submit([record(1)])
    assert other.worker.stop(5) is True
