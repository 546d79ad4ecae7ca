"""OTLP over gRPC, through channels that exist only around exports.

While any gRPC channel is open, the gRPC core keeps threads of its own awake: a timer manager
and a thread-pool lifeguard that wake every second, and work-stealing pool threads that look
for work every 15 ms to 3 s. Those intervals are compile-time constants of gRPC's event engine
(``work_stealing_thread_pool.cc``), not options. On an idle exporter, which exports metrics
once a minute, they cost a third of the process's CPU. When the last channel is released the
core shuts down and the threads exit (measured: 6 threads before, none after).

So each signal's channel is opened at an export and closed once no export has used it for
:data:`LINGER` seconds. Reopening costs about 4 ms of CPU and a connection handshake (over TLS,
a TLS handshake too), paid by the first export after a quiet spell; a burst of changes reuses
one channel. A channel that answered ``UNAVAILABLE`` is closed at once, so the next attempt
connects afresh instead of waiting out gRPC's own reconnection backoff (up to two minutes).
The calls are the generated ``LogsService``/``MetricsService`` stubs of ``opentelemetry-proto``;
each sends once, retries are the caller's (:mod:`.otlp_transport`).

Sizes, as over HTTP (:mod:`.otlp_transport`, :class:`~.otlp_transport.Limits`): a request over
the request limit (its ``ByteSize()``, before compression) is never sent; an answer is received
up to the response limit (4 MiB, gRPC's own default), which gRPC checks after decompression too.
A larger one makes gRPC fail the call *on our side* with ``RESOURCE_EXHAUSTED`` after the server
had answered: a unary server sends a response message only with an OK status, so the collector
took the records. Read as a refusal, it would split and dead-letter records that were
delivered, or send them again; it counts as accepted instead (:func:`own_receive_limit` says
when the failure is provably ours), with the answer discarded unread, as over HTTP. gRPC's
words for a message over the limit after decompression ("Decompressed message larger than
max") name neither side nor number, and a server says the same of a compressed request over
its own limit: they prove our limit only when the request went uncompressed (a server had
nothing to decompress); after a gzipped request they stay the collector's refusal for size.

The answer's metadata (headers and trailers: the status message, ``grpc-status-details-bin``)
is bounded by the same limit (gRPC's default, 16 KiB, turned a refusal with a long message, or
an OK with long trailers, into a ``RESOURCE_EXHAUSTED`` of our own that hid the collector's
status). Metadata over the limit leaves the status unknown: it is read as no answer
(:func:`own_metadata_limit`), retried, as a server that disconnects without answering.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc  # type: ignore[import-untyped]

from scheduled_events_exporter.otlp_settings import OtlpTarget
from scheduled_events_exporter.sinks.otlp_transport import (
    MAX_RESPONSE_BYTES,
    USER_AGENT,
    Answer,
    Limits,
    partial_success,
    refused_here,
    rpc_status,
    shown,
    too_long_to_read,
)

#: Seconds a channel stays open after its last export: longer than the gap between the
#: records of one change and its metric export, far shorter than the 60 s heartbeat.
LINGER = 5.0
#: The trailer in which a gRPC server sends the full ``google.rpc.Status``, with its details
#: (``RetryInfo``): the gRPC convention, what ``grpcio-status`` reads.
STATUS_DETAILS = "grpc-status-details-bin"

#: What gRPC core says of a message over a receive limit. Recent releases name the side that
#: hit it (``CLIENT: ...``/``SERVER: ...``, as grpcio 1.85 does); older ones did not.
_OVER_LIMIT = re.compile(
    r"(?:\b(CLIENT|SERVER): )?Received message larger than max \((\d+) vs\. (\d+)\)")
#: ... and of a compressed message over it once decompressed (no side, no numbers in grpcio
#: 1.85; a side is read if a release adds one).
_DECOMPRESSED_OVER_LIMIT = re.compile(
    r"(?:\b(CLIENT|SERVER): )?Decompressed message larger than max")
#: ... and of metadata (headers, trailers) over the metadata limit; on our side the call's
#: words start "Stream removed (", a server's refusal of our metadata does not.
_METADATA_OVER_LIMIT = re.compile(
    r"^Stream removed \(received metadata size exceeds hard limit "
    r"\(value length (\d+) vs\. (\d+)\)\)$")

T = TypeVar("T")


def own_receive_limit(details: str, request_size: int,
                      limit: int = MAX_RESPONSE_BYTES, *, compressed: bool = False) -> bool:
    """Whether a ``RESOURCE_EXHAUSTED`` with these ``details`` is our own receive limit
    (``limit``) refusing the server's answer, rather than the server refusing our request of
    ``request_size`` bytes (sent gzipped when ``compressed``). Proof: gRPC's words name
    ``limit`` as the maximum, and either say the client hit it, or the request was no larger
    than ``limit`` (a server whose limit is the same number would have taken it); or they say
    a decompressed message was over it, and either name the client or the request was not
    compressed (a server decompresses only what was compressed). Anything else is the
    server's refusal."""
    decompressed = _DECOMPRESSED_OVER_LIMIT.search(details)
    if decompressed is not None:
        side = decompressed.group(1)
        return side == "CLIENT" or (side is None and not compressed)
    match = _OVER_LIMIT.search(details)
    if match is None or match.group(1) == "SERVER" or int(match.group(3)) != limit:
        return False
    return match.group(1) == "CLIENT" or request_size <= limit


def own_metadata_limit(details: str, limit: int = MAX_RESPONSE_BYTES) -> bool:
    """Whether a ``RESOURCE_EXHAUSTED`` with these ``details`` is our own metadata limit
    (``limit``) refusing the server's headers or trailers: gRPC's words for a stream our side
    removed, naming ``limit``. A server refusing our (small) metadata says it otherwise."""
    match = _METADATA_OVER_LIMIT.match(details)
    return match is not None and int(match.group(2)) == limit


class ChannelKeeper:
    """Opens a channel for an export and closes it :data:`LINGER` seconds after the last one.

    ``open_channel``/``close_channel`` are called under this keeper's lock, never during an
    export through the same keeper.
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

    def export(self, call: Callable[[], T]) -> T:
        """Run ``call`` (one export) with the channel open; schedule its closing."""
        with self._lock:
            if not self._open and not self._stopped:
                self._open_channel()
                self._open = True
            try:
                return call()
            finally:
                self._last_use = self._clock()
                self._arm(self._linger)

    def discard(self) -> None:
        """Close the channel now (the next export opens a new one)."""
        with self._lock:
            self._shut()

    def stop(self) -> None:
        """Close the channel and open no other."""
        with self._lock:
            self._stopped = True
            self._shut()
        timer = self._timer
        if timer is not None:
            timer.cancel()

    def _shut(self) -> None:
        if self._open:
            self._open = False
            self._close_channel()

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
            self._shut()


def _method(signal: str) -> str:
    """The full name of the signal's ``Export`` method, as a server's log names it."""
    service = "LogsService" if signal == "logs" else "MetricsService"
    return f"/opentelemetry.proto.collector.{signal}.v1.{service}/Export"


def _stub(signal: str, channel: Any) -> Callable[..., Any]:
    """The ``Export`` call of the signal's generated service stub."""
    if signal == "logs":
        from opentelemetry.proto.collector.logs.v1.logs_service_pb2_grpc import (
            LogsServiceStub,
        )

        return LogsServiceStub(channel).Export  # type: ignore[no-untyped-call, no-any-return]
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2_grpc import (
        MetricsServiceStub,
    )

    return MetricsServiceStub(channel).Export  # type: ignore[no-untyped-call, no-any-return]


def _read(path: str) -> bytes | None:
    if not path:
        return None
    with open(path, "rb") as file:
        return file.read()


def _retry_info(error: Any) -> float | None:
    """The delay of a ``google.rpc.RetryInfo`` in the call's status details, if any (the
    error of a unary call is also its ``grpc.Call``, which has the trailers)."""
    trailers = error.trailing_metadata() if callable(
        getattr(error, "trailing_metadata", None)) else None
    for key, value in trailers or ():
        if key == STATUS_DETAILS and isinstance(value, bytes):
            return rpc_status(value)[1]
    return None


class GrpcTransport:
    """OTLP over gRPC to ``target.grpc_target`` (any target the gRPC client takes:
    ``host:port``, ``dns:``, ``unix:``), one request per call, within ``limits``."""

    def __init__(self, target: OtlpTarget, *, linger: float = LINGER,
                 clock: Callable[[], float] = time.monotonic,
                 limits: Limits | None = None) -> None:
        self._target = target
        self._limits = limits if limits is not None else Limits()
        self._metadata = tuple(target.headers)
        self._compression = grpc.Compression.Gzip if target.gzip else grpc.Compression.NoCompression
        self._credentials = None if target.insecure else grpc.ssl_channel_credentials(
            root_certificates=_read(target.certificate), private_key=_read(target.client_key),
            certificate_chain=_read(target.client_certificate))
        self._channel: Any = None
        self._export: Callable[..., Any] | None = None
        self._keeper = ChannelKeeper(self._open, self._close, linger, clock)
        # No userinfo (a URL's password) in what an error line says was tried.
        self._sent_to = (f"{_method(target.signal)} at "
                         f"{target.grpc_target.rpartition('@')[2]}")

    def _open(self) -> None:
        # An answer is bounded as over HTTP: 4 MiB, room for a collector's long partial-success
        # message (its count is worth reading), and no more than gRPC's own default; its
        # metadata (a refusal's message, trailers) to the same, read rather than refused
        # (gRPC's 16 KiB would hide the status of a refusal with a long message).
        bound = self._limits.max_response_bytes
        options = [("grpc.primary_user_agent", USER_AGENT),
                   ("grpc.max_receive_message_length", bound),
                   ("grpc.max_metadata_size", bound),
                   ("grpc.absolute_max_metadata_size", bound)]
        if self._credentials is None:
            self._channel = grpc.insecure_channel(self._target.grpc_target, options=options,
                                                  compression=self._compression)
        else:
            self._channel = grpc.secure_channel(self._target.grpc_target, self._credentials,
                                                options=options, compression=self._compression)
        self._export = _stub(self._target.signal, self._channel)

    def _close(self) -> None:
        channel, self._channel, self._export = self._channel, None, None
        if channel is not None:
            channel.close()

    def send(self, request: Any, timeout: float) -> Answer:
        """Call ``Export`` once (never with a request over the request limit)."""
        # Its size as gRPC will serialize it (a second encoding's cost, ~5 ms a MB, for the
        # guarantee that no call is started with a request over the limit).
        refused = refused_here(int(request.ByteSize()), self._limits)
        if refused is not None:  # not sent: no channel opened for it either
            return refused
        answer = self._keeper.export(lambda: self._call(request, timeout))
        if answer.status == "UNAVAILABLE":
            self._keeper.discard()
        return answer

    def _call(self, request: Any, timeout: float) -> Answer:
        if self._export is None:  # stopped: no channel any more
            return Answer(False, None, detail="the exporter is shutting down")
        try:
            response = self._export(request, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            code = exc.code() if callable(getattr(exc, "code", None)) else None
            details = str((exc.details() if callable(getattr(exc, "details", None)) else "")
                          or "")
            name = code.name if code is not None else None
            bound = self._limits.max_response_bytes
            if name == "RESOURCE_EXHAUSTED" and own_receive_limit(
                    details, request.ByteSize(), bound, compressed=self._target.gzip):
                # The collector answered, and only with OK does a server send an answer: the
                # records were taken. Resending would duplicate them.
                return Answer(True, "OK", detail=too_long_to_read(bound), unread=True)
            if name == "RESOURCE_EXHAUSTED" and own_metadata_limit(details, bound):
                # Headers or trailers over our limit: the collector's status is unknown, as
                # when it disconnects without answering.
                return Answer(False, None, detail=(
                    f"the answer's metadata was larger than {bound} bytes and was not read"))
            return Answer(False, name, detail=shown(details), retry_after=_retry_info(exc),
                          sent_to=self._sent_to)
        rejected, message = partial_success(response, self._target.signal)
        return Answer(True, "OK", rejected, message)

    def close(self) -> None:
        """Close the channel for good."""
        self._keeper.stop()
