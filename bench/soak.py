"""Soak: 100 000 events through scheduled → started → completed, at speed, through a real collector.

The real exporter process polls the in-process :class:`Simulator` every 0.2 s
(``SEE_POLL_INTERVAL=0.2``) and exports over OTLP http/protobuf to a real ``rotel`` collector,
with metrics every 2 s (``OTEL_METRIC_EXPORT_INTERVAL=2000``). The driver feeds batches of 200
events; each document step holds the previous batch as ``Started`` and the new batch as
``Scheduled``, so every step yields 200 ``completed`` + 200 ``started`` + 200 ``scheduled``
transitions (600 records). The next step is made as soon as a poll has seen the current one; it
also waits while more than 4 000 records are on their way to the collector (the spool bound is
10 000), so the run measures the sustained, lossless rate.

Figures: transitions delivered (must be 3 per event, none dropped), throughput, exporter RSS
at the start (after the first 2 000 events) and at the end, exporter CPU, and the per-event
gauges ``azure.scheduled_events.time_to_not_before`` / ``impact_duration``: at checkpoints the
number of points in a metric export taken after a poll saw the document must equal the pending
events (200 Scheduled with a NotBefore / 400 pending), and 0 after the last event completed.
Points carrying ``otel.metric.overflow`` (the SDK's cardinality limit) are counted apart.

Quick mode: 5 000 events.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from benchlib import (
    SCHEDULED_EVENTS,
    ExporterProcess,
    SummaryRow,
    cpu_seconds,
    exporter_env,
    make_event,
    new_id,
    otlp_env,
    parse_args,
    print_table,
    rss_mib,
    save_results,
    temp_state_dir,
    wait_first_poll,
)

from scheduled_events_exporter.simulator import Simulator
from tests.peers.rotel import ReceivedMetric, RotelReceiver

BATCH = 200
MAX_BACKLOG = 4_000
INTERVAL = 0.2
METRIC_INTERVAL_MS = 2_000
TTNB = "azure.scheduled_events.time_to_not_before"
IMPACT = "azure.scheduled_events.impact_duration"
OVERFLOW = "otel.metric.overflow"
ID = "azure.scheduled_event.id"


def wait_seen(sim: Simulator, after: float, timeout: float = 60.0) -> float:
    """Wait for a Scheduled Events GET that arrived after monotonic ``after``; its wall time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in reversed(sim.requests):
            if entry.monotonic <= after:
                break
            if entry.method == "GET" and entry.path.startswith(SCHEDULED_EVENTS):
                return entry.wall
        time.sleep(0.02)
    raise RuntimeError("the exporter stopped polling")


def series(metric: ReceivedMetric | None) -> tuple[int, int]:
    """(per-event points, overflow points) of one exported metric (none exported: 0, 0)."""
    if metric is None:
        return 0, 0
    overflow = sum(1 for p in metric.points if p.attributes.get(OVERFLOW))
    return len(metric.points) - overflow, overflow


def gauge_check(rotel: RotelReceiver, seen_wall: float) -> dict[str, int]:
    """Points of the per-event gauges in the first metric export after ``seen_wall`` + 0.3 s."""
    cutoff = seen_wall + 0.3
    rotel.wait_for_metric(
        "azure.scheduled_events.pending",
        lambda m: m.arrival_time > cutoff,
        timeout=4 * METRIC_INTERVAL_MS / 1000,
    )
    time.sleep(0.3)  # the rest of the same export

    def latest(name: str) -> ReceivedMetric | None:
        found = [m for m in rotel.metrics if m.name == name and m.arrival_time > cutoff]
        return found[0] if found else None

    ttnb, ttnb_over = series(latest(TTNB))
    impact, impact_over = series(latest(IMPACT))
    ids = {
        p.attributes.get(ID)
        for m in rotel.metrics
        if m.name == IMPACT
        for p in m.points
        if not p.attributes.get(OVERFLOW)
    }
    return {
        "ids_exported": len(ids),
        "ttnb_points": ttnb,
        "ttnb_overflow": ttnb_over,
        "impact_points": impact,
        "impact_overflow": impact_over,
    }


def main() -> None:
    args = parse_args(__doc__.splitlines()[0] if __doc__ else "")
    total = 5_000 if args.quick else 100_000
    batches = total // BATCH
    checkpoints = {2, 10, batches // 4, batches // 2, batches - 1}
    with Simulator() as sim, RotelReceiver() as rotel, temp_state_dir() as state:
        env = exporter_env(
            sim.url,
            state,
            SEE_POLL_INTERVAL=f"{INTERVAL:g}",
            **otlp_env(rotel.http_endpoint, "http/protobuf", METRIC_INTERVAL_MS),
        )
        with ExporterProcess(env) as proc:
            pid = proc.proc.pid
            wait_first_poll(sim)
            time.sleep(1.0)
            rss_idle = rss_mib(pid)
            cpu0, t0 = cpu_seconds(pid), time.monotonic()
            rss_series: list[tuple[int, float]] = []
            checks: list[dict[str, Any]] = []
            rss_warm = rss_half = float("nan")
            expected = 0
            previous: list[dict[str, object]] = []
            for step in range(batches + 2):
                fresh = (
                    [make_event(new_id(), vm_name=sim.vm_name, index=i) for i in range(BATCH)]
                    if step < batches
                    else []
                )
                started = [{**e, "EventStatus": "Started", "NotBefore": ""} for e in previous]
                # Removed (completed): the batch that was Started in the previous document.
                sim.clear_requests()
                sim.set_events([*started, *fresh])
                seen = wait_seen(sim, time.monotonic())
                expected += len(fresh) + len(started) + (BATCH if step >= 2 else 0)
                previous = fresh
                while expected - len(rotel.logs) > MAX_BACKLOG:
                    time.sleep(0.05)
                if step in checkpoints:
                    check = gauge_check(rotel, seen)
                    check.update(
                        step=step,
                        distinct_events=BATCH * (step + 1),
                        expected_ttnb=len(fresh),
                        expected_impact=len(fresh) + len(started),
                    )
                    checks.append(check)
                    print(f"step {step}: {check}", flush=True)
                if step % 25 == 0:
                    rss_series.append((step, rss_mib(pid)))
                    print(
                        f"step {step}/{batches + 2}: {expected} records expected, "
                        f"{len(rotel.logs)} received, RSS {rss_series[-1][1]:.1f} MiB",
                        flush=True,
                    )
                if step == 10:
                    rss_warm = rss_mib(pid)
                if step == batches // 2:
                    rss_half = rss_mib(pid)
            rotel.wait_for_logs(count=expected, timeout=300)
            t_done = time.monotonic()
            cpu1 = cpu_seconds(pid)
            final = gauge_check(rotel, time.time())
            final.update(
                step=batches + 2, distinct_events=total, expected_ttnb=0, expected_impact=0
            )
            checks.append(final)
            time.sleep(1.0)
            rss_end = rss_mib(pid)
            status = proc.stderr()
            proc.terminate()
        logs = rotel.logs
    kinds = Counter(r.event_name.rsplit(".", 1)[-1] for r in logs)
    ids = Counter((r.attributes.get("azure.scheduled_event.id"), r.event_name) for r in logs)
    duplicates = sum(c - 1 for c in ids.values() if c > 1)
    elapsed = t_done - t0
    delivered = len(logs)
    ok_kinds = kinds["scheduled"] == kinds["started"] == kinds["completed"] == total
    gauges_ok = all(
        c["ttnb_points"] == c["expected_ttnb"]
        and c["impact_points"] == c["expected_impact"]
        and c["ttnb_overflow"] == c["impact_overflow"] == 0
        for c in checks
    )
    print_table(
        f"Soak: {total} events x 3 transitions, OTLP http/protobuf to rotel, poll {INTERVAL:g} s",
        ["figure", "value"],
        [
            ["transitions expected", 3 * total],
            ["log records delivered", delivered],
            [
                "scheduled / started / completed",
                f"{kinds['scheduled']} / {kinds['started']} / {kinds['completed']}",
            ],
            [
                "other transitions",
                delivered - sum(kinds[k] for k in ("scheduled", "started", "completed")),
            ],
            ["duplicate records", duplicates],
            ["elapsed s", elapsed],
            ["transitions / s", delivered / elapsed],
            ["exporter CPU s", cpu1 - cpu0],
            ["exporter CPU ms / transition", 1000 * (cpu1 - cpu0) / max(1, delivered)],
            ["RSS idle (before events) MiB", rss_idle],
            ["RSS after 2 200 events MiB", rss_warm],
            ["RSS end MiB", rss_end],
            ["RSS half way MiB", rss_half],
            ["RSS growth after 2 200 events -> end MiB", rss_end - rss_warm],
            ["RSS growth half way -> end MiB", rss_end - rss_half],
        ],
    )
    print_table(
        "Per-event gauge series in a metric export after the document was seen",
        [
            "step",
            "events fed",
            "ids exported so far",
            "time_to_not_before points",
            "expected",
            "overflow",
            "impact_duration points",
            "expected",
            "overflow",
        ],
        [
            [
                c["step"],
                c["distinct_events"],
                c["ids_exported"],
                c["ttnb_points"],
                c["expected_ttnb"],
                c["ttnb_overflow"],
                c["impact_points"],
                c["expected_impact"],
                c["impact_overflow"],
            ]
            for c in checks
        ],
    )
    summary = [
        SummaryRow(
            "soak",
            f"transitions delivered ({total} events)",
            f"= {3 * total}, 0 dup",
            f"{delivered} ({duplicates} dup)",
            f"{3 * total}",
            f"{delivered / (3 * total):.3f}",
            delivered == 3 * total and ok_kinds and duplicates == 0,
        ),
        SummaryRow(
            "soak",
            "RSS idle / after 2 200 events / half way / end (MiB)",
            "-",
            f"{rss_idle:.1f} / {rss_warm:.1f} / {rss_half:.1f} / {rss_end:.1f}",
            f"idle {rss_idle:.1f}",
            f"{rss_end / rss_idle:.2f}x idle",
            None,
        ),
        SummaryRow(
            "soak",
            "RSS growth half way -> end (MiB)",
            "-",
            f"{rss_end - rss_half:+.1f}",
            "0",
            "-",
            None,
        ),
        SummaryRow(
            "soak",
            "per-event gauge points = pending (ttnb, impact at each checkpoint)",
            "equal, 0 overflow",
            "; ".join(
                f"{c['ttnb_points']}+{c['ttnb_overflow']}ovf/{c['expected_ttnb']}, "
                f"{c['impact_points']}+{c['impact_overflow']}ovf/{c['expected_impact']}"
                for c in checks
                if c is not final
            ),
            "-",
            "-",
            gauges_ok,
        ),
        SummaryRow(
            "soak",
            "per-event gauge points at the end (ttnb / impact)",
            "0 / 0",
            f"{final['ttnb_points'] + final['ttnb_overflow']} / "
            f"{final['impact_points'] + final['impact_overflow']}",
            "-",
            "-",
            final["ttnb_points"]
            + final["ttnb_overflow"]
            + final["impact_points"]
            + final["impact_overflow"]
            == 0,
        ),
        SummaryRow(
            "soak",
            "throughput (transitions/s)",
            "-",
            f"{delivered / elapsed:.0f}",
            "-",
            "-",
            None,
        ),
    ]
    save_results(
        "soak",
        {
            "quick": args.quick,
            "events": total,
            "delivered": delivered,
            "kinds": dict(kinds),
            "duplicates": duplicates,
            "elapsed": elapsed,
            "cpu_s": cpu1 - cpu0,
            "rss_idle": rss_idle,
            "rss_warm": rss_warm,
            "rss_half": rss_half,
            "rss_end": rss_end,
            "rss_series": rss_series,
            "checks": checks,
            "stderr_tail": status[-2000:],
        },
        summary,
    )


if __name__ == "__main__":
    main()
