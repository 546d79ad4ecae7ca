"""What the OTLP collector's answer means for the records.

The OpenTelemetry rule is the anchor (transient errors are retried, permanent ones are not),
with two refinements: authentication and endpoint errors are configuration problems that would
reject *every* record, so they are retried and surfaced loudly instead of dead-lettering
everything; and server errors other than the listed ones (500, INTERNAL, UNKNOWN) are retried,
because they say nothing about the record. No answer at all (connection refused, timeout) is
transient. Throttling (OTLP specification, "OTLP/gRPC Throttling", "OTLP/HTTP Throttling"): a
429 or 503 with ``Retry-After``, or any retryable gRPC status with ``RetryInfo``, is retried
after the delay given (capped once, by the delivery worker). A request refused for its size
on proof (HTTP 413; gRPC's own "Received message larger than max", what a server's receive
limit answers) "MUST NOT be retried as is": it is split. Any other ``RESOURCE_EXHAUSTED``
without ``RetryInfo`` is what memory limiters and quotas answer when they are busy: it is
``EXHAUSTED``, which the worker retries with backoff like ``UNAVAILABLE`` unless the collector
accepted smaller requests and none this large (then it is split); the specification reads it
as not retryable, docs/otlp-conformance.md says why we depart from that. A 3xx is a
configuration error: the route follows no redirect, and an OTLP endpoint that moved is a wrong
setting. A request the client itself refused to send for its size (``REQUEST_TOO_LARGE``, over
the request limit of OTLP 1.11.0) is permanent: the record is dead-lettered (alone after the
worker's isolation), a metric export dropped, either counted. docs/decisions.md ("Transient,
configuration, permanent") and docs/otlp-conformance.md have the references.
"""

from __future__ import annotations

from scheduled_events_exporter.delivery.outcome import DeliveryError, FailureKind
from scheduled_events_exporter.sinks.otlp_transport import REQUEST_TOO_LARGE, Answer

#: HTTP answers that mean "this request may succeed later" (OTLP/HTTP spec, plus 408).
TRANSIENT_HTTP = frozenset({408, 429, 502, 503, 504})
#: HTTP answers that refuse the request for its size: split it, never resend it as is.
TOO_LARGE_HTTP = frozenset({413})
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
#: Answers that say the URL or the method was the wrong place: the error names what was tried.
WRONG_PLACE: frozenset[int | str] = frozenset({404, 405, "NOT_FOUND", "UNIMPLEMENTED"})
#: The paths of the two signals: one repeated means a base URL was given as a signal's own.
_SIGNAL_PATHS = ("/v1/logs", "/v1/metrics")
_CONFIG_HINT = ("check OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_LOGS_ENDPOINT and "
                "OTEL_EXPORTER_OTLP_HEADERS / OTEL_EXPORTER_OTLP_LOGS_HEADERS")


def classify_http(code: int | None) -> FailureKind:
    """Transient, configuration, too large or permanent, for an HTTP status (``None``: no
    answer)."""
    if code is not None and 300 <= code < 400:
        return FailureKind.CONFIG
    if code is None or code in TRANSIENT_HTTP or code >= 500 or code < 400:
        return FailureKind.TRANSIENT
    if code in CONFIG_HTTP:
        return FailureKind.CONFIG
    if code in TOO_LARGE_HTTP:
        return FailureKind.TOO_LARGE
    return FailureKind.PERMANENT


#: What gRPC says when a message is over a receive limit (the server's, refusing our request):
#: "Received message larger than max (N vs. M)". The one RESOURCE_EXHAUSTED that proves size.
SIZE_LIMIT_WORDS = "larger than max"


def classify_grpc(name: str | None, retry_info: bool = False,
                  detail: str = "") -> FailureKind:
    """Transient, configuration, too large, exhausted or permanent, for a gRPC status name
    (``None``: no answer); ``retry_info``: whether the status carried ``RetryInfo``;
    ``detail``: the status message."""
    if name in CONFIG_GRPC:
        return FailureKind.CONFIG
    if name in PERMANENT_GRPC:
        return FailureKind.PERMANENT
    if name == "RESOURCE_EXHAUSTED" and not retry_info:
        # The specification: "retryable only if the server signals that a recovery from
        # resource exhaustion is possible" (RetryInfo). But collectors' memory limiters and
        # gateways' quotas answer exactly this, without RetryInfo, for being busy, and an
        # overload of a few seconds then dead-lettered whole bursts. Only gRPC's own size
        # message proves size; anything else the worker judges by the sizes that passed.
        if SIZE_LIMIT_WORDS in detail:
            return FailureKind.TOO_LARGE
        return FailureKind.EXHAUSTED
    return FailureKind.TRANSIENT


#: gRPC statuses the OTLP specification calls retryable ("OTLP/gRPC Response": the rest are not).
RETRYABLE_GRPC = frozenset({"CANCELLED", "DEADLINE_EXCEEDED", "ABORTED", "OUT_OF_RANGE",
                            "UNAVAILABLE", "DATA_LOSS"})


def beyond_the_specification(answer: Answer) -> bool:
    """Whether a refusal is retried although the OTLP specification says not to (a 500, gRPC
    ``INTERNAL`` or ``UNKNOWN``, ``RESOURCE_EXHAUSTED`` without ``RetryInfo``): it says nothing
    about the collector's state, so a record refused this way every time may be the cause
    (delivery/refusal.py then asks the records behind it). An answer the specification calls
    retryable (429, 502-504, ``UNAVAILABLE``, any with ``Retry-After``/``RetryInfo``) or no
    answer at all is about the collector, never the record."""
    status = answer.status
    if status is None or answer.retry_after is not None:
        return False
    if isinstance(status, str):
        return status not in RETRYABLE_GRPC and answer_kind(answer) in (
            FailureKind.TRANSIENT, FailureKind.EXHAUSTED)
    return status >= 500 and status not in TRANSIENT_HTTP


def answer_kind(answer: Answer) -> FailureKind:
    """What a failed export's answer comes to (an HTTP status, a gRPC status, the client's own
    refusal to send, or none)."""
    status = answer.status
    if status == REQUEST_TOO_LARGE:  # never sent: it would be over the limit every time
        return FailureKind.PERMANENT
    if isinstance(status, str):
        return classify_grpc(status, answer.retry_after is not None, answer.detail)
    return classify_http(status)


def tried(answer: Answer) -> str:
    """`` to POST <url>`` (or the gRPC method and target) for an answer that says it was the
    wrong place, with a word on a signal path given twice; ``""`` for any other answer."""
    if answer.status not in WRONG_PLACE or not answer.sent_to:
        return ""
    doubled = next((path for path in _SIGNAL_PATHS
                    if answer.sent_to.endswith(path + path)), "")
    hint = (f" (the path repeats {doubled}: OTEL_EXPORTER_OTLP_ENDPOINT is a base URL to which "
            f"{doubled} is appended, a per-signal endpoint is the whole URL)" if doubled else "")
    return f" to {answer.sent_to}{hint}"


def export_error(answer: Answer, count: int) -> DeliveryError:
    """The :class:`DeliveryError` for a failed export of ``count`` records."""
    status = answer.status
    said = f": {answer.detail}" if answer.detail else ""
    if status is None:
        return DeliveryError(f"OTLP log export of {count} records failed (no answer{said})",
                             retry_after=answer.retry_after)
    if status == REQUEST_TOO_LARGE:
        return DeliveryError(f"OTLP log export of {count} records not sent{said}",
                             FailureKind.PERMANENT, REQUEST_TOO_LARGE)
    kind = answer_kind(answer)
    if isinstance(status, int):
        shown, meaning = f"HTTP {status}", CONFIG_HTTP.get(status)
        if 300 <= status < 400:
            meaning = (f"redirected to {answer.location or '(no Location)'}, and redirects are "
                       "not followed (set the endpoint to where the collector is)")
    else:
        shown, meaning = f"gRPC {status}", CONFIG_GRPC.get(status)
    if kind is FailureKind.CONFIG:
        return DeliveryError(f"OTLP collector answered {shown}{tried(answer)}: {meaning}; "
                             f"{_CONFIG_HINT}", kind, shown)
    if kind is FailureKind.PERMANENT:
        return DeliveryError(f"OTLP collector rejected the request with {shown}{said}", kind,
                             shown)
    if kind is FailureKind.TOO_LARGE:
        return DeliveryError(f"OTLP collector refused a request of {count} records for its "
                             f"size with {shown}{said}", kind, shown)
    return DeliveryError(f"OTLP log export of {count} records failed ({shown}{said})", kind,
                         shown, retry_after=answer.retry_after,
                         suspicious=beyond_the_specification(answer))


def describe(answer: Answer) -> str:
    """An answer in a few words, for a log line (``HTTP 503: overloaded``, ``no answer: ...``)."""
    if answer.status is None:
        return f"no answer ({answer.detail or 'collector unreachable or timed out'})"
    if answer.status == REQUEST_TOO_LARGE:
        return f"not sent: {answer.detail}"
    shown = f"HTTP {answer.status}" if isinstance(answer.status, int) else f"gRPC {answer.status}"
    if answer.location:  # a redirect: where to, since it is not followed
        shown = f"{shown} to {answer.location} (redirects are not followed)"
    shown += tried(answer)
    return f"{shown}: {answer.detail}" if answer.detail else shown
