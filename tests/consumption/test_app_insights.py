"""The Application Insights landing (the Collector's ``azuremonitor`` exporter: log records in
AppTraces with every attribute a string in Properties, metric points in AppMetrics with histogram
buckets dropped): its query pack, log alert rules and dashboard. Their KQL is analysed with the
other packs' (test_kql.py, test_azure_deploy.py) against the AppTraces and AppMetrics schemas
Azure Monitor publishes (consumption_helpers.APP_TRACES_COLUMNS / APP_METRICS_COLUMNS); here:
the pack stays the OTLP pack, nothing reads another landing's tables or typed columns, and the
dashboard covers what the other dashboards do."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.consumption import app_insights_helpers as ah
from tests.consumption import consumption_helpers as ch

PACK = ch.KQL_DIR / "appinsights"
OTEL_PACK = ch.KQL_DIR / "otel"
DASHBOARDS = ch.app_insights_dashboards()
#: What only another landing has: its tables, or OTelLogs' typed attribute columns.
OTHER_LANDINGS = re.compile(
    rf"\b({ch.TRANSITIONS_TABLE}|{ch.METRICS_TABLE}|{ch.OTEL_LOGS_TABLE}|ResourceAttributes|"
    r"Attributes)\b")


def _code(text: str) -> str:
    """KQL without its // comments."""
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def app_insights_kql() -> list[ch.KqlQuery]:
    """Every KQL text of this landing: pack, alert rule variables, dashboard."""
    tables = set(ch.landing_tables("appinsights"))
    return [q for q in ch.all_checked_kql() if set(q.tables) == tables]


#: The pack's files but those written for AppMetrics (the heartbeat) rather than translated.
TRANSLATED = [p for p in sorted(PACK.glob("*.kql")) if p.name not in ah.OWN_QUERIES]


@pytest.mark.parametrize("path", TRANSLATED, ids=lambda p: p.name)
def test_the_pack_is_the_otlp_pack_read_from_app_traces(path: Any) -> None:
    otel = (OTEL_PACK / path.name).read_text(encoding="utf-8")
    assert path.read_text(encoding="utf-8") == ah.app_insights_query(otel), (
        "regenerate: app_insights_helpers.app_insights_query(config/kql/otel/<file>)")


def test_every_landing_kql_is_checked_and_reads_only_app_insights() -> None:
    queries = app_insights_kql()
    ids = {q.id for q in queries}
    assert {f"config/kql/appinsights/{p.name}" for p in PACK.glob("*.kql")} <= ids
    assert any("#kqlSilentAppInsights" in i for i in ids)
    assert any(i.startswith("scheduled-events-app-insights.json") for i in ids)
    for query in queries:
        assert not OTHER_LANDINGS.search(_code(query.text)), query.id
        # Every attribute arrives as a string: a typed read must go through tostring() first.
        typed = re.findall(r"\b(?:toint|toreal|tobool|todynamic|todatetime)\(Properties\[",
                           query.text)
        assert typed == [], query.id


def test_the_silent_exporter_rule_and_query_use_the_metric_heartbeat() -> None:
    template = ch.load_json(ch.AZURE_DIR / "alert-rules.json")
    rule = template["variables"]["kqlSilentAppInsights"]
    pack = (PACK / "silent-exporters.kql").read_text(encoding="utf-8")
    for text in (rule, pack):
        assert '"azure.scheduled_events.imds.staleness"' in text and "AppMetrics" in text
    assert "ago(15m)" in rule and "let silence = 15m;" in pack
    assert template["parameters"]["landingPath"]["allowedValues"] == [
        "eventhubs", "otlp", "appinsights"]


def test_dashboard_type_checks(tsc_errors: dict[str, list[str]]) -> None:
    assert DASHBOARDS
    for name in DASHBOARDS:
        errors = tsc_errors[f"grafana_{ch.ts_ident(name)}.ts"]
        assert errors == [], "\n".join(errors)


def test_dashboard_covers_what_the_log_analytics_dashboard_does() -> None:
    (dashboard,) = DASHBOARDS.values()
    (reference,) = [d for d in ch.grafana_dashboards().values()
                    if d["uid"] == "azure-scheduled-events-la"]
    assert [p["title"] for p in ch.iter_panels(dashboard)] == [
        p["title"] for p in ch.iter_panels(reference)]
    queries = [t["azureLogAnalytics"] for p in ch.iter_panels(dashboard) for t in p["targets"]]
    assert all(q["resources"] == ["$workspace"] for q in queries)
    text = " ".join(q["query"] for q in queries)
    assert ch.APP_TRACES_TABLE in text and ch.APP_METRICS_TABLE in text
    assert dashboard["uid"] != reference["uid"]
