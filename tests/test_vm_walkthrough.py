"""docs/vm.md's walkthrough, its own commands run as far as a machine without systemd as PID 1
allows: the virtualenv from the system Python (step 3, under a strict umask), the unit and the
environment file in place and the unit verified by systemd-analyze (step 4), check-config
--env-file as the service sees it (step 5), and the installed command run by another user, as
the unit's DynamicUser= runs it. The paths move under a temporary root; sudo is dropped (the
tests run as root). Not tried here: systemctl, journalctl and a real dynamic user."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduled_events_exporter import __version__

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "vm.md"
PREFIX = "/opt/scheduled-events-exporter"
UNIT_DIR = "/etc/systemd/system/"
ETC = "/etc/scheduled-events-exporter"
STATE = "/var/lib/scheduled-events-exporter"
SYSTEM_PYTHON = "/usr/bin/python3"

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(sys.platform == "win32" or not hasattr(os, "geteuid") or os.geteuid() != 0,
                       reason="the walkthrough is run as root on Linux (sudo dropped)"),
]


def step(number: int) -> str:
    """The shell commands of docs/vm.md's step ``number`` (its first bash block)."""
    text = DOC.read_text(encoding="utf-8")
    section = re.search(rf"^## {number}\. .*?(?=^## )", text, re.S | re.M)
    assert section, f"docs/vm.md has no step {number}"
    block = re.search(r"```bash\n(.*?)```", section.group(0), re.S)
    assert block, f"docs/vm.md step {number} has no bash block"
    return block.group(1)


def moved(commands: str, root: Path) -> str:
    """``commands`` with sudo dropped and the system paths under ``root``."""
    commands = re.sub(r"\bsudo (env )?", lambda m: "env " if m.group(1) else "", commands)
    for path in (PREFIX, UNIT_DIR.rstrip("/"), ETC, STATE):
        commands = commands.replace(path, f"{root}{path}")
    return commands


def shell(commands: str, *, umask: int = 0o022, timeout: float = 420
          ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SEE_", "OTEL_", "VIRTUAL_ENV", "PYTHON"))}
    return subprocess.run(["bash", "-euo", "pipefail", "-c", commands], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False,
                          umask=umask)


@pytest.fixture(scope="module")
def root() -> Iterator[Path]:
    """A root every user may traverse (pytest's tmp_path is under a 0700 directory), with the
    walkthrough's step 3 done: the virtualenv installed in its /opt, as root with umask 077
    (a hardened image's), which the step's own umask must overcome."""
    if not Path(SYSTEM_PYTHON).exists():
        pytest.skip(f"no system Python at {SYSTEM_PYTHON}")
    with tempfile.TemporaryDirectory(prefix="see-vm-") as top:
        base = Path(top)
        base.chmod(0o755)
        for path in (PREFIX, ETC, STATE):
            (base / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        (base / UNIT_DIR.lstrip("/")).mkdir(parents=True, mode=0o755)  # systemd's own
        done = shell(moved(step(3), base), umask=0o077)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.strip() == __version__, done.stdout
        yield base


def test_the_virtualenv_is_made_from_the_system_python(root: Path) -> None:
    config = (root / PREFIX.lstrip("/") / "pyvenv.cfg").read_text(encoding="utf-8")
    assert f"home = {Path(SYSTEM_PYTHON).parent}" in config, config
    assert (root / PREFIX.lstrip("/") / "bin" / "python3").resolve().is_relative_to("/usr")


def test_the_services_user_runs_the_installed_command(root: Path) -> None:
    """DynamicUser= gives the service a uid of its own, with no access to root's files: what
    uid 65534 can run, it can (nothing under /root or /home, every file readable)."""
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux)")
    command = root / PREFIX.lstrip("/") / "bin" / "scheduled-events-exporter"
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                           str(command), "version"], capture_output=True, text=True,
                          timeout=60, check=False, env={"PATH": "/usr/bin:/bin"})
    assert (done.returncode, done.stdout.strip()) == (0, __version__), done.stderr


def test_the_unit_and_env_file_go_in_place_and_the_unit_verifies(root: Path) -> None:
    commands = [line for line in moved(step(4), root).splitlines()
                if not line.startswith("sudoedit")]
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze missing: .ci/run installs Debian's systemd package")
    # The installed unit runs the installed command, moved under the temporary root like it.
    unit = root / UNIT_DIR.lstrip("/") / "scheduled-events-exporter.service"
    install = [c for c in commands if "systemd-analyze" not in c]
    done = shell("\n".join(install))
    assert done.returncode == 0, done.stderr
    unit.write_text(unit.read_text(encoding="utf-8").replace(PREFIX, f"{root}{PREFIX}"),
                    encoding="utf-8")
    verify = next(c for c in commands if "systemd-analyze verify" in c)
    done = shell(verify.replace("systemd-analyze", analyze, 1))
    assert (done.returncode, done.stdout + done.stderr) == (0, ""), done.stdout + done.stderr
    env_file = root / ETC.lstrip("/") / "env"
    assert (env_file.stat().st_mode & 0o777, unit.stat().st_mode & 0o777) == (0o600, 0o644)


def test_check_config_as_the_service_sees_it(root: Path) -> None:
    env_file = root / ETC.lstrip("/") / "env"
    if not env_file.exists():  # (the test above puts it there; alone, this one does)
        env_file.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / "config" / "systemd" / "scheduled-events-exporter.env", env_file)
    done = shell(moved(step(5), root))
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr  # the shipped file, as shipped: no warning
    assert "SEE_SINKS=otlp\n" in done.stdout
    assert "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318\n" in done.stdout
    assert f"SEE_STATE_DIR={root}{STATE}\n" in done.stdout
    assert not (root / STATE.lstrip("/")).exists()  # check-config creates nothing
    # A typo in the file is said, in the same run, with the name it meant.
    with env_file.open("a", encoding="utf-8") as f:
        f.write("SEE_POLL_INTERVALL=5\n")
    typo = shell(moved(step(5), root))
    assert typo.returncode == 0
    assert "SEE_POLL_INTERVALL is set, but the exporter reads no variable of that name: it " \
           "has no effect; did you mean SEE_POLL_INTERVAL?" in typo.stderr, typo.stderr
