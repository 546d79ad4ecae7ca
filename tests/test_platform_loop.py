"""The platform loop's rules in-process, with a scripted queue and sinks: throttling (503, 500)
backed off and retried, a message never deleted before every sink's spool holds its records,
and a state file that cannot be written adopting nothing (the message comes back)."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from azure.core.exceptions import HttpResponseError, ServiceRequestError

from scheduled_events_exporter.delivery.dead_letter import DeadLetterFile
from scheduled_events_exporter.delivery.outcome import SinkStatus
from scheduled_events_exporter.platform_feed.loop import LoopSettings, PlatformLoop
from scheduled_events_exporter.platform_feed.queue import Message, QueueError, classify
from scheduled_events_exporter.poller import Clock
from scheduled_events_exporter.records import TransitionRecord
from scheduled_events_exporter.state import StateStore
from scheduled_events_exporter.telemetry import Telemetry
from scheduled_events_exporter.tracker import PlatformState

FIXTURE = (Path(__file__).parent / "fixtures" / "platform" /
           "capture-vm-freeze-completed.json").read_text()


class ScriptedQueue:
    def __init__(self, answers: list[list[Message] | QueueError]) -> None:
        self.answers = answers
        self.deleted: list[str] = []

    def receive(self, count: int, visibility_timeout: int) -> list[Message]:
        answer = self.answers.pop(0) if self.answers else []
        if isinstance(answer, QueueError):
            raise answer
        return answer

    def delete(self, message: Message) -> bool:
        self.deleted.append(message.id)
        return True


class Sink:
    name = "fake"

    def __init__(self, spooling: bool = True) -> None:
        self.spooling = spooling
        self.records: list[TransitionRecord] = []

    def submit(self, records: Sequence[TransitionRecord]) -> None:
        self.records.extend(records)

    def status(self) -> SinkStatus:
        spooled = self.records[-1].seq if self.records and self.spooling else 0
        return SinkStatus(self.name, 0, 0.0, 0, "", 0, spooled_seq=spooled)


class Waits(threading.Event):
    """A stop event that notes each wait and stops after ``limit`` of them."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.waits: list[float] = []
        self.limit = limit

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout or 0.0)
        if len(self.waits) >= self.limit:
            self.set()
        return self.is_set()


def loop(tmp_path: Path, queue: ScriptedQueue, sink: Sink) -> PlatformLoop:
    now = datetime(2026, 5, 12, 9, 5, tzinfo=timezone.utc)
    return PlatformLoop(LoopSettings(poll_interval=5.0), queue, [sink], Telemetry(),
                        StateStore(tmp_path), DeadLetterFile(tmp_path), state=PlatformState(),
                        seq=0, clock=Clock(wall=lambda: now))


def message(n: int = 1, content: str = FIXTURE) -> Message:
    return Message(f"m{n}", f"r{n}", 1, content)


def test_throttling_is_backed_off_then_reading_resumes(tmp_path: Path) -> None:
    queue = ScriptedQueue([QueueError("throttled", "HTTP 503"),
                           QueueError("server_error", "HTTP 500"),
                           QueueError("throttled", "HTTP 503"), [message()]])
    sink = Sink()
    platform = loop(tmp_path, queue, sink)
    stop = Waits(limit=4)
    platform.run(stop)
    backoffs = stop.waits[:3]
    assert [0.5 <= w / b <= 1.0 for w, b in zip(backoffs, (1, 2, 4), strict=True)] == [True] * 3
    assert stop.waits[3] == 5.0  # the poll interval after a batch smaller than a full one
    assert [r.transition.kind.value for r in sink.records] == ["completed"]
    assert queue.deleted == ["m1"] and platform.last_outcome == "ok"


def test_no_delete_before_every_spool_holds_the_records(tmp_path: Path) -> None:
    queue = ScriptedQueue([])
    sink = Sink(spooling=False)
    platform = loop(tmp_path, queue, sink)
    platform.process([message()])
    assert queue.deleted == [] and len(sink.records) == 1
    stop = Waits(limit=2)
    platform.run(stop)
    assert queue.deleted == [] and platform.last_outcome == "spool_behind"
    sink.spooling = True
    platform.run(Waits(limit=1))
    assert queue.deleted == ["m1"]


def test_an_unwritable_state_file_adopts_nothing(tmp_path: Path) -> None:
    queue = ScriptedQueue([])
    sink = Sink()
    platform = loop(tmp_path, queue, sink)
    (tmp_path / "state.json" / "in-the-way").mkdir(parents=True)  # the rename cannot land
    platform.process([message()])
    assert queue.deleted == [] and sink.records == []
    assert platform.state == PlatformState() and platform.seq == 0


def test_a_refused_message_is_lettered_then_deleted_and_an_unletterable_one_kept(
        tmp_path: Path) -> None:
    queue = ScriptedQueue([])
    platform = loop(tmp_path, queue, Sink())
    platform.process([message(1, "not json"), message(2, json.dumps({"hello": 1}))])
    assert queue.deleted == ["m1", "m2"]
    letters = [json.loads(line) for line in (tmp_path / "dead-letter.jsonl").read_text()
               .splitlines()]
    assert [(x["status"], x["record_id"], x["payload"]) for x in letters] == [
        ("not_json", "m1", "not json"), ("not_an_event", "m2", '{"hello": 1}')]


def test_the_sdks_errors_are_classified() -> None:
    def http(status: int) -> HttpResponseError:
        error = HttpResponseError(message=f"status {status}")
        error.status_code = status
        return error

    assert classify(http(503)).outcome == "throttled"
    assert classify(http(500)).outcome == "server_error"
    assert classify(http(403)).lasting and classify(http(400)).lasting
    assert classify(ServiceRequestError("refused")).outcome == "connection_error"


def test_readiness_names_the_platform_queue() -> None:
    from scheduled_events_exporter.health import HealthInputs, readiness

    inputs = HealthInputs(last_tick=lambda: None, started=0.0, last_good=lambda: None,
                          last_outcome=lambda: "throttled", sink_status=list,
                          poll_interval=5.0, request_timeout=40.0, staleness_limit=30.0,
                          source="platform queue")
    ok, body = readiness(inputs)
    assert not ok and body["reasons"] == ["no good answer from the platform queue yet"]
    assert body["platform_queue_last_outcome"] == "throttled" and "imds_last_outcome" not in body
