"""Event Hubs sink (SPEC §8): one flat JSON message per transition, metrics as snapshots.

Transitions go to the hub of ``SEE_EVENTHUB_NAME`` (or the connection string's EntityPath).
Metric snapshots go to the hub of ``SEE_EVENTHUB_METRICS_NAME`` when it is set (same namespace
and credential, its own client), else to the transitions hub. Snapshots are sent by an
:class:`OnChangeMetricReader`: soon after a poll that changed something, otherwise every
``SEE_EVENTHUB_HEARTBEAT`` seconds (default 300). Their shape is in :mod:`.metrics_json`.

The ``azure-eventhub`` SDK can block for seconds on retries and, against a peer that accepts
TCP but never answers, forever. Every SDK call runs on a :class:`HubSender` daemon thread with a
deadline; a client stuck past it is abandoned (its thread never joined) and a fresh client and
thread serve the next attempt. Neither the poll loop nor process exit waits on any of this.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
)
from opentelemetry.sdk.resources import Resource

from scheduled_events_exporter import __version__
from scheduled_events_exporter.config import Config
from scheduled_events_exporter.records import TransitionRecord, rfc3339, to_columns
from scheduled_events_exporter.sinks.base import ExtraMetrics, FailureCounter
from scheduled_events_exporter.sinks.delivery import DeliveryError, FailureKind, WorkerSink
from scheduled_events_exporter.sinks.metrics_json import snapshot_bodies, snapshot_metrics
from scheduled_events_exporter.sinks.on_change_reader import OnChangeMetricReader
from scheduled_events_exporter.telemetry import add_metrics

log = logging.getLogger(__name__)

#: Log Analytics ingests Event Hubs messages up to 64 KB; stay far below it.
MAX_MESSAGE_BYTES = 48 * 1024
TRUNCATION_MARK = "…[truncated]"
#: Longest a single SDK call may take before its client is abandoned.
SEND_DEADLINE = 60.0
#: SDK-internal retries per call. The delivery worker retries with its own backoff, so more
#: only lengthen each failing call (3, the SDK default, takes ~12 s against a hub that is down)
#: and delay shutdown; one retry still absorbs a connection the service closed while idle.
SDK_RETRY_TOTAL = 1
#: Shortened first when a message is too large (free text, lists); _KEPT: never shortened.
_SHRINKABLE = ("Description", "Changes", "Resources")
_KEPT = frozenset({"TimeGenerated", "Transition", "RecordId", "ExporterVersion"})


@dataclass(frozen=True, slots=True)
class Message:
    """One Event Hubs message: JSON body plus routing properties."""

    body: bytes
    properties: dict[str, str]


def transition_message(record: TransitionRecord) -> Message:
    """The SPEC §8 object as a message, shrunk (never dropped) to fit :data:`MAX_MESSAGE_BYTES`."""
    columns: dict[str, object] = dict(to_columns(record))
    body = _dump(columns)
    if len(body) > MAX_MESSAGE_BYTES:
        body = _shrink(columns, _SHRINKABLE)
    if len(body) > MAX_MESSAGE_BYTES:  # only with absurd ids or names: cap every other column
        body = _shrink(json.loads(body), tuple(k for k in columns if k not in _KEPT))
    event = record.transition.event
    kind = record.transition.kind.value
    return Message(body, {"RecordKind": "transition", "Transition": kind,
                          "EventType": event.event_type if event else ""})


def _shrink(columns: dict[str, object], keys: Sequence[str]) -> bytes:
    """Cap ``keys`` to a per-value byte budget, halved until the object fits (or is minimal).

    Every column stays present with its JSON type; a shortened string ends with
    :data:`TRUNCATION_MARK`, a shortened list gets it as its last item.
    """
    budget = MAX_MESSAGE_BYTES
    while True:
        body = _dump({k: _cap(v, budget) if k in keys else v for k, v in columns.items()})
        if len(body) <= MAX_MESSAGE_BYTES or budget == 0:
            return body
        budget //= 2


def _cap(value: object, budget: int) -> object:
    if isinstance(value, str):
        raw = value.encode()
        if len(raw) <= budget:
            return value
        return raw[:budget].decode(errors="ignore") + TRUNCATION_MARK
    if isinstance(value, list):
        kept: list[object] = []
        used = 0
        for item in value:
            capped = _cap(item, budget)
            used += len(_dump(capped)) + 1
            if used > budget:
                return [*kept, TRUNCATION_MARK]
            kept.append(capped)
        return kept
    if isinstance(value, dict):  # Changes: {field: [old, new]}; keep both sides of each pair
        return {k: [_cap(side, budget // 2) for side in v] if isinstance(v, list)
                else _cap(v, budget) for k, v in value.items()}
    return value


def _dump(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


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


class EventHubsMetricExporter(MetricExporter):
    """An SDK ``MetricExporter``: one JSON snapshot message per export (``RecordKind=metrics``)."""

    def __init__(self, sender: HubSender, resource: Callable[[], Resource],
                 count_failure: FailureCounter,
                 hub_failing: Callable[[], bool] = lambda: False,
                 extra: ExtraMetrics = list) -> None:
        super().__init__()
        self._extra = extra
        self._sender = sender
        self._resource = resource
        self._count_failure = count_failure
        self._hub_failing = hub_failing
        self._failing = False

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs: Any) -> MetricExportResult:
        """Send one snapshot; failures are counted (metrics are re-observed, not spooled)."""
        if self._sender.closed:  # the SDK's last collection at shutdown comes after the sink's
            return MetricExportResult.FAILURE  # shutdown: skipped, it would reopen the client
        if self._hub_failing():  # transitions are being retried: a snapshot would delay them
            self._count_failure("eventhubs", "metrics", 1)
            return MetricExportResult.FAILURE
        attrs = self._resource().attributes
        header = {"TimeGenerated": rfc3339(datetime.now(timezone.utc)), "RecordKind": "metrics",
                  "VmId": str(attrs.get("host.id", "")), "VmName": str(attrs.get("host.name", "")),
                  "ExporterVersion": __version__}
        data = add_metrics(metrics_data, self._extra())
        bodies = snapshot_bodies(header, snapshot_metrics(data), MAX_MESSAGE_BYTES)
        messages = [Message(body, {"RecordKind": "metrics"}) for body in bodies]
        try:
            self._sender.send(messages, timeout=timeout_millis / 1000)
        except DeliveryError as exc:
            if not self._failing and not self._sender.closed:  # once per failure streak
                log.warning("sink eventhubs: metrics snapshots not sent: %s", exc)
            self._failing = True
            self._count_failure("eventhubs", "metrics", 1)
            return MetricExportResult.FAILURE
        if self._failing:
            log.info("sink eventhubs: metrics snapshots sent again")
        self._failing = False
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        """Nothing is buffered here."""
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        """The sink closes the shared sender (first: the SDK's last collection is skipped)."""


class EventHubsSink(WorkerSink):
    """Transitions to one event hub and metric snapshots to the same or a second hub (one
    client each), partitioned by VM id."""

    name = "eventhubs"

    def __init__(self, config: Config, count_failure: FailureCounter, factory: ClientFactory,
                 send_deadline: float = SEND_DEADLINE,
                 metrics_factory: ClientFactory | None = None) -> None:
        self._sender = HubSender(factory, self._partition_key, send_deadline)
        # With one hub, a snapshot waits while transitions are being retried (it would delay
        # them on the shared client); a metrics hub has its own client and nothing to wait for.
        self._metrics_sender = (self._sender if metrics_factory is None else
                                HubSender(metrics_factory, self._partition_key, send_deadline))
        shared = metrics_factory is None

        def hub_failing() -> bool:
            return shared and self._worker.status().consecutive_failures > 0

        self._reader = OnChangeMetricReader(
            EventHubsMetricExporter(self._metrics_sender, lambda: self._resource, count_failure,
                                    hub_failing, lambda: self._extra_metrics()),
            heartbeat=config.eventhub_heartbeat,
            export_timeout=send_deadline,
        )
        super().__init__(config, count_failure)

    def metric_readers(self) -> Sequence[MetricReader]:
        """The snapshot reader (on change, else every ``SEE_EVENTHUB_HEARTBEAT``)."""
        return (self._reader,)

    def metrics_changed(self) -> None:
        """Send a snapshot soon, on the reader's thread (never blocks the caller)."""
        self._reader.metrics_changed()

    def _close(self) -> None:
        self._sender.close(timeout=1.0)  # within ~1 s more, however stuck the SDK is
        if self._metrics_sender is not self._sender:
            self._metrics_sender.close(timeout=1.0)

    def _partition_key(self) -> str:
        attrs = self._resource.attributes
        return str(attrs.get("host.id") or attrs.get("host.name") or "unknown-vm")

    def _deliver(self, records: Sequence[TransitionRecord]) -> None:
        self._sender.send([transition_message(r) for r in records])

    def _payload(self, record: TransitionRecord) -> object:
        message = transition_message(record)
        return {"body": json.loads(message.body), "properties": message.properties}


def create_eventhubs_sink(config: Config, count_failure: FailureCounter) -> EventHubsSink:
    """Build the sink with a connection string or ``DefaultAzureCredential``."""
    try:
        from azure.eventhub import EventHubProducerClient
    except ImportError:
        # load_config() reports this as a configuration error first; kept for direct callers.
        raise RuntimeError("SEE_SINKS includes eventhubs but azure-eventhub is not installed: "
                           "pip install 'azure-eventhub==5.15.1'") from None
    if config.log_level != "DEBUG":
        # The SDK logs every connection state change and retry at INFO; our sink reports
        # failures once per streak, without the SDK's multi-line exception texts.
        logging.getLogger("azure").setLevel(logging.WARNING)

    def client_for(hub: str) -> ClientFactory:
        def factory() -> Any:
            if config.eventhub_connection_string:
                # eventhub_name wins over the connection string's EntityPath (azure-eventhub).
                return EventHubProducerClient.from_connection_string(
                    config.eventhub_connection_string, eventhub_name=hub or None,
                    retry_total=SDK_RETRY_TOTAL)
            from azure.identity import DefaultAzureCredential

            return EventHubProducerClient(
                fully_qualified_namespace=config.eventhub_namespace,
                eventhub_name=hub, credential=DefaultAzureCredential(),
                retry_total=SDK_RETRY_TOTAL)

        return factory

    metrics_hub = config.eventhub_metrics_name
    return EventHubsSink(config, count_failure, client_for(config.eventhub_name),
                         config.eventhub_send_timeout,
                         client_for(metrics_hub) if metrics_hub else None)
