"""Helpers for the native OTLP route (an Azure Monitor workspace fed by its OTLP ingestion):
where its rules and dashboards live, the names a real exporter run puts there (dotted metric names,
attributes as dotted labels), and a Prometheus 3 PromQL parser (npm @prometheus-io/lezer-promql),
since promtool 2.x cannot read quoted UTF-8 names."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.consumption import consumption_helpers as ch

NATIVE_OTLP_RULES_DIR = ch.PROMETHEUS_DIR / "native-otlp"
NATIVE_OTLP_GRAFANA_DIR = ch.GRAFANA_DIR / "native-otlp"

#: Labels PromQL may use on the native OTLP route besides the exporter's attributes: ``le``, which
#: Azure Monitor makes up at query time for OTLP explicit histograms ("PromQL best practices for
#: OpenTelemetry metrics": histogram_quantile over sum by (le)).
NATIVE_OTLP_QUERY_LABELS = frozenset({"le"})


#: The native-OTLP dashboard's variable naming the function counters and histograms are read with:
#: increase (cumulative temporality, the SDK's default) or sum_over_time (delta).
TEMPORALITY_VARIABLE = "counters"
TEMPORALITY_FUNCTIONS = ("increase", "sum_over_time")


def expand_temporality(expr: str) -> list[tuple[str, str]]:
    """(function, expr) for each value of the temporality variable the expression uses; one
    ("", expr) when it uses none."""
    spellings = (f"${{{TEMPORALITY_VARIABLE}}}", f"${TEMPORALITY_VARIABLE}")
    if not any(s in expr for s in spellings):
        return [("", expr)]
    out = []
    for function in TEMPORALITY_FUNCTIONS:
        text = expr
        for spelling in spellings:
            text = text.replace(spelling, function)
        out.append((function, text))
    return out


def native_otlp_dashboards() -> dict[str, Any]:
    """Dashboards for the native OTLP route (dotted names), by file name."""
    return {p.name: ch.load_json(p) for p in sorted(NATIVE_OTLP_GRAFANA_DIR.glob("*.json"))}


def prometheus_targets(panel: dict[str, Any]) -> list[dict[str, Any]]:
    """A panel's PromQL targets; the reconciliation panels read OTelLogs through Azure Monitor
    (KQL, analysed with the query packs) and have none."""
    return [t for t in panel.get("targets", [])
            if t.get("datasource", {}).get("type") == "prometheus"]


def native_otlp_rule_files() -> list[Path]:
    """Prometheus rule files for the native OTLP route."""
    return sorted(NATIVE_OTLP_RULES_DIR.glob("*.yaml"))


def native_otlp_names() -> tuple[frozenset[str], frozenset[str]]:
    """(metric names, label names) that the native OTLP route stores, from a real run: metric
    names stay as the exporter sends them, data-point and resource attributes become labels."""
    metrics = ch.observed_metrics()
    names = frozenset(m.name for m in metrics)
    labels = frozenset(k for m in metrics for k in m.point_attributes | m.resource_attributes)
    return names, labels


@dataclass(frozen=True, slots=True)
class PromqlResult:
    """Prometheus 3 parse of one expression: syntax errors, metric and label names used."""

    id: str
    errors: tuple[str, ...]
    metrics: frozenset[str]
    labels: frozenset[str]


def run_promql_check(exprs: Sequence[tuple[str, str]]) -> dict[str, PromqlResult]:
    """Parse (id, expr) pairs with @prometheus-io/lezer-promql (Prometheus 3 grammar) in one node
    process; results keyed by id."""
    node = ch.tool_path("node")
    ch.node_package("@prometheus-io/lezer-promql")
    proc = subprocess.run(
        [node, str(Path(__file__).with_name("promql_check.js"))],
        input=json.dumps([{"id": i, "expr": e} for i, e in exprs]),
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PROMQL_NODE_DIR": str(ch.NODE_MODULES)},
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"promql_check.js failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return {
        r["id"]: PromqlResult(
            r["id"],
            tuple(f"at {e['from']}: {e['excerpt']!r}" for e in r["errors"]),
            frozenset(r["metrics"]),
            frozenset(r["labels"]),
        )
        for r in json.loads(proc.stdout)
    }
