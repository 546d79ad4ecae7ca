"""A route whose extra is not installed: one configuration error line naming the extra.

The core install (``pip install azure-scheduled-events-exporter``, the slim image) has neither
gRPC nor the Event Hubs packages. The real CLI runs in a subprocess whose ``sitecustomize``
makes those packages unimportable exactly as if they were not installed
(``ModuleNotFoundError``); ``run`` and ``check-config`` must then exit 2 with one line naming
the setting that asked for the route and the extra that adds it, and no traceback. (The same
on a real core install, without the blocker: tests/test_core_install.py.)
"""

from __future__ import annotations

import re
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
#: The pip of the interpreter that runs the exporter (the subprocess runs this one): the
#: environment to add an extra to, whatever ``pip`` the PATH finds first.
PIP = f"{sys.executable} -m pip"


def ways(extra: str) -> str:
    """The line's two ways to install an extra into this environment: by name, and from its
    lock (by its absolute path: this checkout is the source tree) with hashes."""
    lock = REPO / "requirements" / f"extra-{extra}.lock"
    return (f"expected it installed into this exporter's environment ({PIP} install "
            f"'azure-scheduled-events-exporter[{extra}]', or with the hashes CI tests: {PIP} "
            f"install --require-hashes --no-deps -r {lock})")


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
        f"which is not installed (the eventhubs extra); {ways('eventhubs')} or eventhubs "
        "removed from SEE_SINKS")
    assert "dGVzdA==" not in result.stderr + result.stdout


def test_eventhubs_with_managed_identity_without_either_package(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "check-config", ["azure.eventhub", "azure.identity"],
                     SEE_SINKS="console,eventhubs",
                     SEE_EVENTHUB_NAMESPACE="ns.servicebus.windows.net", SEE_EVENTHUB_NAME="hub")
    line = one_line(result)
    assert line.startswith("configuration error: SEE_SINKS='console,eventhubs': the eventhubs "
                           "sink needs azure-eventhub and azure-identity, which are not "
                           "installed"), line
    assert f"{PIP} install 'azure-scheduled-events-exporter[eventhubs]'" in line


@pytest.mark.parametrize("command", ["run", "check-config"])
def test_otlp_over_grpc_without_grpcio(tmp_path: Path, command: str) -> None:
    result = run_cli(tmp_path, command, ["grpc"], SEE_SINKS="otlp",
                     OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
                     OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:5999")
    assert one_line(result) == (
        "configuration error: OTEL_EXPORTER_OTLP_PROTOCOL='grpc': OTLP over gRPC needs grpcio, "
        f"which is not installed (the grpc extra); {ways('grpc')} or "
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


# --- the way out, for the install that runs -------------------------------------------------

GRPC_ARGS = ("OTEL_EXPORTER_OTLP_PROTOCOL='grpc'", "OTLP over gRPC", extras.GRPC, ["grpcio"],
             "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf")


def test_the_lock_path_and_the_pip_are_absolute_and_exist(tmp_path: Path) -> None:
    """What the line says to run can be run from any directory: the interpreter and the lock
    are named by absolute paths that exist (a VM's service runs from /, the user from home)."""
    line = one_line(run_cli(tmp_path, "check-config", ["grpc"], SEE_SINKS="otlp",
                            OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
                            OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:5999"))
    commands = re.findall(r"(\S+) -m pip install --require-hashes --no-deps -r (\S+?)\)", line)
    assert len(commands) == 1, line
    ((python, lock),) = commands
    assert Path(python).is_absolute() and Path(python).samefile(sys.executable), line
    assert Path(lock).is_absolute() and Path(lock).is_file(), line
    assert "requirements/" not in line.replace(str(REPO / "requirements"), ""), \
        f"a relative lock path in: {line}"


def test_the_slim_image_is_told_to_use_the_default_image_not_pip() -> None:
    slim = extras.Install(python="/opt/scheduled-events-exporter/bin/python", pip=False,
                          source=None, image="slim")
    line = extras.problem(*GRPC_ARGS, install=slim)
    assert line == (
        "OTEL_EXPORTER_OTLP_PROTOCOL='grpc': OTLP over gRPC needs grpcio, which is not in this "
        "image (the slim image has the core alone, and no pip to add the grpc extra); expected "
        "the default image, which has every extra (the same tag without -slim; the chart's "
        "image.flavor=default), or an image built with it (the Dockerfile's default target, "
        "docs/container.md), or OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf")
    assert "pip" not in line.replace("no pip", ""), line


def test_without_pip_in_the_environment_another_pip_installs_into_it() -> None:
    bare = extras.Install(python="/opt/see/bin/python", pip=False, source=REPO, image="")
    line = extras.problem(*GRPC_ARGS, install=bare)
    assert ("(pip --python /opt/see/bin/python install 'azure-scheduled-events-exporter[grpc]', "
            "or with the hashes CI tests: pip --python /opt/see/bin/python install "
            f"--require-hashes --no-deps -r {REPO / 'requirements' / 'extra-grpc.lock'})") \
        in line, line


def test_a_wheel_built_elsewhere_names_the_lock_in_the_source_tree(tmp_path: Path) -> None:
    # docs/vm.md installs a wheel built in a temporary clone: no source tree is recorded.
    vm = extras.Install(python="/opt/scheduled-events-exporter/bin/python", pip=True,
                        source=None, image="")
    line = extras.problem(*GRPC_ARGS, install=vm)
    assert ("expected it installed into this exporter's environment "
            "(/opt/scheduled-events-exporter/bin/python -m pip install "
            "'azure-scheduled-events-exporter[grpc]', or with the hashes CI tests, run in the "
            "exporter's source tree: /opt/scheduled-events-exporter/bin/python -m pip install "
            "--require-hashes --no-deps -r requirements/extra-grpc.lock)") in line, line
    # A source tree that lost its lock is as good as none.
    gone = extras.problem(*GRPC_ARGS, install=extras.Install(
        python="/opt/see/bin/python", pip=True, source=tmp_path, image=""))
    assert "run in the exporter's source tree" in gone and str(tmp_path) not in gone, gone


def test_a_path_with_a_space_stays_one_word() -> None:
    spaced = extras.Install(python="C:\\Program Files\\see\\python.exe", pip=True, source=None,
                            image="")
    assert '("C:\\Program Files\\see\\python.exe" -m pip install' in \
        extras.problem(*GRPC_ARGS, install=spaced)


# --- a route that works only because its extra's packages are installed ---------------------

def warnings_of(result: subprocess.CompletedProcess[str]) -> list[str]:
    assert result.returncode == 0, result.stderr
    return [line.removeprefix("configuration warning: ") for line in result.stderr.splitlines()
            if line.startswith("configuration warning: ")]


def test_check_config_says_a_grpc_route_needs_the_extra_named_in_every_install(
        tmp_path: Path) -> None:
    """grpcio is installed here; whether the grpc extra was asked for is recorded nowhere (a
    ``pip install -U .`` over a release with grpcio in the core keeps it undeclared), and a
    fresh install without the extra refuses the route: check-config says so, and how."""
    result = run_cli(tmp_path, "check-config", [], SEE_SINKS="otlp",
                     OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
                     OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:5999")
    lock = REPO / "requirements" / "extra-grpc.lock"
    assert warnings_of(result) == [
        "OTEL_EXPORTER_OTLP_PROTOCOL='grpc': OTLP over gRPC works here because grpcio is "
        "installed, but it is not part of the core: the grpc extra brings it, and whether this "
        "install asked for that extra is recorded nowhere (pip install -U over a release that "
        "had it in the core leaves it installed without the extra); a fresh install without "
        "the extra refuses this route: expected the extra named in every install and upgrade "
        f"({PIP} install 'azure-scheduled-events-exporter[grpc]', or with the hashes CI tests: "
        f"{PIP} install --require-hashes --no-deps -r {lock})"]


def test_check_config_names_the_event_hubs_packages_the_route_uses(tmp_path: Path) -> None:
    # With a connection string, azure-identity is not used: only azure-eventhub is named.
    result = run_cli(tmp_path, "check-config", [], SEE_SINKS="console,eventhubs",
                     SEE_EVENTHUB_CONNECTION_STRING=CONNECTION)
    (warning,) = warnings_of(result)
    assert warning.startswith("SEE_SINKS='console,eventhubs': the eventhubs sink works here "
                              "because azure-eventhub is installed, but it is not part of the "
                              "core: the eventhubs extra brings it"), warning
    assert "'azure-scheduled-events-exporter[eventhubs]'" in warning, warning
    result = run_cli(tmp_path, "check-config", [], SEE_SINKS="eventhubs",
                     SEE_EVENTHUB_NAMESPACE="ns.servicebus.windows.net", SEE_EVENTHUB_NAME="hub")
    (warning,) = warnings_of(result)
    assert "because azure-eventhub and azure-identity are installed, but they are not" in \
        warning, warning


def test_the_core_routes_are_not_warned_of_extras(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "check-config", [], SEE_SINKS="console,otlp",
                     OTEL_METRICS_EXPORTER="otlp,prometheus",
                     OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:5999")
    assert warnings_of(result) == []
    # gRPC chosen for metrics that do not go over OTLP uses no extra (the one warning is that
    # the otlp sink's metrics are off).
    result = run_cli(tmp_path, "check-config", [], SEE_SINKS="otlp",
                     OTEL_METRICS_EXPORTER="prometheus", OTEL_EXPORTER_OTLP_METRICS_PROTOCOL="grpc",
                     OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:5999")
    assert [w for w in warnings_of(result) if "extra" in w] == [], result.stderr


def test_an_image_installs_its_extras_at_every_build_and_is_not_warned() -> None:
    image = extras.Install(python="/opt/scheduled-events-exporter/bin/python", pip=False,
                           source=None, image="default")
    assert extras.outside_core("SEE_SINKS='eventhubs'", "the eventhubs sink", extras.EVENTHUBS,
                               ["azure-eventhub"], install=image) == ""


QUEUE = ("DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;"
         "QueueEndpoint=http://127.0.0.1:9/devstoreaccount1;")


def test_the_platform_command_without_the_storage_queue_sdk(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "platform", ["azure.storage"], SEE_SINKS="console",
                     SEE_PLATFORM_QUEUE_CONNECTION_STRING=QUEUE, SEE_PLATFORM_QUEUE_NAME="events")
    assert one_line(result) == (
        "configuration error: the platform command: reading the platform's record needs "
        "azure-storage-queue, which is not installed (the platform extra); "
        f"{ways('platform')} or the sidecar's run command alone")
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
