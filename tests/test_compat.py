"""Files written by other releases are read losslessly (docs/semantics.md, "Compatibility").

Each ``tests/compat/<version>/state`` is a state directory written by that released version
(tests/compat/released.py, running the release itself): two pending events, an OTLP and an Event
Hubs spool with three undelivered transitions each, console's acknowledged spool and a dead
letter. The current exporter starts on a copy with a real collector up and must: keep the state
(nothing set aside), report neither pending event again, and deliver exactly the spooled
transitions, once each, with their original ``log.record.uid``. ``next_release`` writes the same
directory as the next release adding a field would (one more field in every object, and a
transition kind this release does not know), which is what a rollback meets; ``damage_entry``
leaves one tracker entry of a fixture unreadable, which must cost only that entry's event.
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


def assert_kept(state: Path, proc: ExporterProcess, console: list[str] | None = None) -> None:
    assert not list(state.glob("state.json.corrupt-*")), proc.stderr()
    assert "this start knows no events" not in proc.stderr()  # said when the state is not used
    # The pending events were remembered: nothing reported as new (console prints only what
    # its spool or the outbox still held).
    assert [r["RecordId"] for r in proc.records()] == (console or []), proc.records()


def letters(state: Path) -> list[dict[str, Any]]:
    path = state / "dead-letter.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


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
    assert "fields this release does not know" not in proc.stderr()


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
    assert "keeping fields this release does not know" in proc.stderr()
    # The transition of a kind this release cannot read is kept for a person, not dropped.
    unreadable = [letter for letter in letters(state) if letter["status"] == "unreadable"]
    assert [letter["record_id"] for letter in unreadable] == [future], letters(state)
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


def outbox_of_the_next_release(state: Path) -> tuple[str, str]:
    """Put in the state file's outbox what the next release commits just before a crash:
    a record of a transition kind this release does not know, then a known one, neither in
    any spool yet. Returns (the unknown one's record id, the known one's)."""
    data = json.loads((state / "state.json").read_text())
    template = spooled(state, "otlp")[0]["record"]  # a known kind (the last is "superseded")
    last = max(data["seq"], max(item["seq"] for item in spooled(state, "otlp")))
    future = json.loads(json.dumps(template))
    future.update(seq=last + 1, record_id="future-outbox-0001")
    future["transition"]["kind"] = "superseded"
    known = json.loads(json.dumps(template))
    known.update(seq=last + 2, record_id="known-outbox-0002")
    data["outbox"] = [future, known]
    data["seq"] = last + 2
    (state / "state.json").write_text(json.dumps(data))
    return "future-outbox-0001", "known-outbox-0002"


@pytest.mark.timeout(90)
def test_a_rollback_with_an_unknown_record_in_the_outbox_keeps_the_state(
        tmp_path: Path, collector: RotelReceiver) -> None:
    """The outbox is as tolerant as the spool: one record of a kind this release does not know
    does not set the state aside; it goes to each sink's dead-letter file once, and the known
    record behind it is delivered once with its own uid."""
    state = tmp_path / "state"
    shutil.copytree(HERE / VERSIONS[-1] / "state", state)
    spooled_before = uids(spooled(state, "otlp"))
    next_release(state)
    future, known = outbox_of_the_next_release(state)
    expected = [*spooled_before, known]
    proc = resume(state, collector, expected)
    assert_kept(state, proc, console=[known])
    assert_delivered_once(collector, expected)
    outbox_letters = [letter for letter in letters(state) if letter["record_id"] == future]
    assert sorted(letter["sink"] for letter in outbox_letters) == ["console", "otlp"]
    assert all(letter["status"] == "unreadable" and "outbox" in letter["reason"]
               and letter["payload"]["record"]["transition"]["kind"] == "superseded"
               for letter in outbox_letters), outbox_letters


@pytest.mark.timeout(120)
def test_fields_of_the_next_release_survive_this_release_writing_the_state_back(
        tmp_path: Path, collector: RotelReceiver) -> None:
    """Upgrade → rollback → upgrade: the next release wrote fields this one does not know; this
    release keeps and saves the state (its pending events moved on meanwhile), and the file the
    next release finds again still holds its fields at every level it wrote them."""
    state = tmp_path / "state"
    shutil.copytree(HERE / VERSIONS[-1] / "state", state)
    expected = uids(spooled(state, "otlp"))
    next_release(state)
    before = json.loads((state / "state.json").read_text())
    proc = resume(state, collector, expected)
    assert_kept(state, proc)
    after = json.loads((state / "state.json").read_text())
    assert after["saved_at"] != before["saved_at"], "this release never saved the state"
    assert after["added_in_next"] == [1, 2]
    assert after["tracker"]["added_in_next"] == {"n": 1}
    events = dict(after["tracker"]["events"])
    assert events and all(entry["added_in_next"] == {"n": 1} for entry in events.values())
    assert all(entry["event"]["added_in_next"] == {"n": 1} for entry in events.values())
    # Nothing this release knows was overwritten by a value it did not write.
    assert after["tracker"]["incarnation"] == before["tracker"]["incarnation"]
    assert "keeping fields this release does not know" in proc.stderr()


def damage_entry(state: Path, event_id: str) -> list[Any]:
    """Write ``event_id``'s tracker entry with its duration as a string (as a disk error or a
    mistaken build can leave it); returns that entry as written."""
    data = json.loads((state / "state.json").read_text())
    [pair] = [pair for pair in data["tracker"]["events"] if pair[0] == event_id]
    pair[1]["event"]["duration"] = str(pair[1]["event"]["duration"])
    (state / "state.json").write_text(json.dumps(data))
    return list(pair)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("version", VERSIONS)
def test_a_released_state_with_one_damaged_entry_keeps_the_rest(
        version: str, tmp_path: Path, collector: RotelReceiver) -> None:
    """One tracker entry of a released state directory cannot be read: the state is kept, the
    other pending event is not reported again, the spooled transitions are delivered once each;
    only the damaged event is new to this start, reported once."""
    state = tmp_path / "state"
    shutil.copytree(HERE / version / "state", state)
    expected = uids(spooled(state, "otlp"))
    damage_entry(state, FREEZE["EventId"])
    proc = resume(state, collector, [*expected, "the freeze, new to this start"])
    [again] = proc.records()
    assert (again["EventId"], again["Transition"]) == (FREEZE["EventId"], "started")
    assert_kept(state, proc, console=[again["RecordId"]])
    assert_delivered_once(collector, [*expected, again["RecordId"]])
    said = [line for line in proc.stderr().splitlines() if "cannot be read" in line]
    assert len(said) == 1 and FREEZE["EventId"] in said[0], said
    # IMDS still lists the freeze: the entry read from the document replaced the damaged one.
    events = json.loads((state / "state.json").read_text())["tracker"]["events"]
    assert sorted(pair[0] for pair in events) == sorted([FREEZE["EventId"],
                                                         REDEPLOY["EventId"]])
    assert all(isinstance(pair[1]["event"]["duration"], int) for pair in events)
