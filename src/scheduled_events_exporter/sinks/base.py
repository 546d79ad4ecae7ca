"""What every sink is: the :class:`Sink` protocol, its status, and what it is given.

A sink is anything with the :class:`Sink` shape. The poll loop only calls :meth:`Sink.submit`
and :meth:`Sink.metrics_changed` (non-blocking hand-overs); every sink does its I/O on its own
worker (:class:`~scheduled_events_exporter.delivery.worker.DeliveryWorker`) or metric reader,
so a dead collector or a hung Event Hubs client never delays the next poll.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import Resource

from scheduled_events_exporter.config import Config
from scheduled_events_exporter.delivery.dead_letter import DeadLetterFile
from scheduled_events_exporter.delivery.outcome import SinkStatus
from scheduled_events_exporter.delivery.spool import Spool
from scheduled_events_exporter.delivery.worker import DeliveryWorker
from scheduled_events_exporter.records import TransitionRecord
from scheduled_events_exporter.telemetry import ExtraMetrics


class Sink(Protocol):
    """What the poll loop needs from a sink."""

    name: str

    def metric_readers(self) -> Sequence[MetricReader]:
        """Metric readers to attach to the MeterProvider (may be empty)."""
        ...

    def start(self, resource: Resource, extra_metrics: ExtraMetrics) -> None:
        """Start the worker; ``resource`` describes this VM for OTel-shaped outputs and
        ``extra_metrics`` gives metrics built at export time (the per-event gauges)."""
        ...

    def submit(self, records: Sequence[TransitionRecord]) -> None:
        """Hand records over for delivery, in order. Must not block on I/O."""
        ...

    @property
    def delivery(self) -> DeliveryWorker:
        """The sink's delivery worker: the start sequence (``delivery/start.py``) hands it the
        state file's outbox and a redeliver request's records."""
        ...

    def metrics_changed(self) -> None:
        """The last poll changed the metrics (transitions, pending set): export them soon, on
        the sink's own thread. Must return at once."""
        ...

    def shutdown(self, timeout: float) -> bool:
        """Deliver what is pending within ``timeout`` and stop. True if nothing was left."""
        ...

    def status(self) -> SinkStatus:
        """Current delivery health."""
        ...



def open_spool(config: Config, sink: str) -> Spool | None:
    """The sink's on-disk spool under the state directory (none when state is disabled)."""
    if config.state_dir is None:
        return None
    return Spool(config.state_dir / "spool", sink)


def open_dead_letter(config: Config) -> DeadLetterFile | None:
    """The dead-letter file under the state directory (none when state is disabled)."""
    if config.state_dir is None:
        return None
    return DeadLetterFile(config.state_dir)
