"""``scheduled-events-exporter simulate``: serve the simulated IMDS from the command line."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from email.utils import formatdate
from types import FrameType

from scheduled_events_exporter.simulator.scenarios import (
    DEFAULT_VM_NAME,
    ScenarioError,
    list_scenarios,
    load_scenario,
)
from scheduled_events_exporter.simulator.server import SCHEDULED_EVENTS_PATH, is_loopback
from scheduled_events_exporter.simulator.service import PlayedStep, Simulator


def _print_step(played: PlayedStep) -> None:
    def one(e: Mapping[str, object]) -> str:
        resources = e.get("Resources")
        names = ",".join(map(str, resources)) if isinstance(resources, list) else "?"
        when = f" NotBefore {e['NotBefore']}" if e.get("NotBefore") else ""
        return (f"{e.get('EventType', '?')} {e.get('EventStatus', '?')} "
                f"{str(e.get('EventId'))[:8]} for {names}{when}")

    summary = "; ".join(one(e) for e in played.events) or "no events"
    note = f" ({played.step.note})" if played.step.note else ""
    print(f"[{played.elapsed:6.1f} s] {played.scenario} step {played.index + 1}/{played.total}"
          f"{note}: incarnation {played.incarnation}: {summary}", file=sys.stderr, flush=True)
    if played.index + 1 == played.total:
        print(f"[{played.elapsed:6.1f} s] {played.scenario} finished", file=sys.stderr, flush=True)


def main(argv: Sequence[str]) -> int:
    """``scheduled-events-exporter simulate``: serve IMDS until SIGINT/SIGTERM; exit status."""
    parser = argparse.ArgumentParser(prog="scheduled-events-exporter simulate",
                                     description="Serve a simulated Azure IMDS on loopback.")
    parser.add_argument("--host", default="127.0.0.1", help="loopback address only")
    parser.add_argument("--port", type=int, default=8099, help="TCP port (default %(default)s)")
    parser.add_argument("--scenario", help="bundled scenario name or path to a scenario .json")
    parser.add_argument("--speed", type=float, help="speed factor (default: the scenario's)")
    parser.add_argument("--loop", action="store_true", help="replay the scenario forever")
    parser.add_argument("--vm-name", help="this VM's name (default: the scenario's)")
    parser.add_argument("--list", action="store_true", help="list bundled scenarios and exit")
    parser.add_argument("--api-versions", metavar="V1,V2,...",
                        help="serve only these Scheduled Events api-versions (default: every "
                             "documented one); others get HTTP 400 with newest-versions, as "
                             "IMDS answers a version it no longer serves")
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exc:  # argparse exits on --help and on errors; the caller wants a code
        return exc.code if isinstance(exc.code, int) else 2
    try:
        if args.list:
            names = list_scenarios()
            width = max(map(len, names), default=0)
            for name in names:
                sc = load_scenario(name)
                print(f"{name:{width}} {sc.real_duration():4.0f} s at x{sc.speed:<4g} "
                      f"{sc.description}")
            return 0
        if not is_loopback(args.host):
            raise ValueError(f"--host must be a loopback address (127.0.0.1, ::1, localhost), "
                             f"got {args.host!r}")
        if args.speed is not None and args.speed <= 0:
            raise ValueError(f"--speed must be > 0, got {args.speed}")
        scenario = load_scenario(args.scenario) if args.scenario else None
        versions = [v.strip() for v in (args.api_versions or "").split(",") if v.strip()]
        if args.api_versions is not None and not versions:
            raise ValueError("--api-versions needs at least one version")
    except (ScenarioError, ValueError) as exc:
        print(f"simulate: {exc}", file=sys.stderr)
        return 2
    vm_name = args.vm_name or (scenario.vm_name if scenario else DEFAULT_VM_NAME)
    sim = Simulator(host=args.host, port=args.port, vm_name=vm_name,
                    instance=scenario.instance if scenario else None)
    if versions:
        sim.set_api_versions(versions)
    try:
        sim.start()
    except OSError as exc:
        print(f"simulate: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    # Signal handlers can only be set from the main thread; elsewhere the caller stops us.
    main_thread = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, on_signal)
                for s in (signal.SIGINT, signal.SIGTERM)} if main_thread else {}
    try:
        print(f"IMDS simulator for VM {vm_name} at {sim.url} since {formatdate(usegmt=True)}; "
              f"try: curl -H Metadata:true "
              f"'{sim.url}{SCHEDULED_EVENTS_PATH}?api-version={(versions or ['2020-07-01'])[-1]}'",
              file=sys.stderr,
              flush=True)
        if scenario is not None:
            sim.play(scenario, speed=args.speed, loop=args.loop, on_step=_print_step)
        stop.wait()
    finally:
        sim.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
