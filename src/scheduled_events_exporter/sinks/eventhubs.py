"""Event Hubs sink (docs/semantics.md#sinks): one flat JSON message per transition, metrics as
snapshots.

Transitions go to the hub of ``SEE_EVENTHUB_NAME`` (or the connection string's EntityPath).
Metric snapshots go to the hub of ``SEE_EVENTHUB_METRICS_NAME`` when it is set (same namespace
and credential, its own client), else to the transitions hub. Snapshots are sent by an
:class:`OnChangeMetricReader`: soon after a poll that changed something, otherwise every
``SEE_EVENTHUB_HEARTBEAT`` seconds (default 300). Their shape is in :mod:`.metrics_json`.

Every SDK call goes through :class:`~.hub_sender.HubSender` (its own daemon thread, a deadline,
stuck clients abandoned), which also sorts the SDK's errors into transient, configuration and
permanent failures.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
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
from scheduled_events_exporter.delivery.outcome import DeliveryError, FailureCounter
from scheduled_events_exporter.extras import EVENTHUBS
from scheduled_events_exporter.records import TransitionRecord, rfc3339, to_columns
from scheduled_events_exporter.sinks.hub_sender import (
    SEND_DEADLINE,
    ClientFactory,
    HubSender,
    Message,
)
from scheduled_events_exporter.sinks.metrics_json import snapshot_bodies, snapshot_metrics
from scheduled_events_exporter.sinks.on_change_reader import OnChangeMetricReader
from scheduled_events_exporter.sinks.worker_sink import WorkerSink
from scheduled_events_exporter.streak import Streak
from scheduled_events_exporter.telemetry import ExtraMetrics, add_metrics

log = logging.getLogger(__name__)

#: Log Analytics ingests Event Hubs messages up to 64 KB; stay far below it.
MAX_MESSAGE_BYTES = 48 * 1024
TRUNCATION_MARK = "…[truncated]"
#: SDK-internal retries per call. The delivery worker retries with its own backoff, so more
#: only lengthen each failing call (3, the SDK default, takes ~12 s against a hub that is down)
#: and delay shutdown; one retry still absorbs a connection the service closed while idle.
SDK_RETRY_TOTAL = 1
#: Shortened first when a message is too large (free text, lists); _KEPT: never shortened.
_SHRINKABLE = ("Description", "Changes", "Resources")
_KEPT = frozenset({"TimeGenerated", "Transition", "RecordId", "ExporterVersion"})


def transition_message(record: TransitionRecord) -> Message:
    """The docs/semantics.md#sinks object as a message, shrunk (never dropped) to fit
    :data:`MAX_MESSAGE_BYTES`."""
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
        self._failing = Streak()

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
            if self._failing.hit() and not self._sender.closed:
                log.warning("sink eventhubs: metrics snapshots not sent: %s", exc)
            self._count_failure("eventhubs", "metrics", 1)
            return MetricExportResult.FAILURE
        if self._failing.clear() is not None:
            log.info("sink eventhubs: metrics snapshots sent again")
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
                           f"{EVENTHUBS.install}") from None
    if config.log_level != "DEBUG":
        # The SDK logs every connection state change and retry at INFO; our sink reports
        # failures once per streak, without the SDK's multi-line exception texts.
        logging.getLogger("azure").setLevel(logging.WARNING)
        # The credential chain's WARNING block at every failed token request: the sink says
        # the failure once per streak.
        logging.getLogger("azure.identity").setLevel(logging.ERROR)

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
