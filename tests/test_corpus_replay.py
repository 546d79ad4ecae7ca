"""Real documents, captured on Azure VMs and published by others (tests/corpus/README.md), replayed
byte for byte by the simulator over HTTP to the installed exporter: the verdicts must hold on
them, not only on our own scenarios (docs/lifecycle.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduled_events_exporter.simulator.service import Simulator
from tests.exporter_process import ExporterProcess, clean_env, state_dir
from tests.peers.rotel import RotelReceiver

CORPUS = Path(__file__).parent / "corpus"
README_REBOOT = "4CAEA225-A741-474D-A72E-428C86FCD853"
pytestmark = pytest.mark.timeout(120)


def corpus(name: str) -> list[bytes]:
    """The documents of one capture, in the order they were seen."""
    return [p.read_bytes() for p in sorted((CORPUS / name).glob("*.json"))]


def serve(sim: Simulator, document: bytes) -> None:
    """Serve ``document`` and wait until the exporter fetched it (twice: once parsed)."""
    sim.clear_requests()
    sim.set_raw_document(document)
    assert sim.wait_for_requests(2, 20, method="GET", path_prefix="/metadata/scheduledevents"), \
        "the exporter did not fetch the document"


def env(sim: Simulator, tmp_path: Path, clock_start: str, **extra: str) -> dict[str, str]:
    boot = tmp_path / "boot_id"
    if not boot.exists():
        boot.write_text("boot-1\n")
    settings = {"SEE_BOOT_ID_FILE": str(boot), **extra}
    return clean_env(SEE_IMDS_ENDPOINT=sim.url, SEE_SINKS="console",
                     SEE_STATE_DIR=state_dir(tmp_path), SEE_HEALTH_ADDR="",
                     SEE_POLL_INTERVAL="0.2", SEE_CLOCK_START=clock_start, **settings)


def verdicts(records: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    return [(r["Transition"], r["OutcomeBasis"]) for r in records]


@pytest.fixture
def readme_sim() -> Iterator[Simulator]:
    # The capture's VM: its name is the one in the event's Resources.
    simulator = Simulator(vm_name="flatcar-vm1")
    simulator.start()
    yield simulator
    simulator.stop()


def test_missed_started_document_is_unknown_not_cancelled(readme_sim: Simulator,
                                                         tmp_path: Path) -> None:
    """The published log: incarnation 2 holds a User Reboot, the next document seen is 4, empty,
    long before NotBefore. Incarnation 3 was missed: nobody can tell a cancellation."""
    one, two, four = corpus("vm-scheduled-events-readme")
    readme_sim.set_raw_document(one)
    with ExporterProcess(env(readme_sim, tmp_path, "2021-07-22T04:35:12Z")) as proc:
        serve(readme_sim, one)
        serve(readme_sim, two)
        proc.wait_for_records(1, 20)
        serve(readme_sim, four)
        records = proc.wait_for_records(2, 20)
    assert verdicts(records) == [("scheduled", "continuous_watch"),
                                 ("outcome_unknown", "missed_documents")]
    assert records[1]["EventId"] == README_REBOOT and records[1]["EventStatus"] == "Unknown"


def test_our_accepted_approval_then_the_event_gone_is_completed(readme_sim: Simulator,
                                                                tmp_path: Path) -> None:
    """The same capture where the exporter itself approved the reboot (as the sample service in
    that log did): IMDS accepted it, so the event ran."""
    one, two, four = corpus("vm-scheduled-events-readme")
    readme_sim.set_raw_document(one)
    with ExporterProcess(env(readme_sim, tmp_path, "2021-07-22T04:35:12Z",
                             SEE_APPROVE="user")) as proc:
        serve(readme_sim, two)
        assert readme_sim.wait_for_requests(1, 20, method="POST"), "no approval was posted"
        proc.wait_for(lambda: any(r["Transition"] == "approved" for r in proc.records()), 20,
                      "the approved record")
        serve(readme_sim, four)
        records = proc.wait_for_records(3, 20)
    assert verdicts(records) == [("scheduled", "first_document"), ("approved", None),
                                 ("completed", "approval_accepted")]
    assert records[2]["ObservedStart"] is False


def test_an_approval_remembered_across_the_reboot_completes_the_event(
        readme_sim: Simulator, tmp_path: Path) -> None:
    """The published log exactly: the exporter approves the reboot at incarnation 2, dies with
    its VM, and comes back to incarnation 4, empty. With no boot id to compare (disabled here),
    the approval IMDS accepted, remembered in the state file, is the evidence that it ran."""
    _, two, four = corpus("vm-scheduled-events-readme")
    readme_sim.set_raw_document(two)
    with ExporterProcess(env(readme_sim, tmp_path, "2021-07-22T04:36:08Z", SEE_APPROVE="user",
                             SEE_BOOT_ID_FILE="")) as first:
        first.wait_for(lambda: any(r["Transition"] == "approved" for r in first.records()), 20,
                       "the approved record")
        first.terminate()
    assert verdicts(first.records()) == [("scheduled", "first_document"), ("approved", None)]
    readme_sim.set_raw_document(four)
    with ExporterProcess(env(readme_sim, tmp_path, "2021-07-22T04:37:09Z", SEE_APPROVE="user",
                             SEE_BOOT_ID_FILE="")) as second:
        records = second.wait_for_records(1, 20)
    assert verdicts(records) == [("completed", "approval_accepted")]
    assert records[0]["EventId"] == README_REBOOT and records[0]["ObservationGapSeconds"] > 0


def test_a_changed_boot_id_across_a_restart_completes_the_pending_reboot(
        readme_sim: Simulator, tmp_path: Path) -> None:
    """The exporter dies with its VM during the reboot and comes back to incarnation 4: the
    host's boot id changed while a Reboot of this VM was pending, so it ran."""
    _, two, four = corpus("vm-scheduled-events-readme")
    readme_sim.set_raw_document(two)
    with ExporterProcess(env(readme_sim, tmp_path, "2021-07-22T04:36:08Z")) as first:
        records = first.wait_for_records(1, 20)
        first.terminate()
    assert verdicts(records) == [("scheduled", "first_document")]
    (tmp_path / "boot_id").write_text("boot-2\n")
    readme_sim.set_raw_document(four)
    with ExporterProcess(env(readme_sim, tmp_path, "2021-07-22T04:37:09Z")) as second:
        records = second.wait_for_records(1, 20)
    assert verdicts(records) == [("completed", "host_rebooted")]
    assert records[0]["EventId"] == README_REBOOT and records[0]["ObservationGapSeconds"] > 0


def test_documented_live_migration_with_console_and_otlp(tmp_path: Path) -> None:
    """Microsoft's documented sequence seen by WestNO_0, to the console and a real collector."""
    docs = corpus("ms-docs-live-migration")
    with Simulator(vm_name="WestNO_0") as sim, RotelReceiver() as rotel:
        sim.set_raw_document(docs[0])
        extra = {"SEE_SINKS": "console,otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": rotel.http_endpoint,
                 "OTEL_SERVICE_NAME": f"replay-{tmp_path.name}"}
        with ExporterProcess(env(sim, tmp_path, "2022-04-11T22:20:00Z") | extra) as proc:
            for doc in docs:
                serve(sim, doc)
            records = proc.wait_for_records(3, 20)
            logs = rotel.wait_for_logs(
                lambda r: r.resource.get("service.name") == f"replay-{tmp_path.name}",
                count=3, timeout=30)
    assert verdicts(records) == [("scheduled", "continuous_watch"), ("started", None),
                                 ("completed", "observed_start")]
    assert [r["AffectsSelf"] for r in records] == [True, True, True]
    assert [lg.event_name for lg in logs] == ["azure.scheduled_event.scheduled",
                                             "azure.scheduled_event.started",
                                             "azure.scheduled_event.completed"]
    assert logs[2].attributes["azure.scheduled_event.outcome_basis"] == "observed_start"


def test_a_fresh_start_into_a_started_event_is_a_late_first_sight(tmp_path: Path) -> None:
    """A document an AKS node logged (a Freeze already Started): a first deployment into it is
    not an unannounced start, and its record says why."""
    (doc,) = corpus("aks-issue-3719")
    with Simulator(vm_name="regular-node-30975042-vmss_6") as sim:
        sim.set_raw_document(doc)
        with ExporterProcess(env(sim, tmp_path, "2023-06-02T19:18:25Z")) as proc:
            records = proc.wait_for_records(1, 20)
            proc.terminate()
    (record,) = records
    assert (record["Transition"], record["Unannounced"], record["OutcomeBasis"]) == (
        "started", False, "first_document")
    assert "ERROR" not in proc.stderr()


def test_a_repeated_event_id_does_not_blind_the_exporter_to_the_rest(tmp_path: Path) -> None:
    """A fixture shape (the same EventId twice) beside a real event: both events are reported,
    the anomaly is logged once however often the document is served."""
    two = json.loads(corpus("vm-scheduled-events-readme")[1])
    reboot = two["Events"][0]
    freeze = json.loads(corpus("ms-docs-live-migration")[1])["Events"][0]
    body = json.dumps({"DocumentIncarnation": 7, "Events": [reboot, reboot, freeze]}).encode()
    with Simulator(vm_name="flatcar-vm1") as sim:
        sim.set_raw_document(body)
        with ExporterProcess(env(sim, tmp_path, "2021-07-22T04:36:08Z")) as proc:
            records = proc.wait_for_records(2, 20)
            assert sim.wait_for_requests(10, 20, method="GET",
                                         path_prefix="/metadata/scheduledevents")
            proc.terminate()
    assert sorted(r["EventId"] for r in records) == sorted([reboot["EventId"], freeze["EventId"]])
    assert proc.stderr().count("duplicate_event_id") == 1, proc.stderr()


def test_a_reset_to_an_older_document_is_not_a_cancellation(tmp_path: Path) -> None:
    """Microsoft's sample documents (incarnations 190 and 192) seen by sample_4: two Reboots
    appear; when the older, empty document comes back the incarnation went backwards, and the
    events that left with it, long before NotBefore, have no verdict (not cancelled)."""
    empty, two_reboots = corpus("azure-samples-sample-documents")
    with Simulator(vm_name="sample_4") as sim:
        sim.set_raw_document(empty)
        with ExporterProcess(env(sim, tmp_path, "2018-01-24T21:00:00Z")) as proc:
            serve(sim, empty)
            serve(sim, two_reboots)
            proc.wait_for_records(2, 20)
            serve(sim, empty)
            records = proc.wait_for_records(5, 20)
    assert verdicts(records) == [("scheduled", "missed_documents"),
                                 ("scheduled", "missed_documents"),
                                 ("document_reset", None),
                                 ("outcome_unknown", "document_reset"),
                                 ("outcome_unknown", "document_reset")]
    assert [r["AffectsSelf"] for r in records[:2]] == [True, False]
    assert 0 < records[0]["NoticeSeconds"] <= 20 * 60 + 44
    assert records[2]["EventId"] in (None, "")


def test_an_event_gone_after_its_not_before_completed_unobserved(tmp_path: Path) -> None:
    """A third-party fixture (a Platform Reboot of two resources, DurationInSeconds -1) seen by
    the second of them; the exporter restarts after NotBefore into an empty document: the
    event ran at its NotBefore even though no document showed it Started."""
    (reboot,) = corpus("aks-node-termination-handler-fixture")
    empty = corpus("ms-docs-live-migration")[0]
    vm = "aks-spotcpu2d2as-24469130-vmss_1"
    with Simulator(vm_name=vm) as sim:
        sim.set_raw_document(reboot)
        with ExporterProcess(env(sim, tmp_path, "2016-09-19T18:10:00Z")) as first:
            records = first.wait_for_records(1, 20)
            first.terminate()
        assert verdicts(records) == [("scheduled", "first_document")]
        assert records[0]["AffectsSelf"] is True and records[0]["DurationInSeconds"] == -1
        assert records[0]["Resources"] == ["FrontEnd_IN_0", vm]
        sim.set_raw_document(empty)
        with ExporterProcess(env(sim, tmp_path, "2016-09-19T18:40:00Z")) as second:
            records = second.wait_for_records(1, 20)
    assert verdicts(records) == [("completed", "not_before_passed")]
    assert records[0]["ObservedStart"] is False and records[0]["ObservationGapSeconds"] > 0


def test_every_corpus_document_is_accepted_by_the_parser() -> None:
    from scheduled_events_exporter.parser import parse_document

    files = sorted(CORPUS.glob("*/*.json"))
    assert len(files) >= 11
    for path in files:
        parse_document(path.read_bytes())
