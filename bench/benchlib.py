"""Shared helpers for the benchmark scripts in ``bench/`` (not a benchmark itself).

Every script is run as ``/work/venv/bin/python bench/<name>.py [--quick]``; Python then puts
``bench/`` on ``sys.path``, so the scripts import this module as ``benchlib``. This module puts
the repository root on ``sys.path`` too, so the test peers (``tests.peers.rotel``,
``tests.peers.amqp_peer``, ``tests.exporter_process``) can be reused unchanged.

Conventions:

* Process CPU comes from ``/proc/<pid>/stat`` (utime + stime, clock ticks), RSS from
  ``/proc/<pid>/status`` (``VmRSS``): the same figures ``ps``/``top`` show.
* Each script writes its raw results to ``bench/results/<name>.json`` (``<name>.quick.json``
  in quick mode; the directory is git-ignored) with a
  ``summary`` list of :class:`SummaryRow` dicts that ``run_all.py`` turns into one table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
RESULTS = BENCH / "results"
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.exporter_process import ExporterProcess, clean_env, free_port  # noqa: E402

__all__ = [
    "BENCH",
    "REPO",
    "RESULTS",
    "SCHEDULED_EVENTS",
    "ExporterProcess",
    "SummaryRow",
    "clean_env",
    "cpu_seconds",
    "exporter_env",
    "free_port",
    "machine_info",
    "make_event",
    "median",
    "parse_args",
    "percentile",
    "print_table",
    "result_path",
    "rss_mib",
    "save_results",
    "temp_state_dir",
    "wait_first_poll",
]

CLK_TCK = os.sysconf("SC_CLK_TCK")
SCHEDULED_EVENTS = "/metadata/scheduledevents"


@dataclass(frozen=True)
class SummaryRow:
    """One line of the ``run_all.py`` summary."""

    bench: str
    metric: str
    target: str
    measured: str
    baseline: str
    ratio: str
    passed: bool | None  # None: informational, no target

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


def parse_args(description: str) -> argparse.Namespace:
    """The common command line: ``--quick`` for the CI smoke run."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--quick", action="store_true", help="short smoke run (< 60 s); figures are indicative"
    )
    return parser.parse_args()


# --- /proc readings ------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` in seconds (all its threads, not its children)."""
    with open(f"/proc/{pid}/stat") as handle:
        text = handle.read()
    fields = text[text.rindex(")") + 2 :].split()
    # After "pid (comm) ": state is fields[0]; utime and stime are stat fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mib(pid: int) -> float:
    """Resident set size of ``pid`` in MiB (``VmRSS``)."""
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def threads(pid: int) -> int:
    """Number of threads of ``pid``."""
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return 0


# --- statistics and output -----------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    """Median (NaN for no values)."""
    return statistics.median(values) if values else float("nan")


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile, ``q`` in [0, 100] (NaN for no values)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[rank]


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A plain aligned text table on stdout (numbers right-aligned, text left-aligned)."""
    cells = [[str(h) for h in headers], *[[_fmt(c) for c in row] for row in rows]]
    numeric = [
        all(isinstance(row[i], int | float) for row in rows) if rows else False
        for i in range(len(headers))
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    print(f"\n{title}")
    for index, row in enumerate(cells):
        pairs = enumerate(zip(row, widths, strict=True))
        print("  ".join(c.rjust(w) if numeric[i] else c.ljust(w) for i, (c, w) in pairs).rstrip())
        if index == 0:
            print("  ".join("-" * w for w in widths))
    sys.stdout.flush()


def _fmt(value: object) -> str:
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
    if value is None:
        return "-"
    return str(value)


def machine_info() -> dict[str, str]:
    """What the figures were measured on."""

    def run(*args: str) -> str:
        try:
            return subprocess.run(args, capture_output=True, text=True, timeout=10).stdout.strip()
        except OSError:
            return ""

    lscpu = {
        k.strip(): v.strip()
        for k, _, v in (line.partition(":") for line in run("lscpu").splitlines())
    }
    mem = run("free", "-h").splitlines()
    return {
        "nproc": run("nproc"),
        "cpu": lscpu.get("Model name", platform.processor()),
        "hypervisor": lscpu.get("Hypervisor vendor", ""),
        "memory": mem[1].split()[1] if len(mem) > 1 else "",
        "python": platform.python_version(),
        "kernel": platform.release(),
        "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def result_path(name: str, quick: bool) -> Path:
    """``bench/results/<name>.json`` (full run) or ``<name>.quick.json`` (quick run)."""
    return RESULTS / f"{name}{'.quick' if quick else ''}.json"


def save_results(name: str, data: Mapping[str, Any], summary: Sequence[SummaryRow]) -> Path:
    """Write the raw data, machine and summary rows to :func:`result_path`."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = result_path(name, bool(data.get("quick")))
    payload = {
        "bench": name,
        "machine": machine_info(),
        "data": data,
        "summary": [row.as_dict() for row in summary],
    }
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(f"\nraw results: {path.relative_to(REPO)}")
    return path


# --- the exporter under test ---------------------------------------------------------------


@contextmanager
def temp_state_dir() -> Iterator[str]:
    """A fresh state directory (the exporter's default keeps state; so do we)."""
    with tempfile.TemporaryDirectory(prefix="see-bench-") as path:
        yield path


def exporter_env(imds_url: str, state_dir: str, **values: str) -> dict[str, str]:
    """The exporter's environment: simulator, state dir, loopback health port, plus ``values``."""
    env = clean_env(
        SEE_IMDS_ENDPOINT=imds_url,
        SEE_STATE_DIR=state_dir,
        SEE_HEALTH_ADDR=f"127.0.0.1:{free_port()}",
        SEE_LOG_LEVEL="warning",
        PYTHONUNBUFFERED="1",
    )
    env.update(values)
    return dict(env)


def otlp_env(endpoint: str, protocol: str, metric_interval_ms: int = 10_000) -> dict[str, str]:
    """OTLP sink settings (only the standard OTEL variables, as a user would set them)."""
    return {
        "SEE_SINKS": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_METRIC_EXPORT_INTERVAL": str(metric_interval_ms),
    }


def wait_first_poll(sim: Any, timeout: float = 30.0) -> None:
    """Wait until the simulator answered at least one Scheduled Events GET."""
    if not sim.wait_for_requests(1, timeout, method="GET", path_prefix=SCHEDULED_EVENTS):
        raise RuntimeError(f"no Scheduled Events request within {timeout} s")


def make_event(
    event_id: str,
    status: str = "Scheduled",
    *,
    vm_name: str = "vm-bench",
    event_type: str = "Freeze",
    minutes_ahead: float = 15.0,
    index: int = 0,
) -> dict[str, object]:
    """An IMDS event as the platform writes it (RFC 1123 NotBefore, empty once Started)."""
    not_before = datetime.now(timezone.utc) + timedelta(minutes=minutes_ahead)
    return {
        "EventId": event_id,
        "EventType": event_type,
        "ResourceType": "VirtualMachine",
        "Resources": [vm_name if index % 2 == 0 else f"{vm_name}-{index}"],
        "EventStatus": status,
        "NotBefore": ""
        if status == "Started"
        else not_before.strftime("%a, %d %b %Y %H:%M:%S GMT"),
        "Description": "Virtual machine is being paused because of a memory-preserving "
        "Live Migration operation.",
        "EventSource": "Platform",
        "DurationInSeconds": 5,
    }


def new_id() -> str:
    """A fresh EventId in the platform's upper-case GUID form."""
    return str(uuid.uuid4()).upper()


def events_document(count: int, *, vm_name: str = "vm-bench") -> list[dict[str, object]]:
    """``count`` distinct Scheduled events (half of them affecting this VM)."""
    return [make_event(new_id(), vm_name=vm_name, index=i) for i in range(count)]


def wall() -> float:
    """Wall clock (seconds since the epoch), the clock rotel's arrival times use."""
    return time.time()
