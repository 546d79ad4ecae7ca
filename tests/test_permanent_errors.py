"""Permanent vs transient sink errors, with the real exporter process and real receivers.

* A collector that answers 400 (http/protobuf) or INVALID_ARGUMENT (gRPC) to any request holding
  one event's id: the other event's records arrive in order, the rejected ones are in the
  dead-letter file, one log line names the status and the EventId, the process stays up.
* The same receiver answering 503 for 15 s: everything arrives afterwards, in order, each
  transition exactly once after de-duplication by ``log.record.uid``.
* 401: a configuration error, retried (never dead-lettered) and shown by ``/readyz``.
* 404: the error names the URL posted to (logs and metrics), never its userinfo or query.
* Event Hubs: a message larger than the hub accepts (the real SDK against the AMQP peer) is
  dead-lettered; the others arrive.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from scheduled_events_exporter.simulator import Simulator
from tests.exporter_process import (
    ExporterProcess,
    clean_env,
    free_port,
    get_json,
    state_dir,
    wait_until,
)
from tests.peers.otlp_standin import Accepted, OtlpGrpcStandIn, OtlpHttpStandIn

VM = "vm-test"
GOOD = "GOOD-1"
BAD = "BAD-1"
FAR = "Mon, 11 Apr 2099 22:26:58 GMT"


def event(event_id: str, status: str = "Scheduled", description: str = "") -> dict[str, Any]:
    return {
        "EventId": event_id,
        "EventStatus": status,
        "EventType": "Reboot",
        "ResourceType": "VirtualMachine",
        "Resources": [VM],
        "NotBefore": FAR if status == "Scheduled" else "",
        "Description": description,
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }


def otlp_env(sim: Simulator, tmp_path: Path, endpoint: str, protocol: str) -> dict[str, str]:
    return clean_env(
        SEE_IMDS_ENDPOINT=sim.url,
        SEE_SINKS="otlp",
        SEE_STATE_DIR=state_dir(tmp_path),
        SEE_HEALTH_ADDR=f"127.0.0.1:{free_port()}",
        SEE_READINESS_INCLUDES="sinks",
        SEE_POLL_INTERVAL="0.3",
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
        OTEL_EXPORTER_OTLP_INSECURE="true",
        OTEL_EXPORTER_OTLP_TIMEOUT="5",
    )


def dead_letters(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "state" / "dead-letter.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def seen(accepted: list[Accepted], event_id: str | None = None) -> list[tuple[str, str]]:
    return [(a.event_id, a.transition) for a in accepted if event_id in (None, a.event_id)]


def readyz(env: dict[str, str]) -> tuple[int, dict[str, Any]]:
    return get_json(f"http://{env['SEE_HEALTH_ADDR']}/readyz")


# Both events in one document: their records travel in one batch, which the collector refuses
# as a whole; the exporter must find the culprit and deliver the other.
STEPS = [
    ([event(BAD), event(GOOD)], "scheduled"),
    ([event(BAD, "Started"), event(GOOD, "Started")], "started"),
    ([], "completed"),
]


@pytest.mark.parametrize(("protocol", "refusal", "shown"), [
    ("http/protobuf", 400, "HTTP 400"),
    ("grpc", "INVALID_ARGUMENT", "gRPC INVALID_ARGUMENT"),
])
@pytest.mark.timeout(120)
def test_a_record_the_collector_never_accepts_is_dead_lettered_and_the_rest_flows(
    sim: Simulator, tmp_path: Path, protocol: str, refusal: int | str, shown: str
) -> None:
    standin_class = OtlpGrpcStandIn if protocol == "grpc" else OtlpHttpStandIn
    with standin_class(lambda ids: refusal if BAD in ids else None) as collector:
        env = otlp_env(sim, tmp_path, collector.endpoint, protocol)
        with ExporterProcess(env) as proc:
            for document, transition in STEPS:
                sim.set_events(document)
                collector.wait_for(lambda a, t=transition: (GOOD, t) in seen(a), 30,
                                   f"{GOOD} {transition}")
            wait_until(lambda: len(dead_letters(tmp_path)) == 3, 30, "3 dead letters")
            status, body = readyz(env)
            assert proc.proc.poll() is None, "the exporter must stay up"
            assert proc.terminate() == 0
    assert seen(collector.accepted) == [(GOOD, "scheduled"), (GOOD, "started"),
                                        (GOOD, "completed")]
    # The refused batch held both records; the culprit alone was refused afterwards.
    assert any(GOOD in ids and BAD in ids for _, ids in collector.refused)
    letters = dead_letters(tmp_path)
    assert [(d["event_id"], d["transition"]) for d in letters] == [
        (BAD, "scheduled"), (BAD, "started"), (BAD, "completed")]
    for letter in letters:
        assert letter["sink"] == "otlp" and letter["status"] == shown
        assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$", letter["time"])
        # The record as it would have been sent: an OTLP/JSON ExportLogsServiceRequest.
        (log_record,) = letter["payload"]["resourceLogs"][0]["scopeLogs"][0]["logRecords"]
        attrs = {a["key"]: a["value"] for a in log_record["attributes"]}
        assert attrs["azure.scheduled_event.id"] == {"stringValue": BAD}
        assert attrs["log.record.uid"] == {"stringValue": letter["record_id"]}
        assert log_record["eventName"] == f"azure.scheduled_event.{letter['transition']}"
    lines = [line for line in proc.stderr_lines if "rejected the record" in line]
    assert len(lines) == 3, proc.stderr()
    assert all(shown in line and f"EventId {BAD}" in line and "sink otlp" in line
               for line in lines)
    assert status == 200, body
    assert body["sinks"]["otlp"]["dead_lettered"] == 3


@pytest.mark.timeout(150)
def test_503_for_15_s_loses_nothing_and_keeps_order(sim: Simulator, tmp_path: Path) -> None:
    outage = {"until": 0.0}
    with OtlpHttpStandIn(
        lambda ids: 503 if time.monotonic() < outage["until"] else None
    ) as collector:
        env = otlp_env(sim, tmp_path, collector.endpoint, "http/protobuf")
        with ExporterProcess(env) as proc:
            sim.set_events([event("E-1")])
            collector.wait_for(lambda a: ("E-1", "scheduled") in seen(a), 30, "E-1 scheduled")
            outage["until"] = time.monotonic() + 15
            # Transitions while the collector answers 503, each seen by the exporter (one line
            # per transition in its diagnostic log) before the next document.
            def transitions_logged() -> int:
                return sum(1 for line in proc.stderr_lines if ": azure.scheduled_event." in line)

            for count, document in enumerate([
                [event("E-1", "Started")],
                [event("E-1", "Started"), event("E-2")],
                [event("E-2")],
                [],
            ], start=2):
                sim.set_events(document)
                proc.wait_for(lambda c=count: transitions_logged() >= c, 20, f"{count} transitions")
            assert time.monotonic() < outage["until"], "the transitions must fall in the outage"
            proc.wait_for(lambda: "sink otlp: delivery failed" in proc.stderr(), 20,
                          "a failed delivery")
            collector.wait_for(lambda a: len({x.uid for x in a}) >= 5, 60, "5 distinct records")
            assert proc.terminate() == 0
    assert collector.refused and all(verdict == 503 for verdict, _ in collector.refused)
    unique: dict[str, tuple[str, str]] = {}
    for accepted in collector.accepted:
        assert unique.setdefault(accepted.uid, (accepted.event_id, accepted.transition)) == (
            accepted.event_id, accepted.transition)
    assert list(unique.values()) == [
        ("E-1", "scheduled"), ("E-1", "started"), ("E-2", "scheduled"),
        ("E-1", "completed"), ("E-2", "cancelled")]
    assert dead_letters(tmp_path) == []


@pytest.mark.timeout(120)
def test_401_is_a_configuration_error_retried_never_dead_lettered(
    sim: Simulator, tmp_path: Path
) -> None:
    refusing = {"on": True}
    with OtlpHttpStandIn(lambda ids: 401 if refusing["on"] else None) as collector:
        env = otlp_env(sim, tmp_path, collector.endpoint, "http/protobuf")
        with ExporterProcess(env) as proc:
            sim.set_events([event("A-1")])
            proc.wait_for(lambda: "HTTP 401" in proc.stderr(), 30, "the 401 log line")

            def not_ready() -> bool:
                status, body = readyz(env)
                return status == 503 and "authentication failed" in body["sinks"]["otlp"][
                    "config_error"]

            wait_until(not_ready, 20, "/readyz reporting the configuration error")
            line = next(x for x in proc.stderr_lines if "HTTP 401" in x)
            assert "ERROR" in line and "OTEL_EXPORTER_OTLP_HEADERS" in line
            assert "nothing will be delivered until this is fixed" in line
            refusing["on"] = False
            collector.wait_for(lambda a: ("A-1", "scheduled") in seen(a), 60, "A-1 after the fix")
            wait_until(lambda: readyz(env)[1]["sinks"]["otlp"]["config_error"] == "", 10,
                       "the configuration error cleared")
            assert proc.terminate() == 0
    assert dead_letters(tmp_path) == []


@pytest.mark.timeout(60)
def test_a_404_names_the_url_posted_to_without_userinfo_or_query(
    sim: Simulator, tmp_path: Path
) -> None:
    # A signal's own endpoint given as a base URL: the signal's path is appended twice. The
    # error says which URL was posted to (what the operator must compare with the collector),
    # and never the userinfo or the query, where credentials hide.
    with OtlpHttpStandIn() as collector:  # it answers 404 to any path but /v1/logs, /v1/metrics
        port = collector.endpoint.rsplit(":", 1)[1]
        base = f"http://otlp-user:pa55w0rd@127.0.0.1:{port}"
        env = otlp_env(sim, tmp_path, collector.endpoint, "http/protobuf")
        env.update(OTEL_EXPORTER_OTLP_LOGS_ENDPOINT=f"{base}/v1/logs/v1/logs?token=t0k3n",
                   OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=f"{base}/v1/metrics/v1/metrics?token=t0k3n",
                   OTEL_METRICS_EXPORTER="otlp", OTEL_METRIC_EXPORT_INTERVAL="1000")
        with ExporterProcess(env) as proc:
            sim.set_events([event("U-1")])
            for signal in ("logs", "metrics"):
                said = f"HTTP 404 to POST http://127.0.0.1:{port}/v1/{signal}/v1/{signal} "
                proc.wait_for(lambda said=said: said in proc.stderr(), 30, said)
            wait_until(lambda: "/v1/logs/v1/logs" in readyz(env)[1]["sinks"]["otlp"][
                "config_error"], 20, "/readyz naming the URL")
            config_error = readyz(env)[1]["sinks"]["otlp"]["config_error"]
            assert proc.terminate() == 0
    logs = next(x for x in proc.stderr_lines if "HTTP 404" in x and "/v1/logs" in x)
    assert "ERROR" in logs and "endpoint not found" in logs, logs
    assert "the path repeats /v1/logs" in logs, logs
    metrics = next(x for x in proc.stderr_lines if "HTTP 404" in x and "/v1/metrics" in x)
    assert "metric export failed" in metrics and "the path repeats /v1/metrics" in metrics
    assert f"POST http://127.0.0.1:{port}/v1/logs/v1/logs " in config_error
    for text in (proc.stderr(), "\n".join(proc.stdout_lines), config_error):
        assert "pa55w0rd" not in text and "otlp-user" not in text and "t0k3n" not in text


@pytest.mark.timeout(120)
def test_eventhubs_message_too_large_for_the_hub_is_dead_lettered(
    sim: Simulator, tmp_path: Path
) -> None:
    pytest.importorskip("proton")
    from tests.peers.amqp_peer import AmqpPeer

    huge = "x" * 8000  # fits our 48 KB bound, not this hub's 6000-byte messages
    with AmqpPeer(hubs={"hub"}, max_message_size=6000) as peer:
        env = clean_env(
            SEE_IMDS_ENDPOINT=sim.url,
            SEE_SINKS="eventhubs",
            SEE_EVENTHUB_CONNECTION_STRING=peer.connection_string("hub"),
            SEE_STATE_DIR=state_dir(tmp_path),
            SEE_HEALTH_ADDR="",
            SEE_POLL_INTERVAL="0.3",
            SEE_SHUTDOWN_TIMEOUT="3",
        )

        def transitions() -> list[tuple[str, str]]:
            bodies = [json.loads(m.body) for m in peer.received
                      if m.application_properties.get("RecordKind") == "transition"]
            return [(b["EventId"], b["Transition"]) for b in bodies]

        with ExporterProcess(env) as proc:
            sim.set_events([event(BAD, description=huge), event(GOOD)])
            wait_until(lambda: (GOOD, "scheduled") in transitions(), 40, "GOOD scheduled")
            sim.set_events([])
            wait_until(lambda: (GOOD, "cancelled") in transitions(), 40, "GOOD cancelled")
            wait_until(lambda: len(dead_letters(tmp_path)) == 2, 20, "2 dead letters")
            assert proc.terminate() == 0
        assert peer.errors == []
    # Both of BAD's records carry its Description, so both are too large for this hub.
    assert transitions() == [(GOOD, "scheduled"), (GOOD, "cancelled")]
    letters = dead_letters(tmp_path)
    assert [(d["event_id"], d["transition"]) for d in letters] == [
        (BAD, "scheduled"), (BAD, "cancelled")]
    for letter in letters:
        assert letter["sink"] == "eventhubs"
        assert letter["status"] == "Event Hubs message_too_large"
        assert letter["payload"]["body"]["Description"] == huge
        assert letter["payload"]["properties"]["RecordKind"] == "transition"
    assert any("Event Hubs message_too_large rejected the record of EventId BAD-1" in line
               for line in proc.stderr_lines)
