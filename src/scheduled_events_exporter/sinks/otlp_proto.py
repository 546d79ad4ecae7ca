"""OTLP requests from our records and from the SDK's collected metrics (pure).

The messages are ``opentelemetry-proto``'s generated classes, the public form of the OTLP
protocol; encoding them here, rather than through the SDK exporters' private encoders, keeps
the OTLP route on public interfaces only (docs/decisions.md). Log records: one per transition,
``event_name`` the OTLP field, attributes typed as docs/semantics.md#records says. Metrics: the
SDK's ``MetricsData`` as the OTLP metrics data model lays them out: every kind the SDK's
aggregations produce (gauges, sums, explicit-bucket and base-2 exponential histograms), with
their exemplars and the scope's attributes, so that a user's choice of
``OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION`` or ``OTEL_METRICS_EXEMPLAR_FILTER``
reaches the collector as it would through the SDK's own exporters (tests/test_otlp_proto.py
compares the bytes with theirs for every shape).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from google.protobuf.json_format import MessageToDict  # type: ignore[import-untyped]
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import (
    AnyValue,
    ArrayValue,
    InstrumentationScope,
    KeyValue,
)
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs, SeverityNumber
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb
from opentelemetry.proto.resource.v1.resource_pb2 import Resource as ResourceMessage
from opentelemetry.sdk.metrics import Exemplar
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    ExponentialHistogram,
    ExponentialHistogramDataPoint,
    Gauge,
    Histogram,
    HistogramDataPoint,
    MetricsData,
    NumberDataPoint,
    Sum,
)
from opentelemetry.sdk.metrics.export import (
    Buckets as SdkBuckets,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope as SdkScope

from scheduled_events_exporter import __version__
from scheduled_events_exporter.records import TransitionRecord, body, to_attributes
from scheduled_events_exporter.telemetry import SCOPE_NAME, severity


def any_value(value: object) -> AnyValue:
    """An attribute value as OTLP carries it (bool before int: a bool is an int in Python)."""
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, str):
        return AnyValue(string_value=value)
    if isinstance(value, bytes):
        return AnyValue(bytes_value=value)
    if isinstance(value, Sequence):
        return AnyValue(array_value=ArrayValue(values=[any_value(v) for v in value]))
    raise TypeError(f"expected a str, bool, int, float or a sequence of them, got "
                    f"{type(value).__name__}")


def key_values(attributes: Mapping[str, Any] | None) -> list[KeyValue]:
    return [KeyValue(key=k, value=any_value(v)) for k, v in (attributes or {}).items()]


def _resource(resource: Resource) -> ResourceMessage:
    return ResourceMessage(attributes=key_values(resource.attributes))


def log_record(record: TransitionRecord) -> LogRecord:
    """One transition as an OTLP log record."""
    number, text = severity(record)
    at = int(record.transition.at.timestamp() * 1e9)
    return LogRecord(time_unix_nano=at, observed_time_unix_nano=at,
                     severity_number=SeverityNumber.ValueType(number),
                     severity_text=text, body=AnyValue(string_value=body(record)),
                     attributes=key_values(dict(to_attributes(record))),
                     event_name=record.event_name)


def logs_request(records: Iterable[TransitionRecord], resource: Resource
                 ) -> ExportLogsServiceRequest:
    """One request holding ``records``, in order, under this VM's resource."""
    scope = ScopeLogs(scope=InstrumentationScope(name=SCOPE_NAME, version=__version__),
                      log_records=[log_record(r) for r in records])
    return ExportLogsServiceRequest(resource_logs=[ResourceLogs(
        resource=_resource(resource), scope_logs=[scope], schema_url=resource.schema_url)])


def as_json(message: Any) -> object:
    """A message in the protobuf JSON mapping OTLP/JSON is based on (integer enums): what the
    dead-letter file keeps of a record as it would have been sent."""
    return MessageToDict(message, use_integers_for_enums=True)


_TEMPORALITY = {
    AggregationTemporality.DELTA: pb.AGGREGATION_TEMPORALITY_DELTA,
    AggregationTemporality.CUMULATIVE: pb.AGGREGATION_TEMPORALITY_CUMULATIVE,
}


def _exemplars(exemplars: Sequence[Exemplar]) -> list[pb.Exemplar]:
    """The SDK's exemplars (``OTEL_METRICS_EXEMPLAR_FILTER``): the span they were recorded in,
    if any, as OTLP's big-endian 16- and 8-byte ids."""
    messages = []
    for exemplar in exemplars:
        message = pb.Exemplar(time_unix_nano=exemplar.time_unix_nano,
                              filtered_attributes=key_values(exemplar.filtered_attributes))
        if exemplar.span_id is not None and exemplar.trace_id is not None:
            message.span_id = exemplar.span_id.to_bytes(8, "big")
            message.trace_id = exemplar.trace_id.to_bytes(16, "big")
        if isinstance(exemplar.value, int):
            message.as_int = exemplar.value
        else:
            message.as_double = exemplar.value
        messages.append(message)
    return messages


def _number_point(point: NumberDataPoint) -> pb.NumberDataPoint:
    message = pb.NumberDataPoint(attributes=key_values(point.attributes),
                                 start_time_unix_nano=point.start_time_unix_nano or 0,
                                 time_unix_nano=point.time_unix_nano,
                                 exemplars=_exemplars(point.exemplars))
    if isinstance(point.value, int):
        message.as_int = point.value
    else:
        message.as_double = point.value
    return message


def _histogram_point(point: HistogramDataPoint) -> pb.HistogramDataPoint:
    return pb.HistogramDataPoint(
        attributes=key_values(point.attributes), start_time_unix_nano=point.start_time_unix_nano,
        time_unix_nano=point.time_unix_nano, count=point.count, sum=point.sum,
        bucket_counts=list(point.bucket_counts), explicit_bounds=list(point.explicit_bounds),
        min=point.min, max=point.max, exemplars=_exemplars(point.exemplars))


def _buckets(buckets: SdkBuckets) -> pb.ExponentialHistogramDataPoint.Buckets | None:
    # No counts: the field stays unset (an empty range needs no offset), as the SDK's encoder
    # leaves it.
    if not buckets.bucket_counts:
        return None
    return pb.ExponentialHistogramDataPoint.Buckets(offset=buckets.offset,
                                                    bucket_counts=list(buckets.bucket_counts))


def _exponential_point(point: ExponentialHistogramDataPoint
                       ) -> pb.ExponentialHistogramDataPoint:
    return pb.ExponentialHistogramDataPoint(
        attributes=key_values(point.attributes), start_time_unix_nano=point.start_time_unix_nano,
        time_unix_nano=point.time_unix_nano, count=point.count, sum=point.sum,
        scale=point.scale, zero_count=point.zero_count, positive=_buckets(point.positive),
        negative=_buckets(point.negative), flags=point.flags, min=point.min, max=point.max,
        exemplars=_exemplars(point.exemplars))


def _scope(scope: SdkScope) -> InstrumentationScope:
    return InstrumentationScope(name=scope.name, version=scope.version or "",
                                attributes=key_values(scope.attributes))


def _metric(metric: Any) -> pb.Metric:
    message = pb.Metric(name=metric.name, description=metric.description or "",
                        unit=metric.unit or "")
    data = metric.data
    if isinstance(data, Gauge):
        message.gauge.data_points.extend(_number_point(p) for p in data.data_points)
    elif isinstance(data, Sum):
        message.sum.data_points.extend(_number_point(p) for p in data.data_points)
        message.sum.aggregation_temporality = _TEMPORALITY[data.aggregation_temporality]
        message.sum.is_monotonic = data.is_monotonic
    elif isinstance(data, Histogram):
        message.histogram.data_points.extend(_histogram_point(p) for p in data.data_points)
        message.histogram.aggregation_temporality = _TEMPORALITY[data.aggregation_temporality]
    elif isinstance(data, ExponentialHistogram):
        message.exponential_histogram.data_points.extend(
            _exponential_point(p) for p in data.data_points)
        message.exponential_histogram.aggregation_temporality = _TEMPORALITY[
            data.aggregation_temporality]
    else:  # the SDK's aggregations make no other kind
        raise TypeError(f"metric {metric.name}: expected a gauge, sum or histogram, got "
                        f"{type(data).__name__}")
    return message


def metrics_request(data: MetricsData) -> ExportMetricsServiceRequest:
    """The SDK's collected ``data`` as one OTLP request."""
    request = ExportMetricsServiceRequest()
    for resource_metrics in data.resource_metrics:
        message = request.resource_metrics.add(resource=_resource(resource_metrics.resource),
                                               schema_url=resource_metrics.schema_url or "")
        for scope_metrics in resource_metrics.scope_metrics:
            message.scope_metrics.add(
                scope=_scope(scope_metrics.scope),
                metrics=[_metric(m) for m in scope_metrics.metrics],
                schema_url=scope_metrics.schema_url or "")
    return request


#: The kinds of metric whose points can be delta: sums and the two histograms.
_DELTA_KINDS = ("sum", "histogram", "exponential_histogram")


def delta_part(request: ExportMetricsServiceRequest) -> ExportMetricsServiceRequest:
    """The metrics of ``request`` whose points are delta (sums and histograms with delta
    temporality), with their resource and scope; empty when there are none. A delta point is
    the only record of its window's counts (the SDK starts afresh at every collection), unlike
    a cumulative point or a gauge, which the next collection reads again."""
    part = ExportMetricsServiceRequest()
    for resource_metrics in request.resource_metrics:
        kept_resource = None
        for scope_metrics in resource_metrics.scope_metrics:
            delta = [m for m in scope_metrics.metrics if _is_delta(m)]
            if not delta:
                continue
            if kept_resource is None:
                kept_resource = part.resource_metrics.add(
                    resource=resource_metrics.resource, schema_url=resource_metrics.schema_url)
            kept_resource.scope_metrics.add(scope=scope_metrics.scope, metrics=delta,
                                            schema_url=scope_metrics.schema_url)
    return part


def _is_delta(metric: pb.Metric) -> bool:
    kind = metric.WhichOneof("data")
    return kind in _DELTA_KINDS and getattr(metric, kind).aggregation_temporality == (
        pb.AGGREGATION_TEMPORALITY_DELTA)


def data_points(request: ExportMetricsServiceRequest) -> tuple[int, int, int]:
    """(data points, earliest start, latest end) of ``request``'s metrics (times in Unix
    nanoseconds; 0, 0 when it has no point)."""
    count, start, end = 0, 0, 0
    for resource_metrics in request.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                kind = metric.WhichOneof("data")
                if kind is None:
                    continue
                for point in getattr(metric, kind).data_points:
                    count += 1
                    if point.start_time_unix_nano and (
                            not start or point.start_time_unix_nano < start):
                        start = point.start_time_unix_nano
                    end = max(end, point.time_unix_nano)
    return count, start, end
