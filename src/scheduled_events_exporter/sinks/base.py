"""What every sink is: the :class:`Sink` protocol, its status, and what it is given.

A sink is anything with the :class:`Sink` shape. The poll loop only calls :meth:`Sink.submit`
and :meth:`Sink.metrics_changed` (non-blocking hand-overs); every sink does its I/O on its own
worker (:class:`~scheduled_events_exporter.sinks.delivery.DeliveryWorker`) or metric reader,
so a dead collector or a hung Event Hubs client never delays the next poll.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import Resource

from scheduled_events_exporter.config import Config
from scheduled_events_exporter.dead_letter import DeadLetterFile
from scheduled_events_exporter.records import TransitionRecord
from scheduled_events_exporter.spool import Spool
from scheduled_events_exporter.telemetry import ExtraMetrics
from scheduled_events_exporter.write_faults import WriteFault


class FailureKind(enum.Enum):
    """How a failed delivery is handled: ``TRANSIENT`` is retried in order, ``CONFIG`` is retried
    and reported loudly (readiness fails), ``PERMANENT`` isolates the record into the dead letter,
    ``TOO_LARGE`` (the request, not a record, was refused for its size) halves the batch until
    it passes, a single record still refused going to the dead letter (:mod:`.delivery`)."""

    TRANSIENT = "transient"
    CONFIG = "config"
    PERMANENT = "permanent"
    TOO_LARGE = "too_large"


class DeliveryError(Exception):
    """A sink could not deliver a batch; the message is safe to log (no secrets).

    ``status`` names what the peer answered (``HTTP 400``, ``gRPC INVALID_ARGUMENT``), empty
    when it did not answer.
    """

    def __init__(self, message: str, kind: FailureKind = FailureKind.TRANSIENT,
                 status: str = "", *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        #: Seconds the peer asked us to wait before trying again, if it said.
        self.retry_after = retry_after


@dataclass(frozen=True, slots=True)
class SinkStatus:
    """A sink's delivery health, for logs and ``/readyz``."""

    name: str
    pending: int
    #: Seconds the oldest undelivered record has waited (0 when idle).
    oldest_wait: float
    consecutive_failures: int
    last_error: str
    dropped: int
    #: Highest record sequence number this sink has seen (spooled or delivered).
    last_seq: int = 0
    #: Records rejected permanently and moved to the dead-letter file since start.
    dead_lettered: int = 0
    #: Set while the sink refuses us for a configuration reason (authentication, endpoint):
    #: records are kept and retried, but nothing will arrive until someone fixes it.
    config_error: str = ""
    #: Files of this sink (spool, dead letter) that cannot be written right now.
    write_faults: tuple[WriteFault, ...] = ()


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


FailureCounter = Callable[[str, str, int], None]


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
