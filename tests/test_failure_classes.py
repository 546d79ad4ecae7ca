"""Which sink answers are transient, configuration errors or permanent (pure logic).

HTTP and gRPC statuses go through :mod:`~scheduled_events_exporter.sinks.otlp_errors`; Event Hubs
failures are the real ``azure-eventhub`` exception classes (with the SDK's own AMQP error
conditions inside) through :func:`~scheduled_events_exporter.sinks.hub_sender.hub_error`.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduled_events_exporter.delivery.outcome import FailureKind
from scheduled_events_exporter.platforms.durable import write_all
from scheduled_events_exporter.sinks.otlp_errors import (
    classify_grpc,
    classify_http,
    describe,
    export_error,
)
from scheduled_events_exporter.sinks.otlp_transport import Answer
from scheduled_events_exporter.write_faults import describe_os_error

T, C, P = FailureKind.TRANSIENT, FailureKind.CONFIG, FailureKind.PERMANENT
L, E = FailureKind.TOO_LARGE, FailureKind.EXHAUSTED


@pytest.mark.parametrize(("code", "kind"), [
    (None, T), (408, T), (429, T), (500, T), (502, T), (503, T), (504, T), (599, T),
    (401, C), (403, C), (404, C), (405, C), (407, C),
    # A redirect: the route follows none, so the endpoint setting is wrong.
    (300, C), (301, C), (302, C), (307, C), (308, C),
    (413, L),
    (400, P), (409, P), (415, P), (422, P), (499, P),
])
def test_http_statuses(code: int | None, kind: FailureKind) -> None:
    assert classify_http(code) is kind


@given(st.integers(min_value=400, max_value=499))
def test_every_other_4xx_is_permanent(code: int) -> None:
    expected = (T if code in (408, 429) else C if code in (401, 403, 404, 405, 407)
                else L if code == 413 else P)
    assert classify_http(code) is expected


@given(st.integers(min_value=500, max_value=599))
def test_every_5xx_is_retried(code: int) -> None:
    assert classify_http(code) is T


@pytest.mark.parametrize(("name", "kind"), [
    (None, T), ("UNAVAILABLE", T), ("DEADLINE_EXCEEDED", T), ("RESOURCE_EXHAUSTED", E),
    ("INTERNAL", T), ("UNKNOWN", T), ("ABORTED", T),
    ("UNAUTHENTICATED", C), ("PERMISSION_DENIED", C), ("UNIMPLEMENTED", C), ("NOT_FOUND", C),
    ("INVALID_ARGUMENT", P), ("FAILED_PRECONDITION", P), ("ALREADY_EXISTS", P),
])
def test_grpc_statuses(name: str | None, kind: FailureKind) -> None:
    assert classify_grpc(name) is kind


def test_resource_exhausted_is_too_large_only_on_grpcs_own_size_words() -> None:
    # With RetryInfo: retried after it (the specification). Without: too large only when gRPC
    # says a message was larger than a limit; anything else is "busy, or maybe too large",
    # which the worker judges by the sizes the collector accepted (docs/otlp-conformance.md).
    assert classify_grpc("RESOURCE_EXHAUSTED", retry_info=True) is T
    assert export_error(Answer(False, "RESOURCE_EXHAUSTED", retry_after=2.0), 4).kind is T
    split = export_error(Answer(False, "RESOURCE_EXHAUSTED", detail=(
        "Received message larger than max (5000000 vs. 4194304)")), 4)
    assert split.kind is L and "refused a request of 4 records for its size" in str(split)
    busy = export_error(Answer(False, "RESOURCE_EXHAUSTED", detail="memory limit exceeded"), 4)
    assert busy.kind is E and busy.status == "gRPC RESOURCE_EXHAUSTED"


def test_a_redirect_names_the_status_and_where_it_points() -> None:
    moved = export_error(Answer(False, 308, location="https://elsewhere.example/v1/logs"), 1)
    assert moved.kind is C and moved.status == "HTTP 308"
    assert "redirected to https://elsewhere.example/v1/logs" in str(moved)
    assert "not followed" in str(moved)
    # A metric export says it the same way.
    assert describe(Answer(False, 307, location="http://x.example/")) == (
        "HTTP 307 to http://x.example/ (redirects are not followed)")


def test_export_error_messages_name_the_status_and_what_to_check() -> None:
    refused = export_error(Answer(False, None, detail="Connection refused"), 3)
    assert refused.kind is T and "no answer: Connection refused" in str(refused)
    auth = export_error(Answer(False, 401), 1)
    assert auth.kind is C and auth.status == "HTTP 401"
    assert "authentication failed" in str(auth) and "OTEL_EXPORTER_OTLP_HEADERS" in str(auth)
    bad = export_error(Answer(False, "INVALID_ARGUMENT", detail="log record too large"), 1)
    assert bad.kind is P and bad.status == "gRPC INVALID_ARGUMENT"
    assert "log record too large" in str(bad)  # the collector's own words
    busy = export_error(Answer(False, 429, retry_after=7.0), 2)
    assert busy.kind is T and busy.retry_after == 7.0


def test_eventhubs_sdk_errors() -> None:
    pytest.importorskip("azure.eventhub")
    from azure.eventhub._pyamqp.error import AMQPLinkError, ErrorCondition, MessageException
    from azure.eventhub.exceptions import (
        AuthenticationError,
        ConnectError,
        ConnectionLostError,
        EventDataError,
        EventDataSendError,
        OperationTimeoutError,
    )

    from scheduled_events_exporter.sinks.hub_sender import MessageTooLarge, hub_error

    too_large = EventDataSendError(
        "size", MessageException(condition=ErrorCondition.LinkMessageSizeExceeded))
    assert hub_error(too_large).kind is P
    assert hub_error(too_large).status == "Event Hubs message_too_large"
    assert hub_error(MessageTooLarge("a 9000-byte message")).kind is P
    assert hub_error(EventDataError("bad event")).kind is P
    decode = EventDataSendError("x", MessageException(condition=ErrorCondition.DecodeError))
    assert hub_error(decode).kind is P
    busy = EventDataSendError("x", MessageException(condition=ErrorCondition.InternalError))
    assert hub_error(busy).kind is T
    assert hub_error(AuthenticationError("401")).kind is C
    unauthorized = ConnectError("x", AMQPLinkError(condition=ErrorCondition.UnauthorizedAccess))
    assert hub_error(unauthorized).kind is C
    for transient in (ConnectError("down"), ConnectionLostError("lost"),
                      OperationTimeoutError("slow"), TimeoutError("t")):
        assert hub_error(transient).kind is T, transient


def test_write_all_completes_short_writes_and_reports_a_full_disk(tmp_path: Path) -> None:
    path = tmp_path / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        write_all(fd, b"x" * 200_000)
    finally:
        os.close(fd)
    assert path.stat().st_size == 200_000
    # /dev/full answers every write with ENOSPC, like a full disk.
    full = os.open("/dev/full", os.O_WRONLY)
    try:
        with pytest.raises(OSError) as caught:
            write_all(full, b"data")
    finally:
        os.close(full)
    assert caught.value.errno == errno.ENOSPC
    assert describe_os_error(caught.value) == "ENOSPC: No space left on device"
