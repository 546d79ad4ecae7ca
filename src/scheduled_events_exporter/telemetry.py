"""Telemetry mapping (docs/semantics.md#records, docs/semantics.md#metrics): tracker state →
metrics, and a record's severity.

Gauges are observable and read a :class:`GaugeSnapshot` that the poll loop publishes by
swapping one reference, so collection (on the SDK's reader thread) never takes a lock shared
with polling and per-event series vanish as soon as the event leaves the snapshot.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    Gauge,
    Metric,
    MetricReader,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from scheduled_events_exporter import __version__
from scheduled_events_exporter.model import (
    Basis,
    InstanceInfo,
    Outcome,
    ScheduledEvent,
    TransitionKind,
)
from scheduled_events_exporter.records import TransitionRecord

SCOPE_NAME = "scheduled_events_exporter"
P = "azure.scheduled_event."

#: (name, kind, unit) of every instrument, exactly as docs/semantics.md#metrics names them.
METRICS: tuple[tuple[str, str, str], ...] = (
    ("azure.scheduled_events.pending", "gauge", "{event}"),
    ("azure.scheduled_events.time_to_not_before", "gauge", "s"),
    ("azure.scheduled_events.impact_duration", "gauge", "s"),
    ("azure.scheduled_events.document_incarnation", "gauge", "1"),
    ("azure.scheduled_events.transitions", "counter", "{transition}"),
    ("azure.scheduled_events.notice", "histogram", "s"),
    ("azure.scheduled_events.imds.requests", "counter", "{request}"),
    ("azure.scheduled_events.imds.duration", "histogram", "s"),
    ("azure.scheduled_events.imds.staleness", "gauge", "s"),
    ("azure.scheduled_events.export.failures", "counter", "{failure}"),
    ("azure.scheduled_events.approvals", "counter", "{approval}"),
    ("azure.scheduled_events.document.anomalies", "counter", "{anomaly}"),
)

#: What the parser repairs instead of refusing a document (``document.anomalies`` kinds).
ANOMALY_KINDS = ("duplicate_event_id", "invalid_unicode")

#: Label values IMDS controls that pass unchanged (the documented ones, and ours for ends).
KNOWN_LABELS: dict[str, frozenset[str]] = {
    "type": frozenset({"Freeze", "Reboot", "Redeploy", "Preempt", "Terminate", ""}),
    "source": frozenset({"Platform", "User", ""}),
    # "Canceled": the platform's own spelling, on the platform command's events.
    "status": frozenset({"Scheduled", "Started", "Completed", "Cancelled", "Canceled", "Unknown",
                         ""}),
}
#: Well-formed values IMDS may add (a new EventType) pass too, up to this many per label.
EXTRA_LABEL_VALUES = 8
OTHER = "other"
_LABEL_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")


class LabelBound:
    """Bounds the metric label values that IMDS controls (``type``, ``source``, ``status``).

    The SDK keeps every attribute set a counter, histogram or observable gauge ever saw for the
    life of the process, so an IMDS that invents values would grow memory and every scrape
    without bound. Known values pass; a new well-formed word (the platform adding an EventType)
    passes until ``EXTRA_LABEL_VALUES`` of them were seen; anything else is ``other``. Records
    always keep the original text. Thread-safe: callers are the poll and reader threads.
    """

    def __init__(self) -> None:
        self._extra: dict[str, set[str]] = {name: set() for name in KNOWN_LABELS}
        self._lock = threading.Lock()

    def __call__(self, label: str, value: str) -> str:
        """The value to use for ``label`` (one of :data:`KNOWN_LABELS`' keys)."""
        if value in KNOWN_LABELS[label]:
            return value
        with self._lock:
            extra = self._extra[label]
            if value in extra:
                return value
            if len(extra) < EXTRA_LABEL_VALUES and _LABEL_WORD.fullmatch(value):
                extra.add(value)
                return value
        return OTHER

#: Notice histogram buckets (s): 30 s preempt … 15 min … days of degraded-hardware notice.
NOTICE_BUCKETS = (0, 30, 60, 120, 300, 600, 900, 1800, 3600, 21600, 86400, 604800)
IMDS_DURATION_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    130,
)


#: Metrics built at collection time (the per-event gauges), appended by every reader.
ExtraMetrics = Callable[[], Sequence[Metric]]


def add_metrics(data: MetricsData, extra: Sequence[Metric]) -> MetricsData:
    """``data`` with ``extra`` appended to this exporter's instrumentation scope."""
    if not extra:
        return data
    if not data.resource_metrics:
        return data  # nothing was collected at all (no resource to attach to)
    first, *rest = data.resource_metrics
    scopes = list(first.scope_metrics)
    for index, scope_metrics in enumerate(scopes):
        if scope_metrics.scope.name == SCOPE_NAME:
            scopes[index] = ScopeMetrics(scope_metrics.scope, [*scope_metrics.metrics, *extra],
                                         scope_metrics.schema_url)
            break
    else:
        scopes.append(ScopeMetrics(InstrumentationScope(SCOPE_NAME, __version__), list(extra), ""))
    return MetricsData([ResourceMetrics(first.resource, scopes, first.schema_url), *rest])


#: OTLP severity numbers (the log data model's SeverityNumber).
SEVERITY_INFO, SEVERITY_WARN, SEVERITY_ERROR = 9, 13, 17


def severity(record: TransitionRecord) -> tuple[int, str]:
    """docs/lifecycle.md severities: WARN for what is coming, ERROR when unannounced, INFO for
    endings (the OTLP severity number and text)."""
    kind = record.transition.kind
    if kind is TransitionKind.STARTED and record.transition.unannounced:
        return SEVERITY_ERROR, "ERROR"
    if kind in (
        TransitionKind.SCHEDULED,
        TransitionKind.STARTED,
        TransitionKind.UPDATED,
        TransitionKind.DOCUMENT_RESET,
    ):
        return SEVERITY_WARN, "WARN"
    return SEVERITY_INFO, "INFO"


def build_resource(instance: InstanceInfo) -> Resource:
    """OTel resource per semantic conventions.

    ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME`` add to *and override* these (the
    SDK's ``Resource.create`` alone would let ours win): the Helm chart sets ``cloud.platform``
    to ``azure.aks`` and the ``k8s.*`` attributes that way. ``service.instance.id`` defaults to
    the vmId, so a restart is the same instance to "exporter went silent" alerts.
    """
    attrs: dict[str, str] = {
        "service.name": "azure-scheduled-events-exporter",
        "service.version": __version__,
        "cloud.provider": "azure",
        "cloud.platform": "azure.vm",
    }
    optional = {
        "cloud.region": instance.region,
        "cloud.account.id": instance.subscription_id,
        "cloud.resource_id": instance.resource_id,
        "cloud.availability_zone": instance.zone,
        "host.id": instance.vm_id,
        "service.instance.id": instance.vm_id,
        "host.name": instance.vm_name,
        "host.type": instance.vm_size,
        "azure.vm.scaleset.name": instance.scale_set_name,
        "azure.vm.sku": instance.vm_size,
        # On AKS the node resource group (MC_...), not the cluster's (docs/aks.md).
        "azure.resource_group.name": instance.resource_group,
    }
    attrs.update({k: v for k, v in optional.items() if v})
    return Resource.create(attrs).merge(OTELResourceDetector().detect())


@dataclass(frozen=True, slots=True)
class GaugeSnapshot:
    """What the observable gauges report, published by the poll loop after each document."""

    events: tuple[ScheduledEvent, ...] = ()
    vm_name: str = ""
    incarnation: int | None = None
    #: EventIds first seen already Started while watched (their per-event gauges say so).
    unannounced: frozenset[str] = frozenset()
    #: Monotonic time of the last good document (None before the first).
    last_good_monotonic: float | None = None


@dataclass
class Telemetry:
    """The instruments, bound to one MeterProvider (no readers means no cost beyond the calls)."""

    readers: Sequence[MetricReader] = ()
    resource: Resource = field(default_factory=lambda: Resource.create({}))
    wall: Callable[[], datetime] = field(default=lambda: datetime.now(timezone.utc))
    monotonic: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self.snapshot = GaugeSnapshot()
        #: Bounds the IMDS-controlled label values of every instrument.
        self.labels = LabelBound()
        self.provider = MeterProvider(metric_readers=list(self.readers), resource=self.resource)
        meter = self.provider.get_meter(SCOPE_NAME, __version__)
        m = "azure.scheduled_events."
        meter.create_observable_gauge(
            m + "pending",
            [self._pending],
            unit="{event}",
            description="Events currently in the document",
        )
        # time_to_not_before and impact_duration are not SDK instruments: see per_event_metrics.
        meter.create_observable_gauge(
            m + "document_incarnation",
            [self._incarnation],
            unit="1",
            description="Last DocumentIncarnation",
        )
        meter.create_observable_gauge(
            m + "imds.staleness",
            [self._staleness],
            unit="s",
            description="Seconds since the last good document",
        )
        self._transitions = meter.create_counter(
            m + "transitions", unit="{transition}", description="Lifecycle transitions"
        )
        self._notice = meter.create_histogram(
            m + "notice",
            unit="s",
            description="Notice the VM got: NotBefore minus first seen, for events that "
                        "appeared while watched; it can be below the platform's documented "
                        "minimum (seen: a Freeze with 319 s against 15 min)",
            explicit_bucket_boundaries_advisory=NOTICE_BUCKETS,
        )
        self._requests = meter.create_counter(
            m + "imds.requests", unit="{request}", description="IMDS requests by outcome"
        )
        self._duration = meter.create_histogram(
            m + "imds.duration",
            unit="s",
            description="IMDS request duration",
            explicit_bucket_boundaries_advisory=IMDS_DURATION_BUCKETS,
        )
        self._approvals = meter.create_counter(
            m + "approvals", unit="{approval}", description="Approval decisions by outcome"
        )
        self._failures = meter.create_counter(
            m + "export.failures", unit="{failure}", description="Failed or dropped exports"
        )
        self._anomalies = meter.create_counter(
            m + "document.anomalies", unit="{anomaly}",
            description="Documents the parser repaired (repeated EventId, invalid Unicode)",
        )
        for kind in ANOMALY_KINDS:  # exported at 0 from the start, so the first one shows
            self._anomalies.add(0, {"kind": kind})

    # --- recording, called by the poll loop and the sinks (cheap, non-blocking) ---

    def record_request(self, outcome: Outcome, status: int | None, duration: float) -> None:
        """Count one IMDS request and its duration."""
        attrs: dict[str, str | int] = {"outcome": outcome.value}
        if status is not None:
            attrs["http.response.status_code"] = status
        self._requests.add(1, attrs)
        self._duration.record(max(duration, 0.0), {"outcome": outcome.value})

    def record_transition(self, record: TransitionRecord) -> None:
        """Count a transition; a ``scheduled`` with a NotBefore also feeds the notice histogram."""
        t = record.transition
        event = t.event
        bound = self.labels
        kind = bound("type", event.event_type if event else "")
        source = bound("source", event.source if event else "")
        self._transitions.add(1, {"transition": t.kind.value, "type": kind, "source": source})
        # Only a notice watched from its first document: a first sight after a start or a gap
        # measures what was left, which would drag the fleet's low percentiles down. The
        # platform's record measures from its own time of scheduling: the whole notice.
        if (t.kind is TransitionKind.SCHEDULED and t.notice is not None and event is not None
                and t.outcome_basis in (Basis.CONTINUOUS_WATCH, Basis.PLATFORM_RECORD)):
            # Histograms take non-negative values; a late sighting counts as zero notice.
            self._notice.record(max(t.notice, 0.0), {"type": kind, "source": source})

    def record_anomaly(self, kind: str) -> None:
        """Count one anomaly the parser repaired (``duplicate_event_id``, ``invalid_unicode``)."""
        self._anomalies.add(1, {"kind": kind})

    def record_export_failure(self, sink: str, signal: str, count: int = 1) -> None:
        """Count failed or dropped exports by sink and signal."""
        self._failures.add(count, {"sink": sink, "signal": signal})

    def record_approval(self, outcome: str) -> None:
        """Count one approval decision (approved, dry_run, not_leader, ...)."""
        self._approvals.add(1, {"outcome": outcome})

    def per_event_metrics(self) -> list[Metric]:
        """The per-event gauges, built from the current snapshot at export time.

        They are not SDK instruments on purpose: the SDK keeps every attribute set an
        asynchronous instrument ever reported (and caps them at 2000, then folds new ones into
        one overflow point), so per-event series keyed by EventId would grow for the life of
        the VM. Built here, a series exists exactly while its event is pending.
        """
        snap = self.snapshot
        now = self.wall()
        now_ns = int(now.timestamp() * 1e9)  # the injected clock, like everything else
        countdown = [
            NumberDataPoint(self._event_attrs(e, snap), 0, now_ns,
                            (e.not_before - now).total_seconds())
            for e in snap.events
            if e.not_before is not None and not e.is_started
        ]
        impact = [
            NumberDataPoint(self._event_attrs(e, snap), 0, now_ns, e.duration)
            for e in snap.events
            if e.duration >= 0
        ]
        m = "azure.scheduled_events."
        out = []
        if countdown:
            out.append(Metric(m + "time_to_not_before", "Seconds until NotBefore", "s",
                              Gauge(countdown)))
        if impact:
            out.append(Metric(m + "impact_duration",
                              "DurationInSeconds of pending events: the announced pause, not "
                              "how long the event stays Started (the platform's window, often "
                              "minutes)", "s",
                              Gauge(impact)))
        return out

    def publish(self, snapshot: GaugeSnapshot) -> None:
        """Replace what the gauges report (one reference swap; readers never see a half)."""
        self.snapshot = snapshot

    def shutdown(self, timeout: float) -> None:
        """Flush and stop the metric readers; a collector that is down must not fail the exit."""
        try:
            self.provider.shutdown(timeout_millis=max(timeout, 0.0) * 1000)
        except Exception as exc:  # the SDK raises when a reader's last export times out
            logging.getLogger(__name__).warning("metrics not flushed at shutdown: %s",
                                                str(exc).splitlines()[0][:200])

    # --- observable gauge callbacks (SDK reader thread) ---

    def _pending(self, _: CallbackOptions) -> Iterable[Observation]:
        snap = self.snapshot
        if not snap.events:
            return [Observation(0)]
        bound = self.labels
        counts = Counter(
            (bound("type", e.event_type), bound("status", e.status), bound("source", e.source),
             e.affects(snap.vm_name), e.event_id in snap.unannounced)
            for e in snap.events
        )
        # ``unannounced`` only on the rare unannounced events, as on the per-event gauges: the
        # unannounced alert keys on this series, which exists whatever DurationInSeconds says
        # (a host failure's Reboot often says -1, and has no impact_duration series).
        return [
            Observation(n, {"type": t, "status": s, "source": src, "affects_self": a,
                            **({"unannounced": True} if u else {})})
            for (t, s, src, a, u), n in counts.items()
        ]

    def _incarnation(self, _: CallbackOptions) -> Iterable[Observation]:
        inc = self.snapshot.incarnation
        return [] if inc is None else [Observation(inc)]

    def _staleness(self, _: CallbackOptions) -> Iterable[Observation]:
        last = self.snapshot.last_good_monotonic
        return [] if last is None else [Observation(self.monotonic() - last)]

    def _event_attrs(self, event: ScheduledEvent, snap: GaugeSnapshot) -> dict[str, str | bool]:
        attrs: dict[str, str | bool] = {
            P + "id": event.event_id,
            "type": self.labels("type", event.event_type),
            "affects_self": event.affects(snap.vm_name),
        }
        if event.event_id in snap.unannounced:
            # Present only on the rare unannounced event: the alert keys on it, others keep
            # their label set.
            attrs["unannounced"] = True
        return attrs
