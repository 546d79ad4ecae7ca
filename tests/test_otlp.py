"""The real exporter → a real OTLP collector (rotel), over http/protobuf and gRPC."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduled_events_exporter.simulator import Simulator
from tests.exporter_process import ExporterProcess, clean_env, state_dir
from tests.peers.rotel import ReceivedLog, RotelReceiver

VM = "WestNO_0"
EVENT_ID = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
FAR = "Mon, 11 Apr 2099 22:26:58 GMT"
P = "azure.scheduled_event."


def freeze(
    status: str = "Scheduled", not_before: str = FAR, event_id: str = EVENT_ID
) -> dict[str, Any]:
    return {
        "EventId": event_id,
        "EventStatus": status,
        "EventType": "Freeze",
        "ResourceType": "VirtualMachine",
        "Resources": [VM, "WestNO_1"],
        "NotBefore": not_before,
        "Description": "Virtual machine is being paused because of a memory-preserving Live "
        "Migration operation.",
        "EventSource": "Platform",
        "DurationInSeconds": 5,
    }


@pytest.fixture(scope="module")
def rotel() -> Iterator[RotelReceiver]:
    with RotelReceiver() as receiver:
        yield receiver


@pytest.fixture
def sim() -> Iterator[Simulator]:
    simulator = Simulator(vm_name=VM)
    simulator.start()
    yield simulator
    simulator.stop()


def otlp_env(sim: Simulator, rotel: RotelReceiver, tmp_path: Path, protocol: str) -> dict[str, str]:
    endpoint = rotel.grpc_endpoint if protocol == "grpc" else rotel.http_endpoint
    return clean_env(
        SEE_IMDS_ENDPOINT=sim.url,
        SEE_SINKS="otlp",
        SEE_STATE_DIR=state_dir(tmp_path),
        SEE_HEALTH_ADDR="",
        SEE_POLL_INTERVAL="0.5",
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
        OTEL_EXPORTER_OTLP_INSECURE="true",
        OTEL_METRIC_EXPORT_INTERVAL="1000",
        OTEL_SERVICE_NAME=f"see-test-{tmp_path.name}",
    )


def ours(rotel: RotelReceiver, tmp_path: Path) -> list[ReceivedLog]:
    return [r for r in rotel.logs if r.resource.get("service.name") == f"see-test-{tmp_path.name}"]


def wait_logs(
    rotel: RotelReceiver, tmp_path: Path, count: int, timeout: float = 20
) -> list[ReceivedLog]:
    service = f"see-test-{tmp_path.name}"
    return rotel.wait_for_logs(
        lambda r: r.resource.get("service.name") == service, count=count, timeout=timeout
    )


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
@pytest.mark.timeout(90)
def test_live_migration_sequence(
    sim: Simulator, rotel: RotelReceiver, tmp_path: Path, protocol: str
) -> None:
    with ExporterProcess(otlp_env(sim, rotel, tmp_path, protocol)) as proc:
        # Watched from an empty document on, so the notice is the whole notice (and counted).
        proc.wait_for(lambda: "first document received" in proc.stderr(), 30, "a first poll")
        sim.set_events([freeze()])
        wait_logs(rotel, tmp_path, 1)
        # While it is pending, the per-event gauges carry it.
        service = f"see-test-{tmp_path.name}"
        gauge = rotel.wait_for_metric(
            "azure.scheduled_events.time_to_not_before",
            lambda m: m.resource.get("service.name") == service and bool(m.points),
            timeout=20,
        )
        assert gauge.unit == "s" and gauge.kind == "Gauge"
        (point,) = gauge.points
        assert point.attributes == {P + "id": EVENT_ID, "type": "Freeze", "affects_self": True}
        assert point.value is not None and point.value > 1e9  # 2099 is far away
        sim.set_events([freeze("Started", "")])
        wait_logs(rotel, tmp_path, 2)
        sim.set_events([])
        logs = wait_logs(rotel, tmp_path, 3)
        # After the event ended, the per-event series is gone from later exports.
        rotel.wait_for_metric(
            "azure.scheduled_events.pending",
            lambda m: (
                m.resource.get("service.name") == service
                and len(m.points) == 1
                and m.points[0].attributes == {}
                and m.points[0].value == 0
            ),
            timeout=20,
        )
        pending_after = _latest(rotel, "azure.scheduled_events.time_to_not_before", service)
        assert (
            pending_after is None
            or pending_after.points == []
            or pending_after.arrival_time < logs[-1].arrival_time
        )
        assert proc.terminate() == 0

    scheduled, started, completed = logs
    assert [r.event_name for r in logs] == [P + "scheduled", P + "started", P + "completed"]
    assert [(r.severity_text, r.severity_number) for r in logs] == [
        ("WARN", 13),
        ("WARN", 13),
        ("INFO", 9),
    ]
    a = scheduled.attributes
    assert a[P + "id"] == EVENT_ID and a[P + "type"] == "Freeze" and a[P + "status"] == "Scheduled"
    assert a[P + "resources"] == [VM, "WestNO_1"] and a[P + "affects_self"] is True
    assert a[P + "duration"] == 5 and a[P + "source"] == "Platform"
    assert a[P + "not_before"] == "2099-04-11T22:26:58.000Z"
    assert isinstance(a[P + "notice"], float) and a[P + "notice"] > 0
    assert P + "previous_status" not in a and P + "observation_gap" not in a
    assert isinstance(a["log.record.uid"], str) and len(a["log.record.uid"]) == 36
    assert scheduled.body.startswith(
        "Freeze scheduled for WestNO_0, WestNO_1 not before 2099-04-11T22:26:58Z"
    )
    s = started.attributes
    assert s[P + "previous_status"] == "Scheduled" and s[P + "unannounced"] is False
    assert isinstance(s[P + "elapsed"], float)
    c = completed.attributes
    assert c[P + "observed_start"] is True and c[P + "status"] == "Completed"
    assert c[P + "previous_status"] == "Started"
    res = scheduled.resource
    assert res["cloud.provider"] == "azure" and res["cloud.platform"] == "azure.vm"
    assert res["host.name"] == VM and res["cloud.region"] == "westeurope"
    assert isinstance(res["host.id"], str) and res["host.id"]

    def counter(name: str) -> dict[tuple[tuple[str, object], ...], float | None]:
        metric = _latest(rotel, name, f"see-test-{tmp_path.name}")
        assert metric is not None, name
        return {tuple(sorted(p.attributes.items())): p.value for p in metric.points}

    transitions = counter("azure.scheduled_events.transitions")
    for kind in ("scheduled", "started", "completed"):
        key = (("source", "Platform"), ("transition", kind), ("type", "Freeze"))
        assert transitions[key] == 1.0, transitions
    requests = counter("azure.scheduled_events.imds.requests")
    assert requests[(("http.response.status_code", 200), ("outcome", "ok"))] >= 3
    units = {m.name: m.unit for m in ours_metrics(rotel, tmp_path)}
    assert units["azure.scheduled_events.notice"] == "s"
    assert units["azure.scheduled_events.imds.requests"] == "{request}"
    assert units["azure.scheduled_events.transitions"] == "{transition}"
    assert units["azure.scheduled_events.document_incarnation"] == "1"
    assert units["azure.scheduled_events.imds.staleness"] == "s"
    notice = _latest(rotel, "azure.scheduled_events.notice", f"see-test-{tmp_path.name}")
    assert notice is not None and notice.kind == "Histogram" and notice.points[0].count == 1


def ours_metrics(rotel: RotelReceiver, tmp_path: Path) -> list[Any]:
    return [
        m for m in rotel.metrics if m.resource.get("service.name") == f"see-test-{tmp_path.name}"
    ]


def _latest(rotel: RotelReceiver, name: str, service: str) -> Any:
    found = [
        m for m in rotel.metrics if m.name == name and m.resource.get("service.name") == service
    ]
    return found[-1] if found else None


@pytest.mark.timeout(60)
def test_hardware_failure_is_an_unannounced_error(
    sim: Simulator, rotel: RotelReceiver, tmp_path: Path
) -> None:
    reboot = {
        **freeze("Started", ""),
        "EventType": "Reboot",
        "DurationInSeconds": -1,
        "EventId": "HW-1",
        "Resources": [VM],
    }
    with ExporterProcess(otlp_env(sim, rotel, tmp_path, "http/protobuf")) as proc:
        wait_for_first_poll(sim)
        sim.set_events([reboot])
        wait_logs(rotel, tmp_path, 1)
        sim.set_events([])
        logs = wait_logs(rotel, tmp_path, 2)
        assert proc.terminate() == 0
    started, completed = logs
    assert started.event_name == P + "started" and started.severity_text == "ERROR"
    assert started.severity_number == 17 and started.attributes[P + "unannounced"] is True
    assert completed.event_name == P + "completed"
    assert completed.attributes[P + "observed_start"] is True


@pytest.mark.timeout(60)
def test_cancellation(sim: Simulator, rotel: RotelReceiver, tmp_path: Path) -> None:
    with ExporterProcess(otlp_env(sim, rotel, tmp_path, "http/protobuf")) as proc:
        wait_for_first_poll(sim)
        sim.set_events([freeze(event_id="CX-1")])
        wait_logs(rotel, tmp_path, 1)
        sim.set_events([])
        logs = wait_logs(rotel, tmp_path, 2)
        assert proc.terminate() == 0
    assert [r.event_name for r in logs] == [P + "scheduled", P + "cancelled"]
    cancelled = logs[1]
    assert cancelled.severity_text == "INFO" and cancelled.attributes[P + "status"] == "Cancelled"
    assert isinstance(cancelled.attributes[P + "elapsed"], float)


def wait_for_first_poll(sim: Simulator) -> None:
    assert sim.wait_for_requests(1, timeout=20, path_prefix="/metadata/scheduledevents")


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
@pytest.mark.timeout(60)
def test_histograms_are_exponential_when_the_variable_says_so(
    sim: Simulator, rotel: RotelReceiver, tmp_path: Path, protocol: str
) -> None:
    """OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION (Azure Monitor's OTLP guides
    recommend exponential histograms with delta temporality) reaches the collector as asked."""
    env = otlp_env(sim, rotel, tmp_path, protocol)
    env["OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION"] = (
        "base2_exponential_bucket_histogram")
    env["OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE"] = "delta"
    # Exemplars on: every point carries them, and the collector must still take the request.
    env["OTEL_METRICS_EXEMPLAR_FILTER"] = "always_on"
    service = f"see-test-{tmp_path.name}"
    with ExporterProcess(env) as proc:
        proc.wait_for(lambda: "first document received" in proc.stderr(), 30, "a first poll")
        sim.set_events([freeze()])
        wait_logs(rotel, tmp_path, 1)
        notice = rotel.wait_for_metric(
            "azure.scheduled_events.notice",
            lambda m: m.resource.get("service.name") == service and bool(m.points),
            timeout=20,
        )
        duration = rotel.wait_for_metric(
            "azure.scheduled_events.imds.duration",
            lambda m: m.resource.get("service.name") == service and bool(m.points),
            timeout=20,
        )
        assert proc.terminate() == 0
    assert (notice.kind, notice.temporality, notice.unit) == (
        "ExponentialHistogram", "AGGREGATION_TEMPORALITY_DELTA", "s")
    (point,) = notice.points
    assert point.count == 1 and point.sum is not None and point.sum > 1e9  # 2099 is far away
    assert point.bounds == ()  # no explicit buckets: the exponential ones instead
    assert sum(point.bucket_counts) == 1
    assert point.exemplars == 1  # the one recorded notice, as its exemplar
    assert duration.kind == "ExponentialHistogram"
    assert all(p.count and sum(p.bucket_counts) == p.count for p in duration.points)
