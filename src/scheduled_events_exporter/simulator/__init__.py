"""A faithful Azure IMDS (Scheduled Events + instance metadata) on loopback:
docs/semantics.md#simulator.

A second product beside the exporter, like amazon-ec2-metadata-mock beside the AWS node
termination handler: the exporter's tests, benchmarks and ``demo`` use it, and the exporter core
never imports it (an import-linter contract in ``pyproject.toml`` keeps it so). Standard library
only.

- :mod:`.scenarios`: scenario files (steps, faults), loading and validation; no HTTP.
- :mod:`.server`: the HTTP face: request checks, response shapes, the threaded server.
- :mod:`.service`: :class:`Simulator`, the state and playback behind the server.
- :mod:`.cli`: ``scheduled-events-exporter simulate``.
"""

from __future__ import annotations

from scheduled_events_exporter.simulator.scenarios import (
    DEFAULT_VM_NAME,
    Fault,
    Scenario,
    ScenarioError,
    list_scenarios,
    load_scenario,
)
from scheduled_events_exporter.simulator.server import RequestLogEntry
from scheduled_events_exporter.simulator.service import PlayedStep, Simulator

__all__ = [
    "DEFAULT_VM_NAME",
    "Fault",
    "PlayedStep",
    "RequestLogEntry",
    "Scenario",
    "ScenarioError",
    "Simulator",
    "list_scenarios",
    "load_scenario",
]
