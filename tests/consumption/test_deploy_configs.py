"""Deployment artefact checks: Kubernetes manifests (type-checked against kubernetes-types under
tsc --strict, plus the exporter's hardening, resources, probes and state volume), the reference
OpenTelemetry Collector config and the systemd unit. kubectl is not used: it needs an API server."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduled_events_exporter import RELEASE
from tests.consumption import consumption_helpers as ch
from tests.k8s_tools import PUBLISHED_IMAGE

IMAGE = f"{PUBLISHED_IMAGE}:{RELEASE}"
STATE_DIR = "/var/lib/scheduled-events-exporter"
KNOWN_ENV = re.compile(
    r"SEE_(IMDS_ENDPOINT|POLL_INTERVAL|SINKS|STATE_DIR|HEALTH_ADDR|EVENTHUB_NAMESPACE|EVENTHUB_NAME"
    r"|EVENTHUB_METRICS_NAME|EVENTHUB_HEARTBEAT|EVENTHUB_CONNECTION_STRING|SHUTDOWN_TIMEOUT"
    r"|STALENESS_LIMIT|READINESS_INCLUDES|LOG_LEVEL|SPOOL_MAX_\w+|APPROVE\w*)"
    r"|OTEL_\w+|POD_NAME|NODE_NAME|POD_NAMESPACE"
)


def test_manifests_type_check(tsc_errors: dict[str, list[str]]) -> None:
    errors = tsc_errors["k8s_manifests.ts"]
    assert errors == [], "\n".join(errors)


def workloads() -> list[tuple[str, dict[str, Any]]]:
    return [
        (w, d) for w, d in ch.k8s_documents()
        if d["kind"] in ("Deployment", "DaemonSet", "Pod", "Job")
    ]


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = doc["spec"] if doc["kind"] == "Pod" else doc["spec"]["template"]["spec"]
    return spec


def exporter(doc: dict[str, Any]) -> dict[str, Any]:
    spec = pod_spec(doc)
    containers: list[dict[str, Any]] = [*spec.get("initContainers", []), *spec["containers"]]
    (container,) = [c for c in containers if c["image"] == IMAGE and c["args"] == ["run"]]
    return container


def test_there_is_a_sidecar_and_a_daemonset() -> None:
    kinds = {d["kind"]: d for _, d in workloads()}
    assert "DaemonSet" in kinds
    sidecar = [d for _, d in workloads() if len(pod_spec(d)["containers"]) > 1]
    assert sidecar, "no pod with an app container next to the exporter"
    native = [d for _, d in workloads() if d["kind"] == "Job"
              and pod_spec(d)["initContainers"][0].get("restartPolicy") == "Always"]
    assert native, "no native sidecar (an init container with restartPolicy: Always)"


@pytest.mark.parametrize(("where", "doc"), workloads(), ids=[w for w, _ in workloads()])
def test_exporter_container(where: str, doc: dict[str, Any]) -> None:
    spec = pod_spec(doc)
    c = exporter(doc)
    assert c["command"] == ["scheduled-events-exporter"] and c["args"] == ["run"]
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert sc.get("runAsNonRoot", spec["securityContext"].get("runAsNonRoot")) is True
    assert spec["securityContext"].get("runAsUser", 0) != 0
    assert spec.get("automountServiceAccountToken") is False
    resources = c["resources"]
    assert resources["requests"]["memory"] and resources["requests"]["cpu"]
    # docs/security.md: 192Mi carries the largest document the parser accepts on either protocol.
    assert resources["limits"]["memory"] == "192Mi"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    env = {e["name"]: e for e in c["env"]}
    health_port = int(env["SEE_HEALTH_ADDR"]["value"].rpartition(":")[2])
    # Readiness only where nothing else depends on it: a DaemonSet; a sidecar's readiness would
    # be its application's (docs/kubernetes.md).
    probes = [("livenessProbe", "/healthz")]
    if doc["kind"] == "DaemonSet":
        probes.append(("readinessProbe", "/readyz"))
    else:
        assert "readinessProbe" not in c, where
    for probe, path in probes:
        get = c[probe]["httpGet"]
        assert get["path"] == path
        assert ports.get(get["port"], get["port"]) == health_port
    for name in env:
        assert KNOWN_ENV.fullmatch(name), f"unknown variable {name}"
    assert env["SEE_STATE_DIR"]["value"] == STATE_DIR
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    state = volumes[mounts[STATE_DIR]]
    assert "emptyDir" in state or state.get("hostPath", {}).get("path") == STATE_DIR
    assert spec.get("hostNetwork") is not True, "use the node route to IMDS (see comment)"


def test_manifests_explain_state_trade_off() -> None:
    for path in sorted(ch.K8S_DIR.glob("*.yaml")):
        text = path.read_text(encoding="utf-8")
        assert text.startswith("# ")
        comments = "\n".join(line for line in text.splitlines() if line.lstrip().startswith("#"))
        assert "emptyDir" in comments and "hostPath" in comments, path
        assert "trade-off" in comments.lower(), path


# ------------------------------------------------------------------------------------- collector

COLLECTOR = ch.COLLECTOR_DIR / "collector.yaml"


def collector() -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(COLLECTOR.read_text(encoding="utf-8"))
    return config


def test_collector_pipelines_reference_defined_components() -> None:
    config = collector()
    service = config["service"]
    for ext in service.get("extensions", []):
        assert ext in config["extensions"], ext
    for name, pipeline in service["pipelines"].items():
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                assert component in config[kind], (name, component)
        assert pipeline["receivers"] and pipeline["exporters"], name


def test_collector_reference_shape() -> None:
    config = collector()
    assert set(config["receivers"]["otlp"]["protocols"]) == {"grpc", "http"}
    pipelines = config["service"]["pipelines"]
    assert pipelines["logs"]["exporters"] == ["otlp_http/azuremonitor"]
    assert "prometheus" in pipelines["metrics"]["exporters"]
    assert pipelines["metrics/azuremonitor"]["exporters"] == ["otlp_http/azuremonitor"]
    azure = config["exporters"]["otlp_http/azuremonitor"]
    assert azure["logs_endpoint"] and azure["metrics_endpoint"]
    assert azure["auth"]["authenticator"] in config["extensions"]
    assert "connection_string" in config["exporters"]["azuremonitor"]
    prom = config["exporters"]["prometheus"]
    assert prom["endpoint"].endswith(":8889")
    assert prom["resource_to_telemetry_conversion"]["enabled"] is True
    assert config["exporters"]["prometheusremotewrite"]["endpoint"]
    assert COLLECTOR.read_text(encoding="utf-8").startswith("# ")


#: Component types renamed to lower_snake_case, with the deprecated alias (collector v0.144.0 for
#: otlphttp -> otlp_http; the contrib azure auth extension declares type azure_auth, deprecated
#: type azureauth).
DEPRECATED_COMPONENTS = {"otlphttp": "otlp_http", "azureauth": "azure_auth"}


def component_type(component_id: str) -> str:
    return component_id.split("/", 1)[0]


def test_collector_uses_current_component_names() -> None:
    config = collector()
    for section in ("receivers", "processors", "exporters", "extensions"):
        for component in config.get(section, {}):
            assert component_type(component) not in DEPRECATED_COMPONENTS, component


def test_delta_conversion_never_reaches_the_rate_rules() -> None:
    # Application Insights wants delta temporality; the PromQL rules use rate()/increase(), which
    # need cumulative counters. The converter exists for the Azure Monitor pipeline only and
    # excludes this exporter's metrics.
    config = collector()
    (name,) = [p for p in config["processors"] if component_type(p) == "cumulativetodelta"]
    exclude = config["processors"][name]["exclude"]
    assert exclude["match_type"] == "regexp"
    assert any(re.match(rx, "azure.scheduled_events.export.failures") for rx in exclude["metrics"])
    for pipeline_name, pipeline in config["service"]["pipelines"].items():
        if "prometheus" in pipeline.get("exporters", []) or "prometheusremotewrite" in pipeline.get(
            "exporters", []
        ):
            assert name not in pipeline.get("processors", []), pipeline_name
    scrape = config["service"]["pipelines"]["metrics"]
    assert "otlp_http/azuremonitor" not in scrape["exporters"]


def test_collector_documents_the_preview_and_endpoints() -> None:
    text = COLLECTOR.read_text(encoding="utf-8")
    assert "--name OtlpApplicationInsights --namespace Microsoft.Insights" in text
    assert "copied from the portal" in text
    assert "OTEL_METRIC_EXPORT_INTERVAL" in text


# --------------------------------------------------------------------------------------- systemd

UNIT = ch.SYSTEMD_DIR / "scheduled-events-exporter.service"
ENV_FILE = ch.SYSTEMD_DIR / "scheduled-events-exporter.env"


def unit_settings(path: Path) -> dict[str, dict[str, list[str]]]:
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        assert current is not None, line
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def test_systemd_unit() -> None:
    assert UNIT.read_text(encoding="utf-8").startswith("# ")
    unit = unit_settings(UNIT)
    service = unit["Service"]
    assert service["ExecStart"][0].endswith("scheduled-events-exporter run")
    assert service["DynamicUser"] == ["yes"] or service.get("User")
    assert service["StateDirectory"] == ["scheduled-events-exporter"]
    assert "SEE_STATE_DIR=%S/scheduled-events-exporter" in service["Environment"]
    assert any(
        v.lstrip("-") == "/etc/scheduled-events-exporter/env" for v in service["EnvironmentFile"]
    )
    for key, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "RestrictSUIDSGID": "yes",
        "CapabilityBoundingSet": "",
    }.items():
        assert service[key] == [value], key
    assert service["RestartPreventExitStatus"] == ["2"]
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


def test_systemd_env_file() -> None:
    text = ENV_FILE.read_text(encoding="utf-8")
    assert text.startswith("# ")
    for line in text.splitlines():
        body = line.lstrip("#").strip()
        if re.fullmatch(r"[A-Z_]+=.*", body):
            assert KNOWN_ENV.fullmatch(body.partition("=")[0]), body


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    """systemd's own parser accepts every line (unknown keys are mere warnings, so any output
    fails). Not one of the installed consumption tools: skipped where systemd is absent."""
    import shutil
    import subprocess

    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not available (systemd not installed)")
    unit = tmp_path / UNIT.name
    # verify checks that ExecStart exists: point it at a binary every system has.
    unit.write_text(
        UNIT.read_text(encoding="utf-8").replace(
            "/opt/scheduled-events-exporter/current/bin/scheduled-events-exporter run",
            "/bin/true run",
        ),
        encoding="utf-8",
    )
    proc = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60, check=False
    )
    output = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 0 and not output, output
