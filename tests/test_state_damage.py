"""Damage inside the state file, met by the exporter as a real process against the IMDS
simulator (docs/semantics.md, "Compatibility"): it costs only what is damaged.

* One tracker entry of the wrong type (a ``duration`` written as a string): the other known
  event is not reported again (no second ``scheduled``, its RecordId the only one), nothing is
  moved away, the entry is said once however often the state is saved, and it stays in the file
  as it was while IMDS does not list its event; once IMDS does, the event is tracked afresh.
* A tracker that cannot be read at all: this start knows no events, but the record the crashed
  run committed to the outbox (and to no spool) is still delivered, with its RecordId.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from scheduled_events_exporter.simulator import Simulator
from tests.exporter_process import ExporterProcess, clean_env, state_dir

FAR = "Mon, 11 Apr 2099 22:26:58 GMT"


def event(event_id: str) -> dict[str, Any]:
    return {"EventId": event_id, "EventStatus": "Scheduled", "EventType": "Reboot",
            "ResourceType": "VirtualMachine", "Resources": ["vm-test"], "NotBefore": FAR,
            "Description": "", "EventSource": "Platform", "DurationInSeconds": 30}


def env(sim: Simulator, tmp_path: Path, **extra: str) -> dict[str, str]:
    return clean_env(SEE_IMDS_ENDPOINT=sim.url, SEE_SINKS="console",
                     SEE_STATE_DIR=state_dir(tmp_path), SEE_HEALTH_ADDR="",
                     SEE_POLL_INTERVAL="0.2", SEE_SHUTDOWN_TIMEOUT="2", **extra)


def seen(records: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(r["EventId"], r["Transition"], r["RecordId"]) for r in records]


def first_run(sim: Simulator, settings: dict[str, str]) -> list[tuple[str, str, str]]:
    """A and B appear and are reported; the exporter stops and saves them as known."""
    sim.set_events([event("A"), event("B")])
    with ExporterProcess(settings) as proc:
        records = proc.wait_for_records(2, timeout=30)
        assert proc.terminate() == 0, proc.stderr()
    assert sorted((e, t) for e, t, _ in seen(records)) == [("A", "scheduled"),
                                                          ("B", "scheduled")]
    return seen(records)


def state_of(tmp_path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((tmp_path / "state" / "state.json").read_text())
    return data


def damage_entry(tmp_path: Path, event_id: str) -> list[Any]:
    """Write ``event_id``'s tracker entry with its duration as a string, as a disk error or a
    mistaken build can leave it; returns the damaged entry."""
    data = state_of(tmp_path)
    [pair] = [pair for pair in data["tracker"]["events"] if pair[0] == event_id]
    assert pair[1]["event"]["duration"] == 30
    pair[1]["event"]["duration"] = "30"
    (tmp_path / "state" / "state.json").write_text(json.dumps(data))
    return list(pair)


def polls(sim: Simulator) -> int:
    return len([r for r in sim.requests if r.path.startswith("/metadata/scheduledevents")])


def said(proc: ExporterProcess) -> list[str]:
    return [line for line in proc.stderr().splitlines() if "cannot be read" in line]


@pytest.mark.timeout(90)
def test_one_damaged_entry_costs_only_its_own_event(sim: Simulator, tmp_path: Path) -> None:
    settings = env(sim, tmp_path)
    before = first_run(sim, settings)
    damage_entry(tmp_path, "A")
    # The document moved on meanwhile (as IMDS does when anything changes): a transition
    # derived again gets a new uid, as in the report.
    sim.set_events([event("A"), event("B")], incarnation=state_of(tmp_path)["tracker"][
        "incarnation"] + 3)
    with ExporterProcess(settings) as proc:
        proc.wait_for_records(1, timeout=30)
        assert sim.wait_for_requests(polls(sim) + 10, timeout=20)  # and some more polls
        assert proc.terminate() == 0, proc.stderr()
    again = seen(proc.records())
    # A could not be read, so it is new to this start: reported once more (a new uid, the
    # document's incarnation being another). B was remembered: not reported again.
    assert [(e, t) for e, t, _ in again] == [("A", "scheduled")], again
    assert again[0][2] not in {uid for _, _, uid in before}
    assert [uid for e, _, uid in before + again if e == "B"] == [
        uid for e, _, uid in before if e == "B"]
    assert not list((tmp_path / "state").glob("state.json.corrupt-*")), proc.stderr()
    [line] = said(proc)
    assert "'A'" in line and "events[0].event.duration: expected int, got str" in line
    assert "ERROR" in line
    # IMDS listed A again: the entry read from the document won, the damaged one is gone.
    pairs = state_of(tmp_path)["tracker"]["events"]
    assert sorted(pair[0] for pair in pairs) == ["A", "B"]
    assert all(pair[1]["event"]["duration"] == 30 for pair in pairs)


@pytest.mark.timeout(90)
def test_a_damaged_entry_stays_in_the_file_as_it_was(sim: Simulator, tmp_path: Path) -> None:
    """While IMDS does not list its event, the entry is written back unchanged at every save
    (each poll here changes the state: a new event each time), and said only once."""
    settings = env(sim, tmp_path)
    first_run(sim, settings)
    damaged = damage_entry(tmp_path, "A")
    saved_at = state_of(tmp_path)["saved_at"]
    sim.set_events([event("B")])
    with ExporterProcess(settings) as proc:
        assert sim.wait_for_requests(polls(sim) + 3, timeout=20)
        for name in ("C", "D", "E"):
            sim.set_events([event("B"), event(name)])
            proc.wait_for(lambda n=name: any(r["EventId"] == n for r in proc.records()), 20,
                          f"{name} reported")
        assert proc.terminate() == 0, proc.stderr()
    # Only the new events: B is remembered; A's end cannot be told (its entry is unread).
    assert [(r["EventId"], r["Transition"]) for r in proc.records()] == [
        ("C", "scheduled"), ("C", "cancelled"), ("D", "scheduled"), ("D", "cancelled"),
        ("E", "scheduled")], proc.records()
    data = state_of(tmp_path)
    assert data["saved_at"] != saved_at
    assert data["tracker"]["events"][-1] == damaged
    assert [pair[0] for pair in data["tracker"]["events"]] == ["B", "E", "A"]
    assert len(said(proc)) == 1, said(proc)
    assert not list((tmp_path / "state").glob("state.json.corrupt-*"))


@pytest.mark.timeout(90)
def test_a_tracker_that_cannot_be_read_still_delivers_the_committed_outbox(
        sim: Simulator, tmp_path: Path) -> None:
    """The crash between the state commit and the spool append leaves B's record in the
    outbox only; the tracker is then damaged beyond one entry. The next start knows no events
    (A and B are reported as new, with new uids), but B's committed record is delivered too,
    with its own uid: nothing committed is lost."""
    settings = env(sim, tmp_path)
    sim.set_events([event("A")])
    with ExporterProcess({**settings, "SEE_FAILPOINT": "after_commit:2"}) as crashed:
        crashed.wait_for_records(1, timeout=30)
        sim.set_events([event("A"), event("B")])
        crashed.proc.wait(timeout=30)
        assert crashed.proc.returncode == 137, crashed.stderr()
    data = state_of(tmp_path)
    [committed] = data["outbox"]
    assert committed["transition"]["event"]["event_id"] == "B"
    assert all(r["EventId"] == "A" for r in crashed.records())
    incarnation = data["tracker"]["incarnation"]
    data["tracker"]["incarnation"] = "one"
    (tmp_path / "state" / "state.json").write_text(json.dumps(data))
    # A later document: what this start derives afresh has new uids, so the committed record's
    # uid can come from the outbox only.
    sim.set_events([event("A"), event("B")], incarnation=incarnation + 5)
    with ExporterProcess(settings) as proc:
        proc.wait_for(lambda: committed["record_id"] in {r["RecordId"] for r in proc.records()},
                      30, "the outbox's record")
        proc.wait_for_records(3, timeout=30)
        assert proc.terminate() == 0, proc.stderr()
    uids = [r["RecordId"] for r in proc.records()]
    assert uids.count(committed["record_id"]) == 1, proc.records()
    assert sorted((r["EventId"], r["Transition"]) for r in proc.records()) == [
        ("A", "scheduled"), ("B", "scheduled"), ("B", "scheduled")]
    assert "its tracker cannot be read" in proc.stderr()
    assert "this start knows no events" in proc.stderr()
    [copy] = (tmp_path / "state").glob("state.json.corrupt-*")
    assert json.loads(copy.read_text())["tracker"]["incarnation"] == "one"
    assert isinstance(state_of(tmp_path)["tracker"]["incarnation"], int)
