"""Files written by other releases are read losslessly (docs/semantics.md, "Compatibility").

Each ``tests/compat/<version>/state`` is a state directory written by that released version
(tests/compat/released.py, running the release itself): two pending events, an OTLP and an Event
Hubs spool with three undelivered transitions each, console's acknowledged spool and a dead
letter. The current exporter starts on a copy with a real collector up and must: keep the state
(nothing set aside), report neither pending event again, and deliver exactly the spooled
transitions, once each, with their original ``log.record.uid``. ``next_release`` writes the same
directory as the next release adding a field would (one more field in every object, and a
transition kind this release does not know), which is what a rollback meets.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduled_events_exporter.delivery.spool import Spool
from scheduled_events_exporter.simulator import Simulator
from tests.compat.released import FREEZE, HERE, REDEPLOY, RELEASES, release_env, write_state_dir
from tests.exporter_process import ExporterProcess
from tests.peers.rotel import RotelReceiver

VERSIONS = sorted(RELEASES)


def spooled(state: Path, sink: str) -> list[dict[str, Any]]:
    """The spool's lines above its ack cursor, as written."""
    ack_file = state / "spool" / f"{sink}.ack"
    ack = int(ack_file.read_text() or 0) if ack_file.exists() else 0
    lines = (state / "spool" / f"{sink}.log").read_text().splitlines()
    return [item for item in map(json.loads, lines) if item["seq"] > ack]


def uids(items: list[dict[str, Any]]) -> list[str]:
    return [item["record"]["record_id"] for item in items]


@pytest.fixture
def collector() -> Iterator[RotelReceiver]:
    with RotelReceiver() as receiver:
        yield receiver


def start_current(sim: Simulator, state: Path, collector: RotelReceiver) -> ExporterProcess:
    return ExporterProcess(release_env(sim, state, collector.http_endpoint, "console,otlp"))


def resume(state: Path, collector: RotelReceiver, expected: list[str]) -> ExporterProcess:
    """Run the current exporter on ``state`` with the release's pending events still in IMDS;
    wait until ``expected`` reached the collector and a few more polls went by."""
    incarnation = json.loads((state / "state.json").read_text())["tracker"]["incarnation"]
    with Simulator(vm_name="vm-test") as sim:
        sim.set_events([FREEZE, REDEPLOY], incarnation=incarnation)
        with start_current(sim, state, collector) as proc:
            collector.wait_for_logs(count=len(expected), timeout=30)
            polls = len(sim.requests)
            assert sim.wait_for_requests(polls + 5, timeout=20)
            assert proc.terminate() == 0, proc.stderr()
    return proc


def assert_delivered_once(collector: RotelReceiver, expected: list[str]) -> None:
    got = [log.attributes.get("log.record.uid") for log in collector.logs]
    assert sorted(got) == sorted(expected), got


def assert_kept(state: Path, proc: ExporterProcess) -> None:
    assert not list(state.glob("state.json.corrupt-*")), proc.stderr()
    assert "starting fresh" not in proc.stderr()
    # The pending events were remembered: nothing reported as new.
    assert proc.records() == [], proc.records()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("version", VERSIONS)
def test_a_released_state_directory_is_read_losslessly(
        version: str, tmp_path: Path, collector: RotelReceiver) -> None:
    state = tmp_path / "state"
    shutil.copytree(HERE / version / "state", state)
    expected = uids(spooled(state, "otlp"))
    hub = uids(spooled(state, "eventhubs"))
    assert len(expected) == 3 and hub == expected
    proc = resume(state, collector, expected)
    assert_kept(state, proc)
    assert_delivered_once(collector, expected)
    # The hub's spool (its sink is off here) reads back whole, in order.
    assert [r.record_id for r in Spool(state / "spool", "eventhubs").load()] == hub
    assert "ignoring fields" not in proc.stderr()


def next_release(state: Path) -> str:
    """Rewrite ``state`` as the next release adding a field would have written it; returns the
    record id of one spooled transition of a kind this release does not know."""
    def grow(value: Any) -> Any:
        if isinstance(value, dict):
            return {**{k: grow(v) for k, v in value.items()}, "added_in_next": {"n": 1}}
        if isinstance(value, list):
            return [grow(v) for v in value]
        return value

    data = json.loads((state / "state.json").read_text())
    data["tracker"] = grow(data["tracker"])
    data["outbox"] = grow(data["outbox"])
    data["added_in_next"] = [1, 2]
    (state / "state.json").write_text(json.dumps(data))
    for sink in ("otlp", "eventhubs"):
        log = state / "spool" / f"{sink}.log"
        lines = [json.loads(line) for line in log.read_text().splitlines()]
        lines = [{**line, "record": grow(line["record"]), "added_in_next": True} for line in lines]
        future = json.loads(json.dumps(lines[-1]))
        future["seq"] = lines[-1]["seq"] + 1
        future["record"]["seq"] = future["seq"]
        future["record"]["record_id"] = "future-kind-0000"
        future["record"]["transition"]["kind"] = "superseded"
        lines.append(future)
        log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return "future-kind-0000"


@pytest.mark.timeout(90)
def test_a_rollback_from_the_next_release_loses_nothing(
        tmp_path: Path, collector: RotelReceiver) -> None:
    state = tmp_path / "state"
    shutil.copytree(HERE / VERSIONS[-1] / "state", state)
    expected = uids(spooled(state, "otlp"))
    future = next_release(state)
    proc = resume(state, collector, expected)
    assert_kept(state, proc)
    assert_delivered_once(collector, expected)
    assert "ignoring fields this release does not know" in proc.stderr()
    # The transition of a kind this release cannot read is kept for a person, not dropped.
    letters = [json.loads(line) for line in
               (state / "dead-letter.jsonl").read_text().splitlines()]
    unreadable = [letter for letter in letters if letter["status"] == "unreadable"]
    assert [letter["record_id"] for letter in unreadable] == [future], letters
    assert "superseded" in unreadable[0]["reason"] and unreadable[0]["sink"] == "otlp"
    assert unreadable[0]["payload"]["record"]["transition"]["kind"] == "superseded"
    # ... and once: the line left the spool when it was moved.
    assert future not in (state / "spool" / "otlp.log").read_text()
    # The hub's spool (not delivered here) still holds it, for its own sink to move.
    assert future in (state / "spool" / "eventhubs.log").read_text()


@pytest.mark.timeout(150)
@pytest.mark.parametrize("version", VERSIONS)
def test_an_upgrade_from_a_release_delivers_its_spool_once(
        version: str, tmp_path: Path, collector: RotelReceiver) -> None:
    """The upgrade as users take it: the release itself runs with the collector unreachable,
    stops with transitions in its spool, and the current exporter delivers exactly those."""
    state = tmp_path / "state"
    write_state_dir(version, state, tmp_path, sinks="console,otlp")
    expected = uids(spooled(state, "otlp"))
    assert len(expected) == 3
    proc = resume(state, collector, expected)
    assert_kept(state, proc)
    assert_delivered_once(collector, expected)

