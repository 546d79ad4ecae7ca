"""Prometheus scrape endpoint (``OTEL_METRICS_EXPORTER=prometheus``): the SDK's own reader.

``opentelemetry-exporter-prometheus``'s :class:`PrometheusMetricReader` turns each collection
into ``prometheus_client`` metric families (names, units, ``_total``, ``target_info``, scope
labels); ``prometheus_client`` renders the text or OpenMetrics format. This module adds only
what the product needs around them:

- the per-event gauges (:meth:`Telemetry.per_event_metrics`) are appended to every collection,
  exactly as the sinks' metric exporters do, so a series exists only while its event is pending
  and leaves the scrape (Prometheus marks it stale) when the event ends;
- gauges of unit ``1`` get the ``_ratio`` suffix the OpenTelemetry Collector's translator gives
  them (the Python exporter does not yet), so every route renders the same names;
- ``/metrics`` only (404 elsewhere), one scrape at a time (the reader hands each collection to
  its renderer through one queue, shared by concurrent scrapes), a private registry (no
  ``python_gc_*``/``process_*`` that the Collector route would not have).

Imported only when ``prometheus`` is selected: ``prometheus_client`` costs start-up time.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, cast
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics.export import Gauge, MetricReader, MetricsData
from prometheus_client import CollectorRegistry, make_wsgi_app

from scheduled_events_exporter.serving import IDLE_TIMEOUT, ConnectionCap
from scheduled_events_exporter.telemetry import ExtraMetrics, add_metrics

log = logging.getLogger(__name__)

PATH = "/metrics"

_StartResponse = Callable[[str, list[tuple[str, str]]], Any]


def collector_compatible(data: MetricsData) -> MetricsData:
    """``data`` with unit ``1`` gauges relabelled ``ratio``, as the Collector's translator names
    them (``foo`` → ``foo_ratio``; OTel spec, Prometheus compatibility, metric metadata)."""
    changed = False
    resource_metrics = []
    for rm in data.resource_metrics:
        scopes = []
        for sm in rm.scope_metrics:
            metrics = []
            for metric in sm.metrics:
                if metric.unit == "1" and isinstance(metric.data, Gauge):
                    metric = replace(metric, unit="ratio")
                    changed = True
                metrics.append(metric)
            scopes.append(replace(sm, metrics=metrics))
        resource_metrics.append(replace(rm, scope_metrics=scopes))
    return MetricsData(resource_metrics) if changed else data


class ProductMetricReader(PrometheusMetricReader):
    """The SDK's Prometheus reader, plus the per-event gauges and Collector-compatible units."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry=registry)
        self.extra: ExtraMetrics = list

    def _receive_metrics(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> None:
        # Called on the scrape thread with what the MeterProvider just collected.
        if metrics_data is None:
            return
        data = collector_compatible(add_metrics(metrics_data, self.extra()))
        super()._receive_metrics(data, timeout_millis, **kwargs)


class _Quiet(WSGIRequestHandler):
    timeout = IDLE_TIMEOUT  # an idle or trickling client is dropped

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes every few seconds would flood the diagnostics."""


class _Server(ConnectionCap, WSGIServer):
    """Scrapes are served concurrently, at most :data:`.serving.MAX_CONNECTIONS` at once."""


class ScrapeEndpoint:
    """``http://HOST:PORT/metrics``; binds at construction so a busy port fails start-up."""

    def __init__(self, host: str, port: int) -> None:
        self._registry = CollectorRegistry()
        self.reader = ProductMetricReader(self._registry)
        app = make_wsgi_app(self._registry)
        lock = threading.Lock()

        def metrics_only(environ: dict[str, Any], start_response: _StartResponse) -> Iterable[
                bytes]:
            if environ.get("PATH_INFO") != PATH:
                start_response("404 Not Found", [("Content-Type", "text/plain")])
                return [f"not found; metrics are at {PATH}\n".encode()]
            with lock:
                return list(app(environ, start_response))

        family = _family(host, port)
        server_class = type("ScrapeServer", (_Server,), {"address_family": family})
        try:
            server: WSGIServer = make_server(host, port, metrics_only, server_class, _Quiet)
            self._server = cast(_Server, server)
        except OSError as exc:
            raise OSError(
                f"OTEL_EXPORTER_PROMETHEUS_HOST={host} OTEL_EXPORTER_PROMETHEUS_PORT={port}: "
                f"cannot listen for Prometheus scrapes ({exc.strerror or exc}); "
                "expected a free port on a local address"
            ) from exc
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve, name="prometheus-scrape", daemon=True
        )

    def metric_readers(self) -> Sequence[MetricReader]:
        """The reader to attach to the MeterProvider."""
        return (self.reader,)

    def start(self, extra: ExtraMetrics) -> None:
        """Serve scrapes; ``extra`` adds the per-event gauges to each collection."""
        self.reader.extra = extra
        self._thread.start()
        log.info("serving Prometheus metrics at http://%s:%d%s",
                 self._server.server_address[0], self.port, PATH)

    def stop(self) -> None:
        """Stop serving and release the port."""
        self._server.stop_serving()
        self._server.server_close()


def _family(host: str, port: int) -> socket.AddressFamily:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise OSError(
            f"OTEL_EXPORTER_PROMETHEUS_HOST={host}: cannot resolve it ({exc}); "
            "expected a local host name or IP address"
        ) from exc
    return infos[0][0]
