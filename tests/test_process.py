"""The real exporter process against the simulator: cadence, proxies, faults, health, signals."""

from __future__ import annotations

import itertools
import statistics
import time
from pathlib import Path
from typing import Any

import pytest

from scheduled_events_exporter.simulator import Fault, Simulator
from tests.exporter_process import ExporterProcess, clean_env, free_port, get_json, state_dir
from tests.peers.rotel import RotelReceiver

FAR = "Mon, 11 Apr 2099 22:26:58 GMT"


def freeze(
    status: str = "Scheduled", not_before: str = FAR, event_id: str = "EVT-1"
) -> dict[str, Any]:
    return {
        "EventId": event_id,
        "EventStatus": status,
        "EventType": "Freeze",
        "ResourceType": "VirtualMachine",
        "Resources": ["vm-test", "vm-peer"],
        "NotBefore": not_before,
        "Description": "Live migration",
        "EventSource": "Platform",
        "DurationInSeconds": 5,
    }


def exporter_env(sim: Simulator, tmp_path: Path, **extra: str) -> dict[str, str]:
    defaults = {
        "SEE_IMDS_ENDPOINT": sim.url,
        "SEE_SINKS": "console",
        "SEE_STATE_DIR": state_dir(tmp_path),
        "SEE_HEALTH_ADDR": f"127.0.0.1:{free_port()}",
        "SEE_POLL_INTERVAL": "0.5",
    }
    return clean_env(**{**defaults, **extra})


def transitions(records: list[dict[str, Any]]) -> list[tuple[str | None, str]]:
    return [(r["EventId"], r["Transition"]) for r in records]


def polls(sim: Simulator) -> list[float]:
    return [r.monotonic for r in sim.requests if r.path.startswith("/metadata/scheduledevents")]


@pytest.mark.timeout(60)
def test_poll_cadence_matches_the_interval(sim: Simulator, tmp_path: Path) -> None:
    with ExporterProcess(exporter_env(sim, tmp_path)) as proc:
        assert sim.wait_for_requests(25, timeout=30, path_prefix="/metadata/scheduledevents")
        proc.terminate()
    stamps = polls(sim)[2:]  # skip start-up
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    assert abs(statistics.median(gaps) - 0.5) <= 0.05, gaps
    assert max(gaps) < 1.0, gaps  # no stall, no burst catch-up
    assert min(gaps) > 0.25, gaps  # never overlapping or doubled


@pytest.mark.timeout(60)
def test_dead_http_proxy_does_not_affect_imds(sim: Simulator, tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    env = exporter_env(
        sim,
        tmp_path,
        HTTP_PROXY=dead,
        http_proxy=dead,
        HTTPS_PROXY=dead,
        ALL_PROXY=dead,
        NO_PROXY="",
    )
    with ExporterProcess(env) as proc:
        sim.set_events([freeze()])
        records = proc.wait_for_records(1, timeout=20)
        assert transitions(records) == [("EVT-1", "scheduled")]
        assert "connection_error" not in proc.stderr()
        assert proc.terminate() == 0


@pytest.mark.timeout(180)
def test_fault_storm_leaves_exactly_the_right_transitions(sim: Simulator, tmp_path: Path) -> None:
    sim.push_fault(Fault.gone_for(3.0))
    rotel = RotelReceiver().start()
    env = exporter_env(sim, tmp_path, SEE_IMDS_TIMEOUT="1", SEE_SINKS="console,otlp",
                       OTEL_EXPORTER_OTLP_ENDPOINT=rotel.http_endpoint,
                       OTEL_SERVICE_NAME="fault-storm")
    with rotel, ExporterProcess(env) as proc:
        proc.wait_for(lambda: any(r.status == 200 for r in sim.requests), 30, "first document")
        sim.set_events([freeze()])
        proc.wait_for_records(1, timeout=20)
        # Each fault is an error outcome: the known event must survive every one of them.
        for fault in (
            Fault.server_error(count=2),
            Fault.html(),
            Fault.truncated(),
            Fault.wrong_types(),
            Fault.throttled(retry_after=1),
            Fault.slow(2.0),
        ):
            sim.push_fault(fault)
        before = len(sim.requests)
        # Seven failures in a row back off 0.5 s · 2^(n-1) with equal jitter, capped at 30 s:
        # up to ~62 s before the next good answer (~46 s on average), so allow 90.
        assert sim.wait_for_requests(
            before + 12, timeout=90, path_prefix="/metadata/scheduledevents"
        )
        sim.set_events([freeze("Started", "")])
        proc.wait_for_records(2, timeout=30)
        sim.set_events([])
        records = proc.wait_for_records(3, timeout=30)
        assert proc.proc.poll() is None, "exporter died during the fault storm"
        assert transitions(records) == [
            ("EVT-1", "scheduled"),
            ("EVT-1", "started"),
            ("EVT-1", "completed"),
        ]
        stderr = proc.stderr()
        for outcome in ("server_error", "invalid_document", "throttled", "timeout"):
            assert f"IMDS request failed ({outcome})" in stderr, outcome
        assert "410 Gone" in stderr
        # The same three, and only those, reached the real collector.
        logs = rotel.wait_for_logs(count=3, timeout=20)
        assert [r.event_name for r in rotel.logs] == [
            "azure.scheduled_event.scheduled",
            "azure.scheduled_event.started",
            "azure.scheduled_event.completed",
        ]
        assert {r.attributes["log.record.uid"] for r in logs} == {r["RecordId"] for r in records}
        assert proc.terminate() == 0
    statuses = [r.status for r in sim.requests]
    assert {410, 500, 429, 200}.issubset(set(statuses))


@pytest.mark.timeout(90)
def test_readyz_follows_imds_staleness(sim: Simulator, tmp_path: Path) -> None:
    env = exporter_env(sim, tmp_path, SEE_STALENESS_LIMIT="2", SEE_IMDS_TIMEOUT="0.5")
    port = env["SEE_HEALTH_ADDR"].rsplit(":", 1)[1]
    with ExporterProcess(env) as proc:
        url = f"http://127.0.0.1:{port}"
        proc.wait_for(lambda: _status(url + "/readyz") == 200, 20, "ready")
        assert get_json(url + "/healthz")[0] == 200
        sim.push_fault(Fault("status", status=503, duration=6.0))
        proc.wait_for(lambda: _status(url + "/readyz") == 503, 20, "not ready")
        status, body = get_json(url + "/readyz")
        assert status == 503 and body["status"] == "not ready"
        assert body["last_good_document_age_seconds"] > 2
        assert get_json(url + "/healthz")[0] == 200  # alive, just not ready
        proc.wait_for(lambda: _status(url + "/readyz") == 200, 40, "ready again")
        assert proc.terminate() == 0


def _status(url: str) -> int:
    try:
        return get_json(url, timeout=1.0)[0]
    except OSError:
        return 0


@pytest.mark.timeout(60)
def test_sigterm_exits_zero_and_persists_state(sim: Simulator, tmp_path: Path) -> None:
    env = exporter_env(sim, tmp_path)
    with ExporterProcess(env) as proc:
        sim.set_events([freeze()])
        proc.wait_for_records(1, timeout=20)
        started = time.monotonic()
        assert proc.terminate(timeout=15) == 0
        assert time.monotonic() - started < 10 + 2
    state = (Path(env["SEE_STATE_DIR"]) / "state.json").read_text()
    assert "EVT-1" in state


@pytest.mark.timeout(90)
def test_restart_reports_what_happened_while_down_exactly_once(
    sim: Simulator, tmp_path: Path
) -> None:
    env = exporter_env(sim, tmp_path)
    sim.set_events([freeze(event_id="A"), freeze(event_id="B")])
    with ExporterProcess(env) as proc:
        first = proc.wait_for_records(2, timeout=20)
        proc.kill()  # kill -9: no shutdown path runs
    # While it is down: A leaves (cancelled or run: nobody watched), B starts, C appears.
    sim.set_events([freeze("Started", "", event_id="B"), freeze(event_id="C")])
    with ExporterProcess(env) as proc:
        second = proc.wait_for_records(3, timeout=20)
        assert proc.terminate() == 0
    # At-least-once: a kill between printing and recording the delivery may repeat a record,
    # always with the same RecordId. After de-duplication each transition is there exactly once.
    union = dedupe(first + second)
    assert transitions(union) == [
        ("A", "scheduled"),
        ("B", "scheduled"),
        ("A", "outcome_unknown"),
        ("B", "started"),
        ("C", "scheduled"),
    ]
    gapped = [r for r in union if r["Transition"] != "scheduled" or r["EventId"] == "C"]
    assert all(r["ObservationGapSeconds"] and r["ObservationGapSeconds"] > 0 for r in gapped)


def dedupe(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Keep the first record per RecordId; a RecordId must always mean the same transition."""
    seen: dict[str, dict[str, Any]] = {}
    for record in records:
        earlier = seen.setdefault(record["RecordId"], record)
        assert (earlier["EventId"], earlier["Transition"]) == (
            record["EventId"],
            record["Transition"],
        )
    by_transition = [(r["EventId"], r["Transition"]) for r in seen.values()]
    assert len(by_transition) == len(set(by_transition)), by_transition
    return list(seen.values())


@pytest.mark.timeout(60)
def test_corrupt_state_file_is_set_aside(sim: Simulator, tmp_path: Path) -> None:
    env = exporter_env(sim, tmp_path)
    state = Path(env["SEE_STATE_DIR"]) / "state.json"
    state.write_bytes(b"\x00garbage{")
    with ExporterProcess(env) as proc:
        sim.set_events([freeze()])
        proc.wait_for_records(1, timeout=20)
        assert proc.terminate() == 0
    assert "unusable" in proc.stderr()
    assert list(state.parent.glob("state.json.corrupt-*"))


@pytest.mark.timeout(90)
def test_a_stop_during_a_slow_answer_lets_that_poll_finish_and_nothing_repeats(
        sim: Simulator, tmp_path: Path) -> None:
    """SIGTERM while an IMDS answer carrying a new transition is on its way: the poll thread
    finishes that poll (its record is printed by the stopping process), commits the state
    itself, and the next start reports nothing of it again (docs/semantics.md#reliability)."""
    env = exporter_env(sim, tmp_path, SEE_POLL_INTERVAL="0.3", SEE_SHUTDOWN_TIMEOUT="10")
    sim.set_events([freeze("Scheduled")])
    with ExporterProcess(env) as first:
        first.wait_for(lambda: ("EVT-1", "scheduled") in transitions(first.records()), 20,
                       "scheduled")
        sim.push_fault(Fault.slow(3.0))  # the next answer leaves 3 s after its request came
        sim.set_events([freeze("Started", not_before="")])
        assert sim.wait_for_faults_taken(1, timeout=10), "the slow request never came"
        stopped = time.monotonic()
        assert first.terminate(timeout=20) == 0, first.stderr()[-1500:]
        took = time.monotonic() - stopped
    assert transitions(first.records()) == [("EVT-1", "scheduled"), ("EVT-1", "started")], (
        first.stderr()[-1500:])
    assert took < 10, f"the stop took {took:.1f} s (SEE_SHUTDOWN_TIMEOUT 10 s)"
    polls_before = len(polls(sim))
    with ExporterProcess(env) as second:
        assert sim.wait_for_requests(polls_before + 6, timeout=30,
                                     path_prefix="/metadata/scheduledevents")
        sim.set_events([])  # the event ends: the only news the second run may report
        second.wait_for(lambda: bool(second.records()), 20, "the completion")
        assert second.terminate() == 0
    assert transitions(second.records()) == [("EVT-1", "completed")], second.stderr()[-1500:]
    ids = [r["RecordId"] for r in first.records() + second.records()]
    assert len(ids) == len(set(ids))
