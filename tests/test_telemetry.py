"""Telemetry mapping: per-event series live exactly while their event is pending."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)

from scheduled_events_exporter.model import InstanceInfo, ScheduledEvent
from scheduled_events_exporter.telemetry import (
    ExtraMetrics,
    GaugeSnapshot,
    Telemetry,
    add_metrics,
    build_resource,
)

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


class Capture(MetricExporter):
    """Keeps what it is asked to export, with the per-event gauges every metric exporter of the
    exporter appends (the SDK ships no in-memory exporter)."""

    def __init__(self, extra: ExtraMetrics = list) -> None:
        super().__init__()
        self.exports: list[MetricsData] = []
        self._extra = extra

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs: Any) -> MetricExportResult:
        self.exports.append(add_metrics(metrics_data, self._extra()))
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        return None


def points(exporter: Capture, name: str) -> list[dict[str, object]]:
    data = exporter.exports[-1]
    return [
        {**dict(p.attributes or {}), "value": p.value}
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == name
        for p in m.data.data_points
    ]


def test_per_event_series_never_accumulate_past_the_sdk_cardinality_limit() -> None:
    telemetry: Telemetry
    inner = Capture(extra=lambda: telemetry.per_event_metrics())
    reader = PeriodicExportingMetricReader(inner, export_interval_millis=10**9)
    telemetry = Telemetry(readers=[reader], wall=lambda: NOW)
    try:
        # More distinct events over a VM's life than the SDK's 2000 attribute sets per
        # instrument: each export must still show exactly the events pending right then.
        for i in range(2100):
            event = ScheduledEvent(f"E{i}", "Scheduled", event_type="Freeze",
                                   resources=("vm",), not_before=NOW + timedelta(seconds=60),
                                   duration=5)
            telemetry.publish(GaugeSnapshot(events=(event,), vm_name="vm"))
            reader.collect()
        countdown = points(inner, "azure.scheduled_events.time_to_not_before")
        assert countdown == [{"azure.scheduled_event.id": "E2099", "type": "Freeze",
                              "affects_self": True, "value": 60.0}]
        assert points(inner, "azure.scheduled_events.impact_duration")[0]["value"] == 5
        telemetry.publish(GaugeSnapshot(events=(), vm_name="vm"))
        reader.collect()
        assert points(inner, "azure.scheduled_events.time_to_not_before") == []
        assert points(inner, "azure.scheduled_events.pending") == [{"value": 0}]
    finally:
        telemetry.shutdown(1.0)


def test_resource_names_the_vm_and_lets_the_environment_override_the_platform(
        monkeypatch: pytest.MonkeyPatch) -> None:
    instance = InstanceInfo(vm_name="aks-pool-1_3", vm_id="vm-id-1",
                            resource_group="MC_rg_cluster_westeurope", region="westeurope")
    attrs = build_resource(instance).attributes
    assert (attrs["cloud.platform"], attrs["azure.resource_group.name"], attrs["host.id"]) == (
        "azure.vm", "MC_rg_cluster_westeurope", "vm-id-1")
    # What the Helm chart sets from the downward API: it adds to and overrides ours.
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES",
                       "cloud.platform=azure.aks,k8s.node.name=aks-pool-1-vmss000003,"
                       "k8s.pod.name=see-abcde,k8s.namespace.name=scheduled-events")
    attrs = build_resource(instance).attributes
    assert attrs["cloud.platform"] == "azure.aks"
    assert (attrs["k8s.node.name"], attrs["k8s.pod.name"], attrs["k8s.namespace.name"]) == (
        "aks-pool-1-vmss000003", "see-abcde", "scheduled-events")
    assert "azure.resource_group.name" not in build_resource(InstanceInfo()).attributes
