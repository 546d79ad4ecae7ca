"""OTel ``MetricsData`` → plain JSON-ready lists, for snapshot messages."""

from __future__ import annotations

from opentelemetry.sdk.metrics.export import (
    Gauge,
    Histogram,
    HistogramDataPoint,
    MetricsData,
    NumberDataPoint,
    Sum,
)


def snapshot_metrics(data: MetricsData) -> list[dict[str, object]]:
    """One entry per metric: name, unit, kind and points with their attributes."""
    out: list[dict[str, object]] = []
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                kind = {Gauge: "gauge", Sum: "sum", Histogram: "histogram"}.get(
                    type(metric.data), type(metric.data).__name__.lower()
                )
                points: list[dict[str, object]] = []
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
                out.append(
                    {"name": metric.name, "unit": metric.unit, "kind": kind, "points": points}
                )
    return out
