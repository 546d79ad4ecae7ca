"""One OTLP request, sent once over a real socket, and the answer read back (sinks/
otlp_transport.py, sinks/grpc_channel.py), against local servers whose answers the test sets:
what goes on the wire (path, protobuf, gzip, headers, user agent), what comes back (partial
success, an error status and the collector's words, Retry-After, no answer at all), TLS with a
given CA, a proxy from the environment, and gRPC with its metadata and status names.
"""

from __future__ import annotations

import datetime
import gzip
import ipaddress
import re
import ssl
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsPartialSuccess,
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)

from scheduled_events_exporter.otlp_settings import OtlpTarget
from scheduled_events_exporter.sinks.grpc_channel import (
    GrpcTransport,
    own_metadata_limit,
    own_receive_limit,
)
from scheduled_events_exporter.sinks.otlp_transport import (
    MAX_ERROR_BYTES,
    MAX_REQUEST_BYTES,
    MAX_RESPONSE_BYTES,
    REQUEST_TOO_LARGE,
    HttpTransport,
    Limits,
    rpc_status,
    status_message,
)
from tests.exporter_process import free_port

REQUEST = ExportLogsServiceRequest()
REQUEST.resource_logs.add().scope_logs.add().log_records.add(event_name="e")


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Server:
    """An HTTP server answering each POST with the next of ``replies``."""

    port: int
    replies: list[tuple[int, dict[str, str], bytes]] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)


def serve(tls: ssl.SSLContext | None = None) -> Iterator[Server]:
    server = Server(free_port())

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            server.seen.append(Seen(self.path, {k.lower(): v for k, v in self.headers.items()},
                                    body))
            status, headers, data = server.replies.pop(0) if server.replies else (200, {}, b"")
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", server.port), Handler)
    if tls is not None:
        httpd.socket = tls.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def http() -> Iterator[Server]:
    yield from serve()


def target(endpoint: str, **kwargs: Any) -> OtlpTarget:
    return OtlpTarget("logs", endpoint=endpoint, timeout=5.0, **kwargs)


def partial(rejected: int, message: str) -> bytes:
    return ExportLogsServiceResponse(partial_success=ExportLogsPartialSuccess(
        rejected_log_records=rejected, error_message=message)).SerializeToString()


def test_http_sends_the_protobuf_gzipped_with_the_headers_and_reads_partial_success(
        http: Server) -> None:
    http.replies.append((200, {"Content-Type": "application/x-protobuf"},
                         partial(2, "2 records too old")))
    transport = HttpTransport(target(f"http://127.0.0.1:{http.port}/v1/logs", gzip=True,
                                     headers=(("api-key", "k1"), ("x-tenant", "t"))))
    answer = transport.send(REQUEST, 5)
    transport.close()
    assert (answer.ok, answer.status, answer.rejected, answer.detail) == (
        True, 200, 2, "2 records too old")
    (seen,) = http.seen
    assert seen.path == "/v1/logs"
    assert seen.headers["content-type"] == "application/x-protobuf"
    assert seen.headers["content-encoding"] == "gzip"
    assert (seen.headers["api-key"], seen.headers["x-tenant"]) == ("k1", "t")
    assert re.fullmatch(r"azure-scheduled-events-exporter/\S+ Python/3\.\d+",
                        seen.headers["user-agent"]), seen.headers["user-agent"]
    received = ExportLogsServiceRequest()
    received.ParseFromString(gzip.decompress(seen.body))
    assert received == REQUEST


@pytest.mark.parametrize(("reply", "status", "detail", "retry_after"), [
    ((503, {"Retry-After": "7"}, b""), 503, "", 7.0),
    # As the peer said it: the delivery worker alone caps it (delivery.RETRY_AFTER_CAP).
    ((429, {"Retry-After": "3600"}, b""), 429, "", 3600.0),
    ((429, {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, b""), 429, "", 0.0),  # past: now
    ((503, {"Retry-After": "soon"}, b""), 503, "", None),
    # A google.rpc.Status: code 3, message "log record too large".
    ((400, {"Content-Type": "application/x-protobuf"},
      b"\x08\x03\x12\x14log record too large"), 400, "log record too large", None),
    ((413, {"Content-Type": "text/plain"}, b"request\n  too big"), 413, "request too big", None),
    ((401, {"Content-Type": "application/x-protobuf"}, b"\x12\xff"), 401, "", None),
])
def test_http_reads_the_status_the_collectors_words_and_retry_after(
        http: Server, reply: tuple[int, dict[str, str], bytes], status: int, detail: str,
        retry_after: float | None) -> None:
    http.replies.append(reply)
    answer = HttpTransport(target(f"http://127.0.0.1:{http.port}/v1/logs")).send(REQUEST, 5)
    assert (answer.ok, answer.status, answer.detail, answer.retry_after) == (
        False, status, detail, retry_after)
    assert len(http.seen) == 1, "sent once: retrying is the caller's"


def test_http_without_a_collector_says_so_without_raising() -> None:
    answer = HttpTransport(target(f"http://127.0.0.1:{free_port()}/v1/logs")).send(REQUEST, 2)
    assert (answer.ok, answer.status) == (False, None)
    assert answer.detail == "Connection refused"


def test_status_message_of_a_malformed_or_foreign_body_is_empty_or_text() -> None:
    assert status_message(b"\x08", "application/x-protobuf") == ""
    assert status_message(b"\x12\x50abc", "application/x-protobuf") == ""  # cut short
    assert status_message(b'{"message": "no"}', "application/json") == '{"message": "no"}'


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 it signed: (ca.pem, cert.pem, key.pem)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(1)
          .not_valid_before(now - datetime.timedelta(minutes=1))
          .not_valid_after(now + datetime.timedelta(hours=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(2)
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = tmp_path / "ca.pem", tmp_path / "cert.pem", tmp_path / "key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


def test_https_trusts_the_given_ca_and_refuses_an_unknown_one(
        tls_files: tuple[Path, Path, Path]) -> None:
    ca, cert, key = tls_files
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    for server in serve(context):
        url = f"https://127.0.0.1:{server.port}/v1/logs"
        trusted = HttpTransport(target(url, certificate=str(ca))).send(REQUEST, 5)
        assert (trusted.ok, trusted.status) == (True, 200)
        unknown = HttpTransport(target(url)).send(REQUEST, 5)  # certifi's bundle only
        assert (unknown.ok, unknown.status) == (False, None)
        assert "CERTIFICATE_VERIFY_FAILED" in unknown.detail
        assert len(server.seen) == 1


def test_http_goes_through_the_proxy_the_environment_names_unless_no_proxy(
        http: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{http.port}")
    monkeypatch.setenv("NO_PROXY", "bypassed.example")
    answer = HttpTransport(target("http://collector.example:4318/v1/logs")).send(REQUEST, 5)
    assert answer.ok
    assert http.seen[-1].path == "http://collector.example:4318/v1/logs"  # the proxy's form
    bypassed = HttpTransport(target("http://bypassed.example:1/v1/logs")).send(REQUEST, 2)
    assert (bypassed.ok, bypassed.status) == (False, None)  # straight to it: no such host
    assert len(http.seen) == 1


# --- gRPC --------------------------------------------------------------------------------------

@dataclass
class GrpcCalls:
    port: int
    #: A status name to refuse with, or (name, RetryInfo delay) to send a RetryInfo too.
    replies: list[str | tuple[str, float] | None] = field(default_factory=list)
    metadata: list[dict[str, str]] = field(default_factory=list)
    #: The partial-success message of an accepted request.
    message: str = "one too old"
    #: What a refusal says (its status message).
    refusal: str = "told to refuse"
    #: An accepted request's answer compressed with gzip (whatever the request was), and the
    #: trailing metadata sent with it.
    gzip_answer: bool = False
    trailers: tuple[tuple[str, str], ...] = ()


def grpc_serve(address: str, options: tuple[tuple[str, int], ...] = ()) -> Iterator[GrpcCalls]:
    calls = GrpcCalls(0)

    class Logs(logs_service_pb2_grpc.LogsServiceServicer):  # type: ignore[misc]
        def Export(self, request: Any, context: Any) -> Any:
            calls.metadata.append(dict(context.invocation_metadata()))
            verdict = calls.replies.pop(0) if calls.replies else None
            if isinstance(verdict, tuple):  # the status details trailer, as grpcio-status sends
                code = getattr(grpc.StatusCode, verdict[0])
                context.set_trailing_metadata((("grpc-status-details-bin",
                                                status_with_retry_info(code.value[0], "throttled",
                                                                       verdict[1])),))
                context.abort(code, "throttled" if calls.refusal == "told to refuse"
                              else calls.refusal)
            if verdict is not None:
                context.abort(getattr(grpc.StatusCode, verdict), calls.refusal)
            if calls.gzip_answer:
                context.set_compression(grpc.Compression.Gzip)
            if calls.trailers:
                context.set_trailing_metadata(calls.trailers)
            return ExportLogsServiceResponse(partial_success=ExportLogsPartialSuccess(
                rejected_log_records=1, error_message=calls.message))

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), options=options)
    logs_service_pb2_grpc.add_LogsServiceServicer_to_server(Logs(), server)
    calls.port = server.add_insecure_port(address)
    server.start()
    try:
        yield calls
    finally:
        server.stop(0)


@pytest.fixture
def grpc_server() -> Iterator[GrpcCalls]:
    yield from grpc_serve(f"127.0.0.1:{free_port()}")


def test_grpc_sends_once_with_metadata_and_reads_status_names(grpc_server: GrpcCalls) -> None:
    grpc_server.replies.extend(["INVALID_ARGUMENT", "UNAVAILABLE", None])
    transport = GrpcTransport(target(f"http://127.0.0.1:{grpc_server.port}",
                                     headers=(("api-key", "k1"),), gzip=True))
    try:
        refused = transport.send(REQUEST, 5)
        assert (refused.ok, refused.status, refused.detail) == (
            False, "INVALID_ARGUMENT", "told to refuse")
        unavailable = transport.send(REQUEST, 5)  # the channel is discarded after this
        assert (unavailable.ok, unavailable.status) == (False, "UNAVAILABLE")
        accepted = transport.send(REQUEST, 5)
        assert (accepted.ok, accepted.status, accepted.rejected, accepted.detail) == (
            True, "OK", 1, "one too old")
    finally:
        transport.close()
    assert len(grpc_server.metadata) == 3, "each sent once"
    assert all(m["api-key"] == "k1" for m in grpc_server.metadata)
    assert all(m["user-agent"].startswith("azure-scheduled-events-exporter/")
               for m in grpc_server.metadata)


def test_grpc_without_a_collector_is_unavailable_and_after_close_sends_nothing() -> None:
    transport = GrpcTransport(target(f"http://127.0.0.1:{free_port()}"))
    answer = transport.send(REQUEST, 2)
    assert (answer.ok, answer.status) == (False, "UNAVAILABLE")
    transport.close()
    after = transport.send(REQUEST, 2)
    assert (after.ok, after.status) == (False, None)


# --- Throttling, redirects, bounds (OTLP specification: "OTLP/HTTP Throttling", "OTLP/gRPC
# Throttling"; docs/otlp-conformance.md) -------------------------------------------------------

def status_with_retry_info(code: int, message: str, delay: float) -> bytes:
    """A google.rpc.Status carrying a RetryInfo, built with googleapis-common-protos (the
    protos' own classes, independent of the exporter's reader)."""
    from google.protobuf import any_pb2, duration_pb2
    from google.rpc import error_details_pb2, status_pb2

    detail = any_pb2.Any()
    seconds = int(delay)
    detail.Pack(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(
        seconds=seconds, nanos=round((delay - seconds) * 1e9))))
    return status_pb2.Status(code=code, message=message, details=[detail]).SerializeToString()


def test_rpc_status_reads_the_message_and_retry_info_as_googleapis_encodes_them() -> None:
    pytest.importorskip("google.rpc.status_pb2")
    assert rpc_status(status_with_retry_info(8, "slow down", 8.25)) == ("slow down", 8.25)
    from google.rpc import status_pb2

    plain = status_pb2.Status(code=8, message="too big").SerializeToString()
    assert rpc_status(plain) == ("too big", None)
    assert rpc_status(b"\xff\xff") == ("", None)


def test_http_reads_retry_info_from_a_status_body_without_retry_after(http: Server) -> None:
    pytest.importorskip("google.rpc.status_pb2")
    http.replies.append((503, {"Content-Type": "application/x-protobuf"},
                         status_with_retry_info(14, "busy", 3.0)))
    answer = HttpTransport(target(f"http://127.0.0.1:{http.port}/v1/logs")).send(REQUEST, 5)
    assert (answer.status, answer.detail, answer.retry_after) == (503, "busy", 3.0)


def test_http_redirect_is_not_followed_and_its_location_is_kept(http: Server) -> None:
    http.replies.append((308, {"Location": "https://elsewhere.example/v1/logs"}, b""))
    answer = HttpTransport(target(f"http://127.0.0.1:{http.port}/v1/logs")).send(REQUEST, 5)
    assert (answer.ok, answer.status, answer.location) == (
        False, 308, "https://elsewhere.example/v1/logs")
    assert len(http.seen) == 1, "not followed"


def test_http_reads_a_response_body_only_up_to_the_bound(http: Server) -> None:
    huge = b"x" * (4 * MAX_ERROR_BYTES)
    http.replies.extend([(503, {"Content-Type": "text/plain"}, huge),
                         (200, {"Content-Type": "application/x-protobuf"}, partial(0, "ok"))])
    transport = HttpTransport(target(f"http://127.0.0.1:{http.port}/v1/logs"))
    first = transport.send(REQUEST, 5)
    # An error body is read to its bound (and said to have been cut), shown in 200 characters.
    assert (first.status, first.detail) == (
        503, "x" * 200 + f"... ({MAX_ERROR_BYTES} characters) (a body larger than "
        f"{MAX_ERROR_BYTES} bytes; the rest was not read)")
    second = transport.send(REQUEST, 5)  # the connection left mid-body is not reused
    assert (second.ok, second.detail) == (True, "ok")
    transport.close()


@pytest.mark.parametrize("status", ["UNAVAILABLE", "RESOURCE_EXHAUSTED", "ABORTED",
                                    "DEADLINE_EXCEEDED", "CANCELLED", "OUT_OF_RANGE",
                                    "DATA_LOSS"])
def test_grpc_reads_retry_info_from_the_status_details_of_any_code(
        grpc_server: GrpcCalls, status: str) -> None:
    pytest.importorskip("google.rpc.status_pb2")
    grpc_server.replies.append((status, 8.5))
    transport = GrpcTransport(target(f"http://127.0.0.1:{grpc_server.port}"))
    try:
        answer = transport.send(REQUEST, 5)
    finally:
        transport.close()
    assert (answer.ok, answer.status, answer.retry_after) == (False, status, 8.5)


def test_grpc_message_larger_than_the_server_takes_is_resource_exhausted_without_retry_info(
) -> None:
    big = ExportLogsServiceRequest()
    big.resource_logs.add().scope_logs.add().log_records.add(event_name="e" * 4096)
    for calls in grpc_serve(f"127.0.0.1:{free_port()}",
                            (("grpc.max_receive_message_length", 1024),)):
        transport = GrpcTransport(target(f"http://127.0.0.1:{calls.port}"))
        try:
            answer = transport.send(big, 5)
        finally:
            transport.close()
        assert (answer.ok, answer.status, answer.retry_after) == (
            False, "RESOURCE_EXHAUSTED", None)
        assert calls.metadata == [], "refused by gRPC before the service saw it"


@pytest.mark.skipif(sys.platform == "win32", reason="unix sockets: the Linux suite")
@pytest.mark.parametrize("form", ["unix:{path}", "unix://{path}", "dns:///127.0.0.1:{port}",
                                  "127.0.0.1:{port}"])
def test_grpc_takes_every_target_form_the_grpc_client_does(tmp_path: Path, form: str) -> None:
    path = tmp_path / "otlp.sock"
    address = f"unix:{path}" if form.startswith("unix") else f"127.0.0.1:{free_port()}"
    for calls in grpc_serve(address):
        endpoint = form.format(path=path, port=calls.port)
        transport = GrpcTransport(OtlpTarget("logs", protocol="grpc", endpoint=endpoint,
                                             timeout=5.0))
        try:
            answer = transport.send(REQUEST, 5)
        finally:
            transport.close()
        assert (answer.ok, answer.status) == (True, "OK"), (endpoint, answer)


def test_http_a_success_too_large_to_read_is_still_a_success_and_says_so(http: Server) -> None:
    http.replies.append((200, {"Content-Type": "application/x-protobuf"},
                         b"\x0a" + b"x" * (2 * MAX_RESPONSE_BYTES)))
    answer = HttpTransport(target(f"http://127.0.0.1:{http.port}/v1/logs")).send(REQUEST, 5)
    assert (answer.ok, answer.rejected, answer.unread) == (True, 0, True)
    assert answer.detail == (f"the response was larger than {MAX_RESPONSE_BYTES} bytes "
                             "and was discarded unread")


def long_words(size: int) -> str:
    return ("one line per dropped attribute, as a verbose collector writes it; " * size)[:size]


def test_http_a_long_partial_success_is_read_and_its_words_are_bounded(http: Server) -> None:
    # 100 kB: over the 64 KiB the transport once read, within the answer bound: the count in it
    # is read, and the message is cut for the log.
    http.replies.append((200, {"Content-Type": "application/x-protobuf"},
                         partial(3, long_words(100_000))))
    answer = HttpTransport(target(f"http://127.0.0.1:{http.port}/v1/logs")).send(REQUEST, 5)
    assert (answer.ok, answer.rejected) == (True, 3)
    assert answer.detail.startswith("one line per dropped attribute")
    assert answer.detail.endswith("... (100000 characters)") and len(answer.detail) < 300


def test_grpc_a_long_partial_success_is_read_and_its_words_are_bounded(
        grpc_server: GrpcCalls) -> None:
    # 100 kB: over the 64 KiB receive limit gRPC once had here, which failed the accepted call.
    grpc_server.message = long_words(100_000)
    transport = GrpcTransport(target(f"http://127.0.0.1:{grpc_server.port}"))
    try:
        answer = transport.send(REQUEST, 5)
    finally:
        transport.close()
    assert (answer.ok, answer.status, answer.rejected) == (True, "OK", 1)
    assert answer.detail.endswith("... (100000 characters)") and len(answer.detail) < 300
    assert len(grpc_server.metadata) == 1


def test_grpc_an_answer_over_our_receive_limit_is_an_accepted_request(
        grpc_server: GrpcCalls) -> None:
    # Over even the 4 MiB bound: gRPC fails the call on our side with RESOURCE_EXHAUSTED after
    # the collector answered OK. Accepted (resending would duplicate), said as a warning.
    grpc_server.message = long_words(MAX_RESPONSE_BYTES + 1000)
    transport = GrpcTransport(target(f"http://127.0.0.1:{grpc_server.port}", gzip=True))
    try:
        answer = transport.send(REQUEST, 5)
        again = transport.send(REQUEST, 5)  # the channel still works
    finally:
        transport.close()
    assert (answer.ok, answer.status, answer.rejected, answer.retry_after, answer.unread) == (
        True, "OK", 0, None, True)
    assert answer.detail == (f"the response was larger than {MAX_RESPONSE_BYTES} bytes and was "
                             "discarded unread")
    assert again.ok and len(grpc_server.metadata) == 2


@pytest.mark.parametrize(("details", "request_size", "ours"), [
    # grpcio today names the side.
    ("Stream removed (CLIENT: Received message larger than max (5006 vs. 4194304))", 10, True),
    ("CLIENT: Received message larger than max (5006 vs. 4194304)", 5 << 20, True),
    ("SERVER: Received message larger than max (5006 vs. 4194304)", 10, False),
    # Older grpcio does not: ours only if no server with our limit could have refused it.
    ("Received message larger than max (5006 vs. 4194304)", 4194304, True),
    ("Received message larger than max (5000000 vs. 4194304)", 5000000, False),
    # Another limit than ours, another failure, nothing at all.
    ("CLIENT: Received message larger than max (5006 vs. 65536)", 10, False),
    ("quota exceeded", 10, False),
    ("", 10, False),
])
def test_own_receive_limit_is_told_only_on_proof(details: str, request_size: int,
                                                 ours: bool) -> None:
    assert own_receive_limit(details, request_size, 4194304) is ours
    assert own_receive_limit(details, request_size, 4194304, compressed=True) is ours


@pytest.mark.parametrize(("details", "compressed", "ours"), [
    # grpcio 1.85 names neither side nor number for a message over the limit once
    # decompressed; a server says the same of a gzipped request over its own limit.
    ("Decompressed message larger than max", False, True),
    ("Stream removed (Decompressed message larger than max)", False, True),
    ("Decompressed message larger than max", True, False),
    # A release that names the side is believed.
    ("CLIENT: Decompressed message larger than max", True, True),
    ("SERVER: Decompressed message larger than max", False, False),
])
def test_a_decompressed_answer_over_the_limit_is_ours_only_when_the_request_was_not_gzipped(
        details: str, compressed: bool, ours: bool) -> None:
    assert own_receive_limit(details, 10, 4194304, compressed=compressed) is ours


@pytest.mark.parametrize(("details", "ours"), [
    ("Stream removed (received metadata size exceeds hard limit (value length 5000000 vs. "
     "4194304))", True),
    # A server refusing our metadata (no "Stream removed"), or another limit than ours.
    ("received metadata size exceeds hard limit (value length 100000 vs. 16384)", False),
    ("Stream removed (received metadata size exceeds hard limit (value length 100000 vs. "
     "16384))", False),
    ("Stream removed (CLIENT: Received message larger than max (5006 vs. 4194304))", False),
    ("", False),
])
def test_own_metadata_limit_is_told_only_on_proof(details: str, ours: bool) -> None:
    assert own_metadata_limit(details, 4194304) is ours


def test_http_an_error_answer_names_the_url_posted_to_without_userinfo_or_query(
        http: Server) -> None:
    http.replies.append((404, {}, b"404 page not found"))
    endpoint = f"http://u:secret@127.0.0.1:{http.port}/v1/logs/v1/logs?token=t&x=1#frag"
    answer = HttpTransport(target(endpoint)).send(REQUEST, 5)
    assert (answer.status, answer.sent_to) == (
        404, f"POST http://127.0.0.1:{http.port}/v1/logs/v1/logs")
    assert http.seen[0].path == "/v1/logs/v1/logs?token=t&x=1", "sent as configured"


def test_grpc_an_unimplemented_answer_names_the_method_and_the_target() -> None:
    # A gRPC server without the OTLP services (another gRPC service on that port).
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        for signal, service in (("logs", "logs.v1.LogsService"),
                                ("metrics", "metrics.v1.MetricsService")):
            transport = GrpcTransport(OtlpTarget(signal, protocol="grpc", timeout=5.0,
                                                 endpoint=f"http://127.0.0.1:{port}"))
            try:
                answer = transport.send(REQUEST, 5)
            finally:
                transport.close()
            assert (answer.status, answer.sent_to) == (
                "UNIMPLEMENTED",
                f"/opentelemetry.proto.collector.{service}/Export at 127.0.0.1:{port}")
    finally:
        server.stop(0)
    # A URL's userinfo never reaches what an error says was tried.
    transport = GrpcTransport(OtlpTarget("logs", protocol="grpc", timeout=2.0,
                                         endpoint=f"http://u:secret@127.0.0.1:{port}"))
    try:
        answer = transport.send(REQUEST, 2)
    finally:
        transport.close()
    assert not answer.ok and "secret" not in answer.sent_to, answer


# --- Sizes (OTLP 1.11.0, "OTLP/HTTP Request", "OTLP/HTTP Response", "OTLP/gRPC Request",
# "OTLP/gRPC Response"; docs/otlp-conformance.md, "Request and response size") ---------------

def padded(size: int) -> ExportLogsServiceRequest:
    """A logs request of one record whose serialized size is at least ``size`` (compresses
    to almost nothing)."""
    request = ExportLogsServiceRequest()
    request.resource_logs.add().scope_logs.add().log_records.add(event_name="e" * size)
    return request


def test_the_limits_are_the_specifications_recommended_defaults() -> None:
    assert (MAX_REQUEST_BYTES, MAX_RESPONSE_BYTES) == (64 * 1024 * 1024, 4 * 1024 * 1024)
    assert Limits() == Limits(MAX_REQUEST_BYTES, MAX_RESPONSE_BYTES)


@pytest.mark.parametrize("gzipped", [False, True], ids=["plain", "gzip"])
def test_http_a_request_over_the_limit_is_never_sent(http: Server, gzipped: bool) -> None:
    # Measured before compression: 100 kB of one letter gzips to a few hundred bytes.
    big = padded(100_000)
    transport = HttpTransport(target(f"http://127.0.0.1:{http.port}/v1/logs", gzip=gzipped),
                              Limits(max_request_bytes=big.ByteSize() - 1))
    try:
        refused = transport.send(big, 5)
        at_limit = transport.send(padded(100_000 - 10), 5)
    finally:
        transport.close()
    assert (refused.ok, refused.status) == (False, REQUEST_TOO_LARGE)
    assert refused.detail == (f"the request is {big.ByteSize()} bytes, over the client's limit "
                              f"of {big.ByteSize() - 1} bytes; it was not sent")
    assert at_limit.ok and len(http.seen) == 1, "only the one within the limit was sent"


@pytest.mark.parametrize("gzipped", [False, True], ids=["plain", "gzip"])
def test_grpc_a_request_over_the_limit_is_never_sent(grpc_server: GrpcCalls,
                                                     gzipped: bool) -> None:
    big = padded(100_000)
    transport = GrpcTransport(target(f"http://127.0.0.1:{grpc_server.port}", gzip=gzipped),
                              limits=Limits(max_request_bytes=big.ByteSize() - 1))
    try:
        refused = transport.send(big, 5)
        assert grpc_server.metadata == [], "not sent"
        exactly = padded(100_000)
        exactly.resource_logs[0].scope_logs[0].log_records[0].event_name = "e" * 99_999
        at_limit = transport.send(exactly, 5)
    finally:
        transport.close()
    assert (refused.ok, refused.status) == (False, REQUEST_TOO_LARGE)
    assert at_limit.ok and len(grpc_server.metadata) == 1


def test_http_a_gzipped_success_is_bounded_after_decompression(http: Server) -> None:
    # 5 MB of partial-success words gzip to a few kB: the bound is on what they decompress to.
    bomb = gzip.compress(partial(2, long_words(5_000_000)))
    assert len(bomb) < 100_000
    gz = {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}
    http.replies += [(200, gz, bomb), (200, gz, gzip.compress(partial(2, "two too old")))]
    transport = HttpTransport(target(f"http://127.0.0.1:{http.port}/v1/logs"))
    try:
        unread = transport.send(REQUEST, 5)
        read = transport.send(REQUEST, 5)  # a new connection: the last one was left mid-body
    finally:
        transport.close()
    assert (unread.ok, unread.status, unread.rejected, unread.unread) == (True, 200, 0, True)
    assert unread.detail == (f"the response was larger than {MAX_RESPONSE_BYTES} bytes and was "
                             "discarded unread")
    assert (read.ok, read.rejected, read.detail, read.unread) == (True, 2, "two too old", False)


def raw_server(answer: bytes) -> Iterator[int]:
    """A server that reads one request and answers ``answer`` as it is, then closes."""
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve_one() -> None:
        connection, _ = listener.accept()
        with connection:
            data = b""
            while b"\r\n\r\n" not in data:
                data += connection.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(re.search(rb"(?i)content-length: (\d+)", head).group(1))  # type: ignore[union-attr]
            while len(body) < length:
                body += connection.recv(65536)
            connection.sendall(answer)

    thread = threading.Thread(target=serve_one, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        listener.close()


@pytest.mark.parametrize("answer", [
    # Cut off: the status said accepted, the body never came whole.
    b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 1000\r\n\r\n"
    b"\x0a\x05",
    # An encoding that is not what it says.
    b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Encoding: gzip\r\n"
    b"Content-Length: 12\r\n\r\nnot gzip at all"[:-3],
], ids=["cut-off", "not-gzip"])
def test_http_a_success_whose_body_cannot_be_read_is_still_accepted(answer: bytes) -> None:
    for port in raw_server(answer):
        got = HttpTransport(target(f"http://127.0.0.1:{port}/v1/logs")).send(REQUEST, 5)
        assert (got.ok, got.status, got.unread) == (True, 200, True), got
        assert got.detail.startswith("the response could not be read ("), got.detail


def test_http_an_error_answer_over_the_bound_keeps_its_status_and_its_retry_after(
        http: Server) -> None:
    pytest.importorskip("google.rpc.status_pb2")
    # A google.rpc.Status with a RetryInfo of 3 s and a message of 5 MB: cut at the bound, it
    # is not parsed (a cut message is no message); the status and the header decide.
    body = status_with_retry_info(14, long_words(5_000_000), 3.0)
    proto = {"Content-Type": "application/x-protobuf"}
    http.replies += [(503, {**proto, "Retry-After": "7"}, body), (429, proto, body),
                     (400, proto, body), (200, proto, partial(0, ""))]
    transport = HttpTransport(target(f"http://127.0.0.1:{http.port}/v1/logs"))
    try:
        answers = [transport.send(REQUEST, 5) for _ in range(4)]
    finally:
        transport.close()
    not_read = f"(a body larger than {MAX_ERROR_BYTES} bytes; the rest was not read)"
    assert [(a.ok, a.status, a.retry_after, a.detail) for a in answers[:3]] == [
        (False, 503, 7.0, not_read), (False, 429, None, not_read), (False, 400, None, not_read)]
    assert answers[3].ok, "the connection left mid-body is not reused"


def test_grpc_a_compressed_answer_over_the_limit_is_accepted_unless_the_request_was_gzipped(
        grpc_server: GrpcCalls) -> None:
    # gRPC checks the limit after decompression too, in words that name no side: ours only
    # when the request went uncompressed (a server decompresses only what was compressed).
    # (Just over the limit, grpcio 1.85 says "CLIENT: Received message larger than max";
    # well over it, as here, "Decompressed message larger than max".)
    grpc_server.message = long_words(5_000_000)
    grpc_server.gzip_answer = True
    answers = []
    for gzipped in (False, True):
        transport = GrpcTransport(target(f"http://127.0.0.1:{grpc_server.port}", gzip=gzipped))
        try:
            answers.append(transport.send(REQUEST, 5))
        finally:
            transport.close()
    plain, gzipped_request = answers
    assert (plain.ok, plain.status, plain.unread) == (True, "OK", True), plain
    # After a gzipped request the same words may be the collector refusing it for its size:
    # its refusal for size, as ever (split, a record alone dead-lettered; never lost).
    assert (gzipped_request.ok, gzipped_request.status) == (False, "RESOURCE_EXHAUSTED")
    assert gzipped_request.detail == "Decompressed message larger than max"
    assert len(grpc_server.metadata) == 2


@pytest.mark.parametrize("status", ["INVALID_ARGUMENT", "UNAVAILABLE", ("UNAVAILABLE", 2.5)],
                         ids=["invalid-argument", "unavailable", "unavailable-retry-info"])
def test_grpc_a_refusal_with_a_long_message_keeps_its_status(
        grpc_server: GrpcCalls, status: str | tuple[str, float]) -> None:
    # gRPC's own metadata limit (16 KiB) turned a refusal with a 100 kB message into a
    # RESOURCE_EXHAUSTED of ours: the collector's status (and RetryInfo) was lost.
    grpc_server.refusal = long_words(100_000)
    grpc_server.replies.append(status)
    transport = GrpcTransport(target(f"http://127.0.0.1:{grpc_server.port}"))
    try:
        answer = transport.send(REQUEST, 5)
    finally:
        transport.close()
    name, delay = status if isinstance(status, tuple) else (status, None)
    assert (answer.ok, answer.status, answer.retry_after) == (False, name, delay), answer
    assert answer.detail.endswith("... (100000 characters)") and len(answer.detail) < 300


def test_grpc_an_accepted_answer_with_long_trailers_is_accepted(grpc_server: GrpcCalls) -> None:
    grpc_server.trailers = (("x-collector-note", "n" * 100_000),)
    transport = GrpcTransport(target(f"http://127.0.0.1:{grpc_server.port}"))
    try:
        answer = transport.send(REQUEST, 5)
    finally:
        transport.close()
    assert (answer.ok, answer.status, answer.rejected) == (True, "OK", 1), answer


def test_grpc_metadata_over_the_limit_is_no_answer(grpc_server: GrpcCalls) -> None:
    # Over the limit, the collector's status is unknown: read as no answer (retried), as a
    # server that disconnects without answering.
    grpc_server.trailers = (("x-collector-note", "n" * 100_000),)
    transport = GrpcTransport(target(f"http://127.0.0.1:{grpc_server.port}"),
                              limits=Limits(max_response_bytes=16 * 1024))
    try:
        answer = transport.send(REQUEST, 5)
    finally:
        transport.close()
    assert (answer.ok, answer.status) == (False, None), answer
    assert answer.detail == "the answer's metadata was larger than 16384 bytes and was not read"
