"""Where an idle exporter's CPU goes, thread by thread (native threads included).

One :class:`Simulator` with one pending event, one ``rotel`` collector and one AMQP peer, then
one exporter per selected route (and, with ``--before DIR``, the same routes running another
checkout's ``src/``), all with a user's defaults and 1 s polls. After a warm-up, every thread of
every exporter is read at the start and the end of one window from ``/proc/<pid>/task/<tid>``:
its name (``comm``: gRPC's core names its threads ``grpc_global_tim``, ``event_engine``,
``lifeguard``...), its CPU time in nanoseconds (``schedstat``: time on a CPU) and its context
switches (``status``: each voluntary switch is one sleep, i.e. one wake-up later). Threads that
started and ended inside the window (a gRPC channel's threads, with channels that open only
around exports) are gone by then; the ``(threads that ended)`` row is the process's total CPU
(``/proc/<pid>/stat``, 10 ms ticks) minus what the live threads account for.

``--perf`` also samples every exporter with ``perf record -e cpu-clock`` over the same window
and prints ``perf report --sort comm,dso``: which thread spent it in which library.

``python bench/threads.py [--routes otlp-grpc otlp-http] [--window 60] [--before DIR] [--perf]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from contextlib import ExitStack
from dataclasses import dataclass

from benchlib import cpu_seconds, temp_state_dir, wait_first_poll
from routes import ROUTES, start_exporters


@dataclass(frozen=True)
class ThreadSample:
    """One thread at one instant."""

    name: str
    cpu_ns: int
    voluntary: int
    involuntary: int


def sample(pid: int) -> dict[int, ThreadSample]:
    """Every live thread of ``pid``, by thread id.

    Python's own threads are all named after the interpreter; the main thread (the poll loop)
    is told apart as ``(main)``.
    """
    threads: dict[int, ThreadSample] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        base = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{base}/comm") as handle:
                name = handle.read().strip() + (" (main)" if int(tid) == pid else "")
            with open(f"{base}/schedstat") as handle:
                cpu_ns = int(handle.read().split()[0])
            switches = {}
            with open(f"{base}/status") as handle:
                for line in handle:
                    key, _, rest = line.partition(":")
                    if key.endswith("ctxt_switches"):
                        switches[key] = int(rest)
        except FileNotFoundError:  # the thread ended while we read it
            continue
        threads[int(tid)] = ThreadSample(name, cpu_ns, switches["voluntary_ctxt_switches"],
                                         switches["nonvoluntary_ctxt_switches"])
    return threads


def profile(start: dict[int, ThreadSample], end: dict[int, ThreadSample], total_s: float,
            window: float) -> list[tuple[str, int, float, float]]:
    """(thread name, threads, CPU ms per minute, wake-ups per minute) rows, largest first."""
    per_minute = 60.0 / window
    rows: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    accounted = 0.0
    for tid, last in end.items():
        first = start.get(tid, ThreadSample(last.name, 0, 0, 0))
        cpu = (last.cpu_ns - first.cpu_ns) / 1e6
        accounted += cpu
        row = rows[last.name]
        row[0] += 1
        row[1] += cpu * per_minute
        row[2] += (last.voluntary - first.voluntary) * per_minute
    ended = total_s * 1000 - accounted
    out = [(name, int(n), cpu, wakes) for name, (n, cpu, wakes) in rows.items()]
    out.append(("(threads that ended)", 0, max(ended, 0.0) * per_minute, float("nan")))
    return sorted(out, key=lambda row: -row[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--routes", nargs="+", choices=ROUTES, default=["otlp-grpc", "otlp-http"])
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=20.0)
    parser.add_argument("--before", default="", help="another checkout's src/ to run beside")
    parser.add_argument("--perf", action="store_true", help="also sample with perf record")
    args = parser.parse_args()
    if args.perf and shutil.which("perf") is None:
        sys.exit("--perf needs perf (Debian package linux-perf)")
    with ExitStack() as stack:
        sim, procs, _ = start_exporters(stack, args.routes, args.before)
        wait_first_poll(sim)
        time.sleep(args.warmup)
        pids = {name: proc.proc.pid for name, proc in procs.items()}
        perfs = {}
        if args.perf:
            for name, pid in pids.items():
                data = stack.enter_context(temp_state_dir()) + "/perf.data"
                perfs[name] = (data, subprocess.Popen(
                    ["perf", "record", "-q", "-e", "cpu-clock", "-F", "4999", "-o", data,
                     "-p", str(pid), "--", "sleep", f"{args.window:g}"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        t0 = time.monotonic()
        start = {name: sample(pid) for name, pid in pids.items()}
        cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
        time.sleep(args.window)
        end = {name: sample(pid) for name, pid in pids.items()}
        cpu1 = {name: cpu_seconds(pid) for name, pid in pids.items()}
        window = time.monotonic() - t0
        for name in pids:
            total = cpu1[name] - cpu0[name]
            print(f"\n{name}: {1000 * total * 60 / window:.1f} ms CPU per minute (process, "
                  f"10 ms ticks), {len(end[name])} live threads")
            print(f"  {'thread':<22} {'n':>2} {'CPU ms/min':>10} {'wake-ups/min':>12}")
            for thread, count, cpu, wakes in profile(start[name], end[name], total, window):
                print(f"  {thread:<22} {count or '':>2} {cpu:>10.1f} {wakes:>12.0f}")
        for name, (data, proc) in perfs.items():
            proc.wait(timeout=args.window + 30)
            report = subprocess.run(
                ["perf", "report", "-i", data, "--stdio", "--sort", "comm,dso", "-q",
                 "--percent-limit", "2"], capture_output=True, text=True)
            print(f"\nperf report --sort comm,dso ({name}, % of its samples, >= 2 %)")
            print(report.stdout.rstrip() or report.stderr.rstrip())


if __name__ == "__main__":
    main()
