"""OTLP sink: transition records as OTLP log records, and the metrics, to a collector.

Log records: each handed-over batch is sent at once by this sink's delivery worker (not at the
next batch timer) as one ``ExportLogsServiceRequest`` (:mod:`.otlp_proto`), once
(:mod:`.otlp_transport`); the worker acknowledges it on success and otherwise retries in order,
or dead-letters a record rejected for good, as the answer says (:mod:`.otlp_errors`). Metrics:
an :class:`OnChangeMetricReader` collects through the SDK and exports at once after a poll
that changed something, otherwise every ``OTEL_METRIC_EXPORT_INTERVAL`` (default 60 s, the
OpenTelemetry default); a failed metric export is counted and reported, not retried as is:
the next export reads cumulative metrics and gauges again, and sends the delta points a refused
export held first, in order (:class:`OtlpMetricExporter`). One :class:`Pause` per collector
says when it may be asked again. The ``OTEL_EXPORTER_OTLP_*`` settings are :mod:`..otlp_settings`'.
gRPC is imported only when a signal uses it (it costs ~15 MB, 6 threads and ~0.35 s of
start-up), and its channels, with the gRPC core's threads, exist only around exports
(:mod:`.grpc_channel`).

Sizes (OTLP 1.11.0, :class:`~.otlp_transport.Limits`): a request over the request limit is
never sent; a log record that alone makes one is dead-lettered with the status
``request_too_large`` (the drop recorded: the letter, its log line and
``export.failures{signal="dead_letter"}``), a metric export is dropped as refused for good. An
accepted export whose answer is over the response limit is delivered (acknowledged, never sent
again, never dead-lettered), what the answer said unknown: said once per streak and counted in
``export.failures{signal="response_discarded"}``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
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
from scheduled_events_exporter.delivery.outcome import FailureCounter, FailureKind, SinkStatus
from scheduled_events_exporter.delivery.pause import Pause
from scheduled_events_exporter.delivery.rejections import METRIC_STREAK
from scheduled_events_exporter.otlp_settings import OtlpTarget, grpc_scheme
from scheduled_events_exporter.records import TransitionRecord
from scheduled_events_exporter.sinks.metric_backlog import KeptBatch, MetricBacklog
from scheduled_events_exporter.sinks.on_change_reader import OnChangeMetricReader
from scheduled_events_exporter.sinks.otlp_errors import answer_kind, describe, export_error
from scheduled_events_exporter.sinks.otlp_proto import (
    as_json,
    data_points,
    delta_part,
    logs_request,
    metrics_request,
)
from scheduled_events_exporter.sinks.otlp_transport import (
    Answer,
    HttpTransport,
    Limits,
    Transport,
)
from scheduled_events_exporter.sinks.worker_sink import WorkerSink
from scheduled_events_exporter.streak import Streak
from scheduled_events_exporter.telemetry import ExtraMetrics, add_metrics

log = logging.getLogger(__name__)

_DELTA, _CUMULATIVE = AggregationTemporality.DELTA, AggregationTemporality.CUMULATIVE
#: The ``signal`` of ``export.failures`` that counts answers to accepted exports discarded
#: unread for their size (OTLP 1.11.0: the client SHOULD record a discarded response).
RESPONSE_DISCARDED = "response_discarded"
_DEFAULT_PORTS = {"http": 80, "https": 443}
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


def authority(target: OtlpTarget) -> tuple[str, str, int | None] | str:
    """Who a signal's requests go to: (scheme, host, port) of its URL, a missing port the
    scheme's default; a gRPC target in gRPC's own naming (``unix:``, ``dns:``) as written."""
    if grpc_scheme(target.endpoint):
        return target.endpoint
    parts = urlsplit(target.endpoint if "//" in target.endpoint else f"//{target.endpoint}")
    scheme = parts.scheme.lower() or ("http" if target.insecure else "https")
    try:
        port = parts.port
    except ValueError:  # not a port: checked at start, never reached
        port = None
    return scheme, (parts.hostname or "").lower(), port or _DEFAULT_PORTS.get(scheme)


def transport_for(target: OtlpTarget, limits: Limits | None = None) -> Transport:
    """The transport ``target``'s protocol asks for (gRPC imported only then), keeping to
    ``limits`` (the specification's defaults when ``None``)."""
    if target.protocol == "grpc":
        from scheduled_events_exporter.sinks.grpc_channel import GrpcTransport

        return GrpcTransport(target, limits=limits)
    return HttpTransport(target, limits)


class OtlpMetricExporter(MetricExporter):
    """The SDK's collected metrics to the collector, one request per export, never retried
    within an export; failures are counted and said once per streak, with the collector's
    answer.

    What a refused export held is not lost. Cumulative points and gauges: the next export
    (change or heartbeat) reads the totals again. Delta points (sums and histograms with delta
    temporality, ``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE=delta``/``lowmemory``):
    the SDK has already started them afresh, so they are kept (:mod:`.metric_backlog`, bounded)
    with their own windows and sent in order, before anything newer, at the next export the
    collector's pause allows; a batch refused for good (a permanent or size refusal) is dropped
    and counted. While ``pause`` lasts (the collector asked it of the metrics), or any of
    ``also`` (the pause of the logs sent to the same collector), nothing is sent.
    """

    def __init__(self, target: OtlpTarget, sink: str, count_failure: FailureCounter,
                 extra: ExtraMetrics = list,
                 temporality: dict[type, AggregationTemporality] | None = None,
                 aggregation: dict[type, Aggregation] | None = None,
                 clock: Callable[[], float] = time.monotonic, *,
                 pause: Pause | None = None, backlog: MetricBacklog | None = None,
                 also: Sequence[Pause] = (), limits: Limits | None = None) -> None:
        """``limits``: the request and response sizes of OTLP 1.11.0 (its defaults when
        ``None``): an export over the request limit is not sent, and is dropped as refused
        for good."""
        super().__init__(preferred_temporality=temporality, preferred_aggregation=aggregation)
        self._clock = clock
        # The collector's requested pause (Retry-After, RetryInfo), capped by the Pause: the
        # specification says the client MUST throttle itself. Metrics also wait out the pause
        # the collector asked of the logs (``also``), never the other way round: a metrics
        # pipeline's refusal must not hold back a transition record.
        self._pause = pause if pause is not None else Pause(clock)
        self._also = tuple(also)
        self._backlog = backlog if backlog is not None else MetricBacklog()
        self._keeps_delta = any(t is _DELTA for t in (temporality or {}).values())
        self._target = target
        self._transport = transport_for(target, limits)
        self._sink = sink
        self._count_failure = count_failure
        self._extra = extra
        self._failing = Streak()
        # Exports in a row the collector refused for good, and its last answer: with
        # METRIC_STREAK of them the sink counts as refusing what it is given (/readyz).
        self._refused: tuple[int, str] = (0, "")
        # Partial success without rejections but with a message: said once per streak.
        self._warned = Streak()
        # Accepted, the answer too large to read: said once per streak.
        self._unread = Streak()
        # Kept batches dropped at the bound, or refused for good: said once per streak.
        self._dropping = Streak()
        self._delivered_late = (0, 0)  # kept (batches, points) delivered since the last line

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs: Any) -> MetricExportResult:
        """Send what was kept, oldest first, then this export, once each, within
        ``timeout_millis`` and the target's own timeout; nothing while the collector's
        requested pause lasts."""
        ends = self._clock() + timeout_millis / 1000
        try:
            request = metrics_request(add_metrics(metrics_data, self._extra()))
            delta = delta_part(request)
        except Exception as exc:  # an encoding bug must not kill the reader's thread
            log.error("sink %s: metric export raised %s: %s", self._sink, type(exc).__name__,
                      str(exc)[:200])
            self._count_failure(self._sink, "metrics", 1)
            return MetricExportResult.FAILURE
        if max(p.remaining() for p in (self._pause, *self._also)) > 0:
            self._keep(delta)
            self._count_failure(self._sink, "metrics", 1)
            return MetricExportResult.FAILURE
        while (kept := self._backlog.first()) is not None:  # their windows come first
            if self._clock() >= ends:  # no time left for this export: it waits its turn
                self._keep(delta)
                return MetricExportResult.FAILURE
            late = ExportMetricsServiceRequest()
            late.ParseFromString(kept.body)
            answer = self._send(late, ends)
            if answer.ok:
                self._backlog.sent()
                batches, points = self._delivered_late
                self._delivered_late = (batches + 1, points + kept.points)
                self._accepted(answer)
            elif self._refused_for_good(answer):
                self._backlog.sent()
                self._dropped([kept], f"refused for good ({describe(answer)})")
            else:
                self._keep(delta)
                return self._failed(answer)
        answer = self._send(request, ends)
        self._refused = ((self._refused[0] + 1, describe(answer))
                         if not answer.ok and self._refused_for_good(answer) else (0, ""))
        if answer.ok:
            self._accepted(answer)
            self._failing.clear()
            self._dropping.clear()
            if self._delivered_late[0]:
                log.info("sink %s: the collector accepts metrics again: %d kept delta batches "
                         "(%d data points) delivered in order", self._sink,
                         *self._delivered_late)
                self._delivered_late = (0, 0)
            return MetricExportResult.SUCCESS
        if self._refused_for_good(answer):
            batch = _kept(delta)
            if batch is not None:
                self._dropped([batch], f"refused for good ({describe(answer)})")
        else:
            self._keep(delta)
        return self._failed(answer)

    def refusing(self) -> str:
        """Why the collector counts as refusing every metric export, or ``""``."""
        count, answer = self._refused
        if count < METRIC_STREAK:
            return ""
        return (f"the last {count} metric exports were refused ({answer}); failing until one "
                f"is accepted (at the next change or heartbeat)")

    def _send(self, request: Any, ends: float) -> Answer:
        return self._transport.send(
            request, max(0.001, min(self._target.timeout, ends - self._clock())))

    def _refused_for_good(self, answer: Answer) -> bool:
        """A refusal that would come again for the same request (not throttling, not an
        outage, not a configuration error)."""
        return answer_kind(answer) in (FailureKind.PERMANENT, FailureKind.TOO_LARGE)

    def _accepted(self, answer: Answer) -> None:
        if answer.unread:
            self._count_failure(self._sink, RESPONSE_DISCARDED, 1)
            if self._unread.hit():
                log.warning("sink %s: the collector accepted the metric export (%s) but %s: "
                            "whether it dropped some of the data points is unknown; counted in "
                            "azure.scheduled_events.export.failures{signal=\"%s\"} (said once "
                            "until an answer is read again)", self._sink,
                            _status(answer), answer.detail, RESPONSE_DISCARDED)
            return
        self._unread.clear()
        if answer.rejected:
            log.warning("sink %s: the collector dropped %d of the metric data points: %s",
                        self._sink, answer.rejected, answer.detail or "no reason given")
        elif answer.detail and self._warned.hit():
            log.warning("sink %s: the collector accepted the metrics with a warning: %s",
                        self._sink, answer.detail)
        elif not answer.detail:
            self._warned.clear()

    def _failed(self, answer: Answer) -> MetricExportResult:
        if answer.retry_after is not None:
            self._pause.hold(answer.retry_after, asked=True)
        if self._failing.hit():
            if self._keeps_delta:
                again = ("the delta points are kept, up to "
                         f"{self._backlog.max_batches} exports or {self._backlog.max_bytes} "
                         "bytes, and sent in order before anything newer once the collector "
                         "accepts; cumulative metrics and gauges are read again at the next "
                         "change or heartbeat")
            else:
                again = ("cumulative metrics and gauges are read again and sent at the next "
                         "change or heartbeat")
            log.error("sink %s: metric export failed: %s (%s)", self._sink, describe(answer),
                      again)
        self._count_failure(self._sink, "metrics", 1)
        return MetricExportResult.FAILURE

    def _keep(self, delta: ExportMetricsServiceRequest) -> None:
        batch = _kept(delta)
        if batch is None:
            return
        dropped = self._backlog.keep(batch)
        if dropped:
            self._dropped(dropped, f"over the bound of kept batches ({self._backlog.max_batches}"
                                   f" batches or {self._backlog.max_bytes} bytes)")

    def _dropped(self, batches: list[KeptBatch], why: str) -> None:
        points = sum(batch.points for batch in batches)
        self._count_failure(self._sink, "metrics_dropped", points)
        if self._dropping.hit():
            log.error("sink %s: %d delta metric batches (%d data points, %s to %s) dropped, %s: "
                      "their counts are lost; counted in azure.scheduled_events.export.failures"
                      "{signal=\"metrics_dropped\"} (said once until the collector accepts "
                      "again)", self._sink, len(batches), points,
                      _utc(min(b.start for b in batches)), _utc(max(b.end for b in batches)),
                      why)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        """Nothing to flush: kept batches go at the next export, which the reader makes."""
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        """Close the connection or channel; say what kept batches are lost with the process."""
        if len(self._backlog):
            log.warning("sink %s: %d kept delta metric batches (%d data points) were not "
                        "delivered before the stop and are lost (metrics are not spooled)",
                        self._sink, len(self._backlog), self._backlog.points)
        self._transport.close()


def _status(answer: Answer) -> str:
    """An accepting answer's status as a log line names it (``HTTP 200``, ``gRPC OK``)."""
    return f"HTTP {answer.status}" if isinstance(answer.status, int) else f"gRPC {answer.status}"


def _kept(delta: ExportMetricsServiceRequest) -> KeptBatch | None:
    """The batch to keep of an export's delta part (``None``: it has no point)."""
    points, start, end = data_points(delta)
    if not points:
        return None
    return KeptBatch(delta.SerializeToString(), points, start, end)


def _utc(unix_nano: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix_nano / 1e9))


class OtlpSink(WorkerSink):
    """Transition records as OTLP log records, and the metrics, over OTLP."""

    name = "otlp"

    def __init__(self, config: Config, count_failure: FailureCounter, *,
                 limits: Limits | None = None) -> None:
        """``limits``: the request and response sizes of OTLP 1.11.0, for both signals (the
        specification's defaults when ``None``; no variable sets them)."""
        self._target = config.otlp_logs
        self._transport = transport_for(config.otlp_logs, limits)
        # A pause per signal, each set by its own answers: the delivery worker holds the logs'
        # one. Metric exports also wait out the logs' pause when both go to the same scheme,
        # host and port (that collector asked us to wait); a refused metric export never holds
        # back the transition records (docs/decisions.md, "Throttling").
        self._logs_pause = Pause()
        self._metrics_pause = Pause()
        same = authority(config.otlp_logs) == authority(config.otlp_metrics)
        self._partial = Streak()
        self._unread = Streak()
        self._count = count_failure
        # OTEL_METRICS_EXPORTER without otlp: records only, no metric reader.
        self._readers: tuple[OnChangeMetricReader, ...] = ()
        if "otlp" in config.metrics_exporters:
            temporality = TEMPORALITIES[config.metrics_temporality]
            self._readers = (OnChangeMetricReader(
                OtlpMetricExporter(config.otlp_metrics, self.name, count_failure,
                                   lambda: self._extra_metrics(), temporality,
                                   histogram_aggregation(config.metrics_histogram_aggregation),
                                   pause=self._metrics_pause,
                                   also=(self._logs_pause,) if same else (), limits=limits),
                heartbeat=config.metric_export_interval,
            ),)
        super().__init__(config, count_failure, pause=self._logs_pause)

    def metric_readers(self) -> Sequence[MetricReader]:
        """The on-change OTLP metric reader, unless OTEL_METRICS_EXPORTER excludes otlp."""
        return self._readers

    def status(self) -> SinkStatus:
        """The worker's health; refusing when its records or its metric exports are."""
        status = super().status()
        if status.rejecting:
            return status
        for reader in self._readers:
            exporter = reader.exporter
            if isinstance(exporter, OtlpMetricExporter) and (why := exporter.refusing()):
                return replace(status, rejecting=why)
        return status

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
        if answer.unread:
            # Accepted (the status said so), the answer over the response limit: the
            # specification's non-retryable error. The records are delivered: acknowledged,
            # never sent again, never dead-lettered; what the answer said (a partial success)
            # is unknown, and that is said and counted.
            self._count(self.name, RESPONSE_DISCARDED, 1)
            if self._unread.hit():
                log.warning("sink %s: the collector accepted the request of %d records (%s) but "
                            "%s: whether it dropped some of them (a partial success) is unknown;"
                            " they count as delivered and are not sent again; counted in "
                            "azure.scheduled_events.export.failures{signal=\"%s\"} (said once "
                            "until an answer is read again)", self.name, len(records),
                            _status(answer), answer.detail, RESPONSE_DISCARDED)
            return
        self._unread.clear()
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
