"""kill -9 at every durability step: each transition reaches the sinks exactly once per RecordId.

The exporter is crashed with ``SEE_FAILPOINT`` (``os._exit`` at an exact point: before or after
the state file is written, after the records are spooled, after a delivery before its ack)
and restarted; the union of everything the sinks received, de-duplicated by RecordId, must hold
each expected transition exactly once and nothing else.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from scheduled_events_exporter.simulator import Simulator
from tests.exporter_process import ExporterProcess, clean_env, state_dir
from tests.peers.rotel import RotelReceiver

FAR = "Mon, 11 Apr 2099 22:26:58 GMT"


def event(event_id: str, status: str = "Scheduled") -> dict[str, Any]:
    return {
        "EventId": event_id,
        "EventStatus": status,
        "EventType": "Reboot",
        "ResourceType": "VirtualMachine",
        "Resources": ["vm-test"],
        "NotBefore": FAR if status == "Scheduled" else "",
        "Description": "",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }


# (document, the transition it must produce)
STEPS: list[tuple[list[dict[str, Any]], tuple[str, str]]] = [
    ([event("A")], ("A", "scheduled")),
    ([event("A"), event("B")], ("B", "scheduled")),
    ([event("A", "Started"), event("B")], ("A", "started")),
    ([event("B")], ("A", "completed")),
    # Cancelled when the exporter watched B leave; after a crash in between, the restart is an
    # observation gap and the verdict is honestly unknown (docs/lifecycle.md).
    ([], ("B", "cancelled|outcome_unknown")),
    ([event("C", "Started")], ("C", "started")),
    ([], ("C", "completed")),
]


def unique(records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(EventId, Transition) per distinct RecordId; a RecordId never names two transitions.
    An end of B is reported under the step's alternatives (see STEPS)."""
    seen: dict[str, tuple[str, str]] = {}
    for r in records:
        key = (r["EventId"], r["Transition"])
        assert seen.setdefault(r["RecordId"], key) == key
    return [(e, "cancelled|outcome_unknown") if e == "B" and t in ("cancelled", "outcome_unknown")
            else (e, t) for e, t in seen.values()]


@pytest.mark.parametrize(
    "failpoint",
    [
        "before_commit:1",
        "after_commit:2",
        "after_spool:3",
        "after_deliver:4",
        "before_commit:5",
        "after_commit:6",
        "after_spool:7",
        "after_deliver:2",
    ],
)
@pytest.mark.timeout(120)
def test_crash_at_each_durability_step(sim: Simulator, tmp_path: Path, failpoint: str) -> None:
    base = clean_env(
        SEE_IMDS_ENDPOINT=sim.url,
        SEE_SINKS="console",
        SEE_STATE_DIR=state_dir(tmp_path),
        SEE_HEALTH_ADDR="",
        SEE_POLL_INTERVAL="0.3",
    )
    received: list[dict[str, Any]] = []
    processes: list[ExporterProcess] = [ExporterProcess({**base, "SEE_FAILPOINT": failpoint})]
    crashes = 0
    try:
        for index, (document, expected) in enumerate(STEPS):
            sim.set_events(document)
            deadline = time.monotonic() + 30
            while expected not in unique(received + processes[-1].records()):
                current = processes[-1]
                if current.proc.poll() is not None:
                    assert current.proc.returncode == 137, current.stderr()
                    received.extend(current.records())
                    crashes += 1
                    processes.append(ExporterProcess(base))  # restart, no failpoint
                    continue
                assert time.monotonic() < deadline, (
                    f"step {index}: {expected} never arrived; got "
                    f"{unique(received + current.records())}"
                )
                # Woken by each line the exporter prints and by its exit (stdout EOF).
                current.wait_until(
                    lambda c=current, e=expected: (
                        c.proc.poll() is not None or e in unique(received + c.records())
                    ),
                    timeout=1.0,
                )
        final = processes[-1]
        code = final.terminate()
        received.extend(final.records())
        if code == 137 and crashes == 0:
            # The armed process reached its failpoint at the last step, after the console
            # worker had already printed that step's record (the worker races the poll thread
            # that spools and then dies): a crash like the others, so restart once more.
            crashes += 1
            final = ExporterProcess(base)
            processes.append(final)
            final.wait_for(lambda: "polling" in final.stderr(), 30, "the restart")
            code = final.terminate()
            received.extend(final.records())
        assert code == 0, final.stderr()
    finally:
        for process in processes:
            process.kill()
    assert crashes == 1, f"the failpoint {failpoint} was never reached"
    assert unique(received) == [expected for _, expected in STEPS]


@pytest.mark.timeout(120)
def test_crash_while_the_collector_is_down_then_both_recover(
    sim: Simulator, tmp_path: Path
) -> None:
    receiver = RotelReceiver().start()
    receiver.stop()  # the collector is down from the start; its ports are known
    env = clean_env(
        SEE_IMDS_ENDPOINT=sim.url,
        SEE_SINKS="otlp",
        SEE_STATE_DIR=state_dir(tmp_path),
        SEE_HEALTH_ADDR="",
        SEE_POLL_INTERVAL="0.3",
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.http_endpoint,
        OTEL_SERVICE_NAME="crash-test",
        OTEL_EXPORTER_OTLP_TIMEOUT="2",
    )
    try:
        with ExporterProcess(env) as first:
            sim.set_events([event("A"), event("B")])
            first.wait_for(
                lambda: "sink otlp: delivery failed" in first.stderr(), 30, "a failed delivery"
            )
            first.kill()
        sim.set_events([event("B", "Started")])  # while everything is down
        receiver.start()
        with ExporterProcess(env) as second:
            logs = receiver.wait_for_logs(count=4, timeout=60)
            assert second.terminate() == 0
    finally:
        receiver.stop()
    got = [(r.attributes["azure.scheduled_event.id"], r.event_name.rsplit(".", 1)[1]) for r in logs]
    # A left while the exporter was down: no evidence either way (docs/lifecycle.md).
    assert got == [("A", "scheduled"), ("B", "scheduled"), ("A", "outcome_unknown"),
                   ("B", "started")]
    assert "azure.scheduled_event.observation_gap" in logs[2].attributes
    assert logs[2].attributes["azure.scheduled_event.outcome_basis"] == "observation_gap"


def spooled_ids(state: Path) -> list[str]:
    """EventIds of the whole lines of the otlp spool, in order."""
    log = state / "spool" / "otlp.log"
    text = log.read_text() if log.exists() else ""
    return [json.loads(line)["record"]["transition"]["event"]["event_id"]
            for line in text.splitlines(keepends=True) if line.endswith("\n")]


@pytest.mark.parametrize("how", ["by hand", "failpoint"])
@pytest.mark.timeout(150)
def test_a_torn_spool_tail_does_not_eat_the_next_record(
        sim: Simulator, tmp_path: Path, how: str) -> None:
    """Power is cut in the middle of a spool append (the first 40 bytes of the line reach the
    disk) while the collector is down; the exporter restarts, still without a collector, and
    the next record is appended. Everything reaches the collector once it is back, and nothing
    whole is dead-lettered. ``by hand`` writes the fragment as the trial did; ``failpoint``
    dies for real inside the append (SEE_FAILPOINT=torn_write)."""
    receiver = RotelReceiver().start()
    receiver.stop()  # down from the start; its ports are known
    state = Path(state_dir(tmp_path))
    env = clean_env(SEE_IMDS_ENDPOINT=sim.url, SEE_SINKS="otlp", SEE_STATE_DIR=str(state),
                    SEE_HEALTH_ADDR="", SEE_POLL_INTERVAL="0.3", OTEL_EXPORTER_OTLP_TIMEOUT="2",
                    OTEL_EXPORTER_OTLP_ENDPOINT=receiver.http_endpoint,
                    OTEL_METRICS_EXPORTER="none")
    try:
        sim.set_events([event("A")])
        armed = {**env, "SEE_FAILPOINT": "torn_write:otlp.log:2:40"} if how == "failpoint" else env
        with ExporterProcess(armed) as first:
            first.wait_for(lambda: spooled_ids(state) == ["A"], 30, "A spooled")
            sim.set_events([event("A"), event("B")])
            if how == "failpoint":
                first.wait_for(lambda: first.proc.poll() is not None, 30, "the torn write")
                assert first.proc.returncode == 137, first.stderr()
            else:
                first.wait_for(lambda: spooled_ids(state) == ["A", "B"], 30, "B spooled")
                first.kill()  # the state file still has B in its outbox, as at a power cut
                # B's line as a power cut during its append would have left it.
                log = state / "spool" / "otlp.log"
                whole = log.read_bytes()
                b_line = whole[whole.index(b"\n") + 1:]
                log.write_bytes(whole[:whole.index(b"\n") + 1] + b_line[:40])
        assert not (state / "spool" / "otlp.log").read_bytes().endswith(b"\n")
        sim.set_events([event("A"), event("B"), event("C")])
        with ExporterProcess(env) as second:
            second.wait_for(lambda: spooled_ids(state) == ["A", "B", "C"], 30,
                            "B (from the outbox) and C spooled after the cut")
            assert second.terminate() == 0
        receiver.start()
        with ExporterProcess(env) as third:
            logs = receiver.wait_for_logs(count=3, timeout=60)
            assert third.terminate() == 0
    finally:
        receiver.stop()
    got = [(r.attributes["azure.scheduled_event.id"], r.event_name.rsplit(".", 1)[1])
           for r in receiver.logs]
    assert got == [("A", "scheduled"), ("B", "scheduled"), ("C", "scheduled")], got
    assert len({r.attributes["log.record.uid"] for r in logs}) == 3
    assert not (state / "dead-letter.jsonl").exists(), (state / "dead-letter.jsonl").read_text()
