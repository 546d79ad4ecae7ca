"""Real documents, captured on Azure VMs and published by others (tests/corpus/README.md): the
verdicts of docs/lifecycle.md must hold on them, not only on our own scenarios.

The verdicts are a pure function of the documents, the time and the evidence, so they are a
table (``VERDICTS``, one row per corpus sequence and transition) checked through the same pure
steps the poll loop takes: ``parser.parse_document`` on the captured bytes, ``tracker.track``
with the evidence the exporter would hold (accepted approvals, the host's boot id, the VM's
name), ``records.make_record``/``to_columns`` for the columns a sink ships. A restart is what
the exporter does at start: the tracker state read back from its JSON form (``codec``), marked
interrupted, the boot id carried on with ``boot.continuing``.

One sequence (Microsoft's documented live migration) is also replayed end to end, byte for
byte: the simulator serves the files to the installed exporter with its wall clock set to the
capture's time (``SEE_CLOCK_START``), to the console and a real OTLP collector.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from scheduled_events_exporter.approval_rules import decide
from scheduled_events_exporter.boot import continuing
from scheduled_events_exporter.codec import decode_state, encode_state
from scheduled_events_exporter.config import load_config
from scheduled_events_exporter.imds import PollResult
from scheduled_events_exporter.model import Document, InstanceInfo, Outcome
from scheduled_events_exporter.parser import parse_document
from scheduled_events_exporter.poller import Poller
from scheduled_events_exporter.records import make_record, to_columns
from scheduled_events_exporter.simulator.service import Simulator
from scheduled_events_exporter.telemetry import Telemetry, severity
from scheduled_events_exporter.tracker import Evidence, TrackerState, track
from tests.exporter_process import ExporterProcess, clean_env, state_dir
from tests.peers.rotel import RotelReceiver

CORPUS = Path(__file__).parent / "corpus"
README_REBOOT = "4CAEA225-A741-474D-A72E-428C86FCD853"
#: The poll interval of the process replay; the table uses the same, so the gap threshold
#: (3 intervals, docs/lifecycle.md) is the one the process runs with.
POLL_INTERVAL = "0.2"
CONFIG = load_config({"SEE_POLL_INTERVAL": POLL_INTERVAL, "SEE_STATE_DIR": ""}, create=False)
#: SEE_APPROVE=user, read by the exporter's own configuration reader.
APPROVE_USER = load_config({"SEE_APPROVE": "user", "SEE_STATE_DIR": ""}, create=False).approval
assert APPROVE_USER is not None


def corpus(name: str) -> list[bytes]:
    """The documents of one capture, in the order they were seen."""
    return [p.read_bytes() for p in sorted((CORPUS / name).glob("*.json"))]


# --- the pure replay: what the exporter derives, poll by poll, from the captured bytes ---


@dataclass(frozen=True)
class Doc:
    """IMDS serves ``body``; the exporter sees it at its next poll (one interval later)."""

    body: bytes


@dataclass(frozen=True)
class Approve:
    """The approval worker looks at the last document (``approval_rules.decide`` with
    ``SEE_APPROVE=user``); IMDS accepts every approval it posts (as the simulator does)."""


@dataclass(frozen=True)
class Restart:
    """The exporter stops (its state saved) and starts again with its wall clock at ``at``
    (``SEE_CLOCK_START``), reading the host's boot id ``boot_id`` (``None``: disabled)."""

    at: str
    boot_id: str | None


Step = Doc | Approve | Restart


@dataclass(frozen=True)
class Sequence:
    vm_name: str
    #: SEE_CLOCK_START of the first exporter: the capture's time.
    clock_start: str
    #: The host's boot id at the first start (``None``: SEE_BOOT_ID_FILE empty).
    boot_id: str | None
    steps: tuple[Step, ...]


def instant(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


def replay(seq: Sequence) -> list[dict[str, Any]]:
    """Every record the exporter would ship, as the console prints its columns (plus the log
    severity); an approval step yields the approver's decision on each matching event."""
    interval = timedelta(seconds=CONFIG.poll_interval)
    instance = InstanceInfo(vm_name=seq.vm_name)
    state, boot_id, approved = TrackerState(), seq.boot_id, frozenset[str]()
    now = instant(seq.clock_start)
    last: Document | None = None
    out: list[dict[str, Any]] = []
    for step in seq.steps:
        if isinstance(step, Doc):
            last = parse_document(step.body)
            evidence = Evidence(approved=approved, boot_id=boot_id, vm_name=seq.vm_name)
            state, transitions = track(state, last, now, gap_threshold=CONFIG.gap_threshold,
                                       evidence=evidence)
            for t in transitions:
                record = make_record(t, instance)
                out.append({**to_columns(record), "Severity": severity(record)[1]})
            now += interval
        elif isinstance(step, Approve):
            assert last is not None and APPROVE_USER is not None
            for event in last.events:
                decision = decide(event, vm_name=seq.vm_name, config=APPROVE_USER,
                                  already_approved=approved)
                if decision is None:
                    continue
                # The approver reports a decision as an ``approved`` or ``approval_skipped``
                # record with no OutcomeBasis; its POST and record are process-tested in
                # test_approval_process.py. Here the verdict is the decision itself.
                out.append({"Transition": "approved" if decision.action == "approve"
                            else "approval_skipped", "OutcomeBasis": None,
                            "EventId": decision.event_id, "Decision": decision.reason})
                if decision.action == "approve":
                    approved |= {decision.event_id}
        else:
            # What Exporter does at start: the saved tracker state, marked interrupted.
            saved = json.loads(json.dumps(encode_state(state)))
            state = replace(decode_state(saved), interrupted=True)
            boot_id = continuing(state.boot_id, step.boot_id)
            now = instant(step.at)
    return out


one, two, four = corpus("vm-scheduled-events-readme")
migration = corpus("ms-docs-live-migration")
(aks_started,) = corpus("aks-issue-3719")
sample_empty, sample_reboots = corpus("azure-samples-sample-documents")
(fixture_reboot,) = corpus("aks-node-termination-handler-fixture")
_reboot = json.loads(two)["Events"][0]
_freeze = json.loads(migration[1])["Events"][0]
#: A fixture shape (no published capture from Azure shows it): the README's Reboot listed
#: twice beside the documentation's Freeze (tests/corpus/README.md).
REPEATED_ID = json.dumps({"DocumentIncarnation": 7,
                          "Events": [_reboot, _reboot, _freeze]}).encode()

SEQUENCES: dict[str, Sequence] = {
    # The published log: incarnation 2 holds a User Reboot, the next document seen is 4,
    # empty, long before NotBefore. Incarnation 3 was missed: nobody can tell a cancellation.
    "readme-watching": Sequence("flatcar-vm1", "2021-07-22T04:35:12Z", "boot-1",
                                (Doc(one), Doc(two), Doc(four))),
    # The exporter itself approves the reboot (as the sample service in that log did): IMDS
    # accepted it, so the event ran.
    "readme-approving": Sequence("flatcar-vm1", "2021-07-22T04:35:12Z", "boot-1",
                                 (Doc(two), Approve(), Doc(four))),
    # The log exactly: approved at incarnation 2, the exporter dies with its VM and comes back
    # to incarnation 4, empty, with no boot id to compare (SEE_BOOT_ID_FILE empty): the
    # approval remembered in the state file is the evidence that it ran.
    "readme-approved-then-restarted": Sequence(
        "flatcar-vm1", "2021-07-22T04:36:08Z", None,
        (Doc(two), Approve(), Restart("2021-07-22T04:37:09Z", None), Doc(four))),
    # Dies with its VM during the reboot: the host's boot id changed while a Reboot of this VM
    # was pending, so it ran.
    "readme-rebooted": Sequence("flatcar-vm1", "2021-07-22T04:36:08Z", "boot-1",
                                (Doc(two), Restart("2021-07-22T04:37:09Z", "boot-2"),
                                 Doc(four))),
    # The same restart without either piece of evidence: the same documents prove nothing.
    "readme-restarted-same-boot": Sequence("flatcar-vm1", "2021-07-22T04:36:08Z", "boot-1",
                                           (Doc(two), Restart("2021-07-22T04:37:09Z", "boot-1"),
                                            Doc(four))),
    # Microsoft's documented sequence seen by WestNO_0 (also replayed by the process below).
    "live-migration": Sequence("WestNO_0", "2022-04-11T22:20:00Z", "boot-1",
                               tuple(Doc(d) for d in migration)),
    # A document an AKS node logged (a Freeze already Started): a first deployment into it is
    # a late first sight, not an unannounced start (WARN, not ERROR).
    "aks-fresh-start": Sequence("regular-node-30975042-vmss_6", "2023-06-02T19:18:25Z",
                                "boot-1", (Doc(aks_started),)),
    # The repeated EventId beside a real event: both events are reported.
    "repeated-event-id": Sequence("flatcar-vm1", "2021-07-22T04:36:08Z", "boot-1",
                                  (Doc(REPEATED_ID),)),
    # Microsoft's sample documents seen by sample_4, 190 -> 192 -> 190: when the older, empty
    # document comes back the incarnation went backwards, and the events that left with it,
    # long before NotBefore, have no verdict (not cancelled).
    "samples-reset": Sequence("sample_4", "2018-01-24T21:00:00Z", "boot-1",
                              (Doc(sample_empty), Doc(sample_reboots), Doc(sample_empty))),
    # A third-party fixture (a Platform Reboot of two resources, DurationInSeconds -1) seen by
    # the second of them; a restart after NotBefore into an empty document (the
    # documentation's incarnation 1): it ran at its NotBefore, though never seen Started.
    "fixture-after-not-before": Sequence(
        "aks-spotcpu2d2as-24469130-vmss_1", "2016-09-19T18:10:00Z", "boot-1",
        (Doc(fixture_reboot), Restart("2016-09-19T18:40:00Z", "boot-1"), Doc(migration[0]))),
}


class Row(NamedTuple):
    sequence: str
    transition: str
    basis: str | None
    #: Further columns the record must carry, exactly.
    columns: Mapping[str, object] = {}


SAMPLE_4_REBOOT = "28512AF7-C957-4500-9BC4-842D6FB531E4"
SAMPLE_1_REBOOT = "A626E37F-793E-44E1-89B5-99AE0B96044C"
FREEZE = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
FIXTURE_REBOOT = "602d9444-d2cd-49c7-8624-8643e7171297"

#: One row per corpus sequence and transition, in the order the exporter ships them.
VERDICTS: tuple[Row, ...] = (
    Row("readme-watching", "scheduled", "continuous_watch", {"EventId": README_REBOOT}),
    Row("readme-watching", "outcome_unknown", "missed_documents",
        {"EventId": README_REBOOT, "EventStatus": "Unknown"}),
    Row("readme-approving", "scheduled", "first_document", {"EventId": README_REBOOT}),
    Row("readme-approving", "approved", None,
        {"EventId": README_REBOOT, "Decision": "approved"}),
    Row("readme-approving", "completed", "approval_accepted",
        {"EventId": README_REBOOT, "ObservedStart": False}),
    Row("readme-approved-then-restarted", "scheduled", "first_document"),
    Row("readme-approved-then-restarted", "approved", None, {"EventId": README_REBOOT}),
    Row("readme-approved-then-restarted", "completed", "approval_accepted",
        {"EventId": README_REBOOT, "ObservationGapSeconds": 61.0}),
    Row("readme-rebooted", "scheduled", "first_document"),
    Row("readme-rebooted", "completed", "host_rebooted",
        {"EventId": README_REBOOT, "ObservationGapSeconds": 61.0}),
    Row("readme-restarted-same-boot", "scheduled", "first_document"),
    Row("readme-restarted-same-boot", "outcome_unknown", "missed_documents",
        {"EventId": README_REBOOT, "ObservationGapSeconds": 61.0}),
    Row("live-migration", "scheduled", "continuous_watch",
        {"EventId": FREEZE, "AffectsSelf": True}),
    Row("live-migration", "started", None, {"AffectsSelf": True, "Unannounced": False}),
    Row("live-migration", "completed", "observed_start",
        {"AffectsSelf": True, "ObservedStart": True}),
    Row("aks-fresh-start", "started", "first_document",
        {"Unannounced": False, "Severity": "WARN"}),
    Row("repeated-event-id", "scheduled", "first_document", {"EventId": README_REBOOT}),
    Row("repeated-event-id", "scheduled", "first_document", {"EventId": FREEZE}),
    # 21:20:44 NotBefore - 21:00:00.2 (the second poll) = 20 min 43.8 s of notice left.
    Row("samples-reset", "scheduled", "missed_documents",
        {"EventId": SAMPLE_4_REBOOT, "AffectsSelf": True, "NoticeSeconds": 1243.8}),
    Row("samples-reset", "scheduled", "missed_documents",
        {"EventId": SAMPLE_1_REBOOT, "AffectsSelf": False, "NoticeSeconds": 1243.8}),
    Row("samples-reset", "document_reset", None, {"EventId": None}),
    Row("samples-reset", "outcome_unknown", "document_reset", {"EventId": SAMPLE_4_REBOOT}),
    Row("samples-reset", "outcome_unknown", "document_reset", {"EventId": SAMPLE_1_REBOOT}),
    Row("fixture-after-not-before", "scheduled", "first_document",
        {"AffectsSelf": True, "DurationInSeconds": -1,
         "Resources": ["FrontEnd_IN_0", "aks-spotcpu2d2as-24469130-vmss_1"]}),
    Row("fixture-after-not-before", "completed", "not_before_passed",
        {"EventId": FIXTURE_REBOOT, "ObservedStart": False, "ObservationGapSeconds": 1800.0}),
)


def rows_of(sequence: str) -> list[Row]:
    return [row for row in VERDICTS if row.sequence == sequence]


def _row_id(row: Row) -> str:
    index = rows_of(row.sequence).index(row)
    return f"{row.sequence}-{index}-{row.transition}"


@pytest.mark.parametrize("row", VERDICTS, ids=[_row_id(r) for r in VERDICTS])
def test_corpus_verdict(row: Row) -> None:
    records = replay(SEQUENCES[row.sequence])
    index = rows_of(row.sequence).index(row)
    assert index < len(records), f"{row.sequence} shipped only {len(records)} records"
    record = records[index]
    assert (record["Transition"], record["OutcomeBasis"]) == (row.transition, row.basis)
    for name, expected in row.columns.items():
        wanted = pytest.approx(expected) if isinstance(expected, float) else expected
        assert record[name] == wanted, (name, record)


@pytest.mark.parametrize("sequence", SEQUENCES)
def test_corpus_sequence_ships_exactly_its_rows(sequence: str) -> None:
    """No record beyond the table's rows (a row per record, none left out)."""
    shipped = [(r["Transition"], r["OutcomeBasis"]) for r in replay(SEQUENCES[sequence])]
    assert shipped == [(row.transition, row.basis) for row in rows_of(sequence)]


def test_every_corpus_capture_is_replayed() -> None:
    used = {step.body for seq in SEQUENCES.values() for step in seq.steps
            if isinstance(step, Doc)}
    for path in sorted(CORPUS.glob("*/*.json")):
        assert path.read_bytes() in used, f"{path.relative_to(CORPUS)} is in no sequence"


def test_every_corpus_document_is_accepted_by_the_parser() -> None:
    files = sorted(CORPUS.glob("*/*.json"))
    assert len(files) >= 11
    for path in files:
        parse_document(path.read_bytes())


class ServesTheSame:
    """An IMDS that answers every poll with a fresh 200 of the same document (no ETag)."""

    def __init__(self, body: bytes) -> None:
        self.document = parse_document(body)
        self.polls = 0

    def fetch_events(self) -> PollResult:
        self.polls += 1
        return PollResult(Outcome.OK, 0.001, status=200, document=self.document)


def test_a_repeated_event_id_is_logged_once_however_often_it_is_served(
        caplog: pytest.LogCaptureFixture) -> None:
    """The anomaly is said once per incarnation, not once per poll: IMDS serves the same
    document every second until it changes."""
    imds = ServesTheSame(REPEATED_ID)
    assert [a.kind for a in imds.document.anomalies] == ["duplicate_event_id"]
    poller = Poller(CONFIG, imds, [], Telemetry(),  # type: ignore[arg-type]
                    instance=InstanceInfo(vm_name="flatcar-vm1"))
    with caplog.at_level(logging.WARNING, logger="scheduled_events_exporter.poller"):
        shipped = [r for _ in range(10) for r in poller.poll_once()[1]]
    assert imds.polls == 10
    assert sorted(r.transition.event.event_id for r in shipped if r.transition.event) == \
        sorted([README_REBOOT, FREEZE])
    said = [r for r in caplog.records if "duplicate_event_id" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in caplog.records]


# --- the one process replay: the same bytes, over HTTP, to the installed exporter ---


def serve(sim: Simulator, document: bytes) -> None:
    """Serve ``document`` and wait until the exporter fetched it (twice: once parsed)."""
    sim.clear_requests()
    sim.set_raw_document(document)
    assert sim.wait_for_requests(2, 20, method="GET", path_prefix="/metadata/scheduledevents"), \
        "the exporter did not fetch the document"


@pytest.mark.timeout(120)
def test_documented_live_migration_end_to_end_with_console_and_otlp(tmp_path: Path) -> None:
    """Microsoft's documented sequence seen by WestNO_0, served byte for byte over HTTP, to the
    console and a real collector: the process ships what the table says."""
    seq = SEQUENCES["live-migration"]
    boot = tmp_path / "boot_id"
    boot.write_text(f"{seq.boot_id}\n")
    service = f"replay-{tmp_path.name}"
    with Simulator(vm_name=seq.vm_name) as sim, RotelReceiver() as rotel:
        sim.set_raw_document(migration[0])
        env = clean_env(SEE_IMDS_ENDPOINT=sim.url, SEE_SINKS="console,otlp",
                        SEE_STATE_DIR=state_dir(tmp_path), SEE_HEALTH_ADDR="",
                        SEE_POLL_INTERVAL=POLL_INTERVAL, SEE_CLOCK_START=seq.clock_start,
                        SEE_BOOT_ID_FILE=str(boot),
                        OTEL_EXPORTER_OTLP_ENDPOINT=rotel.http_endpoint,
                        OTEL_SERVICE_NAME=service)
        with ExporterProcess(env) as proc:
            for doc in migration:
                serve(sim, doc)
            records = proc.wait_for_records(3, 20)
            logs = rotel.wait_for_logs(lambda r: r.resource.get("service.name") == service,
                                       count=3, timeout=30)
    assert [(r["Transition"], r["OutcomeBasis"]) for r in records] == [
        ("scheduled", "continuous_watch"), ("started", None), ("completed", "observed_start")]
    # Every column the pure replay ships too, except what rests on the real poll times
    # (TimeGenerated, NoticeSeconds, ElapsedSeconds) or on the instance metadata the table does
    # not model (the simulator's VmId and the rest; RecordId is derived from the VmId).
    unmodelled = {"TimeGenerated", "NoticeSeconds", "ElapsedSeconds", "VmId", "ResourceId",
                  "SubscriptionId", "ResourceGroup", "Region", "Zone", "ScaleSetName",
                  "RecordId", "Severity"}
    expected = [{k: v for k, v in r.items() if k not in unmodelled} for r in replay(seq)]
    assert [{k: v for k, v in r.items() if k not in unmodelled} for r in records] == expected
    assert [r["AffectsSelf"] for r in records] == [True, True, True]
    assert [lg.event_name for lg in logs] == ["azure.scheduled_event.scheduled",
                                             "azure.scheduled_event.started",
                                             "azure.scheduled_event.completed"]
    assert logs[2].attributes["azure.scheduled_event.outcome_basis"] == "observed_start"
