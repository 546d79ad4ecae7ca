"""OTel ``MetricsData`` → a JSON-ready snapshot, for Event Hubs metrics messages.

The shape is ``{instrument name: [point, ...]}`` where a point is ``{"attributes", "value"}``
(gauges, counters; cumulative) or ``{"attributes", "count", "sum", "min", "max", "bounds",
"counts"}`` (histograms). The Log Analytics queries and dashboards read exactly this.
"""

from __future__ import annotations

from opentelemetry.sdk.metrics.export import HistogramDataPoint, MetricsData, NumberDataPoint


def snapshot_metrics(data: MetricsData) -> dict[str, list[dict[str, object]]]:
    """One entry per instrument with all its points and their attributes."""
    out: dict[str, list[dict[str, object]]] = {}
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                points = out.setdefault(metric.name, [])
                for point in metric.data.data_points:
                    entry: dict[str, object] = {"attributes": dict(point.attributes or {})}
                    if isinstance(point, NumberDataPoint):
                        entry["value"] = point.value
                    elif isinstance(point, HistogramDataPoint):
                        entry.update(
                            count=point.count,
                            sum=point.sum,
                            min=point.min,
                            max=point.max,
                            bounds=list(point.explicit_bounds),
                            counts=list(point.bucket_counts),
                        )
                    points.append(entry)
    return out
