"""Hostile IMDS answers and secrets, against the real exporter process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from scheduled_events_exporter.parser import MAX_EVENTS
from scheduled_events_exporter.simulator import Fault, Simulator
from tests.exporter_process import (
    ExporterProcess,
    clean_env,
    free_port,
    get_json,
    state_dir,
)

FAR = "Mon, 11 Apr 2099 22:26:58 GMT"


def event(event_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "EventId": event_id,
        "EventStatus": "Scheduled",
        "EventType": "Freeze",
        "ResourceType": "VirtualMachine",
        "Resources": ["vm-test"],
        "NotBefore": FAR,
        "Description": "",
        "EventSource": "Platform",
        "DurationInSeconds": 5,
        **extra,
    }


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.timeout(120)
def test_hostile_documents_keep_state_and_process(sim: Simulator, tmp_path: Path) -> None:
    env = clean_env(
        SEE_IMDS_ENDPOINT=sim.url,
        SEE_SINKS="console",
        SEE_STATE_DIR=state_dir(tmp_path),
        SEE_HEALTH_ADDR="",
        SEE_POLL_INTERVAL="0.3",
    )
    with ExporterProcess(env) as proc:
        sim.set_events([event("KEEP")])
        proc.wait_for_records(1, timeout=20)
        hostile = [
            b"{" + b'"a":' * 10 + b" " * (5 * 1024 * 1024) + b"}",  # 5 MB
            b"[" * 200_000 + b"]" * 200_000,  # deeply nested
            b"\xff\xfe\xfa not utf-8",
            json.dumps({"DocumentIncarnation": 2, "Events": [event("X", Resources="vm")]}).encode(),
            json.dumps({"DocumentIncarnation": 2, "Events": None}).encode(),
        ]
        for body in hostile:
            sim.push_fault(Fault("body", body=body))
        before = len(sim.requests)
        assert sim.wait_for_requests(
            before + len(hostile) + 3, timeout=30, path_prefix="/metadata/scheduledevents"
        )
        assert proc.proc.poll() is None
        assert proc.stderr().count("IMDS request failed (invalid_document)") == 1  # once per streak
        # Absurd but well-typed values are accepted and carried, bounded.
        odd = [
            event("OLD", NotBefore="Thu, 01 Jan 1970 00:00:00 GMT", DurationInSeconds=-5),
            event("BIG", NotBefore="9999-12-31T23:59:59Z", DurationInSeconds=2**70),
            event("LONG", Description="d" * 1_000_000),
        ]
        sim.set_events([event("KEEP"), *odd], incarnation=2**80)
        records = proc.wait_for_records(4, timeout=20)
        # Nothing was taken for "no events": KEEP was never cancelled.
        assert [(r["EventId"], r["Transition"]) for r in records] == [
            ("KEEP", "scheduled"),
            ("OLD", "scheduled"),
            ("BIG", "scheduled"),
            ("LONG", "scheduled"),
        ]
        big = records[2]
        assert big["DurationInSeconds"] == 2**62 and big["DocumentIncarnation"] == 2**62
        assert len(records[3]["Description"]) < 10_000
        # Thousands of events (the parser's bound, MAX_EVENTS): bounded time and memory.
        many = [event(f"E{i:05d}") for i in range(MAX_EVENTS)]
        sim.set_events(many)
        proc.wait_for_records(4 + 4 + MAX_EVENTS, timeout=60)  # 4 removed + MAX_EVENTS appeared
        assert rss_mb(proc.proc.pid) < 150
        assert proc.terminate() == 0


@pytest.mark.timeout(90)
def test_secrets_never_appear_in_logs_health_or_check_config(
    sim: Simulator, tmp_path: Path
) -> None:
    secrets = ("OTLPSECRET123", "SASKEYSECRET456")
    port = free_port()
    env = clean_env(
        SEE_IMDS_ENDPOINT=sim.url,
        SEE_SINKS="otlp,eventhubs,console",
        SEE_STATE_DIR=state_dir(tmp_path),
        SEE_HEALTH_ADDR=f"127.0.0.1:{port}",
        SEE_READINESS_INCLUDES="sinks",
        SEE_POLL_INTERVAL="0.3",
        SEE_STALENESS_LIMIT="1",
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{free_port()}",
        OTEL_EXPORTER_OTLP_HEADERS=f"authorization=Bearer {secrets[0]}",
        OTEL_EXPORTER_OTLP_TIMEOUT="1",
        SEE_EVENTHUB_CONNECTION_STRING=(
            f"Endpoint=sb://127.0.0.1:{free_port()};SharedAccessKeyName=send;"
            f"SharedAccessKey={secrets[1]};UseDevelopmentEmulator=true;EntityPath=hub"
        ),
    )
    with ExporterProcess(env) as proc:
        sim.set_events([event("S1")])
        proc.wait_for_records(1, timeout=20)
        proc.wait_for(
            lambda: (
                "sink otlp: delivery failed" in proc.stderr()
                and "sink eventhubs: delivery failed" in proc.stderr()
            ),
            60,
            "failures",
        )
        proc.wait_for(
            lambda: get_json(f"http://127.0.0.1:{port}/readyz")[0] == 503, 20, "sinks failing"
        )
        _status, body = get_json(f"http://127.0.0.1:{port}/readyz")
        assert body["sinks"]["otlp"]["failing"] and body["sinks"]["eventhubs"]["pending"] == 1
        assert proc.terminate(timeout=30) == 0, proc.stderr()[-2000:]
    with ExporterProcess(env, args=("check-config",)) as check:
        assert check.proc.wait(timeout=30) == 0
        check.wait_for_output_end(timeout=10)
    everything = "\n".join(
        [proc.stderr(), *proc.stdout_lines, json.dumps(body), check.stderr(), *check.stdout_lines]
    )
    for secret in secrets:
        assert secret not in everything
    assert "SEE_EVENTHUB_CONNECTION_STRING=<redacted>" in "\n".join(check.stdout_lines)
