"""The deployment examples (config/k8s, config/systemd) are working deployments of the Event Hubs
ingestion template as shipped: same hub names, credentials required where the sink needs them,
and each passes check-config with its own variables (plus a dummy credential)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = json.loads((REPO / "config" / "azure" / "event-hubs-ingestion.json").read_text())
ENV_FILE = REPO / "config" / "systemd" / "scheduled-events-exporter.env"
DUMMY = ("Endpoint=sb://example.servicebus.windows.net/;SharedAccessKeyName=send;"
         "SharedAccessKey=ZHVtbXk=")


def default(parameter: str) -> str:
    return str(TEMPLATE["parameters"][parameter]["defaultValue"])


def exporter_containers() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted((REPO / "config" / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            spec = (doc or {}).get("spec", {}).get("template", {}).get("spec", {})
            for container in spec.get("containers", []):
                if container.get("args") == ["run"]:
                    found.append((path.name, container))
    return found


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e for e in container.get("env", [])}


def env_file_settings(uncomment: bool) -> dict[str, str]:
    settings = {}
    for line in ENV_FILE.read_text().splitlines():
        line = line.strip()
        if uncomment and line.startswith("#SEE_EVENTHUB"):
            line = line[1:]
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            settings[key] = value
    return settings


def check_config(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    script = str(Path(sys.executable).with_name("scheduled-events-exporter"))
    return subprocess.run([script, "check-config"], env={"PATH": "/usr/bin:/bin", **env},
                          capture_output=True, text=True, timeout=60, check=False)


def test_there_are_examples_with_the_eventhubs_sink() -> None:
    assert any("eventhubs" in env_of(c).get("SEE_SINKS", {}).get("value", "")
               for _, c in exporter_containers())


@pytest.mark.parametrize(("where", "container"), exporter_containers(), ids=lambda v: str(v)[:40])
def test_kubernetes_examples_match_the_template(where: str, container: dict[str, Any]) -> None:
    env = env_of(container)
    sinks = env.get("SEE_SINKS", {}).get("value", "")
    if "eventhubs" not in sinks:
        return
    assert env["SEE_EVENTHUB_NAME"]["value"] == default("eventHubName")
    assert env["SEE_EVENTHUB_METRICS_NAME"]["value"] == default("metricsEventHubName")
    credential = env.get("SEE_EVENTHUB_CONNECTION_STRING", {}).get("valueFrom", {})
    ref = credential.get("secretKeyRef", {})
    assert ref or "SEE_EVENTHUB_NAMESPACE" in env, "the eventhubs sink needs a credential"
    assert ref.get("optional") is not True, "an optional Secret makes every pod crash-loop"
    values = {k: str(v["value"]) for k, v in env.items() if "value" in v}
    values = {k: v.replace("$(NODE_NAME)", "node").replace("$(POD_NAME)", "pod")
              for k, v in values.items()}
    values |= {"SEE_EVENTHUB_CONNECTION_STRING": DUMMY, "SEE_STATE_DIR": ""}
    done = check_config(values)
    assert done.returncode == 0, done.stderr


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
