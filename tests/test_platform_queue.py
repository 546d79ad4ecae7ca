"""The platform command against a real Storage queue: Azurite, the real azure-storage-queue SDK
on both sides, the exporter a real subprocess (``scheduled-events-exporter platform``).

Each test shows every transition delivered once (one RecordId per EventId and transition, and
no transition missing), the queue empty at the end (``approximate_message_count`` counts the
invisible messages too: 0 means each was deleted), and what could not be read in the
dead-letter file as received, with its reason.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from azure.storage.queue import QueueClient

from tests.exporter_process import ExporterProcess, clean_env, wait_until
from tests.peers.azurite import Azurite
from tests.peers.otlp_standin import OtlpHttpStandIn

SUBSCRIPTION = "0b6f1a2c-3d4e-4f50-8a9b-1c2d3e4f5a6b"
EVENT_GRID_TYPE = "Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted"


@pytest.fixture
def queue(azurite: Azurite) -> Iterator[QueueClient]:
    client = QueueClient.from_connection_string(azurite.connection_string,
                                                f"q{uuid.uuid4().hex[:16]}")
    client.create_queue()
    yield client
    client.close()


def rfc1123(moment: datetime) -> str:
    return moment.strftime("%a, %d %b %Y %H:%M:%S GMT")


def event_grid(event_id: str, status: str, event_type: str = "Freeze", *,
               source: str = "Platform", vm: str = "app-vm-1", minutes: float = 0,
               delivery: str | None = None, event_type_name: str = EVENT_GRID_TYPE
               ) -> dict[str, Any]:
    """An Event Grid event in the documented sample's shape, at ``minutes`` from now."""
    at = datetime.now(timezone.utc) + timedelta(minutes=minutes)
    arm = (f"/subscriptions/{SUBSCRIPTION}/resourceGroups/rg/providers/Microsoft.Compute/"
           f"virtualMachines/{vm}/providers/microsoft.maintenance/scheduledevents/{event_id}")
    return {
        "id": delivery or str(uuid.uuid4()), "topic": f"/subscriptions/{SUBSCRIPTION}",
        "subject": arm, "eventType": event_type_name, "dataVersion": "3.0",
        "metadataVersion": "1", "eventTime": at.isoformat().replace("+00:00", "Z"),
        "data": {"apiVersion": "2024-07-01", "resourceInfo": {
            "id": arm, "name": event_id, "type": "microsoft.maintenance/scheduledEvents",
            "location": "westeurope", "properties": {
                "EventId": event_id, "EventStatus": status, "EventType": event_type,
                "EventSource": source, "ResourceType": "VirtualMachine", "Resources": [vm],
                "NotBefore": rfc1123(at + timedelta(minutes=15)) if status == "Scheduled"
                else "", "DurationInSeconds": 5 if event_type == "Freeze" else -1,
                "Description": f"{event_type} for a test"}}},
    }


def cloud_event(event: dict[str, Any]) -> dict[str, Any]:
    """The same event as Event Grid delivers it in the CloudEvents 1.0 schema."""
    return {"specversion": "1.0", "type": event["eventType"], "source": event["topic"],
            "id": event["id"], "time": event["eventTime"], "subject": event["subject"],
            "data": event["data"]}


def send(queue: QueueClient, *messages: dict[str, Any] | str, encode: bool = False) -> None:
    for message in messages:
        text = message if isinstance(message, str) else json.dumps(message)
        queue.send_message(base64.b64encode(text.encode()).decode() if encode else text)


def platform(azurite: Azurite, queue: QueueClient, tmp_path: Path, **extra: str
             ) -> ExporterProcess:
    env = clean_env(SEE_STATE_DIR=str(tmp_path / "state"), SEE_HEALTH_ADDR="",
                    SEE_SINKS="console", SEE_SHUTDOWN_TIMEOUT="5",
                    SEE_PLATFORM_QUEUE_CONNECTION_STRING=azurite.connection_string,
                    SEE_PLATFORM_QUEUE_NAME=queue.queue_name, SEE_PLATFORM_POLL_INTERVAL="0.2",
                    SEE_PLATFORM_VISIBILITY_TIMEOUT="2")
    env.update(extra)
    return ExporterProcess(env, args=("platform",))


def empty(queue: QueueClient) -> bool:
    return queue.get_queue_properties().approximate_message_count == 0


def once_each(records: list[dict[str, Any]]) -> dict[tuple[str, str], str]:
    """{(EventId lower-cased, Transition): RecordId}, failing if one has two RecordIds."""
    seen: dict[tuple[str, str], set[str]] = {}
    for record in records:
        assert record["Observer"] == "platform", record
        key = (record["EventId"].lower(), record["Transition"])
        seen.setdefault(key, set()).add(record["RecordId"])
    assert all(len(ids) == 1 for ids in seen.values()), seen
    return {key: ids.pop() for key, ids in seen.items()}


def letters(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "state" / "platform" / "dead-letter.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


FREEZE, REBOOT, USER = (str(uuid.uuid4()) for _ in range(3))
EXPECTED = {(FREEZE, "scheduled"), (FREEZE, "started"), (FREEZE, "completed"),
            (REBOOT, "scheduled"), (REBOOT, "cancelled"),
            (USER, "started"), (USER, "completed")}


def every_kind_of_message(queue: QueueClient) -> None:
    """Freeze Scheduled → Started → Completed (the Completed in base64); Reboot Scheduled →
    Canceled (the Canceled as CloudEvents, its EventId in upper case); a user's Reboot Started
    → Completed with no Scheduled (the Completed under the other event-type name); the Freeze's
    Scheduled delivered twice with the same id; a message that is not JSON."""
    scheduled = event_grid(FREEZE, "Scheduled")
    send(queue, scheduled, scheduled, event_grid(FREEZE, "Started", minutes=15.5))
    send(queue, event_grid(FREEZE, "Completed", minutes=16), encode=True)
    send(queue, event_grid(REBOOT, "Scheduled", "Reboot", vm="app-vm-2"),
         cloud_event(event_grid(REBOOT.upper(), "Canceled", "Reboot", vm="app-vm-2",
                                minutes=3)),
         event_grid(USER, "Started", "Reboot", source="User", vm="app-vm-3"),
         event_grid(USER, "Completed", "Reboot", source="User", vm="app-vm-3", minutes=2,
                    event_type_name="microsoft.maintenance/scheduledevents/write"),
         "<not json at all>")


def test_every_kind_of_message_makes_each_transition_once_and_empties_the_queue(
        azurite: Azurite, queue: QueueClient, tmp_path: Path) -> None:
    every_kind_of_message(queue)
    with platform(azurite, queue, tmp_path) as exporter:
        exporter.wait_for(lambda: len(exporter.records()) >= len(EXPECTED), 60,
                          "a record of every transition")
        wait_until(lambda: empty(queue), 30, "every message deleted")
        assert exporter.terminate() == 0
    records = exporter.records()
    assert set(once_each(records)) == EXPECTED and len(records) == len(EXPECTED)
    by_key = {(r["EventId"].lower(), r["Transition"]): r for r in records}
    assert by_key[(REBOOT, "cancelled")]["EventStatus"] == "Canceled"
    assert by_key[(REBOOT, "cancelled")]["OutcomeBasis"] == "platform_record"
    assert by_key[(USER, "started")]["OutcomeBasis"] == "user_initiated"
    assert by_key[(FREEZE, "completed")]["ObservedStart"] is True
    assert by_key[(FREEZE, "scheduled")]["VmName"] == "app-vm-1"
    assert by_key[(FREEZE, "scheduled")]["ResourceId"].endswith("/virtualMachines/app-vm-1")
    (letter,) = letters(tmp_path)
    assert letter["status"] == "not_json" and letter["payload"] == "<not json at all>"
    assert letter["sink"] == "platform-queue"


def test_a_kill_between_the_spool_append_and_the_delete_repeats_nothing(
        azurite: Azurite, queue: QueueClient, tmp_path: Path) -> None:
    every_kind_of_message(queue)
    with platform(azurite, queue, tmp_path, SEE_FAILPOINT="before_delete:1") as crashed:
        assert crashed.proc.wait(timeout=60) == 137, crashed.stderr()
    assert "failpoint before_delete" in crashed.stderr()
    assert not empty(queue)  # received, spooled, not deleted
    with platform(azurite, queue, tmp_path) as restarted:
        wait_until(lambda: empty(queue), 60, "every message back and deleted")
        restarted.wait_for(lambda: set(once_each(crashed.records() + restarted.records()))
                           == EXPECTED, 30, "every transition delivered")
        assert restarted.terminate() == 0
    # Delivered before the crash, or from the spool after it: each once by RecordId (a record
    # delivered but not yet acknowledged at the kill comes again with the same RecordId).
    assert set(once_each(crashed.records() + restarted.records())) == EXPECTED
    assert [entry["status"] for entry in letters(tmp_path)] in (["not_json"],
                                                                 ["not_json", "not_json"])


def test_a_sink_outage_keeps_every_record_in_the_spool_and_the_queue_empties(
        azurite: Azurite, queue: QueueClient, tmp_path: Path) -> None:
    down = [True]
    with OtlpHttpStandIn(answer=lambda _ids: 503 if down[0] else None) as collector:
        every_kind_of_message(queue)
        with platform(azurite, queue, tmp_path, SEE_SINKS="otlp", OTEL_METRICS_EXPORTER="none",
                      OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint) as exporter:
            # The messages go as soon as the spool has their records, whatever the collector.
            wait_until(lambda: empty(queue), 60, "every message deleted while the sink is down")
            assert not collector.accepted and collector.refused
            down[0] = False
            got = collector.wait_for(lambda got: len(got) >= len(EXPECTED), 60,
                                     "every record once the collector is back")
            assert exporter.terminate() == 0
    assert sorted((a.event_id.lower(), a.transition) for a in got) == sorted(EXPECTED)
    assert len({a.uid for a in got}) == len(EXPECTED)


def test_a_message_received_too_often_is_set_aside_unread(
        azurite: Azurite, queue: QueueClient, tmp_path: Path) -> None:
    send(queue, event_grid(FREEZE, "Scheduled"))
    for _ in range(3):  # another reader that never deletes it
        wait_until(lambda: bool(list(queue.receive_messages(visibility_timeout=1))), 10,
                   "the message visible again")
    with platform(azurite, queue, tmp_path, SEE_PLATFORM_MAX_DEQUEUE="2") as exporter:
        wait_until(lambda: empty(queue), 30, "the message deleted")
        assert exporter.terminate() == 0
    assert exporter.records() == []
    (letter,) = letters(tmp_path)
    assert letter["status"] == "dequeued_too_often"
    assert json.loads(letter["payload"])["data"]["resourceInfo"]["name"] == FREEZE
