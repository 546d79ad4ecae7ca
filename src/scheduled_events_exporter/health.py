"""``/healthz`` and ``/readyz`` (docs/semantics.md#reliability) with JSON bodies.

``/healthz``: the process is alive and the poll loop is ticking (not wedged past the longest
request plus the longest retry delay). ``/readyz``: the exporter itself works, that is a good
IMDS document within ``SEE_STALENESS_LIMIT`` and an api-version IMDS accepts.

What happens downstream is reported in ``/readyz``'s body and decides its status only when
``SEE_READINESS_INCLUDES`` names it (docs/semantics.md#reliability): ``sinks`` (a sink whose oldest
undelivered record has waited longer than the limit, or that refuses us for a configuration
reason such as authentication), ``storage`` (a file under the state directory that cannot be
written; the exporter goes on from memory). A readiness probe that follows the collector would
take a sidecar's application out of its Service, and stall a DaemonSet's rollout, for as long as
the telemetry backend is down. Nothing here reads a secret: sink errors are our own messages.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from scheduled_events_exporter.delivery.outcome import SinkStatus
from scheduled_events_exporter.model import Outcome
from scheduled_events_exporter.serving import IDLE_TIMEOUT, ConnectionCap
from scheduled_events_exporter.write_faults import WriteFault

log = logging.getLogger(__name__)

#: Longest retry delay the poll loop can choose (imds.retry_delay caps), plus slack.
MAX_RETRY_DELAY = 60.0


@dataclass(frozen=True, slots=True)
class HealthInputs:
    """What the probes look at; read through callables so they see live values."""

    last_tick: Callable[[], float | None]
    started: float
    last_good: Callable[[], float | None]
    last_outcome: Callable[[], str | None]
    sink_status: Callable[[], Sequence[SinkStatus]]
    poll_interval: float
    request_timeout: float
    staleness_limit: float
    monotonic: Callable[[], float] = time.monotonic
    #: Files outside the sinks (the state file) that cannot be written right now.
    write_faults: Callable[[], Sequence[WriteFault]] = tuple
    #: Monotonic time by which the poll under way must end (``None`` before the first).
    next_tick_deadline: Callable[[], float | None] = lambda: None
    #: Whether the poll thread is still running (it never ends on its own).
    loop_alive: Callable[[], bool] = lambda: True
    #: Downstream checks that also turn /readyz to 503 (SEE_READINESS_INCLUDES); the others
    #: are reported in the body only.
    includes: frozenset[str] = frozenset()
    #: What a good answer comes from: ``IMDS`` (run), ``platform queue`` (the platform
    #: command, whose body says ``platform_queue_last_outcome`` instead of IMDS's).
    source: str = "IMDS"


def liveness(inputs: HealthInputs) -> tuple[bool, dict[str, object]]:
    """Whether the poll loop is ticking, with the detail."""
    now = inputs.monotonic()
    tick = inputs.last_tick()
    since = now - (tick if tick is not None else inputs.started)
    allowed = inputs.request_timeout + MAX_RETRY_DELAY + 2 * inputs.poll_interval + 5.0
    deadline = inputs.next_tick_deadline()
    if deadline is not None:
        # The loop says when its current poll must be over (its schedule plus the request's
        # own timeout): a loop stuck past that is stalled now, not minutes later.
        allowed = max(deadline - (tick if tick is not None else inputs.started), 0.0)
    alive = inputs.loop_alive()
    ok = alive and since <= allowed
    return ok, {
        "status": "ok" if ok else ("stalled" if alive else "poll loop ended"),
        "seconds_since_last_poll": round(since, 3),
        "allowed_seconds": round(allowed, 3),
    }


def readiness(inputs: HealthInputs) -> tuple[bool, dict[str, object]]:
    """Whether the exporter itself works (fresh IMDS data), with the detail; a failing sink or
    an unwritable state file decides the answer only where ``inputs.includes`` names it."""
    now = inputs.monotonic()
    good = inputs.last_good()
    age = None if good is None else now - good
    fresh = age is not None and age <= inputs.staleness_limit
    sinks: dict[str, object] = {}
    failing: list[str] = []
    statuses = list(inputs.sink_status())
    faults = list(inputs.write_faults())
    letters: list[str] = []
    for status in statuses:
        if status.letters_waiting:
            letters.append(f"sink {status.name}: {status.letters_waiting} records refused for "
                           "good wait in the spool for the dead-letter file to take their "
                           "letters")
        if status.letters_removed:
            letters.append(f"sink {status.name}: {status.letters_removed} dead letters removed "
                           "at the dead-letter file's bound since start (see the log)")
        is_failing = (status.oldest_wait > inputs.staleness_limit or bool(status.config_error)
                      or bool(status.rejecting))
        if is_failing:
            # A configuration error (a refused credential, a redirect) says what to fix; a
            # sink that dead-letters what it is given says how many and with which answer.
            failing.append(f"sink {status.name} failing" + (
                f": {status.config_error}" if status.config_error else
                f": {status.rejecting}" if status.rejecting else ""))
        faults.extend(status.write_faults)
        sinks[status.name] = {
            "pending": status.pending,
            "oldest_wait_seconds": round(status.oldest_wait, 3),
            "failing": is_failing,
            "consecutive_failures": status.consecutive_failures,
            "last_error": status.last_error,
            "config_error": status.config_error,
            "dropped": status.dropped,
            "dead_lettered": status.dead_lettered,
            "letters_waiting": status.letters_waiting,
            "letters_removed": status.letters_removed,
            "rejecting": status.rejecting,
            "request_bytes": status.request_bytes,
            "max_request_bytes": status.max_request_bytes,
            "paused_seconds": round(status.paused_for, 3),
        }
    # A refused api-version will not pass by itself: not ready at once, whatever the age.
    refused = inputs.last_outcome() == Outcome.API_VERSION_REFUSED.value
    reasons: list[str] = []
    if refused:
        reasons.append("IMDS refuses the api-version sent (SEE_IMDS_API_VERSION; see the log)")
    what = "IMDS document" if inputs.source == "IMDS" else f"answer from the {inputs.source}"
    if not fresh:
        reasons.append(
            f"no good {what} yet"
            if age is None
            else f"last good {what} {age:.1f} s ago"
        )
    downstream = {
        "sinks": failing,
        "storage": [*(f"cannot write {f.file}: {f.error}" for f in faults), *letters],
    }
    warnings: list[str] = []
    for check, problems in downstream.items():
        (reasons if check in inputs.includes else warnings).extend(problems)
    ok = not reasons
    body: dict[str, object] = {
        "status": "ready" if ok else "not ready",
        "reasons": reasons,
        # Downstream problems that do not decide the status (SEE_READINESS_INCLUDES).
        "warnings": warnings,
        "readiness_includes": sorted(inputs.includes),
        "last_good_document_age_seconds": None if age is None else round(age, 3),
        "staleness_limit_seconds": inputs.staleness_limit,
        f"{inputs.source.lower().replace(' ', '_')}_last_outcome": inputs.last_outcome(),
        "sinks": sinks,
        # Records held for their letters wait in the spool too.
        "spool_depth": sum(s.pending + s.letters_waiting for s in statuses),
        "storage": {
            "writable": not faults,
            "faults": [
                {
                    "file": f.file,
                    "error": f.error,
                    "failing_for_seconds": round(max(0.0, now - f.since), 3),
                    "failed_writes": f.failures,
                }
                for f in faults
            ],
        },
    }
    return ok, body


class _BoundedServer(ConnectionCap, ThreadingHTTPServer):
    """The probes' server: connections capped, idle ones timed out (:mod:`.serving`)."""


class HealthServer:
    """A tiny HTTP server for the probes, on its own daemon thread."""

    def __init__(self, addr: tuple[str, int], inputs: HealthInputs) -> None:
        probes = {"/healthz": liveness, "/readyz": readiness}

        class Handler(BaseHTTPRequestHandler):
            server_version = "scheduled-events-exporter"
            # An idle or trickling client is dropped after this many seconds (per socket
            # operation): a probe answers in milliseconds.
            timeout = IDLE_TIMEOUT

            def do_GET(self) -> None:
                probe = probes.get(self.path.split("?", 1)[0])
                if probe is None:
                    self._send(
                        404,
                        {
                            "error": f"unknown path {self.path[:100]!r}; "
                            "expected /healthz or /readyz"
                        },
                    )
                    return
                ok, body = probe(inputs)
                self._send(200 if ok else 503, body)

            def _send(self, status: int, body: dict[str, object]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                pass  # probes every few seconds would drown the diagnostic log

        try:
            self._server = _BoundedServer(addr, Handler)
        except OSError as exc:
            raise OSError(f"cannot listen on SEE_HEALTH_ADDR={addr[0]}:{addr[1]} "
                          f"({exc.strerror or exc}); set another address or empty to disable"
                          ) from None
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve, name="health", daemon=True
        )

    def start(self) -> None:
        """Serve in the background."""
        self._thread.start()

    def stop(self) -> None:
        """Stop serving."""
        self._server.stop_serving()
        self._server.server_close()
