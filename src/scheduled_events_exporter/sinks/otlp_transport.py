"""One OTLP request, sent once, and what the collector answered.

The OTLP route owns its requests: :mod:`.otlp_proto` builds them, a transport here sends each
exactly once and reports the answer (:class:`Answer`), and the caller decides what it means
(:mod:`.otlp_errors`). Retrying belongs to one layer only: the sink's delivery worker for log
records (in order, with backoff, to the dead-letter file when rejected for good), the next
change or heartbeat for metrics, which are read again anyway.

http/protobuf (:class:`HttpTransport`): ``urllib3`` (the client the IMDS side already uses),
one keep-alive connection,
``Content-Type: application/x-protobuf``, gzip when asked, the CA bundle of ``certifi`` unless
``..._CERTIFICATE`` names one (as the SDK's ``requests`` session does), a client certificate
for mutual TLS, and ``HTTPS_PROXY``/``HTTP_PROXY``/``NO_PROXY`` as ``requests`` reads them. No
redirect is followed (an OTLP endpoint does not move; a 3xx is reported with its ``Location``
as a configuration error, :mod:`.otlp_errors`). gRPC: :mod:`.grpc_channel`, imported only
when a signal uses it (``otlp.transport_for``).

Sizes (OTLP 1.11.0, "OTLP/HTTP Request", "OTLP/HTTP Response", "OTLP/gRPC Request",
"OTLP/gRPC Response"; docs/otlp-conformance.md, "Request and response size"), the limits of a
:class:`Limits` (its defaults the specification's recommendations, :data:`MAX_REQUEST_BYTES`
and :data:`MAX_RESPONSE_BYTES`):

* A request whose serialized size before compression is over the request limit is never sent
  (the client "MUST NOT make the request"): the transport answers :data:`REQUEST_TOO_LARGE`
  itself (:func:`refused_here`), which the sink reads as a permanent refusal of the record
  (dead-lettered, counted: the drop recorded) or of the metric export (dropped, counted).
* An accepted request's answer is read up to the response limit (4 MiB) on both protocols,
  after decompression: an OTLP response is a count and a message, a few hundred bytes, but a
  collector's partial-success message can be long (one line per dropped item), and the count
  in it is worth reading. Past the limit the answer is discarded unread (HTTP: the rest of the
  body is never read and the connection is closed; gRPC: its receive limit fails the call on
  our side). That is the specification's "non-retryable error", and for an answer whose
  status said the collector *accepted* the request it means: never sent again, acknowledged
  (the collector has the records), never dead-lettered; whether the collector dropped some of
  them (a partial success) is unknown, and the sink says so and counts it
  (``Answer.unread``).
* An error answer's body (HTTP) is read to :data:`MAX_ERROR_BYTES` only: its status decides
  what happens to the records (retried or not), whatever the size of its body, and what is
  shown of the body is its first words; a protobuf body cut at the bound is not parsed (no
  ``RetryInfo`` is read from it; a ``Retry-After`` header still is). The collector's words are
  logged bounded (:func:`shown`).

Throttling: the delay a collector asks for is read here, from ``Retry-After`` in every form
HTTP allows (:mod:`.retry_after`: delta-seconds and the three HTTP-date forms, measured from
the response's ``Date``) and from gRPC's ``google.rpc.RetryInfo`` (:func:`rpc_status`), and
handed over uncapped; the delivery worker alone caps it and waits
(``delivery.RETRY_AFTER_CAP``).
"""

from __future__ import annotations

import gzip
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import certifi
import urllib3
from google.protobuf import (  # type: ignore[import-untyped]
    descriptor_pb2,
    descriptor_pool,
    message_factory,
)
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]

from scheduled_events_exporter import __version__
from scheduled_events_exporter.otlp_settings import OtlpTarget
from scheduled_events_exporter.sinks.retry_after import retry_after

#: Sent with every request, so a collector's log can tell us from other clients: the exporter,
#: its version and its language, as the specification's "User Agent" section asks (RFC 9110
#: product tokens).
USER_AGENT = (f"azure-scheduled-events-exporter/{__version__} "
              f"Python/{sys.version_info.major}.{sys.version_info.minor}")
#: The largest request sent, in bytes of its serialized message before compression: the
#: specification's recommended default (64 MiB). The delivery worker's own bound on a request
#: (``delivery.MAX_BATCH_BYTES``, about 4 MiB of records) keeps requests far below it; this is
#: the guarantee that none over it is ever made, whatever put it together.
MAX_REQUEST_BYTES = 64 * 1024 * 1024
#: The most of an accepted request's answer read (HTTP body; gRPC's receive limit), after
#: decompression: gRPC's own default, the size the specification recommends. Beyond it the
#: answer is not read (HTTP: the connection is closed; gRPC: the call fails on our side) and
#: the request counts as accepted, its partial success unknown.
MAX_RESPONSE_BYTES = 4 * 1024 * 1024
#: The most of an error answer's body read (HTTP): only its first words are shown.
MAX_ERROR_BYTES = 64 * 1024
#: The most of the collector's words (partial-success message, error status) put in a log line.
MAX_SHOWN = 200


def shown(text: str, limit: int = MAX_SHOWN) -> str:
    """The collector's words for a log line: whitespace collapsed, cut at ``limit`` characters
    with a note of how long they were (a collector may write megabytes)."""
    head = " ".join(text[:limit * 4].split())  # never the whole of a long text
    if len(head) <= limit and len(text) <= limit * 4:
        return head
    return f"{head[:limit]}... ({len(text)} characters)"


def too_long_to_read(limit: int) -> str:
    """What is said of an answer over the response limit ``limit``."""
    return f"the response was larger than {limit} bytes and was discarded unread"


#: Said of an accepted request whose answer was over the default response limit.
TOO_LONG_TO_READ = too_long_to_read(MAX_RESPONSE_BYTES)
#: The status of a request the client refused to send for its size (never reached a
#: collector); the ``status`` of the record's dead letter.
REQUEST_TOO_LARGE = "request_too_large"


@dataclass(frozen=True, slots=True)
class Answer:
    """What one request got. ``status`` is the HTTP code or the gRPC status name, ``None`` when
    nothing answered (connection refused, reset, timed out, TLS failed)."""

    ok: bool
    status: int | str | None = None
    #: Items the collector accepted the request for but dropped (OTLP partial success).
    rejected: int = 0
    #: The collector's own words (partial success, error status) or the connection error.
    detail: str = ""
    #: Seconds the collector asked us to wait (``Retry-After``, gRPC ``RetryInfo``), if it did;
    #: not capped here (the delivery worker caps it).
    retry_after: float | None = None
    #: Where a 3xx answer pointed (its ``Location`` header), to say in the warning.
    location: str = ""
    #: What was tried, for an error that says it was the wrong place (404, ``UNIMPLEMENTED``):
    #: ``POST <url>`` (no userinfo, no query), or the gRPC method and target.
    sent_to: str = ""
    #: Accepted (``ok``), but the answer was over the response limit and discarded unread:
    #: whether the collector dropped some of the items (a partial success) is unknown.
    unread: bool = False


@dataclass(frozen=True, slots=True)
class Limits:
    """The sizes a transport keeps to (OTLP 1.11.0: a client limits both; the specification
    recommends these defaults). Not read from the environment: the specification names no
    variable for either (docs/otlp-conformance.md, C1, Z2, Z6)."""

    #: Requests larger than this (serialized, before compression) are never sent.
    max_request_bytes: int = MAX_REQUEST_BYTES
    #: Answers larger than this (after decompression) are not read.
    max_response_bytes: int = MAX_RESPONSE_BYTES


def refused_here(size: int, limits: Limits) -> Answer | None:
    """The answer the client gives itself for a request of ``size`` bytes (serialized, before
    compression) over ``limits.max_request_bytes``, which then is never sent; ``None`` when it
    may go."""
    if size <= limits.max_request_bytes:
        return None
    return Answer(False, REQUEST_TOO_LARGE,
                  detail=(f"the request is {size} bytes, over the client's limit of "
                          f"{limits.max_request_bytes} bytes; it was not sent"))


class Transport(Protocol):
    """Sends one encoded OTLP request of one signal."""

    def send(self, request: Any, timeout: float) -> Answer:
        """Send once; never raises for the collector's or the network's sake."""

    def close(self) -> None:
        """Release connections and channels."""


def _response_type(signal: str) -> Callable[[], Any]:
    if signal == "logs":
        from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
            ExportLogsServiceResponse,
        )

        return ExportLogsServiceResponse
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceResponse,
    )

    return ExportMetricsServiceResponse


def partial_success(response: Any, signal: str) -> tuple[int, str]:
    """(items rejected, the collector's message) of an OTLP response."""
    partial = response.partial_success
    rejected = partial.rejected_log_records if signal == "logs" else partial.rejected_data_points
    return int(rejected), shown(str(partial.error_message))


def status_message(body: bytes, content_type: str) -> str:
    """The collector's explanation in an error answer: OTLP/HTTP sends a ``google.rpc.Status``
    (protobuf), some collectors plain text or JSON."""
    if "protobuf" in content_type:
        return rpc_status(body)[0]
    return shown(body.decode("utf-8", "replace"))


def _rpc_classes() -> tuple[Any, Any]:
    """Message classes with the wire shape of ``google.rpc.Status`` (code 1, message 2, details
    3 as ``google.protobuf.Any``) and ``google.rpc.RetryInfo`` (retry_delay 1, a
    ``google.protobuf.Duration``), in a pool of their own. The protos are googleapis-common-
    protos', not a dependency of ours for two messages; only field numbers and types matter on
    the wire, so these read what a collector sends."""
    file = descriptor_pb2.FileDescriptorProto(name="see_rpc_status.proto",
                                              package="see.rpc", syntax="proto3")
    types = descriptor_pb2.FieldDescriptorProto
    optional, repeated = types.LABEL_OPTIONAL, types.LABEL_REPEATED
    for message, fields in (
        ("Status", (("code", 1, types.TYPE_INT32, optional, ""),
                    ("message", 2, types.TYPE_STRING, optional, ""),
                    ("details", 3, types.TYPE_MESSAGE, repeated, ".see.rpc.Any"))),
        ("Any", (("type_url", 1, types.TYPE_STRING, optional, ""),
                 ("value", 2, types.TYPE_BYTES, optional, ""))),
        ("RetryInfo", (("retry_delay", 1, types.TYPE_MESSAGE, optional, ".see.rpc.Duration"),)),
        ("Duration", (("seconds", 1, types.TYPE_INT64, optional, ""),
                      ("nanos", 2, types.TYPE_INT32, optional, ""))),
    ):
        proto = file.message_type.add(name=message)
        for name, number, kind, label, type_name in fields:
            field = proto.field.add(name=name, number=number, type=kind, label=label)
            if type_name:  # set only for message fields (an empty one counts as set)
                field.type_name = type_name
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(file.SerializeToString())
    return (message_factory.GetMessageClass(pool.FindMessageTypeByName("see.rpc.Status")),
            message_factory.GetMessageClass(pool.FindMessageTypeByName("see.rpc.RetryInfo")))


_STATUS, _RETRY_INFO = _rpc_classes()
_RETRY_INFO_TYPE = "type.googleapis.com/google.rpc.RetryInfo"


def rpc_status(data: bytes) -> tuple[str, float | None]:
    """(message, RetryInfo's delay in seconds or ``None``) of a serialized
    ``google.rpc.Status`` (an OTLP/HTTP error body, gRPC's ``grpc-status-details-bin``
    trailer); ``("", None)`` if it is not one."""
    status = _STATUS()
    try:
        status.ParseFromString(data)
    except DecodeError:
        return "", None
    delay = None
    for detail in status.details:
        if detail.type_url == _RETRY_INFO_TYPE:
            info = _RETRY_INFO()
            try:
                info.ParseFromString(detail.value)
            except DecodeError:
                continue
            seconds = info.retry_delay.seconds + info.retry_delay.nanos / 1e9
            delay = seconds if seconds >= 0 else None
    return shown(str(status.message)), delay


def shown_url(url: str) -> str:
    """``url`` as a log line may show it: without userinfo (a password), query or fragment
    (a token)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


class HttpTransport:
    """OTLP over http/protobuf to ``target.endpoint``, within ``limits``."""

    def __init__(self, target: OtlpTarget, limits: Limits | None = None) -> None:
        self._target = target
        self._limits = limits if limits is not None else Limits()
        self._url = target.endpoint
        self._sent_to = f"POST {shown_url(self._url)}"
        self._response = _response_type(target.signal)
        self._headers = {"Content-Type": "application/x-protobuf", "User-Agent": USER_AGENT,
                         **dict(target.headers)}
        if target.gzip:
            self._headers["Content-Encoding"] = "gzip"
        parts = urlsplit(self._url)
        tls: dict[str, Any] = {}
        if parts.scheme == "https":
            tls = {"cert_reqs": "CERT_REQUIRED",
                   "ca_certs": target.certificate or certifi.where(),
                   "cert_file": target.client_certificate or None,
                   "key_file": target.client_key or None}
        proxy = urllib.request.getproxies().get(parts.scheme)
        if proxy and not urllib.request.proxy_bypass(parts.hostname or ""):
            self._pool: urllib3.PoolManager = urllib3.ProxyManager(
                proxy, num_pools=1, maxsize=1, retries=False, **tls)
        else:
            self._pool = urllib3.PoolManager(num_pools=1, maxsize=1, retries=False, **tls)

    def send(self, request: Any, timeout: float) -> Answer:
        """POST the request once (never one over the request limit)."""
        body = request.SerializeToString()
        refused = refused_here(len(body), self._limits)
        if refused is not None:
            return refused
        if self._target.gzip:
            body = gzip.compress(body)
        accepted_bound = self._limits.max_response_bytes
        error_bound = min(MAX_ERROR_BYTES, accepted_bound)
        try:
            response = self._pool.request(
                "POST", self._url, body=body, headers=self._headers, redirect=False,
                timeout=urllib3.Timeout(total=timeout), retries=False, preload_content=False)
        except urllib3.exceptions.HTTPError as exc:
            reason = getattr(exc, "reason", None) or exc
            return Answer(False, None, detail=_short(reason))
        accepted = 200 <= response.status < 300
        bound = accepted_bound if accepted else error_bound
        unreadable = ""
        try:
            # Read after decompression: urllib3 decodes a Content-Encoding within the amount
            # asked for, so a small compressed body cannot become a large one here.
            data = _read_bounded(response, bound)
        except urllib3.exceptions.HTTPError as exc:  # cut off, or an encoding that is not
            response.close()
            data, unreadable = b"", _short(getattr(exc, "reason", None) or exc)
        content_type = response.headers.get("Content-Type", "")
        cut = len(data) > bound
        if accepted:
            if cut or unreadable:
                # Accepted (the status says so: resending would duplicate), but the answer is
                # not read: over the limit, the specification's non-retryable error, which for
                # an accepted request means delivered, its partial success unknown.
                said = (too_long_to_read(bound) if cut
                        else f"the response could not be read ({unreadable})")
                return Answer(True, response.status, detail=said, unread=True)
            rejected, message = 0, ""
            if data and "protobuf" in content_type:
                answer = self._response()
                try:
                    answer.ParseFromString(data)
                    rejected, message = partial_success(answer, self._target.signal)
                except Exception:  # a success whose body we cannot read is still a success
                    pass
            return Answer(True, response.status, rejected, message)
        # A refusal: its status decides, whatever the size of its body. A body cut at the
        # bound is no message of the collector's: its first words are shown, a protobuf one is
        # not parsed (no RetryInfo from it; the Retry-After header is read all the same).
        delay = retry_after(response.headers.get("Retry-After"),
                            date=response.headers.get("Date"))
        if unreadable:
            detail = f"(a body that could not be read: {unreadable})"
        elif cut:
            said = ("" if "protobuf" in content_type
                    else shown(data[:bound].decode("utf-8", "replace")) + " ")
            detail = f"{said}(a body larger than {bound} bytes; the rest was not read)"
        else:
            if delay is None and "protobuf" in content_type:  # a RetryInfo in the Status body
                delay = rpc_status(data)[1]
            detail = status_message(data or b"", content_type)
        return Answer(False, response.status, detail=detail, retry_after=delay,
                      location=" ".join(response.headers.get("Location", "").split())[:200],
                      sent_to=self._sent_to)

    def close(self) -> None:
        """Close the kept-alive connection."""
        self._pool.clear()


def _read_bounded(response: Any, bound: int) -> bytes:
    """At most ``bound`` + 1 bytes of the body (more than the bound: it was cut); the
    connection is kept for the next request only when the body was read to its end."""
    data: bytes = response.read(bound + 1)
    if len(data) > bound:
        response.close()  # the rest is never read: this connection cannot be reused
        return data  # one byte over: the caller can tell it was cut
    response.release_conn()
    return data


def _short(error: object) -> str:
    """A connection error in a few words (urllib3 nests them: the innermost says it best)."""
    text = str(error)
    for marker in ("Connection refused", "timed out", "Name or service not known",
                   "CERTIFICATE_VERIFY_FAILED", "Connection reset"):
        if marker in text:
            return marker
    return " ".join(text.split())[:200]
