"""The Application Insights landing (the Collector's ``azuremonitor`` exporter, which writes log
records to AppTraces and metric points to AppMetrics): its query pack is the OTLP pack
(config/kql/otel/) with the ``let ScheduledEvents`` block reading AppTraces instead of OTelLogs,
and :func:`app_insights_query` is that translation, so the two packs cannot drift apart.

What the exporter does to a record (open-telemetry/opentelemetry-collector-contrib,
exporter/azuremonitorexporter/log_to_envelope.go and contracts_utils.go): the body becomes
Message; the resource's attributes, the scope's name and version and the record's attributes all
go into one Properties map, each value through ``AsString()`` (``true``, ``5``, ``319.5``, a JSON
array for a list), so every typed read goes through ``tostring()`` first.
"""

from __future__ import annotations

import re

OTEL_HEADER = ("// Query pack: azure-scheduled-events-exporter / OTLP landing path (OTelLogs, "
               "Azure Monitor native OTLP ingestion).")
APP_INSIGHTS_HEADER = ("// Query pack: azure-scheduled-events-exporter / Application Insights "
                       "landing path (AppTraces, the Collector's azuremonitor exporter).")
OTEL_MAPPING_NOTE = (
    "// The `let ScheduledEvents` block maps OTelLogs rows (attributes in the Attributes dynamic "
    "column,\n// VM identity in ResourceAttributes; docs/semantics.md#records) onto the "
    "AzureScheduledEvents_CL column names. It\n// selects our records by the presence of "
    "azure.scheduled_event.transition (no EventName column).")
APP_INSIGHTS_MAPPING_NOTE = (
    "// The `let ScheduledEvents` block maps AppTraces rows (record and resource attributes "
    "together in\n// the Properties dynamic column, every value a string; the body in Message; "
    "docs/consumption.md,\n// \"Application Insights landing\") onto the AzureScheduledEvents_CL "
    "column names. It selects our\n// records by the presence of azure.scheduled_event.transition "
    "(AppTraces has no event name).")
#: Queries written for AppTraces/AppMetrics themselves rather than translated.
OWN_QUERIES = frozenset({"silent-exporters.kql", "uncovered-vms.kql"})

_TYPED = re.compile(r'\b(toint|toreal|tobool|todynamic)\(Properties\[("[^"]+")\]\)')


def app_insights_query(otel_text: str) -> str:
    """An OTLP-pack query (OTelLogs) as the same query over AppTraces."""
    if not otel_text.startswith(OTEL_HEADER) or OTEL_MAPPING_NOTE not in otel_text:
        raise ValueError("expected an OTLP-pack query with its header and mapping note")
    head, sep, body = otel_text.partition("\n};\n")
    if not sep:
        raise ValueError("expected a `let ScheduledEvents = (lookback: timespan) {...};` block")
    head = head.replace(OTEL_HEADER, APP_INSIGHTS_HEADER, 1)
    head = head.replace(OTEL_MAPPING_NOTE, APP_INSIGHTS_MAPPING_NOTE, 1)
    head = head.replace("    OTelLogs\n", "    AppTraces\n", 1)
    head = head.replace("ResourceAttributes[", "Properties[").replace("Attributes[", "Properties[")
    head = _TYPED.sub(r"\1(tostring(Properties[\2]))", head)
    head = head.replace("    | extend EventId = ",
                        "    | extend Body = Message,\n        EventId = ", 1)
    return head + sep + body
