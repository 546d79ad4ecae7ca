"""What a delivery attempt can come to, and a sink's delivery health: the words the delivery
worker and the protocol adapters in ``sinks/`` share."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

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


#: Counts a failure: (sink, signal, count); the ``export.failures`` metric.
FailureCounter = Callable[[str, str, int], None]
