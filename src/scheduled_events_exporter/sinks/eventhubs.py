"""Event Hubs sink (SPEC §8): one flat JSON message per transition, metrics as snapshots.

The ``azure-eventhub`` SDK can block for tens of seconds on retries and, against a peer that
accepts TCP but never answers, forever. Every SDK call therefore runs on a :class:`HubSender`
thread with a deadline; a client stuck past it is abandoned and a fresh one is built for the
next attempt. The poll loop never waits on any of this.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource

from scheduled_events_exporter import __version__
from scheduled_events_exporter.config import Config
from scheduled_events_exporter.records import TransitionRecord, rfc3339, to_columns
from scheduled_events_exporter.sinks import FailureCounter, SinkStatus, open_spool
from scheduled_events_exporter.sinks.delivery import DeliveryError, DeliveryWorker
from scheduled_events_exporter.sinks.metrics_json import snapshot_metrics

log = logging.getLogger(__name__)

#: Log Analytics ingests Event Hubs messages up to 64 KB; stay far below it.
MAX_MESSAGE_BYTES = 48 * 1024
TRUNCATION_MARK = "…[truncated]"
#: Longest a single SDK call may take before its client is abandoned.
SEND_DEADLINE = 60.0


@dataclass(frozen=True, slots=True)
class Message:
    """One Event Hubs message: JSON body plus routing properties."""

    body: bytes
    properties: dict[str, str]


def transition_message(record: TransitionRecord) -> Message:
    """The SPEC §8 object as a message, shrunk (never dropped) to fit :data:`MAX_MESSAGE_BYTES`."""
    columns = to_columns(record)
    body = _dump(columns)
    if len(body) > MAX_MESSAGE_BYTES:
        # Description first (free text), then Resources (keep the first names and say so).
        description = str(columns.get("Description") or "")
        excess = len(body) - MAX_MESSAGE_BYTES
        keep = max(0, len(description.encode()) - excess - len(TRUNCATION_MARK.encode()) - 16)
        columns["Description"] = (
            description.encode()[:keep].decode(errors="ignore") + TRUNCATION_MARK
        )
        body = _dump(columns)
        resources = columns.get("Resources")
        while len(body) > MAX_MESSAGE_BYTES and isinstance(resources, list) and len(resources) > 1:
            resources = resources[: len(resources) // 2]
            columns["Resources"] = [*resources, TRUNCATION_MARK]
            body = _dump(columns)
    event = record.transition.event
    return Message(
        body,
        {
            "RecordKind": "transition",
            "Transition": record.transition.kind.value,
            "EventType": event.event_type if event else "",
        },
    )


def _dump(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


ClientFactory = Callable[[], Any]


class HubSender:
    """Serialises SDK calls onto one thread with a deadline; abandons stuck clients."""

    def __init__(
        self,
        factory: ClientFactory,
        partition_key: Callable[[], str],
        deadline: float = SEND_DEADLINE,
    ) -> None:
        self._factory = factory
        self._partition_key = partition_key
        self._deadline = deadline
        self._lock = threading.Lock()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._client: Any = None

    def send(self, messages: Sequence[Message]) -> None:
        """Send as few batches as fit; raises :class:`DeliveryError` on any failure."""
        with self._lock:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(1, "eventhubs-sdk")
            future = self._executor.submit(self._send_blocking, list(messages))
            try:
                future.result(timeout=self._deadline)
            except concurrent.futures.TimeoutError:
                self._abandon()
                raise DeliveryError(
                    f"Event Hubs send did not finish in {self._deadline:g} s; client abandoned"
                ) from None
            except DeliveryError:
                raise
            except Exception as exc:
                self._reset_client()
                raise DeliveryError(describe_error(exc)) from None

    def close(self, timeout: float) -> None:
        """Close the client without waiting longer than ``timeout``."""
        with self._lock:
            executor, client = self._executor, self._client
            self._executor, self._client = None, None
        if executor is None:
            return
        if client is not None:
            future = executor.submit(client.close)
            # Closing a broken client is best effort.
            with contextlib.suppress(Exception):
                future.result(timeout=max(timeout, 0.1))
        executor.shutdown(wait=False, cancel_futures=True)

    def _send_blocking(self, messages: list[Message]) -> None:
        from azure.eventhub import EventData

        if self._client is None:
            self._client = self._factory()
        client = self._client
        batch = client.create_batch(partition_key=self._partition_key())
        for message in messages:
            data = EventData(message.body)
            data.properties = {k: v for k, v in message.properties.items()}
            data.content_type = "application/json"
            try:
                batch.add(data)
            except ValueError:  # batch full: ship it and start another
                client.send_batch(batch)
                batch = client.create_batch(partition_key=self._partition_key())
                batch.add(data)
        if len(batch):
            client.send_batch(batch)

    def _reset_client(self) -> None:
        client, self._client = self._client, None
        if client is not None and self._executor is not None:
            self._executor.submit(_close_quietly, client)

    def _abandon(self) -> None:
        # The stuck call keeps its thread; a new executor and client serve the next attempt.
        executor, client = self._executor, self._client
        self._executor, self._client = None, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
        if client is not None:
            threading.Thread(target=_close_quietly, args=(client,), daemon=True).start()


def _close_quietly(client: Any) -> None:
    with contextlib.suppress(Exception):  # best effort on a client we are discarding
        client.close()


def describe_error(exc: BaseException) -> str:
    """One clear line without secrets (SDK messages may echo endpoints, never keys)."""
    name = type(exc).__name__
    if name in ("AuthenticationError", "ClientAuthenticationError", "CredentialUnavailableError"):
        return (
            f"Event Hubs authentication failed ({name}): check the credential and that the "
            "identity has the 'Azure Event Hubs Data Sender' role"
        )
    text = str(exc).splitlines()[0] if str(exc) else ""
    if "SharedAccessKey" in text or "sig=" in text:
        text = "(details withheld: they contained credentials)"
    if "not found" in text.lower() or name == "EventHubNotFoundError":
        return f"Event Hubs entity not found ({name}): check SEE_EVENTHUB_NAME / EntityPath"
    return f"Event Hubs send failed ({name}): {text[:200]}"


class EventHubsMetricExporter(MetricExporter):
    """An SDK ``MetricExporter``: one JSON snapshot message per export (``RecordKind=metrics``)."""

    def __init__(
        self, sender: HubSender, resource: Callable[[], Resource], count_failure: FailureCounter
    ) -> None:
        super().__init__()
        self._sender = sender
        self._resource = resource
        self._count_failure = count_failure

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        """Send one snapshot; failures are counted (metrics are re-observed, not spooled)."""
        attrs = self._resource().attributes
        snapshot = {
            "TimeGenerated": rfc3339(datetime.now(UTC)),
            "RecordKind": "metrics",
            "VmId": str(attrs.get("host.id", "")),
            "VmName": str(attrs.get("host.name", "")),
            "Metrics": snapshot_metrics(metrics_data),
            "RecordId": str(uuid.uuid4()),
            "ExporterVersion": __version__,
        }
        try:
            self._sender.send([Message(_dump(snapshot), {"RecordKind": "metrics"})])
        except DeliveryError as exc:
            log.warning("sink eventhubs: metrics snapshot not sent: %s", exc)
            self._count_failure("eventhubs", "metrics", 1)
            return MetricExportResult.FAILURE
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        """Nothing is buffered here."""
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        """The sink closes the shared sender."""


class EventHubsSink:
    """Transitions and metric snapshots to one event hub, partitioned by VM id."""

    name = "eventhubs"

    def __init__(
        self, config: Config, count_failure: FailureCounter, factory: ClientFactory
    ) -> None:
        self._resource = Resource.create({})
        self._sender = HubSender(factory, self._partition_key)
        self._reader = PeriodicExportingMetricReader(
            EventHubsMetricExporter(self._sender, lambda: self._resource, count_failure),
            export_interval_millis=config.metric_export_interval * 1000,
        )
        self._worker = DeliveryWorker(
            self.name,
            self._deliver,
            count_failure,
            max_records=config.spool_max_records,
            spool=open_spool(config, self.name),
        )

    def metric_readers(self) -> Sequence[MetricReader]:
        """The periodic snapshot reader."""
        return (self._reader,)

    def start(self, resource: Resource) -> None:
        """Start the worker."""
        self._resource = resource
        self._worker.start()

    def submit(self, records: Sequence[TransitionRecord]) -> None:
        """Queue records for sending."""
        self._worker.submit(records)

    def flush(self, timeout: float) -> bool:
        """Wait until queued records are sent."""
        return self._worker.flush(timeout)

    def shutdown(self, timeout: float) -> bool:
        """Send what is queued within ``timeout``, then close the client."""
        done = self._worker.stop(timeout)
        self._sender.close(timeout=1.0)
        return done

    def status(self) -> SinkStatus:
        """Delivery health."""
        return self._worker.status()

    def _partition_key(self) -> str:
        attrs = self._resource.attributes
        return str(attrs.get("host.id") or attrs.get("host.name") or "unknown-vm")

    def _deliver(self, records: Sequence[TransitionRecord]) -> None:
        self._sender.send([transition_message(r) for r in records])


def create_eventhubs_sink(config: Config, count_failure: FailureCounter) -> EventHubsSink:
    """Build the sink with a connection string or ``DefaultAzureCredential``."""
    try:
        from azure.eventhub import EventHubProducerClient
    except ImportError:
        raise RuntimeError(
            "SEE_SINKS includes eventhubs but azure-eventhub is not installed: "
            "pip install 'azure-scheduled-events-exporter[eventhubs]'"
        ) from None

    def factory() -> Any:
        if config.eventhub_connection_string:
            return EventHubProducerClient.from_connection_string(
                config.eventhub_connection_string,
                eventhub_name=config.eventhub_name or None,
            )
        from azure.identity import DefaultAzureCredential

        return EventHubProducerClient(
            fully_qualified_namespace=config.eventhub_namespace,
            eventhub_name=config.eventhub_name,
            credential=DefaultAzureCredential(),
        )

    return EventHubsSink(config, count_failure, factory)
