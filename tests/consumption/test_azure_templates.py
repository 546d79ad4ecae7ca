"""ARM template checks for config/azure: the custom tables match records.COLUMNS (a renamed field
breaks this), the Event Hubs data collection rule, its association and role assignments are
wired as Azure Monitor expects, and the log alert rules are complete for every landing path."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from scheduled_events_exporter.records import COLUMNS
from tests.consumption import consumption_helpers as ch

INGESTION = ch.AZURE_DIR / "event-hubs-ingestion.json"
ALERTS = ch.AZURE_DIR / "alert-rules.json"
ROLE_EVENT_HUBS_DATA_RECEIVER = "a638d3c7-ab3a-418d-83e6-5f17a39d4fde"
ROLE_EVENT_HUBS_DATA_SENDER = "2b629674-e913-4c01-ae53-ef4638d8f975"
TEMPLATES = sorted(ch.AZURE_DIR.glob("*.json"))


def resources(template: dict[str, Any], rtype: str) -> list[dict[str, Any]]:
    return [r for r in template["resources"] if r["type"] == rtype]


def table(name: str) -> dict[str, Any]:
    template = ch.load_json(INGESTION)
    (res,) = [
        r
        for r in resources(template, "Microsoft.OperationalInsights/workspaces/tables")
        if r["properties"]["schema"]["name"] == name
    ]
    return res


def test_transitions_table_matches_records_columns() -> None:
    # Same types; the tables API spells them its own way (dateTime), which the schema test enforces.
    res = table(ch.TRANSITIONS_TABLE)
    columns = [(c["name"], c["type"].lower()) for c in res["properties"]["schema"]["columns"]]
    assert columns == [(n, t.lower()) for n, t in COLUMNS]
    assert f"/{ch.TRANSITIONS_TABLE}'" in res["name"]


def test_metrics_table_matches_declared_columns() -> None:
    res = table(ch.METRICS_TABLE)
    columns = [(c["name"], c["type"].lower()) for c in res["properties"]["schema"]["columns"]]
    assert columns == [(n, t.lower()) for n, t in ch.METRICS_COLUMNS]


def test_every_column_is_described() -> None:
    for name in (ch.TRANSITIONS_TABLE, ch.METRICS_TABLE):
        for column in table(name)["properties"]["schema"]["columns"]:
            assert column.get("description"), (name, column["name"])


@pytest.mark.parametrize(
    "dcr",
    resources(ch.load_json(INGESTION), "Microsoft.Insights/dataCollectionRules"),
    ids=lambda r: r["name"],
)
def test_data_collection_rule_reads_event_hubs(dcr: dict[str, Any]) -> None:
    props = dcr["properties"]
    assert dcr["identity"]["type"] in ("SystemAssigned", "systemAssigned")
    (stream_name,) = props["streamDeclarations"]
    declared = [(c["name"], c["type"]) for c in props["streamDeclarations"][stream_name]["columns"]]
    assert declared == list(ch.EVENT_HUB_STREAM_COLUMNS)
    source = props["dataSources"]["dataImports"]["eventHub"]
    assert source["stream"] == stream_name
    assert source["consumerGroup"] and source["name"]
    assert props["dataCollectionEndpointId"]
    destinations = {d["name"] for d in props["destinations"]["logAnalytics"]}
    for flow in props["dataFlows"]:
        assert flow["streams"] == [stream_name]
        assert set(flow["destinations"]) <= destinations
        assert flow["transformKql"].lstrip().startswith("source")


def test_associations_are_scoped_to_the_event_hubs() -> None:
    # One rule per hub: the transitions rule on the transitions hub, the metrics rule on the
    # metrics hub (never the other way round, or each would ingest the other's messages).
    template = ch.load_json(INGESTION)
    assocs = resources(template, "Microsoft.Insights/dataCollectionRuleAssociations")
    pairs = {(a["scope"], a["properties"]["dataCollectionRuleId"]) for a in assocs}
    assert pairs == {
        ("[variables('eventHubId')]", "[variables('dcrId')]"),
        ("[variables('metricsEventHubId')]", "[variables('metricsDcrId')]"),
    }
    for var in ("eventHubId", "metricsEventHubId"):
        assert template["variables"][var].startswith(
            "[resourceId('Microsoft.EventHub/namespaces/eventhubs'"
        )


def test_role_assignments() -> None:
    template = ch.load_json(INGESTION)
    assignments = resources(template, "Microsoft.Authorization/roleAssignments")
    by_role: dict[str, dict[str, dict[str, Any]]] = {}
    for a in assignments:
        role_var = re.fullmatch(r"\[variables\('(\w+)'\)\]", a["properties"]["roleDefinitionId"])
        assert role_var, a
        guid = re.search(r"'([0-9a-f-]{36})'", template["variables"][role_var[1]])
        assert guid, role_var[1]
        by_role.setdefault(guid[1], {})[a["scope"]] = a
    hubs = {
        "[variables('eventHubId')]": "dcrId",
        "[variables('metricsEventHubId')]": "metricsDcrId",
    }
    receivers = by_role[ROLE_EVENT_HUBS_DATA_RECEIVER]
    assert set(receivers) == set(hubs)
    for scope, dcr in hubs.items():
        principal = receivers[scope]["properties"]["principalId"]
        assert "identity.principalId" in principal and f"variables('{dcr}')" in principal
    senders = by_role[ROLE_EVENT_HUBS_DATA_SENDER]
    assert set(senders) == set(hubs)
    for sender in senders.values():
        assert sender["properties"]["principalId"] == "[parameters('exporterPrincipalId')]"
        assert "empty(parameters('exporterPrincipalId'))" in sender["condition"]


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_template_references_resolve(path: Path) -> None:
    template = ch.load_json(path)
    assert template["$schema"].endswith("deploymentTemplate.json#")
    assert template["metadata"]["description"]
    text = path.read_text(encoding="utf-8")
    for name in re.findall(r"parameters\('(\w+)'\)", text):
        assert name in template["parameters"], name
    for name in re.findall(r"variables\('(\w+)'\)", text):
        assert name in template["variables"], name
    for res in template["resources"]:
        assert res["type"] and res["apiVersion"] and res["name"], res


ALERT_RULES = ch.load_json(ALERTS)["resources"]


def test_alert_rules_cover_the_four_conditions() -> None:
    names = {r["properties"]["displayName"] for r in ALERT_RULES}
    assert len(ALERT_RULES) == 4
    assert any("15 minutes" in n for n in names)
    assert any("unannounced" in n.lower() for n in names)
    assert any("silent" in n.lower() for n in names)
    assert any("disagrees with the platform" in n for n in names)


@pytest.mark.parametrize("rule", ALERT_RULES, ids=lambda r: r["name"])
def test_alert_rule_shape(rule: dict[str, Any], kusto_results: dict[str, dict[str, Any]]) -> None:
    template = ch.load_json(ALERTS)
    assert rule["type"] == "Microsoft.Insights/scheduledQueryRules"
    assert rule["kind"] == "LogAlert"
    props = rule["properties"]
    assert props["enabled"] is True
    assert 0 <= props["severity"] <= 4
    assert props["scopes"] == ["[parameters('workspaceResourceId')]"]
    for key in ("evaluationFrequency", "windowSize"):
        assert re.fullmatch(r"P(T\d+[MH]|\d+D)", props[key]), (key, props[key])
    (criterion,) = props["criteria"]["allOf"]
    assert criterion["timeAggregation"] == "Count"
    assert criterion["operator"] == "GreaterThan" and criterion["threshold"] == 0
    variables = re.findall(r"variables\('(\w+)'\)", criterion["query"])
    landings = sorted(re.fullmatch(r"kql[A-Z][a-z]+(\w+)", v)[1] for v in variables)  # type: ignore[index]
    assert landings == ["AppInsights", "EventHubs", "Otlp"], variables
    for var in variables:
        assert var in template["variables"]
        columns = dict(map(tuple, kusto_results[f"{ALERTS.relative_to(ch.REPO)}#{var}"]["columns"]))
        for dim in criterion["dimensions"]:
            assert dim["operator"] == "Include" and dim["values"] == ["*"]
            assert columns.get(dim["name"]) == "string", (var, dim["name"], columns)
