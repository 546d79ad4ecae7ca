"""The IMDS simulator, exercised over real loopback HTTP (docs/semantics.md#simulator). No mocks."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import pytest

from scheduled_events_exporter.simulator import Fault, Simulator
from scheduled_events_exporter.simulator.cli import main

SE = "/metadata/scheduledevents?api-version=2020-07-01"
INSTANCE = "/metadata/instance?api-version=2021-02-01"
META = {"Metadata": "true"}
EID = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
EID2 = "5F197CF0-33EF-48E4-9CE2-B8BEE551CD45"


@dataclass(frozen=True)
class Reply:
    status: int
    headers: Mapping[str, str]  # names lower-cased
    body: bytes

    def json(self) -> dict[str, object]:
        data = json.loads(self.body)
        assert isinstance(data, dict)
        return data


def connect(sim: Simulator) -> http.client.HTTPConnection:
    url = urlsplit(sim.url)
    return http.client.HTTPConnection(url.hostname or "", url.port, timeout=10)


def call(sim: Simulator, method: str = "GET", target: str = SE,
         headers: Mapping[str, str] = META, body: bytes | None = None,
         conn: http.client.HTTPConnection | None = None) -> Reply:
    c = connect(sim) if conn is None else conn
    c.request(method, target, body=body, headers=dict(headers))
    resp = c.getresponse()
    reply = Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    if conn is None:
        c.close()
    return reply


def event(event_id: str = EID, status: str = "Scheduled") -> dict[str, object]:
    return {"EventId": event_id, "EventStatus": status, "EventType": "Freeze",
            "ResourceType": "VirtualMachine", "Resources": ["vm-sim-0"],
            "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT" if status == "Scheduled" else "",
            "Description": "Host server is undergoing maintenance.", "EventSource": "Platform",
            "DurationInSeconds": 5}


@pytest.fixture
def sim() -> Iterator[Simulator]:
    with Simulator() as s:
        yield s


def test_initial_document_is_empty_with_incarnation_1(sim: Simulator) -> None:
    reply = call(sim)
    assert reply.status == 200
    assert reply.json() == {"DocumentIncarnation": 1, "Events": []}
    assert reply.headers["content-type"].startswith("application/json")
    assert reply.headers["content-length"] == str(len(reply.body))
    assert reply.headers["etag"].startswith('"') and reply.headers["etag"].endswith('"')


@pytest.mark.parametrize("headers", [{}, {"Metadata": "false"}, {"Metadata": ""}])
@pytest.mark.parametrize("method,target", [("GET", SE), ("POST", SE), ("GET", INSTANCE)])
def test_metadata_header_is_required(sim: Simulator, headers: dict[str, str], method: str,
                                     target: str) -> None:
    body = json.dumps({"StartRequests": [{"EventId": EID}]}).encode() if method == "POST" else None
    reply = call(sim, method, target, headers=headers, body=body)
    assert reply.status == 400
    assert reply.json() == {"error": "Bad request. Required metadata header not specified"}


def test_metadata_header_value_is_case_insensitive(sim: Simulator) -> None:
    assert call(sim, headers={"Metadata": "True"}).status == 200


def test_x_forwarded_for_is_rejected(sim: Simulator) -> None:
    reply = call(sim, headers={**META, "X-Forwarded-For": "10.0.0.9"})
    assert reply.status == 400
    assert "X-Forwarded-For" in str(reply.json()["error"])


@pytest.mark.parametrize("query,needle", [
    ("", "not specified"), ("?api-version=", "not specified"),
    ("?api-version=2021-02-01", "'2021-02-01' is invalid"), ("?api-version=latest", "invalid"),
])
def test_api_version_is_checked(sim: Simulator, query: str, needle: str) -> None:
    reply = call(sim, target="/metadata/scheduledevents" + query)
    assert reply.status == 400
    body = reply.json()
    assert needle in str(body["error"])
    assert "2020-07-01" in str(body["newest-versions"])


def test_older_api_versions_omit_later_fields(sim: Simulator) -> None:
    sim.set_events([event()])
    for version, absent in [("2020-07-01", set()), ("2019-08-01", {"DurationInSeconds"}),
                            ("2019-01-01", {"DurationInSeconds", "EventSource", "Description"}),
                            ("2017-11-01", {"DurationInSeconds", "EventSource", "Description"})]:
        reply = call(sim, target=f"/metadata/scheduledevents?api-version={version}")
        assert reply.status == 200, version
        events = reply.json()["Events"]
        assert isinstance(events, list) and len(events) == 1
        got: dict[str, object] = events[0]
        assert set(event()) - set(got) == absent, version


def test_unknown_paths_and_methods(sim: Simulator) -> None:
    assert call(sim, target="/metadata/nope?api-version=2020-07-01").status == 404
    assert call(sim, target="/").status == 404
    assert call(sim, "PUT", SE, body=b"{}").status == 405
    assert call(sim, "POST", INSTANCE, body=b"{}").status == 405


def test_etag_and_if_none_match(sim: Simulator) -> None:
    first = call(sim)
    etag = first.headers["etag"]
    again = call(sim, headers={**META, "If-None-Match": etag})
    assert again.status == 304
    assert again.body == b""
    assert again.headers["etag"] == etag
    for header in (f'W/{etag}', f'"other", {etag}', "*"):
        assert call(sim, headers={**META, "If-None-Match": header}).status == 304
    assert call(sim, headers={**META, "If-None-Match": '"stale"'}).status == 200
    sim.set_events([event()])
    changed = call(sim, headers={**META, "If-None-Match": etag})
    assert changed.status == 200
    assert changed.headers["etag"] != etag
    assert changed.json()["DocumentIncarnation"] == 2


def test_etag_differs_for_same_incarnation_with_other_content(sim: Simulator) -> None:
    sim.set_events([event()], incarnation=2)
    tag_a = call(sim).headers["etag"]
    sim.set_events([event(EID2)], incarnation=2)
    assert call(sim).headers["etag"] != tag_a


def test_set_events_incarnation_rules(sim: Simulator) -> None:
    assert sim.set_events([]) == 1  # unchanged list, unchanged incarnation
    assert sim.set_events([event()]) == 2
    assert sim.set_events([event()]) == 2
    assert sim.set_events([event(status="Started")]) == 3
    assert sim.set_events([], incarnation=1) == 1  # a reset goes backwards
    assert sim.incarnation == 1
    assert call(sim).json() == {"DocumentIncarnation": 1, "Events": []}


def test_events_property_is_a_copy(sim: Simulator) -> None:
    original = event()
    sim.set_events([original])
    original["EventStatus"] = "Started"  # the caller's object is detached
    copy = sim.events
    copy[0]["EventStatus"] = "Mangled"
    assert sim.events[0]["EventStatus"] == "Scheduled"


def test_set_events_rejects_values_json_cannot_carry(sim: Simulator) -> None:
    with pytest.raises(ValueError, match="JSON-serialisable"):
        sim.set_events([{"EventId": object()}])


def test_approval_starts_the_listed_event(sim: Simulator) -> None:
    sim.set_events([event(EID), event(EID2)])
    body = json.dumps({"StartRequests": [{"EventId": EID.lower()}]}).encode()
    reply = call(sim, "POST", SE, body=body)
    assert reply.status == 200
    doc = call(sim).json()
    assert doc["DocumentIncarnation"] == 3
    events = doc["Events"]
    assert isinstance(events, list)
    first: dict[str, object] = events[0]
    second: dict[str, object] = events[1]
    assert (first["EventId"], first["EventStatus"], first["NotBefore"]) == (EID, "Started", "")
    assert second["EventStatus"] == "Scheduled"
    assert call(sim, "POST", SE, body=body).status == 200  # approving again changes nothing
    assert sim.incarnation == 3


@pytest.mark.parametrize("body", [
    b"not json", b"{}", b"[]", b'{"StartRequests": []}', b'{"StartRequests": {}}',
    b'{"StartRequests": [{"Id": "x"}]}', b'{"StartRequests": [{"EventId": 5}]}',
    b'{"StartRequests": [{"EventId": "' + EID.encode() + b'"}, "x"]}',
    b'{"StartRequests": [{"EventId": "00000000-0000-0000-0000-000000000000"}]}', b"\xff\xfe",
])
def test_bad_approvals_are_400_and_change_nothing(sim: Simulator, body: bytes) -> None:
    sim.set_events([event()])
    reply = call(sim, "POST", SE, body=body)
    assert reply.status == 400
    assert "error" in reply.json()
    assert sim.incarnation == 2
    assert sim.events[0]["EventStatus"] == "Scheduled"


def test_status_faults_are_used_count_times(sim: Simulator) -> None:
    sim.push_fault(Fault("status", count=2))
    replies = [call(sim) for _ in range(3)]
    assert [r.status for r in replies] == [500, 500, 200]
    assert replies[0].json() == {"error": "Internal Server Error"}


def test_throttle_fault_sends_retry_after(sim: Simulator) -> None:
    sim.push_fault(Fault.throttled(retry_after=2))
    reply = call(sim)
    assert (reply.status, reply.headers["retry-after"]) == (429, "2")


def test_slow_fault_delays_the_real_answer(sim: Simulator) -> None:
    sim.push_fault(Fault.slow(0.3))
    began = time.monotonic()
    reply = call(sim)
    assert time.monotonic() - began >= 0.3
    assert reply.json() == {"DocumentIncarnation": 1, "Events": []}
    began = time.monotonic()
    call(sim)
    assert time.monotonic() - began < 0.25


@pytest.mark.parametrize("fault,content_type", [
    (Fault.html(), "text/html"), (Fault.truncated(), "application/json")])
def test_unparseable_body_faults(sim: Simulator, fault: Fault, content_type: str) -> None:
    sim.push_fault(fault)
    reply = call(sim)
    assert reply.status == 200
    assert reply.headers["content-type"] == content_type
    with pytest.raises(json.JSONDecodeError):
        json.loads(reply.body)
    assert call(sim).json()["DocumentIncarnation"] == 1


def test_wrong_types_fault(sim: Simulator) -> None:
    sim.push_fault(Fault.wrong_types())
    assert call(sim).json() == {"DocumentIncarnation": "x", "Events": {}}


def test_gone_window_lasts_its_duration_from_the_first_request(sim: Simulator) -> None:
    sim.push_fault(Fault.gone_for(0.4))
    first = time.monotonic()
    assert call(sim).status == 410
    deadline = first + 5
    status = 410
    while status == 410 and time.monotonic() < deadline:
        status = call(sim).status
        if status == 410:
            threading.Event().wait(0.02)  # a client's poll interval
    assert status == 200
    assert time.monotonic() - first >= 0.4


def test_faults_match_target_and_method_and_skip_invalid_requests(sim: Simulator) -> None:
    sim.set_events([event()])
    sim.push_fault(Fault("status", status=503, target="instance"))
    sim.push_fault(Fault("status", status=502, method="POST"))
    assert call(sim, headers={}).status == 400  # rejected before faults: none used up
    assert call(sim).status == 200
    assert call(sim, target=INSTANCE).status == 503
    assert call(sim, target=INSTANCE).status == 200
    body = json.dumps({"StartRequests": [{"EventId": EID}]}).encode()
    assert call(sim, "POST", SE, body=body).status == 502
    assert sim.events[0]["EventStatus"] == "Scheduled"
    assert call(sim, "POST", SE, body=body).status == 200


def test_fault_values_are_validated() -> None:
    assert Fault("status").status == 500
    assert Fault("body").status == 200
    for bad in ({"kind": "explode"}, {"kind": "status", "status": 42},
                {"kind": "status", "count": 0}, {"kind": "status", "target": "x"},
                {"kind": "delay", "delay": -1}, {"kind": "status", "bogus": 1}, {}):
        with pytest.raises(ValueError, match="expected"):
            Fault.from_mapping(bad)
    parsed = Fault.from_mapping({"kind": "body", "body": "<p>", "content_type": "text/html"})
    assert parsed == Fault("body", body=b"<p>", content_type="text/html")


def test_request_log_records_each_request(sim: Simulator) -> None:
    sim.set_events([event()])
    call(sim, target=SE + "&x=1")
    body = json.dumps({"StartRequests": [{"EventId": EID}]}).encode()
    call(sim, "POST", SE, body=body)
    call(sim, headers={})
    get, post, bad = sim.requests
    assert (get.method, get.path, get.query, get.status) == (
        "GET", "/metadata/scheduledevents", "api-version=2020-07-01&x=1", 200)
    assert get.header("metadata") == "true" and get.body == b""
    assert (post.method, post.body, post.status) == ("POST", body, 200)
    assert bad.status == 400 and bad.header("Metadata") is None
    assert get.monotonic <= post.monotonic <= bad.monotonic
    assert abs(get.wall - time.time()) < 60
    sim.clear_requests()
    assert sim.requests == []


def test_wait_for_requests(sim: Simulator) -> None:
    assert not sim.wait_for_requests(1, 0.05)
    threading.Thread(target=lambda: [call(sim) for _ in range(3)], daemon=True).start()
    assert sim.wait_for_requests(3, 5, method="GET", path_prefix="/metadata/scheduled")
    assert not sim.wait_for_requests(1, 0.05, method="POST")
    assert not sim.wait_for_requests(1, 0.05, path_prefix="/metadata/instance")


def test_keep_alive_without_nagle_stalls(sim: Simulator) -> None:
    conn = connect(sim)
    began = time.monotonic()
    for _ in range(50):
        assert call(sim, conn=conn).status == 200
    assert time.monotonic() - began < 1.0  # ~40 ms each with Nagle + delayed ACK
    conn.close()
    assert len({e.monotonic for e in sim.requests}) == 50


def test_stop_is_idempotent_closes_idle_connections_and_restarts_on_same_port() -> None:
    sim = Simulator()
    sim.start()
    url = sim.url
    host, port = urlsplit(url).hostname or "", urlsplit(url).port or 0
    raw = socket.create_connection((host, port), timeout=5)
    raw.sendall(f"GET {SE} HTTP/1.1\r\nHost: x\r\nMetadata: true\r\n\r\n".encode())
    stream = raw.makefile("rb")
    assert stream.readline().startswith(b"HTTP/1.1 200")
    length = 0
    while (line := stream.readline()) != b"\r\n":
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    assert json.loads(stream.read(length)) == {"DocumentIncarnation": 1, "Events": []}
    sim.stop()
    assert stream.read(1) == b""  # the idle keep-alive connection was closed, not left hanging
    stream.close()
    raw.close()
    sim.stop()
    sim.start()
    try:
        assert sim.url == url
        assert call(sim).status == 200
    finally:
        sim.stop()


def test_stop_interrupts_a_delayed_answer() -> None:
    sim = Simulator()
    sim.start()
    sim.push_fault(Fault.slow(30))
    outcome: list[object] = []

    def client() -> None:
        try:
            outcome.append(call(sim).status)
        except (OSError, http.client.HTTPException) as exc:
            outcome.append(exc)

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    threading.Event().wait(0.1)  # let the request reach its delay (nothing observable to await)
    began = time.monotonic()
    sim.stop()
    thread.join(5)
    assert time.monotonic() - began < 3
    assert outcome and outcome[0] != 200, outcome


def test_instance_metadata_defaults_and_overrides() -> None:
    with Simulator(instance={"location": "norwayeast", "zone": "2"}) as sim:
        doc = call(sim, target=INSTANCE).json()
        compute = doc["compute"]
        assert isinstance(compute, dict)
        assert compute["name"] == "vm-sim-0"
        assert (compute["location"], compute["zone"]) == ("norwayeast", "2")
        for key in ("vmId", "subscriptionId", "resourceGroupName", "resourceId", "vmSize",
                    "osType", "vmScaleSetName"):
            assert isinstance(compute[key], str), key
        assert str(compute["resourceId"]).endswith("/virtualMachines/vm-sim-0")
        assert "interface" in doc["network"]  # type: ignore[operator]
        assert call(sim, target="/metadata/instance?api-version=1999-01-01").status == 400
    with Simulator(vm_name="vmss-web_3", instance={"vmScaleSetName": "vmss-web"}) as sim:
        compute = call(sim, target=INSTANCE).json()["compute"]
        assert isinstance(compute, dict)
        assert str(compute["resourceId"]).endswith(
            "/virtualMachineScaleSets/vmss-web/virtualMachines/3")


def test_non_loopback_hosts_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="loopback"):
        Simulator(host="0.0.0.0")
    assert main(["--host", "0.0.0.0"]) == 2
    assert "loopback" in capsys.readouterr().err
