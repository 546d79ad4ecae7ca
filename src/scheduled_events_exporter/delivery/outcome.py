"""What a delivery attempt can come to, and a sink's delivery health: the words the delivery
worker and the protocol adapters in ``sinks/`` share."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from scheduled_events_exporter.write_faults import WriteFault


class FailureKind(enum.Enum):
    """How a failed delivery is handled (:mod:`.worker`): ``TRANSIENT`` is retried in order
    after a backoff; ``CONFIG`` too, and reported loudly (readiness fails); ``PERMANENT``
    isolates the record into the dead letter; ``TOO_LARGE`` (the request, not a record, was
    refused for its size, and the answer proves it) halves the request after a backoff, a record
    refused alone twice going to the dead letter; ``EXHAUSTED`` (refused without a reason: busy,
    or perhaps too large) is ``TOO_LARGE`` when the peer accepted smaller requests and none this
    large (:mod:`.bound`), else ``TRANSIENT``."""

    TRANSIENT = "transient"
    CONFIG = "config"
    PERMANENT = "permanent"
    TOO_LARGE = "too_large"
    EXHAUSTED = "exhausted"


class DeliveryError(Exception):
    """A sink could not deliver a batch; the message is safe to log (no secrets).

    ``status`` names what the peer answered (``HTTP 400``, ``gRPC INVALID_ARGUMENT``), empty
    when it did not answer.
    """

    def __init__(self, message: str, kind: FailureKind = FailureKind.TRANSIENT,
                 status: str = "", *, retry_after: float | None = None,
                 suspicious: bool | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        #: Seconds the peer asked us to wait before trying again, if it said.
        self.retry_after = retry_after
        #: Retried although the peer's protocol calls it final (``RESOURCE_EXHAUSTED`` without
        #: ``RetryInfo``, a 500): a record refused this way every time may be the cause.
        #: By default only ``EXHAUSTED`` is.
        self.suspicious = kind is FailureKind.EXHAUSTED if suspicious is None else suspicious


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
    #: Set while the sink's recent records were dead-lettered (all of the last few, or most in
    #: the last minutes): it refuses what it is given (:mod:`.rejections`).
    rejecting: str = ""
    #: Bytes one request may carry now (halved after a refusal for size, grown back after
    #: successes), and the most it may.
    request_bytes: int = 0
    max_request_bytes: int = 0
    #: Seconds until the next request may go (the peer's requested pause, or our backoff).
    paused_for: float = 0.0
    #: Records refused for good whose letters the dead-letter file could not take yet: they
    #: stay in the spool until it can.
    letters_waiting: int = 0
    #: This sink's letters the dead-letter file's bound removed since start (gone for good).
    letters_removed: int = 0
    #: The seconds the peer asked to pause for (Retry-After, RetryInfo), while that request is
    #: the pause in force; 0 while the pause is our backoff after failures (or none runs).
    pause_asked: float = 0.0
    #: Highest record sequence number this sink's spool holds durably (its append returned);
    #: without a spool, the highest it was given. The platform command deletes a queue message
    #: only once every sink's is at least its records' last.
    spooled_seq: int = 0


#: Counts a failure: (sink, signal, count); the ``export.failures`` metric.
FailureCounter = Callable[[str, str, int], None]
