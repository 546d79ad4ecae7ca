"""The .deb and the .rpm (tools/build-packages), installed for real where they run.

Two builds of this tree are made (A, as tools/build-packages names it, and B, a later version of
the same code), and in each Debian root of .ci/package-roots.sh (Debian 12, Debian 13, Debian
unstable, each with its own python3) apt and dpkg do what an operator does with them
(docs/vm.md, "The package"):

1. ``apt-get install ./A.deb``, with no network (bubblewrap ``--unshare-net``): the virtualenv
   is built from the package's wheelhouse with the root's python3; the unit is enabled, not
   started (the environment file names no sink yet); the root's pip.conf (an index that does
   not answer, a constraint the locks break) has no say.
2. The operator names a sink (OTLP, to a collector that is down) and the IMDS simulator
   (started by hand: no systemd runs in a root), and the exporter runs until records wait in
   its spool.
3. An upgrade the new build refuses (a bad line in the environment file): apt fails, saying
   why; A stays current, the running service is not restarted.
4. The line fixed, ``apt-get install ./B.deb``: B is current, the service restarted.
5. ``apt-get install --allow-downgrades ./A.deb``: the rollback.
6. ``apt-get remove``: the state and the environment file stay; then ``apt-get install
   ./A.deb`` again starts the service (the file names a sink), and with the collector up every
   record spooled at step 2 is delivered.
7. ``apt-get purge``: the state and /etc/scheduled-events-exporter are gone; /opt stays.

After every step, nothing spooled is lost and ``scheduled-events-exporter version`` names the
build. systemd's decisions are seen through a ``systemctl`` that records its calls (no systemd
runs in a root): enable at install, start only with a sink named, restart only after the new
build passed ``check-config --unit``. The .rpm is read with Debian's ``rpm`` (payload, scripts,
requirements, configuration files), linted with rpmlint, and installed, upgraded, downgraded
and erased with ``rpm --root`` in the Debian 13 root (docs/decisions.md, "The packages", says
what that does not show). Runs as root (mmdebstrap, bubblewrap, dpkg in a root), as CI does.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.peers.otlp_standin import OtlpHttpStandIn

REPO = Path(__file__).resolve().parent.parent
PREFIX = "/opt/scheduled-events-exporter"
UNIT = "scheduled-events-exporter.service"
ENV_FILE = "/etc/scheduled-events-exporter/env"
STATE = "/var/lib/scheduled-events-exporter"
ROOTS = ("bookworm", "trixie", "sid")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), "")

pytestmark = [
    pytest.mark.timeout(1800),
    pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0 or not ARCH,
                       reason="packages are built and installed as root on Linux x86-64/Arm64"),
]


def timed(log: dict[str, float], name: str, start: float) -> None:
    log[name] = round(time.monotonic() - start, 1)


# ------------------------------------------------------------------------------ the packages

@dataclass(frozen=True)
class Build:
    version: str  # what `scheduled-events-exporter version` prints
    package: str  # the package's version (dpkg's and rpm's)
    deb: Path
    rpm: Path


@dataclass(frozen=True)
class Builds:
    a: Build
    b: Build
    seconds: float


def wait_for_file(path: Path, failed: Path, timeout: float) -> None:
    """Wait, with a deadline, for what .ci/run started in the background to write ``path``
    (or ``failed``)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert path == failed or not failed.exists(), failed.read_text()
        assert time.monotonic() < deadline, f"{path} not written within {timeout} s"
        time.sleep(1)


def built(out: Path, log: str) -> Build:
    (deb,) = out.glob("*.deb")
    (rpm,) = out.glob("*.rpm")
    printed = re.search(r"exporter (\S+), package (\S+), in", log)
    assert printed, log
    return Build(printed.group(1), printed.group(2), deb, rpm)


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> Builds:
    """A (this tree, as tools/build-packages names it) and B (the same code, a later version):
    .ci/package-builds.sh's, which .ci/run started at its beginning (SEE_PACKAGE_BUILDS), or
    made here by that script."""
    started = time.monotonic()
    given = os.environ.get("SEE_PACKAGE_BUILDS")
    if given:
        where = Path(given)
        wait_for_file(where / "done", where / "failed", 1200)
    else:
        where = tmp_path_factory.mktemp("packages")
        done = subprocess.run(["bash", str(REPO / ".ci" / "package-builds.sh"), str(where)],
                              capture_output=True, text=True, timeout=1500, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
    a, b = (built(where / name, (where / f"{name}.log").read_text()) for name in ("a", "b"))
    assert b.package.startswith(a.package) and b.package != a.package
    return Builds(a, b, time.monotonic() - started)


# --------------------------------------------------------------------------------- the roots

@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The roots .ci/run started building (SEE_PACKAGE_ROOTS), waited for with a deadline; or
    built here by the same script."""
    given = os.environ.get("SEE_PACKAGE_ROOTS")
    if given:
        where = Path(given)
        wait_for_file(where / "finished", where / "finished", 900)
        failed = list(where.glob("*.failed"))
        assert not failed, "\n".join(f"{f.name}: {f.read_text()}" for f in failed)
        assert (where / "done").exists()
        return where
    if shutil.which("mmdebstrap") is None or shutil.which("bwrap") is None:
        pytest.fail("mmdebstrap and bubblewrap are needed (.ci/run installs them)")
    where = tmp_path_factory.mktemp("roots")
    done = subprocess.run(["bash", str(REPO / ".ci" / "package-roots.sh"), str(where)],
                          capture_output=True, text=True, timeout=1200, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return where


#: A systemctl for a root without systemd: it records each call, and says a unit is active
#: while /run/see-service-active exists (the test's hand-run exporter stands for the service).
SYSTEMCTL = """#!/bin/sh
echo "$*" >> /var/log/systemctl.calls
case "$1" in
  is-active) [ -e /run/see-service-active ] ;;
  *) exit 0 ;;
esac
"""


@dataclass
class Root:
    """A Debian root, entered with bubblewrap; the packages bound read-only at /pkgs."""

    name: str
    path: Path
    builds: Builds
    times: dict[str, float] = field(default_factory=dict)
    pythons: list[str] = field(default_factory=list)

    def prefix(self, *, net: bool) -> list[str]:
        command = ["bwrap", "--bind", str(self.path), "/", "--dev", "/dev", "--proc", "/proc",
                   "--tmpfs", "/tmp", "--ro-bind", str(self.builds.a.deb.parent.parent), "/pkgs",
                   "--die-with-parent", "--clearenv",
                   "--setenv", "PATH", PATH,
                   "--setenv", "HOME", "/root", "--setenv", "LANG", "C.UTF-8",
                   "--setenv", "DEBIAN_FRONTEND", "noninteractive"]
        if not net:
            command.append("--unshare-net")  # the install needs no network: prove it
        return [*command, "--"]

    def run(self, *args: str, net: bool = False, timeout: float = 600
            ) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.prefix(net=net), *args], capture_output=True, text=True,
                              timeout=timeout, check=False)

    def apt(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run("apt-get", "-y", "-q", "-o", "Dpkg::Use-Pty=0", *args)

    def pkg(self, which: Build, kind: str = "deb") -> str:
        path = which.deb if kind == "deb" else which.rpm
        return f"/pkgs/{path.parent.name}/{path.name}"

    def file(self, path: str) -> Path:
        return self.path / path.lstrip("/")

    def version(self) -> str:
        done = self.run("scheduled-events-exporter", "version")
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def python(self) -> str:
        done = self.run(f"{PREFIX}/current/bin/python", "-V")
        return done.stdout.strip()

    def calls(self) -> list[str]:
        log = self.file("/var/log/systemctl.calls")
        return log.read_text().splitlines() if log.exists() else []

    def waiting(self) -> set[str]:
        """The RecordIds the state directory's OTLP spool holds undelivered (past its ack
        cursor)."""
        spool = self.file(f"{STATE}/spool/otlp.log")
        ack = self.file(f"{STATE}/spool/otlp.ack")
        if not spool.exists():
            return set()
        cursor = int(ack.read_text().strip() or 0) if ack.exists() else 0
        out = set()
        for line in spool.read_text().splitlines():
            if line.strip():
                item = json.loads(line)
                if item["seq"] > cursor:
                    out.add(item["record"]["record_id"])
        return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, predicate: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.2)


class InRoot:
    """A long-running program in the root (the simulator, the exporter): bubblewrap's child
    PID from --info-fd, so that SIGTERM reaches the program itself."""

    def __init__(self, root: Root, *args: str, env: dict[str, str] | None = None) -> None:
        read, write = os.pipe()
        extra = [x for k, v in (env or {}).items() for x in ("--setenv", k, v)]
        prefix = root.prefix(net=True)
        command = [*prefix[:-1], "--info-fd", str(write), *extra, "--", *args]
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, pass_fds=(write,))
        os.close(write)
        with os.fdopen(read) as info:
            self.pid = int(json.loads(info.read())["child-pid"])

    def stop(self, timeout: float = 30) -> str:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=timeout)
        return out


def configure(root: Root, sim_port: int, collector: str, health: int) -> dict[str, str]:
    """What the operator sets in the environment file (docs/vm.md): a sink, where it sends, and
    (here) the simulator instead of IMDS. The same values for the hand-run exporter, as the
    unit's EnvironmentFile= and Environment= lines give them."""
    settings = {"SEE_SINKS": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": collector,
                "SEE_IMDS_ENDPOINT": f"http://127.0.0.1:{sim_port}",
                "SEE_HEALTH_ADDR": f"127.0.0.1:{health}", "SEE_POLL_INTERVAL": "0.2",
                "SEE_SHUTDOWN_TIMEOUT": "2"}
    env_file = root.file(ENV_FILE)
    kept = [line for line in env_file.read_text().splitlines()
            if line.split("=", 1)[0].lstrip("#") not in settings]
    env_file.write_text("\n".join(kept + [f"{k}={v}" for k, v in settings.items()]) + "\n")
    return {**settings, "SEE_STATE_DIR": STATE}


def run_exporter(root: Root, env: dict[str, str], until: object, timeout: float) -> str:
    exporter = InRoot(root, "scheduled-events-exporter", "run", env=env)
    try:
        wait_for("the exporter", until, timeout)
    except AssertionError as failed:
        raise AssertionError(f"{failed}; the exporter said:\n{exporter.stop()[-3000:]}") from None
    return exporter.stop()


def check_build(root: Root, build: Build, waiting: set[str]) -> None:
    assert root.version() == build.version
    assert root.waiting() >= waiting, "spooled records were lost"
    venvs = list(root.file(f"{PREFIX}/venvs").iterdir())
    assert [v.name for v in venvs] == [os.readlink(root.file(f"{PREFIX}/current"))[6:]]


def verify_unit(root: Root) -> None:
    """systemd-analyze verify (the host's systemd: none runs in the root) of the installed unit,
    with the root's /opt/scheduled-events-exporter where the unit's ExecStart= looks."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze missing: .ci/run installs Debian's systemd package")
    done = subprocess.run(["bwrap", "--bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                           "--tmpfs", "/opt", "--bind", str(root.file(PREFIX)), PREFIX, "--",
                           analyze, "verify", str(root.file(f"/usr/lib/systemd/system/{UNIT}"))],
                          capture_output=True, text=True, timeout=120, check=False)
    assert (done.returncode, done.stdout + done.stderr) == (0, ""), done.stdout + done.stderr


def walk(root: Root) -> None:
    """Steps 1 to 7 of the module's docstring in one root."""
    a, b = root.builds.a, root.builds.b
    root.file("/var/log/systemctl.calls").unlink(missing_ok=True)
    stub = root.file("/usr/bin/systemctl")  # dpkg runs maintainer scripts with its own PATH
    stub.write_text(SYSTEMCTL)
    stub.chmod(0o755)
    root.file("/run/systemd/system").mkdir(parents=True, exist_ok=True)

    # 0. Refused, in one line each, before anything changes: an interpreter older than 3.10
    # (here a stand-in, named as an administrator may name one), and a from-source install
    # (a virtualenv at /opt/scheduled-events-exporter itself).
    old = root.file("/usr/bin/python3.9")  # none in these roots
    old.write_text('#!/bin/sh\ncase "$2" in *version_info*) exit 1 ;; *) echo 3.9.2 ;; esac\n')
    old.chmod(0o755)
    done = root.run("env", "SCHEDULED_EVENTS_EXPORTER_PYTHON=python3.9", "apt-get", "-y", "-q",
                    "install", root.pkg(a))
    # (apt passes dpkg's messages, the scripts' included, to its stdout)
    ours = [line for line in (done.stdout + done.stderr).splitlines()
            if line.startswith("scheduled-events-")]
    assert done.returncode != 0 and len(ours) == 1, done.stdout + done.stderr
    assert "3.9.2" in ours[0] and "install python3 (>= 3.10)" in ours[0], ours
    old.unlink()
    assert not root.file(PREFIX).exists()
    root.file(f"{PREFIX}/bin").mkdir(parents=True)
    root.file(f"{PREFIX}/pyvenv.cfg").write_text("home = /usr/bin\n")
    done = root.apt("install", root.pkg(a))
    ours = [line for line in (done.stdout + done.stderr).splitlines()
            if line.startswith("scheduled-events-")]
    assert done.returncode != 0 and len(ours) == 1, done.stdout + done.stderr
    assert "holds a from-source install" in ours[0], ours
    shutil.rmtree(root.file(PREFIX))
    done = root.run("dpkg", "--purge", "azure-scheduled-events-exporter")
    assert done.returncode == 0, done.stderr

    # 1. Install, offline, whatever the host's pip configuration says (an index that does not
    # answer, a constraint the locks break): the package installs its wheelhouse, nothing else.
    root.file("/opt").mkdir(exist_ok=True)
    root.file("/etc/pip.conf").write_text(
        "[global]\nindex-url = http://127.0.0.1:9/simple\nconstraint = /etc/pip-constraints.txt\n")
    root.file("/etc/pip-constraints.txt").write_text("protobuf<5\n")
    started = time.monotonic()
    done = root.apt("install", root.pkg(a))
    timed(root.times, "install", started)
    assert done.returncode == 0, done.stdout + done.stderr
    # /opt is not the package's (no Debian package owns it): dpkg never removes it.
    assert root.run("dpkg", "-S", "/opt").returncode != 0
    assert f"enabled {UNIT}, not started" in done.stderr, done.stderr
    assert f"enable {UNIT}" in root.calls(), root.calls()
    assert not any(c.startswith(("start", "restart")) for c in root.calls()), root.calls()
    check_build(root, a, set())
    assert root.file(ENV_FILE).stat().st_mode & 0o777 == 0o600
    root.pythons.append(root.python())
    verify_unit(root)
    # Debian unstable's other interpreters (3.15: the newest CPython) from the same wheelhouse,
    # offline, through the install step an administrator runs for another interpreter.
    for other in sorted(root.file("/usr/bin").glob("python3.1[0-9]")):
        if other.name != os.readlink(root.file("/usr/bin/python3")):
            done = root.run("env", f"SCHEDULED_EVENTS_EXPORTER_PYTHON={other.name}",
                            f"{PREFIX}/libexec/install-venv")
            assert done.returncode == 0, done.stderr
            root.pythons.append(root.python())
            assert root.pythons[-1].startswith(f"Python {other.name[6:]}."), root.pythons
            check_build(root, a, set())

    # 2. Configure; the exporter runs with the collector down: records wait in the spool.
    sim_port = free_port()
    sim = InRoot(root, "scheduled-events-exporter", "simulate", "--port", str(sim_port),
                 "--scenario", "live-migration", "--speed", "100", "--loop")
    try:
        env = configure(root, sim_port, f"http://127.0.0.1:{free_port()}", free_port())
        done = root.run("scheduled-events-exporter", "check-config", "--unit",
                        f"/usr/lib/systemd/system/{UNIT}")
        assert done.returncode == 0, done.stderr
        run_exporter(root, env, lambda: len(root.waiting()) >= 3, 90)
    finally:
        sim.stop()
    spooled = root.waiting()
    assert len(spooled) >= 3
    root.file("/run/see-service-active").touch()  # as if systemd ran it

    # 3. An upgrade the new build refuses: apt says why, A stays, nothing restarts.
    env_file = root.file(ENV_FILE)
    good = env_file.read_text()
    env_file.write_text(good + "SEE_POLL_INTERVAL=soon\n")
    before = len(root.calls())
    done = root.apt("install", root.pkg(b))
    assert done.returncode != 0
    assert f"build {b.version} refuses the configuration" in done.stderr, done.stderr
    assert "SEE_POLL_INTERVAL" in done.stderr, done.stderr
    assert f"{a.version}." in done.stderr and "stays current and keeps running" in done.stderr
    assert not any(c.startswith("restart") for c in root.calls()[before:]), root.calls()
    check_build(root, a, spooled)

    # 4. Fixed, the upgrade: B current, the running service restarted onto it.
    env_file.write_text(good)
    started = time.monotonic()
    done = root.apt("install", root.pkg(b))
    timed(root.times, "upgrade", started)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"restart {UNIT}" in root.calls()[before:], root.calls()
    check_build(root, b, spooled)

    # 5. Rollback.
    started = time.monotonic()
    done = root.apt("install", "--allow-downgrades", root.pkg(a))
    timed(root.times, "rollback", started)
    assert done.returncode == 0, done.stdout + done.stderr
    check_build(root, a, spooled)
    assert root.file(ENV_FILE).read_text() == good  # the conffile is the operator's

    # 6. Remove keeps the state and the file; the reinstall starts the service (a sink is
    # named), and everything spooled reaches the collector.
    root.file("/run/see-service-active").unlink()
    done = root.apt("remove", "azure-scheduled-events-exporter")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"disable {UNIT}" in root.calls()
    assert not root.file(PREFIX).exists()
    assert not root.file("/usr/bin/scheduled-events-exporter").is_symlink()
    assert root.file(ENV_FILE).read_text() == good
    assert root.waiting() == spooled
    before = len(root.calls())
    done = root.apt("install", root.pkg(a))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"start {UNIT}" in root.calls()[before:], root.calls()
    check_build(root, a, spooled)
    with OtlpHttpStandIn() as collector:
        sim = InRoot(root, "scheduled-events-exporter", "simulate", "--port", str(sim_port),
                     "--scenario", "live-migration", "--speed", "100", "--loop")
        try:
            env = configure(root, sim_port, collector.endpoint, free_port())
            run_exporter(root, env, lambda: spooled <= {r.uid for r in collector.accepted}, 60)
        finally:
            sim.stop()
    assert not root.waiting() & spooled

    # 7. Purge.
    done = root.apt("purge", "azure-scheduled-events-exporter")
    assert done.returncode == 0, done.stdout + done.stderr
    for gone in (STATE, "/var/lib/private/scheduled-events-exporter",
                 "/etc/scheduled-events-exporter", PREFIX):
        assert not root.file(gone).exists(), gone
    # /opt, which dpkg lists as the package's too (no Debian package owns it), stays.
    assert root.file("/opt").is_dir()
    root.file("/etc/pip.conf").unlink()
    root.file("/etc/pip-constraints.txt").unlink()


@dataclass(frozen=True)
class Walked:
    root: Root
    error: BaseException | None


@pytest.fixture(scope="module")
def walks(roots: Path, builds: Builds) -> dict[str, Walked]:
    """The walk in the three roots at once (each mostly waits on dpkg, pip and the exporter's
    clock): a module's tests run in one worker, and one after the other they took three times
    as long."""
    def one(name: str) -> Walked:
        root = Root(name, roots / name, builds)
        try:
            walk(root)
        except BaseException as error:  # raised again by the root's own test, traceback kept
            return Walked(root, error)
        return Walked(root, None)

    with ThreadPoolExecutor(max_workers=len(ROOTS)) as pool:
        return dict(zip(ROOTS, pool.map(one, ROOTS), strict=True))


@pytest.mark.parametrize("name", ROOTS)
def test_the_deb_installs_upgrades_rolls_back_and_purges(name: str, walks: dict[str, Walked],
                                                         builds: Builds) -> None:
    walked = walks[name]
    if walked.error is not None:
        raise walked.error
    root = walked.root
    print(f"{name}: {', '.join(root.pythons)}; seconds: {root.times}; the packages took "
          f"{builds.seconds:.0f} s to build or wait for ({builds.a.deb.stat().st_size / 1e6:.0f}"
          f" MB .deb, {builds.a.rpm.stat().st_size / 1e6:.0f} MB .rpm)")


# ------------------------------------------------------------------ the wheelhouse, offline

def _build_packages_module() -> object:
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.SourceFileLoader("build_packages",
                                                  str(REPO / "tools" / "build-packages"))
    spec = importlib.util.spec_from_loader("build_packages", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_the_wheelhouse_serves_every_supported_python_offline(builds: Builds,
                                                              tmp_path: Path) -> None:
    """For each CPython pyproject.toml names (3.10 to 3.15; the roots run three of them), pip
    finds every locked distribution of every route in the package's wheelhouse, with no index,
    binary only, each file's hash checked: what install-venv does on that interpreter."""
    tools = _build_packages_module()
    subprocess.run(["dpkg-deb", "-x", str(builds.a.deb), str(tmp_path / "x")], check=True)
    opt = tmp_path / "x" / PREFIX.lstrip("/")
    machine = platform.machine()
    platforms = [f"--platform=manylinux_2_{m}_{machine}" for m in tools.GLIBC_MINORS]  # type: ignore[attr-defined]
    for python in tools.pythons():  # type: ignore[attr-defined]
        requirements = tmp_path / f"req-{python}.txt"
        requirements.write_text(tools.requirements_for(python, machine)  # type: ignore[attr-defined]
                                + (opt / "requirements" / "exporter.lock").read_text())
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
             "--dry-run", "--ignore-installed", "--target", str(tmp_path / f"t-{python}"),
             "--no-index", "--find-links", str(opt / "wheelhouse"), "--only-binary=:all:",
             "--implementation", "cp", "--python-version", python, *platforms,
             f"--platform=manylinux2014_{machine}", "--no-deps", "--require-hashes",
             "-r", str(requirements)], capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, f"Python {python}: {done.stderr[-2000:]}"


# ------------------------------------------------------------------------------------ the rpm

def test_the_rpm_reads_right(builds: Builds) -> None:
    """Debian's rpm reads the .rpm: its payload (the layout the .deb has), its requirements,
    its scriptlets (the same scripts as the .deb's) and its configuration file."""
    rpm = str(builds.a.rpm)
    listed = subprocess.run(["rpm", "-qlp", rpm], capture_output=True, text=True, check=True).stdout
    deb = subprocess.run(["dpkg-deb", "-c", str(builds.a.deb)], capture_output=True, text=True,
                         check=True).stdout
    in_deb = {re.sub(r" -> .*", "", line.split(None, 5)[5]).lstrip(".").rstrip("/")
              for line in deb.splitlines()}
    assert set(listed.split()) == in_deb - {"", "/etc", "/opt", "/usr", "/usr/bin", "/usr/lib",
                                            "/usr/lib/systemd", "/usr/lib/systemd/system"}
    requires = subprocess.run(["rpm", "-qp", "--requires", rpm], capture_output=True, text=True,
                              check=True).stdout.split("\n")
    assert "python3 >= 3.10" in requires
    config = subprocess.run(["rpm", "-qp", "--configfiles", rpm], capture_output=True,
                            text=True, check=True).stdout.split()
    assert config == [ENV_FILE]
    scripts = subprocess.run(["rpm", "-qp", "--scripts", rpm], capture_output=True, text=True,
                             check=True).stdout
    for hook in ("preinstall", "postinstall", "preremove", "postremove"):
        assert (REPO / "packaging" / "scripts" / hook).read_text().strip() in scripts, hook


#: rpmlint's errors (its default, openSUSE-minded policy) that these packages make on purpose.
RPMLINT_ACCEPTED = {
    # /opt is the FHS's place for an add-on package that is not the distribution's (the
    # issue's layout; the OpenTelemetry Collector contrib and Azure's own agents use it too).
    "dir-or-file-in-opt": "an add-on package, not the distribution's",
    # The environment file may hold an Event Hubs connection string or OTLP headers.
    "non-readable": "/etc/scheduled-events-exporter/env is 0600: it may hold a secret",
    # The release signs every file with Sigstore (cosign sign-blob), not with a GPG key rpm knows.
    "no-signature": "signed with Sigstore bundles beside the file",
    # nFPM writes no %changelog; the project's is CHANGELOG.md.
    "no-changelogname-tag": "the changelog is CHANGELOG.md",
    # The native code is inside the wheels (zip files) of this architecture's wheelhouse.
    "no-binary": "architecture-specific wheels, no ELF file of its own",
}


def test_rpmlint_finds_no_error_but_those_accepted(builds: Builds) -> None:
    rpmlint = shutil.which("rpmlint")
    if rpmlint is None:
        pytest.fail("rpmlint missing: .ci/run installs Debian's rpmlint")
    done = subprocess.run([rpmlint, str(builds.a.rpm)], capture_output=True, text=True,
                          timeout=300, check=False)
    kinds = {line.split(": E: ", 1)[1].split()[0] for line in done.stdout.splitlines()
             if ": E: " in line}
    assert kinds - set(RPMLINT_ACCEPTED) == set(), done.stdout
    assert "dir-or-file-in-opt" in kinds  # the lint ran and read the payload


def test_the_rpm_installs_upgrades_downgrades_and_erases_in_a_root(
        roots: Path, builds: Builds, walks: dict[str, Walked]) -> None:
    """rpm --root in the Debian 13 root (its python3, 3.13), once the .deb's walk there is
    done: the scriptlets run chrooted there, without network. --nodeps: the root's dpkg
    database, not rpm's, knows its python3."""
    path = roots / "trixie"
    Root("trixie", path, builds).apt("purge", "azure-scheduled-events-exporter")
    shutil.rmtree(path / "var/lib/rpm", ignore_errors=True)

    def rpm(*args: str) -> subprocess.CompletedProcess[str]:
        # /dev and /proc in the root for the scriptlets (rpm mounts nothing); no network.
        return subprocess.run(["bwrap", "--bind", "/", "/", "--dev-bind", "/dev", "/dev",
                               "--bind", str(path), str(path), "--dev", f"{path}/dev",
                               "--proc", f"{path}/proc", "--unshare-net", "--die-with-parent",
                               "--", "rpm", "--root", str(path), *args],
                              capture_output=True, text=True, timeout=600, check=False)

    def version() -> str:
        return Root("trixie", path, builds).version()

    times: dict[str, float] = {}
    assert rpm("--initdb").returncode == 0
    a, b = str(builds.a.rpm), str(builds.b.rpm)
    for step, args, expected in (("install", ("-i", "--nodeps", a), builds.a),
                                 ("upgrade", ("-U", "--nodeps", b), builds.b),
                                 ("downgrade", ("-U", "--nodeps", "--oldpackage", a), builds.a)):
        started = time.monotonic()
        done = rpm(*args)
        timed(times, step, started)
        assert done.returncode == 0, done.stdout + done.stderr
        assert version() == expected.version
    env_file = path / ENV_FILE.lstrip("/")
    env_file.write_text(env_file.read_text() + "SEE_SINKS=console\n")
    done = rpm("-e", "azure-scheduled-events-exporter")
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (path / PREFIX.lstrip("/")).exists()
    # %config(noreplace): an edited file is kept on erase, as .rpmsave.
    assert (path / (ENV_FILE + ".rpmsave").lstrip("/")).read_text().endswith("SEE_SINKS=console\n")
    print(f"rpm --root: {times}")


# ------------------------------------------------------------ CI's Debian pins per release

def test_ci_debian_pins_follow_the_debian_release(roots: Path, builds: Builds) -> None:
    """.ci/debian-pins.sh, run in each root, gives that release's set: Debian 12's versions in
    the bookworm root, Debian 13's in the trixie root, bare names in unstable. (That the
    Debian 13 set installs in a Debian 13 root was shown once by hand: apt-get install of the
    whole set in the trixie root, every package at its pinned version; it needs the network and
    two minutes, so CI does not repeat it.)"""
    script = (REPO / ".ci" / "debian-pins.sh").read_text()
    sets = {name: re.search(rf"^{name}=\((.*?)^\)", script, re.S | re.M) for name in
            ("bookworm", "trixie")}
    expected = {name: re.findall(r'"([^"]+)"', found.group(1)) for name, found in sets.items()
                if found}
    expected["sid"] = [pin.split("=", 1)[0] for pin in expected["bookworm"]]
    for name in ROOTS:
        root = Root(name, roots / name, builds)
        (root.path / "tmp-pins.sh").write_text(script)
        done = root.run("bash", "/tmp-pins.sh")
        (root.path / "tmp-pins.sh").unlink()
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == expected[name], (name, done.stdout)


# ------------------------------------------------------- from a from-source install, one step

def test_a_from_source_install_moves_to_the_package_in_one_step(
        roots: Path, builds: Builds, walks: dict[str, Walked]) -> None:
    """docs/vm.md's "From a from-source install", in the Debian 12 root (its walk done): what an
    earlier docs/vm.md left (a virtualenv at /opt/scheduled-events-exporter itself, its unit in
    /etc/systemd/system, the operator's environment file, the dynamic user's state with a
    spooled record) becomes the package's, the file and the state kept as they were."""
    root = Root("bookworm", roots / "bookworm", builds)
    (root.file(PREFIX) / "bin").mkdir(parents=True)
    root.file(f"{PREFIX}/pyvenv.cfg").write_text("home = /usr/bin\n")
    root.file("/etc/systemd/system").mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "config" / "systemd" / UNIT, root.file(f"/etc/systemd/system/{UNIT}"))
    env_file = root.file(ENV_FILE)
    env_file.parent.mkdir(parents=True, exist_ok=True)
    mine = "# mine\nSEE_SINKS=otlp\nOTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:9\n"
    env_file.write_text(mine)
    env_file.chmod(0o600)
    private = root.file("/var/lib/private/scheduled-events-exporter/spool")
    private.mkdir(parents=True)
    (private / "otlp.log").write_text('{"seq":1,"record":{"record_id":"kept"}}\n')
    root.file(STATE).unlink(missing_ok=True)
    root.file(STATE).symlink_to("private/scheduled-events-exporter")

    text = (REPO / "docs" / "vm.md").read_text(encoding="utf-8")
    found = re.search(r"^### From a from-source install\n.*?```bash\n(.*?)```", text, re.S | re.M)
    assert found, "docs/vm.md has no 'From a from-source install' command"
    command = found.group(1)
    assert command.count("sudo ") == 3 and "--force-confold" in command, command
    # No systemd in the root: its first command has nothing to stop; sudo is dropped (root).
    command = command.replace("sudo systemctl disable --now scheduled-events-exporter", "true")
    command = re.sub(r"\./azure-scheduled-events-exporter_\S+\.deb", root.pkg(builds.a), command)
    done = root.run("bash", "-euo", "pipefail", "-c", command.replace("sudo ", ""))
    assert done.returncode == 0, done.stdout + done.stderr
    assert root.version() == builds.a.version
    assert env_file.read_text() == mine and env_file.stat().st_mode & 0o777 == 0o600
    assert root.waiting() == {"kept"}
    assert not root.file(f"/etc/systemd/system/{UNIT}").exists()
    assert not root.file(f"{PREFIX}/pyvenv.cfg").exists()
    done = root.apt("purge", "azure-scheduled-events-exporter")
    assert done.returncode == 0, done.stdout + done.stderr
