"""Resource Graph's ``maintenanceresources`` table, page by page: what the queue missed.

``POST {endpoint}/providers/Microsoft.ResourceGraph/resources?api-version=2024-04-01`` with the
query below and ``options.$top`` 1000 (the most a page holds), then again with the answer's
``$skipToken`` until an answer has none (Azure/azure-rest-api-specs, Microsoft.ResourceGraph
2024-04-01, ``ResourcesFirstPageQuery`` and ``ResourcesNextPageQuery``). Rows come as objects
(``resultFormat: objectArray``; the older ``table`` form, ``columns`` and ``rows``, is read
too).

Throttling: a 429 is waited out for its ``Retry-After`` (or Resource Graph's own
``x-ms-user-quota-resets-after``, ``hh:mm:ss``), and a page that leaves no quota
(``x-ms-user-quota-remaining: 0``) makes the next request wait the same way; a 5xx or a failed
connection is retried with a capped backoff, a few times. Each wait is a stop-aware sleep.

Resource Graph keeps only each event's *latest* status, with no time of its change: a backfill
can add the ending the queue missed (Scheduled known, Completed in the table), never the steps
in between, and its transitions carry the time they were read.

The bearer token comes from ``azure-identity``'s ``DefaultAzureCredential`` for
``https://management.azure.com/.default``; it is never sent over plain ``http://`` (only a
local stand-in, in tests, is reached that way).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import certifi
import urllib3
from urllib3.exceptions import HTTPError

from scheduled_events_exporter.sinks.retry_after import retry_after

DEFAULT_ENDPOINT = "https://management.azure.com"
API_VERSION = "2024-04-01"
SCOPE = "https://management.azure.com/.default"
QUERY = ('maintenanceresources | where type == "microsoft.maintenance/scheduledevents" '
         "| order by id asc")
PAGE_ROWS = 1000
#: A page's answer is at most this large (1000 rows of a few KB).
MAX_ANSWER = 64 * 1024 * 1024
#: Pages one backfill reads at most (10 million rows): a service that hands out skip tokens
#: forever must not keep the loop from the queue.
MAX_PAGES = 10_000
#: Attempts of one page (throttling and server errors together) before the backfill gives up.
ATTEMPTS = 8
#: The longest single wait (a throttled quota resets within minutes).
MAX_WAIT = 300.0
CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 60.0
TIMEOUT = urllib3.Timeout(connect=CONNECT_TIMEOUT, read=READ_TIMEOUT)
_RESETS = re.compile(r"(\d{1,2}):(\d{2}):(\d{2})")


class GraphError(Exception):
    """The backfill could not be carried out (said, never fatal: the queue goes on)."""


@dataclass(frozen=True, slots=True)
class Page:
    """One answer: its rows as received and the token of the next page (empty at the end)."""

    rows: tuple[object, ...]
    skip_token: str


class ResourceGraph:
    """Reads every scheduled event row the credential may see (or only those of
    ``subscriptions``)."""

    def __init__(self, endpoint: str = DEFAULT_ENDPOINT, subscriptions: Sequence[str] = (),
                 token: Callable[[], str] | None = None,
                 wait: Callable[[float], bool] | None = None) -> None:
        """``token`` gives a bearer token (``DefaultAzureCredential`` when not given, over
        https only); ``wait(seconds)`` sleeps and returns True when the process is stopping."""
        self.url = (f"{endpoint.rstrip('/')}/providers/Microsoft.ResourceGraph/resources"
                    f"?api-version={API_VERSION}")
        self._subscriptions = list(subscriptions)
        self._secure = endpoint.startswith("https://")
        self._token = token if token is not None else (_azure_token() if self._secure
                                                        else None)
        self._wait = wait or _plain_sleep
        self._pool = urllib3.PoolManager(cert_reqs="CERT_REQUIRED", ca_certs=certifi.where(),
                                         retries=False, timeout=TIMEOUT)

    def rows(self) -> Iterator[object]:
        """Every row, page after page; raises :class:`GraphError` when a page cannot be had."""
        token = ""
        for _ in range(MAX_PAGES):
            page = self.page(token)
            yield from page.rows
            if not page.skip_token:
                return
            token = page.skip_token
        raise GraphError(f"more than {MAX_PAGES} pages; stopped there")

    def page(self, skip_token: str = "") -> Page:
        """One page, throttling and server errors waited out (at most :data:`ATTEMPTS`)."""
        options: dict[str, Any] = {"$top": PAGE_ROWS, "resultFormat": "objectArray"}
        if skip_token:
            options["$skipToken"] = skip_token
        body: dict[str, Any] = {"query": QUERY, "options": options}
        if self._subscriptions:
            body["subscriptions"] = self._subscriptions
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        backoff = 1.0
        for attempt in range(1, ATTEMPTS + 1):
            if self._token is not None and self._secure:
                headers["Authorization"] = f"Bearer {self._token()}"
            try:
                answer = self._pool.request("POST", self.url, body=json.dumps(body).encode(),
                                            headers=headers, preload_content=False,
                                            redirect=False)
                data = answer.read(MAX_ANSWER + 1, decode_content=True)
                answer.release_conn()
            except HTTPError as exc:
                delay, why = backoff, f"no answer ({type(exc).__name__}: {exc})"[:300]
            else:
                if answer.status == 200:
                    page = _page(data)
                    if answer.headers.get("x-ms-user-quota-remaining", "").strip() == "0" \
                            and page.skip_token:
                        self._sleep(_quota_wait(answer.headers) or 1.0)
                    return page
                why = f"HTTP {answer.status}: {data[:200].decode('utf-8', 'replace')!r}"
                if answer.status == 429:
                    delay = (retry_after(answer.headers.get("Retry-After"),
                                         date=answer.headers.get("Date"))
                             or _quota_wait(answer.headers) or backoff)
                elif answer.status >= 500:
                    delay = backoff
                else:
                    raise GraphError(f"Resource Graph refused the query: {why}")
            if attempt == ATTEMPTS:
                raise GraphError(f"Resource Graph gave no page after {ATTEMPTS} attempts: {why}")
            self._sleep(min(delay, MAX_WAIT))
            backoff = min(backoff * 2, 60.0)
        raise AssertionError("unreachable")  # the loop returns or raises

    def _sleep(self, seconds: float) -> None:
        if self._wait(seconds):
            raise GraphError("stopping")

    def close(self) -> None:
        """Release the connections."""
        self._pool.clear()


def _page(data: bytes) -> Page:
    if len(data) > MAX_ANSWER:
        raise GraphError(f"an answer larger than {MAX_ANSWER} bytes")
    try:
        answer = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise GraphError(f"an answer that is not JSON: {str(exc)[:200]}") from None
    if not isinstance(answer, dict):
        raise GraphError(f"expected an object, got {type(answer).__name__}")
    rows = answer.get("data")
    if isinstance(rows, dict):  # resultFormat "table": columns and rows
        names = [c.get("name") if isinstance(c, dict) else None
                 for c in rows.get("columns") or []]
        table = rows.get("rows") or []
        if not isinstance(table, list):
            raise GraphError("data.rows: expected a list")
        rows = [dict(zip(names, r, strict=False)) if isinstance(r, list) else r for r in table]
    if not isinstance(rows, list):
        raise GraphError(f"data: expected a list of rows, got {type(rows).__name__}")
    token = answer.get("$skipToken")
    return Page(tuple(rows), token if isinstance(token, str) else "")


def _quota_wait(headers: Any) -> float | None:
    """``x-ms-user-quota-resets-after`` (``hh:mm:ss``) in seconds."""
    match = _RESETS.fullmatch(str(headers.get("x-ms-user-quota-resets-after", "")).strip())
    if match is None:
        return None
    hours, minutes, seconds = (int(g) for g in match.groups())
    return float(hours * 3600 + minutes * 60 + seconds)


def _plain_sleep(seconds: float) -> bool:
    time.sleep(seconds)
    return False


def _azure_token() -> Callable[[], str]:
    from azure.identity import DefaultAzureCredential

    credential = DefaultAzureCredential()
    return lambda: str(credential.get_token(SCOPE).token)
