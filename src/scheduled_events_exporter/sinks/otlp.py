"""OTLP sink: transition records as OTLP log records, and the metrics, to a collector.

Log records: each handed-over batch is sent at once by this sink's delivery worker (not at the
next batch timer) as one ``ExportLogsServiceRequest`` (:mod:`.otlp_proto`), once
(:mod:`.otlp_transport`); the worker acknowledges it on success and otherwise retries in order,
or dead-letters a record rejected for good, as the answer says (:mod:`.otlp_errors`). Metrics:
an :class:`OnChangeMetricReader` collects through the SDK and exports at once after a poll
that changed something, otherwise every ``OTEL_METRIC_EXPORT_INTERVAL`` (default 60 s, the
OpenTelemetry default); a failed metric export is counted and reported, not retried (the next
export reads the metrics again). The ``OTEL_EXPORTER_OTLP_*`` settings are :mod:`..otlp_settings`'.
gRPC is imported only when a signal uses it (it costs ~15 MB, 6 threads and ~0.35 s of
start-up), and its channels, with the gRPC core's threads, exist only around exports
(:mod:`.grpc_channel`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.metrics import (
    Counter,
    Histogram,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
    UpDownCounter,
)
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
)
from opentelemetry.sdk.metrics.view import Aggregation, ExponentialBucketHistogramAggregation

from scheduled_events_exporter.config import Config
from scheduled_events_exporter.delivery.outcome import FailureCounter
from scheduled_events_exporter.delivery.pause import RETRY_AFTER_CAP
from scheduled_events_exporter.otlp_settings import OtlpTarget
from scheduled_events_exporter.records import TransitionRecord
from scheduled_events_exporter.sinks.on_change_reader import OnChangeMetricReader
from scheduled_events_exporter.sinks.otlp_errors import describe, export_error
from scheduled_events_exporter.sinks.otlp_proto import as_json, logs_request, metrics_request
from scheduled_events_exporter.sinks.otlp_transport import HttpTransport, Transport
from scheduled_events_exporter.sinks.worker_sink import WorkerSink
from scheduled_events_exporter.streak import Streak
from scheduled_events_exporter.telemetry import ExtraMetrics, add_metrics

log = logging.getLogger(__name__)

_DELTA, _CUMULATIVE = AggregationTemporality.DELTA, AggregationTemporality.CUMULATIVE
#: OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE, as the OpenTelemetry specification maps
#: each preference onto the instrument kinds.
TEMPORALITIES: dict[str, dict[type, AggregationTemporality]] = {
    "cumulative": {},
    "delta": {Counter: _DELTA, ObservableCounter: _DELTA, Histogram: _DELTA,
              UpDownCounter: _CUMULATIVE, ObservableUpDownCounter: _CUMULATIVE,
              ObservableGauge: _CUMULATIVE},
    "lowmemory": {Counter: _DELTA, Histogram: _DELTA, ObservableCounter: _CUMULATIVE,
                  UpDownCounter: _CUMULATIVE, ObservableUpDownCounter: _CUMULATIVE,
                  ObservableGauge: _CUMULATIVE},
}


def histogram_aggregation(name: str) -> dict[type, Aggregation]:
    """OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION as the reader's preferred
    aggregation for histograms, as the SDK's OTLP exporters map it. Explicit buckets: no
    preference, so the SDK's default aggregation keeps each instrument's advised boundaries
    (telemetry's NOTICE_BUCKETS), as the SDK's explicit-bucket aggregation would."""
    if name == "base2_exponential_bucket_histogram":
        return {Histogram: ExponentialBucketHistogramAggregation()}
    return {}


def transport_for(target: OtlpTarget) -> Transport:
    """The transport ``target``'s protocol asks for (gRPC imported only then)."""
    if target.protocol == "grpc":
        from scheduled_events_exporter.sinks.grpc_channel import GrpcTransport

        return GrpcTransport(target)
    return HttpTransport(target)


class OtlpMetricExporter(MetricExporter):
    """The SDK's collected metrics to the collector, one request per export, never retried
    here; failures are counted and said once per streak, with the collector's answer."""

    def __init__(self, target: OtlpTarget, sink: str, count_failure: FailureCounter,
                 extra: ExtraMetrics = list,
                 temporality: dict[type, AggregationTemporality] | None = None,
                 aggregation: dict[type, Aggregation] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(preferred_temporality=temporality, preferred_aggregation=aggregation)
        self._clock = clock
        # Until then no export is sent: the collector asked for a pause (Retry-After,
        # RetryInfo), capped as the delivery worker caps it. The specification: the client
        # MUST throttle itself; metrics are read again at the next export anyway.
        self._quiet_until = 0.0
        self._target = target
        self._transport = transport_for(target)
        self._sink = sink
        self._count_failure = count_failure
        self._extra = extra
        self._failing = Streak()
        # Partial success without rejections but with a message: said once per streak.
        self._warned = Streak()

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs: Any) -> MetricExportResult:
        """Send once, within ``timeout_millis`` and the target's own timeout (nothing while
        the collector's requested pause lasts)."""
        if self._clock() < self._quiet_until:
            self._count_failure(self._sink, "metrics", 1)
            return MetricExportResult.FAILURE
        try:
            request = metrics_request(add_metrics(metrics_data, self._extra()))
            answer = self._transport.send(
                request, max(0.001, min(self._target.timeout, timeout_millis / 1000)))
        except Exception as exc:  # an encoding bug must not kill the reader's thread
            log.error("sink %s: metric export raised %s: %s", self._sink, type(exc).__name__,
                      str(exc)[:200])
            self._count_failure(self._sink, "metrics", 1)
            return MetricExportResult.FAILURE
        if answer.ok:
            if answer.rejected:
                log.warning("sink %s: the collector dropped %d of the metric data points: %s",
                            self._sink, answer.rejected, answer.detail or "no reason given")
            elif answer.detail and self._warned.hit():
                log.warning("sink %s: the collector accepted the metrics with a warning: %s",
                            self._sink, answer.detail)
            elif not answer.detail:
                self._warned.clear()
            self._failing.clear()
            return MetricExportResult.SUCCESS
        if answer.retry_after is not None:
            self._quiet_until = self._clock() + min(answer.retry_after, RETRY_AFTER_CAP)
        if self._failing.hit():
            log.error("sink %s: metric export failed: %s (metrics are read and sent again at "
                      "the next change or heartbeat)", self._sink, describe(answer))
        self._count_failure(self._sink, "metrics", 1)
        return MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        """Nothing is buffered here."""
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        """Close the connection or channel."""
        self._transport.close()


class OtlpSink(WorkerSink):
    """Transition records as OTLP log records, and the metrics, over OTLP."""

    name = "otlp"

    def __init__(self, config: Config, count_failure: FailureCounter) -> None:
        self._target = config.otlp_logs
        self._transport = transport_for(config.otlp_logs)
        self._partial = Streak()
        self._count = count_failure
        # OTEL_METRICS_EXPORTER without otlp: records only, no metric reader.
        self._readers: tuple[OnChangeMetricReader, ...] = ()
        if "otlp" in config.metrics_exporters:
            temporality = TEMPORALITIES[config.metrics_temporality]
            self._readers = (OnChangeMetricReader(
                OtlpMetricExporter(config.otlp_metrics, self.name, count_failure,
                                   lambda: self._extra_metrics(), temporality,
                                   histogram_aggregation(config.metrics_histogram_aggregation)),
                heartbeat=config.metric_export_interval,
            ),)
        super().__init__(config, count_failure)

    def metric_readers(self) -> Sequence[MetricReader]:
        """The on-change OTLP metric reader, unless OTEL_METRICS_EXPORTER excludes otlp."""
        return self._readers

    def metrics_changed(self) -> None:
        """Export the metrics soon, on the reader's thread (never blocks the caller)."""
        for reader in self._readers:
            reader.metrics_changed()

    def _close(self) -> None:
        # Metrics stop with the MeterProvider (the reader closes its exporter).
        self._transport.close()

    def _deliver(self, records: Sequence[TransitionRecord]) -> None:
        answer = self._transport.send(logs_request(records, self._resource), self._target.timeout)
        if not answer.ok:
            raise export_error(answer, len(records))
        if not answer.rejected and not answer.detail:
            self._partial.clear()
            return
        # Accepted, yet dropped by the collector (OTLP partial success): nothing to resend (it
        # would be dropped again), so it is counted and said once per streak. Accepted whole
        # with a message: the server's warning, which the specification says SHOULD be shown.
        if not answer.rejected:
            if self._partial.hit("warning"):
                log.warning("sink %s: the collector accepted all %d records with a warning: %s",
                            self.name, len(records), answer.detail)
            return
        if self._partial.hit("rejected"):
            log.warning("sink %s: the collector accepted the records but dropped %d of them: "
                        "%s", self.name, answer.rejected, answer.detail or "no reason given")
        self._count(self.name, "logs", answer.rejected)

    def _payload(self, record: TransitionRecord) -> object:
        return as_json(logs_request([record], self._resource))
