"""Steady-state CPU of the exporter at 1 Hz (OTLP sink) against the documentation's poller.

Per case, one in-process :class:`Simulator`, one real ``rotel`` collector, and two processes
polling the same simulator once a second, started together:

* the exporter (``SEE_SINKS=otlp``, http/protobuf, ``OTEL_METRIC_EXPORT_INTERVAL=10000``);
* ``bench/reference_poller.py``: ``requests.get`` + ``resp.json()`` + incarnation compare, the
  loop from Microsoft's Scheduled Events sample (the baseline).

After a warm-up (start-up, first connections, first metric export) the CPU time of each process
(``/proc/<pid>/stat`` utime + stime, all threads) is read at the start and the end of the same
window; polls are counted from the simulator's request log by ``User-Agent``.

Cases: documents of 0, 10, 100 and 1000 events, either unchanged (the exporter gets 304s, the
reference poller always downloads and parses the whole document) or changing before every poll
(the incarnation goes up every 0.5 s and, when there are events, the first event's
``DurationInSeconds`` changes: one ``updated`` transition per poll, so every poll pays for the
200, parse, track, state file + spool writes and one OTLP log export).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from benchlib import (
    BENCH,
    SCHEDULED_EVENTS,
    ExporterProcess,
    SummaryRow,
    cpu_seconds,
    events_document,
    exporter_env,
    otlp_env,
    parse_args,
    print_table,
    save_results,
    temp_state_dir,
    wait_first_poll,
)

from scheduled_events_exporter.simulator import Simulator
from tests.peers.rotel import RotelReceiver

WARMUP = 12.0  # s: start-up, first poll, first metric export (at 10 s)
TARGET_PERCENT = 0.5
TARGET_RATIO = 1.0


@dataclass(frozen=True)
class Case:
    """One measured configuration."""

    events: int
    changing: bool
    duration: float

    @property
    def label(self) -> str:
        return f"{self.events} events, {'changing' if self.changing else 'unchanged'}"


def _changer(sim: Simulator, events: list[dict[str, object]], stop: threading.Event) -> None:
    """Change the document every 0.5 s (so every 1 s poll sees a new one)."""
    counter = 100
    while not stop.wait(0.5):
        counter += 1
        if events:
            events[0]["DurationInSeconds"] = counter
            sim.set_events(events)
        else:
            sim.set_events([], incarnation=sim.incarnation + 1)


def measure(case: Case) -> dict[str, Any]:
    """Run one case; CPU seconds and polls of the exporter and the reference poller."""
    with Simulator() as sim, RotelReceiver() as rotel, temp_state_dir() as state:
        events = events_document(case.events, vm_name=sim.vm_name)
        sim.set_events(events)
        env = exporter_env(
            sim.url,
            state,
            SEE_POLL_INTERVAL="1",
            **otlp_env(rotel.http_endpoint, "http/protobuf", 10_000),
        )
        stop = threading.Event()
        with ExporterProcess(env) as exporter:
            reference = subprocess.Popen(
                [sys.executable, str(BENCH / "reference_poller.py"), sim.url],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                wait_first_poll(sim)
                if case.changing:
                    threading.Thread(target=_changer, args=(sim, events, stop), daemon=True).start()
                time.sleep(WARMUP)
                t0 = time.time()
                exp0, ref0 = cpu_seconds(exporter.proc.pid), cpu_seconds(reference.pid)
                time.sleep(case.duration)
                exp1, ref1 = cpu_seconds(exporter.proc.pid), cpu_seconds(reference.pid)
                t1 = time.time()
            finally:
                stop.set()
                reference.terminate()
                reference.wait(timeout=10)
            exporter.terminate()
        window = [
            e
            for e in sim.requests
            if t0 <= e.wall < t1 and e.method == "GET" and e.path.startswith(SCHEDULED_EVENTS)
        ]
    ua = [(e.header("User-Agent") or "", e.status) for e in window]
    exp_polls = [s for agent, s in ua if "urllib3" in agent]
    ref_polls = [s for agent, s in ua if "requests" in agent]
    elapsed = t1 - t0
    exp_cpu, ref_cpu = exp1 - exp0, ref1 - ref0
    return {
        "events": case.events,
        "changing": case.changing,
        "seconds": elapsed,
        "exporter_cpu_s": exp_cpu,
        "reference_cpu_s": ref_cpu,
        "exporter_percent": 100 * exp_cpu / elapsed,
        "reference_percent": 100 * ref_cpu / elapsed,
        "exporter_polls": len(exp_polls),
        "exporter_200": sum(1 for s in exp_polls if s == 200),
        "exporter_304": sum(1 for s in exp_polls if s == 304),
        "reference_polls": len(ref_polls),
        "exporter_ms_per_poll": 1000 * exp_cpu / max(1, len(exp_polls)),
        "reference_ms_per_poll": 1000 * ref_cpu / max(1, len(ref_polls)),
        "ratio": exp_cpu / ref_cpu if ref_cpu else float("inf"),
    }


def main() -> None:
    args = parse_args(__doc__.splitlines()[0] if __doc__ else "")
    if args.quick:
        cases = [Case(0, False, 30.0)]
    else:
        cases = [Case(0, False, 120.0)] + [
            Case(n, changing, 60.0)
            for changing in (False, True)
            for n in (0, 10, 100, 1000)
            if (n, changing) != (0, False)
        ]
    results = []
    for case in cases:
        print(f"measuring {case.label} for {case.duration:g} s ...", flush=True)
        results.append(measure(case))
    print_table(
        "Steady-state CPU at 1 Hz, OTLP http/protobuf, metrics every 10 s",
        [
            "document",
            "window s",
            "exporter %core",
            "reference %core (baseline)",
            "ratio",
            "exporter ms/poll",
            "reference ms/poll",
            "exporter 200/304",
        ],
        [
            [
                f"{r['events']} events, {'changing' if r['changing'] else 'unchanged'}",
                r["seconds"],
                r["exporter_percent"],
                r["reference_percent"],
                r["ratio"],
                r["exporter_ms_per_poll"],
                r["reference_ms_per_poll"],
                f"{r['exporter_200']}/{r['exporter_304']}",
            ]
            for r in results
        ],
    )
    main_result = results[0]
    summary = [
        SummaryRow(
            "cpu",
            f"exporter CPU, idle doc, {main_result['seconds']:.0f} s (% of one core)",
            f"<= {TARGET_PERCENT}",
            f"{main_result['exporter_percent']:.3f}",
            f"reference {main_result['reference_percent']:.3f}",
            f"{main_result['ratio']:.2f}",
            main_result["exporter_percent"] <= TARGET_PERCENT,
        ),
        SummaryRow(
            "cpu",
            "exporter / reference CPU ratio, idle doc",
            f"<= {TARGET_RATIO}",
            f"{main_result['ratio']:.2f}",
            "1.00 (reference)",
            f"{main_result['ratio']:.2f}",
            main_result["ratio"] <= TARGET_RATIO,
        ),
    ]
    for r in results[1:]:
        summary.append(
            SummaryRow(
                "cpu",
                f"ms CPU/poll, {r['events']} events {'changing' if r['changing'] else 'unchanged'}",
                "-",
                f"{r['exporter_ms_per_poll']:.2f}",
                f"reference {r['reference_ms_per_poll']:.2f}",
                f"{r['ratio']:.2f}",
                None,
            )
        )
    save_results("cpu", {"quick": args.quick, "cases": results}, summary)


if __name__ == "__main__":
    main()
