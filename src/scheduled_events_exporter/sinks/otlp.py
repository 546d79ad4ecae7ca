"""OTLP sink: the SDK's own OTLP exporters, configured only by ``OTEL_EXPORTER_OTLP_*``.

Logs: each handed-over batch is exported at once by this sink's worker (not at the next batch
timer), and acknowledged only on ``SUCCESS``. Metrics: an :class:`OnChangeMetricReader` drives
the SDK's OTLP metric exporter, at once after a poll that changed something and otherwise every
``OTEL_METRIC_EXPORT_INTERVAL`` (default 60 s, the OpenTelemetry default); a thin wrapper
counts failures. gRPC is imported only when selected
(it costs ~15 MB, 6 threads and ~0.35 s of start-up), and its channels, with the gRPC core's
threads, exist only around exports (:mod:`.grpc_channel`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
)
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from scheduled_events_exporter import __version__
from scheduled_events_exporter.config import Config
from scheduled_events_exporter.records import TransitionRecord
from scheduled_events_exporter.sinks.base import FailureCounter
from scheduled_events_exporter.sinks.delivery import WorkerSink
from scheduled_events_exporter.sinks.grpc_channel import grpc_metric_exporter
from scheduled_events_exporter.sinks.on_change_reader import OnChangeMetricReader
from scheduled_events_exporter.sinks.otlp_errors import (
    StatusProbe,
    export_error,
    grpc_log_exporter,
    http_log_exporter,
    otlp_json,
)
from scheduled_events_exporter.telemetry import SCOPE_NAME, ExtraMetrics, add_metrics, to_log_record

log = logging.getLogger(__name__)


class LastWarning(logging.Handler):
    """Remembers the last warning the SDK's OTLP metric exporters logged: the SDK returns a
    bare FAILURE from ``export``, and says why (status, connection error) only in its own log.
    Only the metric exporters' loggers count: the log exporter's words would name the wrong
    signal (its failures are learnt by :mod:`.otlp_errors`)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.message = ""

    def emit(self, record: logging.LogRecord) -> None:
        if "metric_exporter" not in record.name:
            return
        try:
            message = record.getMessage().splitlines()[0]
        except Exception:  # a logging handler must never raise into the SDK
            message = record.msg if isinstance(record.msg, str) else ""
        if len(message) > 400:  # whole words and a mark, not a cut mid-word
            message = message[:400].rsplit(" ", 1)[0] + " …"
        # The SDK ends a retried export with a generic line; the one before says why.
        if not (self.message and "max retries or shutdown" in message):
            self.message = message

    def take(self) -> str:
        """The last message (then forgotten), or a placeholder."""
        message, self.message = self.message, ""
        return message or "no reason given by the SDK"


_SDK_REASONS = LastWarning()
_SDK_LOGGER = logging.getLogger("opentelemetry.exporter.otlp")
_SDK_LOGGER.addHandler(_SDK_REASONS)
# Heard here, printed nowhere: the sink reports once per streak in its own words, while the
# rest of the SDK's logging stays quiet (app.setup_logging).
_SDK_LOGGER.setLevel(logging.WARNING)
_SDK_LOGGER.propagate = False


class CountingMetricExporter(MetricExporter):
    """Delegates to an SDK metric exporter and counts failed exports."""

    def __init__(self, inner: MetricExporter, sink: str, count_failure: FailureCounter,
                 extra: ExtraMetrics = list) -> None:
        super().__init__(
            preferred_temporality=inner._preferred_temporality,
            preferred_aggregation=inner._preferred_aggregation,
        )
        self._inner = inner
        self._extra = extra
        self._sink = sink
        self._count_failure = count_failure
        self._failing = False

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        """Export through the wrapped exporter; count and log (once per streak) failures."""
        try:
            data = add_metrics(metrics_data, self._extra())
            result = self._inner.export(data, timeout_millis=timeout_millis, **kwargs)
        except Exception as exc:  # an exporter bug must not kill the SDK's reader thread
            log.error("sink %s: metric export raised %s", self._sink, type(exc).__name__)
            result = MetricExportResult.FAILURE
        if result is MetricExportResult.FAILURE:
            if not self._failing:
                log.error("sink %s: metric export failed: %s (metrics are re-read and sent "
                          "again at the next change or heartbeat)", self._sink,
                          _SDK_REASONS.take())
            self._failing = True
            self._count_failure(self._sink, "metrics", 1)
        else:
            self._failing = False
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        """Flush the wrapped exporter."""
        return self._inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        """Shut the wrapped exporter down."""
        self._inner.shutdown(timeout_millis=timeout_millis, **kwargs)


class OtlpSink(WorkerSink):
    """Transition records as OTel log records, and the metrics, over OTLP."""

    name = "otlp"

    def __init__(self, config: Config, count_failure: FailureCounter) -> None:
        # What the collector answered to our log exports (otlp_errors says how we learn it).
        self._probe = StatusProbe()
        log_exporter: LogRecordExporter
        metric_exporter: MetricExporter
        if config.otlp_protocol == "grpc":
            log_exporter = grpc_log_exporter(self._probe)
            metric_exporter = grpc_metric_exporter()
        else:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter as HttpMetricExporter,
            )

            log_exporter = http_log_exporter(self._probe)
            metric_exporter = HttpMetricExporter()
        self._log_exporter = log_exporter
        # OTEL_METRICS_EXPORTER without otlp: records only, no metric reader.
        self._readers: tuple[OnChangeMetricReader, ...] = ()
        if "otlp" in config.metrics_exporters:
            self._readers = (OnChangeMetricReader(
                CountingMetricExporter(metric_exporter, self.name, count_failure,
                                       lambda: self._extra_metrics()),
                heartbeat=config.metric_export_interval,
            ),)
        self._scope = InstrumentationScope(SCOPE_NAME, __version__)
        super().__init__(config, count_failure)

    def metric_readers(self) -> Sequence[MetricReader]:
        """The on-change OTLP metric reader, unless OTEL_METRICS_EXPORTER excludes otlp."""
        return self._readers

    def metrics_changed(self) -> None:
        """Export the metrics soon, on the reader's thread (never blocks the caller)."""
        for reader in self._readers:
            reader.metrics_changed()

    def _close(self) -> None:
        # Metrics stop with the MeterProvider; the log exporter is ours to close.
        self._log_exporter.shutdown()

    def _deliver(self, records: Sequence[TransitionRecord]) -> None:
        batch = [to_log_record(r, self._resource, self._scope) for r in records]
        self._probe.reset()
        result = self._log_exporter.export(batch)
        if result is not LogRecordExportResult.SUCCESS:
            raise export_error(self._probe.last, len(batch))

    def _payload(self, record: TransitionRecord) -> object:
        return otlp_json(to_log_record(record, self._resource, self._scope))
