"""A version that names its build (setup.py; docs/decisions.md, "A version that names its
build"): the wheel built from a commit says that commit in the installed command's ``version``,
the commit tagged ``v<RELEASE>`` says the plain release, and every other route (an sdist, a
modified tree, a tree without git, the Dockerfile's VERSION) says what it is.

Each case builds in a repository of its own: the build inputs of this working tree (setup.py,
pyproject.toml, src/, ...) committed there, so the commit is new and the code is the code under
test, whatever this clone's own state. The build backend is requirements/build.lock's, installed
by hash, as the Dockerfile and the release build with it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduled_events_exporter import RELEASE

REPO = Path(__file__).resolve().parents[1]
#: What a build reads: the package's metadata and sources (setup.py, pyproject.toml's readme and
#: licence, the simulator's scenario files), and what git ignores.
INPUTS = ("setup.py", "pyproject.toml", "README.md", "LICENSE", "src", "config/scenarios",
          ".gitignore", ".gitattributes", ".git_archival.txt")
COMMAND = "bin/scheduled-events-exporter"

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(shutil.which("git") is None or sys.platform == "win32",
                       reason="builds from git commits (Linux)"),
]


def run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, check=False,
                          env={**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, **(env or {})})
    if check:
        assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-2000:])
    return done


def git(repo: Path, *args: str) -> str:
    return run("git", "-c", "user.name=test", "-c", "user.email=test@example.invalid", *args,
               cwd=repo).stdout.strip()


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Python with the locked build backend and `build` (requirements/build.lock and
    release.lock, every file by hash), as the release workflow has it."""
    venv = tmp_path_factory.mktemp("backend") / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=REPO)
    run(venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
        "--require-hashes", "--no-deps", "-r", REPO / "requirements" / "build.lock",
        "-r", REPO / "requirements" / "release.lock", cwd=REPO)
    return venv / "bin" / "python"


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty virtualenv the built wheels are installed into (without dependencies:
    ``version`` imports none of them)."""
    venv = tmp_path_factory.mktemp("target") / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=REPO)
    return venv


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[Path]:
    """A git repository whose one commit is this working tree's build inputs."""
    root = tmp_path / "src-tree"
    root.mkdir()
    listed = run("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--",
                 *INPUTS, cwd=REPO).stdout.split("\0")
    for name in filter(None, listed):
        source, dest = REPO / name, root / name
        if not source.is_symlink() and not source.exists():
            continue  # deleted in the working tree, not yet in the index
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest, follow_symlinks=False)
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "the build under test")
    yield root


def build_wheel(backend: Path, tree: Path, out: Path, env: dict[str, str] | None = None
                ) -> Path:
    """``pip wheel`` of ``tree`` with the locked backend, as the Dockerfile builds."""
    run(backend, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
        "--no-build-isolation", "-w", out, tree, cwd=tree, env=env)
    (wheel,) = out.glob("*.whl")
    return wheel


def installed_version(target: Path, wheel: Path) -> str:
    """What the installed command prints for ``version`` (and the same for ``--version``)."""
    run(target / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
        "--no-deps", "--force-reinstall", wheel, cwd=target)
    printed = run(target / COMMAND, "version", cwd=target).stdout.strip()
    assert run(target / COMMAND, "--version", cwd=target).stdout.strip() == printed
    # What service.version, ExporterVersion and the start line read, and pip's metadata.
    module = run(target / "bin" / "python", "-c", "import scheduled_events_exporter as p, "
                 "importlib.metadata as m; print(p.__version__, m.version("
                 "'azure-scheduled-events-exporter'))", cwd=target).stdout.split()
    assert module == [printed, printed], (module, printed)
    return printed


def test_a_build_of_a_commit_names_it_and_its_tag_the_plain_release(
        backend: Path, target: Path, tree: Path, tmp_path: Path) -> None:
    commit = git(tree, "rev-parse", "HEAD")
    wheel = build_wheel(backend, tree, tmp_path / "untagged")
    expected = f"{RELEASE}+g{commit[:7]}"
    assert installed_version(target, wheel) == expected
    assert wheel.name.startswith(f"azure_scheduled_events_exporter-{expected}-"), wheel.name
    # The release: the same commit, tagged.
    git(tree, "tag", "-a", f"v{RELEASE}", "-m", f"v{RELEASE}")
    tagged = build_wheel(backend, tree, tmp_path / "tagged")
    assert installed_version(target, tagged) == RELEASE
    assert tagged.name.startswith(f"azure_scheduled_events_exporter-{RELEASE}-"), tagged.name
    # A tree that differs from its commit is not that commit, nor the release.
    readme = tree / "README.md"
    readme.write_text(readme.read_text(encoding="utf-8") + "\nlocal change\n", encoding="utf-8")
    dirty = build_wheel(backend, tree, tmp_path / "dirty")
    assert installed_version(target, dirty) == f"{RELEASE}+g{commit[:7]}.dirty"
    # The builds changed no tracked file, and left only what git ignores (build/, *.egg-info).
    assert git(tree, "diff", "--name-only") == "README.md"
    assert git(tree, "status", "--porcelain", "--untracked-files=all").splitlines() == [
        "M README.md"]


def test_the_release_route_sdist_then_wheel_keeps_the_commit(
        backend: Path, target: Path, tree: Path, tmp_path: Path) -> None:
    """``python -m build`` (the release workflow) makes the sdist from the tree, then the wheel
    from the unpacked sdist, which has no .git: the sdist's PKG-INFO carries the version."""
    commit = git(tree, "rev-parse", "HEAD")
    out = tmp_path / "dist"
    run(backend, "-m", "build", "--no-isolation", "--outdir", out, tree, cwd=tree)
    expected = f"{RELEASE}+g{commit[:7]}"
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    assert sdist.name == f"azure_scheduled_events_exporter-{expected}.tar.gz", sdist.name
    assert installed_version(target, wheel) == expected


def test_a_git_archive_names_its_commit_and_its_tag(backend: Path, target: Path, tree: Path,
                                                   tmp_path: Path) -> None:
    """``git archive`` (GitHub's source downloads are ones) has no .git: it writes the commit
    and its refs into .git_archival.txt (export-subst)."""
    commit = git(tree, "rev-parse", "HEAD")
    untagged = archive(tree, tmp_path / "untagged")
    assert installed_version(target, build_wheel(backend, untagged, tmp_path / "w1")) \
        == f"{RELEASE}+g{commit[:7]}"
    git(tree, "tag", "-a", f"v{RELEASE}", "-m", f"v{RELEASE}")
    tagged = archive(tree, tmp_path / "tagged")
    assert installed_version(target, build_wheel(backend, tagged, tmp_path / "w2")) == RELEASE


def archive(tree: Path, into: Path) -> Path:
    into.mkdir()
    data = subprocess.run(["git", "archive", "HEAD"], cwd=tree, capture_output=True,
                          check=True, timeout=60).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=data, check=True, timeout=60)
    return into


def test_without_history_the_build_says_so_and_takes_a_given_version(
        backend: Path, target: Path, tree: Path, tmp_path: Path) -> None:
    """A copy of the files alone (the Dockerfile's context has no .git) is ``+unknown``
    unless given its version, which must be this release's."""
    export = tmp_path / "export"
    shutil.copytree(tree, export, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    wheel = build_wheel(backend, export, tmp_path / "unknown")
    assert installed_version(target, wheel) == f"{RELEASE}+unknown"
    given = f"{RELEASE}+g0123456"
    wheel = build_wheel(backend, export, tmp_path / "given",
                        env={"SCHEDULED_EVENTS_EXPORTER_VERSION": given})
    assert installed_version(target, wheel) == given
    refused = run(backend, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                  tmp_path / "refused", export, cwd=export, check=False,
                  env={"SCHEDULED_EVENTS_EXPORTER_VERSION": "9.9.9"})
    assert refused.returncode != 0
    assert (f"SCHEDULED_EVENTS_EXPORTER_VERSION='9.9.9': expected {RELEASE} (a tagged release) "
            f"or {RELEASE}+<local part>") in refused.stdout + refused.stderr
    printed = run(sys.executable, export / "setup.py", "--print-version", cwd=export)
    assert printed.stdout.strip() == f"{RELEASE}+unknown"
    assert "no .git here, no git archive's .git_archival.txt and no PKG-INFO" in printed.stderr


def test_a_module_left_in_build_lib_is_not_packed(backend: Path, tree: Path,
                                                 tmp_path: Path) -> None:
    """setuptools packs whatever build/lib holds; an earlier build of another commit must not
    ship its modules (the upgrade that installed a module the new version had dropped)."""
    stale = tree / "build" / "lib" / "scheduled_events_exporter"
    stale.mkdir(parents=True)
    (stale / "dropped_module.py").write_text("STALE = True\n", encoding="utf-8")
    (tree / "build" / "lib" / "stale_top_level.py").write_text("STALE = True\n",
                                                                 encoding="utf-8")
    wheel = build_wheel(backend, tree, tmp_path / "wheel")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert not [n for n in names if "dropped_module" in n or "stale_top_level" in n], names
    assert "scheduled_events_exporter/_build.py" in names
