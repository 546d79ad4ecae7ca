"""What a real Azure deployment of config/azure and the Log Analytics dashboard needs, beyond KQL
that analyses clean: the templates validate against Azure's published resource manager
schemas; log alert rules can be created before their tables hold data, and stay valid when a table
goes silent; alert queries pass ago() a timespan literal; the event hub partition counts are
parameters; the data collection endpoint and rules default to the workspace's region; the Event
Hubs path uses one hub and one rule per record kind, so no transformation filters out more than
half of what it reads; and the dashboard's "All" covers every VM."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.consumption import arm_schemas
from tests.consumption import consumption_helpers as ch

INGESTION = ch.AZURE_DIR / "event-hubs-ingestion.json"
ALERTS = ch.AZURE_DIR / "alert-rules.json"
TEMPLATES = sorted(ch.AZURE_DIR.glob("*.json"))
LOG_ANALYTICS_DASHBOARD = ch.GRAFANA_DIR / "scheduled-events-log-analytics.json"


def resources(template: dict[str, Any], rtype: str) -> list[dict[str, Any]]:
    return [r for r in template["resources"] if r["type"] == rtype]


# ---------------------------------------------------------------------------- published schemas

needs_schemas = pytest.mark.skipif(bool(arm_schemas.MISSING), reason=arm_schemas.MISSING)



@needs_schemas
@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_template_validates_against_the_arm_schemas(path: Any) -> None:
    skip_unless_its_schemas_are_stored(path)
    problems = arm_schemas.validate_template(ch.load_json(path))
    assert problems == [], "\n".join(f"{p.where}: {p.message}" for p in problems)


@needs_schemas
def test_schema_check_catches_what_azure_would_reject() -> None:
    # Not vacuous: a misspelt property, a wrong enum spelling and an over-long name are reported.
    alerts = ch.load_json(ALERTS)
    alerts["resources"][0]["properties"]["skipQueryValidaton"] = True
    ingestion = ch.load_json(INGESTION)
    table = resources(ingestion, "Microsoft.OperationalInsights/workspaces/tables")[0]
    table["properties"]["schema"]["columns"][0]["type"] = "datetime"
    ingestion["parameters"]["consumerGroupName"]["defaultValue"] = "c" * 51
    messages = [p.message for p in arm_schemas.validate_template(alerts)]
    assert any("skipQueryValidaton" in m for m in messages), messages
    messages = [p.message for p in arm_schemas.validate_template(ingestion)]
    assert any("'datetime'" in m for m in messages), messages
    assert any("too long" in m for m in messages), messages


def skip_unless_its_schemas_are_stored(path: Any) -> None:
    missing = arm_schemas.missing_provider_schemas(ch.load_json(path))
    if missing:
        pytest.skip(f"{path.name}: add {', '.join(missing)} (Azure/azure-resource-manager-schemas, "
                    f"schemas/) to the schema directory ({arm_schemas.SCHEMA_DIR})")


@needs_schemas
@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_every_resource_type_has_a_stored_schema(path: Any) -> None:
    skip_unless_its_schemas_are_stored(path)
    for res in ch.load_json(path)["resources"]:
        assert arm_schemas.resource_definition(res["type"], res["apiVersion"]), res["type"]


def test_table_columns_use_the_tables_api_spelling() -> None:
    # The tables API enumerates dateTime; a DCR stream declaration enumerates datetime.
    template = ch.load_json(INGESTION)
    for table in resources(template, "Microsoft.OperationalInsights/workspaces/tables"):
        types = {c["type"] for c in table["properties"]["schema"]["columns"]}
        assert "dateTime" in types and "datetime" not in types
    for dcr in resources(template, "Microsoft.Insights/dataCollectionRules"):
        for stream in dcr["properties"]["streamDeclarations"].values():
            assert {c["type"] for c in stream["columns"]} >= {"datetime"}


# --------------------------------------------------------------------------------- alert rules

ALERT_RULES = ch.load_json(ALERTS)["resources"]


@pytest.mark.parametrize("rule", ALERT_RULES, ids=lambda r: r["name"])
def test_rules_can_be_created_before_their_tables_hold_data(rule: dict[str, Any]) -> None:
    # Azure validates a log alert's query at creation; custom tables may not exist yet.
    assert rule["properties"]["skipQueryValidation"] is True


@pytest.mark.parametrize("query", ch.alert_queries_without_tables(), ids=lambda q: q.id)
def test_alert_queries_stay_valid_without_their_tables(
    query: ch.KqlQuery, kusto_results: dict[str, dict[str, Any]]
) -> None:
    # A table silent for 30 days makes a plain query fail, and a rule failing for a week is
    # disabled; a fuzzy union with an empty typed datatable keeps the query resolvable. Only the
    # "fuzzy name refers to no table" warning (KS205) may remain.
    result = kusto_results[query.id]
    problems = [d for d in result["diagnostics"] if d["code"] != "KS205"]
    assert problems == [], problems
    assert any(d["code"] == "KS205" for d in result["diagnostics"]), "no fuzzy union"
    columns = dict(map(tuple, result["columns"]))
    assert columns.get("VmName") == "string", columns


_AGO = re.compile(r"\bago\(\s*([^)]*?)\s*\)")
_TIMESPAN_LITERAL = re.compile(r"\d+(\.\d+)?(d|h|m|s|ms|microsecond|tick)")


@pytest.mark.parametrize("query", ch.alert_rule_queries(), ids=lambda q: q.id)
def test_alert_ago_takes_a_timespan_literal(query: ch.KqlQuery) -> None:
    code = "\n".join(ln for ln in query.text.splitlines() if not ln.lstrip().startswith("//"))
    args = _AGO.findall(code)
    for arg in args:
        assert _TIMESPAN_LITERAL.fullmatch(arg), f"ago({arg}) in {query.id}"


@pytest.mark.parametrize("rule", ALERT_RULES, ids=lambda r: r["name"])
def test_alert_rule_respects_the_documented_query_limits(rule: dict[str, Any]) -> None:
    # "Create or edit a log search alert rule": no bag_unpack(), pivot(), narrow(); AggregatedValue
    # is reserved; all data in the rule's properties at most 64 KB (for either landing path).
    variables = ch.load_json(ALERTS)["variables"]
    (criterion,) = rule["properties"]["criteria"]["allOf"]
    for var in re.findall(r"variables\('(\w+)'\)", criterion["query"]):
        text = variables[var]
        for banned in ("bag_unpack(", "pivot(", "narrow(", "AggregatedValue"):
            assert banned not in text, (var, banned)
        props = {**rule["properties"], "criteria": {"allOf": [{**criterion, "query": text}]}}
        assert len(ch.json.dumps(props).encode()) <= 64 * 1024, var


def test_ago_check_rejects_variables() -> None:
    assert not _TIMESPAN_LITERAL.fullmatch(_AGO.findall("where T < ago(silence)")[0])


def test_event_hubs_silent_window_exceeds_two_heartbeats() -> None:
    # Snapshots are sent on change and at least every SEE_EVENTHUB_HEARTBEAT (300 s).
    variables = ch.load_json(ALERTS)["variables"]
    assert "ago(15m)" in variables["kqlSilentEventHubs"]
    pack = (ch.KQL_DIR / "eventhubs" / "silent-exporters.kql").read_text(encoding="utf-8")
    assert "let silence = 15m;" in pack
    dashboard = LOG_ANALYTICS_DASHBOARD.read_text(encoding="utf-8")
    assert "ago(15m)" in dashboard and "ago(10m)" not in dashboard


# ------------------------------------------------------------------------- ingestion template


def test_partition_counts_are_parameters() -> None:
    # Standard tier: the count is set when a hub is created and cannot change afterwards.
    template = ch.load_json(INGESTION)
    hubs = resources(template, "Microsoft.EventHub/namespaces/eventhubs")
    assert len(hubs) == 2
    for hub in hubs:
        count = hub["properties"]["partitionCount"]
        param = re.fullmatch(r"\[parameters\('(\w+)'\)\]", count)
        assert param, count
        spec = template["parameters"][param[1]]
        assert spec["type"] == "int" and spec["minValue"] >= 1
        assert "existing" in spec["metadata"]["description"] or "same rule" in spec[
            "metadata"]["description"]


def test_endpoint_and_rules_take_the_workspace_region_as_a_required_parameter() -> None:
    # ARM resolves a resource's location before the deployment runs: reference() is refused
    # there, so the region is a required parameter (docs/consumption.md).
    template = ch.load_json(INGESTION)
    location = template["parameters"]["location"]
    assert "defaultValue" not in location and location["minLength"] == 1
    assert "workspace" in location["metadata"]["description"]
    regional = [
        *resources(template, "Microsoft.Insights/dataCollectionEndpoints"),
        *resources(template, "Microsoft.Insights/dataCollectionRules"),
    ]
    assert len(regional) == 3
    for res in regional:
        assert res["location"] == "[parameters('location')]", res["name"]
    assert "resourceGroup().location" not in INGESTION.read_text(encoding="utf-8")


def _kind_filter(flow: dict[str, Any]) -> str:
    (line,) = [ln for ln in flow["transformKql"].splitlines() if "RecordKind" in ln]
    return line


def test_one_hub_and_one_rule_per_record_kind() -> None:
    # Azure Monitor bills the data a transformation filters out above 50 % of what it reads: with
    # both kinds on one hub, the transitions flow would drop every metrics snapshot. Each rule reads
    # its own hub through its own consumer group and keeps everything it reads there.
    template = ch.load_json(INGESTION)
    params = template["parameters"]
    assert params["eventHubName"]["defaultValue"] != params["metricsEventHubName"]["defaultValue"]
    dcrs = {r["name"]: r for r in resources(template, "Microsoft.Insights/dataCollectionRules")}
    assert set(dcrs) == {
        "[parameters('dataCollectionRuleName')]",
        "[parameters('metricsDataCollectionRuleName')]",
    }
    outputs = {}
    for name, dcr in dcrs.items():
        (flow,) = dcr["properties"]["dataFlows"]
        outputs[name] = (flow["outputStream"], _kind_filter(flow))
        assert dcr["properties"]["dataSources"]["dataImports"]["eventHub"]["consumerGroup"]
    t_out, t_filter = outputs["[parameters('dataCollectionRuleName')]"]
    m_out, m_filter = outputs["[parameters('metricsDataCollectionRuleName')]"]
    assert t_out == f"Custom-{ch.TRANSITIONS_TABLE}" and m_out == f"Custom-{ch.METRICS_TABLE}"
    # The filters only matter when the hubs are one (exporters without SEE_EVENTHUB_METRICS_NAME).
    assert '"transition"' in t_filter and '"metrics"' in m_filter
    groups = {params["consumerGroupName"]["defaultValue"],
              params["metricsConsumerGroupName"]["defaultValue"]}
    assert len(groups) == 2


def test_shared_hub_mode_declares_no_resource_twice() -> None:
    # metricsEventHubName = eventHubName must still deploy: the metrics hub and the second sender
    # assignment are skipped, everything else has distinct names.
    template = ch.load_json(INGESTION)
    assert template["variables"]["sharedHub"] == (
        "[equals(parameters('metricsEventHubName'), parameters('eventHubName'))]"
    )
    skipped = [
        r for r in template["resources"] if "variables('sharedHub')" in r.get("condition", "")
    ]
    assert sorted(r["type"] for r in skipped) == [
        "Microsoft.Authorization/roleAssignments",
        "Microsoft.EventHub/namespaces/eventhubs",
    ]
    # Even counting the skipped ones (in case duplicates were checked before conditions), every
    # resource keeps a distinct type, name and scope once the metrics hub is the transitions hub.
    shared = (
        INGESTION.read_text(encoding="utf-8")
        .replace("parameters('metricsEventHubName')", "parameters('eventHubName')")
        .replace("variables('metricsEventHubId')", "variables('eventHubId')")
    )
    identities = [(r["type"], r["name"], r.get("scope", ""))
                  for r in ch.json.loads(shared)["resources"]]
    assert len(identities) == len(set(identities)), identities


def test_exporter_variables_match_the_hubs() -> None:
    # Transitions go to SEE_EVENTHUB_NAME, snapshots to SEE_EVENTHUB_METRICS_NAME.
    params = ch.load_json(INGESTION)["parameters"]
    assert "SEE_EVENTHUB_NAME" in params["eventHubName"]["metadata"]["description"]
    assert "SEE_EVENTHUB_METRICS_NAME" in params["metricsEventHubName"]["metadata"]["description"]


# ------------------------------------------------------------------ Log Analytics dashboard


def test_every_all_option_has_an_all_value() -> None:
    # Without allValue, "All" expands to the options the variable query found (VMs with a row in
    # the window); the Azure Monitor data source's $__contains maps the allValue `all` to 1 == 1.
    for name, dashboard in ch.grafana_dashboards().items():
        for var in dashboard.get("templating", {}).get("list", []):
            if var.get("includeAll"):
                assert var.get("allValue"), f"{name}: variable {var['name']}"
    (vm,) = [
        v for v in ch.load_json(LOG_ANALYTICS_DASHBOARD)["templating"]["list"] if v["name"] == "vm"
    ]
    assert vm["allValue"] == "all"
    query = vm["query"]["azureLogAnalytics"]["query"]
    assert ch.TRANSITIONS_TABLE in query and ch.METRICS_TABLE in query


@pytest.mark.parametrize(
    "query", ch.grafana_kql_queries_all_selected(), ids=lambda q: q.id
)
def test_dashboard_queries_with_all_selected(
    query: ch.KqlQuery, kusto_results: dict[str, dict[str, Any]]
) -> None:
    assert "$__contains" not in query.text
    problems = kusto_results[query.id]["diagnostics"]
    assert problems == [], problems


def test_all_expansion_is_the_data_source_macro() -> None:
    text = ch.expand_grafana_macros("T | where $__contains(VmName, $vm)", all_value="all")
    assert text == "T | where 1 == 1"
