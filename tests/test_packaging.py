"""Packaging promises that can be checked without a Docker engine or an index."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[1]


def test_dockerfile_is_non_root_read_only_friendly_and_health_checked() -> None:
    text = (REPO / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and not users[-1].startswith(("root", "0")), users
    assert re.search(r'^HEALTHCHECK .*?CMD \["scheduled-events-exporter", "probe"\]', text,
                     re.M | re.S)
    assert 'ENTRYPOINT ["scheduled-events-exporter"]' in text and 'CMD ["run"]' in text
    assert "SEE_STATE_DIR=/var/lib/scheduled-events-exporter" in text
    assert 'VOLUME ["/var/lib/scheduled-events-exporter"]' in text
    # A read-only root filesystem: Python must not try to write bytecode next to the code.
    assert "PYTHONDONTWRITEBYTECODE=1" in text


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sdist and the wheel built as the release builds them (the wheel from the sdist),
    each once: {"sdist": ..., "wheel": ...}."""
    out = tmp_path_factory.mktemp("dist")
    uv = Path(sys.executable).with_name("uv")
    subprocess.run([str(uv), "build", "--no-progress", "-q", "-o", str(out), str(REPO)],
                   check=True, capture_output=True, timeout=280)
    (sdist,) = out.glob("azure_scheduled_events_exporter-*.tar.gz")
    (wheel,) = out.glob("azure_scheduled_events_exporter-*.whl")
    return {"sdist": sdist, "wheel": wheel}


@pytest.mark.timeout(300)
def test_wheel_carries_the_scenarios_and_the_console_script(dists: dict[str, Path]) -> None:
    with zipfile.ZipFile(dists["wheel"]) as archive:
        names = set(archive.namelist())
        entry_points = next(n for n in names if n.endswith("entry_points.txt"))
        assert "scheduled-events-exporter = scheduled_events_exporter.cli:main" in (
            archive.read(entry_points).decode())
    scenarios = {p.name for p in (REPO / "config" / "scenarios").glob("*.json")}
    packaged = {Path(n).name for n in names if "/scenario_files/" in n and n.endswith(".json")}
    assert scenarios and packaged == scenarios


LICENCE = (REPO / "LICENSE").read_text() if (REPO / "LICENSE").exists() else ""


def test_the_licence_is_the_mit_text_and_the_chart_carries_the_same() -> None:
    assert LICENCE.startswith("MIT License\n") and "Permission is hereby granted" in LICENCE
    chart_copy = REPO / "charts" / "azure-scheduled-events-exporter" / "LICENSE"
    assert chart_copy.read_text() == LICENCE, "the chart's LICENSE is a copy of the root's"
    assert "vulnerability" in (REPO / "SECURITY.md").read_text()


@pytest.mark.timeout(300)
def test_the_wheel_and_the_sdist_carry_the_licence(dists: dict[str, Path]) -> None:
    with zipfile.ZipFile(dists["wheel"]) as archive:
        (licence,) = [n for n in archive.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
        assert archive.read(licence).decode() == LICENCE
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        headers = archive.read(metadata).decode().split("\n\n", 1)[0].splitlines()
    # PEP 639 metadata (2.4): the SPDX expression and the file, not a free-text License: field.
    assert "License-Expression: MIT" in headers and "License-File: LICENSE" in headers, headers
    with tarfile.open(dists["sdist"]) as archive:
        (member,) = [m for m in archive.getmembers() if m.name.count("/") == 1
                     and m.name.endswith("/LICENSE")]
        extracted = archive.extractfile(member)
        assert extracted is not None and extracted.read().decode() == LICENCE


def _runtime_dependencies() -> list[str]:
    """The core's dependencies, then the grpc, eventhubs and platform extras' (``all`` names
    those three)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    deps: list[str] = (project["dependencies"] + extras["grpc"] + extras["eventhubs"]
                       + extras["platform"])
    return deps


def test_runtime_dependencies_are_ranges_that_the_lock_satisfies() -> None:
    from packaging.requirements import Requirement

    from tests.test_lock import locked_for

    locked = {p.name: p.version for p in locked_for(("grpc", "eventhubs", "platform"))}
    deps = _runtime_dependencies()
    assert len(deps) >= 10, deps
    for dep in deps:
        # A floor CI runs (.ci/dependency-floors.sh reads exactly this shape), at most a ceiling;
        # never an exact pin, which would keep a pip user from a dependency's security fix.
        assert "==" not in dep and re.fullmatch(r"[A-Za-z0-9_.-]+>=[^,;\s]+(,<[^,;\s]+)?", dep), dep
        requirement = Requirement(dep)
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        assert requirement.specifier.contains(locked[name], prereleases=True), (dep, locked[name])


def test_ci_installs_the_floor_of_every_runtime_range() -> None:
    script = (REPO / ".ci" / "dependency-floors.sh").read_text()
    assert "bash .ci/dependency-floors.sh" in (REPO / ".ci" / "run").read_text()
    # The script's own reading of pyproject.toml, run as the script runs it: one `name==floor`
    # for every runtime dependency, the one without a ceiling (certifi) included.
    reader = script.split("<<'PY'\n", 1)[1].split("\nPY\n", 1)[0]
    done = subprocess.run([sys.executable, "-c", reader], cwd=REPO, capture_output=True,
                          text=True, check=True, timeout=60)
    expected = [re.sub(r"^([^>]+)>=([^,]+)(,.*)?$", r"\1==\2", dep)
                for dep in _runtime_dependencies()]
    assert done.stdout.split() == expected
    assert any(pin.startswith("certifi==") for pin in expected), expected
    # What was installed is checked to be exactly the floors, and the pure tests run on them.
    assert "expected {want} installed" in script and "tests/test_tracker.py" in script

def test_the_dockerfiles_default_bases_are_pinned_by_digest() -> None:
    # Two builds of one commit start from the same bytes; the tag stays for the reader (and for
    # Renovate, which moves both). The tests build on local bases through these same ARGs.
    text = (REPO / "Dockerfile").read_text()
    defaults = dict(re.findall(r"^ARG (BUILDER_IMAGE|RUNTIME_IMAGE)=(\S+)$", text, re.M))
    assert set(defaults) == {"BUILDER_IMAGE", "RUNTIME_IMAGE"}, defaults
    for arg, reference in defaults.items():
        assert re.fullmatch(r"[a-z0-9.-]+(/[a-z0-9._-]+)+:[A-Za-z0-9._-]+@sha256:[0-9a-f]{64}",
                            reference), (arg, reference)
    assert defaults["BUILDER_IMAGE"].startswith("docker.io/library/debian:13-slim@")
    assert defaults["RUNTIME_IMAGE"].startswith("gcr.io/distroless/python3-debian13:nonroot@")
    # Every FROM names a stage or one of these ARGs: no base bypasses the pins.
    for base in re.findall(r"^FROM\s+(\S+)", text, re.M):
        assert base in ("${BUILDER_IMAGE}", "${RUNTIME_IMAGE}", "builder", "build-core"), base


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def _ci_pythons() -> tuple[list[str], set[str], set[str]]:
    """What CI runs: .ci/other-pythons.sh's list (as the script itself reads it), the Pythons the
    GitHub Linux job puts on PATH for `.ci/run`, and the Windows job's matrix."""
    import yaml

    env = {k: v for k, v in os.environ.items() if k != "OTHER_PYTHONS"}
    listed = subprocess.run(["bash", str(REPO / ".ci" / "other-pythons.sh"), "--list"],
                            env=env, capture_output=True, text=True, check=True, timeout=30)
    jobs = yaml.safe_load((REPO / ".github" / "workflows" / "ci.yml").read_text())["jobs"]
    (setup,) = [step for step in jobs["linux"]["steps"]
                if str(step.get("uses", "")).startswith("actions/setup-python@")]
    linux = set(str(setup["with"]["python-version"]).split())
    windows = {str(v) for v in jobs["windows"]["strategy"]["matrix"]["python"]}
    return listed.stdout.split(), linux, windows


def test_the_classifiers_name_exactly_the_pythons_ci_runs() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    classifiers: list[str] = pyproject["project"].get("classifiers", [])
    prefix = "Programming Language :: Python :: "
    declared = {c[len(prefix):] for c in classifiers if re.fullmatch(r".* :: 3\.\d+", c)
                and c.startswith(prefix)}
    others, linux, windows = _ci_pythons()
    # The GitHub Linux job gives .ci/run the other Pythons plus the one the whole suite runs on.
    assert set(others) <= linux, (others, linux)
    main = linux - set(others)
    assert len(main) == 1, f"the Linux job's Pythons besides .ci/other-pythons.sh's: {main}"
    runs = set(others) | main
    assert declared == runs, (
        f"pyproject.toml's classifiers name {sorted(declared, key=_version_key)}, CI runs "
        f"{sorted(runs, key=_version_key)} (.ci/other-pythons.sh and {sorted(main)} for the suite)")
    assert windows == runs, f"the Windows job runs {sorted(windows)}, not {sorted(runs)}"
    assert f"{sys.version_info[0]}.{sys.version_info[1]}" in runs
    assert {"Programming Language :: Python :: 3",
            "Programming Language :: Python :: 3 :: Only"} <= set(classifiers)
    # The oldest one is the floor everywhere it is written: pip's, ruff's and mypy's.
    floor = min(runs, key=_version_key)
    assert pyproject["project"]["requires-python"] == f">={floor}"
    assert pyproject["tool"]["ruff"]["target-version"] == "py" + floor.replace(".", "")
    assert pyproject["tool"]["mypy"]["python_version"] == floor
