"""Reconciliation with the platform's own record (verdict-agreement.kql, uncovered-vms.kql in
every pack): each pack's classification is the one table in reconciliation.py, the queries
answer with the columns the reference computes, and the reference gives the expected figures on
records of both observers (hand-made, and the exporter's own records from its tracker beside the
platform's records in the shape the platform command writes them). The KQL itself is analysed
against the real schemas with the rest of the packs (test_kql.py)."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from scheduled_events_exporter.model import Basis, InstanceInfo
from scheduled_events_exporter.parser import parse_document
from scheduled_events_exporter.records import COLUMNS, make_record, to_columns
from scheduled_events_exporter.tracker import Evidence, TrackerState, track
from tests.consumption import consumption_helpers as ch
from tests.consumption import reconciliation as rc

PACKS = ("eventhubs", "otel", "appinsights")
VERDICT_QUERIES = [ch.KQL_DIR / p / "verdict-agreement.kql" for p in PACKS]
COVERAGE_QUERIES = [ch.KQL_DIR / p / "uncovered-vms.kql" for p in PACKS]
_STRING = re.compile(r'"((?:\\.|[^"\\])*)"')


def _code(path: Path) -> str:
    return "\n".join(line for line in path.read_text(encoding="utf-8").splitlines()
                     if not line.lstrip().startswith("//"))


def datatable_rows(text: str) -> list[rc.Rule]:
    """The rows of the ``let Classification = datatable(...) [...]`` literal of a query."""
    match = re.search(r"let Classification = datatable\(([^)]*)\)\s*\[(.*?)\];", text, re.S)
    assert match, "no `let Classification = datatable(...) [...];`"
    columns = [c.split(":")[0].strip() for c in match[1].split(",")]
    assert columns == ["SidecarEnding", "SidecarBasis", "PlatformFinal", "Class", "Reason"]
    cells = _STRING.findall(match[2])
    # Nothing but quoted cells and their separators: an unquoted value would be lost above.
    assert re.fullmatch(r'(\s*"(?:\\.|[^"\\])*"\s*,?)*\s*', match[2]), match[2]
    assert len(cells) % len(columns) == 0, cells
    return [rc.Rule(*cells[i:i + len(columns)]) for i in range(0, len(cells), len(columns))]


# --------------------------------------------------------------------- one table, every pack


@pytest.mark.parametrize("path", VERDICT_QUERIES, ids=lambda p: p.parent.name)
def test_every_pack_classifies_with_the_one_table(path: Path) -> None:
    assert datatable_rows(path.read_text(encoding="utf-8")) == list(rc.CLASSIFICATION)


ALERT_VARIABLES = ("kqlVerdictEventHubs", "kqlVerdictOtlp", "kqlVerdictAppInsights")


@pytest.mark.parametrize("variable", ALERT_VARIABLES)
def test_the_alert_rule_classifies_with_the_one_table(variable: str) -> None:
    text = ch.load_json(ch.AZURE_DIR / "alert-rules.json")["variables"][variable]
    assert datatable_rows(text) == list(rc.CLASSIFICATION)
    code = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("//"))
    # It fires on the class bug alone, for pairs with a final status on both sides.
    assert f'where Class == "{rc.BUG}"' in code and "lookup kind=inner PlatformFinals" in code
    assert 'Observer = iff(isempty(Observer), "imds", Observer)' in code
    assert "tolower(EventId)" in code


def test_the_table_check_sees_a_changed_cell() -> None:
    text = VERDICT_QUERIES[0].read_text(encoding="utf-8")
    changed = text.replace('"cancelled", "*", "Completed", "bug"',
                           '"cancelled", "*", "Completed", "expected"', 1)
    assert changed != text
    assert datatable_rows(changed) != list(rc.CLASSIFICATION)


def test_the_table_judges_every_pair_once() -> None:
    rules = rc.CLASSIFICATION
    keys = [(r.sidecar_ending, r.sidecar_basis, r.platform_final) for r in rules]
    assert len(keys) == len(set(keys))
    for ending in rc.SIDECAR_ENDINGS:
        for final in rc.PLATFORM_FINALS:
            assert (ending, rc.ANY_BASIS, final) in keys, (ending, final)
    assert {r.verdict_class for r in rules} == set(rc.JUDGED_CLASSES)
    # A rule for one basis names a basis the exporter gives its endings (docs/lifecycle.md).
    assert {r.sidecar_basis for r in rules} - {rc.ANY_BASIS} <= {b.value for b in Basis}
    # The brief's own pairs.
    assert rc.classify("outcome_unknown", "missed_documents", "Completed")[0] == rc.EXPECTED
    assert rc.classify("cancelled", "consecutive_absence", "Completed")[0] == rc.BUG
    assert rc.classify("completed", "observed_start", "Canceled")[0] == rc.BUG
    assert rc.classify("completed", "not_before_passed", "Canceled")[0] == rc.EXPECTED


@pytest.mark.parametrize("path", VERDICT_QUERIES + COVERAGE_QUERIES,
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_queries_read_both_observers_as_the_reference_does(path: Path) -> None:
    code = _code(path)
    # Rows written before the column (or attribute) existed are the exporter's.
    assert 'Observer = iff(isempty(Observer), "imds", Observer)' in code
    assert 'Observer == "platform"' in code and 'Observer == "imds"' in code
    # Case-insensitive: EventIds, the platform's instance names, subscriptions.
    assert "tolower(EventId)" in code and "tolower(SubscriptionId)" in code
    assert "mv-expand Affected = Resources" in code or "mv-expand Affected = PlatformResources" \
        in code
    if path.parent.name != "eventhubs":
        assert 'Attributes["azure.scheduled_event.observer"]' in path.read_text(encoding="utf-8") \
            or 'Properties["azure.scheduled_event.observer"]' in path.read_text(encoding="utf-8")


def test_every_pack_answers_with_the_references_figures(
        kusto_results: dict[str, dict[str, Any]]) -> None:
    counts = ["Agree", "Expected", "Bugs", "NoPlatformRecord", "PlatformNotFinal",
              "NotSeenBySidecar", "SidecarNotFinal"]
    # The reference's names for the same counts, in the same order.
    assert [*rc.JUDGED_CLASSES, *rc.UNMATCHED_REASONS] == [
        "agree", "expected", "bug", "no_platform_record", "platform_not_final",
        "not_seen_by_sidecar", "sidecar_not_final"]
    for path in VERDICT_QUERIES:
        columns = kusto_results[str(path.relative_to(ch.REPO))]["columns"]
        assert columns == [["SubscriptionId", "string"], ["EventType", "string"],
                           ["AgreementPercent", "real"], ["Judged", "long"],
                           *[[c, "long"] for c in counts], ["Disagreements", "dynamic"]], path
    for path in COVERAGE_QUERIES:
        columns = dict(map(tuple, kusto_results[str(path.relative_to(ch.REPO))]["columns"]))
        assert {k: columns.get(k) for k in ("SubscriptionId", "ResourceGroup", "VmName")} == {
            "SubscriptionId": "string", "ResourceGroup": "string", "VmName": "string"}, path


def test_the_classes_and_reasons_the_queries_name_are_the_references() -> None:
    for path in VERDICT_QUERIES:
        code = _code(path)
        for reason in rc.UNMATCHED_REASONS:
            assert f'"{reason}"' in code, (path, reason)
        assert f'"{rc.UNMATCHED}"' in code and f'"{rc.ALL_TYPES}"' in code
        assert 'Transition in ("completed", "cancelled", "outcome_unknown")' in code
        assert 'iff(Transition == "completed", "Completed", "Canceled")' in code


# ------------------------------------------------------------------- the reference on records

SUB_A = "11111111-1111-1111-1111-111111111111"
SUB_B = "22222222-2222-2222-2222-222222222222"
T0 = datetime(2026, 6, 1, 12, 0, tzinfo=timezone.utc)


def stamp(minutes: float) -> str:
    return (T0 + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def row(observer: str | None, transition: str, event_id: str, *, vm: str = "", sub: str = SUB_A,
        rg: str = "rg-web", event_type: str = "Freeze", basis: str | None = None,
        status: str = "", resources: list[str] | None = None, at: float = 0.0) -> dict[str, Any]:
    """A record with every column (None where it does not apply), as the sinks write it."""
    out: dict[str, Any] = dict.fromkeys(name for name, _ in COLUMNS)
    out.update(TimeGenerated=stamp(at), Transition=transition, EventId=event_id,
               EventType=event_type, EventStatus=status, OutcomeBasis=basis,
               Resources=resources if resources is not None else [vm], VmName=vm or None,
               SubscriptionId=sub, ResourceGroup=rg)
    if observer is None:
        del out["Observer"]  # a row written before the column existed
    else:
        out["Observer"] = observer
    return out


def platform(transition: str, event_id: str, resources: list[str], *, status: str,
             event_type: str = "Freeze", sub: str = SUB_A, rg: str = "RG-WEB",
             at: float = 0.0) -> dict[str, Any]:
    """A platform record: the scope's identity, VmName = the affected instances."""
    out = row("platform", transition, event_id, sub=sub, rg=rg, event_type=event_type,
              status=status, resources=resources, at=at,
              basis="platform_record" if transition in ("completed", "cancelled") else None)
    out["VmName"] = ", ".join(resources)
    out["ResourceId"] = f"/subscriptions/{sub}/resourceGroups/{rg}/providers/" \
                        "Microsoft.Compute/virtualMachineScaleSets/web"
    return out


def fleet() -> list[dict[str, Any]]:
    """Both observers' records for one month of two fleets."""
    e = [f"0000000{i}-aaaa-bbbb-cccc-dddddddddddd" for i in range(10)]
    return [
        # e0 Freeze seen by vm1 and vm2, both saw it start; the platform: Completed, delivered
        # twice (Event Grid delivers at least once), after Scheduled and Started.
        row("imds", "scheduled", e[0], vm="vm1", at=0),
        row("imds", "completed", e[0], vm="vm1", basis="observed_start", at=20),
        row(None, "completed", e[0], vm="VM2", basis="observed_start", at=21),
        platform("scheduled", e[0].upper(), ["vm1", "vm2"], status="Scheduled", at=0),
        platform("started", e[0].upper(), ["vm1", "vm2"], status="Started", at=15),
        platform("completed", e[0].upper(), ["vm1", "vm2"], status="Completed", at=19),
        platform("completed", e[0].upper(), ["vm1", "vm2"], status="Completed", at=19),
        # e1 Reboot cancelled on consecutive absence; the platform: Canceled.
        row("imds", "cancelled", e[1], vm="vm1", event_type="Reboot",
            basis="consecutive_absence", at=30),
        platform("cancelled", e[1], ["vm1"], status="Canceled", event_type="Reboot", at=29),
        # e2 Reboot: missed documents; the platform: Completed. Expected.
        row("imds", "outcome_unknown", e[2], vm="vm2", event_type="Reboot",
            basis="missed_documents", at=40),
        platform("completed", e[2], ["vm2"], status="Completed", event_type="Reboot", at=39),
        # e3 Freeze cancelled, yet the platform completed it: a bug, EventId in upper case.
        row("imds", "cancelled", e[3].upper(), vm="vm1", basis="consecutive_absence", at=50),
        platform("completed", e[3], ["vm1"], status="Completed", at=49),
        # e4 Reboot completed on NotBefore passed; the platform: Canceled. Expected.
        row("imds", "completed", e[4], vm="vm2", event_type="Reboot",
            basis="not_before_passed", at=60),
        platform("cancelled", e[4], ["vm2"], status="Canceled", event_type="Reboot", at=59),
        # e5 Redeploy completed on an accepted approval; the platform: Canceled. A bug.
        row("imds", "completed", e[5], vm="vm1", event_type="Redeploy",
            basis="approval_accepted", at=70),
        platform("cancelled", e[5], ["vm1"], status="Canceled", event_type="Redeploy", at=69),
        # e6 Freeze: the platform never reported it (policy off, feed lost it).
        row("imds", "completed", e[6], vm="vm1", basis="observed_start", at=80),
        # e7 Freeze: the platform's end has not arrived.
        row("imds", "completed", e[7], vm="vm2", basis="observed_start", at=90),
        platform("started", e[7], ["vm2"], status="Started", at=85),
        # e8 Reboot on vm1 (has an exporter) and vm3 (has none): vm1's exporter never saw it.
        platform("completed", e[8], ["vm1", "vm3"], status="Completed", event_type="Reboot",
                 at=100),
        # e9 Freeze on vm2: its exporter saw it scheduled and has recorded no end yet.
        row("imds", "scheduled", e[9], vm="vm2", at=105),
        platform("completed", e[9], ["vm2"], status="Completed", at=110),
        # Another fleet: one agreement.
        row("imds", "completed", "ffffffff-0000-0000-0000-000000000000", vm="db1", sub=SUB_B,
            basis="host_rebooted", event_type="Reboot", at=5),
        platform("completed", "FFFFFFFF-0000-0000-0000-000000000000", ["db1"], sub=SUB_B,
                 status="Completed", event_type="Reboot", at=4),
        # A record without an EventId (document_reset) is nobody's verdict.
        row("imds", "document_reset", "", vm="vm1", at=1),
    ]


def test_the_reference_classes_every_verdict() -> None:
    got = {(v.event_key[:9], v.vm_name.lower(), v.verdict_class, v.reason.split(":")[0])
           for v in rc.verdicts(fleet())}
    assert got == {
        ("00000000-", "vm1", "agree", "both say it ran"),
        ("00000000-", "vm2", "agree", "both say it ran"),
        ("00000001-", "vm1", "agree", "both say it was withdrawn"),
        ("00000002-", "vm2", "expected", "the exporter lacked the evidence"),
        ("00000003-", "vm1", "bug", "gone before its NotBefore between consecutive documents, "
                                    "yet it ran"),
        ("00000004-", "vm2", "expected", "inferred from the clock alone"),
        ("00000005-", "vm1", "bug", "the exporter saw it start or its approval accepted, yet "
                                    "the platform withdrew it"),
        ("00000006-", "vm1", "unmatched", "no_platform_record"),
        ("00000007-", "vm2", "unmatched", "platform_not_final"),
        ("00000008-", "vm1", "unmatched", "not_seen_by_sidecar"),
        ("00000009-", "vm2", "unmatched", "sidecar_not_final"),
        ("ffffffff-", "db1", "agree", "both say it ran"),
    }


def test_the_reference_gives_the_agreement_figures() -> None:
    figures = rc.agreement(rc.verdicts(fleet()))
    freeze = figures[(SUB_A, "Freeze")]
    # e0 twice (two exporters) agree, e3 is a bug; e6 and e7 are not judged; e9 neither.
    assert freeze.counts == {"agree": 2, "expected": 0, "bug": 1, "no_platform_record": 1,
                             "platform_not_final": 1, "not_seen_by_sidecar": 0,
                             "sidecar_not_final": 1}
    assert freeze.agreement_percent == pytest.approx(66.7)
    reboot = figures[(SUB_A, "Reboot")]
    assert (reboot.counts["agree"], reboot.counts["expected"], reboot.counts["bug"],
            reboot.counts["not_seen_by_sidecar"]) == (1, 2, 0, 1)
    assert reboot.agreement_percent == pytest.approx(33.3)
    assert figures[(SUB_A, "Redeploy")].agreement_percent == 0.0
    everything = figures[(SUB_A, rc.ALL_TYPES)]
    assert (everything.counts["agree"], everything.counts["expected"],
            everything.counts["bug"]) == (3, 2, 2)
    assert everything.agreement_percent == pytest.approx(42.9)
    assert sorted(d.verdict_class for d in everything.disagreements) == [
        "bug", "bug", "expected", "expected"]
    assert figures[(SUB_B, rc.ALL_TYPES)].agreement_percent == 100.0
    assert figures[(SUB_B, "Reboot")].counts["agree"] == 1


def test_a_fleet_without_platform_finals_has_no_figure() -> None:
    only_ours = [r for r in fleet() if rc.observer(r) == "imds"]
    figures = rc.agreement(rc.verdicts(only_ours))
    assert figures[(SUB_A, rc.ALL_TYPES)].agreement_percent is None
    # Every ending of the fleet: e0 from two exporters, e1 to e7 from one each.
    assert figures[(SUB_A, rc.ALL_TYPES)].counts["no_platform_record"] == 9


def test_the_reference_finds_the_vms_without_an_exporter() -> None:
    records = fleet()
    # vm3 (e8) has platform events and no exporter; vm1 and vm2 are covered (vm2 by an old row
    # without Observer, in another letter case; the platform writes the group in upper case).
    assert [(u.vm_name, u.resource_group, u.events) for u in rc.uncovered_vms(records)] == [
        ("vm3", "RG-WEB", 1)]
    # A heartbeat under the name covers it (Event Hubs: by name; App Insights: subscription too).
    assert rc.uncovered_vms(records, heartbeat_vm_names=["VM3"]) == []
    assert rc.uncovered_vms(records, heartbeat_vms=[(SUB_B, "vm3")]) != []
    assert rc.uncovered_vms(records, heartbeat_vms=[(SUB_A.upper(), "vm3")]) == []
    # The same name in another resource group is another VM.
    moved = [{**r, "ResourceGroup": "rg-db"} if rc.observer(r) == "imds" else r
             for r in records]
    assert {u.vm_name for u in rc.uncovered_vms(moved)} == {"vm1", "vm2", "vm3", "db1"}


# ------------------------------------------------------- the exporter's own records, for real

VM = InstanceInfo(vm_name="vm-real", vm_id="0f0f0f0f-0000-0000-0000-000000000001",
                  subscription_id=SUB_A, resource_group="rg-real", region="westeurope")


def document(incarnation: int, *events: dict[str, Any]) -> bytes:
    return json.dumps({"DocumentIncarnation": incarnation, "Events": list(events)}).encode()


def event(event_id: str, status: str, event_type: str = "Freeze",
          not_before: str = "Mon, 01 Jun 2026 12:15:00 GMT") -> dict[str, Any]:
    return {"EventId": event_id, "EventStatus": status, "EventType": event_type,
            "ResourceType": "VirtualMachine", "Resources": ["vm-real"], "NotBefore": not_before,
            "Description": "", "EventSource": "Platform", "DurationInSeconds": 5}


def sidecar_records(steps: list[tuple[float, bytes]]) -> list[dict[str, Any]]:
    """What the exporter ships for these documents, seen at these minutes after T0, watched
    every few seconds in between (no gap)."""
    state, out = TrackerState(), []
    for minutes, body in steps:
        state, transitions = track(state, parse_document(body), T0 + timedelta(minutes=minutes),
                                   gap_threshold=1e9, evidence=Evidence(vm_name="vm-real"))
        out += [to_columns(make_record(t, VM)) for t in transitions]
    return out


def test_the_exporters_real_records_reconcile_with_the_platforms() -> None:
    freeze, reboot = "a1b2c3d4-0000-4000-8000-00000000f00d", "a1b2c3d4-0000-4000-8000-0000000b007"
    later = "Mon, 01 Jun 2026 12:30:00 GMT"
    ours = sidecar_records([
        (0, document(1, event(freeze, "Scheduled"), event(reboot, "Scheduled", "Reboot", later))),
        (15, document(2, event(freeze, "Started"), event(reboot, "Scheduled", "Reboot", later))),
        # The Freeze ran and left; the Reboot left before its NotBefore: cancelled.
        (16, document(3)),
    ])
    assert [(r["Transition"], r["OutcomeBasis"], r["Observer"]) for r in ours[-2:]] == [
        ("completed", "observed_start", "imds"), ("cancelled", "consecutive_absence", "imds")]
    theirs = [
        platform("scheduled", freeze.upper(), ["vm-real"], status="Scheduled", rg="RG-REAL"),
        platform("started", freeze.upper(), ["vm-real"], status="Started", rg="RG-REAL", at=15),
        platform("completed", freeze.upper(), ["vm-real"], status="Completed", rg="RG-REAL",
                 at=16),
        # The platform says the Reboot ran: the exporter's cancel is a bug to look at.
        platform("completed", reboot, ["vm-real"], status="Completed", event_type="Reboot",
                 rg="RG-REAL", at=20),
    ]
    rows = {(v.event_type, v.verdict_class) for v in rc.verdicts(ours + theirs)}
    assert rows == {("Freeze", "agree"), ("Reboot", "bug")}
    figures = rc.agreement(rc.verdicts(ours + theirs))
    assert figures[(SUB_A, rc.ALL_TYPES)].agreement_percent == 50.0
    assert rc.uncovered_vms(ours + theirs) == []


# ------------------------------------------------------------------------------- dashboards

DASHBOARD_PACKS = {
    "scheduled-events-log-analytics.json": "eventhubs",
    "scheduled-events-app-insights.json": "appinsights",
    "scheduled-events-azure-monitor-otlp.json": "otel",
}


def test_every_log_dashboard_runs_both_queries_of_its_pack() -> None:
    dashboards = {name: d for name, d, _ in ch.kql_dashboards()}
    assert set(DASHBOARD_PACKS) <= set(dashboards)
    for name, pack in DASHBOARD_PACKS.items():
        panels = {p["title"]: p for p in ch.iter_panels(dashboards[name])}
        for title, query in (("Verdict agreement with the platform's record",
                              "verdict-agreement.kql"),
                             ("VMs with platform events and no exporter", "uncovered-vms.kql")):
            panel = panels[title]
            assert panel["type"] == "table", (name, title)
            (target,) = panel["targets"]
            logs = target["azureLogAnalytics"]
            # The pack's query as it is, its comments left in the file: one logic to check.
            assert logs["query"] == _code(ch.KQL_DIR / pack / query), (name, title)
            assert logs["resources"] == ["$workspace"] and logs["resultFormat"] == "table"
