"""The OTLP messages the exporter builds itself (sinks/otlp_proto.py, pure): a transition as a
log record with docs/semantics.md#records' attribute types, and the SDK's collected metrics as
the OTLP metrics data model lays them out. Delivery to a real collector: tests/test_otlp.py."""

from __future__ import annotations

import math
from typing import Any

import pytest
from opentelemetry.metrics import Observation
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb
from opentelemetry.sdk.metrics import (
    AlwaysOnExemplarFilter,
    Counter,
    Exemplar,
    Histogram,
    MeterProvider,
    ObservableGauge,
    UpDownCounter,
)
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Buckets,
    ExponentialHistogram,
    ExponentialHistogramDataPoint,
    InMemoryMetricReader,
    Metric,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.metrics.view import (
    Aggregation,
    ExplicitBucketHistogramAggregation,
    ExponentialBucketHistogramAggregation,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from scheduled_events_exporter.model import Transition, TransitionKind
from scheduled_events_exporter.records import make_record, to_attributes
from scheduled_events_exporter.sinks.otlp_proto import (
    any_value,
    as_json,
    logs_request,
    metrics_request,
)
from scheduled_events_exporter.telemetry import NOTICE_BUCKETS
from tests.test_records import AT, FREEZE, VM

RESOURCE = Resource.create({"service.name": "see", "host.id": "vm-1"})


def value(message: AnyValue) -> Any:
    kind = message.WhichOneof("value")
    if kind == "array_value":
        return [value(v) for v in message.array_value.values]
    return getattr(message, kind)


def test_a_transition_is_one_log_record_with_its_event_name_severity_and_typed_attributes(
) -> None:
    record = make_record(Transition(TransitionKind.STARTED, AT, 3, FREEZE, unannounced=True),
                         VM, seq=4)
    request = logs_request([record], RESOURCE)
    (resource_logs,) = request.resource_logs
    assert {kv.key: value(kv.value) for kv in resource_logs.resource.attributes} == {
        "service.name": "see", "host.id": "vm-1",
        **{k: value(any_value(v)) for k, v in RESOURCE.attributes.items()}}
    (scope_logs,) = resource_logs.scope_logs
    assert scope_logs.scope.name == "scheduled_events_exporter"
    (log,) = scope_logs.log_records
    assert log.event_name == "azure.scheduled_event.started"
    assert (log.severity_number, log.severity_text) == (17, "ERROR")  # unannounced: ERROR
    assert log.time_unix_nano == log.observed_time_unix_nano == int(AT.timestamp() * 1e9)
    assert log.body.string_value.startswith("Freeze")
    attributes = {kv.key: value(kv.value) for kv in log.attributes}
    assert attributes == {k: list(v) if isinstance(v, tuple) else v
                          for k, v in dict(to_attributes(record)).items()}
    assert attributes["azure.scheduled_event.resources"] == ["WestNO_0", "WestNO_1"]
    assert attributes["azure.scheduled_event.unannounced"] is True
    assert attributes["azure.scheduled_event.duration"] == 5
    # The dead-letter form: the protobuf JSON mapping, integer enums.
    letter = as_json(request)
    assert letter["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0][  # type: ignore[index]
        "severityNumber"] == 17


def test_records_keep_their_order_in_one_request() -> None:
    records = [make_record(Transition(kind, AT, 3, FREEZE), VM, seq=i) for i, kind in
               enumerate((TransitionKind.SCHEDULED, TransitionKind.STARTED,
                          TransitionKind.COMPLETED), 1)]
    logs = logs_request(records, RESOURCE).resource_logs[0].scope_logs[0].log_records
    assert [r.event_name.rsplit(".", 1)[1] for r in logs] == ["scheduled", "started",
                                                               "completed"]


@pytest.mark.parametrize(("given", "expected"), [
    (True, AnyValue(bool_value=True)), (7, AnyValue(int_value=7)),
    (1.5, AnyValue(double_value=1.5)), ("x", AnyValue(string_value="x")),
])
def test_any_value_keeps_the_type(given: object, expected: AnyValue) -> None:
    assert any_value(given) == expected


def test_any_value_refuses_what_otlp_cannot_carry() -> None:
    with pytest.raises(TypeError, match="expected a str, bool, int, float"):
        any_value({"a": 1})


def test_metrics_keep_their_kind_temporality_and_points() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(resource=RESOURCE, metric_readers=[reader])
    meter = provider.get_meter("scheduled_events_exporter", "1.2.3")
    meter.create_counter("c", unit="{x}", description="a counter").add(3, {"k": "v"})
    meter.create_histogram("h", unit="s").record(0.2)
    meter.create_observable_gauge("g", callbacks=[lambda _: [Observation(2.5, {"id": "E1"})]])
    try:
        request = metrics_request(reader.get_metrics_data())  # type: ignore[arg-type]
    finally:
        provider.shutdown()
    (resource_metrics,) = request.resource_metrics
    (scope,) = resource_metrics.scope_metrics
    assert (scope.scope.name, scope.scope.version) == ("scheduled_events_exporter", "1.2.3")
    metrics = {m.name: m for m in scope.metrics}
    counter = metrics["c"]
    assert (counter.unit, counter.description) == ("{x}", "a counter")
    assert counter.sum.is_monotonic
    assert counter.sum.aggregation_temporality == pb.AGGREGATION_TEMPORALITY_CUMULATIVE
    (point,) = counter.sum.data_points
    assert (point.as_int, value(point.attributes[0].value)) == (3, "v")
    assert point.start_time_unix_nano > 0 and point.time_unix_nano >= point.start_time_unix_nano
    (histogram,) = metrics["h"].histogram.data_points
    assert (histogram.count, histogram.sum, histogram.min, histogram.max) == (1, 0.2, 0.2, 0.2)
    assert sum(histogram.bucket_counts) == 1
    assert len(histogram.bucket_counts) == len(histogram.explicit_bounds) + 1
    (gauge,) = metrics["g"].gauge.data_points
    assert (gauge.as_double, value(gauge.attributes[0].value)) == (2.5, "E1")


def _collect(aggregation: Aggregation, temporality: AggregationTemporality) -> MetricsData:
    """Every instrument kind, collected with ``aggregation`` for histograms, ``temporality``
    for all, exemplars on (some recorded inside a span) and a scope with attributes."""
    reader = InMemoryMetricReader(
        preferred_temporality={kind: temporality for kind in (
            Counter, UpDownCounter, Histogram, ObservableGauge)},
        preferred_aggregation={Histogram: aggregation})
    provider = MeterProvider(resource=RESOURCE, metric_readers=[reader],
                             exemplar_filter=AlwaysOnExemplarFilter())
    meter = provider.get_meter("scheduled_events_exporter", "1.2.3",
                               attributes={"k8s.pod.name": "see-0", "replica": 2})
    tracer = TracerProvider().get_tracer("test")
    meter.create_counter("c", unit="{x}", description="a counter").add(3, {"k": "v", "n": 2})
    meter.create_up_down_counter("u").add(-4)
    histogram = meter.create_histogram("h", unit="s",
                                       explicit_bucket_boundaries_advisory=NOTICE_BUCKETS)
    with tracer.start_as_current_span("poll"):
        histogram.record(0.2, {"ok": True})
        meter.create_counter("c2").add(1.5)
    for seconds in (0.0, 7.5, 3600.0, 3600.0):
        histogram.record(seconds, {"ok": True})
    meter.create_observable_gauge(
        "g", callbacks=[lambda _: [Observation(2.5, {"id": "E1"}), Observation(-1, {"id": "E2"})]])
    try:
        data = reader.get_metrics_data()
    finally:
        provider.shutdown()
    assert data is not None
    return data


@pytest.mark.parametrize("temporality", [AggregationTemporality.CUMULATIVE,
                                         AggregationTemporality.DELTA], ids=["cumulative", "delta"])
@pytest.mark.parametrize(("aggregation", "kind"), [
    (ExplicitBucketHistogramAggregation(), "histogram"),
    (ExponentialBucketHistogramAggregation(), "exponential_histogram"),
], ids=["explicit", "exponential"])
def test_metrics_request_is_byte_for_byte_what_the_sdks_own_encoder_builds(
        aggregation: Aggregation, kind: str, temporality: AggregationTemporality) -> None:
    """A second, independent implementation: the OTLP exporters' public ``encode_metrics``
    (a test dependency only) must build the same bytes from the same collection, for every
    histogram aggregation the SDK offers, with exemplars and scope attributes."""
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics

    data = _collect(aggregation, temporality)
    ours = metrics_request(data)
    assert ours.SerializeToString(deterministic=True) == encode_metrics(data).SerializeToString(
        deterministic=True)
    # The shapes the comparison covered are there (a vacuous match proves nothing).
    (scope,) = ours.resource_metrics[0].scope_metrics
    assert {kv.key: value(kv.value) for kv in scope.scope.attributes} == {
        "k8s.pod.name": "see-0", "replica": 2}
    metrics = {m.name: m for m in scope.metrics}
    assert metrics["h"].WhichOneof("data") == kind
    (point,) = getattr(metrics["h"], kind).data_points
    assert point.count == 5 and point.exemplars
    assert getattr(metrics["h"], kind).aggregation_temporality == temporality.value
    in_span = [e for m in scope.metrics for p in _points(m) for e in p.exemplars if e.trace_id]
    assert in_span and all(len(e.trace_id) == 16 and len(e.span_id) == 8 for e in in_span)


def _points(metric: pb.Metric) -> Any:
    return getattr(metric, metric.WhichOneof("data")).data_points


def test_an_exponential_histogram_with_negative_and_empty_ranges_is_the_sdks_bytes() -> None:
    """Shapes the SDK's histogram instrument never records (negative values, no positive
    buckets, the no-recorded-value flag), built by hand: still the public encoder's bytes."""
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics

    exemplars = [Exemplar({"why": "late"}, -2, 10), Exemplar({}, 0.5, 11, span_id=7,
                                                              trace_id=2**127 + 5)]
    points = [
        ExponentialHistogramDataPoint({"a": "b"}, 1, 20, 4, -3.5, 3, 1, Buckets(0, []),
                                      Buckets(-2, [1, 0, 2]), 0, -2.0, 0.0, exemplars),
        ExponentialHistogramDataPoint({}, 1, 20, 0, 0, 0, 0, Buckets(0, []), Buckets(0, []),
                                      1, math.inf, -math.inf),
    ]
    metric = Metric("e", "", "s", ExponentialHistogram(points, AggregationTemporality.DELTA))
    data = MetricsData([ResourceMetrics(RESOURCE, [ScopeMetrics(
        InstrumentationScope("s", None, None, {"x": 1.5}), [metric], "")], "")])
    ours = metrics_request(data)
    assert ours.SerializeToString(deterministic=True) == encode_metrics(data).SerializeToString(
        deterministic=True)
    first = ours.resource_metrics[0].scope_metrics[0].metrics[0].exponential_histogram
    assert list(first.data_points[0].negative.bucket_counts) == [1, 0, 2]
    assert not first.data_points[0].HasField("positive")
