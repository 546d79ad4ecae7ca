"""The lock (requirements/runtime.lock, the extras' layers requirements/extra-*.lock,
requirements/build.lock; tools/lock.py) is the whole closure ``pyproject.toml`` asks for, for
the core and for every combination of extras, one hashed version per distribution and
environment: checked offline against the declared requirements, and by resolving again as of
the date the lock records (a change to ``pyproject.toml`` without a new lock fails)."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomllib
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
RUNTIME = REPO / "requirements" / "runtime.lock"
#: What each extra adds to the core (tools/lock.py cuts them from one resolution).
EXTRA_LOCKS = {extra: REPO / "requirements" / f"extra-{extra}.lock"
               for extra in ("grpc", "eventhubs", "platform")}
BUILD = REPO / "requirements" / "build.lock"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
#: What only the extras may bring: gRPC, the Azure SDK, and what azure-identity pulls in.
NOT_IN_THE_CORE = ("grpcio", "azure-", "msal", "cryptography", "cffi", "pyjwt", "requests")
#: The environments the lock serves: the image (Python 3.13, x86-64 and Arm64), the systemd
#: unit on Ubuntu 22.04 and 24.04 (3.10, 3.12), the Windows service, CI's 3.11.
ENVIRONMENTS = [
    {"python_version": v, "python_full_version": f"{v}.0", "sys_platform": p,
     "platform_system": s, "platform_machine": m, "implementation_name": "cpython",
     "platform_python_implementation": "CPython", "os_name": o}
    for v in ("3.10", "3.11", "3.12", "3.13")
    for p, s, m, o in (("linux", "Linux", "x86_64", "posix"), ("linux", "Linux", "aarch64",
                                                                 "posix"),
                       ("win32", "Windows", "AMD64", "nt"))
]


@dataclass(frozen=True)
class Pin:
    name: str
    version: Version
    marker: Marker | None
    hashes: int


def pins(text: str) -> list[Pin]:
    """Each ``name==version [; marker]`` entry of a uv lock, with its number of hashes."""
    found = []
    for entry in re.split(r"\n(?=[A-Za-z0-9])", text):
        first = entry.split(" \\", 1)[0].strip()
        if not first or first.startswith("#"):
            continue
        requirement = Requirement(first)
        (spec,) = requirement.specifier
        assert spec.operator == "==", first
        found.append(Pin(canonicalize_name(requirement.name), Version(spec.version),
                         requirement.marker, entry.count("--hash=sha256:")))
    return found


def unmet(requirements: list[str], locked: list[Pin]) -> list[str]:
    """Every requirement that the lock does not satisfy with exactly one version in some
    environment where it applies."""
    problems = []
    for env in ENVIRONMENTS:
        here = [p for p in locked if p.marker is None or p.marker.evaluate(env)]
        for text in requirements:
            requirement = Requirement(text)
            if requirement.marker is not None and not requirement.marker.evaluate(env):
                continue
            # (Two layers may list a distribution they share, with the same pin.)
            versions = sorted({p.version for p in here
                               if p.name == canonicalize_name(requirement.name)})
            if len(versions) != 1 or versions[0] not in requirement.specifier:
                problems.append(f"{text} on {env['sys_platform']} {env['platform_machine']} "
                                f"Python {env['python_version']}: lock has {versions}")
    return problems


def requirements_of(extras: tuple[str, ...]) -> list[str]:
    """The core's requirements and those of ``extras``, an extra that names others (``all``:
    ``azure-scheduled-events-exporter[grpc,eventhubs]``) expanded."""
    optional = PYPROJECT["project"]["optional-dependencies"]
    found = list(PYPROJECT["project"]["dependencies"])
    todo = list(extras)
    while todo:
        for text in optional[todo.pop()]:
            requirement = Requirement(text)
            if canonicalize_name(requirement.name) == "azure-scheduled-events-exporter":
                todo.extend(requirement.extras)
            else:
                found.append(text)
    return found


def locked_for(extras: tuple[str, ...]) -> list[Pin]:
    """What an install with ``extras`` takes: the core lock and the layers of its extras."""
    return [*pins(RUNTIME.read_text()),
            *(p for extra in extras for p in pins(EXTRA_LOCKS[extra].read_text()))]


COMBINATIONS = [(), ("grpc",), ("eventhubs",), ("platform",), ("grpc", "eventhubs"),
                ("eventhubs", "platform"), ("grpc", "eventhubs", "platform")]


@pytest.mark.parametrize("extras", COMBINATIONS, ids=lambda e: "+".join(("core", *e)))
def test_every_runtime_requirement_is_locked_once_per_environment(
        extras: tuple[str, ...]) -> None:
    locked = locked_for(extras)
    assert unmet(requirements_of(extras), locked) == []
    for env in ENVIRONMENTS:  # one version of each distribution per environment
        versions: dict[str, set[Version]] = {}
        for p in locked:  # (two layers may list one distribution: with one pin, installed once)
            if p.marker is None or p.marker.evaluate(env):
                versions.setdefault(p.name, set()).add(p.version)
        assert all(len(v) == 1 for v in versions.values()), (env, versions)


def test_the_all_extra_is_every_layer_and_the_build_is_locked() -> None:
    assert sorted(requirements_of(("all",))) == sorted(
        requirements_of(("grpc", "eventhubs", "platform")))
    assert unmet(PYPROJECT["build-system"]["requires"], pins(BUILD.read_text())) == []


def test_the_core_lock_carries_neither_grpc_nor_the_azure_sdk() -> None:
    """The core (pip install without extras, the slim image) stores none of the packages only
    gRPC and Event Hubs need, and so inherits none of their advisories; each layer holds only
    what its extra adds."""
    core = {p.name for p in pins(RUNTIME.read_text())}
    assert not {n for n in core if n.startswith(NOT_IN_THE_CORE)}, sorted(core)
    grpc, eventhubs, platform = ({p.name for p in pins(path.read_text())}
                                 for path in EXTRA_LOCKS.values())
    assert grpc == {"grpcio"}, grpc
    assert {"azure-eventhub", "azure-identity", "msal", "cryptography"} <= eventhubs
    assert {"azure-storage-queue", "azure-identity"} <= platform
    assert not eventhubs & core and not grpc & core and not grpc & eventhubs
    assert not platform & core and not grpc & platform


def test_every_locked_distribution_carries_hashes() -> None:
    # The release workflow's tools too (requirements/release.lock: build, cyclonedx-bom).
    for path in (RUNTIME, *EXTRA_LOCKS.values(), BUILD, REPO / "requirements" / "release.lock"):
        for pin in pins(path.read_text()):
            assert pin.hashes >= 1, f"{path.name}: {pin.name} has no hash"


def test_the_offline_check_sees_a_requirement_the_lock_does_not_meet() -> None:
    locked = pins(RUNTIME.read_text())
    urllib3 = next(p for p in locked if p.name == "urllib3")
    assert unmet([f"urllib3>{urllib3.version}"], locked) != []
    assert unmet(["not-locked-anywhere==1.0"], locked) != []
    assert unmet([f"urllib3=={urllib3.version}; sys_platform == 'darwin'"], locked) == []


@pytest.mark.timeout(300)
def test_resolving_again_as_of_the_recorded_date_gives_the_same_lock() -> None:
    # Needs the package index (as installing does); the date keeps the answer stable.
    done = subprocess.run([sys.executable, str(REPO / "tools" / "lock.py"), "--check"],
                          capture_output=True, text=True, timeout=280, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
