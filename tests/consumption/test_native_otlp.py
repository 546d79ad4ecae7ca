"""Native OTLP route checks (Azure Monitor workspace fed by Azure Monitor's OTLP ingestion, where
metric names stay dotted): the rules and the dashboard variant parse with a Prometheus 3 grammar
(quoted UTF-8 names; promtool 2.x cannot), and use only metric and label names that a real exporter
run delivered to a real OTLP receiver, so a renamed instrument or attribute breaks this test
instead of silently breaking the alerts."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.consumption import consumption_helpers as ch
from tests.consumption import native_otlp_helpers as nh

RULE_FILES = nh.native_otlp_rule_files()
DASHBOARDS = nh.native_otlp_dashboards()


def rules() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            for rule in group["rules"]:
                out.append((f"{path.name}#{rule.get('alert') or rule.get('record')}", rule))
    return out


def dashboard_exprs() -> list[tuple[str, str]]:
    """(id, expr) of every dashboard target, Grafana macros and variables expanded; a target
    that reads counters appears once per temporality (the variable's two functions)."""
    out = []
    for name, dashboard in DASHBOARDS.items():
        for panel in ch.iter_panels(dashboard):
            for target in nh.prometheus_targets(panel):
                where = f"{name}#panel{panel['id']}/{target['refId']}"
                for function, expr in nh.expand_temporality(target["expr"]):
                    out.append((f"{where}/{function}" if function else where,
                                ch.expand_promql_macros(expr)))
    return out


def all_exprs() -> list[tuple[str, str]]:
    return [(where, str(rule["expr"])) for where, rule in rules()] + dashboard_exprs()


@pytest.fixture(scope="module")
def parsed() -> dict[str, nh.PromqlResult]:
    # A translated name and a syntax error must be reported: the checker is not vacuous.
    probes = [("probe#translated", "azure_scheduled_events_pending"), ("probe#broken", 'x{"a"=')]
    return nh.run_promql_check([*all_exprs(), *probes])


def test_there_are_native_rules_and_a_dashboard() -> None:
    alerts = {rule.get("alert") for _, rule in rules()}
    assert {
        "ScheduledEventImpactfulImminent",
        "ScheduledEventUnannouncedStart",
        "ScheduledEventsExporterSilent",
        "ScheduledEventsImdsStale",
        "ScheduledEventsExportFailing",
    } <= alerts
    assert DASHBOARDS


def test_checker_is_not_vacuous(parsed: dict[str, nh.PromqlResult]) -> None:
    assert parsed["probe#broken"].errors
    names, _ = nh.native_otlp_names()
    assert not parsed["probe#translated"].metrics <= names


@pytest.mark.parametrize(("where", "expr"), all_exprs(), ids=[w for w, _ in all_exprs()])
def test_parses_with_prometheus_3_grammar(
    where: str, expr: str, parsed: dict[str, nh.PromqlResult]
) -> None:
    assert parsed[where].errors == (), f"{where}: {parsed[where].errors}\n{expr}"


@pytest.mark.parametrize(("where", "expr"), all_exprs(), ids=[w for w, _ in all_exprs()])
def test_uses_only_names_the_exporter_emits(
    where: str, expr: str, parsed: dict[str, nh.PromqlResult]
) -> None:
    names, labels = nh.native_otlp_names()
    result = parsed[where]
    assert result.metrics, f"{where}: selects no metric"
    assert result.metrics <= names, f"{where}: {sorted(result.metrics - names)} not emitted"
    unknown = result.labels - labels - nh.NATIVE_OTLP_QUERY_LABELS
    assert not unknown, f"{where}: labels {sorted(unknown)} are neither attributes nor resource"
    # Dotted names only exist quoted: a translated (underscore) spelling would match nothing.
    assert not any(n.startswith("azure_scheduled_events") for n in result.metrics), where


def test_silent_window_exceeds_two_otlp_heartbeats() -> None:
    # OTLP metrics are exported on change and at least every OTEL_METRIC_EXPORT_INTERVAL (60 s).
    found = [r for _, r in rules() if r.get("alert") == "ScheduledEventsExporterSilent"]
    assert len(found) == len(RULE_FILES)  # one per temporality
    for rule in found:
        expr = str(rule["expr"])
        assert "[5m]" in expr and "[1h]" in expr, expr


#: PromQL functions that assume cumulative counters (a reset-aware difference of running totals).
CUMULATIVE_ONLY = ("increase(", "rate(", "irate(", "resets(")


def _alerts(path: Path) -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"]}


def test_the_delta_rules_are_the_cumulative_ones_with_sums_over_time() -> None:
    """Delta points are per-export counts: what was counted in a window is their sum_over_time(),
    and increase()/rate() on them is wrong (Azure Monitor, "PromQL best practices for
    OpenTelemetry metrics"). The delta file differs from the cumulative one in exactly that."""
    cumulative = _alerts(nh.NATIVE_OTLP_RULES_DIR / "scheduled-events-alerts.yaml")
    delta = _alerts(nh.NATIVE_OTLP_RULES_DIR / "scheduled-events-alerts-delta.yaml")
    assert delta.keys() == cumulative.keys()
    converted = 0
    for name, rule in delta.items():
        expr = str(rule["expr"])
        assert not any(f in expr for f in CUMULATIVE_ONLY), f"{name}: {expr}"
        wanted = str(cumulative[name]["expr"])
        converted += "increase(" in wanted
        assert expr == wanted.replace("increase(", "sum_over_time("), name
        assert {k: v for k, v in rule.items() if k != "expr"} == {
            k: v for k, v in cumulative[name].items() if k != "expr"}, name
    assert converted >= 2  # the counter alerts (outcomes unknown, export failing)


def test_the_dashboard_reads_counters_as_the_chosen_temporality_says() -> None:
    """Every counter or histogram query goes through the dashboard's temporality variable, whose
    options are increase (cumulative) and sum_over_time (delta); gauges need neither."""
    for name, dashboard in DASHBOARDS.items():
        (variable,) = [v for v in dashboard["templating"]["list"]
                       if v["name"] == nh.TEMPORALITY_VARIABLE]
        assert [o["value"] for o in variable["options"]] == ["increase", "sum_over_time"]
        assert variable["current"]["value"] == "increase"  # the SDK's default, cumulative
        for panel in ch.iter_panels(dashboard):
            for target in nh.prometheus_targets(panel):
                expr = target["expr"]
                assert not any(f in expr for f in CUMULATIVE_ONLY), f"{name}#{panel['id']}"


def test_dashboard_shows_every_instrument(parsed: dict[str, nh.PromqlResult]) -> None:
    shown = set().union(*(parsed[w].metrics for w, _ in dashboard_exprs()))
    names, _ = nh.native_otlp_names()
    # document_incarnation is left out, as on the scrape-route dashboard.
    assert names - {"azure.scheduled_events.document_incarnation"} <= shown


def test_dashboard_type_checks(tsc_errors: dict[str, list[str]]) -> None:
    for name in DASHBOARDS:
        errors = tsc_errors[f"grafana_{ch.ts_ident(name)}.ts"]
        assert errors == [], "\n".join(errors)


def test_dashboard_uses_the_prometheus_data_source() -> None:
    # Metrics from the Azure Monitor workspace (Prometheus); the reconciliation panels alone read
    # OTelLogs in the Log Analytics workspace, through a data source variable of their own.
    for name, dashboard in DASHBOARDS.items():
        assert dashboard["uid"] and dashboard["description"], name
        logs = 0
        for panel in ch.iter_panels(dashboard):
            for target in panel["targets"]:
                if target in nh.prometheus_targets(panel):
                    assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
                    continue
                logs += 1
                assert target["datasource"] == {"type": "grafana-azure-monitor-datasource",
                                                "uid": "${logs}"}, panel["title"]
                query = target["azureLogAnalytics"]
                assert query["resources"] == ["$workspace"]
                assert ch.OTEL_LOGS_TABLE in query["query"], panel["title"]
        assert logs == 2, name


def test_rules_are_not_fed_to_promtool_2() -> None:
    # The translated-name rules are checked with promtool (test_prometheus.py); these live apart so
    # that check never sees quoted names, and each route loads only its own file.
    assert all(p.parent == nh.NATIVE_OTLP_RULES_DIR for p in RULE_FILES)
    assert not any(p.parent == nh.NATIVE_OTLP_RULES_DIR for p in ch.PROMETHEUS_DIR.glob("*.yaml"))


def test_docs_send_grpc_to_the_azure_monitor_agent() -> None:
    # The Azure Monitor agent receives OTLP over gRPC only, metrics on 4317 and logs on 4319; the
    # exporter's default protocol is http/protobuf, so the settings must say grpc explicitly.
    text = (ch.REPO / "docs" / "consumption.md").read_text(encoding="utf-8")
    section = text.split("### With the Azure Monitor agent", 1)[1].split("\n### ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    settings = dict(
        line.split("#", 1)[0].strip().split("=", 1) for line in block.splitlines() if "=" in line
    )
    assert settings["OTEL_EXPORTER_OTLP_PROTOCOL"] == "grpc"
    assert settings["OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"].endswith(":4317")
    assert settings["OTEL_EXPORTER_OTLP_LOGS_ENDPOINT"].endswith(":4319")
    assert settings["OTEL_RESOURCE_ATTRIBUTES"].startswith("microsoft.applicationId=")
    assert "OtlpApplicationInsights" in text


def test_rule_templates_and_structure_pass_promtool(tmp_path: Path) -> None:
    # promtool 2.x cannot parse the quoted names, but it still checks everything else: rule
    # structure, `for` durations and the Go templates of labels and annotations (which read the
    # dotted labels through `index $labels "host.name"`). The expressions are swapped for a
    # placeholder it can parse; test_parses_with_prometheus_3_grammar covers them.
    promtool = ch.tool_path("promtool")
    for path in RULE_FILES:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        for group in doc["groups"]:
            for rule in group["rules"]:
                rule["expr"] = "vector(1)"
        copy = tmp_path / path.name
        copy.write_text(yaml.safe_dump(doc), encoding="utf-8")
        proc = subprocess.run(
            [promtool, "check", "rules", str(copy)], capture_output=True, text=True, check=False
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_rate_panels_span_at_least_two_pushes() -> None:
    """OTLP pushes arrive every 60 s; rate() and increase() need two samples in their window.
    Grafana's $__rate_interval is max($__interval + scrape interval, 4 x scrape interval), and a
    panel's min interval floors $__interval (grafana/grafana#84063), so 2m guarantees two."""
    for dashboard in DASHBOARDS.values():
        for panel in dashboard["panels"]:
            exprs = [t.get("expr", "") for t in panel.get("targets", [])]
            if any("$__rate_interval" in e for e in exprs):
                interval = panel.get("interval", "")
                assert interval.endswith("m") and int(interval[:-1]) >= 2, panel["title"]


def _legacy(expr: str) -> str:
    """A native-OTLP expression in the pre-UTF-8 spelling promtool 2.x parses: quoted dotted
    metric and label names become underscores (values are left alone). Only for evaluating
    the rules' logic on a real Prometheus engine; the names themselves are checked above."""
    expr = re.sub(r'\{"([\w.]+)"\}', lambda m: m[1].replace(".", "_"), expr)
    expr = re.sub(r'\{"([\w.]+)", ', lambda m: m[1].replace(".", "_") + "{", expr)
    expr = re.sub(r'"([\w.]+)"(?=\s*(?:=|!=|=~|!~)\s*")', lambda m: m[1].replace(".", "_"), expr)
    return re.sub(r"\b(by|on) \(([^)]*)\)",
                  lambda m: f"{m[1]} ({m[2].replace(chr(34), '').replace('.', '_')})", expr)


#: Delta points as the exporter sends them with OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE=
#: delta (one point per export, holding what was counted since the previous one; no point when
#: nothing was), and when each counter alert should fire on them.
DELTA_CASES = {
    # One outcome_unknown end, exported once: a single point of 1.
    "ScheduledEventOutcomesUnknown": (
        'azure_scheduled_events_transitions{transition="outcome_unknown",'
        'service_instance_id="vm-1",host_name="vm-1"}', "1 _x59", "10m",
        {"severity": "info", "service_instance_id": "vm-1", "host_name": "vm-1"}),
    # A sink failing at every 60 s export for 40 minutes: a point of 1 each time.
    "ScheduledEventsExportFailing": (
        'azure_scheduled_events_export_failures{sink="otlp",signal="logs",'
        'service_instance_id="vm-1",host_name="vm-1"}', "1x40", "35m",
        {"severity": "warning", "service_instance_id": "vm-1", "host_name": "vm-1",
         "sink": "otlp", "signal": "logs"}),
}


@pytest.mark.parametrize("variant", ["delta", "cumulative"])
def test_on_delta_points_only_the_delta_rules_fire(variant: str, tmp_path: Path) -> None:
    """Prometheus' own engine (promtool test rules) on delta points: the delta file's counter
    alerts fire, and the cumulative file's stay silent (increase() of one point, or of a run of
    1s, is nothing), which is why a user who sets delta must load the delta file."""
    name = "scheduled-events-alerts-delta.yaml" if variant == "delta" else (
        "scheduled-events-alerts.yaml")
    alerts = _alerts(nh.NATIVE_OTLP_RULES_DIR / name)
    rules = [{"alert": a, "expr": _legacy(str(alerts[a]["expr"])), "labels": alerts[a]["labels"],
              **({"for": alerts[a]["for"]} if "for" in alerts[a] else {})} for a in DELTA_CASES]
    group = {"name": "g", "rules": rules}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": [group]}))
    tests = [{
        "interval": "1m",
        "input_series": [{"series": series, "values": values}],
        "alert_rule_test": [{"eval_time": at, "alertname": alert, "exp_alerts": (
            [{"exp_labels": labels}] if variant == "delta" else [])}],
    } for alert, (series, values, at, labels) in DELTA_CASES.items()]
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(
        {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}))
    proc = subprocess.run([ch.tool_path("promtool"), "test", "rules", "tests.yaml"],
                          cwd=tmp_path, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
