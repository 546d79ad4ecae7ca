"""``scheduled-events-exporter redeliver``: dead letters back into their sinks' spools, with
their original ``log.record.uid`` (delivery/redrive.py, redeliver.py). Process tests against a
scripted collector that refuses, then accepts; file-level tests of what is taken and skipped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from scheduled_events_exporter.codec import encode_record
from scheduled_events_exporter.delivery import dead_letter as letters
from scheduled_events_exporter.delivery import redrive
from scheduled_events_exporter.delivery.dead_letter import DeadLetterFile
from scheduled_events_exporter.delivery.spool import Spool
from scheduled_events_exporter.records import to_columns
from scheduled_events_exporter.simulator import Simulator
from tests.exporter_process import ExporterProcess, clean_env, wait_until
from tests.peers.otlp_standin import OtlpHttpStandIn
from tests.test_file_evolution import record
from tests.test_otlp_conformance import dead_letters, event, otlp_env, readyz

NOW = datetime(2026, 11, 27, 12, tzinfo=timezone.utc)


def redeliver(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "scheduled_events_exporter", "redeliver",
                           *args], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.timeout(150)
def test_redeliver_sends_what_a_refusing_collector_dead_lettered_once_it_is_fixed(
        sim: Simulator, tmp_path: Path) -> None:
    refusing = [True]
    with OtlpHttpStandIn(lambda ids: 400 if refusing[0] else None) as collector:
        env = otlp_env(sim, tmp_path, collector.endpoint, "http/protobuf")
        events = [event(f"D-{i}") for i in range(3)]
        with ExporterProcess(env) as proc:
            sim.set_events(events)
            wait_until(lambda: len(dead_letters(tmp_path)) == 3, 40, "three dead letters")
            # Beside a running exporter it says it cannot, and changes nothing.
            busy = redeliver(env)
            assert busy.returncode == 3, busy
            assert "in use by another exporter" in busy.stderr
            assert "--at-next-start" in busy.stderr and "stop it" in busy.stderr
            assert proc.terminate() == 0
        letters = dead_letters(tmp_path)
        uids = [letter["record_id"] for letter in letters]
        assert all("redelivered" not in letter for letter in letters)

        listed = redeliver(env, "--dry-run")
        assert listed.returncode == 0, listed
        assert listed.stdout.count("would redeliver:") == 3 and all(u in listed.stdout
                                                                    for u in uids)
        assert dead_letters(tmp_path) == letters, "a dry run changed the file"

        refusing[0] = False  # the collector is fixed
        done = redeliver(env, "--sink", "otlp")
        assert done.returncode == 0, done
        assert done.stdout.count("redelivered:") == 3
        assert all("redelivered" in letter for letter in dead_letters(tmp_path))
        again = redeliver(env)
        assert "skipped:" not in again.stdout, again.stdout  # a count, not a line each
        assert "nothing to put back, 3 skipped (3 of them redelivered before)" in again.stderr

        with ExporterProcess(env) as proc:
            collector.wait_for(lambda a: len(a) >= 3, 30, "the redelivered records")
            sim.clear_requests()  # a few more polls: nothing else arrives
            assert sim.wait_for_requests(3, 10), "three more polls"
            assert proc.terminate() == 0
    got = [a.uid for a in collector.accepted]
    assert sorted(got) == sorted(uids) and len(got) == 3, got
    assert [a.event_id for a in collector.accepted] == ["D-0", "D-1", "D-2"]


@pytest.mark.timeout(150)
def test_redeliver_at_the_next_start_needs_no_stopped_exporter(
        sim: Simulator, tmp_path: Path) -> None:
    refusing = [True]
    with OtlpHttpStandIn(lambda ids: 400 if refusing[0] else None) as collector:
        env = otlp_env(sim, tmp_path, collector.endpoint, "http/protobuf")
        with ExporterProcess(env) as proc:
            sim.set_events([event("N-0"), event("N-1")])
            wait_until(lambda: len(dead_letters(tmp_path)) == 2, 40, "two dead letters")
            asked = redeliver(env, "--at-next-start", "--event-id", "N-1")
            assert asked.returncode == 0, asked
            assert "carries it out at its next start" in asked.stderr
            refusing[0] = False
            assert proc.terminate() == 0
        with ExporterProcess(env) as proc:
            collector.wait_for(lambda a: len(a) >= 1, 30, "N-1 redelivered")
            sim.clear_requests()  # a few more polls: nothing else arrives
            assert sim.wait_for_requests(3, 10), "three more polls"
            assert proc.terminate() == 0
    assert [a.event_id for a in collector.accepted] == ["N-1"]
    assert "redeliver request carried out: 1 records put back" in proc.stderr()
    assert not (tmp_path / "state" / "redeliver-request.json").exists()
    marked = {letter["event_id"]: "redelivered" in letter for letter in dead_letters(tmp_path)}
    assert marked == {"N-0": False, "N-1": True}


def test_redeliver_refuses_bad_arguments(tmp_path: Path) -> None:
    env = clean_env(SEE_STATE_DIR=str(tmp_path))
    for args, said in [(["--sink", "kafka"], "expected one of console, eventhubs, otlp"),
                       (["--since", "yesterday"], "expected an RFC 3339 time"),
                       (["--since", "2026-11-27T10:00:00"], "with a UTC offset"),
                       (["--wait", "-1"], "expected 0 to 3600 seconds"),
                       (["--event-id"], "without a value"),
                       (["--dry-run", "--at-next-start"], "exclude each other"),
                       (["--frobnicate"], "unexpected '--frobnicate'")]:
        result = redeliver(env, *args)
        assert result.returncode == 2 and said in result.stderr, (args, result.stderr)
    missing = redeliver(clean_env(SEE_STATE_DIR=str(tmp_path / "absent")))
    assert missing.returncode == 1 and "no such state directory" in missing.stderr
    off = redeliver(clean_env(SEE_STATE_DIR=""))
    assert off.returncode == 1 and "SEE_STATE_DIR is empty: state is off" in off.stderr


def test_a_damaged_redeliver_request_never_stops_the_start_and_stays(
        sim: Simulator, tmp_path: Path) -> None:
    env = otlp_env(sim, tmp_path, "http://127.0.0.1:9", "http/protobuf")
    request = tmp_path / "state" / "redeliver-request.json"
    request.write_text("{not json")
    with ExporterProcess(env) as proc:
        proc.wait_for(lambda: "could not be carried out" in proc.stderr(), 30,
                      "the request's failure")
        sim.clear_requests()
        assert sim.wait_for_requests(3, 10), "it polls"
        body = readyz(env)[1]
        assert any("redeliver request not carried out" in w and "fix or delete it" in w
                   for w in body["warnings"]), body
        assert proc.terminate() == 0
    assert request.read_text() == "{not json"


def letter_file(state: Path) -> DeadLetterFile:
    """A dead-letter file with: rec 1 refused by otlp, rec 2 by eventhubs, an unreadable spool
    line of otlp (seq 3, a kind this release does not know), and a letter written before
    redeliver existed (no ``record``)."""
    file = DeadLetterFile(state)
    file.append(letters.rejected("otlp", record(1), "HTTP 400", "refused", to_columns))
    file.append(letters.rejected("eventhubs", record(2), "message_too_large", "big", to_columns))
    future = {"seq": 3, "record": {**encode_record(record(3)), "record_id": "rid-future"}}
    future["record"]["transition"]["kind"] = "superseded"
    file.append(letters.unreadable("otlp", 3, future, "kind 'superseded'"))
    old = json.loads(letters.rejected("otlp", record(4), "HTTP 400", "x", to_columns).to_json())
    del old["record"]
    with file.path.open("a") as handle:
        handle.write(json.dumps(old) + "\n")
    return file


def test_a_plan_takes_what_can_go_back_and_says_why_the_rest_cannot(tmp_path: Path) -> None:
    letter_file(tmp_path)
    chosen = redrive.plan(tmp_path, redrive.Selection())
    assert [t.record.record_id for t in chosen.taken] == ["rid-1", "rid-2"]
    assert [(s.letter.record_id, s.reason.split(" (")[0]) for s in chosen.skipped] == [
        ("rid-future", "this release cannot read it either"),
        ("rid-4", "written by a release before redeliver: it holds the record as sent, not as "
                  "stored")]
    only = redrive.plan(tmp_path, redrive.Selection(sink="eventhubs"))
    assert [t.record.record_id for t in only.taken] == ["rid-2"] and only.skipped == ()
    assert redrive.plan(tmp_path, redrive.Selection(event_id="E1")).taken[0].record.seq == 1
    later = redrive.plan(tmp_path, redrive.Selection(since=datetime(2999, 1, 1,
                                                                    tzinfo=timezone.utc)))
    assert later.taken == () and later.skipped == ()


def test_apply_appends_after_every_sequence_number_used_and_marks_the_letters(
        tmp_path: Path) -> None:
    letter_file(tmp_path)
    (tmp_path / "state.json").write_text(json.dumps({"seq": 40}))
    Spool(tmp_path / "spool", "console").append([record(55)])  # another sink went further
    done = redrive.apply(tmp_path, redrive.plan(tmp_path, redrive.Selection()), NOW)
    assert [(item.record.record_id, seq) for item, seq in done] == [("rid-1", 56),
                                                                     ("rid-2", 57)]
    assert [(r.record_id, r.seq) for r in Spool(tmp_path / "spool", "otlp").load()] == [
        ("rid-1", 56)]
    assert [r.record_id for r in Spool(tmp_path / "spool", "eventhubs").load()] == ["rid-2"]
    marked = [json.loads(x) for x in (tmp_path / "dead-letter.jsonl").read_text().splitlines()]
    assert [x.get("redelivered") for x in marked] == [
        {"time": "2026-11-27T12:00:00.000Z", "seq": 56},
        {"time": "2026-11-27T12:00:00.000Z", "seq": 57}, None, None]
    again = redrive.plan(tmp_path, redrive.Selection())
    assert again.taken == () and {s.reason for s in again.skipped} >= {"already redelivered"}


@pytest.mark.skipif(sys.platform == "win32" or os.geteuid() != 0, reason="needs root")
def test_run_as_root_it_writes_as_the_state_directorys_owner(tmp_path: Path) -> None:
    """As docs/vm.md runs it (sudo, the unit's dynamic user owning the directory, whose parent
    the user cannot enter): no file it writes may end up root's."""
    closed = tmp_path / "private"
    state = closed / "state"
    state.mkdir(parents=True)
    letter_file(state)
    for path in [state, *state.rglob("*")]:
        os.chown(path, 65534, 65534)
    closed.chmod(0o700)  # root's, like /var/lib/private
    done = redeliver(clean_env(SEE_STATE_DIR=str(state)))
    assert done.returncode == 0, done.stderr
    assert "running as the state directory's owner (uid 65534)" in done.stderr
    assert done.stdout.count("redelivered:") == 2
    owners = {str(p.relative_to(state)): p.stat().st_uid for p in state.rglob("*")}
    assert set(owners.values()) == {65534}, owners
