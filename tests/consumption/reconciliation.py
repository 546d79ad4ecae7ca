"""The reconciliation of the exporter's verdicts with the platform's own record, written once.

:data:`CLASSIFICATION` is the table every query pack's ``verdict-agreement.kql`` carries as a
``datatable`` (test_reconciliation.py holds each pack's copy equal to it). :func:`verdicts`,
:func:`agreement` and :func:`uncovered_vms` are the queries' logic in plain Python over records
as the Event Hubs and console sinks write them (one dict of ``records.COLUMNS`` per record; the
OTLP and Application Insights packs map their rows onto the same names first). There is no
Kusto engine here: the KQL is analysed against the real schemas (test_kql.py), its table is
this one, and these functions are what it computes, checked on records from both observers.

The rules, as docs/consumption.md ("Reconciliation with the platform's record") states them:

* One verdict per event and reporting exporter: every exporter that saw an event (all VMs of an
  availability set or scale set placement group see each other's events) judged its end on its
  own evidence, so each of those judgements is compared. Events are matched on the EventId
  lowercased (the platform's samples and IMDS differ in letter case).
* The exporter's verdict is its last ending record for the event (``completed``, ``cancelled``,
  ``outcome_unknown``); the platform's final status is its last ``completed`` (Completed) or
  ``cancelled`` (Canceled) record. The pair is classed by the first rule of
  :data:`CLASSIFICATION` that names the verdict's basis, else by the one for any basis.
* A verdict with nothing final on the platform's side is not judged: ``no_platform_record``
  (the policy is off for that VM, or its feed lost the event) or ``platform_not_final`` (the
  platform's end has not arrived, or the queue lost it). A final status on the platform's side
  for a VM that has an exporter (any ``imds`` record from it in the window) but no verdict from
  it is not judged either: ``not_seen_by_sidecar`` (the exporter never saw it: it was not
  running, or the event came and went between two looks) or ``sidecar_not_final`` (it saw the
  event and has not recorded an end). These are counted apart; they measure coverage, not the
  rules. A VM with no exporter at all is :func:`uncovered_vms`'s business.
* The agreement figure is ``agree / (agree + expected + bug)``, per fleet (subscription) and
  event type, and per fleet over all types.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Record = Mapping[str, Any]

#: The exporter's endings (docs/lifecycle.md) and the platform's final statuses.
SIDECAR_ENDINGS = ("completed", "cancelled", "outcome_unknown")
PLATFORM_FINALS = ("Completed", "Canceled")
#: A rule's basis that matches any basis the verdict names.
ANY_BASIS = "*"
#: The classes: the verdict agrees, disagrees for a reason the exporter could not see, or
#: disagrees where its evidence should have been enough (a rule to look at).
AGREE, EXPECTED, BUG = "agree", "expected", "bug"
#: Pairs that are not judged, and why.
UNMATCHED = "unmatched"
NO_PLATFORM_RECORD = "no_platform_record"
PLATFORM_NOT_FINAL = "platform_not_final"
NOT_SEEN_BY_SIDECAR = "not_seen_by_sidecar"
SIDECAR_NOT_FINAL = "sidecar_not_final"
#: What the figures count (summary columns), in order.
JUDGED_CLASSES = (AGREE, EXPECTED, BUG)
UNMATCHED_REASONS = (NO_PLATFORM_RECORD, PLATFORM_NOT_FINAL, NOT_SEEN_BY_SIDECAR,
                     SIDECAR_NOT_FINAL)
ALL_TYPES = "(all types)"


@dataclass(frozen=True, slots=True)
class Rule:
    """One row of the classification: the exporter's ending and basis beside the platform's
    final status, the class and why."""

    sidecar_ending: str
    sidecar_basis: str
    platform_final: str
    verdict_class: str
    reason: str


#: The classification, written once. Rules for one basis come before the rule for any basis.
CLASSIFICATION: tuple[Rule, ...] = (
    Rule("completed", "not_before_passed", "Canceled", EXPECTED,
         "inferred from the clock alone: the platform may withdraw an event after its NotBefore"),
    Rule("completed", "host_rebooted", "Canceled", EXPECTED,
         "inferred from a changed boot id: a reboot for another cause looks the same"),
    Rule("completed", ANY_BASIS, "Completed", AGREE, "both say it ran"),
    Rule("completed", ANY_BASIS, "Canceled", BUG,
         "the exporter saw it start or its approval accepted, yet the platform withdrew it"),
    Rule("cancelled", ANY_BASIS, "Canceled", AGREE, "both say it was withdrawn"),
    Rule("cancelled", ANY_BASIS, "Completed", BUG,
         "gone before its NotBefore between consecutive documents, yet it ran"),
    Rule("outcome_unknown", ANY_BASIS, "Completed", EXPECTED,
         "the exporter lacked the evidence: missed documents, a gap, a reset or no NotBefore"),
    Rule("outcome_unknown", ANY_BASIS, "Canceled", EXPECTED,
         "the exporter lacked the evidence: missed documents, a gap, a reset or no NotBefore"),
)


def classify(ending: str, basis: str, platform_final: str) -> tuple[str, str]:
    """(class, reason) of an ending beside a final status: the rule for its basis, else the
    rule for any basis."""
    for wanted in (basis, ANY_BASIS):
        for rule in CLASSIFICATION:
            if (rule.sidecar_ending, rule.sidecar_basis, rule.platform_final) == (
                    ending, wanted, platform_final):
                return rule.verdict_class, rule.reason
    raise LookupError(f"no rule for {ending}/{basis} beside {platform_final}")


# ------------------------------------------------------------------------------- the queries


def observer(record: Record) -> str:
    """``imds`` or ``platform``; a row written before the column existed is the exporter's."""
    return str(record.get("Observer") or "imds")


def _key(record: Record) -> str:
    return str(record.get("EventId") or "").lower()


def _lower(value: Any) -> str:
    return str(value or "").lower()


def _latest(records: Iterable[Record]) -> Record:
    # arg_max(TimeGenerated, *): RFC 3339 UTC strings of one format order as their instants.
    return max(records, key=lambda r: str(r["TimeGenerated"]))


@dataclass(frozen=True, slots=True)
class Verdict:
    """One row of verdict-agreement.kql's detail: an exporter's ending beside the platform's."""

    event_key: str
    vm_name: str
    subscription_id: str
    event_type: str
    sidecar_ending: str | None
    outcome_basis: str | None
    platform_final: str | None
    platform_status: str | None
    verdict_class: str
    reason: str


def verdicts(records: Sequence[Record]) -> list[Verdict]:
    """Every exporter's verdict beside the platform's final status, and the platform's finals
    that a covered VM's exporter has no verdict on."""
    with_id = [r for r in records if _key(r)]
    platform = [r for r in with_id if observer(r) == "platform"]
    sidecar = [r for r in with_id if observer(r) == "imds"]
    finals_by_key: dict[str, list[Record]] = defaultdict(list)
    for r in platform:
        if r["Transition"] in ("completed", "cancelled"):
            finals_by_key[_key(r)].append(r)
    finals = {k: _latest(v) for k, v in finals_by_key.items()}
    platform_keys = {_key(r) for r in platform}
    endings_by: dict[tuple[str, str], list[Record]] = defaultdict(list)
    for r in sidecar:
        if r["Transition"] in SIDECAR_ENDINGS:
            endings_by[(_key(r), _lower(r.get("VmName")))].append(r)
    out = []
    for (key, _reporter), rows in sorted(endings_by.items()):
        ending = _latest(rows)
        final = finals.get(key)
        basis = str(ending.get("OutcomeBasis") or "")
        if final is not None:
            platform_final = "Completed" if final["Transition"] == "completed" else "Canceled"
            verdict_class, reason = classify(ending["Transition"], basis, platform_final)
        else:
            platform_final = None
            verdict_class = UNMATCHED
            reason = PLATFORM_NOT_FINAL if key in platform_keys else NO_PLATFORM_RECORD
        out.append(Verdict(key, str(ending.get("VmName") or ""),
                           str(ending.get("SubscriptionId") or ""),
                           str(ending.get("EventType") or ""), ending["Transition"], basis,
                           platform_final, final.get("EventStatus") if final else None,
                           verdict_class, reason))
    # The platform's finals on VMs whose exporter is there but gave no verdict.
    covered = {(_lower(r.get("SubscriptionId")), _lower(r.get("VmName"))) for r in sidecar}
    seen = {(_key(r), _lower(r.get("VmName"))) for r in sidecar}
    for key, final in sorted(finals.items()):
        for vm in sorted({str(v) for v in final.get("Resources") or []}, key=str.lower):
            reporter = vm.lower()
            if ((_lower(final.get("SubscriptionId")), reporter) not in covered
                    or (key, reporter) in endings_by):
                continue
            reason = SIDECAR_NOT_FINAL if (key, reporter) in seen else NOT_SEEN_BY_SIDECAR
            platform_final = "Completed" if final["Transition"] == "completed" else "Canceled"
            out.append(Verdict(key, vm, str(final.get("SubscriptionId") or ""),
                               str(final.get("EventType") or ""), None, None, platform_final,
                               final.get("EventStatus"), UNMATCHED, reason))
    return out


@dataclass(frozen=True, slots=True)
class Agreement:
    """One row of verdict-agreement.kql's output: the figures of one fleet and event type."""

    subscription_id: str
    event_type: str
    counts: Mapping[str, int]
    agreement_percent: float | None
    disagreements: tuple[Verdict, ...]


def agreement(rows: Sequence[Verdict]) -> dict[tuple[str, str], Agreement]:
    """Figures per (subscription, event type) and per (subscription, ALL_TYPES), keyed with the
    subscription lowercased."""
    groups: dict[tuple[str, str], list[Verdict]] = defaultdict(list)
    for v in rows:
        sub = v.subscription_id.lower()
        groups[(sub, v.event_type)].append(v)
        groups[(sub, ALL_TYPES)].append(v)
    out = {}
    for (sub, event_type), group in groups.items():
        counts = {c: sum(v.verdict_class == c for v in group) for c in JUDGED_CLASSES}
        counts.update({r: sum(v.verdict_class == UNMATCHED and v.reason == r for v in group)
                       for r in UNMATCHED_REASONS})
        judged = sum(counts[c] for c in JUDGED_CLASSES)
        percent = round(100.0 * counts[AGREE] / judged, 1) if judged else None
        out[(sub, event_type)] = Agreement(
            sub, event_type, counts, percent,
            tuple(v for v in group if v.verdict_class in (EXPECTED, BUG)))
    return out


@dataclass(frozen=True, slots=True)
class UncoveredVm:
    """One row of uncovered-vms.kql: a VM the platform reported events for, with no exporter."""

    subscription_id: str
    resource_group: str
    vm_name: str
    events: int


def uncovered_vms(records: Sequence[Record], heartbeat_vm_names: Iterable[str] = (),
                  heartbeat_vms: Iterable[tuple[str, str]] = ()) -> list[UncoveredVm]:
    """VMs named in the platform's records (its Resources, under the record's subscription and
    resource group) with no ``imds`` record from the same subscription, resource group and name,
    and no heartbeat: by name alone (``heartbeat_vm_names``: the Event Hubs metrics snapshots
    carry no subscription) or by (subscription, name) (``heartbeat_vms``: App Insights'
    AppMetrics); all case-insensitive. OTelLogs has no heartbeat: neither is given."""
    covered = {(_lower(r.get("SubscriptionId")), _lower(r.get("ResourceGroup")),
                _lower(r.get("VmName"))) for r in records if observer(r) == "imds"}
    names = {name.lower() for name in heartbeat_vm_names}
    beating = {(sub.lower(), name.lower()) for sub, name in heartbeat_vms}
    events: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    shown: dict[tuple[str, str, str], tuple[str, str, str]] = {}
    for r in records:
        if observer(r) != "platform":
            continue
        for vm in r.get("Resources") or []:
            if not vm:
                continue
            key = (_lower(r.get("SubscriptionId")), _lower(r.get("ResourceGroup")), vm.lower())
            events[key].add(_key(r))
            shown.setdefault(key, (str(r.get("SubscriptionId") or ""),
                                   str(r.get("ResourceGroup") or ""), vm))
    return [UncoveredVm(*shown[key], len(ids)) for key, ids in sorted(events.items())
            if key not in covered and key[2] not in names and (key[0], key[2]) not in beating]
