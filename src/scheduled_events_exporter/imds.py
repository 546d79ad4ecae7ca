"""IMDS client (docs/semantics.md#imds): one keep-alive connection, no proxies, no redirects,
ETag/304.

Each call returns a :class:`PollResult` whatever happens; nothing here raises on network or
protocol trouble, so the poll loop only decides *when* to ask again (:func:`retry_delay`).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import urllib3
from urllib3.exceptions import HTTPError, NewConnectionError
from urllib3.exceptions import ReadTimeoutError as Urllib3ReadTimeout
from urllib3.exceptions import TimeoutError as Urllib3Timeout

from scheduled_events_exporter import api_versions
from scheduled_events_exporter.model import Document, InstanceInfo, Outcome
from scheduled_events_exporter.parser import (
    MAX_DOCUMENT_BYTES,
    DocumentError,
    excerpt,
    parse_document,
)


def events_path(api_version: str = api_versions.DEFAULT) -> str:
    """The Scheduled Events request path (GET and the approval POST) at ``api_version``."""
    return f"/metadata/scheduledevents?api-version={api_version}"


INSTANCE_PATH: Final = "/metadata/instance?api-version=2021-02-01"
_HEADERS: Final = {"Metadata": "true", "Accept": "application/json"}


@dataclass(frozen=True, slots=True)
class PollResult:
    """The outcome of one Scheduled Events request."""

    outcome: Outcome
    duration: float
    status: int | None = None
    document: Document | None = None
    error: str = ""
    retry_after: float | None = None
    #: On ``api_version_refused``: the versions IMDS said it serves.
    offered: tuple[str, ...] = ()


class ImdsClient:
    """Talks to IMDS over a single reused HTTP/1.1 connection.

    ``trust_env`` does not exist here by design: urllib3 never reads ``HTTP_PROXY``, and IMDS
    must never be reached through a proxy (the documentation's ``Metadata: true`` guard exists
    precisely because a proxied request could be answered by someone else).
    """

    def __init__(
        self,
        endpoint: str,
        *,
        first_timeout: float,
        timeout: float,
        api_version: str = api_versions.DEFAULT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api_version = api_version
        self._events_path = events_path(api_version)
        self._pool = urllib3.connection_from_url(
            endpoint, maxsize=1, block=False, retries=False, timeout=timeout
        )
        self._first_timeout = first_timeout
        self._timeout = timeout
        self._answered = False
        self._etag: str | None = None
        self._clock = clock
        self._endpoint = endpoint

    def close(self) -> None:
        """Close the connection."""
        self._pool.close()

    def fetch_events(self) -> PollResult:
        """GET the Scheduled Events document (conditional on the last ETag)."""
        headers = dict(_HEADERS)
        if self._etag:
            headers["If-None-Match"] = self._etag
        # The service enables itself on first use and may take up to 2 minutes to answer.
        timeout = self._timeout if self._answered else self._first_timeout
        started = self._clock()
        try:
            status, body, response_headers = self._request("GET", self._events_path, headers,
                                                           timeout)
        except NewConnectionError as exc:
            # Refused, unreachable, no such host: urllib3 derives this from its connect-timeout
            # class for old callers, but nothing waited here, so it is no timeout.
            return PollResult(Outcome.CONNECTION_ERROR, self._clock() - started,
                              error=f"cannot connect to {self._endpoint}: {_reason(exc)}")
        except Urllib3Timeout:
            return PollResult(
                Outcome.TIMEOUT, self._clock() - started,
                error=f"no complete answer from {self._endpoint} within {timeout:g} s"
            )
        except (HTTPError, OSError) as exc:
            return PollResult(Outcome.CONNECTION_ERROR, self._clock() - started, error=_short(exc))
        self._answered = True
        duration = self._clock() - started
        if status == 200:
            try:
                document = parse_document(body)
            except DocumentError as exc:
                self._etag = None
                return PollResult(Outcome.INVALID_DOCUMENT, duration, status, error=str(exc))
            self._etag = response_headers.get("ETag") or None
            return PollResult(Outcome.OK, duration, status, document=document)
        if status == 304 and self._etag:
            return PollResult(Outcome.NOT_MODIFIED, duration, status)
        error = f"HTTP {status}: {excerpt(body)}" if body else f"HTTP {status}"
        if status == 410:
            return PollResult(Outcome.GONE, duration, status, error=error)
        if status == 429:
            return PollResult(
                Outcome.THROTTLED,
                duration,
                status,
                error=error,
                retry_after=_retry_after(response_headers.get("Retry-After")),
            )
        if status >= 500:
            return PollResult(Outcome.SERVER_ERROR, duration, status, error=error)
        # 304 without our ETag, redirects (never followed) and other 4xx.
        self._etag = None
        offers = api_versions.offered(body) if status == 400 else None
        if offers is not None:  # by the status and the body's structure, never its wording
            return PollResult(Outcome.API_VERSION_REFUSED, duration, status,
                              error=api_versions.refusal(self._api_version, offers),
                              offered=offers)
        return PollResult(Outcome.CLIENT_ERROR, duration, status, error=error)

    def fetch_instance(self) -> InstanceInfo:
        """Read the instance metadata once. Raises ``ValueError`` or ``OSError`` on failure."""
        try:
            status, body, _ = self._request("GET", INSTANCE_PATH, dict(_HEADERS), self._timeout)
        except (HTTPError, Urllib3Timeout) as exc:
            raise OSError(f"instance metadata request failed: {_short(exc)}") from None
        if status != 200:
            raise ValueError(f"instance metadata: expected HTTP 200, got {status}: {excerpt(body)}")
        return parse_instance(body)

    def _request(
        self, method: str, path: str, headers: dict[str, str], timeout: float
    ) -> tuple[int, bytes, dict[str, str]]:
        response = self._pool.urlopen(
            method,
            path,
            headers=headers,
            redirect=False,
            retries=False,
            timeout=urllib3.Timeout(connect=min(timeout, 5.0), read=timeout),
            preload_content=False,
        )
        try:
            # Bounded read, in size and in total time: the read timeout applies per socket
            # read, so a body trickled a byte at a time would otherwise hold the poll for ever.
            deadline = time.monotonic() + timeout
            chunks: list[bytes] = []
            received = 0
            while received <= MAX_DOCUMENT_BYTES:
                if time.monotonic() > deadline:
                    response.close()  # the connection is mid-body: never reuse it
                    raise Urllib3ReadTimeout(
                        self._pool, path, f"the body took longer than {timeout:g} s in total")
                chunk = response.read1(min(65536, MAX_DOCUMENT_BYTES + 1 - received))
                if not chunk:
                    break
                chunks.append(chunk)
                received += len(chunk)
            body = b"".join(chunks)
            if len(body) <= MAX_DOCUMENT_BYTES:
                response.drain_conn()
            return response.status, body, {k: v for k, v in response.headers.items()}
        finally:
            response.release_conn()


def parse_instance(body: bytes) -> InstanceInfo:
    """Instance metadata JSON → :class:`InstanceInfo`; raises ``ValueError`` when unusable."""
    try:
        data = json.loads(body[:MAX_DOCUMENT_BYTES].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ValueError(f"instance metadata is not JSON: {excerpt(body)}") from None
    compute = data.get("compute") if isinstance(data, dict) else None
    if not isinstance(compute, dict):
        raise ValueError(f"instance metadata has no 'compute' object: {excerpt(body)}")

    def text(key: str) -> str:
        value = compute.get(key, "")
        return value[:512] if isinstance(value, str) else ""

    return InstanceInfo(
        vm_name=text("name"),
        vm_id=text("vmId"),
        resource_id=text("resourceId"),
        subscription_id=text("subscriptionId"),
        resource_group=text("resourceGroupName"),
        region=text("location"),
        zone=text("zone"),
        scale_set_name=text("vmScaleSetName"),
        vm_size=text("vmSize"),
    )


#: Backoff caps per outcome: 410 is expected for a minute after start, so retry briskly.
_CAPS: Final = {Outcome.GONE: 5.0, Outcome.THROTTLED: 60.0}
_DEFAULT_CAP: Final = 30.0


def retry_delay(
    result: PollResult,
    failures: int,
    interval: float,
    rand: Callable[[], float] = random.random,
) -> float:
    """Delay before the next request after ``failures`` consecutive failed ones (≥ 1).

    Capped exponential backoff from the poll interval with "equal jitter" (half fixed, half
    random), so a fleet that lost IMDS together does not retry in lockstep. A 429's
    Retry-After is honoured as a floor.
    """
    cap = _CAPS.get(result.outcome, _DEFAULT_CAP)
    base = min(cap, interval * 2.0 ** min(failures - 1, 30))
    delay = base / 2 + rand() * base / 2
    if result.retry_after is not None:
        delay = max(delay, min(result.retry_after, cap))
    return max(delay, interval)


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if 0 <= seconds <= 3600 else None


def _reason(exc: NewConnectionError) -> str:
    """The OS's words for a failed connection ("Connection refused", "Name or service not
    known"), without urllib3's object reprs."""
    text = str(exc)
    marker = "Failed to establish a new connection: "
    if marker in text:
        text = text.split(marker, 1)[1]
    return _short(text)


def _short(exc: BaseException | str) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."
