"""A 60 s collector outage across transitions (the quick form of ``bench/outage.py``).

The one outage test through a process; the invariant for any pattern of failures is tested on
a scripted collector in tests/test_delivery_wait.py. The benchmark's own scenario, unchanged: a
real ``rotel`` collector stopped for 60 s while a transition step happens every 5 s, then
restarted. Asserted here: every transition arrives
exactly once after de-duplication by ``log.record.uid``, none missing, in the order produced;
polling kept its cadence during the outage; the exporter exits 0. The 10-minute figures are in
BENCHMARKS.md.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.timeout(400)
def test_60_s_collector_outage_loses_nothing_and_keeps_order() -> None:
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    outage = importlib.import_module("outage")
    data = outage.run(outage=60.0, baseline=20.0, step=5.0, quick=True)
    assert data["outage_seconds"] >= 60
    assert data["outage_records"] >= 30, data
    assert data["missing"] == [] and data["extra"] == [], data
    assert data["inconsistent_uids"] == 0
    assert data["unique"] == data["expected"], data
    assert data["per_event_ordered"] and data["arrival_in_production_order"], data
    assert data["polls_outage_per_s"] >= 0.9 * data["polls_baseline_per_s"], data
    assert data["pending_max"] >= data["outage_records"] - 3, data  # they waited in the spool
    assert data["exit_code"] == 0
