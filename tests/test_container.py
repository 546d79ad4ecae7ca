"""The container image's promises, kept without a container engine.

No container engine runs here, so the test does what the ``Dockerfile`` describes by other
means: it builds the wheel, installs it into a fresh virtualenv (the image's ``pip install .``),
reads the final stage's ``ENV``, ``USER``, ``VOLUME``, ``ENTRYPOINT``/``CMD`` and ``HEALTHCHECK``
from the Dockerfile itself, and runs the entry point under bubblewrap as that user with the
whole filesystem read-only except the state volume, and a network namespace of its own (so
port 8080 is the sandbox's, as in a container). Inside the sandbox the simulator plays the
``live-migration`` scenario on loopback; the exporter runs with the image's environment only
(plus where IMDS is). Checked: the transitions arrive (console sink, the image's default),
the state file is written to the volume, ``/healthz`` answers and the ``HEALTHCHECK`` command
exits 0 inside the sandbox, nothing else is writable, and SIGTERM ends the exporter with 0.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.exporter_process import ExporterProcess, wait_until
from tests.sandbox import bwrap_command, descendants, require_bwrap

REPO = Path(__file__).resolve().parents[1]


def final_stage(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the last stage, continuation lines joined."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    instructions = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        if word.upper() == "FROM":
            instructions = []
        instructions.append((word.upper(), rest.strip()))
    return instructions


def image(dockerfile: Path) -> dict[str, object]:
    """What the image promises: env, user, volume, entry point + command, health check."""
    env: dict[str, str] = {}
    out: dict[str, object] = {"env": env}
    for word, rest in final_stage(dockerfile):
        if word == "ENV":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                env[key] = value
        elif word == "USER":
            uid, _, gid = rest.partition(":")
            out["uid"], out["gid"] = int(uid), int(gid or uid)
        elif word == "VOLUME":
            (out["volume"],) = json.loads(rest)
        elif word in ("ENTRYPOINT", "CMD"):
            out[word] = json.loads(rest)
        elif word == "HEALTHCHECK":
            out["healthcheck"] = json.loads(rest[rest.index("CMD ") + 4:])
    return out


def test_the_dockerfile_is_read_as_expected() -> None:
    promised = image(REPO / "Dockerfile")
    assert promised["uid"] == 10001 and promised["gid"] == 10001
    assert promised["volume"] == "/var/lib/scheduled-events-exporter"
    assert promised["ENTRYPOINT"] == ["scheduled-events-exporter"] and promised["CMD"] == ["run"]
    env = promised["env"]
    assert isinstance(env, dict) and env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["SEE_STATE_DIR"] == promised["volume"]
    healthcheck = promised["healthcheck"]
    assert isinstance(healthcheck, list) and healthcheck[0] == "python"


@pytest.mark.timeout(600)
def test_wheel_in_a_fresh_venv_runs_as_the_image_promises(tmp_path: Path) -> None:
    require_bwrap()
    promised = image(REPO / "Dockerfile")
    quiet = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    wheels = tmp_path / "wheels"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                            str(wheels), str(REPO)], timeout=300, check=False, **quiet)
    assert built.returncode == 0, built.stdout
    (wheel,) = wheels.glob("*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    installed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                                "--disable-pip-version-check", str(wheel)], timeout=400,
                               check=False, **quiet)
    assert installed.returncode == 0, installed.stdout

    state = tmp_path / "volume"
    state.mkdir()
    env_promised = promised["env"]
    assert isinstance(env_promised, dict)
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": "/tmp",
           **env_promised, "SEE_IMDS_ENDPOINT": "http://127.0.0.1:8099"}
    entry = [*promised["ENTRYPOINT"], *promised["CMD"]]  # type: ignore[misc]
    healthcheck = shlex.join(promised["healthcheck"])  # type: ignore[arg-type]
    script = f"""
        scheduled-events-exporter simulate --scenario live-migration --port 8099 \\
            >/tmp/simulator.log 2>&1 &
        simulator=$!
        {shlex.join(entry)} &
        exporter=$!
        if touch /etc/see-probe /usr/see-probe 2>/dev/null; then echo "root is writable" >&2; fi
        tries=0  # the health server needs a moment: retried quietly, as --start-period allows
        until {healthcheck} 2>/dev/null; do
            tries=$((tries + 1))
            if [ $tries -ge 300 ]; then break; fi
            sleep 0.1
        done
        {healthcheck}
        echo "HEALTHCHECK exit $?" >&2
        wait $exporter
        echo "exporter exit $?" >&2
        kill $simulator  # else it outlives the test (its namespace keeps it from the host only)
    """
    command = bwrap_command(["/bin/sh", "-c", script], state=state,
                            uid=int(promised["uid"]),  # type: ignore[call-overload]
                            gid=int(promised["gid"]),  # type: ignore[call-overload]
                            own_network=True, visible=[venv])
    with ExporterProcess(env, command=command) as proc:
        proc.wait_for(lambda: "HEALTHCHECK exit" in proc.stderr(), 60, "the HEALTHCHECK")
        assert "HEALTHCHECK exit 0" in proc.stderr(), proc.stderr()
        records = proc.wait_for_records(3, timeout=90)
        wait_until(lambda: (state / "state.json").exists(), 10, "the state file on the volume")
        saved = json.loads((state / "state.json").read_text())
        exporter = next(
            pid for pid in descendants(proc.proc.pid)
            if _argv(pid)[-1:] == [b"run"] and any(b"scheduled-events-exporter" in a
                                                    for a in _argv(pid)))
        os.kill(exporter, signal.SIGTERM)
        proc.wait_for(lambda: "exporter exit" in proc.stderr(), 30, "the exporter's exit")
    log = proc.stderr()
    assert "exporter exit 0" in log, log
    assert "root is writable" not in log and "Traceback" not in log, log
    assert [(r["EventType"], r["Transition"]) for r in records[:3]] == [
        ("Freeze", "scheduled"), ("Freeze", "started"), ("Freeze", "completed")]
    assert saved["schema"] == 1 and saved["seq"] >= 3


def _argv(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().rstrip(b"\0").split(b"\0")
    except OSError:
        return []
