"""``scheduled-events-exporter demo``: simulator + exporter + console sink in one process.

The first thing a newcomer runs: no Azure, no configuration. It plays an accelerated scenario
against a loopback IMDS and prints what the exporter ships (JSON lines on stdout, one readable
line per transition on stderr), then exits.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import threading
from collections.abc import Sequence
from typing import NoReturn

from scheduled_events_exporter.app import Exporter, setup_logging
from scheduled_events_exporter.config import ConfigError, load_config
from scheduled_events_exporter.demo_summary import RecordCollector, summarize
from scheduled_events_exporter.platforms import stop as stop_requests
from scheduled_events_exporter.simulator import Simulator
from scheduled_events_exporter.simulator.scenarios import (
    ScenarioError,
    list_scenarios,
    load_scenario,
)


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one line (no usage block) and exits 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see --help)\n")


def _number(text: str, low: float, high: float, expected: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and low < value <= high):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def _positive(text: str) -> float:
    return _number(text, 0.0, 1e6, "a speed factor above 0, e.g. 30")


def _interval(text: str) -> float:
    return _number(text, 0.2 - 1e-9, 3600.0, "a poll interval in seconds from 0.2 to 3600")


def main(argv: Sequence[str]) -> int:
    """Run the demo; exit 0 when the scenario has played and every record was printed."""
    parser = _Parser(
        prog="scheduled-events-exporter demo",
        description="Play a scenario against a simulated IMDS on loopback and print what the "
        "exporter ships: JSON lines on stdout, one readable line per transition and a closing "
        "summary on stderr. No Azure and no configuration needed; SEE_APPROVE* is honoured, "
        "the other SEE_*/OTEL_EXPORTER_* variables are ignored.")
    parser.add_argument(
        "--scenario",
        default="demo",
        help=f"scenario name or file (bundled: {', '.join(list_scenarios())})",
    )
    parser.add_argument(
        "--speed",
        type=_positive,
        default=None,
        help="virtual seconds per real second, above 0 (default: the scenario's own)",
    )
    parser.add_argument("--interval", type=_interval, default=1.0,
                        help="poll interval in seconds, 0.2 to 3600 (default 1)")
    args = parser.parse_args(list(argv))
    try:
        scenario = load_scenario(args.scenario)
    except ScenarioError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    simulator = Simulator.for_scenario(scenario)
    simulator.start()
    # The demo ignores the user's sink and endpoint settings but honours approval, so
    # ``SEE_APPROVE=user scheduled-events-exporter demo`` shows the reboot approved and started.
    env = {
        k: v
        for k, v in os.environ.items()
        if k.startswith("SEE_APPROVE") or not k.startswith(("SEE_", "OTEL_EXPORTER"))
    }
    env.update(
        SEE_IMDS_ENDPOINT=simulator.url,
        SEE_SINKS="console",
        SEE_STATE_DIR="",
        SEE_HEALTH_ADDR="",
        SEE_POLL_INTERVAL=str(args.interval),
    )
    try:
        config = load_config(env)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"configuration error: {problem}", file=sys.stderr)
        simulator.stop()
        return 2
    setup_logging("INFO")
    stop, finished = threading.Event(), threading.Event()
    stop_requests.install(stop, finished)
    speed = args.speed or scenario.speed
    print(
        f"demo: playing scenario {scenario.name!r} ({scenario.real_duration(speed):.0f} s) "
        f"against a simulated IMDS at {simulator.url}: {scenario.description}",
        file=sys.stderr,
    )
    print(f"demo: the scenario runs x{speed:g}: records measure real seconds (so every notice "
          f"is far below the documented minimum); the summary adds scenario time",
          file=sys.stderr)
    collector = RecordCollector()
    exporter = Exporter(config, observers=[collector])
    exporter.start()
    done = simulator.play(scenario, speed=speed)
    # Wait for the scenario, then for a few more polls so its last change is seen too.
    while not stop.is_set() and not done.wait(0.2):
        pass
    stop.wait(3 * config.poll_interval)
    exporter.stop()
    finished.set()
    simulator.stop()
    for line in summarize(collector.snapshot(), speed):
        print(line, file=sys.stderr)
    print(
        "demo: done. Next: point it at a real collector with SEE_SINKS=otlp and "
        "OTEL_EXPORTER_OTLP_ENDPOINT (see README).",
        file=sys.stderr,
    )
    return 0
