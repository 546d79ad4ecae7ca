"""Approval through the real exporter process: once, early start, restart-safe, cadence kept."""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from scheduled_events_exporter.simulator import Simulator
from tests.exporter_process import ExporterProcess, clean_env, state_dir

FAR = "Mon, 11 Apr 2099 22:26:58 GMT"


def user_reboot(event_id: str = "USER-1") -> dict[str, Any]:
    return {
        "EventId": event_id,
        "EventStatus": "Scheduled",
        "EventType": "Reboot",
        "ResourceType": "VirtualMachine",
        "Resources": ["vm-test"],
        "NotBefore": FAR,
        "Description": "User initiated reboot",
        "EventSource": "User",
        "DurationInSeconds": -1,
    }


def posts(sim: Simulator) -> list[dict[str, Any]]:
    return [
        json.loads(r.body)
        for r in sim.requests
        if r.method == "POST" and r.path.startswith("/metadata/scheduledevents")
    ]


@pytest.mark.timeout(90)
def test_user_reboot_is_approved_once_starts_early_and_survives_restart(
    sim: Simulator, tmp_path: Path
) -> None:
    env = clean_env(
        SEE_IMDS_ENDPOINT=sim.url,
        SEE_SINKS="console",
        SEE_STATE_DIR=state_dir(tmp_path),
        SEE_HEALTH_ADDR="",
        SEE_POLL_INTERVAL="0.3",
        SEE_APPROVE="user",
    )
    sim.set_events([user_reboot()])
    with ExporterProcess(env) as proc:
        records = proc.wait_for_records(3, timeout=30)
        assert [(r["EventId"], r["Transition"]) for r in records] == [
            ("USER-1", "scheduled"),
            ("USER-1", "approved"),
            ("USER-1", "started"),
        ]
        approved = records[1]
        assert approved["ApprovalStatus"] == 200 and approved["ApprovalReason"] is None
        proc.kill()  # crash after approving: the approval is in the state file
    assert posts(sim) == [{"StartRequests": [{"EventId": "USER-1"}]}]
    post = next(r for r in sim.requests if r.method == "POST")
    assert post.header("Metadata") == "true"
    # The event goes back to Scheduled (say, IMDS re-announced it): never approved twice.
    sim.set_events([user_reboot()])
    with ExporterProcess(env) as proc:
        proc.wait_for_records(1, timeout=30)
        before = len(sim.requests)
        assert sim.wait_for_requests(
            before + 10, timeout=20, path_prefix="/metadata/scheduledevents"
        )
        assert proc.terminate() == 0
    assert len(posts(sim)) == 1


@pytest.mark.timeout(120)
def test_cadence_holds_while_a_hook_sleeps(sim: Simulator, tmp_path: Path) -> None:
    marker = tmp_path / "hook-started"
    env = clean_env(
        SEE_IMDS_ENDPOINT=sim.url,
        SEE_SINKS="console",
        SEE_STATE_DIR=state_dir(tmp_path),
        SEE_HEALTH_ADDR="",
        SEE_POLL_INTERVAL="0.5",
        SEE_APPROVE="user",
        SEE_APPROVE_HOOK=f"touch {marker}; sleep 30",
        SEE_APPROVE_HOOK_TIMEOUT="60",
    )
    with ExporterProcess(env) as proc:
        sim.set_events([user_reboot()])
        proc.wait_for_records(1, timeout=20)
        proc.wait_for(marker.exists, 20, "the hook to start")
        start = len(sim.requests)
        assert sim.wait_for_requests(
            start + 40, timeout=40, path_prefix="/metadata/scheduledevents"
        )
        stamps = [
            r.monotonic
            for r in sim.requests[start:]
            if r.path.startswith("/metadata/scheduledevents")
        ]
        assert proc.terminate() == 0
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    assert abs(statistics.median(gaps) - 0.5) <= 0.05, gaps
    assert posts(sim) == []  # the hook never finished, so nothing was approved
