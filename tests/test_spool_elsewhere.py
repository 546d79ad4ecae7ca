"""Records a sink left in its spool when SEE_SINKS no longer names it are reported at start,
not forgotten in silence (they wait there until the sink is configured again)."""

from __future__ import annotations

from pathlib import Path

from scheduled_events_exporter.delivery.spool import Spool, waiting_elsewhere
from tests.test_delivery_wait import record


def test_a_spool_of_a_sink_no_longer_configured_is_found_with_its_count(tmp_path: Path) -> None:
    spool = Spool(tmp_path, "otlp")
    spool.append([record(1), record(2), record(3)])
    spool.ack(1)
    Spool(tmp_path, "console").append([record(1)])
    assert waiting_elsewhere(tmp_path, ["console"]) == [("otlp", 2)]
    assert waiting_elsewhere(tmp_path, ["otlp", "console"]) == []
    spool.ack(3)  # all delivered: nothing waits
    assert waiting_elsewhere(tmp_path, ["console"]) == []
    assert waiting_elsewhere(tmp_path / "missing", ["console"]) == []
