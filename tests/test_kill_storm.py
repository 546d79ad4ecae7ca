"""Kill storm: ``kill -9`` every 1–3 s (seeded) for 60 s while a scenario plays, with restarts.

The real exporter (``SEE_SINKS=otlp``, state directory on disk) exports to an OTLP/HTTP stand-in
that accepts everything. Each step of the scenario changes the document (event *i* appears,
*i-1* starts, *i-2* completes) and is held until its three transitions arrived, so every
transition is observed by some exporter process; meanwhile the exporter is SIGKILLed at random
moments (seeded, so a failure can be replayed) and restarted at once on the same state
directory. A random SIGKILL seldom lands between a delivery and its acknowledgement, the one
moment a repeat is allowed, so every fourth process also crashes exactly there (the
``after_deliver`` failpoint, at its 1st to 3rd delivery; ``os._exit(137)``, as if SIGKILLed):
the checks below then judge real repeats. Each process names itself in a request header, so the
collector knows which process sent every record.

The contract held (docs/semantics.md, "Reliability"; docs/ARCHITECTURE.md, durability order):
delivery is at least once, and a record repeats only after a crash between shipping it and
persisting that fact (the sink's ack cursor), then with the same ``RecordId``
(``log.record.uid``) and the same content. So, exactly:

* every transition of the scenario is delivered, first deliveries in scenario order, nothing
  else is delivered;
* one transition, one ``RecordId``; every delivery of a ``RecordId`` carries the same record;
* a repeat comes from a later process than the delivery it repeats, the process of that
  delivery crashed (SIGKILL or the failpoint), and the delivery was in that process's *last*
  accepted request: the one worker per sink acknowledges a batch before it takes the next, so
  a process holds at most one delivered but unacknowledged batch when it dies;
* hence the bound: each repeat is paired with the delivery it repeats (the previous one of its
  RecordId, so no delivery is paired twice), which lies in a crashed process's last request; so
  duplicates <= the sum, over the crashes that could have caused one (of a process that had
  shipped something), of the size of that process's last accepted request. A process stopped
  with SIGTERM acknowledges what it delivered and causes none.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from scheduled_events_exporter.simulator import Simulator
from tests.exporter_process import ExporterProcess, clean_env, state_dir
from tests.peers.otlp_standin import SENDER_HEADER, Accepted, OtlpHttpStandIn

SEED = 14
STORM_SECONDS = 60.0
#: Every FAILPOINT_EVERY-th process crashes between a delivery and its acknowledgement.
FAILPOINT_EVERY = 4
#: After the storm, how long the last step's transitions may take to arrive.
SETTLE_SECONDS = 90.0
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


def arrived(wanted: list[tuple[str, str]], accepted: list[Accepted]) -> bool:
    return set(wanted) <= {(a.event_id, a.transition) for a in accepted}


@pytest.mark.timeout(240)
def test_kill_storm_delivers_everything_and_repeats_only_what_a_kill_left_unacknowledged(
        sim: Simulator, tmp_path: Path) -> None:
    rng = random.Random(SEED)
    crash_rng = random.Random(SEED + 1)  # kept apart: the kill times stay those of SEED
    with OtlpHttpStandIn() as collector:
        env = clean_env(
            SEE_IMDS_ENDPOINT=sim.url, SEE_SINKS="otlp", SEE_STATE_DIR=state_dir(tmp_path),
            SEE_HEALTH_ADDR="", SEE_POLL_INTERVAL="0.3",
            OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint, OTEL_EXPORTER_OTLP_TIMEOUT="2",
        )

        def launch() -> ExporterProcess:
            """The next exporter process, named by its index in ``processes``."""
            n = len(processes)
            extra = {"OTEL_EXPORTER_OTLP_LOGS_HEADERS": f"{SENDER_HEADER}={n}"}
            if n % FAILPOINT_EVERY == FAILPOINT_EVERY - 1:
                extra["SEE_FAILPOINT"] = f"after_deliver:{crash_rng.randint(1, 3)}"
            return ExporterProcess(env | extra)

        processes: list[ExporterProcess] = []
        processes.append(launch())
        expected: list[tuple[str, str]] = []
        waiting: list[tuple[str, str]] = []
        i = kills = crashes = 0
        start = time.monotonic()
        end = start + STORM_SECONDS
        next_kill = start + rng.uniform(1, 3)
        try:
            while True:
                now = time.monotonic()
                current = processes[-1]
                if current.proc.poll() is not None:
                    if current.proc.returncode == 137:  # the failpoint, as it says
                        # Its last line may still be in the pipe when the exit is seen.
                        current.wait_for_output_end(10)
                        assert "failpoint after_deliver: exiting" in current.stderr()
                        crashes += 1
                    else:
                        assert current.proc.returncode == -9, current.stderr()
                        kills += 1
                    processes.append(launch())
                    continue
                if now < end and now >= next_kill:
                    current.kill()  # SIGKILL, and reaped: it ships nothing more
                    next_kill = now + rng.uniform(1, 3)
                    continue
                if arrived(waiting, collector.accepted):
                    if now >= end:
                        break
                    document, waiting = step(i)
                    sim.set_events(document)
                    expected.extend(waiting)
                    i += 1
                    continue
                assert now < end + SETTLE_SECONDS, f"step {i - 1}: {waiting} never arrived"
                # Until the step's transitions arrive, or the next kill is due (after the
                # storm: the settling deadline).
                until = next_kill if now < end else end + SETTLE_SECONDS
                collector.wait_until(
                    lambda accepted, wanted=waiting: arrived(wanted, accepted), until - now)
            final = processes[-1]
            if final.terminate() == 137:
                # An armed process reached its failpoint while it drained at the stop (its
                # last delivery before the ack): a crash like the others; one more process,
                # unarmed, takes over and stops cleanly.
                final.wait_for_output_end(10)
                assert "failpoint after_deliver: exiting" in final.stderr()
                crashes += 1
                processes.append(launch())
                final = processes[-1]
                assert "SEE_FAILPOINT" not in final.env, "the process after it is armed too"
                final.wait_for(lambda: "polling" in final.stderr(), 30, "the restart")
                assert final.terminate() == 0
        finally:
            for process in processes:
                process.kill()
    deliveries = list(collector.accepted)
    assert kills >= STORM_SECONDS / 3 - 1, f"only {kills} kills"
    assert crashes >= 1, "no process reached its failpoint"
    assert i >= 5, f"the scenario advanced only {i} steps in the storm"
    # Every process but the last was SIGKILLed or crashed at its failpoint (the loop checked
    # each exit code); the last was stopped with SIGTERM and exited 0, acknowledging what it
    # delivered.
    assert len(processes) == kills + crashes + 1
    crashed = {str(n) for n in range(kills + crashes)}

    # One transition, one RecordId (both ways); every delivery of a RecordId is one record.
    firsts: dict[str, Accepted] = {}
    uids: dict[tuple[str, str], set[str]] = defaultdict(set)
    for d in deliveries:
        first = firsts.setdefault(d.uid, d)
        assert (d.event_id, d.transition) == (first.event_id, first.transition), \
            f"{d.uid}: one RecordId, two transitions"
        assert d.content == first.content, f"{d.uid} delivered again with other content"
        uids[(d.event_id, d.transition)].add(d.uid)
    assert {k: v for k, v in uids.items() if len(v) > 1} == {}, "a transition, two RecordIds"

    # At least once: every transition, first deliveries in scenario order, nothing else.
    assert [(d.event_id, d.transition) for d in firsts.values()] == expected

    # The repeats, each with the delivery it repeats, and each process's last accepted request.
    previous: dict[str, Accepted] = {}
    repeats: list[tuple[Accepted, Accepted]] = []
    last_request: dict[str, list[Accepted]] = defaultdict(list)
    for d in deliveries:
        if d.uid in previous:
            repeats.append((previous[d.uid], d))
        previous[d.uid] = d
        batch = last_request[d.sender]
        if batch and batch[0].request != d.request:
            batch.clear()
        batch.append(d)
    duplicates = len(deliveries) - len(firsts)
    assert duplicates == len(repeats)

    # The bound: a crash can cause at most the repeat of its process's last accepted request,
    # and only a crash of a process that had shipped something can cause one.
    could_cause = {p for p in crashed if last_request[p]}
    bound = sum(len(last_request[p]) for p in could_cause)
    assert duplicates <= bound, f"{duplicates} duplicates, at most {bound} explicable"

    # Each repeat, exactly: left unacknowledged by a crashed process, in its last request.
    for before, again in repeats:
        what = f"{again.event_id} {again.transition} repeated by process {again.sender}"
        assert before.sender in crashed, f"{what}: process {before.sender} did not crash"
        assert int(again.sender) > int(before.sender), f"{what}: not after a restart"
        assert before in last_request[before.sender], (
            f"{what}: process {before.sender} had acknowledged it (not its last request)")
    # The failpoint crashes left delivered batches unacknowledged: repeats happened, so the
    # checks above judged some.
    assert duplicates >= 1
    print(f"seed {SEED}: {kills} SIGKILLs and {crashes} failpoint crashes "
          f"({len(could_cause)} after shipping something), {i} steps, {len(expected)} "
          f"transitions, {duplicates} duplicates delivered (bound {bound}), caused by "
          f"{len({b.sender for b, _ in repeats})} of the crashes")
