"""Resident memory of the exporter over time, per sink configuration, and what it imports.

Three exporter processes run at the same time against one in-process :class:`Simulator`
(they are idle 99 % of the time, so they hardly disturb each other):

* ``otlp-http``: ``SEE_SINKS=otlp``, http/protobuf, to a real ``rotel`` collector;
* ``otlp-grpc``: ``SEE_SINKS=otlp``, gRPC, to the same collector;
* ``otlp+eventhubs``: ``SEE_SINKS=otlp,eventhubs``, the Event Hubs sink talking AMQP to the
  local :class:`AmqpPeer` (the real ``azure-eventhub`` SDK).

All poll at the default 1 s with ``OTEL_METRIC_EXPORT_INTERVAL=10000``. So that every sink has
really delivered something (connections open, encoders warm), one event goes scheduled →
started → completed at 5/15/25 s and again every 2 minutes. ``VmRSS`` of each process is
sampled every 10 s (quick mode: every 5 s). Figures: RSS at the end (10 min; quick 50 s) and its
growth from minute 2 to the end (quick: from 20 s).

Baselines, each the median of 5 fresh processes: ``python -c pass`` and
``python -c "import opentelemetry.sdk"`` (the SDK alone, no exporter).

Import check: for each configuration a fresh process builds the :class:`Exporter` in-process
(no polling) and reports which heavy packages are in ``sys.modules``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from typing import Any

from benchlib import (
    ExporterProcess,
    SummaryRow,
    exporter_env,
    make_event,
    median,
    new_id,
    otlp_env,
    parse_args,
    print_table,
    rss_mib,
    save_results,
    temp_state_dir,
    threads,
    wait_first_poll,
)

from scheduled_events_exporter.simulator import Simulator
from tests.peers.amqp_peer import AmqpPeer
from tests.peers.rotel import RotelReceiver

TARGETS = {"otlp-http": 45.0, "otlp-grpc": 60.0, "otlp+eventhubs": 75.0}
GROWTH_LIMIT = 1.0  # MiB
HUB = "scheduled-events"

RSS_SNIPPET = (
    "import sys\n"
    "for m in sys.argv[1:]: __import__(m)\n"
    "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmRSS')][0])\n"
)

PROBE = r"""
import json, os, sys
from scheduled_events_exporter.config import load_config
from scheduled_events_exporter.app import Exporter
exporter = Exporter(load_config(dict(os.environ)))
prefixes = sys.argv[1:]
mods = list(sys.modules)
loaded = {p: sorted(m for m in mods if m == p or m.startswith(p + ".")).__len__() for p in prefixes}
rss = [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmRSS')][0]
print(json.dumps({"loaded": loaded, "modules": len(mods), "rss_kib": int(rss)}), flush=True)
os._exit(0)
"""

#: What the otlp-http configuration cannot do without: the SDK, its OTLP http exporters, urllib3.
STACK = [
    "opentelemetry.sdk.metrics",
    "opentelemetry.sdk._logs",
    "opentelemetry.sdk.resources",
    "opentelemetry.exporter.otlp.proto.http._log_exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "urllib3",
]

PACKAGES = [
    "grpc",
    "opentelemetry.exporter.otlp.proto.grpc",
    "opentelemetry.exporter.otlp.proto.http",
    "requests",
    "google.protobuf",
    "azure.eventhub",
    "azure.identity",
    "azure.core",
]


def baseline_rss(modules: list[str], runs: int = 5) -> float:
    """Median RSS (MiB) of a fresh interpreter after importing ``modules``."""
    values = []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-c", RSS_SNIPPET, *modules],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        values.append(int(out.strip()) / 1024)
    return median(values)


def lifecycles(sim: Simulator, stop: threading.Event, period: float) -> None:
    """One event scheduled → started → completed at 5/15/25 s, repeated every ``period``."""
    start = time.monotonic()
    cycle = 0
    while not stop.is_set():
        base = start + cycle * period
        event_id = new_id()
        for offset, events in (
            (5.0, [make_event(event_id, vm_name=sim.vm_name)]),
            (15.0, [make_event(event_id, "Started", vm_name=sim.vm_name)]),
            (25.0, []),
        ):
            if stop.wait(max(0.0, base + offset - time.monotonic())):
                return
            sim.set_events(events)
        cycle += 1


def probe_imports(sim_url: str, sinks: dict[str, dict[str, str]]) -> dict[str, Any]:
    """Which packages each configuration imports (Exporter built in a fresh process)."""
    out: dict[str, Any] = {}
    for name, values in sinks.items():
        with temp_state_dir() as state:
            env = exporter_env(sim_url, state, **values)
            proc = subprocess.run(
                [sys.executable, "-c", PROBE, *PACKAGES],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
        lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
        out[name] = json.loads(lines[-1]) if lines else {"error": proc.stderr[-500:]}
    return out


def main() -> None:
    args = parse_args(__doc__.splitlines()[0] if __doc__ else "")
    duration, every, growth_from = (50.0, 5.0, 20.0) if args.quick else (600.0, 10.0, 120.0)
    base_pass = baseline_rss([])
    base_sdk = baseline_rss(["opentelemetry.sdk"])
    base_stack = baseline_rss(STACK)
    print(
        f"baseline RSS: python -c pass {base_pass:.1f} MiB, import opentelemetry.sdk "
        f"{base_sdk:.1f} MiB, import SDK + OTLP http exporters + urllib3 {base_stack:.1f} MiB",
        flush=True,
    )
    samples: dict[str, list[tuple[float, float, int]]] = {name: [] for name in TARGETS}
    with (
        Simulator() as sim,
        RotelReceiver() as rotel,
        AmqpPeer() as peer,
        temp_state_dir() as s1,
        temp_state_dir() as s2,
        temp_state_dir() as s3,
    ):
        configs = {
            "otlp-http": exporter_env(
                sim.url, s1, **otlp_env(rotel.http_endpoint, "http/protobuf")
            ),
            "otlp-grpc": exporter_env(sim.url, s2, **otlp_env(rotel.grpc_endpoint, "grpc")),
            "otlp+eventhubs": exporter_env(
                sim.url,
                s3,
                **{
                    **otlp_env(rotel.http_endpoint, "http/protobuf"),
                    "SEE_SINKS": "otlp,eventhubs",
                    "SEE_EVENTHUB_CONNECTION_STRING": peer.connection_string(HUB),
                },
            ),
        }
        imports = probe_imports(
            sim.url,
            {
                "otlp-http": {
                    k: v for k, v in configs["otlp-http"].items() if k[:4] in ("SEE_", "OTEL")
                },
                "otlp-grpc": {
                    k: v for k, v in configs["otlp-grpc"].items() if k[:4] in ("SEE_", "OTEL")
                },
                "otlp+eventhubs": {
                    k: v for k, v in configs["otlp+eventhubs"].items() if k[:4] in ("SEE_", "OTEL")
                },
                "console": {"SEE_SINKS": "console"},
            },
        )
        sim.clear_requests()
        stop = threading.Event()
        procs = {name: ExporterProcess(env) for name, env in configs.items()}
        t0 = time.monotonic()
        try:
            wait_first_poll(sim)
            threading.Thread(target=lifecycles, args=(sim, stop, 120.0), daemon=True).start()
            tick = 1
            while (at := tick * every) <= duration:
                time.sleep(max(0.0, t0 + at - time.monotonic()))
                for name, proc in procs.items():
                    if proc.proc.poll() is not None:
                        raise RuntimeError(f"{name} exited: {proc.stderr()[-800:]}")
                    pid = proc.proc.pid
                    samples[name].append((at, rss_mib(pid), threads(pid)))
                if tick % 6 == 0 or args.quick:
                    print(
                        f"[{at:5.0f} s] "
                        + ", ".join(f"{n} {v[-1][1]:.1f} MiB" for n, v in samples.items()),
                        flush=True,
                    )
                tick += 1
        finally:
            stop.set()
            for proc in procs.values():
                proc.terminate()
        delivered = {
            "rotel_logs": len(rotel.logs),
            "eventhubs_messages": len(peer.received),
        }
    rows = []
    summary = []
    results: dict[str, Any] = {}
    for name, series in samples.items():
        end = series[-1][1]
        at_from = next(r for t, r, _ in series if t >= growth_from)
        growth = end - at_from
        peak = max(r for _, r, _ in series)
        results[name] = {
            "end_mib": end,
            "growth_mib": growth,
            "peak_mib": peak,
            "threads": series[-1][2],
            "series": series,
        }
        rows.append(
            [
                name,
                end,
                TARGETS[name],
                peak,
                growth,
                series[-1][2],
                end - base_stack,
                end / base_stack,
            ]
        )
        summary.append(
            SummaryRow(
                "memory",
                f"RSS after {duration:g} s, {name} (MiB)",
                f"<= {TARGETS[name]:g}",
                f"{end:.1f}",
                f"stack {base_stack:.1f} (pass {base_pass:.1f}, sdk {base_sdk:.1f})",
                f"{end / base_stack:.2f}x stack",
                end <= TARGETS[name],
            )
        )
        summary.append(
            SummaryRow(
                "memory",
                f"RSS growth {growth_from:g} s -> {duration:g} s, {name} (MiB)",
                f"<= {GROWTH_LIMIT:g}",
                f"{growth:+.2f}",
                "0",
                "-",
                abs(growth) <= GROWTH_LIMIT,
            )
        )
    print_table(
        f"Exporter RSS (MiB) after {duration:g} s; growth from {growth_from:g} s; baselines: "
        f"python -c pass {base_pass:.1f}, import opentelemetry.sdk {base_sdk:.1f}, "
        f"'stack' (SDK + OTLP http exporters + urllib3) {base_stack:.1f}",
        ["config", "RSS end", "target", "peak", "growth", "threads", "- stack", "/ stack"],
        rows,
    )
    print_table(
        "Modules imported by Exporter(config) (count of modules under each package)",
        ["config", "modules", "RSS MiB", *PACKAGES],
        [
            [
                name,
                v.get("modules"),
                v.get("rss_kib", 0) / 1024,
                *(v.get("loaded", {}).get(p) for p in PACKAGES),
            ]
            for name, v in imports.items()
        ],
    )
    grpc_in_http = imports.get("otlp-http", {}).get("loaded", {}).get("grpc", -1)
    hubs_in_http = imports.get("otlp-http", {}).get("loaded", {}).get("azure.eventhub", -1)
    summary.append(
        SummaryRow(
            "memory",
            "grpc / azure.eventhub modules loaded with http/protobuf only",
            "0 / 0",
            f"{grpc_in_http} / {hubs_in_http}",
            "-",
            "-",
            grpc_in_http == 0 and hubs_in_http == 0,
        )
    )
    print(f"delivered during the run: {delivered}")
    save_results(
        "memory",
        {
            "quick": args.quick,
            "duration": duration,
            "growth_from": growth_from,
            "baseline_pass_mib": base_pass,
            "baseline_sdk_mib": base_sdk,
            "baseline_stack_mib": base_stack,
            "stack_modules": STACK,
            "configs": results,
            "imports": imports,
            "delivered": delivered,
        },
        summary,
    )


if __name__ == "__main__":
    main()
