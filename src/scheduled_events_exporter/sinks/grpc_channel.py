"""gRPC channels that exist only around exports.

While any gRPC channel is open, the gRPC core keeps threads of its own awake: a timer manager
and a thread-pool lifeguard that wake every second, and work-stealing pool threads that look
for work every 15 ms to 3 s. Those intervals are compile-time constants of gRPC's event engine
(``work_stealing_thread_pool.cc``), not options. On an idle exporter, which exports metrics
once a minute, they cost a third of the process's CPU. When the last channel is released the
core shuts down and the threads exit (measured: 6 threads before, none after).

So each gRPC exporter opens its channel at an export and closes it once no export has used it
for :data:`LINGER` seconds. Reopening costs about 4 ms of CPU and a connection handshake (over
TLS, a TLS handshake too), paid by the first export after a quiet spell; a burst of changes
reuses one channel. The SDK builds its channel in ``_initialize_channel_and_stub`` (in its
constructor, and again after ``UNAVAILABLE``); :class:`ChannelKeeper` defers that first call to
the first export and closes with the same ``channel.close()`` the SDK's reconnection uses.
Retries, timeouts, compression, credentials and headers stay the SDK's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

#: Seconds a channel stays open after its last export: longer than the gap between the
#: records of one change and its metric export, far shorter than the 60 s heartbeat.
LINGER = 5.0

T = TypeVar("T")


class ChannelKeeper:
    """Opens a channel for each export and closes it :data:`LINGER` seconds after the last.

    ``open_channel``/``close_channel`` act on the exporter; they are called under this
    keeper's lock, never during an export of the same exporter.
    """

    def __init__(self, open_channel: Callable[[], None], close_channel: Callable[[], None],
                 linger: float = LINGER, clock: Callable[[], float] = time.monotonic) -> None:
        self._open_channel = open_channel
        self._close_channel = close_channel
        self._linger = linger
        self._clock = clock
        self._lock = threading.Lock()
        self._open = False
        self._stopped = False
        self._last_use = 0.0
        self._timer: threading.Timer | None = None

    @property
    def is_open(self) -> bool:
        """Whether the channel is open now."""
        return self._open

    def export(self, call: Callable[[], T]) -> T:
        """Run ``call`` (one export) with the channel open; schedule its closing."""
        with self._lock:
            if self._stopped:  # the SDK answers FAILURE after shutdown; no channel for that
                return call()
            if not self._open:
                self._open_channel()
                self._open = True
            try:
                return call()
            finally:
                self._last_use = self._clock()
                self._arm(self._linger)

    def stop(self) -> None:
        """No more channels: cancel the pending close (the SDK's shutdown closes the channel)."""
        self._stopped = True
        timer = self._timer
        if timer is not None:
            timer.cancel()

    def _arm(self, delay: float) -> None:
        if self._timer is None and not self._stopped:
            self._timer = threading.Timer(delay, self._expire)
            self._timer.name = "grpc-channel-linger"
            self._timer.daemon = True
            self._timer.start()

    def _expire(self) -> None:
        with self._lock:
            self._timer = None
            if not self._open or self._stopped:
                return
            idle = self._clock() - self._last_use
            if idle < self._linger:
                self._arm(self._linger - idle)
                return
            self._open = False
            self._close_channel()


def close_channel(exporter: Any) -> None:
    """Close an SDK gRPC exporter's channel and forget it (its shutdown then has none to close)."""
    channel, exporter._channel, exporter._client = exporter._channel, None, None
    if channel is not None:
        channel.close()


def grpc_metric_exporter() -> OTLPMetricExporter:
    """The SDK's gRPC metric exporter, configured by ``OTEL_*``, with a channel per export."""
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics.export import MetricExportResult, MetricsData

    class Exporter(OTLPMetricExporter):
        def __init__(self) -> None:
            self._ready = False  # the SDK's constructor asks for a channel: not yet
            self.keeper = ChannelKeeper(self._reopen, lambda: close_channel(self))
            super().__init__()
            self._ready = True

        def _reopen(self) -> None:
            self._ready = True
            super()._initialize_channel_and_stub()  # type: ignore[no-untyped-call]

        def _initialize_channel_and_stub(self) -> None:
            if self._ready:
                super()._initialize_channel_and_stub()  # type: ignore[no-untyped-call]

        def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
                   **kwargs: Any) -> MetricExportResult:
            return self.keeper.export(
                lambda: super(Exporter, self).export(metrics_data, timeout_millis, **kwargs))

        def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
            self.keeper.stop()
            super().shutdown(timeout_millis, **kwargs)

    return Exporter()
