"""Fleet simulation: many exporters at their defaults, one collector, one Event Hubs peer.

Setup: one :class:`~scheduled_events_exporter.simulator.fleet.Fleet` serves every VM's IMDS
from this process (each VM its own loopback port, name and vmId); one real ``rotel`` collector
(OTLP http/protobuf) and one AMQP 1.0 peer (two hubs: transitions and metrics) receive
everything. Each exporter is the real process with ``SEE_SINKS=otlp,eventhubs`` and nothing
else changed from the defaults (1 s polls, OTLP metrics on change + every 60 s, Event Hubs
snapshots on change + every 300 s to ``SEE_EVENTHUB_METRICS_NAME``). A smaller **baseline**
group runs in the same session with today's behaviour restored by environment overrides
(``OTEL_METRIC_EXPORT_INTERVAL=10000``, ``SEE_EVENTHUB_HEARTBEAT=10``, snapshots on the
transitions hub).

Phase 1, idle (``--idle`` s, default 300): messages, body bytes, OTLP data points and export
requests, log records per VM-hour, counted at the receivers for arrivals inside the window;
CPU (``utime + stime``) and RSS per exporter.

Phase 2, a maintenance wave: every VM gets a Freeze ``Scheduled`` in one loop over the VMs
(well within a second), then ``Started``, then the event is removed. Per step and path:
delivery completeness (distinct RecordIds / VMs; duplicates = deliveries − distinct), and the
delay from each VM's change to its record (log record at rotel, transition message at the
peer) and to the first metrics showing it (``pending`` at rotel, a snapshot at the peer).

``python bench/fleet.py [--vms 200] [--baseline 20] [--idle 300] [--quick]``
"""

from __future__ import annotations

import argparse
import json
import resource
import select
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from benchlib import (
    ExporterProcess,
    SummaryRow,
    cpu_seconds,
    exporter_env,
    median,
    new_id,
    percentile,
    print_table,
    rss_mib,
    save_results,
    temp_state_dir,
)
from proton import _io as proton_io

from scheduled_events_exporter.simulator.fleet import Fleet
from tests.peers.amqp_peer import AmqpPeer, ReceivedMessage
from tests.peers.rotel import ReceivedMetric, RotelReceiver


def poll_select(r: list[Any], w: list[Any], x: list[Any],
                timeout: float | None = None) -> tuple[list[Any], list[Any], list[Any]]:
    """``select.select`` on ``poll``: this process holds more than 1024 descriptors (every VM's
    port and connections, every exporter's pipes), which ``select`` cannot watch. Qpid Proton's
    reactor (the AMQP peer) uses ``select`` through ``proton._io.IO.select``."""
    poller = select.poll()
    masks: dict[int, int] = defaultdict(int)
    for obj in r:
        masks[obj.fileno()] |= select.POLLIN | select.POLLPRI
    for obj in (*w, *x):
        masks[obj.fileno()] |= select.POLLOUT
    for fd, mask in masks.items():
        poller.register(fd, mask)
    ready = dict(poller.poll(None if timeout is None else max(0.0, timeout) * 1000))
    bad = select.POLLERR | select.POLLHUP | select.POLLNVAL
    readable = [o for o in r if ready.get(o.fileno(), 0) & (select.POLLIN | select.POLLPRI | bad)]
    writable = [o for o in w if ready.get(o.fileno(), 0) & (select.POLLOUT | bad)]
    broken = [o for o in x if ready.get(o.fileno(), 0) & bad]
    return readable, writable, broken


proton_io.IO.select = staticmethod(poll_select)  # type: ignore[method-assign,assignment]

EVENTS_HUB, METRICS_HUB = "scheduled-events", "scheduled-events-metrics"
PENDING = "azure.scheduled_events.pending"
UID = "log.record.uid"
ID_ATTR = "azure.scheduled_event.id"
BUDGET = {"eh_messages": 60, "eh_kb": 30, "otlp_points": 1000, "logs": 0}


@dataclass
class Arrival:
    """One Event Hubs message with the time this process saw it arrive."""

    time: float
    message: ReceivedMessage
    body: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.message.application_properties.get("RecordKind", ""))


class PeerClock:
    """Stamps every message the AMQP peer receives with its arrival time (the peer keeps none)."""

    def __init__(self, peer: AmqpPeer) -> None:
        self._peer = peer
        self.items: list[Arrival] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        seen = 0
        while not self._stop.is_set():
            if not self._peer.wait_for(seen + 1, 0.2):
                continue
            now = time.time()
            fresh = self._peer.received[seen:]
            seen += len(fresh)
            self.items.extend(Arrival(now, m, json.loads(m.body)) for m in fresh)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Vm:
    """One simulated VM and its exporter."""

    name: str
    baseline: bool
    proc: ExporterProcess
    changes: dict[str, float] = field(default_factory=dict)  # step -> wall time of the change

    @property
    def group(self) -> str:
        return "baseline" if self.baseline else "fleet"


def freeze(event_id: str, vm: str, status: str) -> dict[str, object]:
    not_before = "" if status == "Started" else time.strftime(
        "%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 600))
    return {"EventId": event_id, "EventStatus": status, "EventType": "Freeze",
            "ResourceType": "VirtualMachine", "Resources": [vm], "NotBefore": not_before,
            "Description": "Virtual machine is being paused because of a memory-preserving "
            "Live Migration operation.", "EventSource": "Platform", "DurationInSeconds": 5}


# --- what the receivers saw -----------------------------------------------------------------


def otlp_pending_shows(step: str) -> Callable[[ReceivedMetric], bool]:
    def check(metric: ReceivedMetric) -> bool:
        if metric.name != PENDING:
            return False
        if step == "removed":
            return any(p.value == 0 and not p.attributes for p in metric.points)
        status = "Scheduled" if step == "scheduled" else "Started"
        return any(p.attributes.get("type") == "Freeze" and p.attributes.get("status") == status
                   for p in metric.points)
    return check


def snapshot_shows(step: str, body: dict[str, Any]) -> bool:
    points = body.get("Metrics", {}).get(PENDING)
    if points is None:
        return False
    if step == "removed":
        return any(p.get("value") == 0 and not p.get("attributes") for p in points)
    status = "Scheduled" if step == "scheduled" else "Started"
    return any(p.get("attributes", {}).get("type") == "Freeze"
               and p.get("attributes", {}).get("status") == status for p in points)


TRANSITION = {"scheduled": "scheduled", "started": "started", "removed": "completed"}


def delivered(step: str, vms: list[Vm], rotel: RotelReceiver, clock: PeerClock,
              ) -> dict[str, dict[str, float]]:
    """First arrival after each VM's change, per path: ``{path: {vm: delay}}``."""
    out: dict[str, dict[str, float]] = defaultdict(dict)
    transition = TRANSITION[step]
    by_name = {vm.name: vm for vm in vms}
    shows = otlp_pending_shows(step)
    for log in rotel.logs:
        vm = by_name.get(str(log.resource.get("host.name")))
        if vm and log.event_name == f"azure.scheduled_event.{transition}" \
                and vm.name not in out["otlp log"]:
            out["otlp log"][vm.name] = log.arrival_time - vm.changes[step]
    for metric in rotel.metrics:
        vm = by_name.get(str(metric.resource.get("host.name")))
        if vm and vm.name not in out["otlp metrics"] and step in vm.changes \
                and metric.arrival_time >= vm.changes[step] and shows(metric):
            out["otlp metrics"][vm.name] = metric.arrival_time - vm.changes[step]
    for item in list(clock.items):
        vm = by_name.get(str(item.body.get("VmName")))
        if vm is None or step not in vm.changes:
            continue
        if item.kind == "transition" and item.body.get("Transition") == transition:
            out["eh transition"].setdefault(vm.name, item.time - vm.changes[step])
        elif item.kind == "metrics" and item.time >= vm.changes[step] \
                and snapshot_shows(step, item.body):
            out["eh metrics"].setdefault(vm.name, item.time - vm.changes[step])
    return out


def completeness(step: str, vms: list[Vm], rotel: RotelReceiver, clock: PeerClock,
                 ) -> dict[str, dict[str, int]]:
    """Per group and path: VMs expected, distinct RecordIds delivered, duplicates."""
    transition = TRANSITION[step]
    groups = {vm.name: vm.group for vm in vms}
    ids: dict[tuple[str, str], list[str]] = defaultdict(list)
    for log in rotel.logs:
        group = groups.get(str(log.resource.get("host.name")))
        if group and log.event_name == f"azure.scheduled_event.{transition}":
            ids[(group, "otlp")].append(str(log.attributes.get(UID)))
    for item in clock.items:
        group = groups.get(str(item.body.get("VmName")))
        if group and item.kind == "transition" and item.body.get("Transition") == transition:
            ids[(group, "eventhubs")].append(str(item.body.get("RecordId")))
    out: dict[str, dict[str, int]] = {}
    for group in ("fleet", "baseline"):
        expected = sum(1 for vm in vms if vm.group == group)
        for path in ("otlp", "eventhubs"):
            got = ids[(group, path)]
            out[f"{group} {path}"] = {"expected": expected, "distinct": len(set(got)),
                                     "duplicates": len(got) - len(set(got))}
    return out


def idle_volume(vms: list[Vm], rotel: RotelReceiver, clock: PeerClock, t0: float,
                t1: float) -> dict[str, dict[str, float]]:
    """Per group: per-VM-hour figures for arrivals in ``[t0, t1)``."""
    hours = (t1 - t0) / 3600
    groups = {vm.name: vm.group for vm in vms}
    sizes = {g: sum(1 for vm in vms if vm.group == g) for g in ("fleet", "baseline")}
    points: dict[str, int] = defaultdict(int)
    metrics: dict[str, int] = defaultdict(int)
    requests: dict[str, set[tuple[str, float]]] = defaultdict(set)
    for metric in rotel.metrics:
        group = groups.get(str(metric.resource.get("host.name")))
        if group and t0 <= metric.arrival_time < t1:
            points[group] += len(metric.points)
            metrics[group] += 1
            # One export request prints all its metrics within milliseconds.
            requests[group].add((str(metric.resource.get("host.name")),
                                 round(metric.arrival_time, 0)))
    logs: dict[str, int] = defaultdict(int)
    for log in rotel.logs:
        group = groups.get(str(log.resource.get("host.name")))
        if group and t0 <= log.arrival_time < t1:
            logs[group] += 1
    messages: dict[str, int] = defaultdict(int)
    body_bytes: dict[str, int] = defaultdict(int)
    transitions: dict[str, int] = defaultdict(int)
    for item in clock.items:
        group = groups.get(str(item.body.get("VmName")))
        if group and t0 <= item.time < t1:
            messages[group] += 1
            body_bytes[group] += len(item.message.body)
            transitions[group] += item.kind == "transition"
    out = {}
    for group, size in sizes.items():
        if not size:
            continue
        scale = 1 / (size * hours)
        out[group] = {
            "vms": size,
            "eh_messages": messages[group] * scale,
            "eh_bytes": body_bytes[group] * scale,
            "eh_transitions": transitions[group] * scale,
            "eh_mean_body": body_bytes[group] / messages[group] if messages[group] else 0.0,
            "otlp_points": points[group] * scale,
            "otlp_metrics": metrics[group] * scale,
            "otlp_requests": len(requests[group]) * scale,
            "logs": logs[group] * scale,
        }
    return out


def cpu_rss(vms: list[Vm], cpu0: dict[str, float], seconds: float) -> dict[str, dict[str, float]]:
    """Median / max % of a core over the window, and RSS now, per group."""
    out = {}
    for group in ("fleet", "baseline"):
        members = [vm for vm in vms if vm.group == group]
        if not members:
            continue
        cpu = [(cpu_seconds(vm.proc.proc.pid) - cpu0[vm.name]) / seconds * 100 for vm in members]
        rss = [rss_mib(vm.proc.proc.pid) for vm in members]
        out[group] = {"cpu_median": median(cpu), "cpu_max": max(cpu), "rss_median": median(rss),
                      "rss_max": max(rss)}
    return out


def extrapolate(per_vm_hour: dict[str, float], vms: int = 10_000) -> dict[str, float]:
    """On paper: a fleet of ``vms`` idle VMs."""
    month = 730  # hours
    msgs_per_s = per_vm_hour["eh_messages"] * vms / 3600
    bytes_per_s = per_vm_hour["eh_bytes"] * vms / 3600
    return {
        "eh_messages_per_s": msgs_per_s,
        # A throughput unit: 1 MB/s or 1000 events/s ingress, whichever comes first.
        "eh_throughput_units": max(msgs_per_s / 1000, bytes_per_s / 1e6),
        "la_gb_per_month": per_vm_hour["eh_bytes"] * vms * month / 1e9,
        "otlp_points_per_month": per_vm_hour["otlp_points"] * vms * month,
    }


# --- the run --------------------------------------------------------------------------------


def spawn(fleet: Fleet, rotel: RotelReceiver, peer: AmqpPeer, count: int,
          states: list[str], batch: int, vms: list[Vm]) -> None:
    """Start one exporter per VM into ``vms`` (the caller kills them whatever happens)."""
    for index, sim in enumerate(fleet.vms):
        is_base = index >= count
        env = exporter_env(
            sim.url, states[index],
            SEE_SINKS="otlp,eventhubs",
            OTEL_EXPORTER_OTLP_ENDPOINT=rotel.http_endpoint,
            SEE_EVENTHUB_CONNECTION_STRING=peer.connection_string(EVENTS_HUB),
            # Not the default 0.0.0.0:8080 (one port per host); 220 free-port picks race with
            # other processes, and the probes play no part in what is measured.
            SEE_HEALTH_ADDR="",
        )
        if is_base:  # today's behaviour, by environment overrides
            env.update(OTEL_METRIC_EXPORT_INTERVAL="10000", SEE_EVENTHUB_HEARTBEAT="10")
        else:
            env["SEE_EVENTHUB_METRICS_NAME"] = METRICS_HUB
        vms.append(Vm(sim.vm_name, is_base, ExporterProcess(env)))
        if len(vms) % batch == 0 or index == len(fleet.vms) - 1:
            # Imports cost ~0.3 s of CPU each: let a batch reach its first poll before the next.
            for waiting, vm_sim in zip(vms[-batch:], fleet.vms[index + 1 - len(vms[-batch:]):
                                                              index + 1], strict=True):
                if not vm_sim.wait_for_requests(1, 120, path_prefix="/metadata/scheduledevents"):
                    raise RuntimeError(f"{waiting.name}: no poll within 120 s: "
                                       f"{waiting.proc.stderr()[-500:]}")
            print(f"  {len(vms)} exporters polling", flush=True)


def wait_all(what: str, check: Callable[[], int], total: int, timeout: float) -> float:
    """Wait until ``check()`` reaches ``total``; returns the seconds it took."""
    start = time.monotonic()
    while (done := check()) < total:
        if time.monotonic() - start > timeout:
            print(f"  {what}: only {done}/{total} after {timeout:g} s", flush=True)
            return float("nan")
        time.sleep(0.25)
    return time.monotonic() - start


def run_wave(vms: list[Vm], fleet: Fleet, rotel: RotelReceiver, clock: PeerClock,
             spacing: float) -> dict[str, Any]:
    ids = {vm.name: new_id() for vm in vms}
    steps: dict[str, Any] = {}
    cpu0 = {vm.name: cpu_seconds(vm.proc.proc.pid) for vm in vms}
    wave_start = time.monotonic()
    for step, status in (("scheduled", "Scheduled"), ("started", "Started"), ("removed", None)):
        began = time.monotonic()
        for vm, sim in zip(vms, fleet.vms, strict=True):
            sim.set_events([] if status is None else [freeze(ids[vm.name], vm.name, status)])
            vm.changes[step] = time.time()
        spread = max(vm.changes[step] for vm in vms) - min(vm.changes[step] for vm in vms)
        print(f"  wave step {step}: {len(vms)} VMs changed within {spread:.3f} s", flush=True)
        paths = ("otlp log", "otlp metrics", "eh transition", "eh metrics")
        def arrived(step: str = step, paths: tuple[str, ...] = paths) -> int:
            found = delivered(step, vms, rotel, clock)
            return min(len(found.get(p, {})) for p in paths)

        took = wait_all(f"step {step}", arrived, len(vms), 90)
        delays = delivered(step, vms, rotel, clock)
        steps[step] = {"spread": spread, "all_delivered_after": took,
                       "delays": {p: dict(d) for p, d in delays.items()},
                       "completeness": completeness(step, vms, rotel, clock)}
        # The next step comes no sooner than ``spacing`` after this one.
        time.sleep(max(0.0, began + spacing - time.monotonic()))
    time.sleep(5)  # late duplicates would show up here
    for step in steps:
        steps[step]["completeness"] = completeness(step, vms, rotel, clock)
    seconds = time.monotonic() - wave_start
    return {"steps": steps, "cpu_rss": cpu_rss(vms, cpu0, seconds), "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--vms", type=int, default=200, help="exporters at the defaults")
    parser.add_argument("--baseline", type=int, default=20,
                        help="exporters with today's behaviour (env overrides)")
    parser.add_argument("--idle", type=float, default=300.0, help="idle window, seconds")
    parser.add_argument("--spacing", type=float, default=20.0, help="seconds between wave steps")
    parser.add_argument("--batch", type=int, default=10, help="exporters started at once")
    parser.add_argument("--quick", action="store_true", help="20 + 4 VMs, 60 s idle")
    args = parser.parse_args()
    if args.quick:
        args.vms, args.baseline, args.idle = 20, 4, 60.0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    total = args.vms + args.baseline
    print(f"fleet: {args.vms} exporters at the defaults + {args.baseline} baseline", flush=True)
    with Fleet(total) as fleet, RotelReceiver() as rotel, \
            AmqpPeer(hubs={EVENTS_HUB, METRICS_HUB}) as peer:
        clock = PeerClock(peer)
        states = [temp_state_dir() for _ in range(total)]
        dirs = [s.__enter__() for s in states]
        vms: list[Vm] = []
        try:
            started = time.monotonic()
            spawn(fleet, rotel, peer, args.vms, dirs, args.batch, vms)
            print(f"  all started in {time.monotonic() - started:.0f} s; settling", flush=True)
            names = {vm.name for vm in vms}
            wait_all("first exports", lambda: len(
                {str(m.resource.get("host.name")) for m in rotel.metrics} & names), total, 120)
            time.sleep(10)  # start-up exports and the last imports are over
            cpu0 = {vm.name: cpu_seconds(vm.proc.proc.pid) for vm in vms}
            t0 = time.time()
            print(f"  idle window: {args.idle:g} s", flush=True)
            time.sleep(args.idle)
            t1 = time.time()
            idle_cpu = cpu_rss(vms, cpu0, t1 - t0)
            volume = idle_volume(vms, rotel, clock, t0, t1)
            print("  maintenance wave", flush=True)
            wave = run_wave(vms, fleet, rotel, clock, args.spacing)
            errors = [vm.name for vm in vms if vm.proc.proc.poll() is not None]
            for vm in vms:  # all at once (a second SIGTERM would skip the graceful drain)
                vm.proc.proc.send_signal(signal.SIGTERM)
            exit_codes = [vm.proc.proc.wait(timeout=60) for vm in vms]
        finally:
            for vm in vms:
                if vm.proc.proc.poll() is None:
                    vm.proc.proc.kill()
                    vm.proc.proc.wait()
            clock.stop()
            for s in states:
                s.__exit__(None, None, None)
        peer_errors = [str(e) for e in peer.errors]
    report(args, volume, idle_cpu, wave, errors, exit_codes, peer_errors)


def report(args: argparse.Namespace, volume: dict[str, dict[str, float]],
           idle_cpu: dict[str, dict[str, float]], wave: dict[str, Any], died: list[str],
           exit_codes: list[int], peer_errors: list[str]) -> None:
    groups = [g for g in ("fleet", "baseline") if g in volume]
    print_table(
        f"Idle, per VM-hour at the receivers ({args.idle:g} s window)",
        ["group", "VMs", "EH messages", "EH body KB", "EH mean body B", "OTLP points",
         "OTLP metrics", "OTLP requests", "log records", "CPU % med", "CPU % max",
         "RSS MiB med", "RSS MiB max"],
        [[g, int(volume[g]["vms"]), volume[g]["eh_messages"], volume[g]["eh_bytes"] / 1000,
          volume[g]["eh_mean_body"], volume[g]["otlp_points"], volume[g]["otlp_metrics"],
          volume[g]["otlp_requests"], volume[g]["logs"], idle_cpu[g]["cpu_median"],
          idle_cpu[g]["cpu_max"], idle_cpu[g]["rss_median"], idle_cpu[g]["rss_max"]]
         for g in groups],
    )
    rows = []
    for step, data in wave["steps"].items():
        for path, delays in sorted(data["delays"].items()):
            for group in ("fleet", "baseline"):
                values = [d for vm, d in delays.items() if _group_of(vm, args) == group]
                if values:
                    rows.append([step, path, group, len(values), median(values),
                                 percentile(values, 99), max(values)])
    print_table("Wave: change -> first arrival (s)",
                ["step", "path", "group", "VMs", "p50", "p99", "max"], rows)
    comp_rows = [[step, key, c["expected"], c["distinct"], c["duplicates"]]
                 for step, data in wave["steps"].items()
                 for key, c in data["completeness"].items()]
    print_table("Wave: completeness (distinct RecordIds per step)",
                ["step", "group path", "expected", "distinct", "duplicates"], comp_rows)
    wc = wave["cpu_rss"]
    print_table(f"Wave: CPU over {wave['seconds']:.0f} s and RSS at the end, per exporter",
                ["group", "CPU % med", "CPU % max", "RSS MiB med", "RSS MiB max"],
                [[g, wc[g]["cpu_median"], wc[g]["cpu_max"], wc[g]["rss_median"],
                  wc[g]["rss_max"]] for g in groups])
    paper = {g: extrapolate(volume[g]) for g in groups}
    print_table("On paper: 10 000 idle VMs",
                ["group", "EH messages/s", "EH throughput units", "LA GB/month (bodies)",
                 "OTLP points/month"],
                [[g, paper[g]["eh_messages_per_s"], paper[g]["eh_throughput_units"],
                  paper[g]["la_gb_per_month"], paper[g]["otlp_points_per_month"]]
                 for g in groups])
    fleet = volume["fleet"]
    complete = all(c["distinct"] == c["expected"] and c["duplicates"] == 0
                   for data in wave["steps"].values() for c in data["completeness"].values())
    all_delays = [d for data in wave["steps"].values() for path, ds in data["delays"].items()
                  for vm, d in ds.items() if _group_of(vm, args) == "fleet"]
    metric_delays = [d for data in wave["steps"].values() for path, ds in data["delays"].items()
                     if "metrics" in path for vm, d in ds.items()
                     if _group_of(vm, args) == "fleet"]
    summary = [
        SummaryRow("fleet", "EH messages / idle VM-hour", "<= 60", f"{fleet['eh_messages']:.1f}",
                   f"baseline {volume.get('baseline', {}).get('eh_messages', float('nan')):.1f}",
                   "-", fleet["eh_messages"] <= BUDGET["eh_messages"]),
        SummaryRow("fleet", "EH body KB / idle VM-hour", "<= 30",
                   f"{fleet['eh_bytes'] / 1000:.1f}",
                   f"baseline {volume.get('baseline', {}).get('eh_bytes', 0) / 1000:.1f}", "-",
                   fleet["eh_bytes"] / 1000 <= BUDGET["eh_kb"]),
        SummaryRow("fleet", "OTLP data points / idle VM-hour", "<= 1000",
                   f"{fleet['otlp_points']:.0f}",
                   f"baseline {volume.get('baseline', {}).get('otlp_points', float('nan')):.0f}",
                   "-", fleet["otlp_points"] <= BUDGET["otlp_points"]),
        SummaryRow("fleet", "log records / idle VM-hour", "0", f"{fleet['logs']:.0f}", "-", "-",
                   fleet["logs"] == 0),
        SummaryRow("fleet", "wave delivery complete, 0 duplicates", "100 %",
                   "yes" if complete else "NO", "-", "-", complete),
        SummaryRow("fleet", "wave change -> metrics p50 / p99 (s)", "p99 <= 5",
                   f"{median(metric_delays):.2f} / {percentile(metric_delays, 99):.2f}",
                   f"all paths p99 {percentile(all_delays, 99):.2f}", "-",
                   percentile(metric_delays, 99) <= 5.0),
    ]
    save_results("fleet", {"quick": args.quick, "args": vars(args), "idle": volume,
                           "idle_cpu_rss": idle_cpu, "wave": wave, "paper": paper,
                           "exited_early": died, "exit_codes": exit_codes,
                           "peer_errors": peer_errors}, summary)
    print(f"exited early: {died}; non-zero exits: {sum(1 for c in exit_codes if c)}; "
          f"peer errors: {len(peer_errors)}")


def _group_of(vm: str, args: argparse.Namespace) -> str:
    index = int(vm.rsplit("-", 1)[1])
    return "baseline" if index >= args.vms else "fleet"


if __name__ == "__main__":
    main()
