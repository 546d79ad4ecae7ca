"""The deployment examples (config/k8s, the Helm chart's Event Hubs values, config/systemd) are
working deployments of the Event Hubs ingestion template as shipped: same hub names, credentials
required where the sink needs them, and each passes check-config with its own variables (plus a
dummy credential)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from scheduled_events_exporter.env_file import parse_env_file
from tests.k8s_tools import CHART, render

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = json.loads((REPO / "config" / "azure" / "event-hubs-ingestion.json").read_text())
ENV_FILE = REPO / "config" / "systemd" / "scheduled-events-exporter.env"
DUMMY = ("Endpoint=sb://example.servicebus.windows.net/;SharedAccessKeyName=send;"
         "SharedAccessKey=ZHVtbXk=")


def default(parameter: str) -> str:
    return str(TEMPLATE["parameters"][parameter]["defaultValue"])


CHART_EVENTHUBS_VALUES = sorted((CHART / "ci").glob("eventhubs-*-values.yaml"))


def exporters_in(where: str, text: str) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for doc in yaml.safe_load_all(text):
        spec = (doc or {}).get("spec", {}).get("template", {}).get("spec", {})
        for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            if container.get("args") == ["run"]:
                found.append((where, container))
    return found


def exporter_containers() -> list[tuple[str, dict[str, Any]]]:
    """The exporters of config/k8s/ and of the chart rendered with its Event Hubs values."""
    found = []
    for path in sorted((REPO / "config" / "k8s").glob("*.yaml")):
        found += exporters_in(path.name, path.read_text())
    for values in CHART_EVENTHUBS_VALUES:
        found += exporters_in(f"chart -f {values.name}", render("-f", str(values)))
    return found


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e for e in container.get("env", [])}


def env_file_settings(uncomment: bool) -> dict[str, str]:
    """What systemd makes of the shipped environment file (the parser check-config --env-file
    uses) once its OTLP lines are uncommented, as docs/vm.md has the operator do (shipped, it
    names no sink), and its commented Event Hubs lines too when asked."""
    text = re.sub(r"^#((?:SEE_SINKS|OTEL_EXPORTER_OTLP_\w+)=)", r"\1",
                  ENV_FILE.read_text(encoding="utf-8"), flags=re.M)
    if uncomment:
        text = re.sub(r"^#(SEE_EVENTHUB)", r"\1", text, flags=re.M)
    return parse_env_file(text).values


def check_config(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    script = str(Path(sys.executable).with_name("scheduled-events-exporter"))
    return subprocess.run([script, "check-config"], env={"PATH": "/usr/bin:/bin", **env},
                          capture_output=True, text=True, timeout=60, check=False)


def test_the_chart_has_event_hubs_examples_by_secret_and_by_identity() -> None:
    with_eventhubs = [(w, c) for w, c in exporter_containers()
                      if "eventhubs" in env_of(c).get("SEE_SINKS", {}).get("value", "")]
    credentials = {"SEE_EVENTHUB_CONNECTION_STRING" in env_of(c) for _, c in with_eventhubs}
    assert credentials == {True, False}, with_eventhubs


def test_kubernetes_examples_match_the_template() -> None:
    checked = [check_example(where, c) for where, c in exporter_containers()]
    assert sum(checked) >= 2


def check_example(where: str, container: dict[str, Any]) -> bool:
    env = env_of(container)
    sinks = env.get("SEE_SINKS", {}).get("value", "")
    if "eventhubs" not in sinks:
        return False
    assert env["SEE_EVENTHUB_NAME"]["value"] == default("eventHubName")
    assert env["SEE_EVENTHUB_METRICS_NAME"]["value"] == default("metricsEventHubName")
    credential = env.get("SEE_EVENTHUB_CONNECTION_STRING", {}).get("valueFrom", {})
    ref = credential.get("secretKeyRef", {})
    assert ref or "SEE_EVENTHUB_NAMESPACE" in env, "the eventhubs sink needs a credential"
    assert ref.get("optional") is not True, "an optional Secret makes every pod crash-loop"
    values = {k: str(v["value"]) for k, v in env.items() if "value" in v}
    values = {k: re.sub(r"\$\((\w+)\)", "x", v) for k, v in values.items()}
    values |= {"SEE_EVENTHUB_CONNECTION_STRING": DUMMY, "SEE_STATE_DIR": ""}
    if "SEE_EVENTHUB_NAMESPACE" in env:
        del values["SEE_EVENTHUB_CONNECTION_STRING"]
    done = check_config(values)
    assert done.returncode == 0, f"{where}: {done.stderr}"
    return True


def test_systemd_example_matches_the_template() -> None:
    settings = env_file_settings(uncomment=True)
    assert settings["SEE_EVENTHUB_NAME"] == default("eventHubName")
    assert settings["SEE_EVENTHUB_METRICS_NAME"] == default("metricsEventHubName")
    assert "EntityPath" not in settings["SEE_EVENTHUB_CONNECTION_STRING"], \
        "one namespace-level key serves both hubs"
    for with_eventhubs in (False, True):
        env = env_file_settings(uncomment=False) | {"SEE_STATE_DIR": ""}
        if with_eventhubs:
            env |= {"SEE_SINKS": env["SEE_SINKS"] + ",eventhubs", "SEE_EVENTHUB_CONNECTION_STRING":
                    DUMMY, "SEE_EVENTHUB_NAME": settings["SEE_EVENTHUB_NAME"],
                    "SEE_EVENTHUB_METRICS_NAME": settings["SEE_EVENTHUB_METRICS_NAME"]}
        done = check_config(env)
        assert done.returncode == 0, done.stderr
        if with_eventhubs:
            assert "SEE_EVENTHUB_METRICS_NAME=scheduled-events-metrics" in done.stdout
