""".ci/run's own scaffolding: its exit status is the run's, whatever its background jobs did.

A run that passed every test once exited 1: the EXIT trap killed background jobs that had
already ended, `kill` failed for them, and `set -e` made that the script's status. These tests
run the scaffolding exactly as `.ci/run` defines it (the functions are cut from the file, not
copied) around three endings: a run that passes, a background job that fails, and a run that
stops early while a job still runs.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

RUN = Path(__file__).resolve().parents[1] / ".ci" / "run"


def _scaffolding() -> str:
    """The phase, cleanup, cpu_used, background and settle functions and the trap, as .ci/run
    has them."""
    text = RUN.read_text(encoding="utf-8")
    phase = re.search(r"^phase\(\) \{.*\}$", text, re.M)
    cleanup = re.search(r"^cleanup\(\) \{\n.*?^trap cleanup EXIT$", text, re.M | re.S)
    jobs = re.search(
        r"^cpu_used\(\) \{.*?^background\(\) \{.*?^settle\(\) \{.*?^\}$", text, re.M | re.S)
    assert phase and cleanup and jobs, (
        f"{RUN} no longer defines phase, cleanup, cpu_used, background and settle")
    return "\n".join(("set -euo pipefail", phase.group(0), cleanup.group(0), jobs.group(0)))


def _run(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "run"
    script.write_text(_scaffolding() + "\n" + body, encoding="utf-8")
    return subprocess.run(
        ["bash", str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env={**os.environ, "SEE_PACKAGE_ROOTS": ""},
    )


def _assert_counted(stdout: str) -> None:
    """The last CPU line counts what burned CPU (more than 0.05 s of user time)."""
    used = re.findall(r"^CPU: user (\d+)m([\d.]+)s, system \d+m[\d.]+s$", stdout, re.M)
    assert used, stdout
    minutes, seconds = used[-1]
    assert int(minutes) * 60 + float(seconds) > 0.05, f"CPU time not counted: {stdout}"


def test_a_run_whose_background_jobs_all_ended_exits_0_and_removes_the_package_folders(
    tmp_path: Path,
) -> None:
    roots, builds = tmp_path / "roots", tmp_path / "builds"
    body = f"""
mkdir -p .ci/logs {roots} {builds}
SEE_PACKAGE_ROOTS={roots}
SEE_PACKAGE_BUILDS={builds}
true & package_jobs=($!)
background quick true
settle quick "a job that passes"
wait "${{package_jobs[0]}}"  # ended and reaped: the cleanup's kill finds no such process
python3 -c "sum(range(10**7))"
phase "done"
cpu_used
"""
    done = _run(tmp_path, body)
    assert done.returncode == 0, done.stderr
    assert "== done" in done.stdout
    _assert_counted(done.stdout)
    assert not roots.exists() and not builds.exists()


def test_a_background_job_that_fails_fails_the_run_with_its_status(tmp_path: Path) -> None:
    body = """
mkdir -p .ci/logs
background broken bash -c 'echo what it said; python3 -c "sum(range(10**7))"; exit 3'
settle broken "a job that fails"
phase "done"
"""
    done = _run(tmp_path, body)
    assert done.returncode == 3
    assert "what it said" in done.stdout
    _assert_counted(done.stdout)
    assert "FAILED: a job that fails (exit status 3)" in done.stderr
    assert "== done" not in done.stdout


def test_a_run_that_stops_early_keeps_its_status_and_stops_what_still_runs(
    tmp_path: Path,
) -> None:
    pid_file = tmp_path / "slow.pid"
    body = f"""
mkdir -p .ci/logs
background slow bash -c 'echo $$ > {pid_file}; exec sleep 300'
while [ ! -s {pid_file} ]; do sleep 0.05; done
exit 2  # a lint failed
"""
    done = _run(tmp_path, body)
    assert done.returncode == 2, done.stderr
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    pytest.fail("the background job still ran after the run stopped")
