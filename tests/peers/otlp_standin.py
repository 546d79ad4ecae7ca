"""Small OTLP receivers on loopback whose answers a test controls (rotel always says yes).

* :class:`OtlpHttpStandIn`: OTLP/HTTP (protobuf) on ``/v1/logs`` and ``/v1/metrics``.
* :class:`OtlpGrpcStandIn`: the OTLP ``LogsService`` and ``MetricsService`` over gRPC.

Metrics requests are answered by :attr:`_Base.metrics_answer` (called as each arrives: ``None``
accepts, a status or a :class:`Reply` refuses) and kept whole, accepted or not, in
:attr:`_Base.metrics`.

Both decode each logs request with the real OTLP protobuf classes, answer according to
:meth:`answer` (a callable given the EventIds in the request: ``None`` accepts, an HTTP status
or a gRPC status name refuses, a :class:`Reply` scripts more: a ``Retry-After`` or ``Location``
header, a gRPC ``RetryInfo``, a partial success, the body of the answer as it is sent, a
gzip-encoded answer, a refusal's message, gRPC trailers), and keep every *accepted* log record, in
arrival order, with its serialized content, the request it came in and the sender the request
named in the :data:`SENDER_HEADER` header (``OTEL_EXPORTER_OTLP_LOGS_HEADERS`` of the exporter
sets it). ``max_bytes`` sets a size limit: over HTTP a larger request is answered 413 (as the
Collector's ``max_request_body_size``), over gRPC the server's own receive limit refuses it
with ``RESOURCE_EXHAUSTED``. Every request is noted in :attr:`_Base.log` (time, size,
verdict), accepted or not, so a test can see how the exporter paced and split its requests.
"""

from __future__ import annotations

import gzip
import sys
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsPartialSuccess,
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

P = "azure.scheduled_event."
#: A request header (gRPC metadata key) a test sets per exporter process to tell who sent what.
SENDER_HEADER = "x-test-sender"

@dataclass(frozen=True)
class Reply:
    """A scripted answer. ``status``: HTTP code or gRPC status name (``None``: accept)."""

    status: int | str | None = None
    #: HTTP headers to send with a refusal (``Retry-After``, ``Location``).
    headers: tuple[tuple[str, str], ...] = ()
    #: gRPC: a ``google.rpc.RetryInfo`` with this delay in the status details.
    retry_info: float | None = None
    #: Accepted with an OTLP partial success: (rejected log records, error message).
    partial: tuple[int, str] | None = None
    #: HTTP: the answer's body exactly as sent (accepted or refused), instead of the one made
    #: from the fields above.
    body: bytes | None = None
    #: The answer compressed: HTTP ``Content-Encoding: gzip``; gRPC, the response message
    #: compressed with gzip (whatever the request was).
    gzip: bool = False
    #: What a refusal says: the HTTP body's text (unless ``body``), the gRPC status message
    #: (``None``: "refused by the stand-in", "refused").
    message: str | None = None
    #: gRPC: trailing metadata sent with an accepted request's answer.
    trailers: tuple[tuple[str, str], ...] = ()


#: Given the EventIds of a request, the refusal to answer with (``None``: accept).
Answer = Callable[[list[str]], "int | str | Reply | None"]
#: The answer to a metrics request, made when it arrives (``None``: accept).
MetricsAnswer = Callable[[], "int | str | Reply | None"]


@dataclass(frozen=True)
class MetricsRequest:
    """One metrics request as it arrived, accepted or not."""

    arrival: float
    request: ExportMetricsServiceRequest
    #: The answer's status (``None``: accepted), and the ``Retry-After``/``RetryInfo`` it asked.
    verdict: int | str | None
    retry_after: str = ""


@dataclass(frozen=True)
class Request:
    """One logs request as it arrived."""

    arrival: float
    #: Serialized size (before any compression), and log records held.
    size: int
    records: int
    #: The answer's status (``None``: accepted).
    verdict: int | str | None


@dataclass(frozen=True)
class Accepted:
    """One log record the stand-in accepted."""

    event_id: str
    transition: str
    uid: str
    arrival: float
    #: The log record as serialized protobuf (time, severity, body, attributes, event name).
    content: bytes = b""
    #: Which accepted request it came in (1, 2, ...), and the request's SENDER_HEADER value.
    request: int = 0
    sender: str = ""


def _records(request: ExportLogsServiceRequest) -> list[tuple[str, str, str, bytes]]:
    """(EventId, transition, log.record.uid, serialized record) of every log record in the
    request."""
    out = []
    for resource_logs in request.resource_logs:
        for scope_logs in resource_logs.scope_logs:
            for record in scope_logs.log_records:
                attrs = {a.key: a.value.string_value for a in record.attributes}
                out.append((attrs.get(P + "id", ""), record.event_name.rsplit(".", 1)[-1],
                            attrs.get("log.record.uid", ""),
                            record.SerializeToString(deterministic=True)))
    return out


def status_details(code: int, message: str, retry_delay: float) -> bytes:
    """A ``google.rpc.Status`` with a ``RetryInfo`` (googleapis-common-protos' own classes),
    as a server puts it in the ``grpc-status-details-bin`` trailer or an OTLP/HTTP body."""
    from google.protobuf import any_pb2, duration_pb2
    from google.rpc import error_details_pb2, status_pb2

    detail = any_pb2.Any()
    seconds = int(retry_delay)
    detail.Pack(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(
        seconds=seconds, nanos=round((retry_delay - seconds) * 1e9))))
    return status_pb2.Status(code=code, message=message, details=[detail]).SerializeToString()


class _Base:
    def __init__(self, answer: Answer | None = None, max_bytes: int | None = None,
                 metrics_answer: MetricsAnswer | None = None) -> None:
        self.answer: Answer = answer or (lambda ids: None)
        self.metrics_answer: MetricsAnswer = metrics_answer or (lambda: None)
        #: Every metrics request, in arrival order.
        self.metrics: list[MetricsRequest] = []
        self.max_bytes = max_bytes
        self._cond = threading.Condition()
        self.accepted: list[Accepted] = []
        self.refused: list[tuple[Any, list[str]]] = []
        self.requests = 0
        self.log: list[Request] = []

    def _handle(self, body: bytes, sender: str = "") -> Reply:
        request = ExportLogsServiceRequest()
        request.ParseFromString(body)
        records = _records(request)
        verdict = self.answer([r[0] for r in records])
        reply = verdict if isinstance(verdict, Reply) else Reply(verdict)
        self._note(reply.status, len(body), records, sender)
        return reply

    def _handle_metrics(self, body: bytes) -> Reply:
        request = ExportMetricsServiceRequest()
        request.ParseFromString(body)
        verdict = self.metrics_answer()
        reply = verdict if isinstance(verdict, Reply) else Reply(verdict)
        asked = next((v for k, v in reply.headers if k.lower() == "retry-after"), "")
        if reply.retry_info is not None:
            asked = str(reply.retry_info)
        with self._cond:
            self.metrics.append(MetricsRequest(time.monotonic(), request, reply.status, asked))
            self._cond.notify_all()
        return reply

    def wait_metrics(self, predicate: Callable[[list[MetricsRequest]], bool], timeout: float,
                     what: str) -> list[MetricsRequest]:
        """Wait until ``predicate(metrics requests)`` holds; fail naming ``what``."""
        with self._cond:
            if not self._cond.wait_for(lambda: predicate(self.metrics), timeout):
                raise AssertionError(f"timed out after {timeout} s waiting for {what}; metrics "
                                     f"requests: {[(m.arrival, m.verdict) for m in self.metrics]}")
            return list(self.metrics)

    def _note(self, status: int | str | None, size: int,
              records: list[tuple[str, str, str, bytes]], sender: str = "") -> None:
        now = time.monotonic()
        with self._cond:
            self.requests += 1
            self.log.append(Request(now, size, len(records), status))
            if status is None:
                self.accepted.extend(Accepted(e, t, u, now, c, self.requests, sender)
                                     for e, t, u, c in records)
            else:
                self.refused.append((status, [r[0] for r in records]))
            self._cond.notify_all()

    def wait_requests(self, predicate: Callable[[list[Request]], bool], timeout: float,
                      what: str) -> list[Request]:
        """Wait until ``predicate(log)`` holds; fail naming ``what``."""
        with self._cond:
            if not self._cond.wait_for(lambda: predicate(self.log), timeout):
                raise AssertionError(f"timed out after {timeout} s waiting for {what}; "
                                     f"requests: {self.log}")
            return list(self.log)

    def wait_for(self, predicate: Callable[[list[Accepted]], bool], timeout: float,
                 what: str) -> list[Accepted]:
        """Wait until ``predicate(accepted)`` holds; fail naming ``what``."""
        with self._cond:
            if not self._cond.wait_for(lambda: predicate(self.accepted), timeout):
                raise AssertionError(f"timed out after {timeout} s waiting for {what}; accepted: "
                                     f"{[(a.event_id, a.transition) for a in self.accepted]}")
            return list(self.accepted)

    def wait_until(self, predicate: Callable[[list[Accepted]], bool], timeout: float) -> bool:
        """Wait until ``predicate(accepted)`` holds; False once ``timeout`` has passed."""
        with self._cond:
            return self._cond.wait_for(lambda: predicate(self.accepted), max(timeout, 0.0))


class OtlpHttpStandIn(_Base):
    """OTLP/HTTP receiver on 127.0.0.1 (free port); a context manager."""

    def __init__(self, answer: Answer | None = None, max_bytes: int | None = None,
                 metrics_answer: MetricsAnswer | None = None) -> None:
        super().__init__(answer, max_bytes, metrics_answer)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            disable_nagle_algorithm = True
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                if outer.max_bytes is not None and length > outer.max_bytes:
                    # Refused before reading, as the Collector's max_request_body_size does
                    # (the body is read anyway, to keep the connection usable).
                    self.rfile.read(length)
                    outer._note(413, length, [])
                    self._reply(413, b"request body too large")
                    return
                body = self.rfile.read(length)
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path == "/v1/logs":
                    reply = outer._handle(body, self.headers.get(SENDER_HEADER, ""))
                    if reply.status is not None:
                        self._reply(int(reply.status),
                                    (reply.message or "refused by the stand-in").encode(),
                                    reply.headers,
                                    reply)
                        return
                    rejected, message = reply.partial or (0, "")
                    self._reply(200, ExportLogsServiceResponse(
                        partial_success=ExportLogsPartialSuccess(
                            rejected_log_records=rejected, error_message=message),
                    ).SerializeToString(), reply.headers, reply)
                elif self.path == "/v1/metrics":
                    reply = outer._handle_metrics(body)
                    if reply.status is not None:
                        self._reply(int(reply.status), b"refused by the stand-in",
                                    reply.headers)
                        return
                    self._reply(200, ExportMetricsServiceResponse().SerializeToString())
                else:
                    self._reply(404, b"not found")

            def _reply(self, status: int, data: bytes,
                       headers: tuple[tuple[str, str], ...] = (),
                       reply: Reply | None = None) -> None:
                if reply is not None and reply.body is not None:
                    data = reply.body
                if reply is not None and reply.gzip:
                    data = gzip.compress(data)
                    headers = (*headers, ("Content-Encoding", "gzip"))
                if any(key.lower() == "date" for key, _ in headers):
                    # A scripted Date (a server whose clock differs from ours) replaces the
                    # one send_response would add.
                    self.log_request(status)
                    self.send_response_only(status)
                    self.send_header("Server", self.version_string())
                else:
                    self.send_response(status)
                for key, value in headers:
                    self.send_header(key, value)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                pass

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                # A client that closes a kept-alive connection (the exporter stopping, or
                # leaving a connection whose answer it did not read to the end) is no error.
                if not isinstance(sys.exc_info()[1], ConnectionError):
                    super().handle_error(request, client_address)

        self._server = Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> OtlpHttpStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


class OtlpGrpcStandIn(_Base):
    """OTLP/gRPC receiver on 127.0.0.1 (free port); a context manager."""

    def __init__(self, answer: Answer | None = None, max_bytes: int | None = None,
                 address: str = "127.0.0.1:0",
                 metrics_answer: MetricsAnswer | None = None) -> None:
        """``address``: where to listen, a free loopback port unless a ``unix:`` path is given
        (then :attr:`endpoint` is that ``unix:`` target)."""
        super().__init__(answer, max_bytes, metrics_answer)
        import grpc
        from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc

        outer = self

        def refuse(reply: Reply, context: Any) -> None:
            if reply.status is not None:
                code = getattr(grpc.StatusCode, str(reply.status))
                if reply.retry_info is not None:
                    context.set_trailing_metadata(((
                        "grpc-status-details-bin",
                        status_details(code.value[0], "refused", reply.retry_info)),))
                context.abort(code, "refused" if reply.message is None else reply.message)
            if reply.gzip:
                context.set_compression(grpc.Compression.Gzip)
            if reply.trailers:
                context.set_trailing_metadata(reply.trailers)

        class Logs(logs_service_pb2_grpc.LogsServiceServicer):  # type: ignore[misc]
            def Export(self, request: Any, context: Any) -> Any:
                sender = dict(context.invocation_metadata()).get(SENDER_HEADER, "")
                reply = outer._handle(request.SerializeToString(), sender)
                refuse(reply, context)
                rejected, message = reply.partial or (0, "")
                return ExportLogsServiceResponse(partial_success=ExportLogsPartialSuccess(
                    rejected_log_records=rejected, error_message=message))

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):  # type: ignore[misc]
            def Export(self, request: Any, context: Any) -> Any:
                refuse(outer._handle_metrics(request.SerializeToString()), context)
                return ExportMetricsServiceResponse()

        # A size limit is gRPC's own: a larger request never reaches Export (not in the log).
        options = [] if max_bytes is None else [("grpc.max_receive_message_length", max_bytes)]
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=options)
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(Logs(), self._server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), self._server)
        port = self._server.add_insecure_port(address)
        self.endpoint = address if address.startswith("unix") else f"http://127.0.0.1:{port}"

    def __enter__(self) -> OtlpGrpcStandIn:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(grace=None)
