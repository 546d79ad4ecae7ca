"""Where the proven parts meet, at the process level: the exporter as a real process against
the IMDS simulator and scripted collectors, its commands (``redeliver``) run beside it, disks
that refuse writes (``chattr +i``: EPERM on one file, as root on ext4), and crashes
(``SEE_FAILPOINT``). Each test here failed on the release before the start sequence, the
refusal rule and the dead-letter policy of delivery/start.py, delivery/refusal.py and
delivery/dead_letter.py:

* ``redeliver`` (both forms) after a crash between a commit and its spooling;
* a pending request with a spool that cannot be written;
* the dead-letter file's bound reached;
* a refusal while the dead-letter file cannot be written;
* a 413 for one record after a larger request was accepted;
* one record refused every time with ``RESOURCE_EXHAUSTED`` and no ``RetryInfo``, and a
  collector that refuses everything for two minutes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from scheduled_events_exporter.delivery import dead_letter as letters
from scheduled_events_exporter.simulator import Simulator
from tests.exporter_process import ExporterProcess, free_port, wait_until
from tests.peers.otlp_standin import OtlpGrpcStandIn, OtlpHttpStandIn
from tests.test_otlp_conformance import dead_letters, event, otlp_env, readyz


def redeliver(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "scheduled_events_exporter", "redeliver",
                           *args], env=env, capture_output=True, text=True, timeout=60)


def immutable_supported(where: Path) -> bool:
    probe = where / ".chattr-probe"
    probe.write_text("")
    try:
        return shutil.which("chattr") is not None and subprocess.run(
            ["chattr", "+i", str(probe)], capture_output=True).returncode == 0
    finally:
        subprocess.run(["chattr", "-i", str(probe)], capture_output=True)
        probe.unlink()


@contextmanager
def immutable(*paths: Path) -> Iterator[None]:
    """Every write to ``paths`` refused (EPERM) inside the block."""
    for path in paths:
        subprocess.run(["chattr", "+i", str(path)], check=True)
    try:
        yield
    finally:
        for path in paths:
            subprocess.run(["chattr", "-i", str(path)], check=True)


def needs_chattr(tmp_path: Path) -> None:
    if sys.platform == "win32" or os.geteuid() != 0 or not immutable_supported(tmp_path):
        pytest.skip("needs root and chattr +i (ext4) to refuse writes to one file")


def counts(accepted: list[Any]) -> Counter[tuple[str, str]]:
    return Counter((a.event_id, a.transition) for a in accepted)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("form", ["by hand", "at the next start"])
def test_redeliver_after_a_crash_between_commit_and_spool_loses_nothing(
        sim: Simulator, tmp_path: Path, form: str) -> None:
    refusing = [True]
    with OtlpHttpStandIn(lambda ids: 400 if refusing[0] and "L-0" in ids else None
                         ) as collector:
        env = otlp_env(sim, tmp_path, collector.endpoint, "http/protobuf")
        with ExporterProcess(env) as proc:
            sim.set_events([event("L-0")])
            wait_until(lambda: len(dead_letters(tmp_path)) == 1, 40, "the letter")
            assert proc.terminate() == 0
        # The next poll's records are committed, then the process dies before its spools
        # have them: only the state file's outbox holds C-1 and C-2.
        sim.set_events([event("L-0"), event("C-1"), event("C-2")])
        with ExporterProcess({**env, "SEE_FAILPOINT": "after_commit"}) as proc:
            proc.wait_for(lambda: proc.proc.poll() is not None, 40, "the crash")
        assert proc.proc.returncode == 137
        state = json.loads((tmp_path / "state" / "state.json").read_text())
        assert sorted(r["transition"]["event"]["event_id"] for r in state["outbox"]) == [
            "C-1", "C-2"]
        refusing[0] = False  # the cause of the letter is fixed
        asked = redeliver(env) if form == "by hand" else redeliver(env, "--at-next-start")
        assert asked.returncode == 0, asked.stderr
        with ExporterProcess(env) as proc:
            collector.wait_for(lambda a: {x.event_id for x in a} >= {"L-0", "C-1", "C-2"}, 40,
                               "the outbox and the letter")
            sim.clear_requests()  # a few more polls: nothing else arrives
            assert sim.wait_for_requests(3, 10), "three more polls"
            assert proc.terminate() == 0
    assert counts(collector.accepted) == {("L-0", "scheduled"): 1, ("C-1", "scheduled"): 1,
                                          ("C-2", "scheduled"): 1}
    [letter] = dead_letters(tmp_path)
    [again] = [a for a in collector.accepted if a.event_id == "L-0"]
    assert again.uid == letter["record_id"] and "redelivered" in letter
    # In order: what the outbox promised goes before the letter put back after it.
    assert [a.event_id for a in collector.accepted][-1] == "L-0"


def lettered_then_requested(sim: Simulator, tmp_path: Path, collector: OtlpHttpStandIn,
                            refusing: list[bool], event_id: str) -> dict[str, str]:
    """One record dead-lettered by a collector that refuses it, the cause then fixed and a
    ``redeliver --at-next-start`` request left; returns the exporter's environment."""
    env = otlp_env(sim, tmp_path, collector.endpoint, "http/protobuf")
    with ExporterProcess(env) as proc:
        sim.set_events([event(event_id)])
        wait_until(lambda: len(dead_letters(tmp_path)) == 1, 40, "the letter")
        assert proc.terminate() == 0
    refusing[0] = False
    assert redeliver(env, "--at-next-start").returncode == 0
    return env


@pytest.mark.timeout(200)
def test_a_request_with_an_unwritable_spool_never_stops_the_start(
        sim: Simulator, tmp_path: Path) -> None:
    needs_chattr(tmp_path)
    refusing = [True]
    with OtlpHttpStandIn(lambda ids: 400 if refusing[0] and "U-0" in ids else None
                         ) as collector:
        env = lettered_then_requested(sim, tmp_path, collector, refusing, "U-0")
        spool = tmp_path / "state" / "spool" / "otlp.log"
        with immutable(spool), ExporterProcess(env) as proc:
            proc.wait_for(lambda: "could not be carried out" in proc.stderr(), 30,
                          "the request's failure")
            sim.clear_requests()
            assert sim.wait_for_requests(3, 10), "it polls"
            sim.set_events([event("U-0"), event("U-1")])
            collector.wait_for(lambda a: "U-1" in {x.event_id for x in a}, 30,
                               "U-1 delivered from memory")
            status, body = readyz(env)
            assert status == 200, body
            assert any("redeliver request not carried out" in w for w in body["warnings"]), body
            assert proc.proc.poll() is None
        # Writable again: the next start carries it out (the running one may have too).
        with ExporterProcess(env) as proc:
            collector.wait_for(lambda a: "U-0" in {x.event_id for x in a}, 40, "the letter")
            assert proc.terminate() == 0
    assert counts(collector.accepted)[("U-0", "scheduled")] == 1
    assert not (tmp_path / "state" / "redeliver-request.json").exists()


@pytest.mark.timeout(200)
def test_the_request_is_tried_again_once_the_spool_can_be_written(
        sim: Simulator, tmp_path: Path) -> None:
    needs_chattr(tmp_path)
    refusing = [True]
    with OtlpHttpStandIn(lambda ids: 400 if refusing[0] and "W-0" in ids else None
                         ) as collector:
        env = lettered_then_requested(sim, tmp_path, collector, refusing, "W-0")
        spool = tmp_path / "state" / "spool" / "otlp.log"
        with ExporterProcess(env) as proc:
            with immutable(spool):
                proc.wait_for(lambda: "could not be carried out" in proc.stderr(), 30,
                              "the request's failure")
            # No restart: the poll thread tries again once the storage works.
            collector.wait_for(lambda a: "W-0" in {x.event_id for x in a}, 60,
                               "the letter redelivered while running")
            # The line follows the records into the spool, so the sink may deliver first.
            proc.wait_for(lambda: re.search(r"redeliver request carried out after \d+ failed "
                                            r"attempts", proc.stderr()) is not None, 20,
                          "the request's success line")
            assert proc.terminate() == 0
    assert counts(collector.accepted) == {("W-0", "scheduled"): 1}


def filler_letter(n: int, sink: str = "otlp") -> bytes:
    return json.dumps({"time": "2026-11-20T00:00:00.000Z", "sink": sink, "status": "HTTP 400",
                       "reason": "old", "event_id": f"OLD-{n}", "transition": "scheduled",
                       "record_id": f"old-{n}", "seq": n, "payload": "x" * 60000}).encode() + b"\n"


@pytest.mark.timeout(200)
def test_no_letter_goes_at_the_bound_without_an_error_line_and_the_counter(
        sim: Simulator, tmp_path: Path) -> None:
    # Every generation the bound keeps is full: the next letter makes room by removing the
    # oldest, and says so, counts it and shows it in /readyz.
    state = tmp_path / "state"
    state.mkdir()
    per_file = letters.MAX_BYTES // len(filler_letter(0))
    n = 0
    for number in range(letters.GENERATIONS - 1, -1, -1):
        path = letters.generation(state, number)
        lines = []
        # The file written to is full too: the next letter does not fit.
        for _ in range(per_file + (number == 0)):
            n += 1
            lines.append(filler_letter(n, "otlp" if n % 3 else "eventhubs"))
        path.write_bytes(b"".join(lines))
    oldest = letters.generation(state, letters.GENERATIONS - 1).read_bytes().splitlines()
    by_sink = Counter(json.loads(x)["sink"] for x in oldest)
    metrics = free_port()
    with OtlpHttpStandIn(lambda ids: 400 if "B-0" in ids else None) as collector:
        env = otlp_env(sim, tmp_path, collector.endpoint, "http/protobuf",
                       OTEL_METRICS_EXPORTER="prometheus",
                       OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
                       OTEL_EXPORTER_PROMETHEUS_PORT=str(metrics))
        with ExporterProcess(env) as proc:
            sim.set_events([event("B-0")])
            proc.wait_for(lambda: "its bound" in proc.stderr(), 40, "the bound's line")
            scrape = fetch(f"http://127.0.0.1:{metrics}/metrics")
            body = readyz(env)[1]
            assert proc.terminate() == 0
    [line] = [x for x in proc.stderr_lines if "its bound" in x]
    assert " ERROR " in line
    assert (f"removed dead-letter.jsonl.{letters.GENERATIONS - 1}, the oldest file, with "
            f"{len(oldest)} letters "
            f"({len(oldest)} of them never redelivered; sinks: eventhubs "
            f"{by_sink['eventhubs']}, otlp {by_sink['otlp']})") in line
    dropped = {(m["sink"], int(float(v))) for m, v in series(scrape, "failures")
               if m.get("signal") == "dead_letter_dropped"}
    assert dropped == {("otlp", by_sink["otlp"]), ("eventhubs", by_sink["eventhubs"])}
    assert any(f"{by_sink['otlp']} dead letters removed" in w for w in body["warnings"]), body
    # Every other letter is still there, the new one included; redeliver reads them all.
    kept = [letters.generation(state, k) for k in range(letters.GENERATIONS)]
    assert all(p.exists() for p in kept)
    assert dead_letters(tmp_path)[-1]["event_id"] == "B-0"
    listed = redeliver(env, "--dry-run")
    total = sum(len(p.read_bytes().splitlines()) for p in kept)
    # The new letter can go back; the old ones (written without their record) are read too.
    assert (f"1 dead-lettered records would be put back (sinks: otlp), {total - 1} skipped"
            in listed.stderr), listed.stderr[-500:]


def fetch(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def series(text: str, name: str) -> list[tuple[dict[str, str], str]]:
    """(labels, value) of every sample whose metric name contains ``name``."""
    out = []
    for line in text.splitlines():
        if line.startswith("#") or name not in line.split("{")[0]:
            continue
        head, _, value = line.rpartition(" ")
        labels = {}
        if "{" in head:
            for pair in head[head.index("{") + 1:head.rindex("}")].split(","):
                key, _, raw = pair.partition("=")
                labels[key.strip()] = raw.strip().strip('"')
        out.append((labels, value))
    return out


@pytest.mark.timeout(200)
def test_a_refusal_while_the_dead_letter_file_cannot_be_written_is_lettered_once_it_can(
        sim: Simulator, tmp_path: Path) -> None:
    needs_chattr(tmp_path)
    with OtlpHttpStandIn(lambda ids: 400 if "R-0" in ids else None) as collector:
        env = otlp_env(sim, tmp_path, collector.endpoint, "http/protobuf")
        state = tmp_path / "state"
        state.mkdir(exist_ok=True)
        letters_file = state / "dead-letter.jsonl"
        letters_file.write_text("")
        with ExporterProcess(env) as proc:
            with immutable(letters_file):
                sim.set_events([event("R-0"), event("R-1")])
                collector.wait_for(lambda a: "R-1" in {x.event_id for x in a}, 30,
                                   "the record behind it")
                wait_until(lambda: readyz(env)[1]["sinks"]["otlp"]["letters_waiting"] == 1, 20,
                           "the record held for its letter")
                body = readyz(env)[1]
                assert any("wait in the spool for the dead-letter file" in w
                           for w in body["warnings"]), body
                spooled = (state / "spool" / "otlp.log").read_text()
                assert "R-0" in spooled, "the refused record left the spool before its letter"
            wait_until(lambda: readyz(env)[1]["sinks"]["otlp"]["letters_waiting"] == 0, 30,
                       "the letter written once the file can take it")
            assert proc.terminate() == 0
    assert [x["event_id"] for x in dead_letters(tmp_path)] == ["R-0"]
    assert "R-0" not in (tmp_path / "state" / "spool" / "otlp.log").read_text()
    assert counts(collector.accepted) == {("R-1", "scheduled"): 1}


@pytest.mark.timeout(200)
def test_a_413_for_one_record_after_a_larger_request_passed_does_not_hold_its_sink(
        sim: Simulator, tmp_path: Path) -> None:
    # A proxy that limits the compressed body refuses a record that compresses badly, though
    # a larger one that compresses well passed before.
    with OtlpHttpStandIn(lambda ids: 413 if "S-1" in ids else None) as collector:
        env = otlp_env(sim, tmp_path, collector.endpoint, "http/protobuf")
        with ExporterProcess(env) as proc:
            sim.set_events([event("S-0", padding=200_000)])
            collector.wait_for(lambda a: "S-0" in {x.event_id for x in a}, 30, "the large one")
            sim.set_events([event("S-0", padding=200_000), event("S-1"), event("S-2"),
                            event("S-3")])
            collector.wait_for(lambda a: {"S-2", "S-3"} <= {x.event_id for x in a}, 60,
                               "the records behind the refused one")
            wait_until(lambda: len(dead_letters(tmp_path)) == 1, 30, "the letter")
            assert proc.terminate() == 0
    assert [(x["event_id"], x["status"]) for x in dead_letters(tmp_path)] == [("S-1", "HTTP 413")]
    assert counts(collector.accepted) == {("S-0", "scheduled"): 1, ("S-2", "scheduled"): 1,
                                          ("S-3", "scheduled"): 1}


@pytest.mark.timeout(240)
def test_one_record_refused_every_time_without_retry_info_is_lettered_and_the_rest_flows(
        sim: Simulator, tmp_path: Path) -> None:
    with OtlpGrpcStandIn(lambda ids: "RESOURCE_EXHAUSTED" if "X-1" in ids else None
                         ) as collector:
        env = otlp_env(sim, tmp_path, collector.endpoint, "grpc")
        with ExporterProcess(env) as proc:
            sim.set_events([event("X-0")])
            collector.wait_for(lambda a: "X-0" in {x.event_id for x in a}, 30, "X-0")
            sim.set_events([event("X-0"), event("X-1"), event("X-2")])
            collector.wait_for(lambda a: "X-2" in {x.event_id for x in a}, 90,
                               "the record behind the refused one")
            wait_until(lambda: len(dead_letters(tmp_path)) == 1, 30, "the letter")
            assert proc.terminate() == 0
    assert [x["event_id"] for x in dead_letters(tmp_path)] == ["X-1"]
    assert "is the cause" in dead_letters(tmp_path)[0]["reason"]
    carried = [ids for _, ids in collector.refused if "X-1" in ids]
    assert len(carried) <= 5, carried
    assert counts(collector.accepted) == {("X-0", "scheduled"): 1, ("X-2", "scheduled"): 1}


@pytest.mark.timeout(300)
def test_a_collector_that_refuses_everything_for_two_minutes_gets_nothing_lettered(
        sim: Simulator, tmp_path: Path) -> None:
    until = [0.0]  # no refusal before the clock is set

    def answer(ids: list[str]) -> str | None:
        return "RESOURCE_EXHAUSTED" if time.monotonic() < until[0] else None

    with OtlpGrpcStandIn(answer) as collector:
        env = otlp_env(sim, tmp_path, collector.endpoint, "grpc")
        with ExporterProcess(env) as proc:
            sim.set_events([event("Y-0")])
            collector.wait_for(lambda a: "Y-0" in {x.event_id for x in a}, 30, "Y-0")
            until[0] = time.monotonic() + 120
            sim.set_events([event(f"Y-{i}") for i in range(6)])
            wait_until(lambda: time.monotonic() > until[0], 130, "two minutes of refusals")
            assert dead_letters(tmp_path) == []
            collector.wait_for(lambda a: {f"Y-{i}" for i in range(6)} <= {x.event_id for x in a},
                               90, "everything once the collector recovers")
            assert proc.terminate() == 0
    assert dead_letters(tmp_path) == []
    assert len(collector.refused) >= 5, "the collector was hardly asked while it refused"
    assert counts(collector.accepted) == {(f"Y-{i}", "scheduled"): 1 for i in range(6)}
