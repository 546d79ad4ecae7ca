"""A route whose extra is not installed: one configuration error line naming the extra.

The core install (``pip install azure-scheduled-events-exporter``, the slim image) has neither
gRPC nor the Event Hubs packages. The real CLI runs in a subprocess whose ``sitecustomize``
makes those packages unimportable exactly as if they were not installed
(``ModuleNotFoundError``); ``run`` and ``check-config`` must then exit 2 with one line naming
the setting that asked for the route and the extra that adds it, and no traceback. (The same
on a real core install, without the blocker: tests/test_core_install.py.)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

from scheduled_events_exporter import extras
from tests.exporter_process import clean_env, state_dir

REPO = Path(__file__).resolve().parents[1]
BLOCKER = '''
import sys

class _NotInstalled:
    """Behave as if these distributions were not installed."""
    blocked = {blocked!r}

    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in self.blocked):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, _NotInstalled())
'''
CONNECTION = ("Endpoint=sb://127.0.0.1:5999;SharedAccessKeyName=k;SharedAccessKey=dGVzdA==;"
              "EntityPath=hub")
IN_A_CONTAINER = "in a container, the default image rather than -slim"


def hashed(extra: str) -> str:
    """The line's second way to install an extra: its lock, with hashes."""
    return ("or with the hashes CI tests: pip install --require-hashes --no-deps -r "
            f"requirements/extra-{extra}.lock")


def run_cli(tmp_path: Path, command: str, blocked: list[str],
            **env: str) -> subprocess.CompletedProcess[str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER.format(blocked=blocked))
    return subprocess.run(
        [sys.executable, "-m", "scheduled_events_exporter", command],
        env=clean_env(PYTHONPATH=str(site), SEE_HEALTH_ADDR="",
                      SEE_STATE_DIR=state_dir(tmp_path), **env),
        capture_output=True, text=True, timeout=60, check=False,
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a refused start (exit 2, no traceback)."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    return line


@pytest.mark.parametrize("command", ["run", "check-config"])
def test_eventhubs_with_a_connection_string_without_azure_eventhub(tmp_path: Path,
                                                                   command: str) -> None:
    result = run_cli(tmp_path, command, ["azure.eventhub"], SEE_SINKS="eventhubs",
                     SEE_EVENTHUB_CONNECTION_STRING=CONNECTION)
    assert one_line(result) == (
        "configuration error: SEE_SINKS='eventhubs': the eventhubs sink needs azure-eventhub, "
        "which is not installed (the eventhubs extra); expected it installed (pip install "
        f"'azure-scheduled-events-exporter[eventhubs]', {hashed('eventhubs')}; "
        f"{IN_A_CONTAINER}) or eventhubs removed from SEE_SINKS")
    assert "dGVzdA==" not in result.stderr + result.stdout


def test_eventhubs_with_managed_identity_without_either_package(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "check-config", ["azure.eventhub", "azure.identity"],
                     SEE_SINKS="console,eventhubs",
                     SEE_EVENTHUB_NAMESPACE="ns.servicebus.windows.net", SEE_EVENTHUB_NAME="hub")
    line = one_line(result)
    assert line.startswith("configuration error: SEE_SINKS='console,eventhubs': the eventhubs "
                           "sink needs azure-eventhub and azure-identity, which are not "
                           "installed"), line
    assert "pip install 'azure-scheduled-events-exporter[eventhubs]'" in line


@pytest.mark.parametrize("command", ["run", "check-config"])
def test_otlp_over_grpc_without_grpcio(tmp_path: Path, command: str) -> None:
    result = run_cli(tmp_path, command, ["grpc"], SEE_SINKS="otlp",
                     OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
                     OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:5999")
    assert one_line(result) == (
        "configuration error: OTEL_EXPORTER_OTLP_PROTOCOL='grpc': OTLP over gRPC needs grpcio, "
        "which is not installed (the grpc extra); expected it installed (pip install "
        f"'azure-scheduled-events-exporter[grpc]', {hashed('grpc')}; {IN_A_CONTAINER}) or "
        "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf (the collector's port 4318)")


def test_the_line_names_the_variable_that_chose_grpc(tmp_path: Path) -> None:
    # Log records over HTTP, metrics over gRPC: the metrics' own variable is the one to change.
    result = run_cli(tmp_path, "check-config", ["grpc"], SEE_SINKS="otlp",
                     OTEL_METRICS_EXPORTER="otlp", OTEL_EXPORTER_OTLP_METRICS_PROTOCOL="grpc",
                     OTEL_EXPORTER_OTLP_METRICS_ENDPOINT="http://127.0.0.1:5999")
    line = one_line(result)
    assert line.startswith("configuration error: OTEL_EXPORTER_OTLP_METRICS_PROTOCOL='grpc': "
                           "OTLP over gRPC needs grpcio"), line
    assert line.endswith("or OTEL_EXPORTER_OTLP_METRICS_PROTOCOL=http/protobuf (the "
                         "collector's port 4318)"), line


def test_the_core_routes_need_no_extra(tmp_path: Path) -> None:
    """OTLP over HTTP, metrics over OTLP and Prometheus, the console: valid with every
    extra's packages unimportable (and gRPC chosen for metrics that are not sent over OTLP
    asks for nothing)."""
    result = run_cli(tmp_path, "check-config", ["grpc", "azure"], SEE_SINKS="console,otlp",
                     OTEL_METRICS_EXPORTER="otlp,prometheus",
                     OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:5999")
    assert result.returncode == 0, result.stderr
    result = run_cli(tmp_path, "check-config", ["grpc"], SEE_SINKS="otlp",
                     OTEL_METRICS_EXPORTER="prometheus",
                     OTEL_EXPORTER_OTLP_METRICS_PROTOCOL="grpc",
                     OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:5999")
    assert result.returncode == 0, result.stderr


def test_each_extra_installs_what_its_line_names() -> None:
    """The extras the lines name are pyproject.toml's, with exactly those distributions, and
    none of them is in the core."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    optional = project["optional-dependencies"]
    for extra in (extras.GRPC, extras.EVENTHUBS, extras.PLATFORM):
        declared = {Requirement(r).name for r in optional[extra.name]}
        assert declared == {distribution for _, distribution in extra.modules}, extra
    core = {Requirement(r).name for r in project["dependencies"]}
    assert not core & {"grpcio", "azure-eventhub", "azure-identity", "azure-storage-queue"}, core
    assert set(optional["all"]) == {f"{extras.DISTRIBUTION}[grpc,eventhubs,platform]"}


def test_the_blocker_is_the_only_difference(tmp_path: Path) -> None:
    """Without blocking anything the same invocations are valid (exit 0)."""
    for env in ({"SEE_SINKS": "eventhubs", "SEE_EVENTHUB_CONNECTION_STRING": CONNECTION},
                {"SEE_SINKS": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                 "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:5999"}):
        result = run_cli(tmp_path, "check-config", [], **env)
        assert result.returncode == 0, result.stderr
        assert f"SEE_SINKS={env['SEE_SINKS']}" in result.stdout


QUEUE = ("DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;"
         "QueueEndpoint=http://127.0.0.1:9/devstoreaccount1;")


def test_the_platform_command_without_the_storage_queue_sdk(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "platform", ["azure.storage"], SEE_SINKS="console",
                     SEE_PLATFORM_QUEUE_CONNECTION_STRING=QUEUE, SEE_PLATFORM_QUEUE_NAME="events")
    assert one_line(result) == (
        "configuration error: the platform command: reading the platform's record needs "
        "azure-storage-queue, which is not installed (the platform extra); expected it "
        "installed (pip install 'azure-scheduled-events-exporter[platform]', "
        f"{hashed('platform')}; {IN_A_CONTAINER}) or the sidecar's run command alone")
    assert "a2V5" not in result.stderr + result.stdout


def test_the_platform_command_with_managed_identity_needs_azure_identity_too(
        tmp_path: Path) -> None:
    result = run_cli(tmp_path, "platform", ["azure.storage", "azure.identity"],
                     SEE_PLATFORM_QUEUE_URL="https://acct.queue.core.windows.net/events")
    assert "needs azure-storage-queue and azure-identity, which are not installed" in \
        one_line(result)


def test_run_needs_no_platform_extra_and_the_platform_needs_a_queue(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "check-config", ["azure.storage"], SEE_SINKS="console")
    assert result.returncode == 0, result.stderr
    result = run_cli(tmp_path, "platform", [], SEE_SINKS="console")
    assert one_line(result).startswith("configuration error: SEE_PLATFORM_QUEUE_URL: expected "
                                       "the queue Event Grid delivers to")
