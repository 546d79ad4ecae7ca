"""Session fixtures for the consumption tests: one node process analyses every KQL text, one tsc run
type-checks every dashboard and manifest (node start-up costs seconds; doing it per test would not
fit the suite's time budget)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.consumption import consumption_helpers as ch
from tests.consumption.native_otlp_helpers import native_otlp_dashboards


@pytest.fixture(scope="session")
def all_kql() -> list[ch.KqlQuery]:
    """Query pack files, alert rule queries, DCR transforms and dashboard queries, plus a self-test
    query that must fail (proves the checker is not vacuous)."""
    return [
        *ch.all_checked_kql(),
        ch.SELF_TEST_QUERY,
        *ch.alert_queries_without_tables(),
        *ch.grafana_kql_queries_all_selected(),
    ]


@pytest.fixture(scope="session")
def kusto_results(all_kql: list[ch.KqlQuery]) -> dict[str, dict[str, Any]]:
    """Diagnostics and result columns for every query, keyed by query id."""
    return ch.run_kusto_check(all_kql)


@pytest.fixture(scope="session")
def tsc_errors() -> dict[str, list[str]]:
    """tsc --strict errors for every generated module (dashboards and Kubernetes manifests)."""
    ch.require_tools()
    dashboards = {**ch.grafana_dashboards(), **native_otlp_dashboards(),
                  **ch.app_insights_dashboards()}
    modules = {
        f"grafana_{ch.ts_ident(name)}.ts": ch.grafana_typescript(name, dashboard)
        for name, dashboard in dashboards.items()
    }
    modules["k8s_manifests.ts"] = ch.k8s_typescript(ch.k8s_documents())
    return ch.run_tsc(modules)
