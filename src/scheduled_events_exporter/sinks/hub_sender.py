"""The boundary with the ``azure-eventhub`` SDK: calls made safely, and its errors understood.

The SDK can block for seconds on retries and, against a peer that accepts TCP but never
answers, forever. Every SDK call runs on a :class:`HubSender` daemon thread with a deadline; a
client stuck past it is abandoned (its thread never joined) and a fresh client and thread serve
the next attempt. Neither the poll loop nor process exit waits on any of this. Every failure
comes out as a :class:`DeliveryError` whose kind (transient, configuration, permanent) the
delivery worker acts on (:func:`hub_error`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from scheduled_events_exporter.delivery.outcome import DeliveryError, FailureKind

#: Longest a single SDK call may take before its client is abandoned.
SEND_DEADLINE = 60.0


@dataclass(frozen=True, slots=True)
class Message:
    """One Event Hubs message: JSON body plus routing properties."""

    body: bytes
    properties: dict[str, str]



ClientFactory = Callable[[], Any]


def _start(call: Callable[[], object]) -> tuple[Future[object], threading.Thread]:
    """Run ``call`` on a new daemon thread. Not a ``ThreadPoolExecutor``: its threads are joined
    at interpreter exit, so one call stuck in the SDK would block process exit."""
    future: Future[object] = Future()

    def run() -> None:
        try:
            future.set_result(call())
        except BaseException as exc:  # handed to the waiting caller
            future.set_exception(exc)

    thread = threading.Thread(target=run, name="eventhubs-sdk", daemon=True)
    thread.start()
    return future, thread


class HubSender:
    """One SDK call at a time, each on its own daemon thread with a deadline; a client whose
    call outlives it is abandoned (and unblocked, see :func:`_reap`), a fresh one built."""

    def __init__(self, factory: ClientFactory, partition_key: Callable[[], str],
                 deadline: float = SEND_DEADLINE) -> None:
        self._factory = factory
        self._partition_key = partition_key
        self._deadline = deadline
        self._serial = threading.Lock()  # held for a whole send; always acquired with a timeout
        self._client: Any = None
        self.closed = False  # set by close(); every later send fails at once

    def send(self, messages: Sequence[Message], timeout: float | None = None) -> None:
        """Send in as few batches as fit, within ``timeout`` (at most the deadline); raises
        :class:`DeliveryError` on any failure, including the deadline passing."""
        budget = self._deadline if timeout is None else max(0.0, min(timeout, self._deadline))
        ends = time.monotonic() + budget
        if self.closed or not self._serial.acquire(timeout=budget):
            raise DeliveryError("Event Hubs sender closed" if self.closed else
                                f"Event Hubs client busy for {budget:g} s with another send")
        try:
            if self.closed:
                raise DeliveryError("Event Hubs sender closed")
            if self._client is None:
                self._client = self._factory()
            client, key, batch = self._client, self._partition_key(), list(messages)
            future, thread = _start(lambda: _send_batches(client, key, batch))
            try:
                future.result(timeout=max(0.0, ends - time.monotonic()))
            except concurrent.futures.TimeoutError:
                self._client = None
                _start(lambda: _reap(client, thread))
                message = f"Event Hubs send did not finish in {budget:g} s; client abandoned"
                raise DeliveryError(message) from None
            except MessageTooLarge as exc:  # decided before sending: the client is fine
                raise hub_error(exc) from None
            except Exception as exc:  # the client may be half-open: close it, build a new one
                self._client = None
                _start(lambda: _close_quietly(client))
                raise hub_error(exc) from None
        finally:
            if self.closed:  # close() came while we sent: it left the cleanup to us
                self._drop_client()
            self._serial.release()

    def close(self, timeout: float) -> None:
        """Close the client without waiting longer than ``timeout``; later sends fail at once."""
        self.closed = True
        ends = time.monotonic() + max(timeout, 0.0)
        if not self._serial.acquire(timeout=max(timeout, 0.0)):
            return  # a send is running: it cleans up when it returns or passes its deadline
        try:
            with contextlib.suppress(Exception):  # closing a broken client is best effort
                self._drop_client().result(timeout=max(ends - time.monotonic(), 0.1))
        finally:
            self._serial.release()

    def _drop_client(self) -> Future[object]:
        client, self._client = self._client, None
        return _start(lambda: _close_quietly(client))[0]


def _reap(client: Any, stuck: threading.Thread) -> None:
    """Unblock a call stuck on a silent peer (the SDK reads without timeout during SASL), so
    abandoned calls do not pile up as threads and sockets: shut the client's sockets (private
    attributes of azure-eventhub 5.x, best effort) until the call gives up, then close it."""
    for _ in range(10):
        with contextlib.suppress(Exception):
            for producer in list(client._producers.values()):
                with contextlib.suppress(Exception):
                    producer._handler._connection._transport.sock.shutdown(socket.SHUT_RDWR)
        stuck.join(1.0)
        if not stuck.is_alive():
            break
    _close_quietly(client)


class MessageTooLarge(ValueError):
    """A single message exceeds what the hub accepts (its link's advertised max-message-size)."""


def _send_batches(client: Any, partition_key: str, messages: list[Message]) -> None:
    from azure.eventhub import EventData

    events = []
    for message in messages:
        data = EventData(message.body)
        data.properties = {k: v for k, v in message.properties.items()}
        data.content_type = "application/json"
        events.append(data)
    if len(events) > 1:
        # Refuse the whole call before sending anything if one message can never fit: the
        # worker then sends one at a time, and the others are not sent twice.
        for data, message in zip(events, messages, strict=True):
            try:
                client.create_batch(partition_key=partition_key).add(data)
            except ValueError:
                raise MessageTooLarge(f"a {len(message.body)}-byte message exceeds the hub's "
                                      "size limit") from None
    batch = client.create_batch(partition_key=partition_key)
    for data, message in zip(events, messages, strict=True):
        try:
            batch.add(data)
        except ValueError:  # batch full: ship it and start another
            if not len(batch):
                raise MessageTooLarge(f"a {len(message.body)}-byte message exceeds the hub's "
                                      "size limit") from None
            client.send_batch(batch)
            batch = client.create_batch(partition_key=partition_key)
            batch.add(data)
    if len(batch):
        client.send_batch(batch)


def _close_quietly(client: Any) -> None:
    with contextlib.suppress(Exception):  # best effort on a client we are discarding
        if client is not None:
            client.close()


#: AMQP error conditions about the message itself: sending it again can never succeed. Written
#: as ``EventHubError.error`` carries them: the condition without its first prefix
#: (``amqp:link:message-size-exceeded`` → ``link:message-size-exceeded``).
PERMANENT_CONDITIONS = frozenset({
    "link:message-size-exceeded", "decode-error", "invalid-field", "argument-error",
    "argument-out-of-range",
})
#: Conditions about who we are or where we send: every message would fail the same way.
CONFIG_CONDITIONS = frozenset({"unauthorized-access", "not-found"})
_AUTH_ERRORS = ("AuthenticationError", "ClientAuthenticationError", "CredentialUnavailableError")


def hub_error(exc: BaseException) -> DeliveryError:
    """The :class:`DeliveryError` (with its :class:`FailureKind`) for an SDK failure.

    Permanent: a message larger than the hub accepts (the SDK refuses to batch it,
    ``ValueError``), ``EventDataError`` (the SDK refuses the event), or a send the service
    rejected with a condition about the message. Configuration: authentication, unknown hub.
    Everything else is what the SDK itself retries (connection lost, timeouts, busy server).
    """
    text = describe_error(exc)
    condition = _condition(exc)
    name = type(exc).__name__
    if isinstance(exc, MessageTooLarge) or condition == "link:message-size-exceeded":
        return DeliveryError(text, FailureKind.PERMANENT, "Event Hubs message_too_large")
    if name == "EventDataError" or condition in PERMANENT_CONDITIONS:
        return DeliveryError(text, FailureKind.PERMANENT, f"Event Hubs {condition or name}")
    if (name in _AUTH_ERRORS or name == "EventHubNotFoundError"
            or condition in CONFIG_CONDITIONS or text.startswith("Event Hubs entity not found")):
        return DeliveryError(text, FailureKind.CONFIG, f"Event Hubs {condition or name}")
    return DeliveryError(text, FailureKind.TRANSIENT, f"Event Hubs {condition or name}")


def _condition(exc: BaseException) -> str:
    """The AMQP error condition of an azure-eventhub exception (``EventHubError.error``, the
    documented attribute: the condition without its first prefix), or ``""``."""
    error = getattr(exc, "error", None)
    return error if isinstance(error, str) else ""


def describe_error(exc: BaseException) -> str:
    """One clear line without secrets (SDK messages may echo endpoints, never keys)."""
    name = type(exc).__name__
    if name in _AUTH_ERRORS:
        return (f"Event Hubs authentication failed ({name}): check the credential and that the "
                "identity has the 'Azure Event Hubs Data Sender' role")
    text = str(exc).splitlines()[0] if str(exc) else ""
    if "SharedAccessKey" in text or "sig=" in text:
        text = "(details withheld: they contained credentials)"
    if "not found" in text.lower() or name == "EventHubNotFoundError":
        return f"Event Hubs entity not found ({name}): check SEE_EVENTHUB_NAME / EntityPath"
    return f"Event Hubs send failed ({name}): {text[:200]}"
