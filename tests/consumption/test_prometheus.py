"""Prometheus rule checks: `promtool check rules` is clean, rules only use exported metric names,
the KQL log alerts have PromQL counterparts, and the name rendering matches the OTel Prometheus
exporter."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.consumption import consumption_helpers as ch

RULE_FILES = sorted(ch.PROMETHEUS_DIR.glob("*.yaml"))


def test_rule_files_exist() -> None:
    assert RULE_FILES


def test_promtool_check_rules() -> None:
    promtool = ch.tool_path("promtool")
    proc = subprocess.run(
        [promtool, "check", "rules", *map(str, RULE_FILES)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def rules() -> list[dict[str, object]]:
    out = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            out.extend(group["rules"])
    return out


@pytest.mark.parametrize("rule", rules(), ids=lambda r: str(r.get("alert") or r.get("record")))
def test_rules_use_exported_metric_names(rule: dict[str, object]) -> None:
    names = ch.promql_metric_names(str(rule["expr"]))
    assert names, rule
    assert names <= ch.exported_prometheus_names(), sorted(names - ch.exported_prometheus_names())
    if "alert" in rule:
        labels = rule.get("labels")
        annotations = rule.get("annotations")
        assert isinstance(labels, dict) and labels.get("severity"), rule["alert"]
        assert isinstance(annotations, dict) and annotations.get("summary"), rule["alert"]


def test_kql_alerts_have_promql_counterparts() -> None:
    alerts = {r.get("alert") for r in rules()}
    assert {
        "ScheduledEventImpactfulImminent",
        "ScheduledEventUnannouncedStart",
        "ScheduledEventsExporterSilent",
    } <= alerts


@pytest.mark.parametrize(
    ("name", "kind", "unit", "python", "collector"),
    [
        (
            "azure.scheduled_events.pending",
            "gauge",
            "{event}",
            "azure_scheduled_events_pending",
            None,
        ),
        (
            "azure.scheduled_events.transitions",
            "counter",
            "{transition}",
            "azure_scheduled_events_transitions_total",
            None,
        ),
        (
            "azure.scheduled_events.notice",
            "histogram",
            "s",
            "azure_scheduled_events_notice_seconds",
            None,
        ),
        (
            "azure.scheduled_events.imds.staleness",
            "gauge",
            "s",
            "azure_scheduled_events_imds_staleness_seconds",
            None,
        ),
        (
            "azure.scheduled_events.document_incarnation",
            "gauge",
            "1",
            "azure_scheduled_events_document_incarnation",
            "azure_scheduled_events_document_incarnation_ratio",
        ),
    ],
)
def test_prometheus_name_rendering(
    name: str, kind: str, unit: str, python: str, collector: str | None
) -> None:
    # Verified against opentelemetry-exporter-prometheus 0.66b2 (Python SDK 1.45.2) and the Go
    # translator used by the collector (prometheus/otlptranslator).
    inst = ch.Instrument(name, kind, unit)
    assert ch.prometheus_family(inst) == python
    assert ch.prometheus_family(inst, ratio_for_unit_one=True) == (collector or python)


def test_exported_names_are_the_spec_instruments() -> None:
    # What a real run delivered to a real collector is exactly what the code declares.
    assert ch.observed_instruments() == tuple(sorted(ch.INSTRUMENTS, key=lambda i: i.name))
    names = ch.exported_prometheus_names()
    assert "azure_scheduled_events_imds_duration_seconds_bucket" in names
    assert "azure_scheduled_events_export_failures_total" in names
    assert "azure_scheduled_events_approvals_total" in names
    assert not any("document_incarnation" in n for n in names)
    assert len(ch.INSTRUMENTS) == 12


def test_rule_file_header(tmp_path: Path) -> None:
    for path in RULE_FILES:
        assert path.read_text(encoding="utf-8").startswith("# "), path
