"""Documents as large as the parser accepts fit the shipped memory limits, and a flapping huge
event with the collector down stays bounded in memory and on disk (docs/security.md)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from scheduled_events_exporter.parser import MAX_DOCUMENT_BYTES, MAX_EVENTS
from scheduled_events_exporter.simulator import Simulator
from tests.exporter_process import (
    ExporterProcess,
    clean_env,
    free_port,
    get_json,
    state_dir,
    wait_until,
)
from tests.test_hostile import event

REPO = Path(__file__).resolve().parents[1]
#: The DaemonSet's and sidecar's limit, and the systemd unit's MemoryMax (192 MiB).
SHIPPED_LIMIT_MB = 192.0


def shipped_limit_mb() -> float:
    chart = yaml.safe_load((REPO / "charts" / "azure-scheduled-events-exporter" /
                            "values.yaml").read_text())
    assert chart["resources"]["limits"] == {"cpu": "200m", "memory": "192Mi"}
    assert "MemoryMax=192M" in (REPO / "config" / "systemd" /
                                "scheduled-events-exporter.service").read_text()
    return SHIPPED_LIMIT_MB


@contextmanager
def peak_rss(pid: int) -> Iterator[list[float]]:
    """Samples VmRSS every 50 ms; yields [peak MB]."""
    peak = [0.0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        peak[0] = max(peak[0], int(line.split()[1]) / 1024)
            except OSError:
                pass
            stop.wait(0.05)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        stop.set()
        thread.join()


@pytest.mark.timeout(180)
def test_the_largest_accepted_documents_fit_the_shipped_limit(tmp_path: Path) -> None:
    limit = shipped_limit_mb()
    big_strings = [event("BIG", Resources=[f"r{j}-" + "x" * 8000 for j in range(450)])]
    assert len(json.dumps({"DocumentIncarnation": 1, "Events": big_strings})) < MAX_DOCUMENT_BYTES
    with Simulator(vm_name="vm-test") as sim:
        env = clean_env(SEE_IMDS_ENDPOINT=sim.url, SEE_SINKS="console",
                        SEE_STATE_DIR=state_dir(tmp_path), SEE_HEALTH_ADDR="",
                        SEE_POLL_INTERVAL="0.5", SEE_LOG_LEVEL="warning")
        with ExporterProcess(env) as proc, peak_rss(proc.proc.pid) as peak:
            sim.set_events([event(f"E{i}", Resources=[f"vm-{i}"]) for i in range(MAX_EVENTS)])
            proc.wait_for_records(MAX_EVENTS, 120)
            sim.set_events(big_strings)  # 2000 removals and one 3.7 MB event
            proc.wait_for_records(2 * MAX_EVENTS + 1, 120)
            sim.set_events([event(f"T{i}") for i in range(MAX_EVENTS + 1)])  # refused whole
            proc.wait_for(lambda: "expected at most 2000" in proc.stderr(), 30, "the refusal")
            assert proc.proc.poll() is None
    assert peak[0] < limit - 32, f"peak RSS {peak[0]:.0f} MB against a {limit:.0f} MB limit"


@pytest.mark.timeout(180)
def test_a_flapping_4_mb_event_with_the_collector_down_stays_bounded(tmp_path: Path) -> None:
    health = free_port()
    dead_collector = f"http://127.0.0.1:{free_port()}"
    with Simulator(vm_name="vm-test") as sim:
        env = clean_env(SEE_IMDS_ENDPOINT=sim.url, SEE_SINKS="otlp",
                        SEE_STATE_DIR=state_dir(tmp_path), SEE_HEALTH_ADDR=f"127.0.0.1:{health}",
                        SEE_POLL_INTERVAL="0.3", SEE_LOG_LEVEL="warning",
                        SEE_SPOOL_MAX_BYTES=str(16 * 1024 * 1024),
                        OTEL_EXPORTER_OTLP_ENDPOINT=dead_collector, OTEL_EXPORTER_OTLP_TIMEOUT="1",
                        OTEL_METRICS_EXPORTER="none")
        with ExporterProcess(env) as proc, peak_rss(proc.proc.pid) as peak:
            def up() -> bool:
                try:
                    return get_json(f"http://127.0.0.1:{health}/healthz")[0] == 200
                except OSError:
                    return False

            wait_until(up, 20, "the health server")
            started = time.monotonic()
            flips = 0
            while time.monotonic() - started < 40:
                flips += 1
                sim.set_events([event("HUGE", Description=str(flips),
                                      Resources=[f"r{j}-" + "y" * 8000 for j in range(450)])])
                asked = time.monotonic()
                status, body = get_json(f"http://127.0.0.1:{health}/readyz", timeout=5)
                assert time.monotonic() - asked < 2, "/readyz answered slowly"
                assert status in (200, 503) and "sinks" in body
                time.sleep(0.6)
            spool_bytes = sum(p.stat().st_size for p in (tmp_path / "state").rglob("*")
                              if p.is_file())
            dropped = body["sinks"]["otlp"]["dropped"]
    assert flips > 30 and dropped > 0, (flips, body)
    # Before the byte bound: 4 MB more memory and spool per change, without end.
    assert peak[0] < SHIPPED_LIMIT_MB - 48, f"peak RSS {peak[0]:.0f} MB"
    assert spool_bytes < 48 * 1024 * 1024, f"state directory {spool_bytes} bytes"
