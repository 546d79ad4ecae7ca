"""The base of every sink: a sink is its ``_deliver`` plus one
:class:`~scheduled_events_exporter.delivery.worker.DeliveryWorker` (queue, spool, retries, dead
letters), which this class builds from the configuration and drives."""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import Resource

from scheduled_events_exporter.config import Config
from scheduled_events_exporter.delivery.outcome import FailureCounter, SinkStatus
from scheduled_events_exporter.delivery.pause import Pause
from scheduled_events_exporter.delivery.worker import DeliveryWorker
from scheduled_events_exporter.records import TransitionRecord, to_columns
from scheduled_events_exporter.sinks.base import open_dead_letter, open_spool
from scheduled_events_exporter.telemetry import ExtraMetrics


class WorkerSink:
    """Base of the sinks: everything but ``_deliver`` goes through one ``DeliveryWorker``.

    Subclasses set ``name``, implement ``_deliver`` (raise ``DeliveryError`` on failure, with
    the ``FailureKind`` the peer's answer means), may override ``_payload`` (the record as sent,
    for the dead-letter file) and may add metric readers or a ``_close`` step.
    """

    name = ""

    def __init__(self, config: Config, count_failure: FailureCounter,
                 pause: Pause | None = None) -> None:
        """``pause``: the collector's pause, when something else sends to it too (the
        sink's metric exporter); the worker makes its own otherwise."""
        self._resource = Resource.create({})
        self._extra_metrics: ExtraMetrics = list
        self._worker = DeliveryWorker(self.name, self._deliver, count_failure,
                                      max_records=config.spool_max_records,
                                      max_bytes=config.spool_max_bytes,
                                      spool=open_spool(config, self.name),
                                      dead_letter=open_dead_letter(config),
                                      payload=self._payload, pause=pause)

    def metric_readers(self) -> Sequence[MetricReader]:
        """No metrics unless the sink adds a reader."""
        return ()

    def start(self, resource: Resource, extra_metrics: ExtraMetrics = list) -> None:
        """Start the worker; ``resource`` describes this VM, ``extra_metrics`` adds metrics
        built at export time to this sink's metric exports."""
        self._resource = resource
        self._extra_metrics = extra_metrics
        self._worker.start()

    def submit(self, records: Sequence[TransitionRecord]) -> None:
        """Queue records for delivery (durably when a spool is configured)."""
        self._worker.submit(records)

    @property
    def delivery(self) -> DeliveryWorker:
        """The sink's delivery worker (for the start sequence)."""
        return self._worker

    def shutdown(self, timeout: float) -> bool:
        """Deliver what is queued within ``timeout``, then release the sink's resources."""
        done = self._worker.stop(timeout)
        self._close()
        return done

    def status(self) -> SinkStatus:
        """Delivery health."""
        return self._worker.status()

    def _deliver(self, records: Sequence[TransitionRecord]) -> None:
        raise NotImplementedError

    def _payload(self, record: TransitionRecord) -> object:
        """The record as this sink sends it (for the dead-letter file): the
        docs/semantics.md#sinks object."""
        return to_columns(record)

    def _close(self) -> None:
        """Release clients and exporters after the worker stopped."""
