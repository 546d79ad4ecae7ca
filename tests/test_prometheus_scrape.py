"""The scrape route end to end: a real Prometheus server scrapes the real exporter (1 s) while the
simulator plays a lifecycle, and every shipped PromQL expression (alert rules, dashboard targets
with the dashboard's variables substituted) is executed by that server.

Phases (module-scoped stack, tests run in file order):
1. pending: a Freeze affecting the VM 10 minutes ahead (impact 5 s), a Reboot already Started
   (never announced, impact 30 s), a Redeploy for another VM 2 hours ahead (impact unknown);
2. ended: the document empties; per-event series must leave the scrape at once (stale), not
   after Prometheus' 5-minute lookback.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduled_events_exporter.simulator import Simulator
from tests.exporter_process import ExporterProcess, clean_env, free_port
from tests.peers.prometheus import PrometheusServer, skip_unless_installed

REPO = Path(__file__).resolve().parents[1]
RULE_FILES = sorted((REPO / "config" / "prometheus").glob("*.yaml"))
DASHBOARD = REPO / "config" / "grafana" / "scheduled-events-prometheus.json"
JOB = "scheduled-events-exporter"
VM = "vm-prom"

pytestmark = skip_unless_installed("prometheus")

FREEZE = "A1B2C3D4-0000-4000-8000-00000000F0F0"
REBOOT = "B2C3D4E5-0000-4000-8000-0000000B0B0B"
REDEPLOY = "C3D4E5F6-0000-4000-8000-00000000D0D0"
USER = "D4E5F6A7-0000-4000-8000-0000000E0E0E"


def rule_exprs() -> list[tuple[str, str]]:
    """(alert or record name, expr) of every rule in config/prometheus/."""
    out = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            for rule in group["rules"]:
                out.append((str(rule.get("alert") or rule.get("record")), str(rule["expr"])))
    return out


def dashboard_exprs() -> list[tuple[str, str]]:
    """(panel title/refId, expr) of every Prometheus target and variable query of the dashboard."""
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            out.append((f"{panel['title']}/{target['refId']}", target["expr"]))
    for var in dashboard["templating"]["list"]:
        query = var.get("query")
        if isinstance(query, dict):
            match = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", query["query"], re.S)
            assert match, f"variable {var['name']}: unsupported query {query['query']}"
            out.append((f"var {var['name']}", match[1]))  # the selector label_values() runs
    return out


def substitute(expr: str, instance: str) -> str:
    """Grafana's variables and macros as Grafana would send them for this one exporter."""
    text = (expr.replace("$__rate_interval", "30s").replace("$__interval", "15s")
            .replace("$__range", "10m"))
    # A regex-escaped value inside a PromQL string literal (backslashes doubled, as Grafana does).
    for name, value in (("$job", JOB), ("$instance", instance)):
        text = text.replace(name, re.escape(value).replace("\\", "\\\\"))
    assert "$" not in text, f"unsubstituted variable in {expr}"
    return text


def panel(title: str) -> str:
    """The single target expression of the dashboard panel ``title``."""
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    (match,) = [p for p in dashboard["panels"] if p["title"] == title]
    (target,) = match["targets"]
    return str(target["expr"])


def http_date(at: datetime) -> str:
    return format_datetime(at, usegmt=True)


@dataclass
class Stack:
    sim: Simulator
    exporter: ExporterProcess
    prom: PrometheusServer
    instance: str
    scrape_url: str

    def q(self, expr: str) -> list[dict[str, Any]]:
        return self.prom.query(substitute(expr, self.instance))

    def by_id(self, expr: str) -> dict[str, float]:
        return {s["metric"]["azure_scheduled_event_id"]: float(s["value"][1])
                for s in self.q(expr)}

    def scalar(self, expr: str) -> float:
        (sample,) = self.q(expr)
        return float(sample["value"][1])


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    now = datetime.now(timezone.utc)
    with Simulator(vm_name=VM) as sim:
        events = [
            {"EventId": FREEZE, "EventStatus": "Scheduled", "EventType": "Freeze",
             "ResourceType": "VirtualMachine", "Resources": [VM],
             "NotBefore": http_date(now + timedelta(minutes=10)), "Description": "",
             "EventSource": "Platform", "DurationInSeconds": 5},
            # A host failure: Started at once, impact duration unknown (no impact series).
            {"EventId": REBOOT, "EventStatus": "Started", "EventType": "Reboot",
             "ResourceType": "VirtualMachine", "Resources": [VM], "NotBefore": "",
             "Description": "Host failure", "EventSource": "Platform", "DurationInSeconds": -1},
            # A user's reboot that the VM approves automatically: Started at once, no surprise.
            {"EventId": USER, "EventStatus": "Started", "EventType": "Reboot",
             "ResourceType": "VirtualMachine", "Resources": [VM], "NotBefore": "",
             "Description": "", "EventSource": "User", "DurationInSeconds": -1},
            {"EventId": REDEPLOY, "EventStatus": "Scheduled", "EventType": "Redeploy",
             "ResourceType": "VirtualMachine", "Resources": ["vm-other"],
             "NotBefore": http_date(now + timedelta(hours=2)), "Description": "",
             "EventSource": "Platform", "DurationInSeconds": -1},
        ]
        # Everything comes while the exporter watches (a first sight at start would be a late
        # sighting, neither an unannounced start nor a whole notice: docs/lifecycle.md).
        port = free_port()
        instance = f"127.0.0.1:{port}"
        env = clean_env(
            SEE_IMDS_ENDPOINT=sim.url, SEE_SINKS="console", SEE_STATE_DIR="",
            SEE_HEALTH_ADDR="", SEE_POLL_INTERVAL="0.5", OTEL_METRICS_EXPORTER="prometheus",
            OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1", OTEL_EXPORTER_PROMETHEUS_PORT=str(port),
        )
        with ExporterProcess(env) as exporter:
            exporter.wait_for(lambda: "first document received" in exporter.stderr(), 30,
                              "a first, empty document")
            sim.set_events([e for e in events if e["EventStatus"] == "Scheduled"])
            exporter.wait_for_records(2, timeout=30)
            sim.set_events(events)
            exporter.wait_for_records(4, timeout=30)
            prom = PrometheusServer([instance], job=JOB, rule_files=RULE_FILES)
            try:
                stack = Stack(sim, exporter, prom, instance, f"http://{instance}/metrics")
                prom.wait_for(f'up{{job="{JOB}"}} == 1', bool, 30, "a successful scrape")
                prom.wait_for("azure_scheduled_events_time_to_not_before_seconds",
                              lambda r: len(r) == 2, 30, "the per-event series")
                yield stack
            finally:
                prom.stop()
            assert exporter.terminate() == 0


# ------------------------------------------------------------------ phase 1: events pending


@pytest.mark.parametrize(("where", "expr"), [*rule_exprs(), *dashboard_exprs()],
                         ids=lambda v: re.sub(r"\s+", " ", str(v))[:60])
def test_every_shipped_expression_evaluates(stack: Stack, where: str, expr: str) -> None:
    stack.q(expr)  # PromQLError (HTTP 400/422 from the server) fails the test


def test_pending_panels(stack: Stack) -> None:
    assert stack.scalar(panel("Pending events (affecting the VM)")) == 3
    assert stack.scalar(panel("Pending events (all)")) == 4
    assert stack.scalar(panel("Exporters reporting")) == 1
    by_type_status = {(s["metric"]["type"], s["metric"]["status"]): float(s["value"][1])
                      for s in stack.q(panel("Pending events by type and status"))}
    assert by_type_status == {("Freeze", "Scheduled"): 1, ("Reboot", "Started"): 2,
                              ("Redeploy", "Scheduled"): 1}


def test_dashboard_variables_list_this_exporter(stack: Stack) -> None:
    variables = dict(dashboard_exprs())
    assert {s["metric"]["job"] for s in stack.q(variables["var job"])} == {JOB}
    assert {s["metric"]["instance"] for s in stack.q(variables["var instance"])} == {
        stack.instance}


def test_time_to_not_before_panel(stack: Stack) -> None:
    countdown = stack.by_id(panel("Countdown to NotBefore"))
    # Started events have no countdown; the other two count down from 10 min and 2 h.
    assert set(countdown) == {FREEZE, REDEPLOY}
    assert 450 < countdown[FREEZE] <= 600
    assert 7000 < countdown[REDEPLOY] <= 7200
    labels = {s["metric"]["azure_scheduled_event_id"]: s["metric"]
              for s in stack.q(panel("Countdown to NotBefore"))}
    assert labels[FREEZE]["affects_self"] == "true"
    assert labels[REDEPLOY]["affects_self"] == "false"
    assert labels[FREEZE]["instance"] == stack.instance


def test_impact_panel(stack: Stack) -> None:
    # DurationInSeconds -1 (unknown) has no series.
    assert stack.by_id(panel("Announced impact of pending events")) == {FREEZE: 5}


def test_imds_staleness_panels(stack: Stack) -> None:
    assert 0 <= stack.scalar(panel("Worst IMDS staleness")) < 5
    (series,) = stack.q(panel("IMDS staleness"))
    assert series["metric"] == {"instance": stack.instance}


def test_alert_expressions_while_pending(stack: Stack) -> None:
    rules = dict(rule_exprs())
    imminent = stack.by_id(rules["ScheduledEventImpactfulImminent"])
    assert set(imminent) == {FREEZE}  # the Redeploy is 2 h away and affects another VM
    # The host failure alone: its DurationInSeconds -1 gives it no per-event series, and the
    # user's automatically approved reboot beside it is no surprise.
    (unannounced,) = stack.q(rules["ScheduledEventUnannouncedStart"])
    assert unannounced["metric"] == {"job": JOB, "instance": stack.instance, "type": "Reboot"}
    assert float(unannounced["value"][1]) == 1
    assert stack.q(rules["ScheduledEventsExporterSilent"]) == []
    assert stack.q(rules["ScheduledEventsImdsStale"]) == []


def test_server_evaluates_the_rule_files(stack: Stack) -> None:
    def firing() -> set[tuple[str, str]]:
        return {(a["labels"]["alertname"], a["labels"].get("azure_scheduled_event_id", ""))
                for a in stack.prom.api("alerts")["alerts"] if a["state"] == "firing"}

    deadline = time.monotonic() + 20
    while firing() != {("ScheduledEventImpactfulImminent", FREEZE),
                       ("ScheduledEventUnannouncedStart", "")}:
        assert time.monotonic() < deadline, firing()
        time.sleep(0.2)
    groups = stack.prom.api("rules")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) == len(rule_exprs())
    assert all(r["health"] == "ok" and not r.get("lastError") for r in rules), rules


def test_scrape_passes_promtool_check_metrics(stack: Stack) -> None:
    # promtool lints the Prometheus text format (what a client without OpenMetrics gets).
    with urllib.request.urlopen(stack.scrape_url, timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read()
    assert b"azure_scheduled_events_time_to_not_before_seconds{" in text
    proc = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == proc.stderr == b""


def test_only_metrics_path_is_served(stack: Stack) -> None:
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(stack.scrape_url.replace("/metrics", "/"), timeout=5)
    assert info.value.code == 404


# ------------------------------------------------------------------ phase 2: events ended


def test_per_event_series_leave_when_events_end(stack: Stack) -> None:
    stack.sim.set_events([])
    stack.exporter.wait_for(lambda: len(stack.exporter.records()) >= 8, 30, "4 removals")
    # Stale at the next scrape: gone from instant queries within seconds, not after 5 minutes.
    stack.prom.wait_for(substitute(panel("Countdown to NotBefore"), stack.instance),
                        lambda r: r == [], 15, "the countdown series to go stale")
    assert stack.q(panel("Announced impact of pending events")) == []
    assert stack.scalar(panel("Pending events (all)")) == 0
    assert stack.scalar(panel("Pending events (affecting the VM)")) == 0
    # Nothing pending: the gauge's single unlabelled 0.
    assert stack.prom.values(substitute(panel("Pending events by type and status"),
                                        stack.instance)) == {(): 0}
    rules = dict(rule_exprs())
    assert stack.q(rules["ScheduledEventImpactfulImminent"]) == []
    assert stack.q(rules["ScheduledEventUnannouncedStart"]) == []
    for where, expr in [*rule_exprs(), *dashboard_exprs()]:
        stack.q(expr)  # still evaluates without error
        assert where
