"""Small OTLP receivers on loopback whose answers a test controls (rotel always says yes).

* :class:`OtlpHttpStandIn`: OTLP/HTTP (protobuf) on ``/v1/logs`` and ``/v1/metrics``.
* :class:`OtlpGrpcStandIn`: the OTLP ``LogsService`` and ``MetricsService`` over gRPC.

Both decode each logs request with the real OTLP protobuf classes, answer according to
:meth:`answer` (a callable given the EventIds in the request: ``None`` accepts, an HTTP status
or a gRPC status name refuses), and keep every *accepted* log record, in arrival order, with its
serialized content, the request it came in and the sender the request named in the
:data:`SENDER_HEADER` header (``OTEL_EXPORTER_OTLP_LOGS_HEADERS`` of the exporter sets it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)

P = "azure.scheduled_event."
#: A request header (gRPC metadata key) a test sets per exporter process to tell who sent what.
SENDER_HEADER = "x-test-sender"

#: Given the EventIds of a request, the refusal to answer with (``None``: accept).
Answer = Callable[[list[str]], "int | str | None"]


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


class _Base:
    def __init__(self, answer: Answer | None = None) -> None:
        self.answer: Answer = answer or (lambda ids: None)
        self._cond = threading.Condition()
        self.accepted: list[Accepted] = []
        self.refused: list[tuple[Any, list[str]]] = []
        self.requests = 0

    def _handle(self, body: bytes, sender: str = "") -> int | str | None:
        request = ExportLogsServiceRequest()
        request.ParseFromString(body)
        records = _records(request)
        verdict = self.answer([r[0] for r in records])
        now = time.monotonic()
        with self._cond:
            self.requests += 1
            if verdict is None:
                self.accepted.extend(Accepted(e, t, u, now, c, self.requests, sender)
                                     for e, t, u, c in records)
            else:
                self.refused.append((verdict, [r[0] for r in records]))
            self._cond.notify_all()
        return verdict

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

    def __init__(self, answer: Answer | None = None) -> None:
        super().__init__(answer)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            disable_nagle_algorithm = True
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path == "/v1/logs":
                    verdict = outer._handle(body, self.headers.get(SENDER_HEADER, ""))
                    if verdict is not None:
                        self._reply(int(verdict), b"refused by the stand-in")
                        return
                    self._reply(200, ExportLogsServiceResponse().SerializeToString())
                elif self.path == "/v1/metrics":
                    self._reply(200, ExportMetricsServiceResponse().SerializeToString())
                else:
                    self._reply(404, b"not found")

            def _reply(self, status: int, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
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

    def __init__(self, answer: Answer | None = None) -> None:
        super().__init__(answer)
        import grpc
        from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc

        outer = self

        class Logs(logs_service_pb2_grpc.LogsServiceServicer):  # type: ignore[misc]
            def Export(self, request: Any, context: Any) -> Any:
                sender = dict(context.invocation_metadata()).get(SENDER_HEADER, "")
                verdict = outer._handle(request.SerializeToString(), sender)
                if verdict is not None:
                    context.abort(getattr(grpc.StatusCode, str(verdict)), "refused")
                return ExportLogsServiceResponse()

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):  # type: ignore[misc]
            def Export(self, request: Any, context: Any) -> Any:
                return ExportMetricsServiceResponse()

        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(Logs(), self._server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"http://127.0.0.1:{port}"

    def __enter__(self) -> OtlpGrpcStandIn:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(grace=None)
