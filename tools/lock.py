"""Lock the exporter's runtime closure, route by route, and its build backend, with hashes.

Run from anywhere: ``python tools/lock.py`` (``--check`` re-resolves and compares without
writing; tests/test_lock.py runs it). It uses uv (pinned in the ``test`` extra, so
``.venv/bin/uv``) and writes, for every Python from 3.10 and every platform (``--universal``:
the images' Python 3.13 on x86-64 and Arm64, the systemd unit's 3.10 and 3.12, the Windows
service):

* ``requirements/runtime.lock``: the core, every distribution ``pyproject.toml``'s
  dependencies need (IMDS, console, OTLP over HTTP, the Prometheus scrape), one version each,
  with the hashes of all its files, for every Python from 3.10 and every platform
  (``--universal``: the image's Python 3.13 on x86-64 and Arm64, the VMs' system Pythons 3.10
  to 3.14 under the systemd unit, 3.10 to 3.15 for the Windows service). The slim image
  installs exactly this.
* ``requirements/extra-grpc.lock``, ``requirements/extra-eventhubs.lock`` and
  ``requirements/extra-platform.lock``: what each extra adds to the core, nothing the core
  already has (two extras may share a distribution, e.g. azure-identity: each layer lists it,
  with the same pin, and pip takes the duplicate once). An install with extras takes the core and
  the layers of its extras together (``-r runtime.lock -r extra-grpc.lock``); the default
  image, CI and the release take all four (the ``all`` extra).
* ``requirements/build.lock``: the build backend (``[build-system] requires``) the image builds
  the exporter's wheel with, also by hash.
* ``requirements/release.lock``: the release workflow's tools (``requirements/release.in``:
  ``build`` and ``cyclonedx-bom``), by hash, so the published wheel and SBOM come from known
  tools as the image does.

The layers are cut from one resolution: the whole closure (every extra) is resolved first, and
the core and each extra are resolved again constrained to its versions, so a distribution two
routes share (typing-extensions, protobuf) has one version in every combination and every
combination of layers is a consistent install. (One file with markers cannot do this: a
requirements file has no marker for "this extra was asked for".)

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
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[1]
REQUIREMENTS = REPO / "requirements"
#: The extras whose layers are locked, in the order the images install them.
EXTRAS = ("grpc", "eventhubs", "platform")
LOCKS = {
    "runtime": REQUIREMENTS / "runtime.lock",
    **{f"extra-{extra}": REQUIREMENTS / f"extra-{extra}.lock" for extra in EXTRAS},
    "build": REQUIREMENTS / "build.lock",
    "release": REQUIREMENTS / "release.lock",
}
_EXCLUDE = re.compile(r"--exclude-newer (\S+)")
_COMMON = ["--universal", "--python-version", "3.10", "--generate-hashes", "--no-progress",
           "--quiet", "--no-header"]


def uv() -> str:
    """uv from the project's virtualenv (the pinned one), else $UV or PATH."""
    for candidate in (os.environ.get("UV"), str(REPO / ".venv" / "bin" / "uv"), shutil.which("uv")):
        if candidate and Path(candidate).is_file():
            return candidate
    raise SystemExit("uv not found: pip install -e '.[test]' installs the pinned one into .venv")


def entries(text: str) -> list[str]:
    """The entries of a uv lock (``name==version [; marker]``, its hashes and its "via" lines),
    without the header comments."""
    return [entry.rstrip("\n") + "\n" for entry in re.split(r"\n(?=[A-Za-z0-9])", text)
            if entry.strip() and not entry.startswith("#")]


def requirement_line(entry: str) -> str:
    """``name==version [; marker]``: what identifies an entry."""
    return entry.split(" \\", 1)[0].strip()


def _compile(args: list[str], exclude_newer: str, tmp: Path, *, drop_via: str = "") -> str:
    out = Path(tempfile.mkstemp(dir=tmp, suffix=".txt")[1])
    done = subprocess.run([uv(), "pip", "compile", *args, *_COMMON, "--exclude-newer",
                           exclude_newer, "-o", str(out)],
                          cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"uv pip compile {' '.join(args)} failed:\n{done.stderr}")
    text = out.read_text()
    return _without_via(text, drop_via) if drop_via else text


def _without_via(text: str, source: str) -> str:
    """The lock without ``source`` among the "via" lines (the constraints file that keeps the
    layers on one resolution is not why a distribution is there), in uv's own layout."""
    kept = []
    for entry in entries(text):
        head, _, via = entry.partition("    # via")
        reasons = [r.strip().removeprefix("#").strip() for r in via.splitlines()]
        reasons = [r for r in reasons if r and source not in r]
        if len(reasons) == 1:
            kept.append(f"{head}    # via {reasons[0]}\n")
        else:
            kept.append(head + "    # via\n" + "".join(f"    #   {r}\n" for r in reasons))
    return "".join(kept)


def _header(what: str, exclude_newer: str) -> str:
    return (f"# {what}, locked with hashes by tools/lock.py (uv pip compile "
            f"--universal --python-version 3.10 --generate-hashes)\n"
            f"# --exclude-newer {exclude_newer}\n")


def _resolve_routes(exclude_newer: str, tmp: Path, constraints: Path | None) -> list[str]:
    """The closure of the core and of the core with each extra (at once: uv spends these
    seconds waiting on the index), optionally constrained to ``constraints``' versions."""
    pinned = ["-c", str(constraints)] if constraints else []
    with ThreadPoolExecutor() as pool:
        return list(pool.map(
            lambda extra: _compile(["pyproject.toml", *extra, *pinned], exclude_newer, tmp,
                                   drop_via=str(constraints) if constraints else ""),
            [[], *(["--extra", extra] for extra in EXTRAS)]))


def _agree(closures: list[str]) -> bool:
    """Whether each distribution has the same pins (one, or one per marker) in every closure
    that holds it."""
    seen: dict[str, set[frozenset[str]]] = {}
    for closure in closures:
        lines: dict[str, set[str]] = {}
        for entry in entries(closure):
            line = requirement_line(entry)
            lines.setdefault(re.split(r"[=;\s]", line, maxsplit=1)[0], set()).add(line)
        for name, pins in lines.items():
            seen.setdefault(name, set()).add(frozenset(pins))
    return all(len(variants) == 1 for variants in seen.values())


def compile_runtime(exclude_newer: str, out_dir: Path) -> None:
    """The core lock and one layer per extra: each extra's closure less the core's."""
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        closures = _resolve_routes(exclude_newer, tmp, None)
        if not _agree(closures):
            # An extra moved a shared distribution: resolve every extra at once, and each route
            # again within those versions, so that every combination is one consistent install.
            whole = entries(_compile(["pyproject.toml", "--extra", "all"], exclude_newer, tmp))
            constraints = tmp / "whole-closure.txt"
            constraints.write_text("".join(requirement_line(e) + "\n" for e in whole))
            closures = _resolve_routes(exclude_newer, tmp, constraints)
        core, *with_extras = closures
        in_core = {requirement_line(e) for e in entries(core)}
        (out_dir / "runtime.lock").write_text(
            _header("The runtime closure of the core (no extra)", exclude_newer) + core)
        for extra, with_extra in zip(EXTRAS, with_extras, strict=True):
            missing = in_core - {requirement_line(e) for e in entries(with_extra)}
            if missing:
                raise SystemExit(f"the {extra} extra's closure lacks the core's {sorted(missing)}")
            layer = [e for e in entries(with_extra) if requirement_line(e) not in in_core]
            (out_dir / f"extra-{extra}.lock").write_text(
                _header(f"What the {extra} extra adds to requirements/runtime.lock (install "
                        f"both: -r requirements/runtime.lock -r requirements/extra-{extra}.lock)",
                        exclude_newer) + "".join(layer))


def compile_lock(kind: str, exclude_newer: str, out: Path) -> None:
    """Resolve ``kind``'s requirements (build or release) as of ``exclude_newer`` into ``out``."""
    with tempfile.TemporaryDirectory() as tmp:
        if kind == "release":
            source = "requirements/release.in"
        else:
            requires = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"][
                "requires"]
            source = str(Path(tmp) / "build-requirements.in")
            Path(source).write_text("\n".join(requires) + "\n")
        body = _compile([source], exclude_newer, Path(tmp))
    # uv names the temporary input in "via" comments; name what it stands for.
    body = body.replace(source, "[build-system] requires") if kind == "build" else body
    out.write_text(_header(f"The {kind} closure", exclude_newer) + body)


#: What is resolved on its own: the extras' layers are written with the runtime lock.
RESOLVED = ("runtime", "build", "release")


def write(kind: str, exclude_newer: str, out_dir: Path) -> None:
    """Write ``kind``'s lock into ``out_dir`` (``runtime``: the core and the extras' layers)."""
    if kind == "runtime":
        compile_runtime(exclude_newer, out_dir)
    else:
        compile_lock(kind, exclude_newer, out_dir / LOCKS[kind].name)


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
    if check:
        with tempfile.TemporaryDirectory() as tmp:
            with ThreadPoolExecutor() as pool:
                list(pool.map(lambda kind: write(kind, recorded_date(LOCKS[kind]), Path(tmp)),
                              RESOLVED))
            for path in LOCKS.values():
                fresh = Path(tmp) / path.name
                if not path.exists() or fresh.read_text() != path.read_text():
                    print(f"{path.relative_to(REPO)} no longer matches pyproject.toml: run "
                          "python tools/lock.py and commit the result", file=sys.stderr)
                    status = 1
                else:
                    print(f"{path.relative_to(REPO)} matches pyproject.toml (resolved again "
                          f"as of {recorded_date(path)})")
    else:
        today = datetime.now(timezone.utc).strftime("%Y-%m-%dT00:00:00Z")
        REQUIREMENTS.mkdir(exist_ok=True)
        with ThreadPoolExecutor() as pool:
            list(pool.map(lambda kind: write(kind, today, REQUIREMENTS), RESOLVED))
        for path in LOCKS.values():
            print(f"wrote {path.relative_to(REPO)} (as of {today})")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
