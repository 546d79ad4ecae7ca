"""Kill storm: ``kill -9`` every 1–3 s (seeded) for 60 s while a scenario plays, with restarts.

The real exporter (``SEE_SINKS=otlp``, state directory on disk) exports to an OTLP/HTTP stand-in
that accepts everything. Each step of the scenario changes the document (event *i* appears,
*i-1* starts, *i-2* completes) and is held until its three transitions arrived, so every
transition is observed by some exporter process; meanwhile the exporter is SIGKILLed at random
moments (seeded, so a failure can be replayed) and restarted at once on the same state
directory. After de-duplication by ``log.record.uid``, the collector must hold every transition
exactly once, in order, none missing.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest

from scheduled_events_exporter.simulator import Simulator
from tests.exporter_process import ExporterProcess, clean_env, state_dir
from tests.peers.otlp_standin import OtlpHttpStandIn

SEED = 14
STORM_SECONDS = 60.0
FAR = "Mon, 11 Apr 2099 22:26:58 GMT"


def event(event_id: str, status: str) -> dict[str, Any]:
    return {
        "EventId": event_id, "EventStatus": status, "EventType": "Freeze",
        "ResourceType": "VirtualMachine", "Resources": ["vm-test"],
        "NotBefore": FAR if status == "Scheduled" else "", "Description": "",
        "EventSource": "Platform", "DurationInSeconds": 5,
    }


def step(i: int) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """Document of step ``i`` and the transitions it causes."""
    document = [event(f"K-{i}", "Scheduled")]
    transitions = []
    if i >= 2:
        transitions.append((f"K-{i - 2}", "completed"))
    if i >= 1:
        document.insert(0, event(f"K-{i - 1}", "Started"))
        transitions.append((f"K-{i - 1}", "started"))
    transitions.append((f"K-{i}", "scheduled"))
    return document, transitions


@pytest.mark.timeout(240)
def test_kill_storm_loses_and_repeats_nothing(sim: Simulator, tmp_path: Path) -> None:
    rng = random.Random(SEED)
    with OtlpHttpStandIn() as collector:
        env = clean_env(
            SEE_IMDS_ENDPOINT=sim.url, SEE_SINKS="otlp", SEE_STATE_DIR=state_dir(tmp_path),
            SEE_HEALTH_ADDR="", SEE_POLL_INTERVAL="0.3",
            OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint, OTEL_EXPORTER_OTLP_TIMEOUT="2",
        )

        def unique() -> dict[str, tuple[str, str]]:
            seen: dict[str, tuple[str, str]] = {}
            for accepted in list(collector.accepted):
                key = (accepted.event_id, accepted.transition)
                assert seen.setdefault(accepted.uid, key) == key, "one uid, two transitions"
            return seen

        processes = [ExporterProcess(env)]
        expected: list[tuple[str, str]] = []
        waiting: list[tuple[str, str]] = []
        i = kills = 0
        start = time.monotonic()
        end = start + STORM_SECONDS
        next_kill = start + rng.uniform(1, 3)
        try:
            while True:
                now = time.monotonic()
                current = processes[-1]
                if current.proc.poll() is not None:
                    assert current.proc.returncode == -9, current.stderr()
                    processes.append(ExporterProcess(env))
                    continue
                if now < end and now >= next_kill:
                    current.kill()
                    kills += 1
                    next_kill = now + rng.uniform(1, 3)
                    continue
                if not set(waiting) - set(unique().values()):
                    if now >= end:
                        break
                    document, waiting = step(i)
                    sim.set_events(document)
                    expected.extend(waiting)
                    i += 1
                assert now < end + 90, f"step {i - 1}: {waiting} never arrived"
                time.sleep(0.05)
            final = processes[-1]
            assert final.terminate() == 0
        finally:
            for process in processes:
                process.kill()
    got = list(unique().values())
    assert kills >= STORM_SECONDS / 3 - 1, f"only {kills} kills"
    assert i >= 5, f"the scenario advanced only {i} steps in the storm"
    missing = [t for t in expected if t not in got]
    assert not missing, f"missing after {kills} kills: {missing}"
    assert got == expected, "each transition exactly once, in order"
    print(f"seed {SEED}: {kills} kills, {i} steps, {len(expected)} transitions, "
          f"{len(collector.accepted) - len(got)} duplicates delivered (then de-duplicated)")
