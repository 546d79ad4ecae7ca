"""Prometheus scrape endpoint (``OTEL_METRICS_EXPORTER=prometheus``): the SDK's own reader.

``opentelemetry-exporter-prometheus``'s :class:`PrometheusMetricReader`, used as it is, turns
each collection into ``prometheus_client`` metric families (names, units, ``_total``,
``target_info``, scope labels); ``prometheus_client`` renders the text or OpenMetrics format.
A ``prometheus_client`` collector around the reader's registry adds only what the product needs:

- the per-event gauges (:meth:`Telemetry.per_event_metrics`), translated by a second SDK reader
  made for each scrape, so a series exists only while its event is pending and leaves the
  scrape (Prometheus marks it stale) when the event ends, as on the push routes;
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
from typing import Any, cast
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import Metric, MetricReader, NumberDataPoint
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.metrics_core import Metric as PrometheusMetric
from prometheus_client.registry import Collector

from scheduled_events_exporter import __version__
from scheduled_events_exporter.serving import IDLE_TIMEOUT, ConnectionCap
from scheduled_events_exporter.telemetry import METRICS, SCOPE_NAME, ExtraMetrics

log = logging.getLogger(__name__)

PATH = "/metrics"

_StartResponse = Callable[[str, list[tuple[str, str]]], Any]


#: The Prometheus names of the gauges of unit ``1``, which the Collector's translator suffixes
#: ``_ratio`` (OTel specification, Prometheus compatibility, "Metric Metadata") and the Python
#: exporter does not yet.
RATIO_GAUGES = frozenset(
    name.replace(".", "_") for name, kind, unit in METRICS if kind == "gauge" and unit == "1"
)


def with_ratio_suffix(family: PrometheusMetric) -> PrometheusMetric:
    """``family`` named as the Collector names it (``foo`` → ``foo_ratio`` for unit-1 gauges)."""
    if family.type != "gauge" or family.name not in RATIO_GAUGES:
        return family
    renamed = PrometheusMetric(family.name, family.documentation, family.type, unit="ratio")
    renamed.samples = [s._replace(name=renamed.name) for s in family.samples]  # namedtuple API
    return renamed


def per_event_families(metrics: Sequence[Metric]) -> list[PrometheusMetric]:
    """The per-event gauges as Prometheus families, translated by the SDK's own reader.

    A MeterProvider made for this one scrape observes them once: a series exists only while
    its event is pending, which the long-lived provider (it remembers every attribute set an
    asynchronous instrument ever reported) would not allow.
    """
    if not metrics:
        return []
    registry = CollectorRegistry(auto_describe=False)
    reader = PrometheusMetricReader(disable_target_info=True, registry=registry)
    provider = MeterProvider(metric_readers=[reader], resource=Resource.get_empty(),
                             shutdown_on_exit=False)
    meter = provider.get_meter(SCOPE_NAME, __version__)
    for metric in metrics:
        points = [Observation(p.value, p.attributes) for p in metric.data.data_points
                  if isinstance(p, NumberDataPoint)]
        meter.create_observable_gauge(metric.name, [_observing(points)],
                                      unit=metric.unit or "", description=metric.description or "")
    try:
        return list(registry.collect())
    finally:
        provider.shutdown()


def _observing(points: list[Observation]) -> Callable[[CallbackOptions], Iterable[Observation]]:
    return lambda _: points


class ProductCollector(Collector):
    """What ``/metrics`` serves: the SDK reader's families (unit-1 gauges renamed) and the
    per-event gauges of this moment."""

    def __init__(self, sdk_families: Collector) -> None:
        self._sdk = sdk_families
        self.extra: ExtraMetrics = list

    def collect(self) -> Iterable[PrometheusMetric]:
        """Called by ``prometheus_client`` for each scrape (one at a time: see ScrapeEndpoint)."""
        for family in self._sdk.collect():
            yield with_ratio_suffix(family)
        yield from per_event_families(self.extra())


class _Quiet(WSGIRequestHandler):
    timeout = IDLE_TIMEOUT  # an idle or trickling client is dropped

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes every few seconds would flood the diagnostics."""


class _Server(ConnectionCap, WSGIServer):
    """Scrapes are served concurrently, at most :data:`.serving.MAX_CONNECTIONS` at once."""


class ScrapeEndpoint:
    """``http://HOST:PORT/metrics``; binds at construction so a busy port fails start-up."""

    def __init__(self, host: str, port: int) -> None:
        # The SDK's reader renders into a registry of its own; the served one holds only the
        # product's collector around it.
        sdk_registry = CollectorRegistry(auto_describe=False)
        self.reader = PrometheusMetricReader(registry=sdk_registry)
        self._collector = ProductCollector(sdk_registry)
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(self._collector)
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
        self._collector.extra = extra
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
