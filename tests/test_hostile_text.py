"""Hostile text and labels from IMDS, and what the approval hook may see: the real exporter
process over loopback (docs/security.md)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from scheduled_events_exporter.simulator import Simulator
from tests.exporter_process import ExporterProcess, clean_env, free_port, state_dir, wait_until
from tests.peers.rotel import RotelReceiver
from tests.test_hostile import event, rss_mb

STRING_FIELDS = ["EventId", "EventStatus", "EventType", "ResourceType", "Description",
                 "EventSource", "NotBefore", "Resources"]


def with_surrogate(field: str, index: int) -> bytes:
    """A document whose ``field`` holds a lone surrogate escape (valid JSON, invalid Unicode)."""
    doc = {"DocumentIncarnation": 10 + index, "Events": [
        event(f"S{index}", **({field: ["vm-test", "SURROGATE"]} if field == "Resources"
                              else {field: f"{event('x').get(field, '')}SURROGATE"})),
        event(f"OK{index}")]}
    return json.dumps(doc).replace("SURROGATE", "\\ud800").encode()


@pytest.mark.timeout(150)
def test_a_lone_surrogate_in_any_field_never_stops_polling_or_a_sink(tmp_path: Path) -> None:
    metrics_port = free_port()
    with Simulator(vm_name="vm-test") as sim, RotelReceiver() as rotel:
        env = clean_env(SEE_IMDS_ENDPOINT=sim.url, SEE_SINKS="console,otlp",
                        SEE_STATE_DIR=state_dir(tmp_path), SEE_HEALTH_ADDR="",
                        SEE_POLL_INTERVAL="0.2", OTEL_EXPORTER_OTLP_ENDPOINT=rotel.http_endpoint,
                        OTEL_SERVICE_NAME=f"surrogate-{tmp_path.name}",
                        OTEL_METRICS_EXPORTER="prometheus",
                        OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
                        OTEL_EXPORTER_PROMETHEUS_PORT=str(metrics_port))
        with ExporterProcess(env) as proc:
            seen = 0
            for index, field in enumerate(STRING_FIELDS):
                sim.set_raw_document(with_surrogate(field, index))
                # Every document yields its events' records (the OK one and the repaired one).
                seen += 2 if index == 0 else 4  # the previous two end, two new appear
                proc.wait_for_records(seen, 20)
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                        timeout=5) as answer:
                assert answer.status == 200
                scrape = answer.read().decode()
            logs = rotel.wait_for_logs(
                lambda r: r.resource.get("service.name") == f"surrogate-{tmp_path.name}",
                count=seen, timeout=30)
            assert proc.proc.poll() is None
            errors = proc.stderr()
    assert "Traceback" not in errors and "UnicodeEncodeError" not in errors, errors[-2000:]
    assert errors.count("invalid_unicode") >= len(STRING_FIELDS) - 1  # NotBefore may parse
    records = proc.records()
    assert all("\ud800" not in json.dumps(r, ensure_ascii=False) for r in records)
    assert any("\ufffd" in json.dumps(r, ensure_ascii=False) for r in records)
    assert len(logs) == seen and "azure_scheduled_events_document_anomalies_total" in scrape


@pytest.mark.timeout(150)
def test_invented_types_and_sources_do_not_grow_metrics_or_memory(tmp_path: Path) -> None:
    metrics_port = free_port()
    with Simulator(vm_name="vm-test") as sim:
        env = clean_env(SEE_IMDS_ENDPOINT=sim.url, SEE_SINKS="console",
                        SEE_STATE_DIR="", SEE_HEALTH_ADDR="", SEE_POLL_INTERVAL="0.2",
                        SEE_LOG_LEVEL="warning", OTEL_METRICS_EXPORTER="prometheus",
                        OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
                        OTEL_EXPORTER_PROMETHEUS_PORT=str(metrics_port))
        with ExporterProcess(env) as proc:
            baseline = None
            for batch in range(12):  # 12 x 100 = 1 200 invented types and sources
                sim.set_events([event(f"E{batch}-{i}", EventType=f"Type{batch}x{i}" * 50,
                                      EventSource=f"Src{batch}x{i}") for i in range(100)])
                proc.wait_for_records(100 * (batch + 1) + 100 * batch, 30)
                if batch == 1:
                    baseline = rss_mb(proc.proc.pid)
            wait_until(lambda: len(proc.records()) >= 2300, 30, "the last removals")
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                        timeout=5) as answer:
                scrape = answer.read()
            grown = rss_mb(proc.proc.pid) - (baseline or 0)
    # Before the bound: one series per invented value (the audit's 1 200 values: 83 MB scrape).
    assert len(scrape) < 200_000, f"/metrics is {len(scrape)} bytes"
    assert b'type="other"' in scrape and b'source="other"' in scrape
    assert grown < 40, f"RSS grew {grown:.0f} MB over 1 000 invented values"
    assert any(r["EventType"].startswith("Type11x") for r in proc.records())  # records keep it


def test_the_hook_gets_the_event_not_the_exporters_secrets(tmp_path: Path) -> None:
    dump = tmp_path / "hook-env"
    secrets = {"AZURE_CLIENT_SECRET": "planted-secret-1",
               "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer planted-secret-2",
               "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "x-key=planted-secret-3",
               "SEE_EVENTHUB_CONNECTION_STRING": "Endpoint=sb://x/;SharedAccessKey=planted-4",
               "MY_SETTING": "wanted"}
    with Simulator(vm_name="vm-test") as sim:
        env = clean_env(SEE_IMDS_ENDPOINT=sim.url, SEE_SINKS="console", SEE_STATE_DIR="",
                        SEE_HEALTH_ADDR="", SEE_POLL_INTERVAL="0.2", SEE_APPROVE="all",
                        SEE_APPROVE_HOOK=f"env > {dump}", SEE_APPROVE_HOOK_ENV="MY_SETTING",
                        **secrets)
        env.pop("SEE_EVENTHUB_CONNECTION_STRING")  # the console sink only; still in os.environ
        env["SEE_EVENTHUB_CONNECTION_STRING_UNUSED"] = secrets["SEE_EVENTHUB_CONNECTION_STRING"]
        with ExporterProcess(env) as proc:
            sim.set_events([event("HOOKED")])
            proc.wait_for(lambda: any(r["Transition"] == "approved" for r in proc.records()),
                          30, "the approval")
    seen = dump.read_text()
    assert "planted" not in seen, seen
    assert "SEE_EVENT_ID=HOOKED" in seen and "MY_SETTING=wanted" in seen and "PATH=" in seen


def test_a_nul_in_one_event_id_costs_only_that_event(tmp_path: Path) -> None:
    body = json.dumps({"DocumentIncarnation": 3, "Events": [
        event("BAD\u0000ID"), event("GOOD")]}).encode()
    with Simulator(vm_name="vm-test") as sim:
        env = clean_env(SEE_IMDS_ENDPOINT=sim.url, SEE_SINKS="console", SEE_STATE_DIR="",
                        SEE_HEALTH_ADDR="", SEE_POLL_INTERVAL="0.2", SEE_APPROVE="all",
                        SEE_APPROVE_MULTI="any", SEE_APPROVE_HOOK="true")
        with ExporterProcess(env) as proc:
            sim.set_raw_document(body)
            proc.wait_for(lambda: {(r["Transition"], r["EventId"]) for r in proc.records()}
                          >= {("approved", "GOOD"), ("approval_skipped", "BAD\u0000ID")}, 30,
                          "a decision on each event")
            assert sim.wait_for_requests(1, 10, method="POST")
            errors = proc.stderr()
    skipped = [r for r in proc.records() if r["Transition"] == "approval_skipped"]
    assert skipped[0]["ApprovalReason"] == "hook_failed"
    assert "Traceback" not in errors and "BAD\x00ID" not in errors
    records_seen: list[Any] = proc.records()
    assert {r["EventId"] for r in records_seen if r["Transition"] == "scheduled"} == {
        "BAD\u0000ID", "GOOD"}


@pytest.mark.timeout(90)
def test_idle_health_connections_are_capped_and_timed_out(tmp_path: Path) -> None:
    import os
    import socket

    health = free_port()
    with Simulator(vm_name="vm-test") as sim:
        env = clean_env(SEE_IMDS_ENDPOINT=sim.url, SEE_SINKS="console", SEE_STATE_DIR="",
                        SEE_HEALTH_ADDR=f"127.0.0.1:{health}", SEE_POLL_INTERVAL="0.5")
        with ExporterProcess(env) as proc:
            def answers() -> bool:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz",
                                                timeout=2) as answer:
                        return answer.status == 200
                except OSError:
                    return False

            wait_until(answers, 20, "the health server")
            fds_before = len(os.listdir(f"/proc/{proc.proc.pid}/fd"))
            idle = [socket.create_connection(("127.0.0.1", health)) for _ in range(200)]
            try:
                wait_until(lambda: len(os.listdir(f"/proc/{proc.proc.pid}/fd")) < fds_before + 40
                           and proc.proc.poll() is None, 5, "a bounded number of descriptors")
                # Idle connections are closed after 5 s, and the probe answers again.
                wait_until(answers, 20, "the probe answering despite 200 idle clients")
                assert threading_count(proc.proc.pid) < 60
            finally:
                for sock in idle:
                    sock.close()


def threading_count(pid: int) -> int:
    import os

    return len(os.listdir(f"/proc/{pid}/task"))
