"""The Kubernetes tools the chart and manifest tests run (``bash .ci/install-k8s-tools.sh``):
Helm 4, kubectl 1.33 with kustomize, checkov; plus the chart's rendering helpers."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
TOOLS = REPO / ".ci" / "k8s"
CHART = REPO / "charts" / "azure-scheduled-events-exporter"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
KUBE_VERSION = "1.33.0"
#: Custom resources of the Prometheus Operator: not in Kubernetes' published schemas.
CUSTOM_KINDS = frozenset({"PodMonitor", "ServiceMonitor", "PrometheusRule"})
#: Where releases publish the image (docs/releasing.md); the chart and config/k8s name it.
PUBLISHED_IMAGE = "ghcr.io/azure-scheduled-events-exporter/azure-scheduled-events-exporter"


def tool(name: str) -> str:
    """``.ci/k8s/<name>``; skipped when the tools were never installed on this machine, failed in
    CI (``CI=true``), where a green run must never hide a skipped check."""
    path = {"checkov": TOOLS / "checkov-venv" / "bin" / "checkov"}.get(name, TOOLS / name)
    if path.is_file():
        return str(path)
    message = f"{path} missing: run `bash .ci/install-k8s-tools.sh`"
    if os.environ.get("CI", "").strip().lower() in ("", "0", "false", "no"):
        pytest.skip(message)
    pytest.fail(message)


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=300,
                          check=False, env={**os.environ, "KUBECONFIG": os.devnull})
    if check and done.returncode != 0:
        pytest.fail(f"{' '.join(args[:3])} ... exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run(tool("helm"), *args, check=check)


def render(*args: str, release: str = "see", namespace: str = "scheduled-events") -> str:
    """``helm template`` of the chart for Kubernetes 1.33."""
    return helm("template", release, str(CHART), "--namespace", namespace,
                "--kube-version", KUBE_VERSION, *args).stdout


def documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = doc["spec"] if doc["kind"] == "Pod" else doc["spec"]["template"]["spec"]
    return spec


def containers(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    spec = pod_spec(doc)
    yield from spec.get("initContainers", [])
    yield from spec.get("containers", [])


#: The findings the chart's renderings accept, each with its reason (docs/kubernetes.md).
CHECKOV_CONFIG = REPO / "charts" / "checkov.yaml"


def checkov(directory: Path, config: Path | None = None,
            frameworks: tuple[str, ...] = ("kubernetes",)) -> dict[str, Any]:
    """checkov's JSON report on the files in ``directory`` (offline; Kubernetes manifests unless
    other frameworks are named), with ``config`` as its configuration file when given."""
    done = run(tool("checkov"), "-d", str(directory), "--framework", *frameworks, "-o", "json",
               "--skip-download", *(["--config-file", str(config)] if config else []),
               check=False)
    report = json.loads(done.stdout)
    reports = report if isinstance(report, list) else [report]
    merged: dict[str, Any] = {"failed": [], "skipped": [], "passed": 0}
    for one in reports:
        results = one.get("results", {})
        merged["failed"] += results.get("failed_checks", [])
        merged["skipped"] += results.get("skipped_checks", [])
        merged["passed"] += len(results.get("passed_checks", []))
    return merged
