"""OTel ``MetricsData`` → a JSON-ready snapshot, for Event Hubs metrics messages.

The shape is ``{instrument name: [point, ...]}`` where a point is ``{"attributes", "value"}``
(gauges, counters; cumulative) or ``{"attributes", "count", "sum", "min", "max", "bounds",
"counts"}`` (histograms). The Log Analytics queries and dashboards read exactly this.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping

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


def _dump(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def snapshot_bodies(
    header: Mapping[str, object],
    metrics: Mapping[str, list[dict[str, object]]],
    max_bytes: int,
) -> list[bytes]:
    """The snapshot as one or more JSON bodies of at most ``max_bytes`` each.

    Each body repeats ``header`` (with its own ``RecordId``) and carries a share of the points;
    hundreds of pending events in a large availability set would otherwise exceed what Log
    Analytics ingests per message. Sizes are summed per point, so splitting stays linear.
    """
    base = len(_dump({**header, "RecordId": str(uuid.uuid4()), "Metrics": {}}))
    parts: list[dict[str, list[dict[str, object]]]] = [{}]
    size = base
    for name, points in metrics.items():
        name_cost = len(_dump(name)) + 4
        for point in points:
            extra = len(_dump(point)) + 1 + (0 if name in parts[-1] else name_cost)
            if size + extra > max_bytes and parts[-1]:
                parts.append({})
                size = base
                extra = len(_dump(point)) + 1 + name_cost
            parts[-1].setdefault(name, []).append(point)
            size += extra
    return [_dump({**header, "RecordId": str(uuid.uuid4()), "Metrics": part}) for part in parts]
