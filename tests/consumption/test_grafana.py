"""Grafana dashboard checks: each dashboard (and each panel's options, field config and queries)
type-checks against @grafana/schema under `tsc --strict`; Prometheus panels only query metric names
the exporter really exports (docs/semantics.md#metrics rendered by the OTel Prometheus
translation) and parse with
promtool; Azure Monitor panels query Log Analytics through the workspace variable (their KQL is
analysed in test_kql.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.consumption import consumption_helpers as ch

DASHBOARDS = ch.grafana_dashboards()


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_type_checks(name: str, tsc_errors: dict[str, list[str]]) -> None:
    errors = tsc_errors[f"grafana_{ch.ts_ident(name)}.ts"]
    assert errors == [], "\n".join(errors)


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_basics(name: str) -> None:
    dashboard = DASHBOARDS[name]
    assert dashboard["uid"] and dashboard["title"] and dashboard["description"]
    ids = [p["id"] for p in ch.iter_panels(dashboard)]
    assert len(ids) == len(set(ids)), ids
    for panel in ch.iter_panels(dashboard):
        assert panel.get("title"), panel["id"]
        assert panel.get("targets"), panel["id"]


def test_prometheus_queries_use_exported_metric_names() -> None:
    exported = ch.exported_prometheus_names()
    used: set[str] = set()
    for where, expr in ch.grafana_promql():
        names = ch.promql_metric_names(expr)
        assert names, f"{where}: no exporter metric in {expr!r}"
        assert names <= exported, f"{where}: {sorted(names - exported)} not exported"
        used |= names
    # The dashboard shows every instrument family except document_incarnation (its name differs
    # between the Python exporter and the collector: see exported_prometheus_names).
    families = {ch.prometheus_family(i) for i in ch.INSTRUMENTS} - {
        "azure_scheduled_events_document_incarnation"
    }
    shown = {n.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count") for n in used}
    assert families <= shown, sorted(families - shown)


def test_prometheus_queries_parse(tmp_path: Path) -> None:
    promtool = ch.tool_path("promtool")
    rules = []
    for i, (_where, expr) in enumerate(ch.grafana_promql()):
        selector = ch.label_values_metric(expr)
        rules.append(
            {"record": f"dashboard:query_{i}", "expr": ch.expand_promql_macros(selector or expr)}
        )
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}), encoding="utf-8"
    )
    proc = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def azure_targets(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        t
        for p in ch.iter_panels(dashboard)
        for t in p.get("targets", [])
        if t.get("datasource", {}).get("type") == "grafana-azure-monitor-datasource"
    ]


def test_azure_monitor_panels_query_the_workspace() -> None:
    targets = [t for d in DASHBOARDS.values() for t in azure_targets(d)]
    assert targets, "no Azure Monitor dashboard"
    for target in targets:
        assert target["queryType"] == "Azure Log Analytics"
        logs = target["azureLogAnalytics"]
        assert logs["resources"] == ["$workspace"]
        assert logs["resultFormat"] in ("table", "time_series")
        expanded = ch.expand_grafana_macros(logs["query"])
        assert "$" not in expanded, expanded


def test_azure_monitor_dashboard_covers_the_brief() -> None:
    (dashboard,) = [d for d in DASHBOARDS.values() if azure_targets(d)]
    text = " ".join(t["azureLogAnalytics"]["query"] for t in azure_targets(dashboard))
    titles = " ".join(p["title"].lower() for p in ch.iter_panels(dashboard))
    for needle in ("pending", "countdown", "impact", "notice", "transitions", "imds"):
        assert needle in titles, needle
    assert ch.TRANSITIONS_TABLE in text and ch.METRICS_TABLE in text
