"""Command line: ``run`` (default), ``check-config``, ``simulate``, ``demo``, ``version``."""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Sequence

from scheduled_events_exporter import __version__
from scheduled_events_exporter.config import Config, ConfigError, load_config

EXIT_CONFIG = 2


def _load() -> Config | None:
    try:
        return load_config()
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"configuration error: {problem}", file=sys.stderr)
        return None


def _run() -> int:
    config = _load()
    if config is None:
        return EXIT_CONFIG
    from scheduled_events_exporter.app import install_signal_handlers, run, setup_logging

    setup_logging(config.log_level)
    stop = threading.Event()
    install_signal_handlers(stop)
    return run(config, stop)


def _check_config() -> int:
    config = _load()
    if config is None:
        return EXIT_CONFIG
    for line in config.describe(os.environ):
        print(line)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``scheduled-events-exporter`` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="scheduled-events-exporter",
        description="Azure Scheduled Events → OpenTelemetry logs and metrics. Configured by "
        "SEE_* and OTEL_* environment variables (see README).",
    )
    parser.add_argument(
        "command",
        nargs="?",
        default="run",
        choices=["run", "check-config", "simulate", "demo", "version"],
    )
    known, rest = parser.parse_known_args(args[:1])
    rest += args[1:]
    if known.command == "simulate":
        from scheduled_events_exporter.simulator.cli import main as simulate

        return simulate(rest)
    if known.command == "demo":
        from scheduled_events_exporter.demo import main as demo

        return demo(rest)
    if rest:
        parser.error(f"unexpected arguments: {' '.join(rest)}")
    if known.command == "version":
        print(__version__)
        return 0
    if known.command == "check-config":
        return _check_config()
    return _run()
