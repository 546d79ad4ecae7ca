"""The core install, for real: ``requirements/runtime.lock`` and the exporter's wheel, no extra.

A virtualenv of its own (no pip in it: uv installs into it, the locked closure by hash, then
the wheel built from this checkout) is what ``pip install azure-scheduled-events-exporter``
gives and what the slim image carries. On it: nothing only gRPC or Event Hubs needs is
installed and what is installed is consistent (``pip check``); the common route, OTLP over
HTTP, delivers a scheduled event to a real collector (rotel); the gRPC and Event Hubs routes are
refused at start and by ``check-config`` in one line naming the extra to install, with nothing
made unimportable by the test (tests/test_missing_extras.py does that inside the main suite).
The pure tests run on core installs of Python 3.10, 3.12 and 3.13 in .ci/other-pythons.sh.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scheduled_events_exporter.simulator import Simulator
from tests.exporter_process import ExporterProcess, clean_env, free_port, state_dir
from tests.peers.rotel import RotelReceiver
from tests.test_hostile import event

REPO = Path(__file__).resolve().parents[1]
#: What only the extras may bring (the distributions' names as installed, lower case).
EXTRAS_ONLY = ("grpcio", "azure-", "msal", "cryptography", "cffi", "pyjwt", "requests")
CONNECTION = ("Endpoint=sb://127.0.0.1:5999;SharedAccessKeyName=k;SharedAccessKey=dGVzdA==;"
              "EntityPath=hub")

pytestmark = pytest.mark.timeout(300)


def _uv() -> str:
    uv = Path(sys.executable).with_name("uv")
    if not uv.is_file():
        pytest.fail("uv not installed: pip install -e '.[test]' installs it")
    return str(uv)


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The core virtualenv's ``bin`` directory."""
    venv = tmp_path_factory.mktemp("core") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = str(venv / "bin" / "python")
    for what in (["--require-hashes", "-r", str(REPO / "requirements" / "runtime.lock")],
                 [str(REPO)]):
        done = subprocess.run([_uv(), "pip", "install", "-q", "--python", python, "--no-deps",
                               *what], capture_output=True, text=True, timeout=280,
                              check=False)
        assert done.returncode == 0, done.stderr[-3000:]
    return venv / "bin"


def _installed(core: Path) -> list[str]:
    script = ("import importlib.metadata, json\n"
              "print(json.dumps(sorted(d.metadata['Name'].lower()\n"
              "                        for d in importlib.metadata.distributions())))")
    done = subprocess.run([str(core / "python"), "-c", script], capture_output=True, text=True,
                          timeout=60, check=True)
    names: list[str] = json.loads(done.stdout)
    return names


def test_the_core_install_holds_neither_grpc_nor_the_azure_sdk(core: Path) -> None:
    installed = _installed(core)
    assert "azure-scheduled-events-exporter" in installed and "urllib3" in installed, installed
    assert [n for n in installed if n.startswith(EXTRAS_ONLY)
            and n != "azure-scheduled-events-exporter"] == [], installed
    # Every installed distribution's own requirements are met: the core lock is complete.
    checked = subprocess.run([_uv(), "pip", "check", "--python", str(core / "python")],
                             capture_output=True, text=True, timeout=60, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def _cli(core: Path, tmp_path: Path, command: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(core / "scheduled-events-exporter"), command], cwd=tmp_path,
                          env=clean_env(SEE_HEALTH_ADDR="", SEE_STATE_DIR=state_dir(tmp_path),
                                        **env),
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("command", ["run", "check-config"])
@pytest.mark.parametrize(("env", "extra"), [
    ({"SEE_SINKS": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
      "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:5999"}, "grpc"),
    ({"SEE_SINKS": "console,eventhubs", "SEE_EVENTHUB_CONNECTION_STRING": CONNECTION},
     "eventhubs"),
], ids=["grpc", "eventhubs"])
def test_a_route_without_its_extra_is_refused_in_one_line(core: Path, tmp_path: Path,
                                                          command: str, env: dict[str, str],
                                                          extra: str) -> None:
    done = _cli(core, tmp_path, command, **env)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("configuration error: ") and "not installed" in line, line
    # This virtualenv has no pip (as uv makes one, and the images'): another pip installs into
    # it, named by its interpreter; the lock by its path in the tree it was installed from.
    pip = f"pip --python {core / 'python'}"
    assert f"({pip} install 'azure-scheduled-events-exporter[{extra}]', or with the hashes CI " \
           f"tests: {pip} install --require-hashes --no-deps -r " \
           f"{REPO / 'requirements' / f'extra-{extra}.lock'})" in line, line


def test_inside_the_slim_image_the_line_names_the_image_to_use(core: Path,
                                                               tmp_path: Path) -> None:
    """The slim image is this core virtualenv with the Dockerfile's image-target file saying
    so: no pip there, so the way out is the image that has the extra."""
    marker = core.parent / "image-target"
    marker.write_text("slim\n")
    try:
        done = _cli(core, tmp_path, "check-config", SEE_SINKS="otlp",
                    OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
                    OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:5999")
    finally:
        marker.unlink()
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert ("which is not in this image (the slim image has the core alone, and no pip to add "
            "the grpc extra); expected the default image") in line, line
    assert "pip install" not in line and "pip --python" not in line, line


def test_grpcio_left_from_an_older_core_is_said_to_be_undeclared(core: Path,
                                                                  tmp_path: Path) -> None:
    """What ``pip install -U .`` leaves on a VM installed when grpcio was in the core: the core
    install with grpcio beside it, the extra never asked for. The route works, and
    check-config says a fresh install would refuse it unless the extra is named."""
    python = str(core / "python")
    added = subprocess.run([_uv(), "pip", "install", "-q", "--python", python, "--no-deps",
                            "--require-hashes", "-r",
                            str(REPO / "requirements" / "extra-grpc.lock")],
                           capture_output=True, text=True, timeout=280, check=False)
    assert added.returncode == 0, added.stderr[-3000:]
    try:
        done = _cli(core, tmp_path, "check-config", SEE_SINKS="otlp",
                    OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
                    OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:5999")
    finally:  # the other tests of this module need the core alone
        removed = subprocess.run([_uv(), "pip", "uninstall", "-q", "--python", python,
                                  "grpcio"], capture_output=True, text=True, timeout=120,
                                 check=False)
        assert removed.returncode == 0, removed.stderr[-3000:]
    assert done.returncode == 0, done.stderr
    (warning,) = done.stderr.splitlines()
    assert warning.startswith(
        "configuration warning: OTEL_EXPORTER_OTLP_PROTOCOL='grpc': OTLP over gRPC works here "
        "because grpcio is installed, but it is not part of the core"), warning
    assert "a fresh install without the extra refuses this route" in warning, warning
    assert f"pip --python {python} install 'azure-scheduled-events-exporter[grpc]'" in warning


def test_otlp_over_http_delivers_a_scheduled_event_on_the_core(core: Path,
                                                               tmp_path: Path) -> None:
    with Simulator(vm_name="vm-core") as sim, RotelReceiver() as rotel:
        env = clean_env(SEE_IMDS_ENDPOINT=sim.url, SEE_SINKS="otlp",
                        SEE_STATE_DIR=state_dir(tmp_path),
                        SEE_HEALTH_ADDR=f"127.0.0.1:{free_port()}", SEE_POLL_INTERVAL="0.5",
                        OTEL_EXPORTER_OTLP_ENDPOINT=rotel.http_endpoint,
                        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
                        OTEL_METRICS_EXPORTER="otlp", OTEL_METRIC_EXPORT_INTERVAL="1000")
        with ExporterProcess(env, command=[str(core / "scheduled-events-exporter"), "run"]) \
                as proc:
            sim.set_events([event("CORE-1")])
            (log,) = rotel.wait_for_logs(
                lambda r: r.event_name == "azure.scheduled_event.scheduled", 1, 60)
            assert log.attributes.get("azure.scheduled_event.id") == "CORE-1", log.attributes
            rotel.wait_for_metric("azure.scheduled_events.pending", timeout=60)
            assert proc.terminate() == 0, proc.stderr()[-2000:]
