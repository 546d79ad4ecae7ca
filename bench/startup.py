"""Start-up: process spawn → first Scheduled Events request answered by the simulator.

``t0`` is taken right before ``subprocess.Popen`` of ``python -m scheduled_events_exporter run``;
the simulator's request log gives the monotonic arrival time of the first instance metadata
request (imports and configuration done) and of the first Scheduled Events GET (the first poll;
the simulator answers it within a millisecond). Each run uses a fresh state directory; the
median of 10 runs per sink configuration is reported (quick mode: 3 runs, OTLP http only).

Baseline: wall time of ``python -c "import urllib3"`` from spawn to exit (the interpreter plus
the IMDS client library: the least any Python poller pays), median of as many runs.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

from benchlib import (
    SCHEDULED_EVENTS,
    ExporterProcess,
    SummaryRow,
    exporter_env,
    median,
    otlp_env,
    parse_args,
    print_table,
    save_results,
    temp_state_dir,
    wait_first_poll,
)

from scheduled_events_exporter.simulator import Simulator
from tests.peers.amqp_peer import AmqpPeer
from tests.peers.rotel import RotelReceiver

TARGET = 1.5
INSTANCE_PATH = "/metadata/instance"


def spawn_baseline(runs: int) -> list[float]:
    """Spawn-to-exit seconds of ``python -c "import urllib3"``."""
    values = []
    for _ in range(runs):
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-c", "import urllib3"], check=True)
        values.append(time.monotonic() - t0)
    return values


def one_run(sim: Simulator, values: dict[str, str]) -> dict[str, float]:
    """Start the exporter once; seconds to its first instance and Scheduled Events requests."""
    sim.clear_requests()
    with temp_state_dir() as state:
        env = exporter_env(sim.url, state, **values)
        t0 = time.monotonic()
        with ExporterProcess(env) as proc:
            wait_first_poll(sim, timeout=30)
            proc.terminate()
    first_instance = next(e.monotonic for e in sim.requests if e.path.startswith(INSTANCE_PATH))
    first_poll = next(
        e.monotonic
        for e in sim.requests
        if e.method == "GET" and e.path.startswith(SCHEDULED_EVENTS)
    )
    return {"instance": first_instance - t0, "first_poll": first_poll - t0}


def main() -> None:
    args = parse_args(__doc__.splitlines()[0] if __doc__ else "")
    runs = 3 if args.quick else 10
    baseline = spawn_baseline(runs)
    results: dict[str, Any] = {}
    with Simulator() as sim, RotelReceiver() as rotel, AmqpPeer() as peer:
        configs = {
            "otlp-http": otlp_env(rotel.http_endpoint, "http/protobuf"),
            "console": {"SEE_SINKS": "console"},
            "otlp-grpc": otlp_env(rotel.grpc_endpoint, "grpc"),
            "otlp+eventhubs": {
                **otlp_env(rotel.http_endpoint, "http/protobuf"),
                "SEE_SINKS": "otlp,eventhubs",
                "SEE_EVENTHUB_CONNECTION_STRING": peer.connection_string("hub"),
            },
        }
        if args.quick:
            configs = {"otlp-http": configs["otlp-http"]}
        for name, values in configs.items():
            print(f"measuring {name}: {runs} runs ...", flush=True)
            samples = [one_run(sim, values) for _ in range(runs)]
            results[name] = {
                "first_poll_median": median([s["first_poll"] for s in samples]),
                "first_poll_max": max(s["first_poll"] for s in samples),
                "instance_median": median([s["instance"] for s in samples]),
                "samples": samples,
            }
    base = median(baseline)
    print_table(
        f"Start-up (s), median of {runs}; baseline python -c 'import urllib3' = {base:.3f} s",
        [
            "config",
            "first poll median",
            "first poll max",
            "to 1st IMDS request (imports+config)",
            "x baseline",
        ],
        [
            [
                name,
                r["first_poll_median"],
                r["first_poll_max"],
                r["instance_median"],
                r["first_poll_median"] / base,
            ]
            for name, r in results.items()
        ],
    )
    main_result = results["otlp-http"]
    summary = [
        SummaryRow(
            "startup",
            "spawn -> first poll, otlp-http, median (s)",
            f"<= {TARGET}",
            f"{main_result['first_poll_median']:.3f}",
            f"import urllib3 {base:.3f}",
            f"{main_result['first_poll_median'] / base:.2f}",
            main_result["first_poll_median"] <= TARGET,
        )
    ]
    for name, r in results.items():
        if name != "otlp-http":
            summary.append(
                SummaryRow(
                    "startup",
                    f"spawn -> first poll, {name}, median (s)",
                    "-",
                    f"{r['first_poll_median']:.3f}",
                    f"import urllib3 {base:.3f}",
                    f"{r['first_poll_median'] / base:.2f}",
                    None,
                )
            )
    save_results(
        "startup",
        {"quick": args.quick, "runs": runs, "baseline": baseline, "configs": results},
        summary,
    )


if __name__ == "__main__":
    main()
