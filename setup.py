"""What a build of this tree is called: the release, plus the commit unless it is the release's
tag (docs/decisions.md, "A version that names its build").

Everything else about the package is in pyproject.toml; setuptools runs this file for every
build (``pip install .``, ``pip install -e .``, ``pip wheel``, ``python -m build``, the
Dockerfile). The version it settles is the distribution's (the wheel's name, ``pip show``) and
is written into the package as ``_build.py``, which ``scheduled_events_exporter.__version__``
reads: ``version``, the start line, ``service.version`` and the records' ``ExporterVersion``.
It comes from the first of these that applies:

1. ``SCHEDULED_EVENTS_EXPORTER_VERSION``, when set: the whole version, which must be RELEASE or
   RELEASE+<local part>. The Dockerfile passes its ``VERSION`` build argument here (its build
   context has no ``.git``), the release workflow the tag's version.
2. git, when this directory is a git work tree: RELEASE when the tag ``v<RELEASE>`` points at
   HEAD and no tracked file differs from it; otherwise RELEASE+g<the commit's first 7 hex
   digits>, with ``.dirty`` added when tracked files differ (PEP 440 local version).
3. ``.git_archival.txt``, in a ``git archive`` (GitHub's "Download ZIP" and release archives
   are ones): git wrote the commit and its refs into it (``export-subst`` in .gitattributes),
   read as in 2, a tagged commit giving RELEASE.
4. ``PKG-INFO``, in an unpacked sdist: the version the sdist was made with.
5. RELEASE+unknown, said on stderr: a copy without its history (a copied tree, a tarball of
   the files), or git refusing the repository (another user's clone: "dubious ownership").

RELEASE is ``src/scheduled_events_exporter/__init__.py``'s, read without importing it.
``python3 setup.py --print-version`` prints the version without building anything and without
setuptools (what README's image build passes as ``VERSION``).

A wheel is built from a clean ``build/lib``: setuptools copies the sources there and packs
whatever it finds, so a module left there by an earlier build of another commit would ship.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from email.parser import HeaderParser
from pathlib import Path

ROOT = Path(__file__).resolve().parent
PACKAGE = "scheduled_events_exporter"
OVERRIDE = "SCHEDULED_EVENTS_EXPORTER_VERSION"
#: PEP 440's local version label (normalised: lower case, dot-separated alphanumerics).
_LOCAL = re.compile(r"[a-z0-9]+(?:\.[a-z0-9]+)*")
#: Variables that would point git at another repository than this directory's.
_GIT_REDIRECTS = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_COMMON_DIR",
                  "GIT_OBJECT_DIRECTORY", "GIT_CEILING_DIRECTORIES")


def release() -> str:
    """RELEASE from the package's ``__init__.py`` (a string literal assigned at module level)."""
    init = ROOT / "src" / PACKAGE / "__init__.py"
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
                and any(getattr(target, "id", None) == "RELEASE" for target in node.targets)):
            return node.value.value
    raise SystemExit(f"{init}: no RELEASE = \"X.Y.Z\" line; expected the release number there")


def checked(version: str, base: str, source: str) -> str:
    """``version`` if it is ``base`` or ``base+<local>``; else the build stops with one line."""
    public, plus, local = version.strip().lower().partition("+")
    if public != base or (plus and not _LOCAL.fullmatch(local)):
        raise SystemExit(f"{source}={version!r}: expected {base} (a tagged release) or "
                         f"{base}+<local part> (letters, digits and dots, e.g. {base}+g56159e4): "
                         f"{base} is the release in src/{PACKAGE}/__init__.py")
    return f"{public}{plus}{local}"


def _git(*args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in _GIT_REDIRECTS}
    # --no-optional-locks: reading never rewrites the index (a root build in another user's
    # clone must leave nothing of root's behind).
    done = subprocess.run(["git", "--no-optional-locks", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=False, timeout=60)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        raise RuntimeError(lines[0] if lines else f"git {' '.join(args)}: exit {done.returncode}")
    return done.stdout.strip()


def from_git(base: str) -> str:
    """The version of this work tree's HEAD (raises RuntimeError or OSError when git cannot
    tell)."""
    commit = _git("rev-parse", "--verify", "HEAD")
    dirty = _git("status", "--porcelain", "--untracked-files=no") != ""
    tagged = f"v{base}" in _git("tag", "--points-at", "HEAD").split()
    if tagged and not dirty:
        return base
    return f"{base}+g{commit[:7]}{'.dirty' if dirty else ''}"


def from_archive(base: str) -> str:
    """The version ``git archive`` recorded in ``.git_archival.txt``, or "" when it is not one
    (in a checkout the file holds git's placeholders, not their values)."""
    try:
        fields = dict(line.partition(": ")[::2] for line in
                      (ROOT / ".git_archival.txt").read_text(encoding="utf-8").splitlines())
    except OSError:
        return ""
    commit = fields.get("node", "")
    if not re.fullmatch(r"[0-9a-f]{40,64}", commit):
        return ""
    tags = {ref.strip().removeprefix("tag: ") for ref in fields.get("refs", "").split(",")
            if ref.strip().startswith("tag: ")}
    return base if f"v{base}" in tags else f"{base}+g{commit[:7]}"


def version() -> str:
    """The version a build of this tree gets (the module docstring says from where)."""
    base = release()
    given = os.environ.get(OVERRIDE, "").strip()
    if given:
        return checked(given, base, OVERRIDE)
    why = "no .git here, no git archive's .git_archival.txt and no PKG-INFO"
    if (ROOT / ".git").exists():  # a directory in a clone, a file in a git worktree
        try:
            return from_git(base)
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
            why = f"git could not read this clone ({exc})"
    archived = from_archive(base)
    if archived:
        return archived
    pkg_info = ROOT / "PKG-INFO"
    if pkg_info.is_file():
        headers = HeaderParser().parsestr(pkg_info.read_text(encoding="utf-8"))
        return checked(headers.get("Version", ""), base, "PKG-INFO Version")
    print(f"setup.py: version {base}+unknown: {why}; build from a git clone, or set "
          f"{OVERRIDE}", file=sys.stderr)
    return f"{base}+unknown"


def write_build_file(directory: Path, built: str) -> None:
    """``_build.py`` in the package ``directory``: what ``__init__.py`` reads at run time."""
    (directory / "_build.py").write_text(
        '"""Written by setup.py when this package was built: the build\'s version."""\n\n'
        f"VERSION = {json.dumps(built)}\n", encoding="utf-8")


if __name__ == "__main__" and sys.argv[1:] == ["--print-version"]:
    print(version())
    raise SystemExit(0)

if __name__ == "__main__":  # setuptools runs this file as __main__, every build
    from setuptools import setup
    from setuptools.command.build_py import build_py

    VERSION = version()

    class BuildPy(build_py):
        """The sources into a clean ``build/lib``, and ``_build.py`` beside them."""

        def run(self) -> None:
            if self.editable_mode:
                # An editable install imports the source tree itself: the file goes there
                # (ignored by git), and says what the tree was at install time.
                write_build_file(ROOT / "src" / PACKAGE, VERSION)
                return
            build_lib = Path(self.build_lib).resolve()
            if build_lib.is_relative_to(ROOT / "build"):
                shutil.rmtree(build_lib, ignore_errors=True)
            super().run()
            write_build_file(build_lib / PACKAGE, VERSION)

    setup(version=VERSION, cmdclass={"build_py": BuildPy})
