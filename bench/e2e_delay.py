"""End-to-end delay: a change at the simulator → its log record printed by a real OTLP collector.

Setup per configuration: the in-process IMDS :class:`Simulator`, a real ``rotel`` collector
(:class:`RotelReceiver`, ``--disable-batching``) and the real exporter process with
``SEE_SINKS=otlp``. Each change adds a fresh event (a ``scheduled`` transition) and drops the
event added five changes earlier, so every change yields exactly one ``scheduled`` record even
when two changes fall between two polls. Changes are ``0.3–1.7 s`` apart (uniformly random), so
they land at random phases of the poll schedule.

For each change:

* ``t_change`` = wall time when ``Simulator.set_events`` returned;
* ``t_poll`` = wall time the simulator received the first Scheduled Events GET that came after
  the change and was answered 200 (the poll that saw it);
* ``t_recv`` = ``ReceivedLog.arrival_time`` of the ``scheduled`` record with that EventId.

``delay = t_recv - t_change`` (the figure), split into ``wait = t_poll - t_change`` (set by the
poll schedule alone: the baseline, uniform on ``[0, interval)``) and ``pipeline = t_recv -
t_poll`` (request, parse, track, state file + spool fsync, OTLP encode and send, collector).

Full mode: 100 changes at 1 s (http/protobuf, the targets), 60 each for gRPC and for 0.5 s and
2 s intervals. Quick mode: 30 changes at 1 s; the sample median of so few uniform poll waits
swings by ±0.1 s, so the quick verdict is taken on ``interval / 2 + median pipeline`` (and
``interval + max pipeline`` for the max), the part the exporter controls.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from dataclasses import dataclass
from typing import Any

from benchlib import (
    BENCH,
    SCHEDULED_EVENTS,
    ExporterProcess,
    SummaryRow,
    exporter_env,
    make_event,
    median,
    new_id,
    otlp_env,
    parse_args,
    percentile,
    print_table,
    save_results,
    temp_state_dir,
    wait_first_poll,
)

from scheduled_events_exporter.simulator import Simulator
from tests.peers.rotel import RotelReceiver

WINDOW = 5  # events kept in the document (older ones are dropped: ``cancelled``)
SCHEDULED = "azure.scheduled_event.scheduled"
ID_ATTR = "azure.scheduled_event.id"


@dataclass(frozen=True)
class Config:
    """One measured configuration."""

    protocol: str
    interval: float
    changes: int
    probe: bool = False
    code: str = ""
    batching: bool = False  # the collector's own batching (rotel's default: 200 ms timeout)
    as_user: bool = False  # endpoint "localhost", default log level (info)
    spacing: tuple[float, float] = (0.3, 1.7)  # seconds between changes, uniform

    @property
    def label(self) -> str:
        return f"{self.protocol} @ {self.interval:g} s"


def measure(config: Config, rng: random.Random) -> dict[str, Any]:
    """Run one configuration; returns per-change samples and their statistics."""
    with Simulator() as sim, RotelReceiver(batching=config.batching) as rotel, \
            temp_state_dir() as state:
        http = config.protocol == "http/protobuf"
        endpoint = rotel.http_endpoint if http else rotel.grpc_endpoint
        if config.as_user:  # what a user writes, and the default log level
            endpoint = endpoint.replace("127.0.0.1", "localhost")
        otlp = otlp_env(endpoint, config.protocol)
        del otlp["OTEL_METRIC_EXPORT_INTERVAL"]  # as a user runs it: metrics on change + 60 s
        env = exporter_env(
            sim.url,
            state,
            SEE_POLL_INTERVAL=f"{config.interval:g}",
            **otlp,
        )
        if config.as_user:
            del env["SEE_LOG_LEVEL"]
        paths = [str(BENCH / "probe_site")] if config.probe else []
        if config.code:  # another checkout's src/ (e.g. the code before a change)
            paths.append(config.code)
        if paths:
            env["PYTHONPATH"] = os.pathsep.join(paths)
        with ExporterProcess(env) as proc:
            wait_first_poll(sim)
            window: list[dict[str, object]] = []
            # Warm-up change (not measured): the exporter opens its collector connection.
            warm = new_id()
            window.append(make_event(warm))
            sim.set_events(window)
            rotel.wait_for_logs(lambda r: r.attributes.get(ID_ATTR) == warm, timeout=30)
            changes: list[tuple[str, float, float]] = []  # (id, t_before, t_change)
            for _ in range(config.changes):
                time.sleep(rng.uniform(*config.spacing))
                event_id = new_id()
                window = [*window, make_event(event_id)][-WINDOW:]
                t_before = time.time()
                sim.set_events(window)
                changes.append((event_id, t_before, time.time()))
            wanted = {c[0] for c in changes}
            received = rotel.wait_for_logs(
                lambda r: r.event_name == SCHEDULED and r.attributes.get(ID_ATTR) in wanted,
                count=len(changes),
                timeout=30,
            )
            proc.terminate()
            probes = [line.split()[1:4] for line in proc.stderr_lines
                      if line.startswith("PROBE ")]
        metric_times = sorted({round(m.arrival_time, 2) for m in rotel.metrics})
        polls = sorted(
            e.wall
            for e in sim.requests
            if e.method == "GET" and e.path.startswith(SCHEDULED_EVENTS) and e.status == 200
        )
    arrival = {str(r.attributes[ID_ATTR]): r.arrival_time for r in received}
    samples = []
    for event_id, t_before, t_change in changes:
        t_poll = next((p for p in polls if p >= t_before), float("nan"))
        t_recv = arrival[event_id]
        # Seconds from the last metric export the collector printed to this poll (diagnostic).
        last_metric = max((m for m in metric_times if m <= t_recv), default=float("nan"))
        stages = {}
        if probes:
            # The stages of the poll that saw this change: from its "fetched" to the next one.
            fetched = [float(t) for stage, t, _ in probes if stage == "fetched"]
            start = next((f for f in fetched if f >= t_poll - 0.05), float("nan"))
            later = [f for f in fetched if f > start]
            end = later[0] if later else float("inf")
            for stage, t, _ in probes:
                if start <= float(t) < end and stage not in stages:
                    stages[stage] = float(t) - start
            stages["recv"] = t_recv - start
        samples.append(
            {
                "stages": stages,
                "delay": t_recv - t_change,
                "wait": t_poll - t_change,
                "pipeline": t_recv - t_poll,
                "poll_after_metric_export": t_poll - last_metric,
            }
        )
    delays = [s["delay"] for s in samples]
    waits = [s["wait"] for s in samples]
    pipes = [s["pipeline"] for s in samples]
    return {
        "protocol": config.protocol,
        "interval": config.interval,
        "changes": len(samples),
        "delay_median": median(delays),
        "delay_p90": percentile(delays, 90),
        "delay_max": max(delays),
        "wait_median": median(waits),
        "wait_max": max(waits),
        "pipeline_median": median(pipes),
        "pipeline_p90": percentile(pipes, 90),
        "pipeline_max": max(pipes),
        "samples": samples,
    }


def tail_runs(changes: int, repeat: int, probe: bool = False, code: str = "",
              name: str = "e2e_delay_tail", batching: tuple[bool, ...] = (False,),
              as_user: bool = False, spacing: tuple[float, float] = (0.3, 1.7),
              protocols: tuple[str, ...] = ("grpc", "http/protobuf")) -> None:
    """gRPC and http/protobuf side by side at 1 s, ``repeat`` runs each (the issue-11 check)."""
    rng = random.Random(20261123)
    results = []
    for run in range(repeat):
        for batch, protocol in ((b, p) for b in batching for p in protocols):
            label = "collector batching 200 ms" if batch else "collector batching off"
            print(f"run {run + 1}: {protocol} @ 1 s, {label}, {changes} changes "
                  f"{spacing[0]:g}-{spacing[1]:g} s apart ...", flush=True)
            result = measure(Config(protocol, 1.0, changes, probe, code, batch, as_user,
                                    spacing), rng)
            results.append({"run": run + 1, "collector": label, **result})
            if probe:
                slow = sorted(result["samples"], key=lambda x: -x["pipeline"])[:5]
                for sample in slow:
                    print(f"    pipeline {sample['pipeline']:.3f} s: " + ", ".join(
                        f"{k} {v * 1000:.1f}" for k, v in sorted(sample["stages"].items(),
                                                                   key=lambda kv: kv[1])),
                          flush=True)
    print_table(
        "Change -> record at rotel, 1 s polls, defaults (seconds)",
        ["run", "collector", "protocol", "n", "median", "p90", "max", "wait max", "pipeline med",
         "pipeline max"],
        [[r["run"], r["collector"], r["protocol"], r["changes"], r["delay_median"], r["delay_p90"],
          r["delay_max"], r["wait_max"], r["pipeline_median"], r["pipeline_max"]]
         for r in results],
    )
    summary = [
        SummaryRow("e2e_delay", f"max delay, {p} @ 1 s, {c}, {repeat} x {changes} (s)",
                   "<= 1.2" if c.endswith("off") else "-",
                   " / ".join(f"{r['delay_max']:.3f}" for r in rows),
                   "poll wait max " + " / ".join(f"{r['wait_max']:.3f}" for r in rows),
                   "-", all(r["delay_max"] <= 1.2 for r in rows) if c.endswith("off") else None)
        for c in sorted({r["collector"] for r in results}) for p in protocols
        if (rows := [r for r in results if r["protocol"] == p and r["collector"] == c])
    ]
    save_results(name, {"quick": False, "code": code, "runs": results}, summary)


def main() -> None:
    if "--tail" in sys.argv:
        parser = argparse.ArgumentParser(description="gRPC vs http change->record tail")
        parser.add_argument("--tail", action="store_true")
        parser.add_argument("--changes", type=int, default=40)
        parser.add_argument("--repeat", type=int, default=3)
        parser.add_argument("--probe", action="store_true",
                            help="stamp the pipeline stages (bench/tail_probe.py)")
        parser.add_argument("--code", default="", help="run this src/ directory's exporter")
        parser.add_argument("--name", default="e2e_delay_tail", help="results file name")
        parser.add_argument("--batching", choices=("off", "on", "both"), default="off",
                            help="the collector's batching (rotel default: 200 ms timeout)")
        parser.add_argument("--as-user", action="store_true",
                            help="endpoint http://localhost:PORT and the default log level")
        parser.add_argument("--spacing", type=float, nargs=2, default=(0.3, 1.7),
                            metavar=("LO", "HI"), help="seconds between changes, uniform "
                            "(default 0.3 1.7; above the gRPC channel's 5 s linger every change "
                            "finds the channel closed)")
        parser.add_argument("--protocols", nargs="+", default=("grpc", "http/protobuf"),
                            choices=("grpc", "http/protobuf"))
        options = parser.parse_args()
        batching = {"off": (False,), "on": (True,), "both": (False, True)}[options.batching]
        tail_runs(options.changes, options.repeat, options.probe, options.code, options.name,
                  batching, options.as_user, tuple(options.spacing), tuple(options.protocols))
        return
    args = parse_args(__doc__.splitlines()[0] if __doc__ else "")
    rng = random.Random(20240611)
    if args.quick:
        configs = [Config("http/protobuf", 1.0, 30)]
    else:
        configs = [
            Config("http/protobuf", 1.0, 100),
            Config("grpc", 1.0, 60),
            Config("http/protobuf", 0.5, 60),
            Config("http/protobuf", 2.0, 60),
        ]
    results = []
    for config in configs:
        print(f"measuring {config.label}: {config.changes} changes ...", flush=True)
        results.append(measure(config, rng))
    print_table(
        "End-to-end delay, change at IMDS -> record at rotel (seconds)",
        [
            "config",
            "n",
            "median",
            "p90",
            "max",
            "poll wait med (baseline)",
            "poll wait max",
            "pipeline med",
            "pipeline p90",
            "pipeline max",
            "median/wait",
        ],
        [
            [
                f"{r['protocol']} @ {r['interval']:g} s",
                r["changes"],
                r["delay_median"],
                r["delay_p90"],
                r["delay_max"],
                r["wait_median"],
                r["wait_max"],
                r["pipeline_median"],
                r["pipeline_p90"],
                r["pipeline_max"],
                r["delay_median"] / r["wait_median"],
            ]
            for r in results
        ],
    )
    main_result = results[0]
    median_ok = main_result["delay_median"] <= 0.6
    max_ok = main_result["delay_max"] <= 1.2
    note = ""
    if args.quick:
        # The sample median of a few uniform poll waits is too noisy to judge (±0.1 s at
        # n = 30): judge what the exporter controls, the pipeline, under the worst phase.
        interval = main_result["interval"]
        median_ok = interval / 2 + main_result["pipeline_median"] <= 0.6
        max_ok = interval + main_result["pipeline_max"] <= 1.2
        note = " [quick: judged as interval/2 (or interval) + pipeline]"
    summary = [
        SummaryRow(
            "e2e_delay",
            f"median delay, http/protobuf @ 1 s (s){note}",
            "<= 0.6",
            f"{main_result['delay_median']:.3f}",
            f"poll wait {main_result['wait_median']:.3f}",
            f"{main_result['delay_median'] / main_result['wait_median']:.2f}",
            median_ok,
        ),
        SummaryRow(
            "e2e_delay",
            f"max delay, http/protobuf @ 1 s (s){note}",
            "<= 1.2",
            f"{main_result['delay_max']:.3f}",
            f"poll wait {main_result['wait_max']:.3f}",
            f"{main_result['delay_max'] / main_result['wait_max']:.2f}",
            max_ok,
        ),
    ]
    for r in results[1:]:
        summary.append(
            SummaryRow(
                "e2e_delay",
                f"median / max delay, {r['protocol']} @ {r['interval']:g} s (s)",
                "-",
                f"{r['delay_median']:.3f} / {r['delay_max']:.3f}",
                f"poll wait {r['wait_median']:.3f} / {r['wait_max']:.3f}",
                f"{r['delay_median'] / r['wait_median']:.2f}",
                None,
            )
        )
    save_results("e2e_delay", {"quick": args.quick, "configs": results}, summary)


if __name__ == "__main__":
    main()
