"""docs/vm.md's from-source walkthrough, its own commands run as far as a machine without
systemd as PID 1 allows: the unit and the environment file in place (step 3), the build into a
new virtualenv from the system Python, checked by check-config --unit before anything switches
(step 4, under a strict umask), the switch of the link the unit runs and the unit verified by
systemd-analyze (step 5), check-config --unit as the service sees it (step 6), the installed
command run by another user as the unit's DynamicUser= runs it, and the upgrade and the
rollback. (The packages have tests/test_os_packages.py.) The user's clone is a
clone of a repository holding this working tree (so the code under test is this tree's,
committed), to which the test adds the commit an upgrade pulls. The system paths move under a
temporary root; sudo is dropped (the tests run as root), and systemctl with it. Not tried here:
systemctl, journalctl and a real dynamic user."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from scheduled_events_exporter import RELEASE

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "vm.md"
PREFIX = "/opt/scheduled-events-exporter"
UNIT_DIR = "/etc/systemd/system/"
ETC = "/etc/scheduled-events-exporter"
STATE = "/var/lib/scheduled-events-exporter"
SYSTEM_PYTHON = "/usr/bin/python3"
UNIT_NAME = "scheduled-events-exporter.service"
#: A module only the first build has: the upgrade's commit removes it.
FIRST_ONLY = "src/scheduled_events_exporter/only_in_the_first_build.py"
#: What a root ``pip install .`` in the clone used to leave there, found by the next build.
PLANTED = "build/lib/scheduled_events_exporter/left_by_an_old_build.py"

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(sys.platform == "win32" or not hasattr(os, "geteuid") or os.geteuid() != 0,
                       reason="the walkthrough is run as root on Linux (sudo dropped)"),
]


def section(title: str) -> str:
    """The shell commands of docs/vm.md's section ``title`` (a regex; its first bash block)."""
    text = DOC.read_text(encoding="utf-8")
    found = re.search(rf"^###? {title}\n.*?(?=^###? |\Z)", text, re.S | re.M)
    assert found, f"docs/vm.md has no section {title!r}"
    block = re.search(r"```bash\n(.*?)```", found.group(0), re.S)
    assert block, f"docs/vm.md's section {title!r} has no bash block"
    return block.group(1)


def step(number: int) -> str:
    """The shell commands of docs/vm.md's from-source step ``number``."""
    return section(rf"{number}\. .*")


def operator_edits(env_file: Path) -> None:
    """What step 3's sudoedit does here: the OTLP lines uncommented (shipped, no sink is named)."""
    text = env_file.read_text(encoding="utf-8")
    env_file.write_text(re.sub(r"^#((?:SEE_SINKS|OTEL_EXPORTER_OTLP_\w+)=)", r"\1", text,
                               flags=re.M), encoding="utf-8")


def move_unit(root: Path) -> Path:
    """The installed unit's paths moved under the temporary root like the files it names."""
    unit = root / UNIT_DIR.lstrip("/") / UNIT_NAME
    text = unit.read_text(encoding="utf-8")
    for path in (PREFIX, ETC):
        text = text.replace(path, f"{root}{path}")
    unit.write_text(text, encoding="utf-8")
    return unit


def install_unit(root: Path, clone: Path) -> Path:
    """Step 3 (not sudoedit: operator_edits), the unit's paths moved."""
    commands = [line for line in moved(step(3), root).splitlines()
                if not line.startswith("sudoedit")]
    done = shell("\n".join(commands), cwd=clone)
    assert done.returncode == 0, done.stderr
    return move_unit(root)


def moved(commands: str, root: Path) -> str:
    """``commands`` with sudo dropped, systemctl's lines left out (no systemd here) and the
    system paths under ``root``."""
    commands = "\n".join(line for line in commands.splitlines()
                         if not line.startswith("sudo systemctl "))
    commands = re.sub(r"\bsudo (env )?", lambda m: "env " if m.group(1) else "", commands)
    for path in (PREFIX, UNIT_DIR.rstrip("/"), ETC, STATE):
        commands = commands.replace(path, f"{root}{path}")
    return commands


def shell(commands: str, *, cwd: Path, umask: int = 0o022, timeout: float = 600
          ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SEE_", "OTEL_", "VIRTUAL_ENV", "PYTHON"))}
    return subprocess.run(["bash", "-euo", "pipefail", "-c", commands], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False,
                          umask=umask)


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid",
                           *args], cwd=repo, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, (args, done.stderr)
    return done.stdout.strip()


def built(commit: str) -> str:
    """What ``version`` prints for a build of ``commit`` (untagged)."""
    return f"{RELEASE}+g{commit[:7]}"


@dataclass(frozen=True)
class Walkthrough:
    """The temporary root, the upstream repository and the user's clone of it (step 2)."""

    root: Path
    upstream: Path
    clone: Path
    first: str  # the commit step 3 installs


@pytest.fixture(scope="module")
def walk() -> Iterator[Walkthrough]:
    """A root every user may traverse (pytest's tmp_path is under a 0700 directory), with the
    walkthrough's steps 3 to 5 done in the user's clone: the unit and the environment file in
    place, the virtualenv built and checked, the link switched to it, as root with umask 077 (a
    hardened image's), which the steps' own umask must overcome."""
    if not Path(SYSTEM_PYTHON).exists():
        pytest.skip(f"no system Python at {SYSTEM_PYTHON}")
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze missing: .ci/run installs Debian's systemd package")
    with tempfile.TemporaryDirectory(prefix="see-vm-") as top:
        base = Path(top)
        base.chmod(0o755)
        root, upstream, clone = base / "root", base / "upstream", base / "clone"
        for path in (PREFIX, ETC, STATE):
            (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        (root / UNIT_DIR.lstrip("/")).mkdir(parents=True, mode=0o755)  # systemd's own
        # Upstream: this working tree (tracked and new files, not what git ignores), committed,
        # with one module more that the next commit removes.
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard"], cwd=REPO, capture_output=True,
                                check=True, timeout=60).stdout.decode().split("\0")
        for name in filter(None, listed):
            source = REPO / name
            if source.is_symlink() or source.exists():
                (upstream / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, upstream / name, follow_symlinks=False)
        (upstream / FIRST_ONLY).write_text('"""Only in the first build."""\n', encoding="utf-8")
        git(upstream, "init", "-q", "-b", "main")
        git(upstream, "add", "-A")
        git(upstream, "commit", "-q", "-m", "what step 4 installs")
        git(base, "clone", "-q", str(upstream), str(clone))  # step 2
        install_unit(root, clone)
        operator_edits(root / ETC.lstrip("/") / "env")
        done = shell(moved(step(4) + step(5), root), cwd=clone, umask=0o077)
        assert done.returncode == 0, done.stdout + done.stderr
        first = git(clone, "rev-parse", "HEAD")
        printed = done.stdout.splitlines()
        # Step 4's check-config (the settings), its version; step 5's previous one, the new one.
        assert "SEE_SINKS=otlp" in printed, done.stdout
        assert printed[-3:] == [built(first), "previous: none", built(first)], done.stdout
        yield Walkthrough(root, upstream, clone, first)


def site_packages(root: Path) -> Path:
    (found,) = (root / PREFIX.lstrip("/") / "current").glob("lib/python3*/site-packages")
    return found


def test_the_build_names_its_commit_and_leaves_the_clone_as_it_was(walk: Walkthrough) -> None:
    assert (site_packages(walk.root) / "scheduled_events_exporter" / "only_in_the_first_build.py"
            ).is_file()
    # No build/, no *.egg-info, nothing else: the clone holds only what git tracks.
    assert git(walk.clone, "status", "--porcelain", "--ignored", "--untracked-files=all") == ""


def test_the_virtualenv_is_made_from_the_system_python(walk: Walkthrough) -> None:
    current = walk.root / PREFIX.lstrip("/") / "current"
    config = (current / "pyvenv.cfg").read_text(encoding="utf-8")
    assert f"home = {Path(SYSTEM_PYTHON).parent}" in config, config
    assert (current / "bin" / "python3").resolve().is_relative_to("/usr")
    # The link the unit runs names a virtualenv of its own under venvs/.
    assert os.readlink(current).startswith(f"{walk.root}{PREFIX}/venvs/")


def test_the_services_user_runs_the_installed_command(walk: Walkthrough) -> None:
    """DynamicUser= gives the service a uid of its own, with no access to root's files: what
    uid 65534 can run, it can (nothing under /root or /home, every file readable)."""
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux)")
    command = walk.root / PREFIX.lstrip("/") / "current" / "bin" / "scheduled-events-exporter"
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                           str(command), "version"], capture_output=True, text=True,
                          timeout=60, check=False, env={"PATH": "/usr/bin:/bin"})
    assert (done.returncode, done.stdout.strip()) == (0, built(walk.first)), done.stderr


def test_the_unit_and_env_file_go_in_place_and_the_unit_verifies(walk: Walkthrough) -> None:
    """Step 5 ran systemd-analyze verify (its output would have been on stdout); again here, and
    the files' modes."""
    unit = walk.root / UNIT_DIR.lstrip("/") / UNIT_NAME
    verify = next(c for c in moved(step(5), walk.root).splitlines()
                  if "systemd-analyze verify" in c)
    done = shell(verify, cwd=walk.clone)
    assert (done.returncode, done.stdout + done.stderr) == (0, ""), done.stdout + done.stderr
    env_file = walk.root / ETC.lstrip("/") / "env"
    assert (env_file.stat().st_mode & 0o777, unit.stat().st_mode & 0o777) == (0o600, 0o644)


def check_config_command(root: Path) -> str:
    """Step 6's check-config (its first command, with its continuation lines)."""
    lines = []
    for line in moved(step(6), root).splitlines():
        lines.append(line)
        if not line.endswith("\\"):
            break
    return "\n".join(lines)


def test_check_config_as_the_service_sees_it(walk: Walkthrough) -> None:
    """Through the unit: SEE_STATE_DIR from its Environment= line (%S, the system manager's
    /var/lib), the rest from the file its EnvironmentFile= names; nothing passed by hand."""
    env_file = walk.root / ETC.lstrip("/") / "env"
    state_existed = Path(STATE).exists()
    command = check_config_command(walk.root)
    assert "check-config" in command and "SEE_STATE_DIR" not in command
    done = shell(command, cwd=walk.clone)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr  # the shipped files, as shipped: no warning
    assert "SEE_SINKS=otlp\n" in done.stdout
    assert "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318\n" in done.stdout
    assert f"SEE_STATE_DIR={STATE}\n" in done.stdout
    assert Path(STATE).exists() == state_existed  # check-config creates nothing
    # A typo in the file is said, in the same run, with the name it meant.
    original = env_file.read_text(encoding="utf-8")
    with env_file.open("a", encoding="utf-8") as f:
        f.write("SEE_POLL_INTERVALL=5\n")
    try:
        typo = shell(command, cwd=walk.clone)
    finally:
        env_file.write_text(original, encoding="utf-8")
    assert typo.returncode == 0
    assert "SEE_POLL_INTERVALL is set, but the exporter reads no variable of that name: it " \
           "has no effect; did you mean SEE_POLL_INTERVAL?" in typo.stderr, typo.stderr


def test_the_upgrade_and_the_rollback_as_written(walk: Walkthrough) -> None:
    """The upgrade installs the pulled commit into a fresh virtualenv beside the running one:
    the module that commit removed is gone, and a module an old build left in the clone's
    build/ is not installed. A route the environment file names brings its extra's layer in,
    and a configuration the new build refuses stops the upgrade before the switch. The
    rollback, given the virtualenv the upgrade's step 5 printed, brings the first build back;
    git reflog names the commit it was. Nothing writes into the clone."""
    planted = walk.clone / PLANTED
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_text("LEFT = True\n", encoding="utf-8")
    git(walk.upstream, "rm", "-q", FIRST_ONLY)
    git(walk.upstream, "commit", "-q", "-m", "the upgrade drops a module")
    second = git(walk.upstream, "rev-parse", "HEAD")
    current = walk.root / PREFIX.lstrip("/") / "current"
    running = os.readlink(current)
    env_file = walk.root / ETC.lstrip("/") / "env"
    configured = env_file.read_text(encoding="utf-8")

    upgrade = shell(moved(section("Upgrade from source"), walk.root), cwd=walk.clone)
    assert upgrade.returncode == 0, upgrade.stdout + upgrade.stderr
    move_unit(walk.root)
    assert git(walk.clone, "rev-parse", "HEAD") == second
    assert git(walk.clone, "rev-parse", "HEAD@{1}") == walk.first  # what the rollback names

    # A value the new build refuses: step 4 fails at its check, and nothing was switched.
    env_file.write_text(configured + "SEE_POLL_INTERVAL=soon\n", encoding="utf-8")
    refused = shell(moved(step(4) + step(5), walk.root), cwd=walk.clone)
    assert refused.returncode != 0 and "SEE_POLL_INTERVAL" in refused.stderr, refused.stderr
    assert os.readlink(current) == running

    # The route names gRPC: step 4 installs the grpc layer (and check-config passes).
    env_file.write_text(configured.replace("OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
                                           "OTEL_EXPORTER_OTLP_PROTOCOL=grpc")
                        .replace(":4318", ":4317"), encoding="utf-8")
    done = shell(moved(step(4) + step(5), walk.root), cwd=walk.clone)
    assert done.returncode == 0, done.stdout + done.stderr
    printed = done.stdout.splitlines()
    assert printed[-3:] == [built(second), f"previous: {running}", built(second)], done.stdout
    package = site_packages(walk.root) / "scheduled_events_exporter"
    assert not (package / "only_in_the_first_build.py").exists()
    assert not list(package.rglob("left_by_an_old_build*")), "a stale module was installed"
    assert list(site_packages(walk.root).glob("grpcio-*.dist-info")), "no grpc layer"
    assert not list(site_packages(walk.root).glob("azure_eventhub-*.dist-info"))
    assert git(walk.clone, "status", "--porcelain", "--ignored", "--untracked-files=all") \
        == "!! build/lib/scheduled_events_exporter/left_by_an_old_build.py"
    assert Path(running).is_dir()  # the previous virtualenv stays for a rollback

    rollback = section("Rollback from source")
    assert rollback.rstrip().endswith("new=/opt/scheduled-events-exporter/venvs/20261127-093000")
    listed = shell(moved(rollback, walk.root), cwd=walk.clone)
    assert listed.returncode == 0, listed.stderr
    assert f"{running} {built(walk.first)}" in listed.stdout.splitlines(), listed.stdout
    rollback = moved(rollback, walk.root).replace(f"{walk.root}{PREFIX}/venvs/20261127-093000",
                                                  running)
    done = shell(rollback + "\n" + moved(step(5), walk.root), cwd=walk.clone)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split()[-1] == built(walk.first), done.stdout
    package = site_packages(walk.root) / "scheduled_events_exporter"
    assert (package / "only_in_the_first_build.py").is_file()
    assert git(walk.clone, "rev-parse", "HEAD") == second
