"""`.ci/other-pythons.sh` cannot pass without Python 3.14 and 3.15 where CI runs it.

The script, copied with what building the wheel needs, runs as `.ci/run` runs it (as root in
CI) with only 3.14 and 3.15 asked for and a Debian mirror that refuses connections, so the
unstable root those interpreters come from cannot be built. As root it must fail and say so;
without root (a developer's machine, where mmdebstrap cannot run) it must skip them with a
notice and pass. The root's successful build and the runs inside it are what `.ci/run` does on
every CI run (docs/decisions.md, "CI per interpreter").
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def checkout(into: Path) -> Path:
    """The script and what `pip wheel .` reads, without build leftovers or virtualenvs."""
    into.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, into / name)
    shutil.copytree(REPO / "src", into / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    (into / ".ci").mkdir()
    shutil.copy2(REPO / ".ci" / "other-pythons.sh", into / ".ci" / "other-pythons.sh")
    return into


@pytest.mark.timeout(300)
def test_python_3_14_and_3_15_are_not_skipped_silently(tmp_path: Path) -> None:
    for v in ("3.14", "3.15"):
        if shutil.which(f"python{v}", path=PATH):
            pytest.skip(f"this machine has python{v} itself: the script takes it, not Debian's")
    root = checkout(tmp_path / "checkout")
    (tmp_path / "home").mkdir()
    (tmp_path / "tmp").mkdir()
    with socket.socket() as closed:
        # Bound, never listening: a connection to it is refused, and no one else takes the port.
        closed.bind(("127.0.0.1", 0))
        mirror = f"http://127.0.0.1:{closed.getsockname()[1]}/debian"
        env = {k: v for k, v in os.environ.items() if k not in ("OTHER_PYTHONS", "PYENV_ROOT")}
        env.update(OTHER_PYTHONS="3.14 3.15", SID_MIRROR=mirror, PYTHON=sys.executable,
                   PATH=PATH, HOME=str(tmp_path / "home"), TMPDIR=str(tmp_path / "tmp"))
        done = subprocess.run(["bash", ".ci/other-pythons.sh"], cwd=root, env=env,
                              capture_output=True, text=True, timeout=280)
    said = done.stdout + done.stderr
    if os.geteuid() != 0:
        assert done.returncode == 0, said
        assert "notice: no Python 3.14 3.15 on this machine" in said, said
        assert "their checks are skipped" in said, said
        return
    if not (shutil.which("mmdebstrap", path=PATH) and shutil.which("bwrap", path=PATH)):
        assert done.returncode == 1, said
        assert "no mmdebstrap or bwrap" in said, said
        return
    assert done.returncode == 1, said
    assert "FAILED: the Debian unstable root for Python 3.14 3.15 could not be built" in said, said
    # apt's own reason is shown, not only that it failed.
    assert "Could not connect to 127.0.0.1" in said, said
    assert "FAILED: Python 3.14 3.15: the Debian unstable root could not be built" in done.stderr
    assert not list((tmp_path / "tmp").iterdir()), "the half-built root was left behind"
