"""Metrics on change, heartbeat otherwise, through the real exporter against the IMDS
simulator, a real OTLP collector (rotel) and the AMQP peer with two hubs (transitions and
metrics). The heartbeats are shortened (OTLP every 4 s, Event Hubs every 10 s: the schedule
itself is tested on given times in tests/test_on_change_reader.py, the defaults of 60 s and
300 s in tests/test_config.py); what this shows is the wiring.

An idle spell: OTLP heartbeats about 4 s apart after the start-up export, no Event Hubs
snapshot beyond the start-up one before its 10 s, no log record at all. Then a change reaches
both receivers' metrics within 5 s, and the transition goes to the transitions hub only.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("azure.eventhub")
pytest.importorskip("proton")

from scheduled_events_exporter.simulator import Simulator
from tests.exporter_process import ExporterProcess, clean_env, free_port, state_dir, wait_until
from tests.peers.amqp_peer import AmqpPeer, ReceivedMessage
from tests.peers.rotel import ReceivedMetric, RotelReceiver

VM = "WestNO_0"
EVENTS_HUB, METRICS_HUB = "scheduled-events", "scheduled-events-metrics"
PENDING = "azure.scheduled_events.pending"
#: How far an export may land from where the cadence puts it (CPU shared with other tests).
SLACK = 1.5
OTLP_HEARTBEAT = 4.0
HUB_HEARTBEAT = 10
CHANGE_DEADLINE = 5.0


@pytest.fixture
def sim() -> Iterator[Simulator]:
    with Simulator(vm_name=VM) as simulator:
        yield simulator


@pytest.fixture
def peer() -> Iterator[AmqpPeer]:
    with AmqpPeer(hubs={EVENTS_HUB, METRICS_HUB}) as running:
        yield running
        assert running.errors == []


@pytest.fixture
def rotel() -> Iterator[RotelReceiver]:
    with RotelReceiver() as receiver:
        yield receiver


def exports(metrics: list[ReceivedMetric]) -> list[float]:
    """Arrival time of each export (one export prints several metrics within milliseconds)."""
    times: list[float] = []
    for metric in metrics:
        if not times or metric.arrival_time - times[-1] > 1.0:
            times.append(metric.arrival_time)
    return times


def snapshots(peer: AmqpPeer) -> list[tuple[ReceivedMessage, dict[str, Any]]]:
    return [(m, json.loads(m.body)) for m in peer.received if m.hub == METRICS_HUB]


def pending_types(metrics: dict[str, list[dict[str, Any]]]) -> set[str]:
    return {str(p.get("attributes", {}).get("type")) for p in metrics.get(PENDING, [])
            if p.get("value")}


@pytest.mark.timeout(180)
def test_idle_heartbeat_cadence_and_change_within_5_s(
    sim: Simulator, peer: AmqpPeer, rotel: RotelReceiver, tmp_path: Path
) -> None:
    env = clean_env(
        SEE_IMDS_ENDPOINT=sim.url,
        SEE_SINKS="otlp,eventhubs",
        SEE_STATE_DIR=state_dir(tmp_path),
        SEE_HEALTH_ADDR=f"127.0.0.1:{free_port()}",
        OTEL_EXPORTER_OTLP_ENDPOINT=rotel.http_endpoint,
        SEE_EVENTHUB_CONNECTION_STRING=peer.connection_string(EVENTS_HUB),
        SEE_EVENTHUB_METRICS_NAME=METRICS_HUB,
        OTEL_METRIC_EXPORT_INTERVAL=str(int(OTLP_HEARTBEAT * 1000)),
        SEE_EVENTHUB_HEARTBEAT=str(HUB_HEARTBEAT),
    )
    with ExporterProcess(env) as proc:
        # Start-up: the first document makes the pending set known, which is a change.
        assert sim.wait_for_requests(1, 30, path_prefix="/metadata/scheduledevents")
        first_poll = next(r.wall for r in sim.requests
                          if r.path.startswith("/metadata/scheduledevents"))
        rotel.wait_for_metric(PENDING, timeout=CHANGE_DEADLINE + SLACK)
        wait_until(lambda: len(snapshots(peer)) >= 1, CHANGE_DEADLINE + SLACK, "first snapshot")
        start = exports(rotel.metrics)[0]
        assert start - first_poll < CHANGE_DEADLINE

        # Idle: two OTLP heartbeats after the start-up export, one period apart each, and no
        # Event Hubs heartbeat before its own period.
        wait_until(lambda: len(exports(rotel.metrics)) >= 3, 2 * OTLP_HEARTBEAT + 2 * SLACK,
                   "two OTLP heartbeats")
        idle = exports(rotel.metrics)[:3]
        assert all(abs(b - a - OTLP_HEARTBEAT) < SLACK for a, b in itertools.pairwise(idle)), idle
        if time.time() < start + HUB_HEARTBEAT - SLACK:
            assert len(snapshots(peer)) == 1
        assert rotel.logs == [] and [m for m in peer.received if m.hub == EVENTS_HUB] == []

        # A change: the metrics follow within 5 s on both paths.
        freeze = {"EventId": "C7061BAC-AFDC-4513-B24B-AA5F13A16123", "EventStatus": "Scheduled",
                  "EventType": "Freeze", "ResourceType": "VirtualMachine", "Resources": [VM],
                  "NotBefore": "Mon, 11 Apr 2099 22:26:58 GMT", "EventSource": "Platform",
                  "DurationInSeconds": 5, "Description": ""}
        changed = time.time()
        sim.set_events([freeze])
        otlp = rotel.wait_for_metric(
            PENDING, lambda m: any(p.attributes.get("type") == "Freeze" for p in m.points),
            timeout=CHANGE_DEADLINE + SLACK)
        wait_until(lambda: any("Freeze" in pending_types(s["Metrics"])
                               for _, s in snapshots(peer)), CHANGE_DEADLINE + SLACK,
                   "a snapshot with the Freeze pending")
        hub_arrival = time.time()
        assert otlp.arrival_time - changed < CHANGE_DEADLINE
        assert hub_arrival - changed < CHANGE_DEADLINE
        # The transition goes to the transitions hub, snapshots only to the metrics hub.
        wait_until(lambda: any(m.hub == EVENTS_HUB for m in peer.received), 10, "transition")
        [transition] = [json.loads(m.body) for m in peer.received if m.hub == EVENTS_HUB]
        assert transition["Transition"] == "scheduled" and transition["EventType"] == "Freeze"
        for message, body in snapshots(peer):
            assert message.application_properties == {"RecordKind": "metrics"}
            assert body["RecordKind"] == "metrics" and set(body) == {
                "TimeGenerated", "RecordKind", "VmId", "VmName", "Metrics", "RecordId",
                "ExporterVersion"}
        assert proc.terminate() == 0
