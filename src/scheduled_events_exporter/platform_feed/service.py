"""Assembly of the ``platform`` command: its state directory and lock, sinks, telemetry, health
and loop, as ``app`` assembles ``run``'s.

Its files live in ``SEE_STATE_DIR/platform/`` (state, spools, dead letters, lock): a sidecar
and a platform process may share one SEE_STATE_DIR without meeting, and ``redeliver`` works on
that subdirectory (``SEE_STATE_DIR=.../platform scheduled-events-exporter redeliver``).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace

from scheduled_events_exporter import __version__
from scheduled_events_exporter.app import (
    EXIT_STATE_DIR_BUSY,
    SHUTDOWN_GRACE,
    LoggingSink,
    exit_if_stuck,
    lock_state_dir,
)
from scheduled_events_exporter.config import Config
from scheduled_events_exporter.delivery import start
from scheduled_events_exporter.delivery.dead_letter import DeadLetterFile
from scheduled_events_exporter.health import HealthInputs, HealthServer
from scheduled_events_exporter.model import InstanceInfo
from scheduled_events_exporter.platform_feed.loop import LoopSettings, PlatformLoop, Rows
from scheduled_events_exporter.platform_feed.queue import QueueAddress, StorageQueue
from scheduled_events_exporter.platform_feed.resource_graph import ResourceGraph
from scheduled_events_exporter.platforms import dir_lock
from scheduled_events_exporter.platforms import stop as stop_requests
from scheduled_events_exporter.poller import Clock
from scheduled_events_exporter.sinks import Sink, create_sinks
from scheduled_events_exporter.state import NewerStateFile, StateStore
from scheduled_events_exporter.telemetry import Telemetry, build_resource
from scheduled_events_exporter.tracker import PlatformState
from scheduled_events_exporter.write_faults import WriteFault

log = logging.getLogger("scheduled_events_exporter")

#: The platform command's subdirectory of SEE_STATE_DIR.
SUBDIRECTORY = "platform"


def platform_config(config: Config) -> Config:
    """``config`` with the state directory the platform command uses."""
    assert config.state_dir is not None  # config.load_config(command="platform") says so
    return replace(config, state_dir=config.state_dir / SUBDIRECTORY)


class PlatformService:
    """A running platform command: its loop thread, sinks, telemetry and probes."""

    def __init__(self, config: Config, clock: Clock | None = None) -> None:
        """``config``: with the platform's state directory (:func:`platform_config`)."""
        assert config.state_dir is not None
        self.config = config
        settings = config.platform
        self.clock = clock or Clock()
        self.sinks: list[Sink] = create_sinks(config, self._count_failure)
        self._telemetry: Telemetry | None = None
        readers = [r for s in self.sinks for r in s.metric_readers()]
        self.scrape = None
        if "prometheus" in config.metrics_exporters:
            from scheduled_events_exporter.scrape import ScrapeEndpoint

            self.scrape = ScrapeEndpoint(*config.prometheus_addr)
            readers.extend(self.scrape.metric_readers())
        # No VM of its own: the resource says which service it is; each record says its VM.
        self.telemetry = Telemetry(readers=readers, resource=build_resource(InstanceInfo()),
                                   wall=self.clock.wall, monotonic=self.clock.monotonic)
        self._telemetry = self.telemetry
        self.store = StateStore(config.state_dir)
        persisted = self.store.load()
        # The start in its one order, as the sidecar's (delivery/start.py).
        begun = start.begin(config.state_dir, persisted, [s.delivery for s in self.sinks],
                            self.clock.wall(), self.clock.monotonic)
        self.pending_request = begun.pending
        for sink in self.sinks:  # their threads, now that the start decided what waits
            sink.start(self.telemetry.resource, self.telemetry.per_event_metrics)
        state = persisted.platform if persisted and persisted.platform else PlatformState()
        if persisted:
            log.info("platform state restored: %d pending events, %d ended, %d delivery ids "
                     "remembered", len(state.events), len(state.ended), len(state.deliveries))
        self.queue = StorageQueue(QueueAddress(settings.queue_url,
                                               settings.queue_connection_string,
                                               settings.queue_name))

        def graph() -> Rows:
            return ResourceGraph(settings.graph_endpoint, settings.subscriptions,
                                 wait=self._stopping.wait)

        self._stopping = threading.Event()
        self.loop = PlatformLoop(
            LoopSettings(settings.poll_interval, settings.visibility_timeout,
                         settings.max_dequeue),
            self.queue, self.sinks, self.telemetry, self.store, DeadLetterFile(config.state_dir),
            state=state, seq=begun.seq, clock=self.clock, observers=[LoggingSink()],
            graph=graph, outbox=persisted.outbox if persisted else (),
            pending_request=begun.pending,
            metrics_changed=self._metrics_changed,
            unknown_fields=persisted.unknown_fields if persisted else ())
        self._thread: threading.Thread | None = None
        self.health: HealthServer | None = None
        if config.health_addr is not None:
            self.health = HealthServer(config.health_addr, HealthInputs(
                last_tick=lambda: self.loop.last_tick_monotonic,
                next_tick_deadline=lambda: self.loop.next_tick_deadline,
                loop_alive=lambda: self._thread is None or self._thread.is_alive(),
                started=time.monotonic(),
                last_good=lambda: self.loop.last_good_monotonic,
                last_outcome=lambda: self.loop.last_outcome,
                sink_status=lambda: [s.status() for s in self.sinks],
                poll_interval=settings.poll_interval,
                request_timeout=40.0,
                staleness_limit=max(config.staleness_limit, 3 * settings.poll_interval),
                write_faults=self._state_faults,
                includes=config.readiness_includes,
                source="platform queue",
            ))

    def start(self, *, backfill: bool, once: bool = False) -> None:
        """Start the loop thread (a backfill first when asked; ``once``: only that)."""
        log.info("scheduled-events-exporter %s platform: reading %s%s; records to: %s; "
                 "state: %s", __version__, self.queue.address.describe(),
                 " after a Resource Graph backfill" if backfill else "",
                 ", ".join(self.config.sinks), self.config.state_dir)
        self._thread = threading.Thread(
            target=self.loop.run, args=(self._stopping,),
            kwargs={"backfill": backfill, "once": once}, name="platform", daemon=True)
        self._thread.start()
        if self.scrape is not None:
            self.scrape.start(self.telemetry.per_event_metrics)
        if self.health is not None:
            self.health.start()

    def wait(self, stop: threading.Event) -> None:
        """Until ``stop`` is set, or the loop ended by itself (a one-shot backfill)."""
        while not stop.is_set() and self._thread is not None and self._thread.is_alive():
            stop.wait(0.5)

    def stop(self) -> bool:
        """Stop reading, drain the sinks within the shutdown timeout; True if all drained."""
        deadline = time.monotonic() + self.config.shutdown_timeout
        drain_deadline = deadline - min(1.0, self.config.shutdown_timeout / 10)
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=max(0.0, drain_deadline - time.monotonic()))
        drained = True
        for sink in self.sinks:
            if not sink.shutdown(max(0.0, drain_deadline - time.monotonic())):
                log.warning("sink %s: %d records not delivered before the shutdown timeout; "
                            "they are kept in the spool and delivered after the restart",
                            sink.name, sink.status().pending)
                drained = False
        if self.scrape is not None:
            self.scrape.stop()
        self.telemetry.shutdown(max(0.2, deadline - time.monotonic()))
        if self.health is not None:
            self.health.stop()
        self.queue.close()
        return drained

    def _metrics_changed(self) -> None:
        for sink in self.sinks:
            sink.metrics_changed()

    def _state_faults(self) -> tuple[WriteFault, ...]:
        fault = self.store.fault
        return (fault,) if fault else ()

    def _count_failure(self, sink: str, signal: str, count: int) -> None:
        if self._telemetry is not None:
            self._telemetry.record_export_failure(sink, signal, count)


def run(config: Config, stop: threading.Event, finished: threading.Event | None = None,
        *, backfill_only: bool = False) -> int:
    """The platform command until ``stop`` (``backfill_only``: one backfill, then exit)."""
    # The Azure SDK logs every request and answer at INFO, and the credential chain a block of
    # WARNING lines at every failed token request; failures are said by the loop, once per
    # streak, with the chain's own words.
    logging.getLogger("azure").setLevel(logging.WARNING)
    logging.getLogger("azure.identity").setLevel(logging.ERROR)
    config = platform_config(config)
    assert config.state_dir is not None
    try:
        lock = lock_state_dir(config, stop)
    except dir_lock.DirectoryBusy as busy:
        log.error("cannot start: %s; one platform process per state directory%s (exit code %d)",
                  busy, ": stop it, or set SEE_PLATFORM_BACKFILL=start to backfill at its "
                  "start" if backfill_only else "", EXIT_STATE_DIR_BUSY)
        return EXIT_STATE_DIR_BUSY
    except OSError as exc:
        log.error("cannot start: state directory %s: %s", config.state_dir, exc)
        return 1
    try:
        service = PlatformService(config)
    except (OSError, NewerStateFile, ValueError) as exc:
        log.error("cannot start: %s", exc)
        lock.release()
        return 1
    service.start(backfill=backfill_only or config.platform.backfill == "start",
                  once=backfill_only)
    if backfill_only:
        service.wait(stop)
    else:
        stop_requests.wait_for(stop)
    exit_if_stuck(config.shutdown_timeout + SHUTDOWN_GRACE, True)
    log.info("stopping: draining sinks (up to %g s)", config.shutdown_timeout)
    try:
        drained = service.stop()
    finally:
        if finished is not None:
            finished.set()
    lock.release()
    log.info("stopped%s", "" if drained else " with undelivered records")
    return 0

