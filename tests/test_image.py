"""The container images, built from the repository's Dockerfile and run with podman + runc.

The bases are Debian 13's own packages (``tests/containers.py``: no registry is reachable
here): a builder with ``python3`` and ``venv``, and a shell-less runtime made as distroless
``python3-debian13`` is. Everything else is the images users get: the default image's size and
what it carries (no shell, no installers, the locked closure of every route, OCI labels, its
SBOM) and every route delivering from it (the trimmed virtualenv: stripped shared objects,
dependencies as bytecode only), the ``slim`` target (the core alone: its size, no gRPC or Azure
SDK, OTLP over HTTP delivering, the other routes refused in one line), the ``shell`` target,
PID 1 (signals, orphans, a hook's process tree), approval hooks in exec form without a shell
and in shell form with one, a pod beside a simulated IMDS with a read-only root
and a state volume, a stop and a start, the shipped memory limit enforced by a real cgroup, and
the chart's Kubernetes objects under ``podman kube play``.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduled_events_exporter.parser import MAX_EVENTS
from scheduled_events_exporter.simulator import Simulator
from tests.containers import (
    BOOKWORM_BUILDER_BASE,
    BUILDER_BASE,
    IMAGE,
    LABELS,
    MANIFEST_IMAGE,
    REPO,
    RUNTIME_BASE,
    SHELL_IMAGE,
    SLIM_IMAGE,
    STATE,
    Podman,
    build,
    build_image,
    cleanup,
    ensure_bases,
    ensure_bookworm_builder,
    exec_json,
    exec_python,
    image_json,
    namespace_processes,
    require_podman,
    unique,
)
from tests.exporter_process import ExporterProcess, answers, free_port, get_json, wait_until
from tests.peers.rotel import ROTEL_AGENT, RotelReceiver
from tests.test_hostile import event

pytestmark = pytest.mark.timeout(600)

#: The uid and gid of the image, of every manifest and of the docs.
UID = 65532
#: The shipped memory limit (config/k8s/: ``limits: {cpu: 200m, memory: 192Mi}``).
LIMIT_MIB = 192
#: The images' whole sizes at most, as ``podman image inspect`` reports them (their runtime
#: base, made as distroless python3-debian13 is, is about 56 MB here): the default (every
#: route) and the slim image (the core alone).
MAX_IMAGE_MB = 100
MAX_SLIM_MB = 70
#: What only the grpc, eventhubs and platform extras bring: never in the slim image (top-level
#: names in site-packages, distributions' names).
EXTRAS_ONLY = ("grpc", "azure", "msal", "cryptography", "_cffi_backend", "cffi", "pycparser",
               "jwt", "pyjwt", "requests", "isodate")


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Podman:
    require_podman()
    return Podman(tmp_path_factory.mktemp("podman"))


@pytest.fixture(scope="module")
def image(podman: Podman, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The default image (shell-less), built once for the module on the Debian 13 bases."""
    ensure_bases(podman, tmp_path_factory.mktemp("bases"))
    seconds = build_image(podman)
    print(f"image built in {seconds:.1f} s")
    return IMAGE


@pytest.fixture(scope="module")
def slim_image(podman: Podman, image: str) -> str:
    """The ``slim`` target (its build stage, the core's, is the default image's first: cached)."""
    seconds = build_image(podman, SLIM_IMAGE, target="slim")
    print(f"slim image built in {seconds:.1f} s")
    return SLIM_IMAGE


@pytest.fixture(scope="module")
def shell_image(podman: Podman, image: str) -> str:
    """The ``shell`` target (its build stage is the default image's, cached)."""
    build_image(podman, SHELL_IMAGE, target="shell")
    return SHELL_IMAGE


def run_args(*extra: str, healthcheck: bool = False) -> list[str]:
    """``podman run`` as the manifests run the exporter: read-only root and no tmpfs that a
    Kubernetes pod would not have either. The image's HEALTHCHECK only where a test runs it
    (podman would schedule it with systemd timers, which this machine does not have)."""
    return ["run", "--read-only", "--read-only-tmpfs=false",
            *([] if healthcheck else ["--no-healthcheck"]), *extra]


# --- what the image is ---------------------------------------------------------------------

def _layers(podman: Podman, image: str) -> list[tuple[int, str]]:
    """(bytes, instruction) of each layer that holds anything, oldest first."""
    layers = json.loads(podman("history", "--format", "json", image).stdout)
    return [(int(layer["size"]), " ".join(layer["CreatedBy"].split())[:80])
            for layer in reversed(layers) if int(layer["size"])]


_CONTENTS = """\
import importlib.metadata, importlib.util, json, os, shutil, site, sys
venv = "/opt/scheduled-events-exporter"
print(json.dumps({
  "prefix": sys.prefix, "uid": os.getuid(), "gid": os.getgid(), "python": sys.version.split()[0],
  "modules": [m for m in ("pip", "setuptools", "wheel", "_distutils_hack")
              if importlib.util.find_spec(m)],
  "tools": [t for t in ("sh", "bash", "dash", "busybox", "apt", "apt-get", "dpkg", "ls", "cat",
                        "pip", "pip3", "gcc", "cc", "make", "curl") if shutil.which(t)],
  "bin": sorted(os.listdir(venv + "/bin")),
  "state": oct(os.stat("/var/lib/scheduled-events-exporter").st_mode & 0o777),
  "state_owner": os.stat("/var/lib/scheduled-events-exporter").st_uid,
  "sources": sum(f.endswith(".py") for _, _, fs in os.walk(venv) for f in fs),
  "bytecode": sum(f.endswith(".pyc") for _, _, fs in os.walk(venv) for f in fs),
  "uncompiled": sorted(os.path.join(d, f) for d, _, fs in os.walk(venv) for f in fs
                       if f.endswith(".py") and not os.path.exists(
                           importlib.util.cache_from_source(os.path.join(d, f)))),
  "dependency_sources": sorted(os.path.join(d, f) for d, _, fs in os.walk(venv) for f in fs
                               if f.endswith((".py", ".pyi"))
                               and "/site-packages/scheduled_events_exporter/" not in d + "/"),
  "site_packages": sorted(os.listdir(site.getsitepackages()[0])),
  "distributions": sorted(f"{d.metadata['Name']}=={d.version}"
                          for d in importlib.metadata.distributions()),
  "licence": [str(f.locate().read_text()) for f in
              importlib.metadata.distribution("azure-scheduled-events-exporter").files or []
              if str(f).endswith(".dist-info/licenses/LICENSE")],
}))
"""


def _contents(podman: Podman, image: str) -> dict[str, Any]:
    seen: dict[str, Any] = json.loads(podman("run", "--rm", "--no-healthcheck", "--entrypoint",
                                             "python", image, "-c", _CONTENTS).stdout)
    return seen


def _locked(python: str, extras: tuple[str, ...] = ("grpc", "eventhubs", "platform")
            ) -> set[str]:
    """``name==version`` of everything requirements/runtime.lock and the layers of ``extras``
    (requirements/extra-*.lock; by default every extra, as the default image) install for
    ``python``."""
    from tests.test_lock import ENVIRONMENTS, locked_for

    (env,) = [e for e in ENVIRONMENTS if e["python_version"] == python
              and e["platform_machine"] == "x86_64" and e["sys_platform"] == "linux"]
    return {f"{p.name}=={p.version}" for p in locked_for(extras)
            if p.marker is None or p.marker.evaluate(env)}


def _canonical(spec: str) -> str:
    name, _, version = spec.partition("==")
    return f"{re.sub(r'[-_.]+', '-', name).lower()}=={version}"


@pytest.mark.parametrize("target", [None, "slim", "shell"], ids=["default", "slim", "shell"])
def test_a_build_without_optional_arguments_warns_of_nothing(podman: Podman, image: str,
                                                             target: str | None) -> None:
    """The README's build (no PIP_INDEX_URL) prints no warning: podman used to say 'missing
    "PIP_INDEX_URL" build argument' at every build, which hides the warnings that matter.
    (The stages are cached by the fixtures' builds: podman warns all the same, at parse.)"""
    done = build(podman, {None: IMAGE, "slim": SLIM_IMAGE, "shell": SHELL_IMAGE}[target],
                 target=target)
    warnings = [line for line in (done.stdout + done.stderr).splitlines()
                if "level=warning" in line or "build argument" in line]
    assert warnings == [], warnings


def test_the_default_image_is_small_shell_less_and_holds_the_locked_closure(
        podman: Podman, image: str) -> None:
    total = int(image_json(podman, image)["Size"])  # type: ignore[call-overload]
    base = int(image_json(podman, RUNTIME_BASE)["Size"])  # type: ignore[call-overload]
    layers = _layers(podman, image)
    print(f"default image: {total / 1e6:.1f} MB in all; layers: "
          + "; ".join(f"{size / 1e6:.2f} MB {what}" for size, what in layers))
    assert total <= MAX_IMAGE_MB * 1_000_000, f"{total / 1e6:.1f} MB > {MAX_IMAGE_MB} MB"
    # The base, the virtualenv, the state directory: nothing else is added.
    assert len(layers) == 3, layers
    assert abs(layers[0][0] - base) < 100_000 and layers[2][0] < 10_000, (layers, base)
    config = image_json(podman, image)["Config"]
    assert isinstance(config, dict)
    assert config["User"] == f"{UID}:{UID}"
    assert config["Entrypoint"] == ["scheduled-events-exporter"] and config["Cmd"] == ["run"]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == LABELS["VERSION"]
    assert labels["org.opencontainers.image.revision"] == LABELS["REVISION"]
    assert labels["org.opencontainers.image.created"] == LABELS["CREATED"]
    assert labels["org.opencontainers.image.licenses"] == "MIT"
    assert labels["org.opencontainers.image.source"].startswith("https://github.com/")
    assert labels["org.opencontainers.image.title"] == "azure-scheduled-events-exporter"
    healthcheck = image_json(podman, image)["Healthcheck"]  # (podman keeps it beside Config)
    assert isinstance(healthcheck, dict), healthcheck
    assert healthcheck["Test"] == ["CMD", "scheduled-events-exporter", "probe"]
    seen = _contents(podman, image)
    assert seen["prefix"] == "/opt/scheduled-events-exporter", seen
    assert (seen["uid"], seen["gid"]) == (UID, UID), seen
    assert (seen["state"], seen["state_owner"]) == ("0o700", UID), seen
    assert seen["modules"] == [] and seen["tools"] == [], seen  # no shell, no installer
    assert not [name for name in seen["bin"] if name.startswith(("pip", "activate"))], seen
    # The root is read-only: every module's bytecode is compiled at build time. The
    # dependencies are bytecode only (tools/trim_venv.py), the exporter keeps its sources.
    assert seen["bytecode"] > 900 and seen["uncompiled"] == [], seen["uncompiled"][:20]
    assert seen["dependency_sources"] == [] and seen["sources"] > 50, seen["dependency_sources"]
    # Exactly the locked closure (every file of it installed with its hash checked) and the
    # exporter itself.
    installed = {_canonical(d) for d in seen["distributions"]}
    expected = _locked(seen["python"].rsplit(".", 1)[0]) | {
        f"azure-scheduled-events-exporter=={LABELS['VERSION']}"}
    assert installed == expected, (sorted(installed - expected), sorted(expected - installed))
    version = podman("run", "--rm", "--no-healthcheck", image, "version").stdout.strip()
    assert version == LABELS["VERSION"]
    # The MIT text ships beside the code (the wheel's .dist-info/licenses/, PEP 639).
    assert seen["licence"] == [(REPO / "LICENSE").read_text()], seen["licence"]


def test_the_shell_image_is_the_same_exporter_with_a_shell(podman: Podman, image: str,
                                                           shell_image: str) -> None:
    seen, default = _contents(podman, shell_image), _contents(podman, image)
    assert "sh" in seen["tools"] and seen["distributions"] == default["distributions"], seen
    assert (seen["uid"], seen["state"], seen["state_owner"]) == (UID, "0o700", UID), seen
    assert seen["python"] == default["python"], "one interpreter in both stages"
    labels = image_json(podman, shell_image)["Config"]["Labels"]  # type: ignore[index]
    assert labels["org.opencontainers.image.version"] == LABELS["VERSION"]  # type: ignore[index]
    print(f"shell image: {int(image_json(podman, shell_image)['Size']) / 1e6:.1f} MB in all; "  # type: ignore[call-overload]
          "layers: " + "; ".join(f"{size / 1e6:.2f} MB {what}"
                                 for size, what in _layers(podman, shell_image)))


def test_a_shell_form_hook_is_refused_without_a_shell_with_what_to_use(podman: Podman,
                                                                      image: str) -> None:
    for command in ("check-config", "run"):
        done = podman("run", "--rm", "--no-healthcheck", "-e", "SEE_APPROVE=user",
                      "-e", "SEE_APPROVE_HOOK=kubectl drain x && echo done", "-e", "SEE_STATE_DIR=",
                      image, command, check=False)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        (line,) = [x for x in done.stderr.splitlines() if "SEE_APPROVE_HOOK" in x]
        assert "needs /bin/sh" in line and "JSON array of strings" in line and "-shell" in line


def test_the_sbom_of_the_image_lists_exactly_the_locked_distributions(
        podman: Podman, image: str, tmp_path: Path) -> None:
    """CycloneDX (cyclonedx-bom, as the release attaches) of the image's Python environment,
    made by the builder base's interpreter (the same Python) with the image mounted."""
    script = ("python3 -m venv /tmp/tool && /tmp/tool/bin/pip install -q --disable-pip-version-"
              "check cyclonedx-bom==7.5.0 && /tmp/tool/bin/cyclonedx-py environment --output-"
              "format JSON --output-file /out/sbom.json /image/opt/scheduled-events-exporter/bin/"
              "python")
    podman("run", "--rm", "--network=host", "-v", "/etc/ssl/certs:/etc/ssl/certs:ro",
           "-v", f"{tmp_path}:/out", "--mount", f"type=image,source={image},destination=/image",
           BUILDER_BASE, "sh", "-euc", script, timeout=600)
    sbom = json.loads((tmp_path / "sbom.json").read_text())
    assert sbom["bomFormat"] == "CycloneDX"
    listed = {_canonical(f"{c['name']}=={c['version']}") for c in sbom["components"]}
    seen = _contents(podman, image)
    # The locked distributions, and the exporter itself (installed from its own wheel).
    expected = _locked(seen["python"].rsplit(".", 1)[0]) | {
        f"azure-scheduled-events-exporter=={LABELS['VERSION']}"}
    assert listed == expected, (sorted(listed - expected), sorted(expected - listed))
    assert {c["type"] for c in sbom["components"]} == {"library"}, sbom["components"][:2]


def test_a_debian_12_builder_leaves_no_installer_in_the_image(
        podman: Podman, image: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    # Debian 12's Python 3.11 seeds setuptools 66 (with published vulnerabilities) as well as
    # pip into a new venv; the Dockerfile accepts that builder, so its image must not carry
    # either. The shell target runs on the builder's own base, so its interpreter is 3.11 here.
    ensure_bookworm_builder(podman, tmp_path_factory.mktemp("bookworm"))
    tag = "localhost/scheduled-events-exporter:test-bookworm"
    try:
        build_image(podman, tag, target="shell", builder=BOOKWORM_BUILDER_BASE)
        seen = _contents(podman, tag)
        assert seen["python"].startswith("3.11."), seen["python"]
        assert seen["modules"] == [], seen  # no pip, setuptools, wheel or _distutils_hack
        assert not [n for n in seen["bin"] if n.startswith(("pip", "easy_install", "wheel"))], seen
        installed = {_canonical(d) for d in seen["distributions"]}
        expected = _locked("3.11") | {f"azure-scheduled-events-exporter=={LABELS['VERSION']}"}
        assert installed == expected, (sorted(installed - expected), sorted(expected - installed))
        assert seen["licence"] == [(REPO / "LICENSE").read_text()]
    finally:
        podman("rmi", "-f", tag, check=False)


# --- the slim image: the core alone ---------------------------------------------------------

def test_the_slim_image_is_the_core_alone_and_small(podman: Podman, image: str,
                                                    slim_image: str) -> None:
    total = int(image_json(podman, slim_image)["Size"])  # type: ignore[call-overload]
    default = int(image_json(podman, image)["Size"])  # type: ignore[call-overload]
    base = int(image_json(podman, RUNTIME_BASE)["Size"])  # type: ignore[call-overload]
    layers = _layers(podman, slim_image)
    print(f"slim image: {total / 1e6:.1f} MB in all (default {default / 1e6:.1f} MB, base "
          f"{base / 1e6:.1f} MB); layers: "
          + "; ".join(f"{size / 1e6:.2f} MB {what}" for size, what in layers))
    assert total <= MAX_SLIM_MB * 1_000_000, f"{total / 1e6:.1f} MB > {MAX_SLIM_MB} MB"
    assert len(layers) == 3 and abs(layers[0][0] - base) < 100_000, (layers, base)
    config = image_json(podman, slim_image)["Config"]
    assert isinstance(config, dict)
    assert config["User"] == f"{UID}:{UID}" and config["Cmd"] == ["run"]
    assert config["Labels"]["org.opencontainers.image.title"] == \
        "azure-scheduled-events-exporter (slim)"
    assert config["Labels"]["org.opencontainers.image.version"] == LABELS["VERSION"]
    seen, full = _contents(podman, slim_image), _contents(podman, image)
    assert seen["python"] == full["python"] and (seen["uid"], seen["state"]) == (UID, "0o700")
    assert seen["modules"] == [] and seen["tools"] == [], seen
    # Nothing of gRPC, the Azure SDK or what azure-identity pulls in: not a file, not a
    # distribution (the advisory surface a scanner sees).
    assert not [n for n in seen["site_packages"] if n.lower().startswith(EXTRAS_ONLY)
                and not n.startswith("azure_scheduled_events_exporter-")], seen["site_packages"]
    installed = {_canonical(d) for d in seen["distributions"]}
    expected = _locked(seen["python"].rsplit(".", 1)[0], extras=()) | {
        f"azure-scheduled-events-exporter=={LABELS['VERSION']}"}
    assert installed == expected, (sorted(installed - expected), sorted(expected - installed))
    assert seen["uncompiled"] == [] and seen["dependency_sources"] == [], seen
    print(f"distributions: default {len(full['distributions'])}, slim "
          f"{len(seen['distributions'])}")


def test_the_slim_image_delivers_over_otlp_http_read_only_and_non_root(
        podman: Podman, slim_image: str) -> None:
    name = unique("see-slim")
    health = free_port()
    with cleanup(podman, containers=[name]), Simulator(vm_name="vm-slim") as sim, \
            RotelReceiver() as rotel:
        command = podman.command(*run_args(
            "--name", name, "--network", "host", "-e", f"SEE_IMDS_ENDPOINT={sim.url}",
            "-e", "SEE_SINKS=otlp", "-e", f"OTEL_EXPORTER_OTLP_ENDPOINT={rotel.http_endpoint}",
            "-e", "OTEL_METRICS_EXPORTER=otlp,prometheus",
            "-e", f"OTEL_EXPORTER_PROMETHEUS_PORT={free_port()}",
            "-e", "OTEL_METRIC_EXPORT_INTERVAL=1000",
            "-e", f"SEE_HEALTH_ADDR=127.0.0.1:{health}"), slim_image)
        with ExporterProcess({}, command=command) as proc:
            wait_until(lambda: answers(f"http://127.0.0.1:{health}/readyz", 200), 60, "/readyz")
            sim.set_events([event("SLIM-1")])
            (log,) = rotel.wait_for_logs(
                lambda r: r.event_name == "azure.scheduled_event.scheduled", 1, 60)
            assert log.attributes["azure.scheduled_event.id"] == "SLIM-1", log.attributes
            rotel.wait_for_metric("azure.scheduled_events.pending", timeout=60)
            root = int(podman.inspect(name, "{{.State.Pid}}"))
            procs = namespace_processes(root)
            assert procs and {p.uid for p in procs} == {UID}, procs
            wrote = exec_python(podman, name, "open('/probe', 'w')")
            assert "Read-only file system" in wrote.stderr, wrote
            podman("stop", "-t", "20", name)
            assert proc.proc.wait(30) == 0, proc.stderr()[-2000:]
        assert "Traceback" not in proc.stderr(), proc.stderr()[-2000:]


@pytest.mark.parametrize(("env", "extra"), [
    (["-e", "SEE_SINKS=otlp", "-e", "OTEL_EXPORTER_OTLP_PROTOCOL=grpc"], "grpc"),
    (["-e", "SEE_SINKS=eventhubs", "-e", "SEE_EVENTHUB_NAMESPACE=ns.servicebus.windows.net",
      "-e", "SEE_EVENTHUB_NAME=hub"], "eventhubs"),
], ids=["grpc", "eventhubs"])
def test_the_slim_image_refuses_a_route_it_lacks_in_one_line(
        podman: Podman, slim_image: str, env: list[str], extra: str) -> None:
    for command in ("check-config", "run"):
        done = podman("run", "--rm", "--no-healthcheck", "-e", "SEE_STATE_DIR=", *env,
                      slim_image, command, check=False)
        assert done.returncode == 2 and "Traceback" not in done.stderr, (command, done.stderr)
        (line,) = done.stderr.splitlines()
        # The image has no pip and a read-only root: the way out is the image with the extra.
        assert (f"not in this image (the slim image has the core alone, and no pip to add "
                f"the {extra} extra); expected the default image, which has every extra (the "
                "same tag without -slim") in line, line
        assert "pip install" not in line and "pip --python" not in line, line


def test_the_slim_image_refuses_the_platform_command_in_one_line(podman: Podman,
                                                                 slim_image: str) -> None:
    done = podman("run", "--rm", "--no-healthcheck", "-e",
                  "SEE_PLATFORM_QUEUE_URL=https://acct.queue.core.windows.net/events",
                  slim_image, "platform", check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.splitlines()
    # No pip in the slim image: the line names the image that has the extra instead.
    assert ("needs azure-storage-queue and azure-identity, which are not in this image (the "
            "slim image has the core alone, and no pip to add the platform extra); expected "
            "the default image") in line, line


def test_the_platform_command_runs_from_the_default_image(podman: Podman, image: str) -> None:
    """Its SDK imports from the trimmed virtualenv (no asyncio clients left), and a queue it
    cannot reach is retried, not fatal: it stops cleanly on SIGTERM."""
    done = podman("run", "--rm", "--no-healthcheck", "--entrypoint",
                  "/opt/scheduled-events-exporter/bin/python", image, "-c",
                  "import azure.storage.queue, azure.identity, azure.eventhub, importlib.util;"
                  "print(importlib.util.find_spec('azure.storage.queue.aio'))")
    assert done.stdout.strip() == "None", done.stdout
    name = unique("platform")
    with cleanup(podman, containers=[name]):
        podman(*run_args("-d", "--name", name), "-e", "SEE_HEALTH_ADDR=",
               "-e", "SEE_PLATFORM_QUEUE_CONNECTION_STRING=DefaultEndpointsProtocol=http;"
               "AccountName=devstoreaccount1;AccountKey=a2V5;"
               "QueueEndpoint=http://127.0.0.1:9/devstoreaccount1;",
               "-e", "SEE_PLATFORM_QUEUE_NAME=events", image, "platform")
        wait_until(lambda: "platform queue: connection_error" in podman("logs", name).stderr,
                   60, "the unreachable queue said, and retried", interval=0.5)
        podman("stop", "-t", "10", name, timeout=30)
        assert podman.inspect(name, "{{.State.ExitCode}}") == "0"


# --- every route from the trimmed default image ---------------------------------------------

_SHARED_OBJECTS = """import importlib, os, site
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
root = site.getsitepackages()[0]
loaded = []
for d, _, fs in os.walk(root):
    for f in fs:
        if ".so" in f:
            rel = os.path.relpath(os.path.join(d, f.split(".")[0]), root)
            importlib.import_module(rel.replace(os.sep, "."))
            loaded.append(rel)
key = ec.generate_private_key(ec.SECP256R1())
key.public_key().verify(key.sign(b"x", ec.ECDSA(hashes.SHA256())), b"x",
                        ec.ECDSA(hashes.SHA256()))
from azure.identity import DefaultAzureCredential
DefaultAzureCredential()
print(" ".join(sorted(loaded)))
"""


def test_every_shared_object_of_the_default_image_loads_stripped(podman: Podman,
                                                                 image: str) -> None:
    """Every extension module, stripped (tools/trim_venv.py), loads; cryptography signs and
    verifies; azure-identity's credential chain builds (msal, pyjwt, cryptography)."""
    done = podman("run", "--rm", "--no-healthcheck", "--read-only", "--entrypoint", "python",
                  image, "-c", _SHARED_OBJECTS, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = done.stdout.split()
    assert {"grpc/_cython/cygrpc", "cryptography/hazmat/bindings/_rust",
            "google/_upb/_message", "_cffi_backend"} <= set(loaded), loaded


def test_otlp_over_grpc_from_the_default_image(podman: Podman, image: str) -> None:
    name = unique("see-grpc")
    with cleanup(podman, containers=[name]), Simulator(vm_name="vm-grpc") as sim, \
            RotelReceiver() as rotel:
        command = podman.command(*run_args(
            "--name", name, "--network", "host", "-e", f"SEE_IMDS_ENDPOINT={sim.url}",
            "-e", "SEE_HEALTH_ADDR=", "-e", "SEE_SINKS=otlp",
            "-e", "OTEL_EXPORTER_OTLP_PROTOCOL=grpc",
            "-e", f"OTEL_EXPORTER_OTLP_ENDPOINT={rotel.grpc_endpoint}",
            "-e", "OTEL_METRICS_EXPORTER=otlp", "-e", "OTEL_METRIC_EXPORT_INTERVAL=1000"), image)
        with ExporterProcess({}, command=command) as proc:
            sim.set_events([event("GRPC-1")])
            (log,) = rotel.wait_for_logs(
                lambda r: r.event_name == "azure.scheduled_event.scheduled", 1, 60)
            assert log.attributes["azure.scheduled_event.id"] == "GRPC-1", log.attributes
            rotel.wait_for_metric("azure.scheduled_events.pending", timeout=60)
            podman("stop", "-t", "20", name)
            assert proc.proc.wait(30) == 0, proc.stderr()[-2000:]
        assert "Traceback" not in proc.stderr(), proc.stderr()[-2000:]


def test_event_hubs_from_the_default_image(podman: Podman, image: str) -> None:
    pytest.importorskip("proton")
    from tests.peers.amqp_peer import AmqpPeer

    name = unique("see-hub")
    with cleanup(podman, containers=[name]), Simulator(vm_name="vm-hub") as sim, \
            AmqpPeer(hubs={"hub"}) as peer:
        command = podman.command(*run_args(
            "--name", name, "--network", "host", "-e", f"SEE_IMDS_ENDPOINT={sim.url}",
            "-e", "SEE_HEALTH_ADDR=", "-e", "SEE_SINKS=eventhubs",
            "-e", f"SEE_EVENTHUB_CONNECTION_STRING={peer.connection_string('hub')}"), image)
        with ExporterProcess({}, command=command) as proc:
            sim.set_events([event("HUB-1")])
            wait_until(lambda: any(b"HUB-1" in m.body for m in peer.received), 60,
                       "the scheduled record at the hub")
            podman("stop", "-t", "20", name)
            assert proc.proc.wait(30) == 0, proc.stderr()[-2000:]
        assert "Traceback" not in proc.stderr(), proc.stderr()[-2000:]
        assert peer.errors == []


# --- in a pod beside a simulated IMDS ------------------------------------------------------

def test_in_a_pod_beside_a_simulated_imds_with_a_read_only_root_stopped_and_started(
        podman: Podman, image: str) -> None:
    pod, volume = unique("see-pod"), unique("see-state")
    imds, exporter = f"{pod}-imds", f"{pod}-exporter"
    health = free_port()
    with cleanup(podman, pods=[pod], volumes=[volume]):
        podman("pod", "create", "--name", pod, "-p", f"127.0.0.1:{health}:8080")
        podman("run", "-d", "--no-healthcheck", "--pod", pod, "--name", imds, image,
               "simulate", "--scenario", "demo")
        # The image's own environment: console sink, state on the volume, health on :8080.
        first = ExporterProcess({}, command=podman.command(
            *run_args("--pod", pod, "--name", exporter, "-v", f"{volume}:{STATE}",
                      "-e", "SEE_IMDS_ENDPOINT=http://127.0.0.1:8099", healthcheck=True), image))
        with first:
            first.wait_for(lambda: sum(r["Transition"] == "scheduled" for r in first.records())
                           >= 2, 60, "two scheduled events")
            status, body = get_json(f"http://127.0.0.1:{health}/readyz")
            assert status == 200 and body["status"] == "ready", body
            assert get_json(f"http://127.0.0.1:{health}/healthz")[0] == 200
            # The image's own HEALTHCHECK command, run by podman inside the container.
            checked = podman("healthcheck", "run", exporter, check=False)
            assert checked.returncode == 0, checked.stdout + checked.stderr
            wrote = exec_python(podman, exporter, "open('/probe', 'w')")
            assert wrote.returncode != 0 and "Read-only file system" in wrote.stderr, wrote
            stopped_at = time.monotonic()
            podman("stop", "-t", "20", exporter)
            assert first.proc.wait(30) == 0, first.stderr()
            took = time.monotonic() - stopped_at
        assert podman.inspect(exporter, "{{.State.ExitCode}}") == "0"
        assert took < 10 + 2, f"podman stop took {took:.1f} s (shutdown timeout 10 s)"
        assert "stopped" in first.stderr().splitlines()[-1], first.stderr()[-600:]

        volume_dir = Path(podman("volume", "inspect", "--format", "{{.Mountpoint}}",
                                 volume).stdout.strip())
        saved = volume_dir / "state.json"
        assert saved.stat().st_uid == UID and saved.stat().st_mode & 0o777 == 0o600
        assert json.loads(saved.read_text())["seq"] >= 2

        second = ExporterProcess({}, command=podman.command("start", "--attach", exporter))
        with second:
            second.wait_for(lambda: any(r["Transition"] == "completed" and r["EventType"] ==
                                        "Reboot" for r in second.records()), 90,
                            "the Reboot's completion after the restart")
            podman("stop", "-t", "20", exporter)
            assert second.proc.wait(30) == 0, second.stderr()
    records = first.records() + second.records()
    ids = [r["RecordId"] for r in records]
    assert len(ids) == len(set(ids)), "a record was reported twice"
    pairs = [(r["EventId"], r["Transition"]) for r in records]
    assert len(pairs) == len(set(pairs)), f"a transition was reported twice: {pairs}"
    kinds = {(r["EventType"], r["Transition"]) for r in records}
    assert {("Freeze", "scheduled"), ("Freeze", "completed"), ("Reboot", "scheduled"),
            ("Reboot", "completed"), ("Redeploy", "scheduled")} <= kinds, kinds


# --- PID 1 -----------------------------------------------------------------------------------

def _hook_env(sim: Simulator, hook: str, timeout: int = 60) -> list[str]:
    return ["-e", f"SEE_IMDS_ENDPOINT={sim.url}", "-e", "SEE_HEALTH_ADDR=",
            "-e", "SEE_STATE_DIR=", "-e", "SEE_POLL_INTERVAL=0.2", "-e", "SEE_APPROVE=all",
            "-e", f"SEE_APPROVE_HOOK={hook}", "-e", f"SEE_APPROVE_HOOK_TIMEOUT={timeout}"]


def _schedule(sim: Simulator, proc: ExporterProcess, event_id: str, outcome: str) -> None:
    sim.set_events([event(event_id)])
    proc.wait_for(lambda: any(r["EventId"] == event_id and r["Transition"] == outcome
                              for r in proc.records()), 30, f"{outcome} of {event_id}")


#: Hooks that leave a background child behind, orphaned when the hook exits: in exec form (the
#: default image has no shell) and in shell form (the shell image).
_ORPHANING = {
    "exec": json.dumps(["python3", "-c", "import subprocess; subprocess.Popen(['python3', '-c', "
                        "'import time; time.sleep(0.2)']); print('draining')"]),
    "shell": "sleep 0.2 & echo draining",
}
_HANGING = {
    "exec": json.dumps(["python3", "-c", "import subprocess, time; subprocess.Popen(['python3', "
                        "'-c', 'import time; time.sleep(600)']); time.sleep(600)"]),
    "shell": "sleep 600 & sleep 600",
}


def _hook_children(root: int) -> list[Any]:
    """The hooks and what they started, running or zombie (a zombie has no argv left, so it is
    known by its command name; the exporter's own is ``scheduled-event``)."""
    return [p for p in namespace_processes(root) if p.comm in ("sleep", "python3", "sh")]


@pytest.mark.parametrize(("form", "init"), [("exec", False), ("exec", True), ("shell", False)],
                         ids=["exec-form, exporter-is-pid-1", "exec-form, podman-init",
                              "shell-form in the shell image"])
def test_pid_1_reaps_what_hooks_leave_and_a_stop_exits_0(
        podman: Podman, image: str, shell_image: str, form: str, init: bool) -> None:
    name = unique("see-pid1")
    used = shell_image if form == "shell" else image
    with cleanup(podman, containers=[name]), Simulator(vm_name="vm-test") as sim:
        command = podman.command(*run_args("--name", name, "--network", "host",
                                           *(["--init"] if init else []),
                                           *_hook_env(sim, _ORPHANING[form])), used)
        with ExporterProcess({}, command=command) as proc:
            for i in range(10):  # each approved: the hook ran and exited 0
                _schedule(sim, proc, f"E{i}", "approved")
            root = int(podman.inspect(name, "{{.State.Pid}}"))
            # Ended and reaped; a zombie that stays fails this wait, and the message lists it.
            wait_until(lambda: not _hook_children(root), 10,
                       "the hooks' background children to end and be reaped")
            procs = namespace_processes(root)
            assert [p for p in procs if p.state == "Z"] == [], procs
            pid1 = next(p for p in procs if p.pid == root)
            if init:
                assert pid1.comm in ("catatonit", "podman-init"), procs
            else:
                assert "scheduled-events-exporter" in " ".join(pid1.argv), procs
            # Two processes: the init and the exporter, both the image's user.
            assert len(procs) == 2 and {p.uid for p in procs} == {UID}, procs
            podman("stop", "-t", "20", name)
            assert proc.proc.wait(30) == 0, proc.stderr()[-2000:]
        assert podman.inspect(name, "{{.State.ExitCode}}") == "0"


@pytest.mark.parametrize("form", ["exec", "shell"])
def test_a_hook_past_its_timeout_loses_its_whole_process_tree(
        podman: Podman, image: str, shell_image: str, form: str) -> None:
    name = unique("see-hook")
    used = shell_image if form == "shell" else image
    with cleanup(podman, containers=[name]), Simulator(vm_name="vm-test") as sim:
        command = podman.command(*run_args("--name", name, "--network", "host",
                                           *_hook_env(sim, _HANGING[form], timeout=1)), used)
        with ExporterProcess({}, command=command) as proc:
            _schedule(sim, proc, "SLOW", "approval_skipped")
            root = int(podman.inspect(name, "{{.State.Pid}}"))
            wait_until(lambda: not _hook_children(root) and not any(
                p.state == "Z" for p in namespace_processes(root)), 10,
                       "the hook's tree to be killed and reaped")
            skipped = next(r for r in proc.records() if r["Transition"] == "approval_skipped")
            assert skipped["ApprovalReason"] == "hook_failed", skipped
            podman("stop", "-t", "20", name)
            assert proc.proc.wait(30) == 0


def test_podman_stop_with_the_collector_down_exits_0_within_its_default_10_s(
        podman: Podman, image: str) -> None:
    name = unique("see-stop")
    with cleanup(podman, containers=[name]), Simulator(vm_name="vm-test") as sim:
        sim.set_events([event("A"), event("B")])
        command = podman.command(*run_args(
            "--name", name, "--network", "host", "-e", f"SEE_IMDS_ENDPOINT={sim.url}",
            "-e", "SEE_HEALTH_ADDR=", "-e", "SEE_SINKS=otlp",
            "-e", f"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:{free_port()}"), image)
        with ExporterProcess({}, command=command) as proc:
            proc.wait_for(lambda: "delivery failed, will retry" in proc.stderr(), 60,
                          "the collector to be found down")
            started = time.monotonic()
            podman("stop", name)  # podman's default: SIGTERM, SIGKILL 10 s later
            took = time.monotonic() - started
            assert proc.proc.wait(30) == 0, proc.stderr()[-1500:]
        assert podman.inspect(name, "{{.State.ExitCode}}") == "0"
    assert took < 9, f"podman stop took {took:.1f} s"
    log = proc.stderr()
    assert "kept in the spool" in log and "shutdown did not finish" not in log, log[-1500:]


# --- under the shipped memory limit ----------------------------------------------------------

def _cgroup_memory(host_pid: int) -> dict[str, int]:
    """Peak usage and OOM kills of the container's memory cgroup (v1 or v2)."""
    lines = Path(f"/proc/{host_pid}/cgroup").read_text().splitlines()
    v1 = next((line.split(":", 2)[2] for line in lines if ":memory:" in line), None)
    if v1 is not None:
        base = Path("/sys/fs/cgroup/memory") / v1.lstrip("/")
        oom = dict(line.split() for line in (base / "memory.oom_control").read_text().splitlines())
        return {"limit": int((base / "memory.limit_in_bytes").read_text()),
                "peak": int((base / "memory.max_usage_in_bytes").read_text()),
                "oom_kill": int(oom.get("oom_kill", 0))}
    base = Path("/sys/fs/cgroup") / lines[0].split(":", 2)[2].lstrip("/")
    events = dict(line.split() for line in (base / "memory.events").read_text().splitlines())
    return {"limit": int((base / "memory.max").read_text()),
            "peak": int((base / "memory.peak").read_text()), "oom_kill": int(events["oom_kill"])}


def test_under_the_shipped_memory_limit_the_largest_documents_flapping_collector_down(
        podman: Podman, image: str) -> None:
    name, volume = unique("see-mem"), unique("see-state")
    health, scrape, collector = free_port(), free_port(), free_port()
    many = [event(f"E{i}", Resources=[f"vm-{i}"]) for i in range(MAX_EVENTS)]
    huge = event("HUGE", Resources=[f"r{j}-" + "y" * 8000 for j in range(450)])
    with cleanup(podman, containers=[name], volumes=[volume]), \
            Simulator(vm_name="vm-test") as sim:
        # The manifests' settings (OTLP http/protobuf, Prometheus scrape, 1 s polls) and limit.
        command = podman.command(*run_args(
            "--name", name, "--network", "host", "-v", f"{volume}:{STATE}",
            "--memory", f"{LIMIT_MIB}m", "--memory-swap", f"{LIMIT_MIB}m",
            "-e", f"SEE_IMDS_ENDPOINT={sim.url}", "-e", "SEE_SINKS=otlp",
            "-e", f"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:{collector}",
            "-e", "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
            "-e", "OTEL_METRICS_EXPORTER=prometheus",
            "-e", f"OTEL_EXPORTER_PROMETHEUS_PORT={scrape}",
            "-e", f"SEE_HEALTH_ADDR=127.0.0.1:{health}", "-e", "SEE_LOG_LEVEL=warning"), image)
        rss_peak = 0
        with ExporterProcess({}, command=command) as proc:
            wait_until(lambda: answers(f"http://127.0.0.1:{health}/healthz", 200), 60, "/healthz")
            root = int(podman.inspect(name, "{{.State.Pid}}"))
            started, flips = time.monotonic(), 0
            while time.monotonic() - started < 50:
                flips += 1
                # 2000 events, then one 3.6 MB event, each changed on every poll.
                if (time.monotonic() - started) < 20:
                    sim.set_events([{**e, "Description": str(flips)} for e in many])
                else:
                    sim.set_events([{**huge, "Description": str(flips)}])
                rss_peak = max(rss_peak, _rss(root))
                assert get_json(f"http://127.0.0.1:{health}/healthz", timeout=5)[0] == 200
                time.sleep(0.5)
            memory = _cgroup_memory(root)
            assert podman.inspect(name, "{{.State.Running}} {{.State.OOMKilled}}") == \
                "true false"
            # The collector's outage is reported, and leaves the exporter ready
            # (SEE_READINESS_INCLUDES unset: docs/semantics.md#reliability).
            status, body = get_json(f"http://127.0.0.1:{health}/readyz", timeout=5)
            assert (status, body["reasons"], body["warnings"]) == (
                200, [], ["sink otlp failing"]), body
            assert body["sinks"]["otlp"]["dropped"] > 0, body  # the spool's byte bound held
            # The collector comes back: the spool drains and the exporter is ready again.
            rotel = subprocess.Popen(
                [str(ROTEL_AGENT), "start", "--exporter", "blackhole", "--otlp-grpc-endpoint",
                 f"127.0.0.1:{free_port()}", "--otlp-http-endpoint", f"127.0.0.1:{collector}"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                wait_until(lambda: get_json(f"http://127.0.0.1:{health}/readyz",
                                            timeout=5)[1]["warnings"] == [], 120,
                           "the sink delivering again", 0.5)
            finally:
                rotel.terminate()
                rotel.wait(10)
            memory = _cgroup_memory(root)
            podman("stop", "-t", "20", name)
            assert proc.proc.wait(30) == 0
    print(f"flips {flips}; cgroup peak {memory['peak'] / 2**20:.1f} MiB of "
          f"{memory['limit'] / 2**20:.0f} MiB; processes' peak RSS {rss_peak / 2**20:.1f} MiB")
    assert memory["limit"] == LIMIT_MIB * 2**20 and memory["oom_kill"] == 0, memory
    assert flips > 60


def _rss(root: int) -> int:
    """Resident bytes of every process in the container (the init and the exporter)."""
    total = 0
    for proc in namespace_processes(root):
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text()
        except OSError:
            continue
        total += next((int(line.split()[1]) * 1024 for line in status.splitlines()
                       if line.startswith("VmRSS:")), 0)
    return total


# --- the shipped manifests under podman kube play --------------------------------------------

def _with_env(container: dict[str, Any], **values: str) -> None:
    env = [e for e in container["env"] if e["name"] not in values]
    container["env"] = env + [{"name": k, "value": v} for k, v in values.items()]


def _node_name_from_pod_name(container: dict[str, Any]) -> None:
    """kube play knows ``fieldRef`` ``metadata.name`` only (not ``spec.nodeName`` nor
    ``metadata.namespace``): the node's name is the pod's, the namespace a literal."""
    for variable in container["env"]:
        if variable["name"] == "NODE_NAME":
            variable["valueFrom"] = {"fieldRef": {"fieldPath": "metadata.name"}}
        elif variable["name"] == "POD_NAMESPACE":
            del variable["valueFrom"]
            variable["value"] = "played"


def _health_port(container: dict[str, Any]) -> int:
    (addr,) = [e["value"] for e in container["env"] if e["name"] == "SEE_HEALTH_ADDR"]
    return int(addr.rpartition(":")[2])


def _exporter_in_pod(podman: Podman, container: str, health: int, state_on_host: Path | None,
                     rotel: RotelReceiver) -> None:
    """What every manifest must give: the manifest's user, a read-only root, state written,
    /readyz and /metrics answering, records at the collector on the pod's loopback."""
    root = int(podman.inspect(container, "{{.State.Pid}}"))
    wait_until(lambda: exec_json(podman, container, f"http://127.0.0.1:{health}/readyz")[0]
               == 200, 60, "/readyz")
    status, metrics = exec_json(podman, container, "http://127.0.0.1:9464/metrics")
    assert status == 200 and "azure_scheduled_events_pending" in metrics, metrics[:500]
    procs = namespace_processes(root)
    assert procs and {p.uid for p in procs} == {UID}, procs
    # The manifest's limits reached the container's cgroup (192Mi, 200m).
    limits = podman.inspect(container, "{{.HostConfig.Memory}} {{.HostConfig.CpuQuota}} "
                                       "{{.HostConfig.CpuPeriod}}").split()
    assert [int(x) for x in limits] == [LIMIT_MIB * 2**20, 20_000, 100_000], limits
    wrote = exec_python(podman, container, "open('/probe', 'w')")
    assert "Read-only file system" in wrote.stderr, wrote
    owner = exec_python(podman, container, "import os; s = os.stat("
                        f"'{STATE}/state.json'); print(s.st_uid, s.st_gid)").stdout.split()
    assert owner == [str(UID), str(UID)], owner
    if state_on_host is not None:
        assert (state_on_host / "state.json").stat().st_uid == UID
        assert state_on_host.stat().st_mode & 0o777 == 0o700
    rotel.wait_for_logs(lambda r: r.event_name == "azure.scheduled_event.scheduled", 1, 60)


@pytest.fixture
def pod_collector() -> Iterator[list[RotelReceiver]]:
    started: list[RotelReceiver] = []
    yield started
    for rotel in started:
        rotel.stop()


def _unpublished(pod_spec: dict[str, Any]) -> None:
    """podman 4.3's kube play publishes every containerPort on the host's same port (8080,
    9464): the tests probe inside the pod instead, so no host port is taken (or found taken)."""
    for container in pod_spec["containers"]:
        container.pop("ports", None)


def _empty_dirs(pod_spec: dict[str, Any]) -> list[str]:
    """The volumes ``kube play`` makes of the pod's emptyDir volumes (named as in the spec)."""
    return [v["name"] for v in pod_spec["volumes"] if "emptyDir" in v]


def _play(podman: Podman, manifest: Path, pod: str,
          collectors: list[RotelReceiver]) -> RotelReceiver:
    """``podman kube play`` the manifest with a real OTLP collector on the pod's loopback
    (4318), started in the pod's network namespace before its containers."""
    podman("kube", "play", "--start=false", str(manifest))
    infra = podman("pod", "inspect", "--format", "{{.InfraContainerID}}", pod).stdout.strip()
    podman("start", infra)
    netns = f"/proc/{podman.inspect(infra, '{{.State.Pid}}')}/ns/net"
    rotel = RotelReceiver(netns=netns, ports=(4317, 4318)).start()
    collectors.append(rotel)
    podman("pod", "start", pod)
    return rotel


def _as_simulator(container: dict[str, Any]) -> None:
    """The example's application, here the image's own simulated IMDS on the pod's loopback."""
    name = container["name"]
    container.clear()
    container.update(name=name, image=MANIFEST_IMAGE, command=["scheduled-events-exporter"],
                     args=["simulate", "--scenario", "live-migration", "--loop"])


def test_the_sidecar_manifest_under_podman_kube_play(podman: Podman, image: str,
                                                     tmp_path: Path,
                                                     pod_collector: list[RotelReceiver]) -> None:
    """The classic sidecar as shipped, and its promise: with the collector down, the exporter
    stays ready and says why in /readyz (a pod is Ready only when every container is)."""
    manifest = yaml.safe_load((REPO / "config" / "k8s" / "sidecar.yaml").read_text())
    manifest["metadata"]["name"] = name = unique("see-web")
    template = manifest["spec"]["template"]["spec"]
    (app, exporter) = template["containers"]
    assert "readinessProbe" not in exporter, "nothing the exporter depends on may gate the app"
    _as_simulator(app)
    _node_name_from_pod_name(exporter)
    # The staleness limit short, so a sink counts as failing after 5 s instead of 30.
    _with_env(exporter, SEE_IMDS_ENDPOINT="http://127.0.0.1:8099", SEE_STALENESS_LIMIT="5",
              OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:4318")
    health = _health_port(exporter)
    _unpublished(template)
    played = tmp_path / "sidecar.yaml"
    played.write_text(yaml.safe_dump(manifest))
    podman("tag", image, MANIFEST_IMAGE)
    pod = f"{name}-pod-0"
    container = f"{pod}-{exporter['name']}"
    with cleanup(podman, kube=played, volumes=_empty_dirs(template)):
        rotel = _play(podman, played, pod, pod_collector)
        _exporter_in_pod(podman, container, health, None, rotel)
        rotel.stop()  # the collector goes away; the scenario goes on changing the document

        def readyz() -> tuple[int, dict[str, Any]]:
            status, body = exec_json(podman, container, f"http://127.0.0.1:{health}/readyz")
            return status, json.loads(body) if status else {}

        wait_until(lambda: readyz()[1].get("warnings") == ["sink otlp failing"], 90,
                   "/readyz reporting the failing collector", 1.0)
        status, body = readyz()
        assert (status, body["status"], body["reasons"]) == (200, "ready", []), body
        assert body["sinks"]["otlp"]["pending"] > 0, body
        assert podman.inspect(f"{pod}-app", "{{.State.Running}}") == "true"


def test_the_native_sidecar_job_under_podman_kube_play(
        podman: Podman, image: str, tmp_path: Path,
        pod_collector: list[RotelReceiver]) -> None:
    """The native sidecar's container as shipped, in the Job's pod. podman 4.3 plays neither a
    Job nor an init container with restartPolicy: Always (it would wait for it to exit): the
    pod template is played as a Pod with the sidecar among the containers, and the batch step
    is the simulated IMDS."""
    (job,) = yaml.safe_load_all((REPO / "config" / "k8s" / "native-sidecar-job.yaml")
                                .read_text())
    spec = job["spec"]["template"]["spec"]
    (sidecar,) = spec.pop("initContainers")
    assert sidecar.pop("restartPolicy") == "Always"
    (batch,) = spec["containers"]
    _as_simulator(batch)
    _node_name_from_pod_name(sidecar)
    _with_env(sidecar, SEE_IMDS_ENDPOINT="http://127.0.0.1:8099",
              OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:4318")
    spec["containers"].append(sidecar)
    spec["restartPolicy"] = "OnFailure"
    _unpublished(spec)
    pod = unique("see-job")
    played = tmp_path / "job-pod.yaml"
    played.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Pod",
                                      "metadata": {**job["spec"]["template"]["metadata"],
                                                   "name": pod}, "spec": spec}))
    podman("tag", image, MANIFEST_IMAGE)
    with cleanup(podman, kube=played, volumes=_empty_dirs(spec)):
        rotel = _play(podman, played, pod, pod_collector)
        _exporter_in_pod(podman, f"{pod}-{sidecar['name']}", _health_port(sidecar), None, rotel)


def test_the_daemonset_pod_template_under_podman_kube_play(
        podman: Podman, image: str, tmp_path: Path,
        pod_collector: list[RotelReceiver]) -> None:
    documents = list(yaml.safe_load_all((REPO / "config" / "k8s" / "daemonset.yaml").read_text()))
    daemonset = next(d for d in documents if d["kind"] == "DaemonSet")
    template = daemonset["spec"]["template"]
    spec = template["spec"]
    # podman 4.3 restarts an init container forever under restartPolicy Always.
    spec["restartPolicy"] = "OnFailure"
    host_state = tmp_path / "node" / "var-lib-see"  # created by kube play (DirectoryOrCreate)
    for volume in spec["volumes"]:
        if "hostPath" in volume:
            volume["hostPath"]["path"] = str(host_state)
    (exporter,) = spec["containers"]
    # kube play knows fieldRef metadata.name, not spec.nodeName; Event Hubs is left out (its
    # Secret and namespace are Azure's), the rest as shipped.
    exporter["env"] = [e for e in exporter["env"] if not e["name"].startswith("SEE_EVENTHUB")]
    _node_name_from_pod_name(exporter)
    _with_env(exporter, SEE_SINKS="otlp", SEE_IMDS_ENDPOINT="http://127.0.0.1:8099",
              OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:4318")
    spec["containers"].append({"name": "imds", "image": exporter["image"],
                               "command": ["scheduled-events-exporter"],
                               "args": ["simulate", "--scenario", "live-migration", "--loop"]})
    _unpublished(spec)
    pod = unique("see-node")
    played = tmp_path / "daemonset-pod.yaml"
    played.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Pod",
                                      "metadata": {**template["metadata"], "name": pod},
                                      "spec": spec}))
    podman("tag", image, MANIFEST_IMAGE)
    with cleanup(podman, kube=played, volumes=_empty_dirs(spec)):
        rotel = _play(podman, played, pod, pod_collector)
        _exporter_in_pod(podman, f"{pod}-{exporter['name']}", _health_port(exporter), host_state,
                         rotel)
