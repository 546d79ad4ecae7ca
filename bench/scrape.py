"""What the Prometheus scrape endpoint (``OTEL_METRICS_EXPORTER=prometheus``) costs.

* Resident memory: ``SEE_SINKS=console`` exporters with and without ``prometheus``, each a fresh
  process against one in-process :class:`Simulator` with one pending event, ``VmRSS`` read after
  the endpoint answered 3 scrapes (without it: after the same wait). Median of N processes each.
* Import time: ``python -c "import scheduled_events_exporter.app"`` (the baseline: what every
  run imports) against the same plus ``scheduled_events_exporter.scrape`` (prometheus_client and
  the SDK's Prometheus exporter), wall time of fresh processes, median of N.
* Scrape latency: one in-process endpoint, GET ``/metrics`` with 0 (baseline), 10, 100 and 1000
  pending events (each adds two per-event series), median and p95 over M scrapes.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timedelta, timezone
from typing import Any

from benchlib import (
    SummaryRow,
    exporter_env,
    make_event,
    median,
    parse_args,
    percentile,
    print_table,
    rss_mib,
    save_results,
    temp_state_dir,
)

from scheduled_events_exporter.model import ScheduledEvent
from scheduled_events_exporter.scrape import ScrapeEndpoint
from scheduled_events_exporter.simulator import Simulator
from scheduled_events_exporter.telemetry import GaugeSnapshot, Telemetry
from tests.exporter_process import ExporterProcess, free_port, wait_until


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        return bytes(response.read())


def rss_run(sim: Simulator, prometheus: bool) -> float:
    values = {"SEE_SINKS": "console"}
    port = free_port()
    if prometheus:
        values.update(OTEL_METRICS_EXPORTER="prometheus",
                      OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
                      OTEL_EXPORTER_PROMETHEUS_PORT=str(port))
    with temp_state_dir() as state, ExporterProcess(exporter_env(sim.url, state, **values)) as p:
        p.wait_for_records(1, 30)
        if prometheus:
            wait_until(lambda: _answers(f"http://127.0.0.1:{port}/metrics"), 30, "the endpoint")
            for _ in range(3):
                get(f"http://127.0.0.1:{port}/metrics")
        else:
            time.sleep(0.5)  # the same settling time the three scrapes take, roughly
        rss = rss_mib(p.proc.pid)
        p.terminate()
    return rss


def _answers(url: str) -> bool:
    try:
        get(url)
    except OSError:
        return False
    return True


def import_seconds(modules: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import {modules}"], check=True)
    return time.perf_counter() - start


def scrape_latency(events: int, scrapes: int) -> tuple[float, float, int]:
    now = datetime.now(timezone.utc)
    endpoint = ScrapeEndpoint("127.0.0.1", 0)
    telemetry = Telemetry(readers=endpoint.metric_readers())
    endpoint.start(telemetry.per_event_metrics)
    telemetry.publish(GaugeSnapshot(
        events=tuple(ScheduledEvent(f"E{i}", "Scheduled", event_type="Freeze",
                                    resources=("vm",), not_before=now + timedelta(minutes=10),
                                    source="Platform", duration=5) for i in range(events)),
        vm_name="vm", incarnation=1, last_good_monotonic=time.monotonic()))
    url = f"http://127.0.0.1:{endpoint.port}/metrics"
    size = len(get(url))
    times = []
    for _ in range(scrapes):
        start = time.perf_counter()
        get(url)
        times.append((time.perf_counter() - start) * 1000)
    endpoint.stop()
    telemetry.shutdown(1)
    return median(times), percentile(times, 95), size


def main() -> None:
    args = parse_args(__doc__.splitlines()[0] if __doc__ else "")
    runs = 3 if args.quick else 7
    scrapes = 30 if args.quick else 200
    data: dict[str, Any] = {"quick": args.quick}
    with Simulator(vm_name="vm-bench") as sim:
        sim.set_events([make_event("BENCH-1", vm_name="vm-bench")])
        rss = {name: [rss_run(sim, flag) for _ in range(runs)]
               for name, flag in (("console", False), ("console+prometheus", True))}
    data["rss_mib"] = rss
    base_rss, prom_rss = median(rss["console"]), median(rss["console+prometheus"])
    imports = {
        "app": [import_seconds("scheduled_events_exporter.app") for _ in range(runs)],
        "app+scrape": [import_seconds("scheduled_events_exporter.app, "
                                      "scheduled_events_exporter.scrape") for _ in range(runs)],
    }
    data["import_s"] = imports
    base_imp, prom_imp = median(imports["app"]), median(imports["app+scrape"])
    latency = {n: scrape_latency(n, scrapes) for n in (0, 10, 100, 1000)}
    data["scrape_ms"] = latency
    print_table(f"Scrape endpoint cost, median of {runs} processes", ["measure", "baseline",
                "with prometheus", "difference", "ratio"], [
        ["RSS (MiB)", base_rss, prom_rss, prom_rss - base_rss, prom_rss / base_rss],
        ["import (s)", base_imp, prom_imp, prom_imp - base_imp, prom_imp / base_imp],
    ])
    base_ms = latency[0][0]
    print_table(f"GET /metrics, {scrapes} scrapes each", ["pending events", "median ms",
                "p95 ms", "bytes", "x 0 events"],
                [[n, m, p, size, m / base_ms] for n, (m, p, size) in latency.items()])
    summary = [
        SummaryRow("scrape", "RSS console+prometheus, median (MiB)", "-", f"{prom_rss:.1f}",
                   f"console {base_rss:.1f}", f"{prom_rss / base_rss:.2f}", None),
        SummaryRow("scrape", "GET /metrics, 100 pending events, median (ms)", "-",
                   f"{latency[100][0]:.2f}", f"0 events {base_ms:.2f}",
                   f"{latency[100][0] / base_ms:.2f}", None),
    ]
    save_results("scrape", data, summary)


if __name__ == "__main__":
    main()
