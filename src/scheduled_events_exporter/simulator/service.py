"""The simulated IMDS service: its state (events, incarnation, faults, request log) and playback.

Standard library only, so it runs wherever the exporter does. Tests drive :class:`Simulator` in
process; ``scheduled-events-exporter simulate`` (:mod:`.cli`) serves it from the command line.
The wire rules live in :mod:`.server`, the scenario files in :mod:`.scenarios`.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from types import TracebackType

from scheduled_events_exporter.simulator.scenarios import (
    DEFAULT_VM_NAME,
    Fault,
    Scenario,
    Step,
)
from scheduled_events_exporter.simulator.server import (
    SCHEDULED_EVENTS_VERSIONS,
    FaultQueue,
    RequestLogEntry,
    Response,
    Route,
    Server,
    check_request,
    document_response,
    error,
    fault_response,
    instance_document,
    is_loopback,
    parse_start_requests,
    raw_document_response,
    start_events,
)

__all__ = ["Fault", "PlayedStep", "RequestLogEntry", "Simulator"]


@dataclass(frozen=True)
class PlayedStep:
    """What :meth:`Simulator.play` just applied, for progress reporting."""

    scenario: str
    index: int  # 0-based
    total: int
    step: Step
    incarnation: int
    events: tuple[Mapping[str, object], ...]
    elapsed: float  # real seconds since the playback started


class Simulator:
    """IMDS on loopback: scheduled events (GET/POST), instance metadata, faults, scenarios.

    Thread-safe; every public method may be called from any thread while the server runs.
    """

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, vm_name: str = DEFAULT_VM_NAME,
                 instance: Mapping[str, str] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        if not is_loopback(host):
            raise ValueError(f"simulator host: expected a loopback address, got {host!r}")
        self._host, self._port, self.vm_name = host, port, vm_name
        self._instance = dict(instance or {})
        self._clock = clock
        self._lock = threading.Condition()
        self._events: list[dict[str, object]] = []
        self._incarnation = 1
        self._faults = FaultQueue()
        self._faults_taken = 0
        self._log_entries: list[RequestLogEntry] = []
        self._approved: set[str] = set()
        self._versions: tuple[str, ...] = SCHEDULED_EVENTS_VERSIONS
        #: A recorded document served byte for byte instead of the rendered one (replay).
        self._raw: bytes | None = None
        self._conns: set[socket.socket] = set()
        self._playbacks: list[threading.Event] = []
        self._stopping = threading.Event()
        self._server: Server | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    def for_scenario(cls, scenario: Scenario, *, host: str = "127.0.0.1", port: int = 0,
                     clock: Callable[[], float] = time.time) -> Simulator:
        """A simulator named and described like the VM ``scenario`` is written for."""
        return cls(host=host, port=port, vm_name=scenario.vm_name, instance=scenario.instance,
                   clock=clock)

    def start(self, *, serve: bool = True) -> Server:
        """Bind and serve in a daemon thread; after :meth:`stop` it rebinds the same port.

        With ``serve=False`` only bind, and return the server for a caller that serves many
        simulators from one thread (:class:`~.fleet.Fleet`).
        """
        if self._server is not None:
            raise RuntimeError(f"simulator already serving at {self.url}")
        self._stopping.clear()
        server = Server((self._host, self._port), self)
        self._port = server.server_address[1]
        self._server = server
        if serve:
            self._thread = threading.Thread(target=server.serve_forever,
                                            kwargs={"poll_interval": 0.05},
                                            name="imds-simulator", daemon=True)
            self._thread.start()
        return server

    def stop(self) -> None:
        """Stop playback and serving, drop open connections; safe to call repeatedly."""
        self.stop_playing()
        with self._lock:
            server, thread, self._server, self._thread = self._server, self._thread, None, None
        if server is None:
            return
        self._stopping.set()  # wakes requests sleeping in a delay fault
        if thread is not None:  # else whoever serves it (a Fleet) stopped serving already
            server.shutdown()
            thread.join()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:  # idle keep-alive clients must see the server go, not hang
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        server.server_close()

    def __enter__(self) -> Simulator:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:8099`` (known once started)."""
        if not self._port:
            raise RuntimeError("simulator URL is known only after start()")
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self._port}"

    @property
    def incarnation(self) -> int:
        """Current DocumentIncarnation."""
        with self._lock:
            return self._incarnation

    @property
    def events(self) -> list[dict[str, object]]:
        """A copy of the current Events list."""
        with self._lock:
            return json.loads(json.dumps(self._events))  # type: ignore[no-any-return]

    def set_events(self, events: Sequence[Mapping[str, object]], *,
                   incarnation: int | None = None) -> int:
        """Replace the Events list; the incarnation goes up by one only if the list changed,
        or becomes ``incarnation`` when given (lower simulates an IMDS reset). Returns it."""
        with self._lock:
            return self._replace(events, incarnation)

    def _replace(self, events: Sequence[Mapping[str, object]], incarnation: int | None) -> int:
        try:  # a JSON round trip both validates and detaches the caller's objects
            fresh = json.loads(json.dumps([dict(e) for e in events]))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"events: expected JSON-serialisable mappings, got {exc}") from exc
        if incarnation is not None:
            self._incarnation = incarnation
        elif fresh != self._events:
            self._incarnation += 1
        self._events = fresh
        return self._incarnation

    def set_raw_document(self, body: bytes | None) -> None:
        """Serve ``body`` exactly as given (a document captured on a real VM), until the next
        call; ``None`` goes back to rendering. Its events (when it parses) become the current
        ones, so an approval of them is accepted as IMDS would; the bytes served stay the
        recorded ones, since the recording is what the platform sent next."""
        with self._lock:
            self._raw = body
            if body is None:
                return
            try:
                parsed = json.loads(body)
                events = parsed["Events"]
                incarnation = parsed["DocumentIncarnation"]
            except (ValueError, KeyError, TypeError):
                return  # a broken recording is served as it is; the exporter must cope
            if isinstance(events, list) and isinstance(incarnation, int):
                self._events = [e for e in events if isinstance(e, dict)]
                self._incarnation = incarnation

    def set_api_versions(self, versions: Sequence[str]) -> None:
        """Serve only these Scheduled Events api-versions (oldest first); any other is answered
        400 with ``newest-versions``, as IMDS does when it stops serving a version."""
        if not versions:
            raise ValueError("api versions: expected at least one version")
        with self._lock:
            self._versions = tuple(versions)

    def push_fault(self, fault: Fault) -> None:
        """Queue ``fault``; queued faults are used in order by the requests they match."""
        with self._lock:
            self._faults.push(fault)

    @property
    def requests(self) -> list[RequestLogEntry]:
        """Every request answered so far, oldest first (a copy)."""
        with self._lock:
            return list(self._log_entries)

    def wait_for_faults_taken(self, count: int, timeout: float) -> bool:
        """Wait until requests have met ``count`` queued faults in all (a delay fault is met
        when its request arrives, before the answer: the request is then in flight); False
        on timeout."""
        with self._lock:
            return self._lock.wait_for(lambda: self._faults_taken >= count, timeout)

    def clear_requests(self) -> None:
        """Forget the request log (wait_for_requests counts from here on)."""
        with self._lock:
            self._log_entries.clear()

    def wait_for_requests(self, count: int, timeout: float, *, method: str | None = None,
                          path_prefix: str | None = None) -> bool:
        """Wait until the log holds ``count`` matching requests; False on timeout."""
        def enough() -> bool:
            return sum(1 for e in self._log_entries
                       if (method is None or e.method == method)
                       and (path_prefix is None or e.path.startswith(path_prefix))) >= count
        with self._lock:
            return self._lock.wait_for(enough, timeout)

    def now(self) -> float:
        """Wall clock (the injected one) for the request log."""
        return self._clock()

    def record(self, entry: RequestLogEntry) -> None:
        """Append ``entry`` to the request log and wake :meth:`wait_for_requests`."""
        with self._lock:
            self._log_entries.append(entry)
            self._lock.notify_all()

    def track(self, conn: socket.socket, *, add: bool) -> None:
        """Remember open connections so :meth:`stop` can close idle keep-alive ones."""
        with self._lock:
            (self._conns.add if add else self._conns.discard)(conn)

    def handle(self, method: str, path: str, query: str, headers: tuple[tuple[str, str], ...],
               body: bytes) -> Response:
        """Answer one request: IMDS checks first, then a queued fault, then the real answer."""
        with self._lock:
            versions = self._versions
        route = check_request(method, path, query, headers, versions)
        if isinstance(route, Response):
            return route
        with self._lock:
            fault = self._faults.take(route.target, method, time.monotonic())
            if fault is not None:
                self._faults_taken += 1
                self._lock.notify_all()
        if fault is not None:
            if self._stopping.wait(fault.delay):  # stop() cuts a delay short, unlike time.sleep
                return error(HTTPStatus.SERVICE_UNAVAILABLE, "Simulator stopping")
            if fault.kind != "delay":
                return fault_response(fault)
        if route.target == "instance":
            return Response(HTTPStatus.OK,
                            json.dumps(instance_document(self.vm_name, self._instance)).encode())
        if method == "POST":
            return self._approve(body)
        return self._document(route, headers)

    def _document(self, route: Route, headers: tuple[tuple[str, str], ...]) -> Response:
        inm = next((v for k, v in headers if k.lower() == "if-none-match"), None)
        with self._lock:
            if self._raw is not None:
                return raw_document_response(self._raw, inm)
            return document_response(self._incarnation, self._events, route.version, inm)

    def _approve(self, body: bytes) -> Response:
        ids = parse_start_requests(body)
        if isinstance(ids, Response):
            return ids
        with self._lock:
            changed = start_events(self._events, ids)
            if isinstance(changed, Response):
                return changed
            self._approved.update(i.casefold() for i in ids)
            if changed:
                self._incarnation += 1
        return Response(HTTPStatus.OK)

    def play(self, scenario: Scenario, *, speed: float | None = None, loop: bool = False,
             on_step: Callable[[PlayedStep], None] | None = None) -> threading.Event:
        """Play ``scenario`` in a daemon thread at ``speed`` (default: the scenario's own).

        Returns an event set when the last step is applied (or playback is cancelled). A running
        playback is cancelled first. Events approved by POST during playback stay ``Started``
        when a later step lists them ``Scheduled``, as approval would on Azure. With ``loop`` it
        replays until cancelled, with fresh EventIds each round.
        """
        speed = scenario.speed if speed is None else speed
        if speed <= 0:
            raise ValueError(f"speed: expected a number > 0, got {speed!r}")
        self.stop_playing()
        cancel, done = threading.Event(), threading.Event()
        with self._lock:
            self._playbacks.append(cancel)
        threading.Thread(target=self._playback, args=(scenario, speed, loop, on_step, cancel, done),
                         name=f"imds-scenario-{scenario.name}", daemon=True).start()
        return done

    def stop_playing(self) -> None:
        """Cancel any running playback (the current document stays as it is)."""
        with self._lock:
            for cancel in self._playbacks:
                cancel.set()

    def _playback(self, scenario: Scenario, speed: float, loop: bool,
                  on_step: Callable[[PlayedStep], None] | None, cancel: threading.Event,
                  done: threading.Event) -> None:
        try:
            ids: dict[str, str] | None = None
            while True:
                with self._lock:
                    self._approved.clear()
                self._play_once(scenario, speed, ids, on_step, cancel)
                if not loop or cancel.is_set():
                    break
                # A replayed EventId would look like the same event coming back: use fresh ones.
                ids = {str(e.get("EventId")): str(uuid.uuid4()).upper()
                       for s in scenario.steps for e in s.events}
        finally:
            with self._lock:
                self._playbacks.remove(cancel)
            done.set()

    def _play_once(self, scenario: Scenario, speed: float, ids: Mapping[str, str] | None,
                   on_step: Callable[[PlayedStep], None] | None, cancel: threading.Event) -> None:
        start, start_wall = time.monotonic(), self._clock()
        for index, step in enumerate(scenario.steps):
            if cancel.wait(max(0.0, start + step.at / speed - time.monotonic())):
                return
            events = scenario.render(step, start=start_wall, speed=speed, vm_name=self.vm_name,
                                     id_map=ids)
            with self._lock:
                if cancel.is_set():
                    return
                for event in events:
                    if str(event.get("EventId")).casefold() in self._approved and \
                            event.get("EventStatus") == "Scheduled":
                        event["EventStatus"], event["NotBefore"] = "Started", ""
                incarnation = self._replace(events, step.incarnation)
                if step.fault is not None:
                    self._faults.push(step.fault)
            if on_step is not None:
                on_step(PlayedStep(scenario.name, index, len(scenario.steps), step, incarnation,
                                   tuple(events), time.monotonic() - start))
