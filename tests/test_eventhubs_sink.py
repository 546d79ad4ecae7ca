"""The Event Hubs sink end to end: the real exporter process, the real ``azure-eventhub`` SDK and a
real AMQP 1.0 peer (``tests/peers/amqp_peer.py``), driven by the IMDS simulator. No mocks, except
in the two unit tests at the end (message shrinking and the send deadline).

Figures for the closing note (message counts and sizes per VM-hour) are printed by
``test_live_migration_and_cancellation_reach_the_hub`` (run with ``-s`` to see them).
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from email.utils import formatdate
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("azure.eventhub")
pytest.importorskip("proton")

from scheduled_events_exporter.delivery.outcome import DeliveryError
from scheduled_events_exporter.model import (
    FieldChange,
    InstanceInfo,
    ScheduledEvent,
    Transition,
    TransitionKind,
)
from scheduled_events_exporter.records import COLUMNS, make_record, to_columns
from scheduled_events_exporter.simulator import Simulator
from scheduled_events_exporter.sinks.eventhubs import (
    MAX_MESSAGE_BYTES,
    TRUNCATION_MARK,
    transition_message,
)
from scheduled_events_exporter.sinks.hub_sender import HubSender, Message
from tests.exporter_process import (
    ExporterProcess,
    clean_env,
    free_port,
    get_json,
    state_dir,
    wait_until,
)
from tests.peers.amqp_peer import AmqpPeer, ReceivedMessage

HUB = "hub"
VM = "WestNO_0"
FREEZE_ID = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
REBOOT_ID = "0D47DD87-BB71-4F2F-89DD-FB5CAD852199"
KEY = "dGVzdA=="  # the SharedAccessKey in AmqpPeer.connection_string(): must never be printed
NAMES = [name for name, _ in COLUMNS]
RFC3339_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
SHUTDOWN_TIMEOUT = 3.0


# --- fixtures and helpers -------------------------------------------------------------------


@pytest.fixture
def sim() -> Iterator[Simulator]:
    simulator = Simulator(vm_name=VM)
    simulator.start()
    yield simulator
    simulator.stop()


@pytest.fixture
def peer() -> Iterator[AmqpPeer]:
    with AmqpPeer(hubs={HUB}) as running:
        yield running
        assert running.errors == []


def exporter_env(sim: Simulator, peer: AmqpPeer, tmp_path: Path, **extra: str) -> dict[str, str]:
    values = {
        "SEE_IMDS_ENDPOINT": sim.url,
        "SEE_SINKS": "eventhubs",
        "SEE_EVENTHUB_CONNECTION_STRING": peer.connection_string(HUB),
        "SEE_STATE_DIR": state_dir(tmp_path),
        "SEE_HEALTH_ADDR": f"127.0.0.1:{free_port()}",
        "SEE_POLL_INTERVAL": "0.5",
        "SEE_SHUTDOWN_TIMEOUT": str(SHUTDOWN_TIMEOUT),
        "OTEL_METRIC_EXPORT_INTERVAL": "1000",
    }
    values.update(extra)
    return clean_env(**values)


def readyz(env: dict[str, str]) -> dict[str, Any]:
    return get_json(f"http://{env['SEE_HEALTH_ADDR']}/readyz")[1]


def scheduled_polls(sim: Simulator) -> int:
    return sum(1 for r in sim.requests if r.path.startswith("/metadata/scheduledevents"))


def wait_started(sim: Simulator) -> None:
    assert sim.wait_for_requests(2, timeout=20, path_prefix="/metadata/scheduledevents")


def vm_id(sim: Simulator) -> str:
    request = urllib.request.Request(
        f"{sim.url}/metadata/instance?api-version=2021-02-01", headers={"Metadata": "true"}
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        return str(json.loads(response.read())["compute"]["vmId"])


def in_minutes(minutes: float) -> str:
    return formatdate(time.time() + minutes * 60, usegmt=True)


def freeze(status: str = "Scheduled", not_before: str | None = None) -> dict[str, Any]:
    return {
        "EventId": FREEZE_ID,
        "EventStatus": status,
        "EventType": "Freeze",
        "ResourceType": "VirtualMachine",
        "Resources": [VM, "WestNO_1"],
        "NotBefore": in_minutes(15) if not_before is None else not_before,
        "Description": "Virtual machine is being paused because of a memory-preserving Live "
        "Migration operation.",
        "EventSource": "Platform",
        "DurationInSeconds": 5,
    }


def reboot() -> dict[str, Any]:
    return {
        "EventId": REBOOT_ID,
        "EventStatus": "Scheduled",
        "EventType": "Reboot",
        "ResourceType": "VirtualMachine",
        "Resources": [VM],
        "NotBefore": in_minutes(60),
        "Description": "Host server is undergoing maintenance.",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }


Step = tuple[Callable[[], list[dict[str, Any]]], tuple[str, str]]
#: Live migration (Scheduled → Started with NotBefore "" → removed), then a cancellation.
STEPS: list[Step] = [
    (lambda: [freeze()], (FREEZE_ID, "scheduled")),
    (lambda: [freeze("Started", "")], (FREEZE_ID, "started")),
    (lambda: [], (FREEZE_ID, "completed")),
    (lambda: [reboot()], (REBOOT_ID, "scheduled")),
    (lambda: [], (REBOOT_ID, "cancelled")),
]


def hub(peer: AmqpPeer, kind: str) -> list[ReceivedMessage]:
    return [m for m in peer.received if m.application_properties.get("RecordKind") == kind]


def hub_records(peer: AmqpPeer) -> list[dict[str, Any]]:
    return [json.loads(m.body) for m in hub(peer, "transition")]


def seen(records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(r["EventId"], r["Transition"]) for r in records]


def play(sim: Simulator, observed: Callable[[], list[dict[str, Any]]], steps: list[Step]) -> None:
    """Apply each step once the previous one's transition was observed (no step is skipped)."""
    for events, expected in steps:
        sim.set_events(events())

        def done(expected: tuple[str, str] = expected) -> bool:
            return expected in seen(observed())

        wait_until(done, 20, f"transition {expected}")


def check_columns(record: dict[str, Any]) -> None:
    """Exactly the COLUMNS keys, in order, each with its Log Analytics type (or null)."""
    assert list(record) == NAMES
    for name, kind in COLUMNS:
        value = record[name]
        if value is None:
            continue
        if kind == "datetime":
            assert isinstance(value, str) and RFC3339_UTC.match(value), (name, value)
            assert datetime.fromisoformat(value).utcoffset() is not None
        elif kind == "boolean":
            assert isinstance(value, bool), (name, value)
        elif kind == "int":
            assert isinstance(value, int) and not isinstance(value, bool), (name, value)
        elif kind == "real":
            assert isinstance(value, int | float) and not isinstance(value, bool), (name, value)
        elif kind == "dynamic":
            assert isinstance(value, list | dict), (name, value)
        else:
            assert isinstance(value, str), (name, value)


# --- the real exporter against the AMQP peer -------------------------------------------------


@pytest.mark.timeout(60)
def test_live_migration_and_cancellation_reach_the_hub(
    sim: Simulator, peer: AmqpPeer, tmp_path: Path
) -> None:
    env = exporter_env(sim, peer, tmp_path)
    with ExporterProcess(env) as proc:
        wait_started(sim)
        # An idle VM first: the start-up snapshot with nothing pending (measured below).
        wait_until(lambda: len(hub(peer, "metrics")) >= 1, 20, "the first metric snapshot")
        idle = hub(peer, "metrics")[-1]
        play(sim, lambda: hub_records(peer), STEPS)
        assert proc.terminate() == 0

    messages = hub(peer, "transition")
    records = [json.loads(m.body) for m in messages]
    assert seen(records) == [step[1] for step in STEPS]
    vm = vm_id(sim)
    for message, record in zip(messages, records, strict=True):
        check_columns(record)
        assert message.partition_key == vm
        assert message.application_properties == {
            "RecordKind": "transition",
            "EventType": record["EventType"],
            "Transition": record["Transition"],
        }
        assert (record["VmId"], record["VmName"], record["AffectsSelf"]) == (vm, VM, True)
        assert str(uuid.UUID(record["RecordId"])) == record["RecordId"]
        assert isinstance(record["DocumentIncarnation"], int)
    assert len({r["RecordId"] for r in records}) == len(records)
    scheduled, started, completed, rescheduled, cancelled = records
    assert scheduled["Resources"] == [VM, "WestNO_1"]
    assert scheduled["EventType"] == "Freeze" and scheduled["DurationInSeconds"] == 5
    assert scheduled["NotBefore"].endswith("Z") and scheduled["NoticeSeconds"] > 800
    assert (started["EventStatus"], started["PreviousStatus"]) == ("Started", "Scheduled")
    assert started["NotBefore"] is None and started["Unannounced"] is False
    assert completed["ObservedStart"] is True and completed["ElapsedSeconds"] >= 0
    assert rescheduled["EventType"] == "Reboot" and rescheduled["DurationInSeconds"] == -1
    assert cancelled["PreviousStatus"] == "Scheduled"

    snapshots = [json.loads(m.body) for m in hub(peer, "metrics")]
    assert all(m.partition_key == vm for m in hub(peer, "metrics"))
    assert all(m.application_properties == {"RecordKind": "metrics"} for m in hub(peer, "metrics"))
    names = {name for s in snapshots for name in s["Metrics"]}  # {instrument: [points]}
    for name in (
        "azure.scheduled_events.imds.requests",
        "azure.scheduled_events.imds.duration",
        "azure.scheduled_events.pending",
        "azure.scheduled_events.transitions",
        "azure.scheduled_events.document_incarnation",
    ):
        assert name in names
    for snapshot in snapshots:
        assert snapshot["RecordKind"] == "metrics" and snapshot["VmId"] == vm
        assert RFC3339_UTC.match(snapshot["TimeGenerated"])

    idle_bytes = len(idle.body)
    transition_bytes = [len(m.body) for m in messages]
    per_hour = 3600 / 300  # one snapshot per heartbeat at the default SEE_EVENTHUB_HEARTBEAT
    print(
        f"\n[event hubs volume] idle VM: {per_hour:.0f} snapshot messages/VM-hour x "
        f"{idle_bytes} B = {per_hour * idle_bytes / 1024:.0f} KiB/VM-hour of JSON bodies; "
        f"transition messages {min(transition_bytes)}-{max(transition_bytes)} B "
        f"(mean {sum(transition_bytes) / len(transition_bytes):.0f} B); largest snapshot "
        f"{max(len(m.body) for m in hub(peer, 'metrics'))} B"
    )
    assert idle_bytes < 8 * 1024 and max(transition_bytes) < 4 * 1024


@pytest.mark.timeout(45)
def test_console_line_and_hub_message_are_the_same_object(
    sim: Simulator, peer: AmqpPeer, tmp_path: Path
) -> None:
    env = exporter_env(sim, peer, tmp_path, SEE_SINKS="eventhubs,console")
    with ExporterProcess(env) as proc:
        wait_started(sim)
        play(sim, lambda: hub_records(peer), STEPS)
        proc.wait_for_records(len(STEPS), timeout=10)
        console = proc.records()
        assert proc.terminate() == 0
    by_id = {r["RecordId"]: r for r in hub_records(peer)}
    assert [r["RecordId"] for r in console] == list(by_id)
    for line in console:
        assert line == by_id[line["RecordId"]]
        check_columns(line)


@pytest.mark.timeout(100)
def test_hub_outage_loses_nothing_and_keeps_order(
    sim: Simulator, peer: AmqpPeer, tmp_path: Path
) -> None:
    env = exporter_env(sim, peer, tmp_path, SEE_SINKS="eventhubs,console")
    with ExporterProcess(env) as proc:
        wait_started(sim)
        play(sim, lambda: hub_records(peer), STEPS[:1])
        # The peer has the first record; wait until the exporter has its acknowledgement too,
        # or pausing the peer could strand it unacknowledged (then 4 wait, and it is resent).
        wait_until(lambda: readyz(env)["sinks"]["eventhubs"]["pending"] == 0, 10,
                   "the first record acknowledged")
        peer.pause()
        outage_polls = scheduled_polls(sim)
        # Three transitions while the hub is unreachable: the console sink shows them at once.
        play(sim, proc.records, STEPS[1:4])
        wait_until(lambda: readyz(env)["sinks"]["eventhubs"]["pending"] >= 3, 20, "3 pending")
        # Keep the hub away for ~20 s of polling (40 polls at 0.5 s).
        assert sim.wait_for_requests(
            outage_polls + 40, timeout=40, path_prefix="/metadata/scheduledevents"
        ), "the exporter stopped polling during the hub outage"
        during = readyz(env)
        status = during["sinks"]["eventhubs"]
        assert status["pending"] == 3 and status["consecutive_failures"] >= 1
        assert "Event Hubs" in status["last_error"] and KEY not in json.dumps(during)
        assert during["sinks"]["console"]["pending"] == 0
        assert len(hub_records(peer)) == 1
        peer.resume()
        produced = [r["RecordId"] for r in proc.records()]
        assert len(produced) == 4
        # SDK retry (1) plus the worker's backoff (capped at 30 s): recovery takes a while.
        wait_until(lambda: len(hub_records(peer)) >= 4, 45, "the spooled records")
        wait_until(lambda: readyz(env)["sinks"]["eventhubs"]["pending"] == 0, 10, "drained")
        assert [r["RecordId"] for r in hub_records(peer)] == produced
        assert "sink eventhubs: delivering again" in proc.stderr()
        assert proc.terminate() == 0


@pytest.mark.timeout(45)
def test_bad_credentials_one_clear_line_and_console_keeps_working(
    sim: Simulator, tmp_path: Path
) -> None:
    with AmqpPeer(hubs={HUB}, reject_auth=True) as peer:
        env = exporter_env(
            sim, peer, tmp_path, SEE_SINKS="eventhubs,console", SEE_SHUTDOWN_TIMEOUT="1"
        )
        with ExporterProcess(env) as proc:
            wait_started(sim)
            play(sim, proc.records, STEPS[:2])
            # Several failed attempts (worker retries, metric snapshots every second) ...
            wait_until(
                lambda: readyz(env)["sinks"]["eventhubs"]["consecutive_failures"] >= 2,
                30,
                "2 failed deliveries",
            )
            polls = scheduled_polls(sim)
            assert sim.wait_for_requests(polls + 4, 10, path_prefix="/metadata/scheduledevents")
            play(sim, proc.records, STEPS[2:3])
            ready = readyz(env)
            assert proc.terminate() == 0
        assert peer.auth_requests, "the SDK never tried to authenticate"
        assert peer.received == []
    stderr = proc.stderr()
    # ... yet one ERROR line, which names the problem, and no SDK chatter or secret.
    errors = [line for line in stderr.splitlines() if " ERROR " in line]
    auth_errors = [line for line in errors if "authentication" in line.lower()]
    assert len(auth_errors) == 1, errors
    assert "Azure Event Hubs Data Sender" in auth_errors[0]
    assert sum("metrics snapshots not sent" in line for line in stderr.splitlines()) <= 1
    assert "azure.eventhub" not in stderr
    for text in (stderr, "\n".join(proc.stdout_lines), json.dumps(ready)):
        assert KEY not in text and "SharedAccessKey" not in text
    assert "authentication" in ready["sinks"]["eventhubs"]["last_error"]
    assert seen(proc.records()) == [step[1] for step in STEPS[:3]]


def thread_count(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("Threads:"))


@pytest.mark.timeout(60)
def test_blackholed_hub_is_rescued_by_the_deadline(sim: Simulator, tmp_path: Path) -> None:
    with AmqpPeer(hubs={HUB}, blackhole=True) as peer:
        env = exporter_env(
            sim, peer, tmp_path, SEE_SINKS="eventhubs,console", SEE_EVENTHUB_SEND_TIMEOUT="2",
            SEE_SHUTDOWN_TIMEOUT="1",
        )
        with ExporterProcess(env) as proc:
            wait_started(sim)
            play(sim, proc.records, STEPS[:2])

            def failures() -> int:
                return int(readyz(env)["sinks"]["eventhubs"]["consecutive_failures"])

            wait_until(lambda: failures() >= 1, 20, "an abandoned send")
            threads = thread_count(proc.proc.pid)
            polls = scheduled_polls(sim)
            wait_until(lambda: failures() >= 4, 30, "4 abandoned sends")
            assert sim.wait_for_requests(polls + 10, 1, path_prefix="/metadata/scheduledevents")
            status = readyz(env)["sinks"]["eventhubs"]
            assert status["pending"] == 2 and "did not finish in 2 s" in status["last_error"]
            # Abandoned calls are unblocked, not left hanging: no thread (or socket) pile-up.
            assert thread_count(proc.proc.pid) <= threads + 3
            peer.blackhole = False  # the hub answers again: a fresh client delivers everything
            wait_until(lambda: len(hub_records(peer)) >= 2, 30, "delivery after the blackhole")
            assert [r["RecordId"] for r in hub_records(peer)] == [
                r["RecordId"] for r in proc.records()
            ]
            assert proc.terminate() == 0


@pytest.mark.timeout(40)
@pytest.mark.parametrize("failure", ["down", "blackhole"])
def test_sigterm_with_the_hub_unreachable_exits_in_time(
    sim: Simulator, tmp_path: Path, failure: str
) -> None:
    with AmqpPeer(hubs={HUB}, blackhole=failure == "blackhole") as peer:
        if failure == "down":
            peer.pause()
        env = exporter_env(sim, peer, tmp_path, SEE_SINKS="eventhubs,console")
        with ExporterProcess(env) as proc:
            wait_started(sim)
            play(sim, proc.records, STEPS[:1])
            wait_until(lambda: readyz(env)["sinks"]["eventhubs"]["pending"] == 1, 10, "pending")
            started = time.monotonic()
            assert proc.terminate(timeout=SHUTDOWN_TIMEOUT + 15) == 0
            took = time.monotonic() - started
    assert took < SHUTDOWN_TIMEOUT + 3, f"exit took {took:.1f} s"
    # What kept the record (a backoff past the timeout, or a send still failing at it) is
    # said in the line (tests/test_shutdown_drain.py); here only that it is kept.
    (line,) = [line for line in proc.stderr().splitlines()
               if "sink eventhubs: 1 records not delivered" in line]
    assert line.endswith("; they are kept in the spool and delivered, in order, after the "
                         "restart"), line


# --- units: message shrinking and the send deadline -------------------------------------------


def _record(transition: Transition) -> Any:
    instance = InstanceInfo(vm_name=VM, vm_id=str(uuid.uuid4()), region="westeurope")
    return make_record(transition, instance, seq=1)


@pytest.mark.timeout(10)
def test_oversized_transition_is_shrunk_never_dropped() -> None:
    resources = tuple(f"vmss-node-{i:05d}" for i in range(5000))
    event = ScheduledEvent(
        event_id=FREEZE_ID,
        status="Scheduled",
        event_type="Freeze",
        resources=(VM, *resources),
        description="é" + "x" * 200_000,
        source="Platform",
        duration=5,
    )
    now = datetime.now(timezone.utc)
    big = _record(Transition(TransitionKind.SCHEDULED, now, 7, event, notice=900.0))
    message = transition_message(big)
    assert len(message.body) <= MAX_MESSAGE_BYTES
    body = json.loads(message.body)
    assert list(body) == NAMES
    assert body["Description"].startswith("éxxx") and body["Description"].endswith(TRUNCATION_MARK)
    assert body["Resources"][-1] == TRUNCATION_MARK and len(body["Resources"]) > 100
    assert body["Resources"][:-1] == [VM, *resources][: len(body["Resources"]) - 1]
    unchanged = {k: v for k, v in to_columns(big).items() if k not in ("Description", "Resources")}
    assert {k: v for k, v in body.items() if k in unchanged} == unchanged
    assert message.properties == {
        "RecordKind": "transition", "Transition": "scheduled", "EventType": "Freeze"
    }

    # An update of both: Changes carries old and new of each, and still fits.
    changes = (
        FieldChange("Description", "a" * 100_000, "b" * 100_000),
        FieldChange("Resources", list(resources), list(resources[:10])),
    )
    updated = _record(Transition(TransitionKind.UPDATED, now, 8, event, changes=changes))
    body = json.loads(transition_message(updated).body)
    assert len(transition_message(updated).body) <= MAX_MESSAGE_BYTES
    assert list(body) == NAMES and set(body["Changes"]) == {"Description", "Resources"}
    old, new = body["Changes"]["Description"]
    assert old.startswith("a") and new.startswith("b") and new.endswith(TRUNCATION_MARK)
    assert body["Changes"]["Resources"][1] == list(resources[:10])

    small = _record(Transition(TransitionKind.SCHEDULED, now, 7, ScheduledEvent("E", "Scheduled")))
    assert json.loads(transition_message(small).body) == json.loads(json.dumps(to_columns(small)))


class _StuckClient:
    """An SDK client whose every call blocks like one talking to a silent peer."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.closed = threading.Event()

    def create_batch(self, **_: Any) -> Any:
        self.release.wait()
        raise ConnectionError("peer went away")

    def close(self) -> None:
        self.closed.set()


@pytest.mark.timeout(20)
def test_send_deadline_abandons_a_stuck_client_and_close_does_not_wait() -> None:
    clients: list[_StuckClient] = []

    def factory() -> _StuckClient:
        clients.append(_StuckClient())
        return clients[-1]

    sender = HubSender(factory, lambda: "vm", deadline=0.5)
    message = [Message(b"{}", {"RecordKind": "transition"})]
    for attempt in range(2):
        started = time.monotonic()
        with pytest.raises(DeliveryError, match=r"did not finish in 0\.5 s"):
            sender.send(message)
        assert time.monotonic() - started < 2.0
        assert len(clients) == attempt + 1  # a fresh client for every attempt after a stuck one
    # close() while a send is stuck returns within its own timeout; later sends fail at once.
    errors: list[DeliveryError] = []

    def send_in_background() -> None:
        try:
            sender.send(message)
        except DeliveryError as exc:
            errors.append(exc)

    stuck = threading.Thread(target=send_in_background, daemon=True)
    stuck.start()
    wait_until(lambda: len(clients) == 3, 5, "third client")
    started = time.monotonic()
    sender.close(timeout=0.2)
    assert time.monotonic() - started < 1.0
    with pytest.raises(DeliveryError, match="closed"):
        sender.send(message)
    stuck.join(5)
    assert len(errors) == 1 and "did not finish" in str(errors[0])
    for client in clients:
        client.release.set()
    wait_until(lambda: all(c.closed.is_set() for c in clients), 15, "every client closed")
    # Daemon threads only: a stuck SDK call never blocks interpreter exit.
    assert all(t.daemon for t in threading.enumerate() if t.name == "eventhubs-sdk")


def test_large_metric_snapshots_are_split_under_the_message_limit() -> None:
    from scheduled_events_exporter.sinks.metrics_json import snapshot_bodies

    points = [{"attributes": {"azure.scheduled_event.id": f"EVENT-{i:05d}-" + "x" * 30,
                              "type": "Freeze", "affects_self": False}, "value": float(i)}
              for i in range(2000)]
    metrics = {"azure.scheduled_events.time_to_not_before": points,
               "azure.scheduled_events.impact_duration": points[:500],
               "azure.scheduled_events.pending": [{"attributes": {}, "value": 0}]}
    header = {"TimeGenerated": "2026-01-01T00:00:00.000Z", "RecordKind": "metrics", "VmId": "v"}
    bodies = snapshot_bodies(header, metrics, 48 * 1024)
    assert len(bodies) > 1 and all(len(b) <= 48 * 1024 for b in bodies)
    parsed = [json.loads(b) for b in bodies]
    assert len({p["RecordId"] for p in parsed}) == len(parsed)
    merged: dict[str, list[object]] = {}
    for p in parsed:
        assert p["VmId"] == "v" and p["RecordKind"] == "metrics"
        for name, pts in p["Metrics"].items():
            merged.setdefault(name, []).extend(pts)
    assert merged == metrics  # nothing lost, order kept
    assert len(snapshot_bodies(header, {}, 48 * 1024)) == 1  # an idle VM still sends one
