"""Lock the exporter's whole runtime closure, and its build backend, with hashes.

Run from anywhere: ``python tools/lock.py`` (``--check`` re-resolves and compares without
writing; tests/test_lock.py runs it). It uses uv (pinned in the ``test`` extra, so
``.venv/bin/uv``) and writes:

* ``requirements/runtime.lock``: every distribution ``pyproject.toml``'s dependencies need, one
  version each, with the hashes of all its files, for every Python from 3.10 and every platform
  (``--universal``: the image's Python 3.13 on x86-64 and Arm64, the VMs' system Pythons 3.10
  to 3.14 under the systemd unit, 3.10 to 3.15 for the Windows service). The image installs
  from it with ``--require-hashes``.
* ``requirements/build.lock``: the build backend (``[build-system] requires``) the image builds
  the exporter's wheel with, also by hash.
* ``requirements/release.lock``: the release workflow's tools (``requirements/release.in``:
  ``build`` and ``cyclonedx-bom``), by hash, so the published wheel and SBOM come from known
  tools as the image does.

Resolution sees only what the index held at ``--exclude-newer`` (today when writing, the date
recorded in the file when checking), so a check on a later day gives the same answer unless
``pyproject.toml`` changed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[1]
LOCKS = {
    "runtime": REPO / "requirements" / "runtime.lock",
    "build": REPO / "requirements" / "build.lock",
    "release": REPO / "requirements" / "release.lock",
}
_EXCLUDE = re.compile(r"--exclude-newer (\S+)")


def uv() -> str:
    """uv from the project's virtualenv (the pinned one), else $UV or PATH."""
    for candidate in (os.environ.get("UV"), str(REPO / ".venv" / "bin" / "uv"), shutil.which("uv")):
        if candidate and Path(candidate).is_file():
            return candidate
    raise SystemExit("uv not found: pip install -e '.[test]' installs the pinned one into .venv")


def compile_lock(kind: str, exclude_newer: str, out: Path) -> None:
    """Resolve ``kind``'s requirements as of ``exclude_newer`` into ``out``."""
    common = ["--universal", "--python-version", "3.10", "--generate-hashes",
              "--exclude-newer", exclude_newer, "--no-progress", "--quiet"]
    with tempfile.TemporaryDirectory() as tmp:
        if kind == "runtime":
            source = "pyproject.toml"
        elif kind == "release":
            source = "requirements/release.in"
        else:
            requires = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"][
                "requires"]
            source = str(Path(tmp) / "build-requirements.in")
            Path(source).write_text("\n".join(requires) + "\n")
        done = subprocess.run(
            [uv(), "pip", "compile", source, *common, "--no-header", "-o", str(out)],
            cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"uv pip compile ({kind}) failed:\n{done.stderr}")
    header = (f"# The {kind} closure, locked with hashes by tools/lock.py (uv pip compile "
              f"--universal --python-version 3.10 --generate-hashes)\n"
              f"# --exclude-newer {exclude_newer}\n")
    body = out.read_text()
    # uv names the temporary input in "via" comments; name what it stands for.
    body = body.replace(source, "[build-system] requires") if kind == "build" else body
    out.write_text(header + body)


def recorded_date(path: Path) -> str:
    match = _EXCLUDE.search(path.read_text()) if path.exists() else None
    if match is None:
        raise SystemExit(f"{path}: no --exclude-newer line; run python tools/lock.py")
    return match.group(1)


def main(argv: list[str]) -> int:
    check = argv == ["--check"]
    if argv and not check:
        print("usage: python tools/lock.py [--check]", file=sys.stderr)
        return 2
    status = 0
    for kind, path in LOCKS.items():
        if check:
            with tempfile.TemporaryDirectory() as tmp:
                fresh = Path(tmp) / path.name
                compile_lock(kind, recorded_date(path), fresh)
                if fresh.read_text() != path.read_text():
                    print(f"{path.relative_to(REPO)} no longer matches pyproject.toml: run "
                          "python tools/lock.py and commit the result", file=sys.stderr)
                    status = 1
                else:
                    print(f"{path.relative_to(REPO)} matches pyproject.toml (resolved again "
                          f"as of {recorded_date(path)})")
        else:
            today = datetime.now(timezone.utc).strftime("%Y-%m-%dT00:00:00Z")
            path.parent.mkdir(exist_ok=True)
            compile_lock(kind, today, path)
            print(f"wrote {path.relative_to(REPO)} (as of {today})")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
