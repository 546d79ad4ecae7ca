"""Resource Graph for what the queue missed: the client pages with ``$skipToken`` (1000 rows a
page at most), honours 429 with ``Retry-After`` or Resource Graph's own quota header, retries a
5xx a few times and gives up on a refusal; ``platform --backfill`` (a real subprocess, against
a loopback stand-in serving the documented response format) records only what is new to the
state: Resource Graph keeps each event's latest status only."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from scheduled_events_exporter.platform_feed.resource_graph import (
    ATTEMPTS,
    PAGE_ROWS,
    QUERY,
    GraphError,
    ResourceGraph,
)
from tests.exporter_process import ExporterProcess, clean_env
from tests.peers.resource_graph import ResourceGraphStandIn

SUB = "0b6f1a2c-3d4e-4f50-8a9b-1c2d3e4f5a6b"


def row(event_id: str, status: str, vm: str = "vm-1") -> dict[str, Any]:
    return {
        "id": f"/subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Compute/"
              f"virtualMachines/{vm}/providers/microsoft.maintenance/scheduledevents/{event_id}",
        "name": event_id, "type": "microsoft.maintenance/scheduledevents",
        "location": "westeurope", "resourceGroup": "rg", "subscriptionId": SUB,
        "properties": {"EventId": event_id, "EventStatus": status, "EventType": "Reboot",
                       "EventSource": "Platform", "ResourceType": "VirtualMachine",
                       "Resources": [vm], "NotBefore": "", "DurationInSeconds": -1}}


def graph(standin: ResourceGraphStandIn, waits: list[float]) -> ResourceGraph:
    return ResourceGraph(standin.endpoint, [SUB], wait=lambda s: waits.append(s) is None and False)


def test_pages_follow_the_skip_token_and_no_token_goes_over_http() -> None:
    rows = [row(str(uuid.uuid4()), "Scheduled") for _ in range(2 * PAGE_ROWS + 5)]
    waits: list[float] = []
    with ResourceGraphStandIn(rows) as standin:
        got = list(graph(standin, waits).rows())
    assert got == rows and waits == []
    assert [r["options"].get("$skipToken") for r in standin.requests] == [None, "1000", "2000"]
    assert all(r["options"]["$top"] == PAGE_ROWS and r["query"] == QUERY
               and r["subscriptions"] == [SUB] for r in standin.requests)
    assert standin.requests[0]["path"] == ("/providers/Microsoft.ResourceGraph/resources"
                                           "?api-version=2024-04-01")
    assert not any("Authorization" in h for h in standin.headers)


@pytest.mark.parametrize(("refusal", "waited"), [
    ((429, {"Retry-After": "7"}), 7.0),
    ((429, {"x-ms-user-quota-resets-after": "00:00:05"}), 5.0),
    ((429, {}), 1.0),
    ((500, {}), 1.0),
    ((503, {"Retry-After": "2"}), 1.0),  # a 5xx backs off on its own schedule
])
def test_throttling_and_server_errors_are_waited_out(
        refusal: tuple[int, dict[str, str]], waited: float) -> None:
    rows = [row("e1", "Completed")]
    waits: list[float] = []
    with ResourceGraphStandIn(rows, script=lambda n: refusal if n == 1 else None) as standin:
        assert list(graph(standin, waits).rows()) == rows
    assert waits == [waited] and len(standin.requests) == 2


def test_a_refusal_or_too_many_failures_ends_the_backfill() -> None:
    waits: list[float] = []
    with ResourceGraphStandIn([], script=lambda n: (403, {})) as standin, \
            pytest.raises(GraphError, match="refused the query: HTTP 403"):
        list(graph(standin, waits).rows())
    with ResourceGraphStandIn([], script=lambda n: (500, {})) as standin, \
            pytest.raises(GraphError, match=f"no page after {ATTEMPTS} attempts"):
        list(graph(standin, waits).rows())
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0]


def test_a_page_without_quota_left_waits_for_its_reset_before_the_next() -> None:
    rows = [row(str(i), "Scheduled") for i in range(5)]
    waits: list[float] = []
    quota = {"x-ms-user-quota-remaining": "0", "x-ms-user-quota-resets-after": "00:00:03"}
    with ResourceGraphStandIn(rows, page_rows=2, quota=quota) as standin:
        assert list(graph(standin, waits).rows()) == rows
    assert waits == [3.0, 3.0]  # before pages 2 and 3; none after the last


def backfill(standin: ResourceGraphStandIn, tmp_path: Path) -> ExporterProcess:
    env = clean_env(SEE_STATE_DIR=str(tmp_path / "state"), SEE_HEALTH_ADDR="",
                    SEE_SINKS="console", SEE_SHUTDOWN_TIMEOUT="5",
                    # Never read in a backfill: the queue is not asked for anything.
                    SEE_PLATFORM_QUEUE_CONNECTION_STRING=(
                        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
                        "AccountKey=a2V5;QueueEndpoint=http://127.0.0.1:9/devstoreaccount1;"),
                    SEE_PLATFORM_QUEUE_NAME="unused",
                    SEE_PLATFORM_RESOURCE_GRAPH_ENDPOINT=standin.endpoint,
                    SEE_PLATFORM_SUBSCRIPTIONS=SUB)
    return ExporterProcess(env, args=("platform", "--backfill"))


def test_platform_backfill_records_only_what_is_new_to_the_state(tmp_path: Path) -> None:
    fixture = json.loads((Path(__file__).parent / "fixtures" / "platform" /
                          "resource-graph-page.json").read_text())["data"]
    first = [*fixture, row("aaaa0001-0000-4000-8000-000000000001", "Scheduled"),
             row("aaaa0002-0000-4000-8000-000000000002", "Started"),
             {"type": "microsoft.compute/virtualmachines", "id": "/x"}]  # not an event
    with ResourceGraphStandIn(first, page_rows=2,
                              script=lambda n: (429, {"Retry-After": "1"}) if n == 2 else None
                              ) as standin:
        with backfill(standin, tmp_path) as once:
            assert once.proc.wait(timeout=60) == 0, once.stderr()
            once.wait_for_output_end(10)
        assert len(standin.requests) == 4  # 3 pages, one of them throttled once
    made = {(r["EventId"].lower(), r["Transition"], r["EventStatus"]) for r in once.records()}
    assert made == {("5d6e7f8a-9b0c-4d1e-8f2a-3b4c5d6e7f8a", "scheduled", "Scheduled"),
                    ("6e7f8a9b-0c1d-4e2f-9a3b-4c5d6e7f8a9b", "completed", "Completed"),
                    ("aaaa0001-0000-4000-8000-000000000001", "scheduled", "Scheduled"),
                    ("aaaa0002-0000-4000-8000-000000000002", "started", "Started")}
    assert all(r["Observer"] == "platform" for r in once.records())
    # Later the table holds the latest status of each: only the endings are new.
    later = [*fixture[1:], row("aaaa0001-0000-4000-8000-000000000001", "Canceled"),
             row("AAAA0002-0000-4000-8000-000000000002", "Completed"),
             {**fixture[0], "properties": {**fixture[0]["properties"],
                                           "EventStatus": "Started"}}]
    with ResourceGraphStandIn(later) as standin, backfill(standin, tmp_path) as again:
        assert again.proc.wait(timeout=60) == 0, again.stderr()
        again.wait_for_output_end(10)
    assert sorted((r["EventId"].lower()[:8], r["Transition"]) for r in again.records()) == [
        ("5d6e7f8a", "started"), ("aaaa0001", "cancelled"), ("aaaa0002", "completed")]
