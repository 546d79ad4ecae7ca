"""The request and response size limits of OTLP 1.11.0 (docs/otlp-conformance.md, "Request and
response size"), with several records in flight: the OTLP sink, its delivery worker, spool and
dead-letter file in this process, against the scripted OTLP/HTTP and OTLP/gRPC peers of
tests/peers/otlp_standin.py over real loopback sockets, with the limits lowered through the
sink's ``limits`` argument (a record over 64 MiB cannot come out of a 4 MiB IMDS document, so
the process tests cannot reach the request limit):

* a request over the client's request limit is never made: a record that alone makes one is
  dead-lettered with the status ``request_too_large``, counted and said, and the records
  around it are delivered, whatever the collector answers them;
* a metric export over it is not sent either: dropped as refused for good, counted;
* an accepted export whose answer is over the response limit is delivered once (acknowledged,
  never sent again, never dead-lettered), its partial success unknown, counted in
  ``export.failures{signal="response_discarded"}`` and said once per streak.

The process tests of the response limit (the real exporter, both protocols, every form of a
large answer) are in tests/test_otlp_conformance.py.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import AggregationTemporality, MetricExportResult
from opentelemetry.sdk.resources import Resource

from scheduled_events_exporter.config import load_config
from scheduled_events_exporter.model import InstanceInfo, ScheduledEvent, Transition, TransitionKind
from scheduled_events_exporter.otlp_settings import OtlpTarget
from scheduled_events_exporter.records import TransitionRecord
from scheduled_events_exporter.sinks.otlp import (
    RESPONSE_DISCARDED,
    TEMPORALITIES,
    OtlpMetricExporter,
    OtlpSink,
)
from scheduled_events_exporter.sinks.otlp_transport import REQUEST_TOO_LARGE, Limits
from tests.peers.otlp_standin import OtlpGrpcStandIn, OtlpHttpStandIn, Reply
from tests.test_metric_backlog import collected
from tests.test_otlp_transport import serve

AT = datetime(2026, 7, 21, 12, 0, tzinfo=timezone.utc)
#: The request limit the tests lower the client's to: a record of 100 kB is over it alone.
LIMIT = 64 * 1024
SMALL, HUGE = 8_000, 100_000
Failures = list[tuple[str, str, int]]


def record(seq: int, event_id: str, size: int) -> TransitionRecord:
    """A ``scheduled`` record of about ``size`` bytes (its event's description)."""
    happened = ScheduledEvent(event_id, "Scheduled", "Reboot", resources=("vm",),
                              description="d" * size)
    return TransitionRecord(
        Transition(TransitionKind.SCHEDULED, AT, seq, happened),
        InstanceInfo(vm_name="vm"), f"rid-{seq}", True, "0.1.0", seq)


def letters(state: Path) -> list[dict[str, Any]]:
    path = state / "dead-letter.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def wait_until(condition: Callable[[], object], what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s"
        time.sleep(0.01)


def sink_for(endpoint: str, protocol: str, state: Path, failures: Failures,
             limits: Limits) -> OtlpSink:
    config = load_config({
        "SEE_SINKS": "otlp", "SEE_STATE_DIR": str(state),
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_EXPORTER_OTLP_INSECURE": "true", "OTEL_EXPORTER_OTLP_TIMEOUT": "5",
        "OTEL_METRICS_EXPORTER": "none"})
    return OtlpSink(config, lambda *f: failures.append(f), limits=limits)


@pytest.fixture
def running() -> Iterator[list[OtlpSink]]:
    """Sinks a test starts, shut down at its end whatever happened."""
    sinks: list[OtlpSink] = []
    yield sinks
    for sink in sinks:
        sink.shutdown(5)


# --- The request limit -------------------------------------------------------------------------

#: (protocol, the answer to the first request the collector sees; then it accepts everything)
FIRST_ANSWERS = [
    pytest.param("http/protobuf", None, id="http-accepted"),
    pytest.param("http/protobuf", Reply(503, (("Retry-After", "1"),)), id="http-503-retry-after"),
    pytest.param("http/protobuf", Reply(429), id="http-429"),
    pytest.param("http/protobuf", Reply(partial=(1, "one dropped")), id="http-partial-success"),
    pytest.param("http/protobuf", Reply(partial=(0, "w" * 5_000_000)),
                 id="http-answer-over-the-response-limit"),
    pytest.param("grpc", None, id="grpc-accepted"),
    pytest.param("grpc", Reply("UNAVAILABLE", retry_info=1.0), id="grpc-unavailable-retry-info"),
    pytest.param("grpc", Reply("RESOURCE_EXHAUSTED"), id="grpc-resource-exhausted"),
    pytest.param("grpc", Reply(partial=(1, "one dropped")), id="grpc-partial-success"),
    pytest.param("grpc", Reply(partial=(0, "w" * 5_000_000)),
                 id="grpc-answer-over-the-response-limit"),
]


@pytest.mark.parametrize(("protocol", "first"), FIRST_ANSWERS)
@pytest.mark.timeout(60)
def test_a_record_over_the_request_limit_is_never_sent_and_dead_lettered_the_rest_flows(
        tmp_path: Path, running: list[OtlpSink], caplog: pytest.LogCaptureFixture,
        protocol: str, first: Reply | None) -> None:
    # OTLP 1.11.0, "OTLP/HTTP Request" / "OTLP/gRPC Request": the client MUST NOT make a
    # request over its limit and SHOULD record that it was discarded. Five records in flight
    # at once, the third over the limit alone; the collector's first answer is scripted.
    script = [first]
    standin = OtlpGrpcStandIn if protocol == "grpc" else OtlpHttpStandIn
    state = tmp_path / "state"
    failures: Failures = []
    ids = ["S-1", "S-2", "HUGE", "S-3", "S-4"]
    with standin(lambda ids: script.pop(0) if script else None) as collector:
        sink = sink_for(collector.endpoint, protocol, state, failures, Limits(LIMIT))
        running.append(sink)
        sink.start(Resource.create({}))
        with caplog.at_level(logging.INFO):
            sink.submit([record(n + 1, event_id, HUGE if event_id == "HUGE" else SMALL)
                         for n, event_id in enumerate(ids)])
            collector.wait_for(lambda a: len(a) >= 4, 30, "the four records within the limit")
            wait_until(lambda: sink.status().pending == 0, "everything acknowledged")
            # The event behind them: delivered as ever.
            sink.submit([record(6, "AFTER", SMALL)])
            collector.wait_for(lambda a: len(a) >= 5, 30, "the record after")
    assert [a.event_id for a in collector.accepted] == ["S-1", "S-2", "S-3", "S-4", "AFTER"]
    # Never made: no request over the limit reached the collector, nor any holding HUGE.
    assert all(r.size <= LIMIT for r in collector.log), collector.log
    assert all("HUGE" not in refused for _, refused in collector.refused)
    (letter,) = letters(state)
    assert (letter["event_id"], letter["status"]) == ("HUGE", REQUEST_TOO_LARGE), letter
    assert f"over the client's limit of {LIMIT} bytes; it was not sent" in letter["reason"]
    # The drop recorded: counted, in /readyz, one ERROR line naming the record.
    assert ("otlp", "dead_letter", 1) in failures
    assert sink.status().dead_lettered == 1
    lines = [r.getMessage() for r in caplog.records
             if r.levelno == logging.ERROR and "EventId HUGE" in r.getMessage()]
    assert len(lines) == 1 and REQUEST_TOO_LARGE in lines[0], lines


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_a_request_exactly_at_the_limit_is_sent(
        tmp_path: Path, running: list[OtlpSink], protocol: str) -> None:
    # The limit is the largest request made, not the first refused.
    from scheduled_events_exporter.sinks.otlp_proto import logs_request

    standin = OtlpGrpcStandIn if protocol == "grpc" else OtlpHttpStandIn
    one = record(1, "EXACT", HUGE)
    size = logs_request([one], Resource.create({})).ByteSize()
    with standin() as collector:
        sink = sink_for(collector.endpoint, protocol, tmp_path / "state", [], Limits(size))
        running.append(sink)
        sink.start(Resource.create({}))
        sink.submit([one])
        collector.wait_for(lambda a: len(a) == 1, 30, "the record at the limit")
    assert [r.size for r in collector.log] == [size]
    assert letters(tmp_path / "state") == []


@pytest.mark.parametrize("preference", ["delta", "cumulative"])
def test_a_metric_export_over_the_request_limit_is_not_sent_and_is_counted(
        preference: str, caplog: pytest.LogCaptureFixture) -> None:
    temporality = (AggregationTemporality.DELTA if preference == "delta"
                   else AggregationTemporality.CUMULATIVE)
    failures: Failures = []
    for http in serve():
        exporter = OtlpMetricExporter(
            OtlpTarget("metrics", endpoint=f"http://127.0.0.1:{http.port}/v1/metrics",
                       timeout=5.0), "otlp", lambda *f: failures.append(f),
            temporality=TEMPORALITIES[preference], limits=Limits(max_request_bytes=64))
        try:
            with caplog.at_level(logging.INFO):
                result = exporter.export(collected(0, 2, temporality))
        finally:
            exporter.shutdown()
        assert result is MetricExportResult.FAILURE
        assert http.seen == [], "never sent"
    assert ("otlp", "metrics", 1) in failures
    # Refused for good: the delta points are dropped (not kept to fail again), and counted;
    # cumulative totals are read again by the next export, nothing to drop.
    dropped = [f for f in failures if f[1] == "metrics_dropped"]
    assert dropped == ([("otlp", "metrics_dropped", 1)] if preference == "delta" else [])
    said = [r.getMessage() for r in caplog.records if "metric export failed" in r.getMessage()]
    assert len(said) == 1 and "not sent: the request is" in said[0], said


# --- The response limit ------------------------------------------------------------------------

@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
@pytest.mark.timeout(60)
def test_an_accepted_export_whose_answer_is_over_the_limit_is_delivered_and_counted(
        tmp_path: Path, running: list[OtlpSink], caplog: pytest.LogCaptureFixture,
        protocol: str) -> None:
    # OTLP 1.11.0, "OTLP/HTTP Response" / "OTLP/gRPC Response": an answer over the limit is a
    # non-retryable error. For an accepted request: delivered, never sent again, never
    # dead-lettered, partial success unknown, counted. Lowered to 16 KiB here, answered with
    # 100 kB (then small again, then large again: once per streak).
    big = Reply(partial=(3, "x" * 100_000))
    script = [big, big, None, big]
    standin = OtlpGrpcStandIn if protocol == "grpc" else OtlpHttpStandIn
    state = tmp_path / "state"
    failures: Failures = []
    with standin(lambda ids: script.pop(0) if script else None) as collector:
        sink = sink_for(collector.endpoint, protocol, state, failures,
                        Limits(max_response_bytes=16 * 1024))
        running.append(sink)
        sink.start(Resource.create({}))
        with caplog.at_level(logging.INFO):
            for seq in range(1, 5):  # one after the other: four requests, four answers
                sink.submit([record(seq, f"R-{seq}", SMALL)])
                collector.wait_for(lambda a, n=seq: len(a) >= n, 30, f"R-{seq}")
                wait_until(lambda: sink.status().pending == 0, "acknowledged")
    assert [a.event_id for a in collector.accepted] == ["R-1", "R-2", "R-3", "R-4"]
    assert [r.verdict for r in collector.log] == [None] * 4, "each sent once"
    assert letters(state) == [] and sink.status().dead_lettered == 0
    # Counted each time; the rejected count of 3 in the unread answers is unknown to us.
    assert [f for f in failures if f[1] == RESPONSE_DISCARDED] == [
        ("otlp", RESPONSE_DISCARDED, 1)] * 3
    assert not [f for f in failures if f[1] == "logs"], failures
    said = [r.getMessage() for r in caplog.records if "is unknown" in r.getMessage()]
    assert len(said) == 2, said  # once per streak: R-1 (R-2 alike), then R-4
    status = "HTTP 200" if protocol == "http/protobuf" else "gRPC OK"
    assert said[0].startswith(f"sink otlp: the collector accepted the request of 1 records "
                              f"({status}) but the response was larger than 16384 bytes and "
                              "was discarded unread: whether it dropped some of them"), said[0]


def test_an_accepted_metric_export_whose_answer_is_over_the_limit_is_counted(
        caplog: pytest.LogCaptureFixture) -> None:
    failures: Failures = []
    delta = AggregationTemporality.DELTA
    for http in serve():
        http.replies += [(200, {"Content-Type": "application/x-protobuf"}, b"\x0a" + b"x" * 5000)
                         ] * 2
        exporter = OtlpMetricExporter(
            OtlpTarget("metrics", endpoint=f"http://127.0.0.1:{http.port}/v1/metrics",
                       timeout=5.0), "otlp", lambda *f: failures.append(f),
            temporality=TEMPORALITIES["delta"], limits=Limits(max_response_bytes=1024))
        try:
            with caplog.at_level(logging.INFO):
                first = exporter.export(collected(0, 2, delta))
                second = exporter.export(collected(1, 1, delta))
        finally:
            exporter.shutdown()
        assert (first, second) == (MetricExportResult.SUCCESS, MetricExportResult.SUCCESS)
        assert len(http.seen) == 2, "each export sent once, none kept to send again"
    assert failures == [("otlp", RESPONSE_DISCARDED, 1)] * 2
    said = [r.getMessage() for r in caplog.records if "is unknown" in r.getMessage()]
    assert len(said) == 1 and "larger than 1024 bytes" in said[0], said
