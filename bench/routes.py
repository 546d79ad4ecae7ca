"""Idle CPU and RSS of every route, beside the documentation's reference loop, in one run.

Per run, one in-process :class:`Simulator` holding one pending event, one real ``rotel``
collector and one AMQP 1.0 peer; then, started together and polling that simulator once a
second:

* ``bench/reference_poller.py`` (``requests`` + ``json()`` + incarnation compare): the baseline;
* one exporter per route, each with the defaults a user gets (metrics on change and every
  60 s, 1 s polls): ``console``; ``otlp-http`` (http/protobuf) and ``otlp-grpc`` to rotel;
  ``eventhubs`` to the AMQP peer; ``prometheus`` (console records, ``/metrics`` scraped by this
  script every 15 s);
* with ``--before DIR``, the same routes again running another checkout's ``src/`` (the code
  before a change), so before and after share the run, the machine and the reference loop.

After a warm-up, the CPU time of every process (``/proc/<pid>/stat`` utime + stime: all
threads, those that ended in the window included; 10 ms ticks) is read at the start and the end
of one shared window; RSS (``VmRSS``, with its file-backed and anonymous parts) at the end, and
the pages each process touched during the window (accessed bits cleared at the start through
``/proc/<pid>/clear_refs``, ``Referenced`` summed from ``/proc/<pid>/smaps`` at the end): the
working set, as against what is merely resident.
Each route's figure is its ratio to the reference loop *of the same run*; the table gives the
median over the runs (and the smallest and largest ratio), with the load average at the start
and the end of every run, because these machines are shared.

``python bench/routes.py [--runs 5] [--window 180] [--before /path/to/old/src] [--quick]``;
``--report`` prints the table again from ``bench/results/routes.json`` without measuring.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from math import nan
from typing import Any

from benchlib import (
    BENCH,
    SummaryRow,
    cpu_seconds,
    events_document,
    exporter_env,
    free_port,
    median,
    print_table,
    result_path,
    save_results,
    temp_state_dir,
    wait_first_poll,
)

from scheduled_events_exporter.simulator import Simulator
from tests.exporter_process import ExporterProcess
from tests.peers.amqp_peer import AmqpPeer
from tests.peers.rotel import RotelReceiver

ROUTES = ("console", "otlp-http", "otlp-grpc", "eventhubs", "prometheus")
OTLP_ROUTES = ("otlp-http", "otlp-grpc")
TARGET_RATIO = 0.8  # every OTLP protocol, CPU / reference loop's CPU
TARGET_GRPC_RSS = 42.0  # MiB of VmRSS (the unit of BENCHMARKS.md and of the 49/39/27)
SCRAPE_EVERY = 15.0  # s, a common Prometheus scrape interval (its default is 60 s)
HUB = "scheduled-events"


@dataclass(frozen=True)
class Options:
    """One invocation."""

    runs: int
    window: float
    warmup: float
    before: str
    quick: bool


def route_env(route: str, sim: Simulator, state: str, rotel: RotelReceiver,
              peer: AmqpPeer) -> tuple[dict[str, str], int]:
    """The environment of ``route`` (and its scrape port, 0 when it has none)."""
    values: dict[str, str] = {"SEE_POLL_INTERVAL": "1"}
    port = 0
    if route == "console":
        values["SEE_SINKS"] = "console"
    elif route == "otlp-http":
        values.update(SEE_SINKS="otlp", OTEL_EXPORTER_OTLP_ENDPOINT=rotel.http_endpoint,
                      OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf")
    elif route == "otlp-grpc":
        values.update(SEE_SINKS="otlp", OTEL_EXPORTER_OTLP_ENDPOINT=rotel.grpc_endpoint,
                      OTEL_EXPORTER_OTLP_PROTOCOL="grpc")
    elif route == "eventhubs":
        values.update(SEE_SINKS="eventhubs",
                      SEE_EVENTHUB_CONNECTION_STRING=peer.connection_string(HUB))
    elif route == "prometheus":
        port = free_port()
        values.update(SEE_SINKS="console", OTEL_METRICS_EXPORTER="prometheus",
                      OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
                      OTEL_EXPORTER_PROMETHEUS_PORT=str(port))
    else:
        raise ValueError(f"unknown route {route!r}")
    return exporter_env(sim.url, state, **values), port


def memory(pid: int) -> dict[str, float]:
    """VmRSS and its file-backed / anonymous parts, in MiB."""
    fields: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "Threads"):
                fields[key] = int(rest.split()[0])
    return {
        "rss_mib": fields["VmRSS"] / 1024,
        "rss_file_mib": fields.get("RssFile", 0) / 1024,
        "rss_anon_mib": fields.get("RssAnon", 0) / 1024,
        "threads": fields.get("Threads", 0),
    }


def clear_referenced(pid: int) -> None:
    """Clear the accessed bits of every page of ``pid`` (``/proc/<pid>/clear_refs``, value 1).

    Hardware sets them again on the next access without a fault, so this costs the measured
    process nothing; what is marked at the end of the window is what it touched in the window.
    """
    with open(f"/proc/{pid}/clear_refs", "w") as handle:
        handle.write("1")


def referenced(pid: int) -> dict[str, float]:
    """MiB of pages touched since :func:`clear_referenced`: in all, and in file mappings."""
    total = in_files = 0
    file_backed = False
    with open(f"/proc/{pid}/smaps") as handle:
        for line in handle:
            first = line.split(maxsplit=6)
            if "-" in first[0] and len(first) >= 5 and ":" in first[3]:  # a mapping's header
                file_backed = len(first) > 5 and first[5].startswith("/")
            elif first[0] == "Referenced:":
                total += int(first[1])
                in_files += int(first[1]) if file_backed else 0
    return {"touched_mib": total / 1024, "touched_file_mib": in_files / 1024}


def _scraper(ports: list[int], stop: threading.Event) -> None:
    while not stop.wait(SCRAPE_EVERY):
        for port in ports:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    r.read()
            except OSError as exc:
                print(f"scrape of port {port} failed: {exc}", file=sys.stderr)


def start_exporters(stack: ExitStack, routes: Sequence[str], before: str
                    ) -> tuple[Simulator, dict[str, ExporterProcess], list[int]]:
    """The simulator (one pending event) and its peers, then one exporter per route named
    ``route/after`` and, with ``before`` (another checkout's ``src/``), ``route/before``; all
    closed by ``stack``. Also the scrape ports of the Prometheus routes."""
    sim = stack.enter_context(Simulator())
    rotel = stack.enter_context(RotelReceiver())
    peer = stack.enter_context(AmqpPeer())
    sim.set_events(events_document(1, vm_name=sim.vm_name))
    procs: dict[str, ExporterProcess] = {}
    ports: list[int] = []
    for code, path in ({"after": ""} | ({"before": before} if before else {})).items():
        for route in routes:
            env, port = route_env(route, sim, stack.enter_context(temp_state_dir()), rotel, peer)
            if path:
                env["PYTHONPATH"] = path
            procs[f"{route}/{code}"] = stack.enter_context(ExporterProcess(env))
            if port:
                ports.append(port)
    return sim, procs, ports


def one_run(options: Options, index: int) -> dict[str, Any]:
    """Start everything, wait, measure one window; figures per process."""
    with ExitStack() as stack:
        sim, procs, ports = start_exporters(stack, ROUTES, options.before)
        reference = subprocess.Popen(
            [sys.executable, str(BENCH / "reference_poller.py"), sim.url],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stop = threading.Event()
        try:
            wait_first_poll(sim)
            threading.Thread(target=_scraper, args=(ports, stop), daemon=True).start()
            time.sleep(options.warmup)
            for name, proc in procs.items():
                if proc.proc.poll() is not None:
                    raise RuntimeError(f"{name} exited: {''.join(proc.stderr_lines)[-2000:]}")
            pids = {name: p.proc.pid for name, p in procs.items()} | {"reference": reference.pid}
            load0 = os.getloadavg()
            t0 = time.monotonic()
            cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
            for pid in pids.values():
                clear_referenced(pid)
            time.sleep(options.window)
            cpu1 = {name: cpu_seconds(pid) for name, pid in pids.items()}
            elapsed = time.monotonic() - t0
            mem = {name: memory(pid) | referenced(pid) for name, pid in pids.items()}
            load1 = os.getloadavg()
        finally:
            stop.set()
            reference.terminate()
            reference.wait(timeout=10)
    ref_cpu = cpu1["reference"] - cpu0["reference"]
    figures = {
        name: {
            "cpu_s": cpu1[name] - cpu0[name],
            "percent": 100 * (cpu1[name] - cpu0[name]) / elapsed,
            "ratio": (cpu1[name] - cpu0[name]) / ref_cpu if ref_cpu else float("nan"),
            **mem[name],
        }
        for name in pids
    }
    print(f"run {index + 1}: window {elapsed:.0f} s, reference {100 * ref_cpu / elapsed:.3f} % "
          f"of a core, load {load0[0]:.2f} -> {load1[0]:.2f}", flush=True)
    return {"window_s": elapsed, "load_start": load0[0], "load_end": load1[0],
            "figures": figures}


def one_run_retried(options: Options, index: int, attempts: int = 3) -> dict[str, Any]:
    """:func:`one_run`, started again when a process lost its port to another socket between
    ``free_port`` and its bind (eleven processes and their connections share the ephemeral
    range); any other failure ends the benchmark."""
    for attempt in range(1, attempts + 1):
        try:
            return one_run(options, index)
        except RuntimeError as exc:
            if "Address already in use" not in str(exc) or attempt == attempts:
                raise
            print(f"run {index + 1}: a port was taken, starting the run again", flush=True)
    raise AssertionError("unreachable")


def report(runs: list[dict[str, Any]], options: Options, args: dict[str, Any]) -> None:
    """Print the medians table and save the results with their summary rows."""
    names = list(runs[0]["figures"])
    rows = []
    table: dict[str, dict[str, float]] = {}
    for name in names:
        ratios = [r["figures"][name]["ratio"] for r in runs]
        row = {
            "percent": median([r["figures"][name]["percent"] for r in runs]),
            "ratio": median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "rss_mib": median([r["figures"][name]["rss_mib"] for r in runs]),
            "rss_file_mib": median([r["figures"][name]["rss_file_mib"] for r in runs]),
            "rss_anon_mib": median([r["figures"][name]["rss_anon_mib"] for r in runs]),
            "threads": median([r["figures"][name]["threads"] for r in runs]),
            "touched_mib": median([r["figures"][name].get("touched_mib", nan) for r in runs]),
            "touched_file_mib": median([r["figures"][name].get("touched_file_mib", nan)
                                        for r in runs]),
        }
        table[name] = row
        rows.append([name, row["percent"], row["ratio"],
                     f"{row['ratio_min']:.2f}-{row['ratio_max']:.2f}", row["rss_mib"],
                     row["rss_file_mib"], row["rss_anon_mib"], row["touched_mib"],
                     row["touched_file_mib"], int(row["threads"])])
    loads = ", ".join(f"{r['load_start']:.2f}->{r['load_end']:.2f}" for r in runs)
    print_table(
        f"Idle CPU and RSS per route, 1 s polls, one pending event; medians of {len(runs)} "
        f"run(s) of {options.window:g} s (load average at start->end: {loads})",
        ["process", "% core", "ratio to reference", "ratio min-max", "RSS MiB", "file MiB",
         "anon MiB", "touched MiB", "touched in files", "threads"],
        rows,
    )
    summary = []
    reference = table["reference"]
    for route in ROUTES:
        row = table[f"{route}/after"]
        before = table.get(f"{route}/before")
        target = route in OTLP_ROUTES
        summary.append(SummaryRow(
            "routes", f"{route}: CPU / reference loop, idle, median of {len(runs)}",
            f"<= {TARGET_RATIO}" if target else "-", f"{row['ratio']:.2f}",
            f"reference {reference['percent']:.3f} % core"
            + (f"; before {before['ratio']:.2f}" if before else ""),
            f"{row['ratio']:.2f}", row["ratio"] <= TARGET_RATIO if target else None))
        grpc = route == "otlp-grpc"
        summary.append(SummaryRow(
            "routes", f"{route}: RSS MiB (VmRSS)",
            f"<= {TARGET_GRPC_RSS:g}" if grpc else "-", f"{row['rss_mib']:.1f}",
            f"reference {reference['rss_mib']:.1f}"
            + (f"; before {before['rss_mib']:.1f}" if before else ""),
            f"{row['rss_mib'] / reference['rss_mib']:.2f}",
            row["rss_mib"] <= TARGET_GRPC_RSS if grpc else None))
    save_results("routes", {"quick": options.quick, "options": args, "runs": runs,
                            "medians": table}, summary)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--quick", action="store_true", help="one 40 s run (indicative only)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--window", type=float, default=180.0, help="seconds measured per run")
    parser.add_argument("--warmup", type=float, default=20.0)
    parser.add_argument("--before", default="", help="another checkout's src/ to run beside")
    parser.add_argument("--report", action="store_true",
                        help="print the table from the saved results; measure nothing")
    args = parser.parse_args()
    if args.report:
        saved = json.loads(result_path("routes", args.quick).read_text())["data"]
        kept = saved["options"]
        options = Options(len(saved["runs"]), kept["window"], kept["warmup"], kept["before"],
                          saved["quick"])
        report(saved["runs"], options, kept)
        return
    options = Options(1 if args.quick else args.runs, 40.0 if args.quick else args.window,
                      10.0 if args.quick else args.warmup, args.before, args.quick)
    runs = [one_run_retried(options, i) for i in range(options.runs)]
    report(runs, options, vars(args))


if __name__ == "__main__":
    main()
