"""The Kubernetes examples show the scrape consistently: the exporter serves Prometheus on the port
the pod annotations and the PodMonitors name, the PodMonitors select those pods, and both
PodMonitor flavours (Prometheus Operator, Azure Monitor managed Prometheus) relabel the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduled_events_exporter.config import load_config
from tests.k8s_tools import PUBLISHED_IMAGE

K8S = Path(__file__).resolve().parents[1] / "config" / "k8s"
IMAGE_PREFIX = f"{PUBLISHED_IMAGE}:"


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def workloads() -> list[dict[str, Any]]:
    return [d for p in sorted(K8S.glob("*.yaml")) for d in docs(p)
            if d["kind"] in ("DaemonSet", "Deployment")]


def exporter(workload: dict[str, Any]) -> dict[str, Any]:
    (container,) = [c for c in workload["spec"]["template"]["spec"]["containers"]
                    if c["image"].startswith(IMAGE_PREFIX)]
    return container


def scrape_port(container: dict[str, Any]) -> int:
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    config = load_config({"SEE_STATE_DIR": "", **{k: v for k, v in env.items()
                                                  if k.startswith("OTEL_METRICS_EXPORTER")
                                                  or k.startswith("OTEL_EXPORTER_PROMETHEUS")}})
    assert "prometheus" in config.metrics_exporters
    return config.prometheus_addr[1]


@pytest.mark.parametrize("workload", workloads(), ids=lambda w: str(w["kind"]))
def test_workload_serves_the_annotated_port(workload: dict[str, Any]) -> None:
    container = exporter(workload)
    port = scrape_port(container)
    assert port in [p["containerPort"] for p in container["ports"]]
    annotations = workload["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(port)
    assert annotations["prometheus.io/path"] == "/metrics"


MONITOR_FILES = sorted((K8S / "monitoring").glob("*.yaml"))


def monitors() -> list[dict[str, Any]]:
    return [d for p in MONITOR_FILES for d in docs(p)]


@pytest.mark.parametrize("monitor", monitors(),
                         ids=lambda m: f"{m['apiVersion']}/{m['metadata']['name']}")
def test_pod_monitor_selects_an_exporter_pod_and_its_port(monitor: dict[str, Any]) -> None:
    assert monitor["kind"] == "PodMonitor"
    assert monitor["apiVersion"] in ("monitoring.coreos.com/v1", "azmonitoring.coreos.com/v1")
    selector = monitor["spec"]["selector"]["matchLabels"]
    (workload,) = [w for w in workloads()
                   if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()]
    assert monitor["metadata"]["namespace"] == workload["metadata"].get("namespace", "default")
    container = exporter(workload)
    ports = {p.get("name"): p["containerPort"] for p in container["ports"]}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert ports[endpoint["port"]] == scrape_port(container)
    assert endpoint["path"] == "/metrics"
    relabel = {r["targetLabel"]: r for r in endpoint["relabelings"]}
    # job as on the Collector route (service.name); instance as the service.instance.id.
    assert relabel["job"]["replacement"] == "azure-scheduled-events-exporter"
    env = {e["name"]: e.get("value", "") for e in container["env"]}
    assert env["OTEL_SERVICE_NAME"] == "azure-scheduled-events-exporter"
    source = {"NODE_NAME": "__meta_kubernetes_pod_node_name",
              "POD_NAME": "__meta_kubernetes_pod_name"}
    instance_var = env["OTEL_RESOURCE_ATTRIBUTES"].split("service.instance.id=$(")[1].split(")")[0]
    assert relabel["instance"]["sourceLabels"] == [source[instance_var]]


def test_both_flavours_are_the_same_objects() -> None:
    by_group: dict[str, list[dict[str, Any]]] = {}
    for monitor in monitors():
        spec = {k: v for k, v in monitor["spec"].items() if not k.endswith("Limit")}
        by_group.setdefault(monitor["apiVersion"], []).append(
            {"name": monitor["metadata"]["name"], "spec": spec})
    assert set(by_group) == {"monitoring.coreos.com/v1", "azmonitoring.coreos.com/v1"}
    assert by_group["monitoring.coreos.com/v1"] == by_group["azmonitoring.coreos.com/v1"]
