"""A released version of the exporter, run as users ran it, to write the state directory the
current code must read (docs/semantics.md, "Compatibility").

``RELEASES`` maps each released version (and the development tree before files could
evolve) to the commit it was built from. A release is taken
out of the repository's own history with ``git archive`` and run from its own ``src/`` on the
current interpreter (its runtime dependencies are in the same lock), never imported into the
test process. ``write_state_dir`` makes the directory a fixture holds: two pending events, an
OTLP and an Event Hubs spool with undelivered transitions, console's acknowledged spool, and a
dead-letter line.
"""

from __future__ import annotations

import http.server
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from io import BytesIO
from pathlib import Path

from scheduled_events_exporter.simulator import Simulator
from tests.exporter_process import ExporterProcess, clean_env, free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
#: version → the commit of this repository it was released from.
#: ``dev-56159e4`` is the development tree at that commit, the last before the files could
#: evolve, which early adopters run from a clone; no version has been tagged yet. Each tag adds
#: its version here (docs/releasing.md, step 4).
RELEASES = {"dev-56159e4": "56159e478654be07ada73b595c7c0a854d3e8a3c"}

REBOOT = {"EventId": "C7061BAC-AFDC-4513-B24B-AA5F13A16123", "EventStatus": "Scheduled",
          "EventType": "Reboot", "ResourceType": "VirtualMachine", "Resources": ["vm-test"],
          "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT", "Description": "planned reboot",
          "EventSource": "Platform", "DurationInSeconds": -1}
FREEZE = {"EventId": "F1E2D3C4-0000-4000-8000-000000000001", "EventStatus": "Started",
          "EventType": "Freeze", "ResourceType": "VirtualMachine", "Resources": ["vm-test"],
          "NotBefore": "", "Description": "live migration", "EventSource": "Platform",
          "DurationInSeconds": 5}
REDEPLOY = {"EventId": "A0B1C2D3-0000-4000-8000-000000000002", "EventStatus": "Scheduled",
            "EventType": "Redeploy", "ResourceType": "VirtualMachine", "Resources": ["vm-test"],
            "NotBefore": "Mon, 19 Sep 2016 18:40:00 GMT", "Description": "redeploy",
            "EventSource": "Platform", "DurationInSeconds": -1}


def release_source(version: str, into: Path, part: str = "src") -> Path:
    """The released ``version``'s ``part`` of the tree (``git archive`` of its commit), in a
    folder under ``into`` that holds ``part`` at its own path."""
    out = into / f"release-{version}"
    if not (out / part).exists():
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", RELEASES[version], part],
                                 check=True, capture_output=True).stdout
        with tarfile.open(fileobj=BytesIO(archive)) as tar:
            if hasattr(tarfile, "data_filter"):  # every Python since 3.11.4
                tar.extractall(out, filter="data")
            else:  # our own history, not a stranger's archive
                tar.extractall(out)
    return out


def run_release(source: Path, env: dict[str, str]) -> ExporterProcess:
    """``python -m scheduled_events_exporter run`` from a release's own ``src/``."""
    return ExporterProcess({**env, "PYTHONPATH": str(source / "src")},
                           command=[sys.executable, "-m", "scheduled_events_exporter", "run"])


class _Refuse(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(400)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", "7")
        self.end_headers()
        self.wfile.write(b"refused")

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def refusing_collector() -> Iterator[str]:
    """An OTLP/HTTP endpoint that refuses every request with 400 (permanent: dead-lettered)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def release_env(sim: Simulator, state: Path, otlp: str, sinks: str) -> dict[str, str]:
    """The settings both runs share (nothing but loopback)."""
    return clean_env(
        SEE_IMDS_ENDPOINT=sim.url, SEE_POLL_INTERVAL="0.2", SEE_STATE_DIR=str(state),
        SEE_SINKS=sinks, SEE_HEALTH_ADDR="", SEE_SHUTDOWN_TIMEOUT="1", SEE_LOG_LEVEL="info",
        OTEL_EXPORTER_OTLP_ENDPOINT=otlp, OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
        OTEL_METRICS_EXPORTER="none",
        SEE_EVENTHUB_CONNECTION_STRING=(
            f"Endpoint=sb://127.0.0.1:{free_port()};SharedAccessKeyName=k;"
            "SharedAccessKey=c2VjcmV0;EntityPath=hub;UseDevelopmentEmulator=true"),
    )


def write_state_dir(version: str, state: Path, scratch: Path, *,
                    sinks: str = "console,otlp,eventhubs") -> None:
    """Run released ``version`` so that ``state`` ends up as a fixture holds it: first against a
    collector that refuses (dead letters), then with the collector and the hub unreachable
    while events appear and end (spooled), then stopped."""
    source = release_source(version, scratch)
    with Simulator(vm_name="vm-test") as sim:
        sim.set_events([REBOOT])
        with refusing_collector() as refusing:
            env = release_env(sim, state, refusing, "console,otlp")
            with run_release(source, env) as first:
                first.wait_for(lambda: "dead-letter" in first.stderr(), 30,
                               "the refused record dead-lettered")
                assert first.terminate() == 0, first.stderr()
        env = release_env(sim, state, f"http://127.0.0.1:{free_port()}", sinks)
        with run_release(source, env) as second:
            wait_until(lambda: sim.requests != [], 20,
                       "the release polling")
            sim.set_events([REBOOT, FREEZE, REDEPLOY])
            second.wait_for(lambda: len(second.records()) >= 2, 30, "two new events")
            sim.set_events([FREEZE, REDEPLOY])  # the reboot ends
            second.wait_for(lambda: len(second.records()) >= 3, 30, "the reboot's end")
            assert second.terminate(timeout=30) == 0, second.stderr()


if __name__ == "__main__":
    # python -m tests.compat.released VERSION: (re)write tests/compat/VERSION/state.
    import shutil
    import tempfile

    version = sys.argv[1]
    target = HERE / version / "state"
    shutil.rmtree(target, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        write_state_dir(version, target, Path(tmp))
    for lock in target.glob("*.lock"):
        lock.unlink()
    print(f"wrote {target}")
