"""The rotel test peer against the real OpenTelemetry SDK and the real rotel collector.

Logs and metrics go over both OTLP transports (http/protobuf and gRPC) and are asserted on as
rotel printed them: event name, severity, body, typed attributes, resource, metric kinds, units,
values. The parser is also pinned down on rotel's exact dump format, and restart() is shown to
come back on the same ports with SDK exporters reconnecting by themselves.
"""

from __future__ import annotations

import math
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Sequence

import pytest
from opentelemetry._logs import LogRecord, SeverityNumber
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogs
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetrics
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogs
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetrics
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk._logs import LoggerProvider, ReadableLogRecord
from opentelemetry.sdk._logs.export import (
    BatchLogRecordProcessor,
    LogRecordExporter,
    LogRecordExportResult,
    SimpleLogRecordProcessor,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.util.types import AttributeValue

from tests.peers import rotel as rotel_peer
from tests.peers.rotel import DumpParser, ReceivedLog, ReceivedMetric, RotelReceiver, parse_value

pytestmark = pytest.mark.timeout(60)

EVENT = "azure.scheduled_event.scheduled"
ATTRIBUTES: dict[str, AttributeValue] = {
    "azure.scheduled_event.id": "602d9444-d2cd-49c7-8624-8643e7171297",
    "azure.scheduled_event.type": "Reboot",
    "azure.scheduled_event.resources": ["vm-a", "vm b (2)"],
    "azure.scheduled_event.duration_s": 900,
    "azure.scheduled_event.lead_time_s": 612.5,
    "azure.scheduled_event.user_initiated": False,
}


@pytest.fixture(scope="module")
def rotel() -> Iterator[RotelReceiver]:
    with RotelReceiver() as receiver:
        yield receiver


@pytest.fixture(params=["http", "grpc"])
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def log_exporter(rotel: RotelReceiver, protocol: str) -> LogRecordExporter:
    if protocol == "http":
        return HttpLogs(endpoint=f"{rotel.http_endpoint}/v1/logs", timeout=5)
    return GrpcLogs(endpoint=rotel.grpc_endpoint, insecure=True, timeout=5)


def metric_exporter(rotel: RotelReceiver, protocol: str) -> MetricExporter:
    if protocol == "http":
        return HttpMetrics(endpoint=f"{rotel.http_endpoint}/v1/metrics", timeout=5)
    return GrpcMetrics(endpoint=rotel.grpc_endpoint, insecure=True, timeout=5)


def resource(run: str) -> Resource:
    return Resource.create({"service.name": "scheduled-events-exporter", "test.run": run,
                            "host.name": "vm-1", "azure.vm.zone": 2})


def connectable(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_log_arrives_with_event_name_severity_body_and_typed_attributes(
        rotel: RotelReceiver, protocol: str) -> None:
    run = uuid.uuid4().hex
    provider = LoggerProvider(resource=resource(run), shutdown_on_exit=False)
    provider.add_log_record_processor(SimpleLogRecordProcessor(log_exporter(rotel, protocol)))
    logger = provider.get_logger("scheduled_events_exporter", "0.1.0")
    sent_at, timestamp = time.time(), time.time_ns()
    try:
        logger.emit(event_name=EVENT, severity_number=SeverityNumber.WARN, severity_text="WARN",
                    body="Reboot scheduled for vm-a (in 10 min)", attributes=ATTRIBUTES,
                    timestamp=timestamp)
        logger.emit(LogRecord(event_name="azure.scheduled_event.started",
                              severity_number=SeverityNumber.INFO, body={"k": [1, "two"]}))
        logs = rotel.wait_for_logs(lambda r: r.resource.get("test.run") == run, count=2)
    finally:
        provider.shutdown()

    first, second = logs
    assert first.event_name == EVENT
    assert (first.severity_number, first.severity_text) == (13, "WARN")
    assert first.body == first.body_value == "Reboot scheduled for vm-a (in 10 min)"
    assert first.attributes == ATTRIBUTES
    assert type(first.attributes["azure.scheduled_event.duration_s"]) is int
    assert type(first.attributes["azure.scheduled_event.lead_time_s"]) is float
    assert first.resource["service.name"] == "scheduled-events-exporter"
    assert first.resource["azure.vm.zone"] == 2
    assert first.resource["telemetry.sdk.language"] == "python"
    assert first.scope == "scheduled_events_exporter"
    assert first.timestamp_ns == timestamp
    assert first.observed_timestamp_ns > 0
    assert sent_at <= first.arrival_time <= time.time()
    assert second.event_name == "azure.scheduled_event.started"
    assert (second.severity_number, second.severity_text) == (9, "")
    assert second.body_value == {"k": [1, "two"]}
    assert second.body == "Map(k:Slice(Int(1), Str(two)))"
    assert second.timestamp_ns == 0  # the SDK leaves Timestamp unset unless given
    assert first in rotel.logs


def test_readable_log_record_exported_directly(rotel: RotelReceiver, protocol: str) -> None:
    run = uuid.uuid4().hex
    exporter = log_exporter(rotel, protocol)
    record = ReadableLogRecord(
        log_record=LogRecord(event_name=EVENT, severity_number=SeverityNumber.WARN,
                             severity_text="WARN", body="direct", attributes={"n": 1},
                             timestamp=time.time_ns()),
        resource=resource(run), instrumentation_scope=InstrumentationScope("direct", "1.0"))
    try:
        assert exporter.export([record]) is LogRecordExportResult.SUCCESS
    finally:
        exporter.shutdown()  # type: ignore[no-untyped-call]  # untyped in the SDK
    [log] = rotel.wait_for_logs(lambda r: r.resource.get("test.run") == run)
    assert (log.event_name, log.body, log.attributes, log.scope) == (EVENT, "direct", {"n": 1},
                                                                     "direct")


def test_metrics_arrive_with_kinds_units_values_and_attributes(
        rotel: RotelReceiver, protocol: str) -> None:
    run = uuid.uuid4().hex
    reader = PeriodicExportingMetricReader(metric_exporter(rotel, protocol),
                                           export_interval_millis=3_600_000)
    provider = MeterProvider(resource=resource(run), metric_readers=[reader],
                             shutdown_on_exit=False)
    meter = provider.get_meter("scheduled_events_exporter")

    def pending(_: CallbackOptions) -> Sequence[Observation]:
        return [Observation(3, {"event.type": "Reboot"}),
                Observation(1.5, {"event.type": "Freeze"})]

    def ours(m: ReceivedMetric) -> bool:
        return m.resource.get("test.run") == run

    meter.create_observable_gauge("sched.pending", [pending], unit="{event}",
                                  description="Pending scheduled events")
    polls = meter.create_counter("sched.polls", unit="{poll}", description="IMDS polls")
    latency = meter.create_histogram("sched.poll.duration", unit="s")
    inflight = meter.create_up_down_counter("sched.inflight", unit="{event}")
    polls.add(5, {"outcome": "ok"})
    latency.record(0.2, {"outcome": "ok"})
    latency.record(7)
    inflight.add(4)
    inflight.add(-1)
    try:
        assert reader.force_flush(timeout_millis=10_000)
        gauge = rotel.wait_for_metric("sched.pending", ours)
        counter = rotel.wait_for_metric("sched.polls", ours)
        histogram = rotel.wait_for_metric("sched.poll.duration", ours)
        updown = rotel.wait_for_metric("sched.inflight", ours)

        polls.add(2, {"outcome": "ok"})  # re-exported: both exports are kept, latest is newest
        assert reader.force_flush(timeout_millis=10_000)
        again = rotel.wait_for_metric("sched.polls", lambda m: ours(m) and m.points[0].value == 7)
    finally:
        provider.shutdown()

    assert (gauge.kind, gauge.unit, gauge.description) == ("Gauge", "{event}",
                                                          "Pending scheduled events")
    assert {p.attributes["event.type"]: p.value for p in gauge.points} == {"Reboot": 3.0,
                                                                          "Freeze": 1.5}
    assert gauge.resource["host.name"] == "vm-1"
    assert (counter.kind, counter.unit, counter.is_monotonic) == ("Sum", "{poll}", True)
    assert counter.temporality == "AGGREGATION_TEMPORALITY_CUMULATIVE"
    assert [(p.attributes, p.value) for p in counter.points] == [({"outcome": "ok"}, 5.0)]
    assert (histogram.kind, histogram.unit) == ("Histogram", "s")
    by_attrs = {tuple(p.attributes.items()): p for p in histogram.points}
    ok, bare = by_attrs[(("outcome", "ok"),)], by_attrs[()]
    assert (ok.count, ok.sum, ok.min, ok.max) == (1, 0.2, 0.2, 0.2)
    assert (bare.count, bare.sum) == (1, 7.0)
    assert bare.bounds[:4] == (0.0, 5.0, 10.0, 25.0)
    assert len(bare.bucket_counts) == len(bare.bounds) + 1
    assert (ok.bucket_counts[1], bare.bucket_counts[2]) == (1, 1)
    assert (updown.kind, updown.is_monotonic, updown.points[0].value) == ("Sum", False, 3.0)
    assert again.arrival_time >= counter.arrival_time
    assert rotel.latest_metric("sched.polls") is not None
    assert sum(m.name == "sched.polls" and ours(m) for m in rotel.metrics) >= 2


@pytest.mark.timeout(30)
def test_restart_comes_back_on_the_same_ports_and_exporters_reconnect() -> None:
    run = uuid.uuid4().hex
    with RotelReceiver() as receiver:
        ports = receiver.ports
        provider = LoggerProvider(resource=resource(run), shutdown_on_exit=False)
        for protocol in ("http", "grpc"):
            processor = SimpleLogRecordProcessor(log_exporter(receiver, protocol))
            provider.add_log_record_processor(processor)
        logger = provider.get_logger("restart")
        try:
            logger.emit(body="before")
            receiver.wait_for_logs(lambda r: r.body == "before", count=2)

            receiver.stop()
            receiver.stop()  # idempotent
            assert not connectable(ports[0]) and not connectable(ports[1])
            receiver.restart()
            assert receiver.ports == ports
            assert connectable(ports[0]) and connectable(ports[1])

            logger.emit(body="after")
            after = receiver.wait_for_logs(lambda r: r.body == "after", count=2)
        finally:
            provider.shutdown()
        assert [log.body for log in receiver.logs] == ["before"] * 2 + ["after"] * 2
        assert all(log.resource["test.run"] == run for log in after)
    assert not connectable(ports[0]) and not connectable(ports[1])


def test_first_start_retries_on_new_ports_when_one_was_taken(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = rotel_peer._free_ports
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        offers = iter([(taken, real()[1])])
        monkeypatch.setattr(rotel_peer, "_free_ports", lambda: next(offers, None) or real())
        with RotelReceiver() as receiver:
            assert taken not in receiver.ports
            assert connectable(receiver.ports[0]) and connectable(receiver.ports[1])


@pytest.mark.timeout(30)
def test_restart_waits_for_its_port_to_be_free_again() -> None:
    with RotelReceiver() as receiver:
        ports = receiver.ports
        receiver.stop()
        squatter = socket.socket()
        squatter.bind(("127.0.0.1", ports[0]))
        squatter.listen()
        threading.Timer(0.3, squatter.close).start()  # the port is held for 0.3 s
        started = time.monotonic()
        receiver.restart()
        assert time.monotonic() - started >= 0.25
        assert receiver.ports == ports and connectable(ports[0]) and connectable(ports[1])


def test_many_logs_are_all_parsed(rotel: RotelReceiver) -> None:
    run, n = uuid.uuid4().hex, 1000
    provider = LoggerProvider(resource=resource(run), shutdown_on_exit=False)
    provider.add_log_record_processor(BatchLogRecordProcessor(log_exporter(rotel, "http")))
    logger = provider.get_logger("volume")
    try:
        for i in range(n):
            logger.emit(event_name=EVENT, body=f"event {i}", attributes={"i": i})
        provider.force_flush()
        logs = rotel.wait_for_logs(lambda r: r.resource.get("test.run") == run, count=n)
    finally:
        provider.shutdown()
    assert sorted(log.attributes["i"] for log in logs) == list(range(n))  # type: ignore[type-var]


def test_wait_timeouts_say_what_did_arrive(rotel: RotelReceiver) -> None:
    with pytest.raises(AssertionError, match=r"expected 1 matching log\(s\) within 0.1s"):
        rotel.wait_for_logs(lambda _: False, timeout=0.1)
    with pytest.raises(AssertionError, match=r"no metric 'no\.such\.metric'.*names arrived"):
        rotel.wait_for_metric("no.such.metric", timeout=0.1)


@pytest.mark.parametrize(("notation", "value"), [
    ("Str(hello world)", "hello world"),
    ("Str()", ""),
    ("Str(x) y)", "x) y"),
    ("Int(-42)", -42),
    ("Double(3)", 3.0),
    ("Double(0.0000001)", 1e-7),
    ("Bool(true)", True),
    ("Slice(Str(a), Str(b, c), Int(2))", ["a", "b, c", 2]),
    ("Slice()", []),
    ("Map(m:Map(inner:Slice(Int(1), Str(two), Double(3))), e:Slice(), b:Bytes([1, 255]))",
     {"m": {"inner": [1, "two", 3.0]}, "e": [], "b": b"\x01\xff"}),
    ("Empty", None),
    ("not rotel notation", "not rotel notation"),
])
def test_parse_value(notation: str, value: object) -> None:
    parsed = parse_value(notation)
    assert parsed == value and type(parsed) is type(value)


def test_parse_value_nan() -> None:
    parsed = parse_value("Double(NaN)")
    assert isinstance(parsed, float) and math.isnan(parsed)


# rotel's exact output (trailing spaces included), one log record and one metric
DUMP = [
    "\x1b[2m2026-11-22T02:09:17.730085Z\x1b[0m \x1b[32m INFO\x1b[0m Starting Rotel.",
    "ResourceLog #0",
    "Resource SchemaURL: ",
    "Resource attributes:",
    "     -> service.name: Str(scratch)",
    "ScopeLogs #0",
    "ScopeLogs SchemaURL: ",
    "InstrumentationScope s2 ",
    "LogRecord #0",
    "ObservedTimestamp: 1795313391621189156",
    "Timestamp: 1700000000123456789",
    "SeverityText: ",
    "SeverityNumber: SEVERITY_NUMBER_UNSPECIFIED(0)",
    "Body: Str(line1 (",
    "line2)",
    "Attributes:",
    "     -> nested: Str(x)",
    "    Trace ID       : ",
    "    Span ID        : ",
    "Flags: 0",
    "ResourceMetrics #0",
    "Resource SchemaURL: ",
    "Resource attributes:",
    "     -> service.name: Str(scratch2)",
    "ScopeMetrics #0",
    "ScopeMetrics SchemaURL: ",
    "InstrumentationScope m2 ",
    "Metric #0",
    "Descriptor:",
    "     -> Name: exp.hist",
    "     -> Description: ",
    "     -> Unit: ms",
    "     -> DataType: ExponentialHistogram",
    "     -> AggregationTemporality: AGGREGATION_TEMPORALITY_CUMULATIVE",
    "ExponentialHistogramDataPoints #0",
    "StartTimestamp: 1795313391632314860",
    "Timestamp: 1795313391632763905",
    "Count: 3",
    "Sum: 103",
    "Min: 0",
    "Max: 100",
    "Bucket [0, 0], Count: 1",
    "Bucket (2.9536522918789987, 3.0844216508158815], Count: 1",
    "Exemplars:",
    "Exemplar #0",
    "     -> Trace ID: a88b94285939c138e9a9c208c3f7a442",
    "     -> Timestamp: 1795314703258257985",
    "     -> Value: 3",
]


def test_dump_parser_on_rotel_output() -> None:
    received: list[ReceivedLog | ReceivedMetric] = []
    agent: list[str] = []
    parser = DumpParser(received.append, agent.append)
    for line in DUMP:
        parser.feed(line, 1.5)
    assert len(received) == 1  # the metric has no end marker: it waits for flush()
    parser.flush()
    log, metric = received
    assert isinstance(log, ReceivedLog) and isinstance(metric, ReceivedMetric)
    assert agent == ["2026-11-22T02:09:17.730085Z  INFO Starting Rotel."]
    assert (log.body, log.severity_number, log.event_name) == ("line1 (\nline2", None, "")
    assert (log.attributes, log.resource, log.scope) == ({"nested": "x"},
                                                         {"service.name": "scratch"}, "s2")
    assert (log.timestamp_ns, log.arrival_time) == (1700000000123456789, 1.5)
    assert (metric.name, metric.kind, metric.unit, metric.description) == (
        "exp.hist", "ExponentialHistogram", "ms", "")
    assert metric.resource == {"service.name": "scratch2"}
    [point] = metric.points
    assert (point.count, point.sum, point.min, point.max) == (3, 103.0, 0.0, 100.0)
    assert point.bucket_counts == (1, 1)
    assert (point.attributes, point.time_ns) == ({}, 1795313391632763905)  # exemplars ignored
