"""Assembly: build the client, sinks, telemetry and poller from a :class:`Config` and run them.

The poll loop runs on its own thread; the caller's thread waits for a stop request (a signal),
then stops polling, drains the sinks within ``SEE_SHUTDOWN_TIMEOUT`` and returns. A blocked
IMDS request (the first one may take minutes) therefore never delays shutdown.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from scheduled_events_exporter import __version__
from scheduled_events_exporter.approval_worker import Approver
from scheduled_events_exporter.boot import continuing, host_boot_id
from scheduled_events_exporter.config import Config
from scheduled_events_exporter.delivery import start
from scheduled_events_exporter.delivery.outcome import SinkStatus
from scheduled_events_exporter.delivery.spool import waiting_elsewhere
from scheduled_events_exporter.health import HealthInputs, HealthServer
from scheduled_events_exporter.imds import ImdsClient
from scheduled_events_exporter.model import InstanceInfo
from scheduled_events_exporter.platforms import dir_lock
from scheduled_events_exporter.platforms import stop as stop_requests
from scheduled_events_exporter.platforms.files import FILES
from scheduled_events_exporter.poller import Clock, Poller, Submitter, with_vm_name
from scheduled_events_exporter.records import TransitionRecord, body, for_log
from scheduled_events_exporter.sinks import Sink, create_sinks
from scheduled_events_exporter.state import (
    NewerStateFile,
    PersistedState,
    StateCommitter,
    StateStore,
)
from scheduled_events_exporter.telemetry import Telemetry, build_resource, severity
from scheduled_events_exporter.write_faults import WriteFault

if TYPE_CHECKING:
    from scheduled_events_exporter.scrape import ScrapeEndpoint

log = logging.getLogger("scheduled_events_exporter")

#: How long start-up waits for instance metadata before polling without it.
INSTANCE_WAIT = 2.0
#: Seconds past ``SEE_SHUTDOWN_TIMEOUT`` after which a shutdown that is stuck ends the process.
SHUTDOWN_GRACE = 5.0
#: The exit code of a shutdown the watchdog ended (a restart is safe: nothing is lost).
EXIT_STUCK = 1
#: The exit code when another exporter holds SEE_STATE_DIR (docs/semantics.md, "One exporter
#: per state directory").
EXIT_STATE_DIR_BUSY = 3


def exit_if_stuck(seconds: float, spooled: bool = True,
                  end: Callable[[int], None] = os._exit) -> threading.Timer:
    """End the process if the shutdown it starts has not ended within ``seconds``.

    Each step of the drain has its own deadline; this bounds what none of them covers: a
    library call that never returns, or a thread that keeps the interpreter from exiting. A
    daemon thread, so a clean exit never waits for it. With a state directory (``spooled``)
    nothing is lost by ending here: the state was committed first and every record not
    acknowledged is in its sink's spool.
    """
    fate = ("records not delivered stay in the spool" if spooled else
            "records not delivered are lost: SEE_STATE_DIR is empty, so there is no spool")

    def expire() -> None:
        log.error("shutdown did not finish within %g s; exiting with code %d (%s)",
                  seconds, EXIT_STUCK, fate)
        for handler in logging.getLogger().handlers:
            handler.flush()
        end(EXIT_STUCK)

    timer = threading.Timer(seconds, expire)
    timer.name = "shutdown-watchdog"
    timer.daemon = True
    timer.start()
    return timer


def setup_logging(level: str) -> None:
    """Plain text diagnostics on stderr; stdout belongs to the console sink."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # The OTel SDK logs every retry of an unreachable collector; our sink reports once per streak.
    logging.getLogger("opentelemetry").setLevel(logging.CRITICAL)


class LoggingSink:
    """Writes each transition's one-line summary to the diagnostic log (stderr)."""

    name = "log"

    def submit(self, records: Sequence[TransitionRecord]) -> None:
        """Log one line per record (logging is buffered by the stream, never network I/O)."""
        for record in records:
            # At INFO whatever the record's own severity (SEE_LOG_LEVEL=warning silences this
            # copy, not the sinks'), which is named in the line so a reader of stderr sees it.
            log.info("%s [%s]: %s", record.event_name, severity(record)[1],
                     for_log(body(record)))


def replay_clock(start: datetime | None) -> Clock | None:
    """A wall clock that starts at ``start`` and runs at real speed (SEE_CLOCK_START, for
    replaying captured documents against the times they were captured at)."""
    if start is None:
        return None
    origin = time.monotonic()
    return Clock(wall=lambda: start + timedelta(seconds=time.monotonic() - origin))


class Exporter:
    """A running exporter: poller thread, sinks and telemetry."""

    def __init__(self, config: Config, clock: Clock | None = None,
                 observers: Sequence[Submitter] = ()) -> None:
        """``observers`` see every record after the sinks (the demo's summary uses it)."""
        self.config = config
        self.clock = clock or replay_clock(config.clock_start) or Clock()
        self.client = ImdsClient(
            config.imds_endpoint,
            first_timeout=config.imds_first_timeout,
            timeout=config.imds_timeout,
            api_version=config.imds_api_version,
        )
        self._telemetry: Telemetry | None = None
        self.sinks: list[Sink] = create_sinks(config, self._count_failure)
        self.scrape: ScrapeEndpoint | None = None
        if "prometheus" in config.metrics_exporters:
            # Imported only when selected: prometheus_client costs start-up time and memory.
            from scheduled_events_exporter.scrape import ScrapeEndpoint

            self.scrape = ScrapeEndpoint(*config.prometheus_addr)  # binds: a busy port fails here
        instance = self._first_instance()
        readers = [r for s in self.sinks for r in s.metric_readers()]
        if self.scrape is not None:
            readers.extend(self.scrape.metric_readers())
        self.telemetry = Telemetry(
            readers=readers,
            resource=build_resource(instance),
            wall=self.clock.wall,
            monotonic=self.clock.monotonic,
        )
        self._telemetry = self.telemetry
        self.store = StateStore(config.state_dir) if config.state_dir else None
        persisted = self.store.load() if self.store else None
        # The start in its one order (delivery/start.py): spools read, the outbox repaired,
        # the numbers counted, then a redeliver request; a request that fails waits.
        begun = start.begin(config.state_dir, persisted, [s.delivery for s in self.sinks],
                            self.clock.wall(), self.clock.monotonic)
        self.pending_request = begun.pending
        for sink in self.sinks:  # their threads, now that the start decided what waits
            sink.start(self.telemetry.resource, self.telemetry.per_event_metrics)
        if config.state_dir is not None:
            for name, count in waiting_elsewhere(config.state_dir / "spool", config.sinks):
                log.warning("spool of sink %s holds %d undelivered records, but %s is not in "
                            "SEE_SINKS now: they wait there until it is again (delete %s to "
                            "drop them)", name, count, name,
                            config.state_dir / "spool" / f"{name}.log")
        if persisted:
            log.info(
                "state restored: %d known events, incarnation %s, last good document %s",
                len(persisted.tracker.events),
                persisted.tracker.incarnation,
                persisted.tracker.last_good.isoformat() if persisted.tracker.last_good else "never",
            )
        self.approver: Approver | None = None
        if config.approval is not None:
            self.approver = Approver(
                config.approval,
                endpoint=config.imds_endpoint,
                timeout=config.imds_timeout,
                vm_name=lambda: self.poller.instance.vm_name,
                already_approved=persisted.approvals if persisted else (),
                clock=self.clock.wall,
                on_outcome=self.telemetry.record_approval,
                api_version=config.imds_api_version,
            )
        approver = self.approver
        self.committer = (
            StateCommitter(
                self.store,
                self._count_failure,
                approvals=approver.approved_ids if approver is not None else tuple,
                unknown_fields=persisted.unknown_fields if persisted else (),
                # The outbox keeps a record until every sink's spool has it.
                settled=self._settled,
                outbox=persisted.outbox if persisted else (),
                unreadable=begun.unlettered,
            )
            if self.store
            else None
        )
        self.poller = Poller(
            config,
            self.client,
            [*self.sinks, LoggingSink(), *observers],
            self.telemetry,
            instance=instance,
            # Whatever happened while we were not running is reported with its gap.
            state=replace(persisted.tracker, interrupted=True) if persisted else None,
            clock=self.clock,
            seq=begun.seq,
            commit=self.committer,
            pending_request=self.pending_request,
            approver=self.approver,
            metrics_changed=self._metrics_changed,
            boot_id=self._boot_id(persisted),
        )
        self._stop_polling = threading.Event()
        self._thread = threading.Thread(
            target=self.poller.run, args=(self._stop_polling,), name="poller", daemon=True
        )
        self.health: HealthServer | None = None
        if config.health_addr is not None:
            self.health = HealthServer(
                config.health_addr,
                HealthInputs(
                    last_tick=lambda: self.poller.last_tick_monotonic,
                    next_tick_deadline=lambda: self.poller.next_tick_deadline,
                    loop_alive=lambda: self._thread.ident is None or self._thread.is_alive(),
                    started=time.monotonic(),
                    last_good=lambda: self.poller.last_good_monotonic,
                    last_outcome=lambda: self.poller.last_outcome,
                    sink_status=lambda: [s.status() for s in self.sinks],
                    poll_interval=config.poll_interval,
                    request_timeout=max(config.imds_first_timeout, config.imds_timeout),
                    staleness_limit=config.staleness_limit,
                    write_faults=self._state_faults,
                    includes=config.readiness_includes,
                ),
            )
        if not instance.vm_id:
            threading.Thread(
                target=self._retry_instance, name="instance-metadata", daemon=True
            ).start()

    def start(self) -> None:
        """Start polling."""
        config = self.config
        # The bound ports, not the configured ones: port 0 means "any free port" and the
        # operator needs the one that was chosen.
        health = (f"http://{config.health_addr[0]}:{self.health.port}/healthz and /readyz"
                  if config.health_addr and self.health is not None else "off")
        scrape_port = self.scrape.port if self.scrape is not None else config.prometheus_addr[1]
        metrics = ", ".join(
            f"Prometheus http://{config.prometheus_addr[0]}:{scrape_port}/metrics"
            if m == "prometheus" else m for m in config.metrics_exporters) or "none"
        # The version first: which build runs is the first question about a VM's journal.
        log.info(
            "scheduled-events-exporter %s polling %s every %g s; records to: %s; metrics to: %s; "
            "health: %s; state: %s",
            __version__, config.imds_endpoint, config.poll_interval, ", ".join(config.sinks),
            metrics, health, config.state_dir or "not kept (SEE_STATE_DIR empty)",
        )
        self._thread.start()
        if self.scrape is not None:
            self.scrape.start(self.telemetry.per_event_metrics)
        if self.health is not None:
            self.health.start()

    def stop(self) -> bool:
        """Stop polling, drain every sink within the shutdown timeout. True if all drained.

        The poll thread finishes by itself: the poll under way completes (its records are
        committed and handed over), then it ships the approval decisions and commits the state
        a last time (``Poller.finish``). This thread only waits for it: two threads committing
        could write an older state last, and the next start would report delivered
        transitions again."""
        # The whole stop fits SEE_SHUTDOWN_TIMEOUT: the sinks drain until shortly before it,
        # the last metric export takes the rest.
        deadline = time.monotonic() + self.config.shutdown_timeout
        drain_deadline = deadline - min(1.0, self.config.shutdown_timeout / 10)
        if self.approver is not None:
            # A hook still running is killed; decisions made so far ship with the last commit.
            self.approver.stop(min(2.0, max(0.0, deadline - time.monotonic())))
        self._stop_polling.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=max(0.0, drain_deadline - time.monotonic()))
            if self._thread.is_alive():
                # Still inside an IMDS request (the first may take 130 s): what it brings is
                # committed before it is handed over, or derived again at the next start.
                log.warning("the poll under way did not end within SEE_SHUTDOWN_TIMEOUT; "
                            "stopping without it (the state of the last poll is saved)")
        drained = True
        for sink in self.sinks:
            remaining = max(0.0, drain_deadline - time.monotonic())
            if not sink.shutdown(remaining):
                status = sink.status()
                kept = self.config.state_dir is not None
                (log.warning if kept else log.error)("%s", not_drained(
                    status, max(0.0, drain_deadline - time.monotonic()), kept=kept))
                drained = False
        if self.scrape is not None:
            self.scrape.stop()
        self.telemetry.shutdown(max(0.2, deadline - time.monotonic()))
        if self.health is not None:
            self.health.stop()
        self.client.close()
        return drained

    def _boot_id(self, persisted: PersistedState | None) -> str | None:
        """This boot's identity, written as the state file has it when it is the same boot (a
        Windows boot instant read again may differ by a clock correction)."""
        current = host_boot_id(self.config.boot_id_file, enabled=self.config.boot_evidence)
        return continuing(persisted.tracker.boot_id if persisted else None, current)

    def _metrics_changed(self) -> None:
        for sink in self.sinks:
            sink.metrics_changed()

    def _state_faults(self) -> tuple[WriteFault, ...]:
        faults = (self.store.fault if self.store else None,
                  self.pending_request.fault if self.pending_request else None)
        return tuple(f for f in faults if f is not None)

    def _settled(self) -> int:
        return min((s.delivery.settled_seq() for s in self.sinks), default=0)

    def _count_failure(self, sink: str, signal: str, count: int) -> None:
        if self._telemetry is not None:
            self._telemetry.record_export_failure(sink, signal, count)

    def _first_instance(self) -> InstanceInfo:
        fallback = InstanceInfo(vm_name=socket.gethostname())
        probe = ImdsClient(
            self.config.imds_endpoint,
            first_timeout=INSTANCE_WAIT,
            timeout=min(INSTANCE_WAIT, self.config.imds_timeout),
        )
        try:
            instance = with_vm_name(probe.fetch_instance(), fallback.vm_name)
            log.info(
                "instance metadata: VM %s (%s) in %s",
                instance.vm_name,
                instance.vm_id or "no vmId",
                instance.region or "unknown region",
            )
            return instance
        except (OSError, ValueError) as exc:
            log.warning(
                "instance metadata unavailable (%s); using host name %r as VM name and "
                "retrying in the background",
                exc,
                fallback.vm_name,
            )
            return fallback
        finally:
            probe.close()

    def _retry_instance(self) -> None:
        delay = 2.0
        probe = ImdsClient(
            self.config.imds_endpoint,
            first_timeout=self.config.imds_timeout,
            timeout=self.config.imds_timeout,
        )
        while not self._stop_polling.wait(delay * (0.5 + random.random() / 2)):
            try:
                instance = with_vm_name(probe.fetch_instance(), socket.gethostname())
            except (OSError, ValueError):
                delay = min(delay * 2, 300.0)
                continue
            self.poller.set_instance(instance)
            log.info(
                "instance metadata arrived: VM %s (%s); records carry it from now on "
                "(the OTel resource keeps its start-up values)",
                instance.vm_name,
                instance.vm_id,
            )
            break
        probe.close()


def run(config: Config, stop: threading.Event, finished: threading.Event | None = None) -> int:
    """Run until ``stop`` is set; exit code 0 after a clean shutdown. ``finished`` is set once
    the shutdown is done (Windows' console handler waits for it before the OS ends us)."""
    lock: dir_lock.DirectoryLock | None = None
    if config.state_dir is not None:
        try:
            lock = lock_state_dir(config, stop)
        except dir_lock.DirectoryBusy as busy:
            log.error("cannot start: %s; one exporter per state directory: stop the other one, "
                      "or give this one another SEE_STATE_DIR (exit code %d)", busy,
                      EXIT_STATE_DIR_BUSY)
            return EXIT_STATE_DIR_BUSY
        except OSError as exc:
            log.error("cannot start: state directory %s: %s", config.state_dir, exc)
            return 1
    try:
        exporter = Exporter(config)
    except (OSError, NewerStateFile) as exc:
        # E.g. SEE_HEALTH_ADDR already in use, the state directory vanished, or a newer
        # release's state file this one cannot read.
        log.error("cannot start: %s", exc)
        if lock is not None:
            lock.release()
        return 1
    exporter.start()
    stop_requests.wait_for(stop)
    exit_if_stuck(config.shutdown_timeout + SHUTDOWN_GRACE, config.state_dir is not None)
    log.info("stopping: draining sinks (up to %g s)", config.shutdown_timeout)
    try:
        drained = exporter.stop()
    finally:
        if finished is not None:
            finished.set()
    if lock is not None:
        lock.release()
    log.info("stopped%s", "" if drained else " with undelivered records")
    return 0


def lock_state_dir(config: Config, stop: threading.Event) -> dir_lock.DirectoryLock:
    """Take SEE_STATE_DIR for this process before anything in it is read.

    A holder that is stopping (a service restarted while the old process drains) is waited
    for as long as its shutdown can take (``SEE_SHUTDOWN_TIMEOUT`` plus the watchdog's grace);
    one that is still there then is another exporter on the same directory:
    :class:`~scheduled_events_exporter.platforms.dir_lock.DirectoryBusy`."""
    assert config.state_dir is not None
    FILES.make_dirs(config.state_dir)
    wait = config.shutdown_timeout + SHUTDOWN_GRACE

    def waiting(holder: str) -> None:
        log.warning("state directory %s is held by another exporter (%s); waiting up to %g s "
                    "for it to stop", config.state_dir, holder or "holder unknown", wait)

    remote = dir_lock.remote_file_system(config.state_dir)
    if remote:
        log.warning("state directory %s is on a network file system (%s): after a crash its "
                    "lock can outlive the %g s a new exporter waits (an NFSv4 lease lasts about "
                    "90 s), and the new one then exits with code 3 until it expires; put "
                    "SEE_STATE_DIR on a local disk (docs/semantics.md, \"One exporter per state "
                    "directory\")", config.state_dir, remote, wait)
    return dir_lock.acquire(config.state_dir, wait=wait, waiting=waiting, sleep=stop.wait,
                            cancelled=stop.is_set)


#: Who answers each sink, in what a stop says of it.
_PEER = {"otlp": "the collector", "eventhubs": "the hub"}


def not_drained(status: SinkStatus, left: float, *, kept: bool) -> str:
    """What ``Exporter.stop`` says of a sink that still held records when its drain ended,
    ``left`` seconds before the drain's deadline: what kept them, as it was.

    A worker sends nothing before a pause ends (the peer's requested one, or our backoff after
    failures), so a pause that outlasts the time left ends the drain at once (within
    milliseconds of "draining sinks"): that is said with the pause, not as a timeout that was
    never waited for (``DeliveryWorker.flush``)."""
    where = ("they are kept in the spool and delivered, in order, after the restart" if kept
             else "they are lost (SEE_STATE_DIR is empty: no spool)")
    what = f"sink {status.name}: {status.pending} records not delivered"
    if status.paused_for > 0 and status.paused_for >= left:
        peer = _PEER.get(status.name, "the sink")
        if status.pause_asked:
            why = (f"{peer} asked for a pause of {status.pause_asked:g} s "
                   f"({status.paused_for:.1f} s of it still to run), longer than the "
                   f"shutdown timeout left")
        else:
            failed = status.consecutive_failures
            why = (f"the next attempt was not due before the shutdown timeout (in "
                   f"{status.paused_for:.1f} s, the backoff after {failed} failed "
                   f"attempt{'s' if failed != 1 else ''}"
                   f"{f'; last: {status.last_error}' if status.last_error else ''})")
        return f"{what}: {why}, so the drain did not wait for it; {where}"
    if status.last_error:
        return (f"{what} before the shutdown timeout, still failing (last: "
                f"{status.last_error}); {where}")
    return f"{what} before the shutdown timeout (still being sent); {where}"
