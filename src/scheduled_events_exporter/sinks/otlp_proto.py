"""OTLP requests from our records and from the SDK's collected metrics (pure).

The messages are ``opentelemetry-proto``'s generated classes, the public form of the OTLP
protocol; encoding them here, rather than through the SDK exporters' private encoders, keeps
the OTLP route on public interfaces only (docs/decisions.md). Log records: one per transition,
``event_name`` the OTLP field, attributes typed as docs/semantics.md#records says. Metrics: the
SDK's ``MetricsData`` (gauges, sums, explicit-bucket histograms; the only kinds the exporter
records), as the OTLP metrics data model lays them out.
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
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    MetricsData,
    NumberDataPoint,
    Sum,
)
from opentelemetry.sdk.resources import Resource

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


def _number_point(point: NumberDataPoint) -> pb.NumberDataPoint:
    message = pb.NumberDataPoint(attributes=key_values(point.attributes),
                                 start_time_unix_nano=point.start_time_unix_nano or 0,
                                 time_unix_nano=point.time_unix_nano)
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
        min=point.min, max=point.max)


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
    else:  # the exporter records no other kind (an exponential histogram would need a view)
        raise TypeError(f"metric {metric.name}: no OTLP encoding for {type(data).__name__}")
    return message


def metrics_request(data: MetricsData) -> ExportMetricsServiceRequest:
    """The SDK's collected ``data`` as one OTLP request."""
    request = ExportMetricsServiceRequest()
    for resource_metrics in data.resource_metrics:
        message = request.resource_metrics.add(resource=_resource(resource_metrics.resource),
                                               schema_url=resource_metrics.schema_url or "")
        for scope_metrics in resource_metrics.scope_metrics:
            scope = scope_metrics.scope
            message.scope_metrics.add(
                scope=InstrumentationScope(name=scope.name, version=scope.version or ""),
                metrics=[_metric(m) for m in scope_metrics.metrics],
                schema_url=scope_metrics.schema_url or "")
    return request
