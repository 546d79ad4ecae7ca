"""Scenario files (config/scenarios) and their playback by the simulator
(docs/semantics.md#simulator)."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
from email.utils import parsedate_to_datetime
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from scheduled_events_exporter.simulator import PlayedStep, Simulator
from scheduled_events_exporter.simulator.cli import main
from scheduled_events_exporter.simulator.scenarios import (
    Scenario,
    ScenarioError,
    list_scenarios,
    load_scenario,
    parse_scenario,
    scenario_dir,
)

SE = "/metadata/scheduledevents?api-version=2020-07-01"
META = {"Metadata": "true"}
REQUIRED = {"live-migration", "user-reboot", "platform-redeploy", "spot-preempt",
            "vmss-terminate", "hardware-failure", "cancelled-maintenance", "reschedule",
            "availability-set-two-vm", "incarnation-reset", "demo"}
GUID = re.compile(r"^[0-9A-F]{8}-[0-9A-F]{4}-[0-9A-F]{4}-[0-9A-F]{4}-[0-9A-F]{12}$")
RFC1123 = re.compile(r"^(Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d\d (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|"
                     r"Sep|Oct|Nov|Dec) \d{4} \d\d:\d\d:\d\d GMT$")
REAL_SECONDS = 0.25  # each full scenario is squeezed into this much real time


def fetch(sim: Simulator) -> dict[str, object]:
    url = urlsplit(sim.url)
    conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=5)
    try:
        conn.request("GET", SE, headers={"Metadata": "true"})
        resp = conn.getresponse()
        assert resp.status == 200
        data = json.loads(resp.read())
        assert isinstance(data, dict)
        return data
    finally:
        conn.close()


def play_fully(sim: Simulator, scenario: Scenario, speed: float | None = None
               ) -> list[PlayedStep]:
    played: list[PlayedStep] = []
    speed = speed or max(scenario.steps[-1].at / REAL_SECONDS, 1.0)
    done = sim.play(scenario, speed=speed, on_step=played.append)
    assert done.wait(5 + scenario.real_duration(speed)), f"{scenario.name} did not finish"
    return played


def test_required_scenarios_are_bundled() -> None:
    assert set(list_scenarios()) >= REQUIRED


@pytest.mark.parametrize("name", list_scenarios())
def test_scenario_plays_to_completion(name: str) -> None:
    scenario = load_scenario(name)
    assert scenario.name == name and scenario.description
    assert scenario.real_duration() <= 40, "too slow for a demo or an integration test"
    with Simulator.for_scenario(scenario) as sim:
        played = play_fully(sim, scenario)
        assert [p.index for p in played] == list(range(len(scenario.steps)))
        previous = 1
        for p in played:
            if p.step.incarnation is None:  # only explicit incarnations may go backwards
                assert p.incarnation >= previous, (name, p.index)
            previous = p.incarnation
            for e in p.events:
                assert GUID.match(str(e["EventId"])), e
                assert e["NotBefore"] == "" or RFC1123.match(str(e["NotBefore"])), e
                if e["EventStatus"] == "Started":
                    assert e["NotBefore"] == ""
        doc = fetch(sim)
        assert doc["DocumentIncarnation"] == played[-1].incarnation == sim.incarnation
        assert doc["Events"] == list(played[-1].events)


def test_default_speeds_give_short_real_durations() -> None:
    durations = {name: load_scenario(name).real_duration() for name in list_scenarios()}
    assert all(5 <= d <= 40 for d in durations.values()), durations
    assert 30 <= durations["demo"] <= 42


def test_live_migration_follows_the_documented_sequence() -> None:
    scenario = load_scenario("live-migration")
    assert scenario.vm_name == "WestNO_0"
    with Simulator.for_scenario(scenario) as sim:
        played = play_fully(sim, scenario)
    assert [p.incarnation for p in played] == [1, 2, 3, 4]
    assert [len(p.events) for p in played] == [0, 1, 1, 0]
    scheduled, started = played[1].events[0], played[2].events[0]
    assert scheduled["EventId"] == started["EventId"] == "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
    assert (scheduled["EventStatus"], started["EventStatus"]) == ("Scheduled", "Started")
    assert started["NotBefore"] == ""
    for e in (scheduled, started):
        assert (e["EventType"], e["Resources"], e["DurationInSeconds"]) == (
            "Freeze", ["WestNO_0", "WestNO_1"], 5)


def test_not_before_in_is_rendered_as_rfc1123() -> None:
    scenario = load_scenario("live-migration")
    # Chosen so the Freeze lands on the documentation's NotBefore.
    start = 1649716018 - (10 + 900) / 30
    with Simulator.for_scenario(scenario, clock=lambda: start) as sim:
        play_fully(sim, scenario, speed=30 * 1000)
        step = scenario.steps[1]
        [event] = scenario.render(step, start=start, speed=30)
        assert event["NotBefore"] == "Mon, 11 Apr 2022 22:26:58 GMT"
        # Through HTTP: the same rule at the played speed (1000x faster).
        sim.set_events(scenario.render(step, start=start, speed=30 * 1000))
        served = fetch(sim)["Events"]
        assert isinstance(served, list)
        not_before = served[0]["NotBefore"]
        assert RFC1123.match(not_before)
        assert parsedate_to_datetime(not_before).timestamp() == round(start + 910 / 30000)


def test_restated_not_before_stays_identical_to_the_second() -> None:
    demo = load_scenario("demo")
    seen: dict[str, set[object]] = {}
    for step in demo.steps:
        for e in demo.render(step, start=1_700_000_000.4, speed=demo.speed):
            if e["EventStatus"] == "Scheduled":
                seen.setdefault(str(e["EventId"]), set()).add(e["NotBefore"])
    assert seen and all(len(values) == 1 for values in seen.values()), seen


def test_render_renames_the_own_vm_and_swaps_ids() -> None:
    scenario = load_scenario("live-migration")
    [event] = scenario.render(scenario.steps[1], start=0, speed=1, vm_name="other-vm",
                              id_map={"C7061BAC-AFDC-4513-B24B-AA5F13A16123": "NEW"})
    assert event["Resources"] == ["other-vm", "WestNO_1"]
    assert event["EventId"] == "NEW"
    with Simulator(vm_name="vm-x") as sim:
        played = play_fully(sim, scenario)
    assert played[1].events[0]["Resources"] == ["vm-x", "WestNO_1"]


def test_scenario_shapes() -> None:
    hardware = load_scenario("hardware-failure")
    first_seen = hardware.steps[1].events[0]
    assert (first_seen["EventType"], first_seen["EventStatus"]) == ("Reboot", "Started")
    reboot = load_scenario("user-reboot").steps[1].events[0]
    assert reboot["EventSource"] == "User"
    preempt = load_scenario("spot-preempt").steps[1].events[0]
    assert (preempt["EventType"], preempt["NotBefore"]) == ("Preempt", {"in": 30})
    vmss = load_scenario("vmss-terminate")
    assert vmss.instance["vmScaleSetName"] == "vmss-web"
    assert vmss.steps[1].events[0]["ResourceType"] == "VirtualMachine"
    reset = load_scenario("incarnation-reset")
    assert [s.incarnation for s in reset.steps].count(1) == 1
    two = load_scenario("availability-set-two-vm")
    resources = {json.dumps(e["Resources"]) for s in two.steps for e in s.events}
    assert resources == {'["web-1"]', '["web-0", "web-1"]'} and two.vm_name == "web-0"


def write(tmp_path: Path, data: object, name: str = "bad") -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return str(path)


EV = {"EventId": "A", "EventStatus": "Scheduled"}


@pytest.mark.parametrize("data,message", [
    ({"steps": [{"at": "abc", "events": []}]},
     "scenario bad step 1: expected 'at' to be a number, got 'abc'"),
    ({"steps": [{"at": True, "events": []}]},
     "scenario bad step 1: expected 'at' to be a number, got True"),
    ({"steps": [{"events": []}]}, "scenario bad step 1: expected 'at' to be a number, got nothing"),
    ({}, "scenario bad: expected 'steps' to be a list, got nothing"),
    ({"steps": []}, "scenario bad: expected 'steps' to hold at least one step, got []"),
    ({"steps": [], "colour": 1}, "scenario bad: expected keys among"),
    ({"name": "x", "steps": [{"at": 0, "event": []}]}, "scenario x step 1: expected keys among"),
    ({"steps": [{"at": 5, "events": []}, {"at": 4, "events": []}]},
     "scenario bad step 2: expected 'at' >= 5 (the previous step's), got 4"),
    ({"steps": [{"at": 0, "events": [{"EventStatus": "Scheduled"}]}]},
     "scenario bad step 1 event 1: expected an 'EventId' field"),
    ({"steps": [{"at": 0, "events": [{**EV, "Resources": "vm"}]}]},
     "scenario bad step 1 event 1: expected 'Resources' to be a list of strings, got 'vm'"),
    ({"steps": [{"at": 0, "events": [{**EV, "NotBefore": {"in": "soon"}}]}]},
     "scenario bad step 1 event 1: expected 'NotBefore' {\"in\": seconds >= 0}"),
    ({"steps": [{"at": 0, "events": [{**EV, "NotBefore": 5}]}]},
     "scenario bad step 1 event 1: expected 'NotBefore' to be a string or"),
    ({"steps": [{"at": 0, "events": [{**EV, "DurationInSeconds": "5"}]}]},
     "scenario bad step 1 event 1: expected 'DurationInSeconds' to be an integer, got '5'"),
    ({"steps": [{"at": 0, "events": [EV, EV]}]}, "scenario bad step 1: expected distinct EventIds"),
    ({"steps": [{"at": 0, "events": [], "fault": {"kind": "boom"}}]},
     "scenario bad step 1: fault: expected kind to be one of"),
    ({"steps": [{"at": 0, "events": [], "incarnation": "2"}]},
     "scenario bad step 1: expected 'incarnation' to be an integer, got '2'"),
    ({"speed": 0, "steps": [{"at": 0, "events": []}]}, "scenario bad: expected 'speed' > 0, got 0"),
    ({"instance": {"zone": 1}, "steps": [{"at": 0, "events": []}]},
     "scenario bad: expected 'instance' to map strings to strings"),
    ([], "scenario bad: expected a JSON object at the top, got []"),
    ("{nope", "scenario bad: invalid JSON at line 1 column 2"),
])
def test_invalid_scenarios_say_what_was_expected(tmp_path: Path, data: object,
                                                 message: str) -> None:
    with pytest.raises(ScenarioError) as caught:
        load_scenario(write(tmp_path, data))
    assert str(caught.value).startswith(message), str(caught.value)


def test_unknown_names_list_the_bundled_ones(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"expected one of .*live-migration"):
        load_scenario("nope")
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(str(tmp_path / "missing.json"))


def test_bundled_files_are_package_data() -> None:
    names = {entry.name for entry in scenario_dir().iterdir()}
    assert {f"{n}.json" for n in REQUIRED} <= names
    for name in list_scenarios():
        assert Path(load_scenario(name).source).is_file()


def test_fault_steps_are_pushed(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, {"steps": [
        {"at": 0, "events": [], "fault": {"kind": "status", "status": 410, "count": 1}}]}))
    with Simulator() as sim:
        play_fully(sim, scenario, speed=1)
        url = urlsplit(sim.url)
        conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=5)
        conn.request("GET", SE, headers={"Metadata": "true"})
        response = conn.getresponse()
        response.read()
        assert response.status == 410
        conn.close()
        assert fetch(sim)["DocumentIncarnation"] == 1


def test_approval_during_playback_sticks(tmp_path: Path) -> None:
    event = {"EventId": "A1", "EventStatus": "Scheduled", "EventType": "Reboot",
             "Resources": ["vm-sim-0"], "NotBefore": {"in": 900}}
    scenario = parse_scenario({"steps": [
        {"at": 0, "events": [event]},
        {"at": 10, "events": [{**event, "NotBefore": {"in": 890}, "Description": "later"}]},
    ]}, label="sticky")
    applied = [threading.Event(), threading.Event()]
    with Simulator() as sim:
        done = sim.play(scenario, speed=40, on_step=lambda p: applied[p.index].set())
        assert applied[0].wait(5)
        url = urlsplit(sim.url)
        conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=5)
        conn.request("POST", SE, body=b'{"StartRequests": [{"EventId": "A1"}]}',
                     headers={"Metadata": "true"})
        assert conn.getresponse().status == 200
        conn.close()
        assert done.wait(5)
        [after] = sim.events
        assert (after["EventStatus"], after["NotBefore"], after["Description"]) == (
            "Started", "", "later")


def test_loop_replays_with_fresh_event_ids() -> None:
    scenario = load_scenario("cancelled-maintenance")
    ids_by_round: list[set[str]] = []
    second_round_scheduled = threading.Event()

    def on_step(p: PlayedStep) -> None:
        if p.index == 0:
            ids_by_round.append(set())
        ids_by_round[-1].update(str(e["EventId"]) for e in p.events)
        if len(ids_by_round) == 2 and p.events:
            second_round_scheduled.set()

    with Simulator() as sim:
        done = sim.play(scenario, speed=scenario.steps[-1].at / 0.05, loop=True, on_step=on_step)
        assert second_round_scheduled.wait(5)
        assert not done.is_set()
        sim.stop_playing()
        assert done.wait(5)
    first, second = ids_by_round[:2]
    assert first == {"0D47DD87-BB71-4F2F-89DD-FB5CAD852199"}
    assert len(second) == 1 and second.isdisjoint(first)
    assert all(GUID.match(i) for i in second)


def test_a_new_play_cancels_the_running_one() -> None:
    scenario = load_scenario("user-reboot")
    with Simulator() as sim:
        slow = sim.play(scenario, speed=1)
        fast = sim.play(scenario, speed=scenario.steps[-1].at / 0.1)
        assert slow.wait(5) and fast.wait(5)
        assert sim.events == []
        with pytest.raises(ValueError, match="speed"):
            sim.play(scenario, speed=0)


def test_cli_lists_scenarios_and_rejects_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    assert "live-migration" in out and "demo" in out
    assert main(["--scenario", "no-such-thing"]) == 2
    assert "unknown scenario 'no-such-thing'" in capsys.readouterr().err
    assert main(["--speed", "0"]) == 2
    assert main(["--bogus"]) == 2


@pytest.mark.skipif(sys.platform == "win32", reason="Windows has no SIGTERM to send another "
                    "process (Popen.send_signal(SIGTERM) is TerminateProcess)")
def test_cli_serves_until_sigterm() -> None:
    code = ("import sys; from scheduled_events_exporter.simulator.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "--port", "0", "--scenario", "live-migration",
         "--speed", "100000"],
        stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stderr is not None
        banner = proc.stderr.readline()
        url = banner.split(" at ")[1].split(" ")[0]
        lines = [proc.stderr.readline() for _ in range(5)]
        assert "finished" in lines[-1], lines
        parts = urlsplit(url)
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=5)
        conn.request("GET", SE, headers=META)
        assert json.loads(conn.getresponse().read())["DocumentIncarnation"] == 4
        conn.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
