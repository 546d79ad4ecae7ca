"""Run every benchmark (each in its own process, one after the other) and print one summary.

``/work/venv/bin/python bench/run_all.py [--quick] [--only NAME ...] [--summary-only]``

Each script writes ``bench/results/<name>.json`` (``<name>.quick.json`` with ``--quick``); this
script runs them, then reads those files and prints the target / measured / baseline / ratio /
pass table. ``--summary-only`` prints the
table from the existing result files without running anything. A script that fails is reported
as FAIL with its exit code; the others still run. Exit code: 0 if every target passed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

from benchlib import BENCH, machine_info, print_table, result_path

#: In the order they run: cheap and CPU-sensitive ones on a quiet machine first.
BENCHES = ("tracker", "startup", "e2e_delay", "cpu", "routes", "memory", "soak", "outage")


def run(name: str, quick: bool) -> tuple[int, float]:
    """Run ``bench/<name>.py``; (exit code, seconds)."""
    cmd = [sys.executable, str(BENCH / f"{name}.py"), *(["--quick"] if quick else [])]
    print(f"\n=== {' '.join(cmd[1:])}", flush=True)
    t0 = time.monotonic()
    code = subprocess.run(cmd).returncode
    return code, time.monotonic() - t0


def load(name: str, quick: bool) -> dict[str, Any] | None:
    """The result file of ``name`` (quick or full run), if any."""
    path = result_path(name, quick)
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--quick", action="store_true", help="quick mode of every script")
    parser.add_argument("--only", nargs="+", choices=BENCHES, help="run only these")
    parser.add_argument("--summary-only", action="store_true", help="do not run, just summarise")
    args = parser.parse_args()
    names = list(args.only or BENCHES)
    outcome: dict[str, tuple[int, float]] = {}
    if not args.summary_only:
        for name in names:
            outcome[name] = run(name, args.quick)
    rows: list[list[object]] = []
    all_passed = True
    for name in names:
        code, _ = outcome.get(name, (0, float("nan")))
        data = load(name, args.quick)
        if code != 0 or data is None:
            got = f"exit {code}" if code else "no results"
            rows.append([name, "script", "exit 0", got, "-", "-", "FAIL"])
            all_passed = False
            continue
        mode = "quick" if data.get("data", {}).get("quick") else "full"
        for row in data["summary"]:
            verdict = {True: "pass", False: "FAIL", None: "info"}[row["passed"]]
            all_passed = all_passed and row["passed"] is not False
            rows.append(
                [
                    f"{name} ({mode})",
                    row["metric"],
                    row["target"],
                    row["measured"],
                    row["baseline"],
                    row["ratio"],
                    verdict,
                ]
            )
    info = machine_info()
    print_table(
        f"Summary ({info['nproc']} cores {info['cpu']}, Python {info['python']}, "
        f"load {info['loadavg']})",
        ["bench", "figure", "target", "measured", "baseline", "ratio", "result"],
        rows,
    )
    if outcome:
        print("\nwall time: " + ", ".join(f"{n} {s:.0f} s" for n, (_, s) in outcome.items()))
    sys.exit(0 if all_passed else 1)


if __name__ == "__main__":
    main()
