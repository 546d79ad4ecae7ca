"""The Storage queue Event Grid delivers to, through the azure-storage-queue SDK (its public
interface only): receive a batch, delete a message, each answer classified.

The SDK retries nothing here (``retry_total=0``): the platform loop is the one retry layer, so
a throttled account (503 ``ServerBusy``, 500 ``OperationTimedOut``) is waited out with a capped
backoff the loop controls and ``/healthz`` can account for. Messages are read as the text the
service holds (no decode policy): ``envelope`` decides between JSON and base64 itself, and
keeps what it cannot read as it was received.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ResourceNotFoundError,
    ServiceRequestError,
)
from azure.storage.queue import QueueClient

#: How long one request may take (connecting; reading the answer).
CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 30.0
#: The most messages one receive returns (the service's own limit).
MAX_BATCH = 32


@dataclass(frozen=True, slots=True)
class Message:
    """A received message: its id, the receipt its delete needs, how often it was received
    (this time included) and its text as the service holds it."""

    id: str
    pop_receipt: str
    dequeue_count: int
    content: str
    inserted_on: datetime | None = None


class QueueError(Exception):
    """A request the queue did not carry out. ``outcome`` is the word ``/readyz`` and the log
    show (``throttled``, ``server_error``, ``refused``, ``not_found``, ``connection_error``);
    ``lasting`` says it will not pass by waiting (a credential, a missing queue)."""

    def __init__(self, outcome: str, detail: str, *, lasting: bool = False) -> None:
        super().__init__(detail)
        self.outcome = outcome
        self.lasting = lasting


@dataclass(frozen=True, slots=True)
class QueueAddress:
    """Where the queue is: a URL (``https://<account>.queue.core.windows.net/<queue>``, with
    ``DefaultAzureCredential``), or a connection string and a queue name (a key, a SAS, the
    Azurite emulator)."""

    url: str = ""
    connection_string: str = ""
    name: str = ""

    def describe(self) -> str:
        """For the log: the URL, or the queue's name and endpoint without the secret."""
        if self.url:
            return self.url
        fields = dict(part.split("=", 1) for part in self.connection_string.split(";")
                      if "=" in part)
        endpoint = fields.get("QueueEndpoint") or fields.get("AccountName", "the account")
        return f"queue {self.name} at {endpoint}"


class StorageQueue:
    """One queue; each call a single request, never retried here."""

    def __init__(self, address: QueueAddress,
                 credential: Callable[[], Any] | None = None) -> None:
        """``credential``: makes the token credential for a URL (``DefaultAzureCredential``
        unless a test gives another)."""
        options: dict[str, Any] = {"retry_total": 0, "connection_timeout": CONNECT_TIMEOUT,
                                   "read_timeout": READ_TIMEOUT}
        self.address = address
        if address.url:
            if credential is None:
                from azure.identity import DefaultAzureCredential

                credential = DefaultAzureCredential
            self._client = QueueClient.from_queue_url(address.url, credential=credential(),
                                                      **options)
        else:
            self._client = QueueClient.from_connection_string(
                address.connection_string, address.name, **options)

    def receive(self, count: int, visibility_timeout: int) -> list[Message]:
        """Up to ``count`` messages, each invisible to others for ``visibility_timeout`` s."""
        try:
            pages = self._client.receive_messages(
                messages_per_page=min(count, MAX_BATCH), visibility_timeout=visibility_timeout,
                max_messages=min(count, MAX_BATCH))
            return [Message(str(m.id), str(m.pop_receipt), int(m.dequeue_count or 0),
                            m.content if isinstance(m.content, str) else str(m.content or ""),
                            m.inserted_on) for m in pages]
        except AzureError as exc:
            raise classify(exc) from None

    def delete(self, message: Message) -> bool:
        """Delete ``message``; False when it is no longer there under this receipt (it became
        visible again and was received anew, or someone deleted it): it then comes back, or
        is gone, and either way is nothing to retry here."""
        try:
            self._client.delete_message(message.id, message.pop_receipt)
            return True
        except ResourceNotFoundError:
            return False
        except HttpResponseError as exc:
            code = str(getattr(exc, "error_code", "") or exc.reason or "")
            if exc.status_code == 400 and "popreceipt" in code.lower():
                return False
            raise classify(exc) from None
        except AzureError as exc:
            raise classify(exc) from None

    def approximate_count(self) -> int:
        """The queue's approximate message count (for tests and the start's log line)."""
        try:
            return int(self._client.get_queue_properties().approximate_message_count or 0)
        except AzureError as exc:
            raise classify(exc) from None

    def close(self) -> None:
        """Release the SDK's connections."""
        self._client.close()


def classify(exc: AzureError) -> QueueError:
    """The SDK's exception as the loop reads it: what happened, and whether waiting helps."""
    detail = " ".join(str(exc).split())[:300] or type(exc).__name__
    if isinstance(exc, ClientAuthenticationError):
        # The credential chain says which credentials it tried and why each failed: worth the
        # length, once per streak (the SDK's own warnings are silenced, service.py).
        whole = " ".join(str(exc).split())[:2000] or type(exc).__name__
        return QueueError("refused", f"authentication failed: {whole}", lasting=True)
    if isinstance(exc, ResourceNotFoundError):
        return QueueError("not_found", f"queue not found: {detail}", lasting=True)
    if isinstance(exc, HttpResponseError) and exc.status_code is not None:
        status = exc.status_code
        if status in (403,):
            return QueueError("refused", f"HTTP 403: {detail}", lasting=True)
        if status in (429, 503):
            return QueueError("throttled", f"HTTP {status}: {detail}")
        if status >= 500:
            return QueueError("server_error", f"HTTP {status}: {detail}")
        return QueueError("refused", f"HTTP {status}: {detail}", lasting=True)
    if isinstance(exc, ServiceRequestError):
        return QueueError("connection_error", detail)
    return QueueError("connection_error", f"{type(exc).__name__}: {detail}")
