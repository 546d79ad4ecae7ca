"""Podman for the tests: the real image, built from the repository's Dockerfile and run.

No registry is reachable here, so the base image is built from Debian packages (``mmdebstrap``:
``python3`` and ``python3-venv`` of Debian bookworm) and imported into podman; the Dockerfile
is then built on it with ``--build-arg BASE_IMAGE``. Podman's settings live in a
``containers.conf`` that only the tests use (``CONTAINERS_CONF``): ``runc`` (``crun`` fails on
this kind of machine's hybrid cgroups) and ulimits within the machine's hard limits.
``.ci/run`` installs podman, runc, mmdebstrap and catatonit; without them the tests skip.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from scheduled_events_exporter import __version__
from tests.k8s_tools import PUBLISHED_IMAGE

REPO = Path(__file__).resolve().parents[1]
#: The base every test image is built on (``mmdebstrap``; see :func:`ensure_base`).
BASE = "localhost/see-test-base:bookworm"
#: The image under test.
IMAGE = "localhost/scheduled-events-exporter:test"
#: What the chart and ``config/k8s/`` name as the exporter's image (tagged to the built one).
MANIFEST_IMAGE = f"{PUBLISHED_IMAGE}:{__version__}"
STATE = "/var/lib/scheduled-events-exporter"

_CONF = """\
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]
[engine]
runtime = "runc"
"""


def require_podman() -> None:
    """Skip unless podman, runc and mmdebstrap are installed (``.ci/run`` installs them)."""
    missing = [tool for tool in ("podman", "runc", "mmdebstrap") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed; .ci/run installs them (as root)")
    if os.geteuid() != 0:
        pytest.skip("the image tests run podman as root (as CI does)")


class Podman:
    """``podman`` with the tests' own configuration."""

    def __init__(self, conf_dir: Path) -> None:
        conf_dir.mkdir(parents=True, exist_ok=True)
        conf = conf_dir / "containers.conf"
        conf.write_text(_CONF)
        self.env = {**os.environ, "CONTAINERS_CONF": str(conf)}

    def __call__(self, *args: str, timeout: float = 120, check: bool = True,
                 input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``podman *args``; raise with its output when ``check`` and it fails."""
        done = subprocess.run(["podman", *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False, input=input)
        if check and done.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)} exited {done.returncode}:\n"
                                 f"{done.stdout[-2000:]}{done.stderr[-3000:]}")
        return done

    def command(self, *args: str) -> list[str]:
        """The argv of ``podman *args``, for a process the test reads as it runs."""
        return ["env", f"CONTAINERS_CONF={self.env['CONTAINERS_CONF']}", "podman", *args]

    def inspect(self, name: str, template: str) -> str:
        return self("inspect", "--format", template, name).stdout.strip()

    def exists(self, image: str) -> bool:
        return self("image", "exists", image, check=False).returncode == 0


def ensure_base(podman: Podman, workdir: Path) -> None:
    """Build :data:`BASE` from Debian packages unless podman already has it (~25 s)."""
    if podman.exists(BASE):
        return
    tarball = workdir / "base.tar"
    built = subprocess.run(
        ["mmdebstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates",
         "bookworm", str(tarball)], capture_output=True, text=True, timeout=900, check=False)
    assert built.returncode == 0, built.stderr[-3000:]
    podman("import", "--change", 'CMD ["python3"]', str(tarball), BASE, timeout=300)
    tarball.unlink()


def build_image(podman: Podman, tag: str = IMAGE, base: str = BASE) -> float:
    """Build the repository's Dockerfile on ``base``; returns the seconds it took.

    ``--network=host`` and the host's CA bundle let pip inside the build reach the package
    index the way the host does; ``--format docker`` keeps the ``HEALTHCHECK``."""
    started = time.monotonic()
    podman("build", "--pull=never", "--network=host", "-v", "/etc/ssl/certs:/etc/ssl/certs:ro",
           "--format", "docker", "--build-arg", f"BASE_IMAGE={base}", "-t", tag, str(REPO),
           timeout=900)
    return time.monotonic() - started


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@contextmanager
def cleanup(podman: Podman, *, containers: Sequence[str] = (), pods: Sequence[str] = (),
            volumes: Sequence[str] = (), kube: Path | None = None) -> Iterator[None]:
    """Remove what a test made, whatever happened (``kube down`` keeps the named volumes a
    manifest's emptyDir volumes became: pass them in ``volumes``)."""
    try:
        yield
    finally:
        if kube is not None:
            podman("kube", "down", str(kube), check=False)
        for pod in pods:
            podman("pod", "rm", "-f", "-t", "0", pod, check=False)
        for container in containers:
            # -v: also the anonymous volume the image's VOLUME gives a container without -v.
            podman("rm", "-f", "-v", "-t", "0", container, check=False)
        for volume in volumes:
            podman("volume", "rm", "-f", volume, check=False)


@dataclass(frozen=True)
class Proc:
    """A process of a container, as the host sees it."""

    pid: int
    comm: str
    state: str
    uid: int
    argv: tuple[str, ...]


def namespace_processes(host_pid: int) -> list[Proc]:
    """Every process in the PID namespace of host process ``host_pid`` (the container's)."""
    namespace = os.readlink(f"/proc/{host_pid}/ns/pid")
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/pid") != namespace:
                continue
            stat = Path(f"/proc/{entry}/stat").read_text()
            status = Path(f"/proc/{entry}/status").read_text()
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:  # ended meanwhile
            continue
        uid = next(int(line.split()[1]) for line in status.splitlines()
                   if line.startswith("Uid:"))
        found.append(Proc(int(entry), stat[stat.index("(") + 1:stat.rindex(")")],
                          stat[stat.rindex(")") + 2], uid,
                          tuple(a.decode(errors="replace") for a in argv if a)))
    return found


def exec_json(podman: Podman, container: str, url: str) -> tuple[int, str]:
    """GET ``url`` from inside ``container`` (what an exec probe does): (status, body)."""
    script = ("import sys, urllib.request, urllib.error\n"
              "try:\n"
              "    r = urllib.request.urlopen(sys.argv[1], timeout=3)\n"
              "except urllib.error.HTTPError as e:\n"
              "    r = e\n"
              "print(r.status if hasattr(r, 'status') else r.code)\n"
              "print(r.read().decode())\n")
    done = podman("exec", container, "python", "-c", script, url, check=False)
    if done.returncode != 0:
        return 0, done.stderr
    status, _, body = done.stdout.partition("\n")
    return int(status), body


def image_json(podman: Podman, image: str) -> dict[str, object]:
    (data,) = json.loads(podman("image", "inspect", image).stdout)
    assert isinstance(data, dict)
    return data
