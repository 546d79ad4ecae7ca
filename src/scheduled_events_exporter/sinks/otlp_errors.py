"""What the OTLP collector answered to a log export, and what that means for the records.

The SDK's log exporters (1.45) decide retries internally and return only ``SUCCESS`` or
``FAILURE``: a record the collector will never accept looks exactly like a collector that is
down. We learn the answer without re-implementing the exporters, at the narrowest seam each
offers:

* http/protobuf: the exporter's documented ``session`` parameter. We pass a
  ``requests.Session`` with a response hook (a public ``requests`` feature) that notes the
  status code of every answer; the SDK's own encoding, compression, retries of 429/502/503/504
  and ``Retry-After`` handling stay in charge.
* gRPC: a client interceptor (``grpc.intercept_channel``, public gRPC API) that notes the
  status code of every ``Export`` call. The SDK builds its channel, and rebuilds it after
  ``UNAVAILABLE``, in ``_initialize_channel_and_stub``; overriding that one method to wrap the
  channel (and :mod:`.grpc_channel`'s use of ``_channel``/``_client`` to close it when idle)
  are the only private names we depend on.

:func:`classify_http` / :func:`classify_grpc` then follow the OpenTelemetry rule (transient
errors are retried, permanent ones are not) with two refinements: authentication and endpoint
errors are configuration problems that would reject *every* record, so they are retried and
surfaced loudly instead of dead-lettering everything; and server errors other than the listed
ones (500, INTERNAL, UNKNOWN) are retried, because they say nothing about the record.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from google.protobuf.json_format import MessageToDict  # type: ignore[import-untyped]
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.sdk._logs import ReadableLogRecord

from scheduled_events_exporter.sinks.base import DeliveryError, FailureKind
from scheduled_events_exporter.sinks.grpc_channel import ChannelKeeper, close_channel

if TYPE_CHECKING:
    import requests
    from opentelemetry.exporter.otlp.proto.grpc._log_exporter import (
        OTLPLogExporter as GrpcLogExporter,
    )
    from opentelemetry.exporter.otlp.proto.http._log_exporter import (
        OTLPLogExporter as HttpLogExporter,
    )

#: HTTP answers that mean "this request may succeed later" (OTLP/HTTP spec, plus 408).
TRANSIENT_HTTP = frozenset({408, 429, 502, 503, 504})
#: Answers about who we are or where we send, not about the record.
CONFIG_HTTP = {
    401: "authentication failed",
    403: "not authorized",
    404: "endpoint not found",
    405: "endpoint does not accept OTLP logs",
    407: "proxy authentication failed",
}
#: gRPC status names that say the request itself is wrong (never retried by anybody).
PERMANENT_GRPC = frozenset({"INVALID_ARGUMENT", "ALREADY_EXISTS", "FAILED_PRECONDITION"})
CONFIG_GRPC = {
    "UNAUTHENTICATED": "authentication failed",
    "PERMISSION_DENIED": "not authorized",
    "UNIMPLEMENTED": "endpoint does not implement OTLP logs",
    "NOT_FOUND": "endpoint not found",
}
_CONFIG_HINT = ("check OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_LOGS_ENDPOINT and "
                "OTEL_EXPORTER_OTLP_HEADERS / OTEL_EXPORTER_OTLP_LOGS_HEADERS")


class StatusProbe:
    """The last answer the collector gave during the current export (``None``: no answer).

    One log exporter per sink, used by the sink's single delivery thread: the export that
    follows :meth:`reset` is the only one writing.
    """

    def __init__(self) -> None:
        self._local = threading.local()

    def reset(self) -> None:
        """Forget the previous export's answer."""
        self._local.status = None

    def note(self, status: int | str) -> None:
        """Record an answer (HTTP status code or gRPC status name)."""
        self._local.status = status

    @property
    def last(self) -> int | str | None:
        """The last answer since :meth:`reset`."""
        status: int | str | None = getattr(self._local, "status", None)
        return status


def classify_http(code: int | None) -> FailureKind:
    """Transient, configuration or permanent, for an HTTP status (``None``: no answer)."""
    if code is None or code in TRANSIENT_HTTP or code >= 500 or code < 400:
        return FailureKind.TRANSIENT
    if code in CONFIG_HTTP:
        return FailureKind.CONFIG
    return FailureKind.PERMANENT


def classify_grpc(name: str | None) -> FailureKind:
    """Transient, configuration or permanent, for a gRPC status name (``None``: no answer)."""
    if name in CONFIG_GRPC:
        return FailureKind.CONFIG
    if name in PERMANENT_GRPC:
        return FailureKind.PERMANENT
    return FailureKind.TRANSIENT


def export_error(status: int | str | None, count: int) -> DeliveryError:
    """The :class:`DeliveryError` for a failed export of ``count`` records."""
    if status is None:
        return DeliveryError(f"OTLP log export of {count} records failed (no answer: "
                             "collector unreachable or timed out)")
    if isinstance(status, int):
        kind, shown, meaning = classify_http(status), f"HTTP {status}", CONFIG_HTTP.get(status)
    else:
        kind, shown, meaning = classify_grpc(status), f"gRPC {status}", CONFIG_GRPC.get(status)
    if kind is FailureKind.CONFIG:
        return DeliveryError(f"OTLP collector answered {shown}: {meaning}; {_CONFIG_HINT}",
                             kind, shown)
    if kind is FailureKind.PERMANENT:
        return DeliveryError(f"OTLP collector rejected the request with {shown}", kind, shown)
    return DeliveryError(f"OTLP log export of {count} records failed ({shown})", kind, shown)


def otlp_json(record: ReadableLogRecord) -> object:
    """The record as an OTLP/JSON ``ExportLogsServiceRequest`` (for the dead-letter file)."""
    return MessageToDict(encode_logs([record]), use_integers_for_enums=True)


def http_log_exporter(probe: StatusProbe) -> HttpLogExporter:
    """The SDK's http/protobuf log exporter, configured by ``OTEL_*``, reporting to ``probe``."""
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter

    return OTLPLogExporter(session=_session(probe))


def _session(probe: StatusProbe) -> requests.Session:
    import requests

    session = _credential_session() or requests.Session()

    def hook(response: requests.Response, *args: Any, **kwargs: Any) -> None:
        probe.note(response.status_code)

    session.hooks["response"].append(hook)
    return session


def _credential_session() -> requests.Session | None:
    """The session a configured OTLP credential-provider entry point supplies (the SDK would
    load it itself when given no session)."""
    names = ("OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER",
             "OTEL_PYTHON_EXPORTER_OTLP_HTTP_LOGS_CREDENTIAL_PROVIDER")
    if not any(os.environ.get(name) for name in names):
        return None
    from opentelemetry.exporter.otlp.proto.http._common import _load_session_from_envvar

    return _load_session_from_envvar("OTEL_PYTHON_EXPORTER_OTLP_HTTP_LOGS_CREDENTIAL_PROVIDER")


def grpc_log_exporter(probe: StatusProbe) -> GrpcLogExporter:
    """The SDK's gRPC log exporter, configured by ``OTEL_*``, reporting to ``probe``, with a
    channel opened per export and closed when idle (:mod:`.grpc_channel` says why)."""
    import grpc  # type: ignore[import-untyped]
    from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
    from opentelemetry.sdk._logs.export import LogRecordExportResult

    class Interceptor(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
        def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
            outcome = continuation(details, request)
            code = outcome.code()
            if code is not None:
                probe.note(str(code.name))
            return outcome

    class Exporter(OTLPLogExporter):
        def __init__(self) -> None:
            self._ready = False  # the SDK's constructor asks for a channel: not yet
            self.keeper = ChannelKeeper(self._open, lambda: close_channel(self))
            super().__init__()
            self._ready = True

        def _open(self) -> None:
            self._ready = True
            self._initialize_channel_and_stub()

        def _initialize_channel_and_stub(self) -> None:
            if not self._ready:
                return
            super()._initialize_channel_and_stub()  # type: ignore[no-untyped-call]
            self._channel = grpc.intercept_channel(self._channel, Interceptor())
            self._client = self._stub(self._channel)

        def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
            return self.keeper.export(lambda: super(Exporter, self).export(batch))

        def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
            self.keeper.stop()
            super().shutdown(timeout_millis, **kwargs)

    return Exporter()
