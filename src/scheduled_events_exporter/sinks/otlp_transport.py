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
redirect is followed (an OTLP endpoint does not move). gRPC: :mod:`.grpc_channel`, imported only
when a signal uses it (``otlp.transport_for``).
"""

from __future__ import annotations

import gzip
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import certifi
import urllib3

from scheduled_events_exporter import __version__
from scheduled_events_exporter.otlp_settings import OtlpTarget

#: Sent with every request, so a collector's log can tell us from other clients.
USER_AGENT = f"azure-scheduled-events-exporter/{__version__}"
#: The longest Retry-After we honour (a collector asking for more is waited on at the worker's
#: own backoff instead).
MAX_RETRY_AFTER = 60.0


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
    #: Seconds the collector asked us to wait (``Retry-After``), if it did.
    retry_after: float | None = None


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
    return int(rejected), str(partial.error_message)


def status_message(body: bytes, content_type: str) -> str:
    """The collector's explanation in an error answer: OTLP/HTTP sends a ``google.rpc.Status``
    (protobuf; field 2 is the message), some collectors plain text or JSON."""
    if "protobuf" in content_type:
        return _status_field_2(body)
    text = body[:300].decode("utf-8", "replace")
    return " ".join(text.split())[:200]


def _status_field_2(data: bytes) -> str:
    """Field 2 (``message``) of a serialized ``google.rpc.Status``; ``""`` if malformed."""
    i = 0
    try:
        while i < len(data):
            key, i = _varint(data, i)
            field, wire = key >> 3, key & 7
            if wire == 0:
                _, i = _varint(data, i)
            elif wire == 2:
                size, i = _varint(data, i)
                if field == 2:
                    return data[i:i + size].decode("utf-8", "replace")[:200]
                i += size
            else:
                return ""
    except IndexError:
        return ""
    return ""


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i
        shift += 7
        if shift > 63:
            raise IndexError("varint too long")


def _retry_after(value: str | None) -> float | None:
    try:
        seconds = float(value) if value else None
    except ValueError:
        return None  # an HTTP date: rare from collectors; the worker's backoff applies
    return None if seconds is None or seconds < 0 else min(seconds, MAX_RETRY_AFTER)


class HttpTransport:
    """OTLP over http/protobuf to ``target.endpoint``."""

    def __init__(self, target: OtlpTarget) -> None:
        self._target = target
        self._url = target.endpoint
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
        """POST the request once."""
        body = request.SerializeToString()
        if self._target.gzip:
            body = gzip.compress(body)
        try:
            response = self._pool.request(
                "POST", self._url, body=body, headers=self._headers, redirect=False,
                timeout=urllib3.Timeout(total=timeout), retries=False)
        except urllib3.exceptions.HTTPError as exc:
            reason = getattr(exc, "reason", None) or exc
            return Answer(False, None, detail=_short(reason))
        content_type = response.headers.get("Content-Type", "")
        if 200 <= response.status < 300:
            rejected, message = 0, ""
            if response.data and "protobuf" in content_type:
                answer = self._response()
                try:
                    answer.ParseFromString(response.data)
                    rejected, message = partial_success(answer, self._target.signal)
                except Exception:  # a success whose body we cannot read is still a success
                    pass
            return Answer(True, response.status, rejected, message)
        return Answer(False, response.status,
                      detail=status_message(response.data or b"", content_type),
                      retry_after=_retry_after(response.headers.get("Retry-After")))

    def close(self) -> None:
        """Close the kept-alive connection."""
        self._pool.clear()


def _short(error: object) -> str:
    """A connection error in a few words (urllib3 nests them: the innermost says it best)."""
    text = str(error)
    for marker in ("Connection refused", "timed out", "Name or service not known",
                   "CERTIFICATE_VERIFY_FAILED", "Connection reset"):
        if marker in text:
            return marker
    return " ".join(text.split())[:200]
