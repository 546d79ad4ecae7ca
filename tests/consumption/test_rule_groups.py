"""Azure Monitor managed Prometheus rule groups (config/azure/prometheus-rule-groups.json): in
step with config/prometheus/, valid against the published prometheusRuleGroups schema, every
expression parsing (promtool for the translated names, the Prometheus 3 grammar for native OTLP),
durations in ISO 8601."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.consumption import arm_schemas
from tests.consumption import consumption_helpers as ch
from tests.consumption import native_otlp_helpers as nh

REPO = Path(__file__).resolve().parents[2]
TEMPLATE_PATH = REPO / "config" / "azure" / "prometheus-rule-groups.json"
TEMPLATE = json.loads(TEMPLATE_PATH.read_text())
SOURCES = {"scrape": REPO / "config" / "prometheus" / "scheduled-events-alerts.yaml",
           "native-otlp": REPO / "config" / "prometheus" / "native-otlp" /
           "scheduled-events-alerts.yaml",
           "native-otlp-delta": REPO / "config" / "prometheus" / "native-otlp" /
           "scheduled-events-alerts-delta.yaml"}


def group(route: str) -> dict[str, Any]:
    (found,) = [r for r in TEMPLATE["resources"] if f"'{route}')" in r["condition"]]
    return found


def test_template_is_generated_from_the_rule_files() -> None:
    done = subprocess.run([sys.executable, "tools/rule_groups.py", "--check"], cwd=REPO,
                          check=False)
    assert done.returncode == 0, "run: python tools/rule_groups.py"


@pytest.mark.skipif(bool(arm_schemas.MISSING), reason=arm_schemas.MISSING)
def test_template_validates_against_the_published_schema() -> None:
    problems = arm_schemas.validate_template(TEMPLATE)
    assert not problems, "\n".join(f"{p}" for p in problems)


@pytest.mark.parametrize("route", sorted(SOURCES))
def test_every_alert_has_its_counterpart(route: str) -> None:
    source = yaml.safe_load(SOURCES[route].read_text())
    wanted = {r["alert"]: r for g in source["groups"] for r in g["rules"]}
    rules = {r["alert"]: r for r in group(route)["properties"]["rules"]}
    assert rules.keys() == wanted.keys()
    for name, rule in rules.items():
        assert rule["expression"] == wanted[name]["expr"].strip()
        assert rule["labels"]["severity"] == wanted[name]["labels"]["severity"]
        severity = rule["labels"]["severity"]
        assert rule["severity"] == {"critical": 0, "warning": 2, "info": 3}[severity]
        assert set(rule["annotations"]) == set(wanted[name]["annotations"])
        if "for" in wanted[name]:
            assert re.fullmatch(r"PT(\d+H)?(\d+M)?(\d+S)?", rule["for"]), rule["for"]


def test_native_otlp_group_never_sets_a_cluster() -> None:
    assert "clusterName" not in group("native-otlp")["properties"]
    assert "clusterName" not in group("native-otlp-delta")["properties"]
    assert "clusterName" in group("scrape")["properties"]
    assert group("scrape")["properties"]["interval"] == "PT1M"


def test_translated_expressions_pass_promtool(tmp_path: Path) -> None:
    rules = [{"alert": r["alert"], "expr": r["expression"]}
             for r in group("scrape")["properties"]["rules"]]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": rules}]}))
    done = subprocess.run([ch.tool_path("promtool"), "check", "rules", str(path)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("route", ["native-otlp", "native-otlp-delta"])
def test_native_expressions_parse_with_the_prometheus_3_grammar(route: str) -> None:
    exprs = [(r["alert"], r["expression"]) for r in group(route)["properties"]["rules"]]
    results = nh.run_promql_check(exprs)
    assert all(not results[name].errors for name, _ in exprs), results
