"""gRPC channels exist only around exports, so an idle exporter runs none of gRPC's threads.

This is the regression guard of the gRPC route's idle cost (the figures are in BENCHMARKS.md,
measured by ``bench/routes.py``): gRPC's own threads (timer manager, lifeguard, thread-pool
workers) wake several times a second while any channel is open. The guard is structural, not
timed: once the channel's linger has passed, no gRPC thread exists in the process, and the
next change still reaches the collector over a reopened channel.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduled_events_exporter.simulator import Simulator
from scheduled_events_exporter.sinks.grpc_channel import LINGER, ChannelKeeper
from tests.exporter_process import ExporterProcess, clean_env, state_dir, wait_until
from tests.peers.rotel import RotelReceiver

#: Thread names the gRPC core gives its own threads (``/proc/<pid>/task/<tid>/comm``).
GRPC_THREADS = ("grpc_global_tim", "event_engine", "lifeguard")
P = "azure.scheduled_event."


class Channel:
    """What a keeper opens and closes, with the counts a test looks at."""

    def __init__(self) -> None:
        self.opened = 0
        self.closed = 0
        self.open_now = False

    def open(self) -> None:
        assert not self.open_now, "opened twice without a close"
        self.opened += 1
        self.open_now = True

    def close(self) -> None:
        assert self.open_now, "closed while not open"
        self.closed += 1
        self.open_now = False


def test_keeper_opens_at_the_first_export_and_closes_after_the_linger() -> None:
    channel = Channel()
    keeper = ChannelKeeper(channel.open, channel.close, linger=0.2)
    assert channel.opened == 0  # nothing until there is something to export
    assert keeper.export(lambda: channel.open_now) is True
    wait_until(lambda: channel.closed == 1, 5, "the idle channel closed")
    assert keeper.export(lambda: "second") == "second"
    assert channel.opened == 2
    wait_until(lambda: channel.closed == 2, 5, "closed again")


def test_keeper_keeps_one_channel_through_a_burst() -> None:
    channel = Channel()
    keeper = ChannelKeeper(channel.open, channel.close, linger=0.5)
    end = time.monotonic() + 1.5  # three lingers' worth of exports, one every 50 ms
    while time.monotonic() < end:
        keeper.export(lambda: None)
        time.sleep(0.05)  # the exports' own pace, not a wait for something to happen
    assert (channel.opened, channel.closed) == (1, 0)
    wait_until(lambda: channel.closed == 1, 5, "closed after the burst")


def test_keeper_never_closes_during_an_export() -> None:
    # A linger far shorter than an export: the closing timer fires again and again while
    # exports run on two threads. Every close must fall between exports.
    channel = Channel()
    running = [0]
    overlaps: list[int] = []
    guard = threading.Lock()

    def close() -> None:
        with guard:
            if running[0]:
                overlaps.append(running[0])
        channel.close()

    keeper = ChannelKeeper(channel.open, close, linger=0.0005)

    def export() -> None:
        with guard:
            running[0] += 1
        assert channel.open_now
        time.sleep(0.001)  # the export's own work
        with guard:
            running[0] -= 1

    def exports() -> None:
        for i in range(150):
            keeper.export(export)
            if i % 3 == 0:
                time.sleep(0.003)  # now and then a gap longer than the linger: a close

    workers = [threading.Thread(target=exports) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)
    wait_until(lambda: not channel.open_now, 5, "the last channel closed")
    assert overlaps == [] and channel.opened == channel.closed > 1, (overlaps, channel.opened)


def test_keeper_closes_at_once_when_discarded_or_stopped_and_reopens_only_when_discarded(
) -> None:
    channel = Channel()
    keeper = ChannelKeeper(channel.open, channel.close, linger=60)
    keeper.export(lambda: None)
    keeper.discard()  # what an UNAVAILABLE answer does: the next export connects afresh
    assert (channel.opened, channel.closed) == (1, 1)
    keeper.export(lambda: None)
    assert channel.opened == 2 and channel.open_now
    keeper.stop()
    assert channel.closed == 2 and not channel.open_now
    assert keeper.export(lambda: "after stop") == "after stop"  # runs, opens nothing
    assert channel.opened == 2


def test_keeper_survives_a_raising_export() -> None:
    channel = Channel()
    keeper = ChannelKeeper(channel.open, channel.close, linger=0.1)

    def boom() -> None:
        raise RuntimeError("export bug")

    with pytest.raises(RuntimeError):
        keeper.export(boom)
    wait_until(lambda: channel.closed == 1, 5, "closed after a raising export")


# --- the real process over gRPC to a real collector ------------------------------------------


@pytest.fixture
def rotel() -> Iterator[RotelReceiver]:
    with RotelReceiver() as receiver:
        yield receiver


def grpc_threads(pid: int) -> list[str]:
    names = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as handle:
                names.append(handle.read().strip())
        except OSError:
            continue  # the thread ended while we listed
    return [name for name in names if name.startswith(GRPC_THREADS)]


def freeze(status: str) -> dict[str, object]:
    return {
        "EventId": "C7061BAC-AFDC-4513-B24B-AA5F13A16123", "EventStatus": status,
        "EventType": "Freeze", "ResourceType": "VirtualMachine", "Resources": ["vm-g"],
        "NotBefore": "" if status == "Started" else "Mon, 11 Apr 2099 22:26:58 GMT",
        "Description": "", "EventSource": "Platform", "DurationInSeconds": 5,
    }


@pytest.mark.timeout(120)
def test_idle_exporter_runs_no_grpc_thread_and_reopens_for_the_next_change(
    rotel: RotelReceiver, tmp_path: Path
) -> None:
    service = f"see-grpc-{tmp_path.name}"
    with Simulator(vm_name="vm-g") as sim:
        env = clean_env(
            SEE_IMDS_ENDPOINT=sim.url, SEE_SINKS="otlp", SEE_STATE_DIR=state_dir(tmp_path),
            SEE_HEALTH_ADDR="", SEE_POLL_INTERVAL="0.5",
            OTEL_EXPORTER_OTLP_ENDPOINT=rotel.grpc_endpoint, OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
            OTEL_SERVICE_NAME=service,  # metrics on change and every 60 s: the default
        )
        with ExporterProcess(env) as proc:
            pid = proc.proc.pid
            sim.set_events([freeze("Scheduled")])
            ours = lambda r: r.resource.get("service.name") == service  # noqa: E731
            rotel.wait_for_logs(ours, count=1, timeout=30)
            wait_until(lambda: not grpc_threads(pid), LINGER + 20,
                       f"gRPC threads gone once idle (left: {grpc_threads(pid)})")
            # Idle now: polling goes on (four more polls), and nothing of gRPC's runs.
            assert sim.wait_for_requests(len(sim.requests) + 4, timeout=20)
            assert grpc_threads(pid) == []

            sim.set_events([freeze("Started")])
            logs = rotel.wait_for_logs(ours, count=2, timeout=30)
            assert [r.event_name for r in logs] == [P + "scheduled", P + "started"]
            metric = rotel.wait_for_metric(
                "azure.scheduled_events.pending",
                lambda m: m.resource.get("service.name") == service
                and m.arrival_time >= logs[-1].arrival_time - 1, timeout=30)
            assert metric.points
            wait_until(lambda: not grpc_threads(pid), LINGER + 20, "gRPC threads gone again")
            assert proc.terminate() == 0
        assert "error" not in proc.stderr().lower(), proc.stderr()[-2000:]
