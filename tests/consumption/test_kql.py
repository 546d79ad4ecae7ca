"""KQL consumption checks: every query the project ships parses and analyses cleanly against the
real table schemas (AzureScheduledEvents_CL from records.COLUMNS, the metrics snapshot table,
OTelLogs, and a DCR's Event Hubs input stream), and the DCR transforms produce exactly the
table's columns."""

from __future__ import annotations

import re
from typing import Any

import pytest

from scheduled_events_exporter.records import COLUMNS
from tests.consumption import consumption_helpers as ch

QUERIES = ch.all_checked_kql()

#: KQL the Azure Monitor transformation engine accepts (data-collection-transformations-kql).
DCR_TABULAR_OPERATORS = {
    "extend",
    "project",
    "print",
    "where",
    "parse",
    "project-away",
    "project-rename",
    "datatable",
    "columnifexists",
}
DCR_FUNCTIONS = {
    "tobool",
    "todatetime",
    "todouble",
    "toreal",
    "toguid",
    "toint",
    "tolong",
    "tostring",
    "totimespan",
    "ago",
    "datetime_add",
    "datetime_diff",
    "now",
    "array_length",
    "pack_array",
    "pack",
    "parse_json",
    "zip",
    "abs",
    "bin",
    "floor",
    "ceiling",
    "round",
    "case",
    "iif",
    "max_of",
    "min_of",
    "extract",
    "indexof",
    "isempty",
    "isnotempty",
    "split",
    "strcat",
    "strcat_delim",
    "strlen",
    "substring",
    "tolower",
    "toupper",
    "gettype",
    "isnotnull",
    "isnull",
}


def test_checker_reports_unknown_columns(kusto_results: dict[str, dict[str, Any]]) -> None:
    diagnostics = kusto_results[ch.SELF_TEST_QUERY.id]["diagnostics"]
    assert any("EventTypo" in d["excerpt"] for d in diagnostics), diagnostics


@pytest.mark.parametrize("query", QUERIES, ids=[q.id for q in QUERIES])
def test_kql_has_no_diagnostics(
    query: ch.KqlQuery, kusto_results: dict[str, dict[str, Any]]
) -> None:
    result = kusto_results[query.id]
    problems = [
        f"{d['severity']} {d['code']}: {d['message']} near {d['excerpt']!r}"
        for d in result["diagnostics"]
    ]
    assert problems == [], "\n".join(problems)


def test_query_pack_covers_every_landing_path() -> None:
    eventhubs = {p.name for p in (ch.KQL_DIR / "eventhubs").glob("*.kql")}
    otel = {p.name for p in (ch.KQL_DIR / "otel").glob("*.kql")}
    appinsights = {p.name for p in (ch.KQL_DIR / "appinsights").glob("*.kql")}
    required = {
        "pending-now.kql",
        "upcoming-maintenance.kql",
        "event-timeline.kql",
        "notice-vs-minimum.kql",
        "unannounced-events.kql",
        "cancellations.kql",
        "observation-gaps.kql",
        "fleet-heatmap.kql",
        "silent-exporters.kql",
        "unknown-outcomes.kql",
        "late-first-sight.kql",
        "verdict-agreement.kql",
        "uncovered-vms.kql",
    }
    assert required <= eventhubs
    assert eventhubs == otel == appinsights
    assert {p.parent.name for p in ch.kql_files()} == {"eventhubs", "otel", "appinsights"}


@pytest.mark.parametrize("path", ch.kql_files(), ids=lambda p: str(p.relative_to(ch.REPO)))
def test_query_files_say_what_they_answer(path: Any) -> None:
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("// Query pack:"), lines[0]
    header = [line for line in lines if line.startswith("//")]
    assert any(line.startswith("// Answers:") for line in header), "missing '// Answers:' line"


def test_otel_queries_read_attributes_not_event_name() -> None:
    for query in ch.pack_queries() + ch.alert_rule_queries():
        if ch.OTEL_LOGS_TABLE in query.tables:
            code = "\n".join(
                line for line in query.text.splitlines() if not line.lstrip().startswith("//")
            )
            assert "EventName" not in code, query.id
            assert 'Attributes["azure.scheduled_event.transition"]' in query.text, query.id


def test_dcr_transforms_produce_the_table_columns(kusto_results: dict[str, dict[str, Any]]) -> None:
    expected = {
        f"Custom-{ch.TRANSITIONS_TABLE}": [[n, ch.kusto_type(t)] for n, t in COLUMNS],
        f"Custom-{ch.METRICS_TABLE}": [[n, ch.kusto_type(t)] for n, t in ch.METRICS_COLUMNS],
    }
    flows = ch.dcr_flows()
    assert sorted(f["outputStream"] for f in flows) == sorted(expected)
    for flow in flows:
        result = kusto_results[f"event-hubs-ingestion.json#{flow['outputStream']}"]
        assert result["columns"] == expected[flow["outputStream"]]


def test_dcr_transforms_use_only_supported_kql() -> None:
    for query in ch.dcr_queries():
        text = re.sub(r'"(?:\\.|[^"\\])*"', '""', query.text)
        assert text.lstrip().startswith("source"), query.id
        operators = set(re.findall(r"\|\s*([a-z][a-z-]*)", text))
        assert operators <= DCR_TABULAR_OPERATORS, operators - DCR_TABULAR_OPERATORS
        functions = set(re.findall(r"\b([a-z_][a-z0-9_]*)\s*\(", text))
        assert functions <= DCR_FUNCTIONS, functions - DCR_FUNCTIONS
