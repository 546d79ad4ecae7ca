"""The Log Analytics dashboard's counter panel ("IMDS requests by outcome") turns cumulative
snapshots into increases: its KQL is analysed by the Kusto language service with the other
dashboard queries; here the same arithmetic runs in Python over a made sequence of snapshots
(one per 300 s heartbeat, a restart in the middle) and must give the true increase per bin."""

from __future__ import annotations

import json
import random
from collections import defaultdict

from tests.consumption import consumption_helpers as ch

HEARTBEAT = 300
BIN = 600  # the dashboard's $__interval at a 12 h range is minutes; bins of two heartbeats


def panel_query() -> str:
    dashboard = json.loads((ch.GRAFANA_DIR / "scheduled-events-log-analytics.json").read_text())
    (panel,) = [p for p in dashboard["panels"] if p["title"] == "IMDS requests by outcome"]
    return str(panel["targets"][0]["azureLogAnalytics"]["query"])


def increases(snapshots: list[tuple[int, str, str, float]]) -> dict[tuple[int, str], float]:
    """The panel's arithmetic: order by VM, outcome, time; difference consecutive values of the
    same series (a drop means a restart: the value itself is the increase); sum per bin."""
    rows = sorted(snapshots, key=lambda r: (r[1], r[2], r[0]))
    out: dict[tuple[int, str], float] = defaultdict(float)
    previous: tuple[int, str, str, float] | None = None
    for row in rows:
        at, vm, outcome, value = row
        if previous is not None and previous[1:3] == (vm, outcome):
            gained = value - previous[3] if value >= previous[3] else value
            out[(at // BIN * BIN, outcome)] += gained
        previous = row
    return dict(out)


def test_the_panel_differences_consecutive_snapshots() -> None:
    query = panel_query()
    assert "prev(Value)" in query and "order by VmId asc, Outcome asc, TimeGenerated asc" in query
    assert "max(Value) - min(Value)" not in query


def test_increase_per_bin_equals_the_truth_across_a_restart() -> None:
    rng = random.Random(19)
    snapshots: list[tuple[int, str, str, float]] = []
    truth: dict[tuple[int, str], float] = defaultdict(float)
    for vm in ("vm1", "vm2", "vm3"):
        counters = {"ok": 0.0, "timeout": 0.0}
        for step in range(24):  # two hours of heartbeats
            at = step * HEARTBEAT + rng.randrange(0, 60)  # heartbeats are not aligned to bins
            if vm == "vm2" and step == 12:
                counters = {"ok": 0.0, "timeout": 0.0}  # the exporter restarted
            for outcome in counters:
                gained = float(rng.randrange(0, 300))
                counters[outcome] += gained
                if step > 0:  # the first snapshot's history is unknown to any query
                    truth[(at // BIN * BIN, outcome)] += gained
                snapshots.append((at, vm, outcome, counters[outcome]))
    got = increases(snapshots)
    assert got == {k: v for k, v in truth.items() if v or k in got}
    # The old panel (max - min per bin) lost every rise across a bin edge and every restart.
    old: dict[tuple[int, str], float] = defaultdict(float)
    per_bin: dict[tuple[int, str, str], list[float]] = defaultdict(list)
    for at, vm, outcome, value in snapshots:
        per_bin[(at // BIN * BIN, vm, outcome)].append(value)
    for (start, _, outcome), values in per_bin.items():
        old[(start, outcome)] += max(values) - min(values)
    assert sum(old.values()) < 0.7 * sum(truth.values())
