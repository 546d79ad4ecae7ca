"""OTel ``MetricsData`` → a JSON-ready snapshot, for Event Hubs metrics messages.

The message's top-level fields are ``TimeGenerated, RecordKind ("metrics"), VmId, VmName,
ExporterVersion, RecordId, Metrics``. ``Metrics`` is ``{instrument name: [point, ...]}``
(cumulative counters), where a point is

* ``{"attributes": {...}, "value": v}`` for gauges and counters;
* ``{"attributes": {...}, "count": n, "sum": s, "min": a, "max": b, "buckets": {"le": n}}``
  for histograms, where ``buckets`` holds only the non-empty buckets, keyed by their upper
  bound as text (``"+Inf"`` for the last), with the count of that bucket alone (not cumulative).

``attributes`` is left out when a point has none, and floats keep 6 significant digits: an idle
snapshot is about 0.6 KB instead of 1.1 KB with every empty bucket and bound spelled out. The
Log Analytics queries read ``Metrics["name"]`` points' ``value`` and ``attributes``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping

from opentelemetry.sdk.metrics.export import HistogramDataPoint, MetricsData, NumberDataPoint

#: Significant digits kept in float values (durations to the microsecond, counts exact).
DIGITS = 6


def _num(value: float | int | None) -> float | int | None:
    if isinstance(value, float):
        short = float(f"{value:.{DIGITS}g}")
        return int(short) if short.is_integer() and abs(short) < 2**53 else short
    return value


def _buckets(point: HistogramDataPoint) -> dict[str, int]:
    bounds = [f"{b:g}" for b in point.explicit_bounds] + ["+Inf"]
    return {le: n for le, n in zip(bounds, point.bucket_counts, strict=False) if n}


def snapshot_metrics(data: MetricsData) -> dict[str, list[dict[str, object]]]:
    """One entry per instrument with all its points (see the module docstring for the shape)."""
    out: dict[str, list[dict[str, object]]] = {}
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                points = out.setdefault(metric.name, [])
                for point in metric.data.data_points:
                    entry: dict[str, object] = {}
                    if point.attributes:
                        entry["attributes"] = dict(point.attributes)
                    if isinstance(point, NumberDataPoint):
                        entry["value"] = _num(point.value)
                    elif isinstance(point, HistogramDataPoint):
                        entry.update(count=point.count, sum=_num(point.sum), min=_num(point.min),
                                     max=_num(point.max), buckets=_buckets(point))
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
