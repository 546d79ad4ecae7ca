"""Shared helpers for the consumption tests (query pack, ARM templates, dashboards, rules,
manifests).

Everything that names a table column, an OTel attribute or a Prometheus metric is derived here
from the product's own definitions (``scheduled_events_exporter.records.COLUMNS``, the
docs/semantics.md#metrics
instrument table in :data:`INSTRUMENTS`), so renaming a field breaks these tests instead of
silently breaking the queries users run.

External tools (installed by ``.ci/install-consumption-tools.sh``): node packages in
``.ci/node`` and ``promtool``. :func:`require_tools` decides whether a missing tool skips (local
run, tools never installed) or fails (CI, or the tools directory exists but is incomplete).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from scheduled_events_exporter.records import COLUMNS
from scheduled_events_exporter.telemetry import METRICS

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "config"
KQL_DIR = CONFIG / "kql"
AZURE_DIR = CONFIG / "azure"
GRAFANA_DIR = CONFIG / "grafana"
APP_INSIGHTS_GRAFANA_DIR = GRAFANA_DIR / "app-insights"
PROMETHEUS_DIR = CONFIG / "prometheus"
COLLECTOR_DIR = CONFIG / "otel-collector"
K8S_DIR = CONFIG / "k8s"
SYSTEMD_DIR = CONFIG / "systemd"
TOOLS_DIR = REPO / ".ci" / "node"
NODE_MODULES = TOOLS_DIR / "node_modules"
INSTALL_HINT = "run `bash .ci/install-consumption-tools.sh`"

TRANSITIONS_TABLE = "AzureScheduledEvents_CL"
METRICS_TABLE = "AzureScheduledEventsMetrics_CL"
OTEL_LOGS_TABLE = "OTelLogs"
APP_TRACES_TABLE = "AppTraces"
APP_METRICS_TABLE = "AppMetrics"
DCR_SOURCE_TABLE = "source"

#: The metrics snapshot table (RecordKind = "metrics" messages on the Event Hubs path). The exporter
#: must emit exactly these keys (plus RecordKind) in its snapshot messages; config/azure declares
#: the table.
METRICS_COLUMNS: tuple[tuple[str, str], ...] = (
    ("TimeGenerated", "datetime"),
    ("VmId", "string"),
    ("VmName", "string"),
    ("Metrics", "dynamic"),
    ("RecordId", "string"),
    ("ExporterVersion", "string"),
)

#: The fixed input stream of a data collection rule reading Event Hubs (dataImports.eventHub).
EVENT_HUB_STREAM_COLUMNS: tuple[tuple[str, str], ...] = (
    ("TimeGenerated", "datetime"),
    ("RawData", "string"),
    ("Properties", "dynamic"),
)

#: OTelLogs columns as documented for the Log Analytics table (Azure Monitor native OTLP ingestion).
#: Deliberately no EventName column: the query pack must not rely on one.
OTEL_LOGS_COLUMNS: tuple[tuple[str, str], ...] = (
    ("TimeGenerated", "datetime"),
    ("Attributes", "dynamic"),
    ("ResourceAttributes", "dynamic"),
    ("Body", "string"),
    ("SeverityText", "string"),
    ("SeverityNumber", "int"),
    ("ScopeName", "string"),
    ("ScopeVersion", "string"),
    ("ServiceName", "string"),
    ("ServiceInstanceId", "string"),
    ("RoleName", "string"),
    ("TraceId", "string"),
    ("SpanId", "string"),
    ("OperationName", "string"),
    ("SDKVersion", "string"),
    ("DroppedAttributesCount", "int"),
    ("ItemCount", "int"),
    ("Measurements", "dynamic"),
    ("K8sContainerName", "string"),
    ("K8sNamespaceName", "string"),
    ("K8sPodName", "string"),
    ("ClientIP", "string"),
    ("EndUserId", "string"),
    ("SourceSystem", "string"),
    ("TenantId", "string"),
    ("Type", "string"),
    ("_ResourceId", "string"),
    ("_SubscriptionId", "string"),
)

#: Application Insights tables as Azure Monitor's reference publishes them (Azure Monitor Logs
#: reference, "AppTraces" and "AppMetrics":
#: learn.microsoft.com/azure/azure-monitor/reference/tables/apptraces and .../appmetrics; source
#: the include files for both tables in MicrosoftDocs/azure-reference-other, folder
#: azure-monitor-ref/tables/includes, at 04e8b5c978e7aa75c2917ee23ef053b529f95374), every column in
#: its order.
#: The Collector's azuremonitor exporter writes a log record to AppTraces (Message: the body;
#: Properties: resource, scope and record attributes, each as a string) and a metric data point
#: to AppMetrics (Name, Sum, ItemCount, Min, Max, Properties); docs/consumption.md.
_APP_COMMON_HEAD: tuple[tuple[str, str], ...] = (
    ("AppRoleInstance", "string"),
    ("AppRoleName", "string"),
    ("AppVersion", "string"),
    ("_BilledSize", "real"),
    ("ClientBrowser", "string"),
    ("ClientCity", "string"),
    ("ClientCountryOrRegion", "string"),
    ("ClientIP", "string"),
    ("ClientModel", "string"),
    ("ClientOS", "string"),
    ("ClientStateOrProvince", "string"),
    ("ClientType", "string"),
    ("IKey", "string"),
    ("_IsBillable", "string"),
    ("ItemCount", "int"),
)
_APP_USER_TAIL: tuple[tuple[str, str], ...] = (
    ("UserAccountId", "string"),
    ("UserAuthenticatedId", "string"),
    ("UserId", "string"),
)
APP_TRACES_COLUMNS: tuple[tuple[str, str], ...] = (
    *_APP_COMMON_HEAD,
    ("Measurements", "dynamic"),
    ("Message", "string"),
    ("OperationId", "string"),
    ("OperationName", "string"),
    ("ParentId", "string"),
    ("Properties", "dynamic"),
    ("ReferencedItemId", "string"),
    ("ReferencedType", "string"),
    ("ResourceGUID", "string"),
    ("_ResourceId", "string"),
    ("SDKVersion", "string"),
    ("SessionId", "string"),
    ("SeverityLevel", "int"),
    ("SourceSystem", "string"),
    ("_SubscriptionId", "string"),
    ("SyntheticSource", "string"),
    ("TenantId", "string"),
    ("TimeGenerated", "datetime"),
    ("Type", "string"),
    *_APP_USER_TAIL,
)
APP_METRICS_COLUMNS: tuple[tuple[str, str], ...] = (
    *_APP_COMMON_HEAD,
    ("Max", "real"),
    ("Min", "real"),
    ("Name", "string"),
    ("OperationId", "string"),
    ("OperationName", "string"),
    ("ParentId", "string"),
    ("Properties", "dynamic"),
    ("ResourceGUID", "string"),
    ("_ResourceId", "string"),
    ("SDKVersion", "string"),
    ("SessionId", "string"),
    ("SourceSystem", "string"),
    ("_SubscriptionId", "string"),
    ("Sum", "real"),
    ("SyntheticSource", "string"),
    ("TenantId", "string"),
    ("TimeGenerated", "datetime"),
    ("Type", "string"),
    *_APP_USER_TAIL,
)

#: Time used to expand Grafana time macros before analysis.
_FROM = "datetime(2024-01-01T00:00:00Z)"
_TO = "datetime(2024-01-02T00:00:00Z)"


def kusto_schema(columns: Iterable[tuple[str, str]]) -> str:
    """``(Col:type, ...)`` as the Kusto language service's TableSymbol constructor takes it."""
    return "(" + ", ".join(f"{name}:{typ}" for name, typ in columns) + ")"


def kusto_type(log_analytics_type: str) -> str:
    """Normalise a Log Analytics column type to the Kusto scalar type name the analyser reports."""
    return {"boolean": "bool", "double": "real"}.get(log_analytics_type.lower(), log_analytics_type)


def table_schemas() -> dict[str, str]:
    """Every table the query pack may use, keyed by name."""
    return {
        TRANSITIONS_TABLE: kusto_schema(COLUMNS),
        METRICS_TABLE: kusto_schema(METRICS_COLUMNS),
        OTEL_LOGS_TABLE: kusto_schema(OTEL_LOGS_COLUMNS),
        APP_TRACES_TABLE: kusto_schema(APP_TRACES_COLUMNS),
        APP_METRICS_TABLE: kusto_schema(APP_METRICS_COLUMNS),
        DCR_SOURCE_TABLE: kusto_schema(EVENT_HUB_STREAM_COLUMNS),
    }


# ------------------------------------------------------------------------------------------- tools


def in_ci() -> bool:
    """CI runs set CI=true (any non-empty value other than 0/false counts)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require_tools() -> None:
    """Skip when the consumption tools were never installed locally; otherwise they must be there.

    In CI (``CI=true``) a missing tool fails: a green run must never hide a skipped check.
    """
    if not TOOLS_DIR.is_dir() and not in_ci():
        pytest.skip(f"consumption tools not installed ({TOOLS_DIR} missing): {INSTALL_HINT}")


def tool_path(name: str) -> str:
    """Absolute path of an executable, or fail/skip per :func:`require_tools`."""
    require_tools()
    found = shutil.which(name)
    if found is None:
        local = NODE_MODULES / ".bin" / name
        if local.exists():
            return str(local)
        pytest.fail(f"{name} not found: {INSTALL_HINT}")
    return found


def node_package(name: str) -> Path:
    """Directory of an installed npm package in .ci/node, or fail/skip per :func:`require_tools`."""
    require_tools()
    path = NODE_MODULES / name
    if not (path / "package.json").is_file():
        pytest.fail(f"npm package {name} missing in {NODE_MODULES}: {INSTALL_HINT}")
    return path


# ---------------------------------------------------------------------------------- KQL collection


@dataclass(frozen=True, slots=True)
class KqlQuery:
    """One KQL text to analyse, where it came from, and the tables it may use."""

    id: str
    text: str
    tables: tuple[str, ...]


def load_json(path: Path) -> Any:
    """Parse a JSON file."""
    return json.loads(path.read_text(encoding="utf-8"))


def kql_files() -> list[Path]:
    """Every ``.kql`` file of the query pack."""
    return sorted(KQL_DIR.rglob("*.kql"))


def landing_tables(landing: str) -> tuple[str, ...]:
    """Tables a query of one landing path may read."""
    if landing in ("eventhubs", "EventHubs"):
        return (TRANSITIONS_TABLE, METRICS_TABLE)
    if landing in ("otel", "otlp", "Otlp"):
        return (OTEL_LOGS_TABLE,)
    if landing in ("appinsights", "AppInsights"):
        return (APP_TRACES_TABLE, APP_METRICS_TABLE)
    raise ValueError(f"unknown landing path {landing!r}")


def pack_queries() -> list[KqlQuery]:
    """The query pack: one file per question per landing path (directory = landing path)."""
    return [
        KqlQuery(
            str(p.relative_to(REPO)), p.read_text(encoding="utf-8"), landing_tables(p.parent.name)
        )
        for p in kql_files()
    ]


def alert_rule_queries() -> list[KqlQuery]:
    """KQL held in the ARM alert template's variables (kql<Name><EventHubs|Otlp|AppInsights>)."""
    path = AZURE_DIR / "alert-rules.json"
    template = load_json(path)
    out = []
    for name, text in template["variables"].items():
        match = re.fullmatch(r"kql\w+?(EventHubs|Otlp|AppInsights)", name)
        if match:
            out.append(KqlQuery(f"{path.relative_to(REPO)}#{name}", text, landing_tables(match[1])))
    return out


def dcr_flows() -> list[dict[str, Any]]:
    """The dataFlows of every Event Hubs data collection rule (one rule per event hub)."""
    template = load_json(AZURE_DIR / "event-hubs-ingestion.json")
    return [
        flow
        for r in template["resources"]
        if r["type"] == "Microsoft.Insights/dataCollectionRules"
        for flow in r["properties"]["dataFlows"]
    ]


def dcr_queries() -> list[KqlQuery]:
    """Each DCR transform, analysed against the fixed Event Hubs input stream (``source``)."""
    return [
        KqlQuery(
            f"event-hubs-ingestion.json#{flow['outputStream']}",
            flow["transformKql"],
            (DCR_SOURCE_TABLE,),
        )
        for flow in dcr_flows()
    ]


def grafana_dashboards() -> dict[str, Any]:
    """Dashboard JSON by file name."""
    return {p.name: load_json(p) for p in sorted(GRAFANA_DIR.glob("*.json"))}


def iter_panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Panels, including those nested in rows."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def _variable_sample(name: str) -> str:
    return {"vm": "vm-1"}.get(name, "sample")


def expand_grafana_macros(query: str, *, all_value: str | None = None) -> str:
    """Expand the Azure Monitor data source's macros and template variables into plain KQL.

    ``all_value``: expand ``$__contains`` as the "All" option does when the variable's
    ``allValue`` is that text (Grafana passes a custom allValue unformatted, and the data source's
    macro turns ``all`` into ``1 == 1``; anything else becomes a one-value ``in`` list).
    """
    text = query

    def contains(m: re.Match[str]) -> str:
        if all_value is None:
            return f"{m[1]} in ('{_variable_sample(m[2])}', 'vm-2')"
        return "1 == 1" if all_value == "all" else f"{m[1]} in ({all_value})"

    text = re.sub(
        r"\$__contains\(\s*([A-Za-z_][\w.]*)\s*,\s*\$\{?(\w+)\}?\s*\)", contains, text
    )
    text = re.sub(
        r"\$__escapeMulti\(\s*\$\{?(\w+)\}?\s*\)", lambda m: f"'{_variable_sample(m[1])}'", text
    )
    text = re.sub(
        r"\$__timeFilter\(\s*([A-Za-z_]\w*)?\s*\)",
        lambda m: f"{m[1] or 'TimeGenerated'} between ({_FROM} .. {_TO})",
        text,
    )
    text = text.replace("$__timeFrom()", _FROM).replace("$__timeTo()", _TO)
    text = text.replace("$__interval", "5m")
    text = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: _variable_sample(m[1] or m[2]), text)
    return text


def _azure_log_queries(obj: Any, where: str) -> Iterator[tuple[str, str]]:
    """Every azureLogAnalytics.query inside an object (targets, variables), with a location."""
    if isinstance(obj, dict):
        la = obj.get("azureLogAnalytics")
        if isinstance(la, dict) and isinstance(la.get("query"), str):
            yield f"{where}/{obj.get('refId', '?')}", la["query"]
        for key, value in obj.items():
            yield from _azure_log_queries(value, f"{where}/{key}")
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            yield from _azure_log_queries(value, f"{where}[{i}]")


def app_insights_dashboards() -> dict[str, Any]:
    """Dashboards for the Application Insights landing (AppTraces / AppMetrics), by file name."""
    return {p.name: load_json(p) for p in sorted(APP_INSIGHTS_GRAFANA_DIR.glob("*.json"))}


def native_otlp_kql_dashboards() -> dict[str, Any]:
    """The native OTLP route's dashboards, by file name: PromQL panels on the Azure Monitor
    workspace, and the reconciliation panels' KQL on OTelLogs."""
    return {p.name: load_json(p) for p in sorted((GRAFANA_DIR / "native-otlp").glob("*.json"))}


def kql_dashboards() -> list[tuple[str, Any, tuple[str, ...]]]:
    """(name, dashboard, tables its KQL may read) of every dashboard with Azure Monitor Logs
    panels."""
    return [
        *((n, d, landing_tables("eventhubs")) for n, d in grafana_dashboards().items()),
        *((n, d, landing_tables("appinsights")) for n, d in app_insights_dashboards().items()),
        *((n, d, landing_tables("otel")) for n, d in native_otlp_kql_dashboards().items()),
    ]


def grafana_kql_queries() -> list[KqlQuery]:
    """KQL of every Azure Monitor dashboard panel and variable, macros expanded."""
    out = []
    for name, dashboard, tables in kql_dashboards():
        for where, query in _azure_log_queries(dashboard, name):
            out.append(KqlQuery(where, expand_grafana_macros(query), tables))
    return out


def run_kusto_check(queries: Sequence[KqlQuery]) -> dict[str, dict[str, Any]]:
    """Analyse every query in one node process; results keyed by query id."""
    node = tool_path("node")
    node_package("@kusto/language-service-next")
    payload = {
        "tables": table_schemas(),
        "queries": [{"id": q.id, "text": q.text, "tables": list(q.tables)} for q in queries],
    }
    proc = subprocess.run(
        [node, str(Path(__file__).with_name("kusto_check.js"))],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "KUSTO_NODE_DIR": str(NODE_MODULES)},
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"kusto_check.js failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return {r["id"]: r for r in json.loads(proc.stdout)}


# ------------------------------------------------------------------------- Prometheus metric names


@dataclass(frozen=True, slots=True)
class Instrument:
    """One docs/semantics.md#metrics instrument: name, kind (gauge, counter, histogram) and unit."""

    name: str
    kind: str
    unit: str


#: The instruments the code declares (``telemetry.METRICS``, documented in the README).
INSTRUMENTS: tuple[Instrument, ...] = tuple(Instrument(n, k, u) for n, k, u in METRICS)

_KINDS = {"Gauge": "gauge", "Sum": "counter", "Histogram": "histogram"}


@dataclass(frozen=True, slots=True)
class ObservedMetric:
    """One metric as a real OTLP receiver saw it: name, kind, unit, and every attribute key of
    its data points and of the resource that sent it."""

    name: str
    kind: str
    unit: str
    point_attributes: frozenset[str]
    resource_attributes: frozenset[str]


@functools.cache
def observed_metrics() -> tuple[ObservedMetric, ...]:
    """The metrics a real exporter run delivers to a real OTLP collector (rotel), by name.

    The run is arranged so every instrument has a point: a pending user Reboot (per-event
    gauges, notice), an unannounced host failure, dry-run approval (approvals), and a logs
    endpoint nobody listens on while
    metrics reach the collector (export.failures). Attribute keys are the union over every
    export of the run.
    """
    from scheduled_events_exporter.simulator import Simulator
    from tests.exporter_process import ExporterProcess, clean_env, free_port
    from tests.peers.rotel import RotelReceiver

    wanted = {i.name for i in INSTRUMENTS}
    with Simulator(vm_name="vm-obs") as sim, RotelReceiver() as rotel:
        announced = {"EventId": "OBS-1", "EventStatus": "Scheduled", "EventType": "Reboot",
                     "ResourceType": "VirtualMachine", "Resources": ["vm-obs"],
                     "NotBefore": "Mon, 11 Apr 2099 22:26:58 GMT", "Description": "",
                     "EventSource": "User", "DurationInSeconds": 30}
        env = clean_env(
            SEE_IMDS_ENDPOINT=sim.url, SEE_SINKS="otlp", SEE_STATE_DIR="", SEE_HEALTH_ADDR="",
            SEE_POLL_INTERVAL="0.5", SEE_APPROVE="user", SEE_APPROVE_DRY_RUN="true",
            OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=f"{rotel.http_endpoint}/v1/metrics",
            OTEL_EXPORTER_OTLP_LOGS_ENDPOINT=f"http://127.0.0.1:{free_port()}/v1/logs",
            OTEL_EXPORTER_OTLP_TIMEOUT="1", OTEL_METRIC_EXPORT_INTERVAL="1000",
        )
        with ExporterProcess(env) as proc:
            # Announced while watched (a first sight's notice is not counted), then a host
            # failure while watched: an unannounced start (its gauges carry the label).
            assert sim.wait_for_requests(2, 30, method="GET")
            sim.set_events([announced])
            assert sim.wait_for_requests(5, 30, method="GET")
            sim.set_events([*sim.events, {
                "EventId": "OBS-2", "EventStatus": "Started", "EventType": "Reboot",
                "ResourceType": "VirtualMachine", "Resources": ["vm-obs"], "NotBefore": "",
                "Description": "", "EventSource": "Platform", "DurationInSeconds": 10}])
            rotel.wait_for_metric(
                "azure.scheduled_events.export.failures", timeout=60)
            proc.wait_until(lambda: any(
                "unannounced" in p.attributes for m in rotel.metrics
                if m.name == "azure.scheduled_events.impact_duration" for p in m.points),
                timeout=30)
            proc.wait_until(lambda: wanted <= {m.name for m in rotel.metrics}, timeout=30)
            proc.terminate()
        seen: dict[str, ObservedMetric] = {}
        for metric in rotel.metrics:
            if not metric.name.startswith("azure.scheduled_events."):
                continue
            before = seen.get(metric.name)
            points = frozenset(k for p in metric.points for k in p.attributes)
            resource = frozenset(metric.resource)
            seen[metric.name] = ObservedMetric(
                metric.name, _KINDS.get(metric.kind, metric.kind), metric.unit,
                points | (before.point_attributes if before else frozenset()),
                resource | (before.resource_attributes if before else frozenset()),
            )
    return tuple(sorted(seen.values(), key=lambda m: m.name))


def observed_instruments() -> tuple[Instrument, ...]:
    """The instruments of :func:`observed_metrics` (name, kind, unit)."""
    return tuple(Instrument(m.name, m.kind, m.unit) for m in observed_metrics())


_UNIT_SUFFIXES = {"s": "seconds", "ms": "milliseconds", "By": "bytes", "%": "percent", "1": ""}


def prometheus_family(instrument: Instrument, *, ratio_for_unit_one: bool = False) -> str:
    """The metric family name the OpenTelemetry -> Prometheus translation gives an instrument.

    Dots (any invalid character) become ``_``, the unit is appended as a word (``s`` ->
    ``_seconds``; ``{...}`` annotations and ``1`` are dropped), counters end in ``_total``. The
    Python exporter (opentelemetry-exporter-prometheus 0.66b2, verified) adds nothing for unit
    ``1``; the collector's Go translator appends ``_ratio`` to unit-``1`` gauges
    (``ratio_for_unit_one``).
    """
    tokens = [t for t in re.split(r"[^A-Za-z0-9:]+", instrument.name) if t]
    unit = re.sub(r"\{[^}]*\}", "", instrument.unit)
    suffix = _UNIT_SUFFIXES.get(unit, unit)
    if suffix and suffix not in tokens:
        tokens.append(suffix)
    if instrument.kind == "counter":
        tokens = [t for t in tokens if t != "total"] + ["total"]
    if ratio_for_unit_one and instrument.unit == "1" and instrument.kind == "gauge":
        tokens = [t for t in tokens if t != "ratio"] + ["ratio"]
    return "_".join(tokens)


def _series_names(family: str, kind: str) -> set[str]:
    if kind == "histogram":
        return {f"{family}_bucket", f"{family}_sum", f"{family}_count"}
    return {family}


def exported_prometheus_names() -> frozenset[str]:
    """Every sample name a scrape shows for the instruments a real run exported (histograms:
    _bucket/_sum/_count).

    Names a dashboard or rule may use must come out the same from the Python SDK exporter and from
    the collector's prometheus / prometheusremotewrite exporters, so only names both agree on count.
    """
    python = set()
    collector = set()
    for inst in observed_instruments():
        python |= _series_names(prometheus_family(inst), inst.kind)
        collector |= _series_names(prometheus_family(inst, ratio_for_unit_one=True), inst.kind)
    return frozenset(python & collector)


_METRIC_TOKEN = re.compile(r"(?<![\w:\"'])azure_scheduled_events_[A-Za-z0-9_:]*")


def promql_metric_names(expr: str) -> set[str]:
    """Our metric names referenced by a PromQL expression (labels like azure_scheduled_event_id
    differ by the missing ``s`` and are not matched)."""
    without_strings = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)
    return set(_METRIC_TOKEN.findall(without_strings))


def grafana_promql() -> list[tuple[str, str]]:
    """(location, expr) for every Prometheus target and variable query of the dashboards."""
    out: list[tuple[str, str]] = []
    for name, dashboard in grafana_dashboards().items():
        for panel in iter_panels(dashboard):
            for target in panel.get("targets", []):
                if isinstance(target.get("expr"), str):
                    out.append(
                        (f"{name}#panel{panel.get('id')}/{target.get('refId')}", target["expr"])
                    )
        for var in dashboard.get("templating", {}).get("list", []):
            query = var.get("query")
            if (
                isinstance(query, dict)
                and isinstance(query.get("query"), str)
                and var.get("datasource", {}).get("type") == "prometheus"
            ):
                out.append((f"{name}#var/{var['name']}", query["query"]))
    return out


def expand_promql_macros(expr: str) -> str:
    """Grafana Prometheus macros and variables replaced, so that promtool can parse it."""
    text = expr
    for macro, value in (("$__rate_interval", "5m"), ("$__interval", "1m"), ("$__range", "1d")):
        text = text.replace(macro, value)
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", ".*", text)


def label_values_metric(query: str) -> str | None:
    """The metric selector inside a ``label_values(metric{...}, label)`` variable query."""
    match = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", query, re.S)
    return match[1] if match else None


# -------------------------------------------------------------------- TypeScript (tsc) type checks

_GRAFANA_PKG = "@grafana/schema/dist/esm/raw/composable"

#: Panel type -> (module of @grafana/schema's panel config, has a FieldConfig type). A panel type
#: not listed here fails the test, so every panel's options are type-checked.
GRAFANA_PANEL_MODULES: Mapping[str, tuple[str, bool]] = {
    "timeseries": ("timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen", True),
    "stat": ("stat/panelcfg/x/StatPanelCfg_types.gen", False),
    "table": ("table/panelcfg/x/TablePanelCfg_types.gen", True),
    "bargauge": ("bargauge/panelcfg/x/BarGaugePanelCfg_types.gen", False),
    "histogram": ("histogram/panelcfg/x/HistogramPanelCfg_types.gen", True),
}

_TS_PRELUDE = """\
// Generated by tests/consumption: type checks for one config file. Do not edit.
import type { DataQuery } from '@grafana/schema';

/** String enums accept their literal values (JSON has no enums); everything else keeps its type. */
export type Loose<T> = T extends string
  ? `${T}`
  : T extends number | boolean | bigint | symbol | null | undefined
    ? T
    : T extends (...args: never[]) => unknown
      ? T
      : T extends ReadonlyArray<infer U>
        ? Array<Loose<U>>
        : T extends object
          ? { [K in keyof T]: Loose<T[K]> }
          : T;

/** Grafana's Prometheus query model (not part of @grafana/schema). */
export interface PrometheusQuery extends DataQuery {
  expr: string;
  legendFormat?: string;
  instant?: boolean;
  range?: boolean;
  exemplar?: boolean;
  format?: 'time_series' | 'table' | 'heatmap';
  interval?: string;
  intervalFactor?: number;
  editorMode?: 'code' | 'builder';
}

/** Variable query of the Prometheus data source. */
export interface PrometheusVariableQuery {
  query: string;
  refId: string;
  qryType?: number;
}
"""


def ts_ident(text: str) -> str:
    return re.sub(r"\W", "_", text)


def grafana_typescript(name: str, dashboard: Mapping[str, Any]) -> str:
    """TS module asserting a dashboard (and each panel's options, field config and targets)
    satisfies @grafana/schema's types; unknown panel types raise ValueError."""
    lines = [
        _TS_PRELUDE,
        "import type { Dashboard, VariableModel } from '@grafana/schema';",
        "import type { AzureMonitorQuery } from "
        f"'{_GRAFANA_PKG}/azuremonitor/dataquery/x/AzureMonitorDataQuery_types.gen';",
    ]
    for ptype, (module, _) in GRAFANA_PANEL_MODULES.items():
        lines.append(f"import type * as {ptype} from '{_GRAFANA_PKG}/{module}';")
    body = json.dumps(dashboard, indent=2)
    lines.append(f"export const dashboard = ({body}) satisfies Loose<Dashboard>;")
    for panel in iter_panels(dashboard):
        ptype = panel.get("type", "")
        if ptype == "row":
            continue
        if ptype not in GRAFANA_PANEL_MODULES:
            raise ValueError(f"{name}: panel {panel.get('id')} has unchecked type {ptype!r}")
        pid = ts_ident(str(panel.get("id")))
        lines.append(
            f"export const panel_{pid}_options = ({json.dumps(panel.get('options', {}))})"
            f" satisfies Loose<{ptype}.Options>;"
        )
        custom = panel.get("fieldConfig", {}).get("defaults", {}).get("custom")
        if custom is not None and GRAFANA_PANEL_MODULES[ptype][1]:
            lines.append(
                f"export const panel_{pid}_custom = ({json.dumps(custom)})"
                f" satisfies Loose<{ptype}.FieldConfig>;"
            )
        for target in panel.get("targets", []):
            query_type = (
                "AzureMonitorQuery"
                if target.get("datasource", {}).get("type") == "grafana-azure-monitor-datasource"
                else "PrometheusQuery"
            )
            lines.append(
                f"export const panel_{pid}_target_{ts_ident(target.get('refId', 'X'))} = "
                f"({json.dumps(target)}) satisfies Loose<{query_type}>;"
            )
    for var in dashboard.get("templating", {}).get("list", []):
        query = var.get("query")
        lines.append(
            f"export const var_{ts_ident(var['name'])} = ({json.dumps(var)})"
            " satisfies Loose<VariableModel>;"
        )
        if isinstance(query, dict):
            query_type = (
                "AzureMonitorQuery"
                if var.get("datasource", {}).get("type") == "grafana-azure-monitor-datasource"
                else "PrometheusVariableQuery"
            )
            lines.append(
                f"export const var_{ts_ident(var['name'])}_query = ({json.dumps(query)})"
                f" satisfies Loose<{query_type}>;"
            )
    return "\n".join(lines) + "\n"


#: Kubernetes kind -> (kubernetes-types module, type name).
K8S_KINDS: Mapping[str, tuple[str, str]] = {
    "Deployment": ("apps/v1", "Deployment"),
    "DaemonSet": ("apps/v1", "DaemonSet"),
    "Namespace": ("core/v1", "Namespace"),
    "ServiceAccount": ("core/v1", "ServiceAccount"),
    "Pod": ("core/v1", "Pod"),
    "Secret": ("core/v1", "Secret"),
    "ConfigMap": ("core/v1", "ConfigMap"),
    "NetworkPolicy": ("networking/v1", "NetworkPolicy"),
    "Job": ("batch/v1", "Job"),
}


def k8s_documents() -> list[tuple[str, dict[str, Any]]]:
    """(location, object) for every YAML document under config/k8s."""
    import yaml  # PyYAML: a test dependency, imported late so collection works without it

    out = []
    for path in sorted(K8S_DIR.glob("*.yaml")):
        for i, doc in enumerate(yaml.safe_load_all(path.read_text(encoding="utf-8"))):
            if doc is not None:
                out.append((f"{path.relative_to(REPO)}#{i}", doc))
    return out


def k8s_typescript(docs: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """TS module asserting each manifest satisfies its kubernetes-types interface (apiVersion
    and kind are literal types there, so a wrong group/version fails too)."""
    lines = ["// Generated by tests/consumption: Kubernetes manifest type checks. Do not edit."]
    for module in sorted({m for m, _ in K8S_KINDS.values()}):
        names = sorted({t for m, t in K8S_KINDS.values() if m == module})
        lines.append(f"import type {{ {', '.join(names)} }} from 'kubernetes-types/{module}';")
    for i, (where, doc) in enumerate(docs):
        kind = doc.get("kind", "")
        if kind not in K8S_KINDS:
            raise ValueError(f"{where}: kind {kind!r} has no type check")
        lines.append(f"// {where}")
        lines.append(
            f"export const doc_{i} = ({json.dumps(doc, indent=2)}) satisfies {K8S_KINDS[kind][1]};"
        )
    return "\n".join(lines) + "\n"


_TSC_LINE = re.compile(r"^(?P<file>[^(\s]+\.ts)\((?P<line>\d+),(?P<col>\d+)\): error (?P<msg>.*)$")


def run_tsc(modules: Mapping[str, str]) -> dict[str, list[str]]:
    """Type-check generated modules in one ``tsc --noEmit --strict`` run; errors per module name."""
    node = tool_path("node")
    tsc = node_package("typescript") / "bin" / "tsc"
    node_package("@grafana/schema")
    node_package("kubernetes-types")
    import tempfile

    # Inside .ci/node so that module resolution finds .ci/node/node_modules.
    with tempfile.TemporaryDirectory(prefix="tscheck-", dir=TOOLS_DIR) as tmp:
        work = Path(tmp)
        for name, text in modules.items():
            (work / name).write_text(text, encoding="utf-8")
        (work / "tsconfig.json").write_text(
            json.dumps(
                {
                    "compilerOptions": {
                        "strict": True,
                        "noEmit": True,
                        "target": "es2022",
                        "module": "esnext",
                        "moduleResolution": "bundler",
                        "skipLibCheck": True,
                        "types": [],
                        "isolatedModules": True,
                    },
                    "files": sorted(modules),
                }
            ),
            encoding="utf-8",
        )
        proc = subprocess.run(
            [node, str(tsc), "--noEmit", "--strict", "--pretty", "false", "-p", str(work)],
            capture_output=True,
            text=True,
            timeout=180,
            cwd=work,
            check=False,
        )
        errors: dict[str, list[str]] = {name: [] for name in modules}
        current: list[str] | None = None
        for line in proc.stdout.splitlines():
            match = _TSC_LINE.match(line)
            if match:
                current = errors.setdefault(Path(match["file"]).name, [])
                source = (work / Path(match["file"]).name).read_text(encoding="utf-8").splitlines()
                lineno = int(match["line"])
                context = source[lineno - 1].strip() if 0 < lineno <= len(source) else ""
                current.append(f"line {lineno}: {match['msg']}  <<{context[:160]}>>")
            elif current is not None and line.startswith(" "):
                current[-1] += "\n" + line
        if proc.returncode != 0 and not any(errors.values()):
            pytest.fail(
                f"tsc failed ({proc.returncode}): {proc.stdout[-2000:]} {proc.stderr[-2000:]}"
            )
        return errors


def all_checked_kql() -> list[KqlQuery]:
    """Every KQL text the project ships: query pack, alert rules, DCR transforms, dashboards."""
    return pack_queries() + alert_rule_queries() + dcr_queries() + grafana_kql_queries()


def alert_queries_without_tables() -> list[KqlQuery]:
    """The alert rule queries analysed against an empty database: how they fare while their
    tables do not exist yet, or after 30 days without data (ids end in ``#no-tables``)."""
    return [KqlQuery(f"{q.id}#no-tables", q.text, ()) for q in alert_rule_queries()]


def grafana_kql_queries_all_selected() -> list[KqlQuery]:
    """Dashboard KQL with every multi-value variable on "All", expanded as Grafana and the Azure
    Monitor data source do (ids end in ``#all``); a variable without ``allValue`` expands to the
    sample list, which the tests reject separately."""
    out = []
    for name, dashboard, tables in kql_dashboards():
        all_values = {
            v["name"]: v.get("allValue")
            for v in dashboard.get("templating", {}).get("list", [])
            if v.get("includeAll")
        }
        for where, query in _azure_log_queries(dashboard, name):
            used = [n for n in all_values if f"${n}" in query or f"${{{n}}}" in query]
            value = next((all_values[n] for n in used if all_values[n]), None)
            text = expand_grafana_macros(query, all_value=value)
            out.append(KqlQuery(f"{where}#all", text, tables))
    return out


#: A query using a column that does not exist: the checker must report it.
SELF_TEST_QUERY = KqlQuery(
    "self-test#renamed-column",
    f"{TRANSITIONS_TABLE} | where EventTypo == 'Freeze' | project TimeGenerated",
    (TRANSITIONS_TABLE,),
)
