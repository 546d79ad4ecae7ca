"""Collector outage: 10 minutes without a collector while transitions keep coming.

The real exporter process (``SEE_SINKS=otlp``, http/protobuf, poll every 1 s, state directory
on disk) polls the in-process :class:`Simulator`; a real ``rotel`` collector receives. Every
``STEP`` seconds the document changes: event *i* appears (``scheduled``), event *i-1* starts
(``started``) and event *i-2* disappears (``completed``), so transitions keep arriving at a
steady rate throughout.

Phases, in one run:

1. **baseline**, collector up, ``BASELINE`` seconds of steps: records arrive as they happen
   (delivery delay per record, exporter CPU per minute, RSS);
2. **outage**, the collector is stopped (connection refused) for ``OUTAGE`` seconds while the
   steps go on: polls must keep their cadence, records wait in the spool (``/readyz`` pending
   count), CPU per minute and RSS are measured against the baseline;
3. **recovery**, the collector restarts on the same ports: time until every record of the
   outage arrived (drain time).

Checks: every expected transition exactly once after de-duplication by ``log.record.uid``
(duplicates counted), none missing, per event in lifecycle order, and all records in the order
the exporter produced them (their timestamps never go backwards in arrival order).

Full mode: ``OUTAGE`` = 600 s, ``BASELINE`` = 60 s, ``STEP`` = 10 s. Quick mode (and the test in
``tests/test_outage.py``): 60 s, 20 s, 5 s.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from benchlib import (
    SCHEDULED_EVENTS,
    ExporterProcess,
    SummaryRow,
    cpu_seconds,
    exporter_env,
    make_event,
    median,
    otlp_env,
    parse_args,
    percentile,
    print_table,
    rss_mib,
    save_results,
    temp_state_dir,
    wait_first_poll,
)

from scheduled_events_exporter.simulator import Simulator
from tests.exporter_process import get_json
from tests.peers.rotel import ReceivedLog, RotelReceiver

ID = "azure.scheduled_event.id"
UID = "log.record.uid"
ORDER = {"scheduled": 0, "started": 1, "completed": 2}


def step_document(i: int) -> list[dict[str, object]]:
    """Event i Scheduled, event i-1 Started (events i-2 and older are gone)."""
    events = [make_event(f"EV-{i:04d}", "Scheduled")]
    if i >= 1:
        events.insert(0, make_event(f"EV-{i - 1:04d}", "Started"))
    return events


def expected_after(steps: int) -> list[tuple[str, str]]:
    """The transitions of ``steps`` steps (0..steps-1) once the last document was seen."""
    out: list[tuple[str, str]] = []
    for i in range(steps):
        if i >= 2:
            out.append((f"EV-{i - 2:04d}", "completed"))
        if i >= 1:
            out.append((f"EV-{i - 1:04d}", "started"))
        out.append((f"EV-{i:04d}", "scheduled"))
    return out


def key(log: ReceivedLog) -> tuple[str, str]:
    return str(log.attributes[ID]), log.event_name.rsplit(".", 1)[1]


def run(outage: float, baseline: float, step: float, quick: bool) -> dict[str, Any]:
    with temp_state_dir() as state, Simulator(vm_name="vm-bench") as sim, \
            RotelReceiver() as rotel:
        env = exporter_env(sim.url, state, **otlp_env(rotel.http_endpoint, "http/protobuf"),
                           SEE_POLL_INTERVAL="1", OTEL_EXPORTER_OTLP_TIMEOUT="5")
        health = f"http://{env['SEE_HEALTH_ADDR']}"
        with ExporterProcess(env) as proc:
            wait_first_poll(sim)
            pid = proc.proc.pid
            i = 0
            changed_at: dict[tuple[str, str], float] = {}

            def do_step() -> None:
                nonlocal i
                sim.set_events(step_document(i))
                now = time.time()
                for k in expected_after(i + 1)[len(expected_after(i)):]:
                    changed_at[k] = now
                i += 1

            def play(seconds: float, sample: list[dict[str, Any]]) -> None:
                end = time.monotonic() + seconds
                next_step = time.monotonic()
                while time.monotonic() < end:
                    if time.monotonic() >= next_step:
                        do_step()
                        next_step += step
                    status, body = get_json(f"{health}/readyz")
                    sample.append({"t": time.monotonic(), "ready": status == 200,
                                   "pending": body["spool_depth"], "rss": rss_mib(pid)})
                    time.sleep(min(1.0, max(0.0, min(end, next_step) - time.monotonic())))

            # 1. baseline
            base_samples: list[dict[str, Any]] = []
            cpu0, t0 = cpu_seconds(pid), time.monotonic()
            polls0 = len([r for r in sim.requests if r.path.startswith(SCHEDULED_EVENTS)])
            play(baseline, base_samples)
            base_cpu_per_min = (cpu_seconds(pid) - cpu0) / (time.monotonic() - t0) * 60
            base_expected = expected_after(i)
            rotel.wait_for_logs(count=len(base_expected), timeout=60)
            base_delays = [log.arrival_time - changed_at[key(log)] for log in rotel.logs
                           if key(log) in changed_at]
            polls_base = len([r for r in sim.requests if r.path.startswith(SCHEDULED_EVENTS)])
            polls_base -= polls0

            # 2. outage
            rotel.stop()
            out_samples: list[dict[str, Any]] = []
            cpu1, t1 = cpu_seconds(pid), time.monotonic()
            polls1 = len([r for r in sim.requests if r.path.startswith(SCHEDULED_EVENTS)])
            steps_before = i
            play(outage, out_samples)
            out_seconds = time.monotonic() - t1
            out_cpu_per_min = (cpu_seconds(pid) - cpu1) / out_seconds * 60
            polls_out = len([r for r in sim.requests if r.path.startswith(SCHEDULED_EVENTS)])
            polls_out -= polls1
            time.sleep(2)  # the last step's poll
            # 3. recovery
            expected = expected_after(i)
            restarted = time.time()
            rotel.start()
            received = rotel.wait_for_logs(count=len(expected), timeout=max(120, outage))
            deadline = time.monotonic() + 10
            while len({str(r.attributes[UID]) for r in rotel.logs}) < len(expected) and \
                    time.monotonic() < deadline:
                time.sleep(0.2)
            received = list(rotel.logs)
            last_arrival = max(r.arrival_time for r in received)
            drain = last_arrival - restarted
            rss_end = rss_mib(pid)
            code = proc.terminate()

    unique: dict[str, tuple[str, str]] = {}
    inconsistent = 0
    for log in received:
        if unique.setdefault(str(log.attributes[UID]), key(log)) != key(log):
            inconsistent += 1
    got = list(unique.values())
    missing = [k for k in expected if k not in got]
    extra = [k for k in got if k not in expected]
    per_event_ordered = all(
        [ORDER[t] for e, t in got if e == event] == sorted(ORDER[t] for e, t in got if e == event)
        for event in {e for e, _ in got})
    first: dict[str, int] = {}
    for log in received:  # first arrival of each record
        first.setdefault(str(log.attributes[UID]), log.timestamp_ns)
    stamps = list(first.values())
    in_order = all(a <= b for a, b in itertools.pairwise(stamps))
    outage_records = len(expected_after(i)) - len(expected_after(steps_before))
    return {
        "quick": quick,
        "outage_seconds": round(out_seconds, 1),
        "baseline_seconds": baseline,
        "step_seconds": step,
        "expected": len(expected),
        "outage_records": outage_records,
        "received": len(received),
        "unique": len(got),
        "duplicates": len(received) - len(got),
        "inconsistent_uids": inconsistent,
        "missing": missing,
        "extra": extra,
        "per_event_ordered": per_event_ordered,
        "arrival_in_production_order": in_order,
        "drain_seconds": round(drain, 2),
        "baseline_delay_median_s": round(median(base_delays), 3) if base_delays else None,
        "baseline_delay_p95_s": round(percentile(base_delays, 95), 3) if base_delays else None,
        "polls_baseline_per_s": round(polls_base / baseline, 3),
        "polls_outage_per_s": round(polls_out / out_seconds, 3),
        "cpu_s_per_min_baseline": round(base_cpu_per_min, 3),
        "cpu_s_per_min_outage": round(out_cpu_per_min, 3),
        "rss_mib_baseline_end": round(base_samples[-1]["rss"], 1),
        "rss_mib_outage_max": round(max(s["rss"] for s in out_samples), 1),
        "rss_mib_end": round(rss_end, 1),
        "pending_max": max(s["pending"] for s in out_samples),
        "ready_during_outage_fraction": round(
            sum(s["ready"] for s in out_samples) / len(out_samples), 3),
        "exit_code": code,
    }


def main() -> None:
    args = parse_args(__doc__ or "")
    outage, baseline, step = (60.0, 20.0, 5.0) if args.quick else (600.0, 60.0, 10.0)
    data = run(outage, baseline, step, args.quick)
    lossless = not data["missing"] and not data["extra"] and not data["inconsistent_uids"]
    ordered = data["per_event_ordered"] and data["arrival_in_production_order"]
    rows = [
        SummaryRow("outage", f"records of a {outage:.0f} s outage delivered, de-duplicated",
                   "all, once", f"{data['unique']}/{data['expected']}", "", "",
                   lossless and data["unique"] == data["expected"]),
        SummaryRow("outage", "order after the outage", "kept", "kept" if ordered else "broken",
                   "", "", ordered),
        SummaryRow("outage", "drain time after the collector returns", "",
                   f"{data['drain_seconds']} s",
                   f"{data['baseline_delay_median_s']} s per record, collector up", "", None),
        SummaryRow("outage", "polls per second during the outage", "cadence kept",
                   f"{data['polls_outage_per_s']}", f"{data['polls_baseline_per_s']}",
                   f"{data['polls_outage_per_s'] / data['polls_baseline_per_s']:.2f}",
                   data["polls_outage_per_s"] >= 0.9 * data["polls_baseline_per_s"]),
        SummaryRow("outage", "exporter CPU s/min", "",
                   f"{data['cpu_s_per_min_outage']}", f"{data['cpu_s_per_min_baseline']}",
                   f"{data['cpu_s_per_min_outage'] / data['cpu_s_per_min_baseline']:.2f}",
                   None),
        SummaryRow("outage", "exporter RSS MiB (max in outage)", "",
                   f"{data['rss_mib_outage_max']}", f"{data['rss_mib_baseline_end']}",
                   f"{data['rss_mib_outage_max'] / data['rss_mib_baseline_end']:.2f}", None),
    ]
    print_table("Collector outage", ["metric", "measured"],
                [[k, v] for k, v in data.items() if k != "quick"])
    save_results("outage", data, rows)


if __name__ == "__main__":
    main()
