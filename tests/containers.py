"""Podman for the tests: the real images, built from the repository's Dockerfile and run.

No registry is reachable here, so both bases are made of Debian 13 (trixie) packages with
``mmdebstrap`` and imported into podman: the builder (``BUILDER_IMAGE``) a minbase with
``python3``, ``python3-venv`` and CA certificates; the runtime (``RUNTIME_IMAGE``) what
distroless ``python3-debian13`` is: the interpreter's packages and the C++ runtime distroless
``cc`` adds for C extensions (gRPC's needs ``libstdc++``), unpacked without running any
maintainer script (no shell, no dpkg, no coreutils), plus what distroless adds by hand (the
merged-``/usr`` links, ``/usr/bin/python3``, a CA bundle, ``root`` and ``nonroot`` (65532) in
passwd and group, a 1777 ``/tmp``). Podman's settings live in a ``containers.conf`` that only
the tests use (``CONTAINERS_CONF``): ``runc`` (``crun`` fails on this kind of machine's hybrid
cgroups) and ulimits within the machine's hard limits. ``.ci/run`` installs podman, runc,
mmdebstrap and catatonit; without them the tests skip. ``SEE_TEST_IMAGE_TAG`` (default ``test``)
names the images built, so that two checkouts can run the image tests side by side.
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

from scheduled_events_exporter import RELEASE
from tests.k8s_tools import PUBLISHED_IMAGE

REPO = Path(__file__).resolve().parents[1]
#: The bases the test images are built on (``mmdebstrap``; see :func:`ensure_bases`).
BUILDER_BASE = "localhost/see-test-builder:trixie"
#: (``-cc``: with distroless cc's packages; a base made before they were added has another name.)
RUNTIME_BASE = "localhost/see-test-runtime:trixie-cc"
_TAG = os.environ.get("SEE_TEST_IMAGE_TAG", "test")
#: The images under test: the default target (shell-less, every route), the ``slim`` target
#: (the core alone) and the ``shell`` target.
IMAGE = f"localhost/scheduled-events-exporter:{_TAG}"
SLIM_IMAGE = f"localhost/scheduled-events-exporter:{_TAG}-slim"
SHELL_IMAGE = f"localhost/scheduled-events-exporter:{_TAG}-shell"
#: What the chart and ``config/k8s/`` name as the exporter's image (tagged to the built one).
MANIFEST_IMAGE = f"{PUBLISHED_IMAGE}:{RELEASE}"
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


#: What distroless adds by hand to the unpacked packages (an extract hook's shell commands;
#: "$1" is the tree). Without lib64 every binary fails: the dynamic loader's path.
_RUNTIME_TOUCHES = [
    'for d in bin sbin lib lib64; do [ -e "$1/$d" ] || ln -s "usr/$d" "$1/$d"; done',
    'ln -sf python3.13 "$1/usr/bin/python3"',
    'mkdir -p "$1/etc/ssl/certs" && cp /etc/ssl/certs/ca-certificates.crt "$1/etc/ssl/certs/"',
    "printf 'root:x:0:0:root:/root:/sbin/nologin\\nnonroot:x:65532:65532:nonroot:"
    "/home/nonroot:/sbin/nologin\\n' > \"$1/etc/passwd\"",
    "printf 'root:x:0:\\nnonroot:x:65532:\\n' > \"$1/etc/group\"",
    'mkdir -p "$1/tmp" "$1/home/nonroot" && chmod 1777 "$1/tmp"',
    'chown 65532:65532 "$1/home/nonroot"',
]


def _mmdebstrap(podman: Podman, name: str, workdir: Path, args: list[str],
                suite: str = "trixie") -> None:
    tarball = workdir / f"{name.rsplit('/', 1)[-1].replace(':', '-')}.tar"
    built = subprocess.run(["mmdebstrap", *args, suite, str(tarball)], capture_output=True,
                           text=True, timeout=900, check=False)
    assert built.returncode == 0, built.stderr[-3000:]
    podman("import", "--change", 'CMD ["python3"]', str(tarball), name, timeout=300)
    tarball.unlink()


def ensure_bases(podman: Podman, workdir: Path) -> None:
    """Build :data:`BUILDER_BASE` (~45 s, ~167 MB) and :data:`RUNTIME_BASE` (~10 s, ~56 MB) from
    Debian 13 packages unless podman already has them."""
    if not podman.exists(BUILDER_BASE):
        _mmdebstrap(podman, BUILDER_BASE, workdir,
                    ["--variant=minbase", "--include=python3,python3-venv,ca-certificates"])
    if not podman.exists(RUNTIME_BASE):
        _mmdebstrap(podman, RUNTIME_BASE, workdir, [
            # distroless python3 is built on distroless cc: libstdc++6, libgomp1, libgcc-s1.
            "--variant=extract", "--include=python3.13-minimal,libpython3.13-stdlib,netbase,"
            "libstdc++6,libgomp1,libgcc-s1",
            *(f"--extract-hook={hook}" for hook in _RUNTIME_TOUCHES)])


#: A Debian 12 (bookworm) builder: Python 3.11, whose venv seeds setuptools as well as pip.
BOOKWORM_BUILDER_BASE = "localhost/see-test-builder:bookworm"


def ensure_bookworm_builder(podman: Podman, workdir: Path) -> None:
    """Build :data:`BOOKWORM_BUILDER_BASE` from Debian 12 packages unless podman has it."""
    if not podman.exists(BOOKWORM_BUILDER_BASE):
        _mmdebstrap(podman, BOOKWORM_BUILDER_BASE, workdir,
                    ["--variant=minbase", "--include=python3,python3-venv,ca-certificates"],
                    suite="bookworm")


#: The OCI labels the tests build with (the release workflow passes the same arguments). VERSION
#: is also the exporter's version in the image (setup.py): a build of commit REVISION.
_REVISION = "0123456789abcdef0123456789abcdef01234567"
LABELS = {"VERSION": f"{RELEASE}+g{_REVISION[:7]}", "REVISION": _REVISION,
          "CREATED": "2026-11-26T12:00:00Z"}


def build(podman: Podman, tag: str = IMAGE, target: str | None = None,
          builder: str = BUILDER_BASE) -> subprocess.CompletedProcess[str]:
    """Build the repository's Dockerfile (its default target, or ``target``) on the test bases,
    with the build arguments the README gives and nothing else (no ``PIP_INDEX_URL``); returns
    podman's output.

    ``--network=host`` and the host's CA bundle let pip inside the build reach the package
    index the way the host does; ``--format docker`` keeps the ``HEALTHCHECK``."""
    args = [f"BUILDER_IMAGE={builder}", f"RUNTIME_IMAGE={RUNTIME_BASE}",
            *(f"{k}={v}" for k, v in LABELS.items())]
    return podman("build", "--pull=never", "--network=host", "-v",
                  "/etc/ssl/certs:/etc/ssl/certs:ro", "--format", "docker",
                  *(a for arg in args for a in ("--build-arg", arg)),
                  *(["--target", target] if target else []), "-t", tag, str(REPO), timeout=900)


def build_image(podman: Podman, tag: str = IMAGE, target: str | None = None,
                builder: str = BUILDER_BASE) -> float:
    """:func:`build`; returns the seconds it took."""
    started = time.monotonic()
    build(podman, tag, target, builder)
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


def exec_python(podman: Podman, container: str, code: str) -> subprocess.CompletedProcess[str]:
    """Run Python ``code`` inside ``container`` (the default image has no shell)."""
    return podman("exec", container, "python", "-c", code, check=False)


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
