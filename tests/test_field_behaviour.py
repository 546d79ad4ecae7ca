"""What IMDS does in the field, through the installed exporter against the simulator over HTTP
(docs/lifecycle.md, "What the platform does"):

- a user's reboot that the VM approves automatically appears directly as Started: an ordinary
  start with its own basis, not an unannounced one, on every route; a platform event first seen
  Started while watched (a host failure) stays unannounced;
- a 200 with an empty body is neither a document nor "no events"; DocumentIncarnation 0 is a
  document; the same document for many polls says nothing new;
- Started lasts the platform's window, far longer than the pause it announces (at field scale,
  minutes, on an injected clock; through the process, for a number of polls the simulator
  observed); notice below the documented minimum is reported as measured, and said to be below
  it;
- an empty or changing Description; 410 for longer than the documentation says.
"""

from __future__ import annotations

import itertools
import json
import time
import urllib.request
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import pytest

from scheduled_events_exporter.model import InstanceInfo
from scheduled_events_exporter.parser import parse_document
from scheduled_events_exporter.records import body, make_record, to_columns
from scheduled_events_exporter.simulator import Fault, Simulator
from scheduled_events_exporter.tracker import TrackerState, note_unchanged, track
from tests.exporter_process import (
    ExporterProcess,
    answers,
    clean_env,
    free_port,
    get_json,
    state_dir,
    wait_until,
)
from tests.peers.rotel import RotelReceiver
from tests.test_hostile import event

P = "azure.scheduled_event."


def env(sim: Simulator, tmp_path: Path, **extra: str) -> dict[str, str]:
    return clean_env(**{"SEE_IMDS_ENDPOINT": sim.url, "SEE_SINKS": "console",
                        "SEE_STATE_DIR": state_dir(tmp_path), "SEE_HEALTH_ADDR": "",
                        "SEE_POLL_INTERVAL": "0.2", **extra})


def watched(proc: ExporterProcess) -> None:
    """Wait until the exporter has read a first document (so what follows is watched)."""
    proc.wait_for(lambda: "first document received" in proc.stderr(), 30, "a first document")


def started(event_id: str, event_type: str, source: str) -> dict[str, Any]:
    return event(event_id, EventStatus="Started", EventType=event_type, NotBefore="",
                 EventSource=source, DurationInSeconds=-1)


def transitions(records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(r["EventId"], r["Transition"]) for r in records]


# --- auto-approved user operations ------------------------------------------------------------

@pytest.mark.timeout(120)
def test_an_auto_approved_user_reboot_is_a_start_on_every_route_a_host_failure_a_surprise(
        sim: Simulator, tmp_path: Path) -> None:
    scrape = free_port()
    with RotelReceiver() as rotel:
        extra = {"SEE_SINKS": "console,otlp",
                 "OTEL_EXPORTER_OTLP_ENDPOINT": rotel.http_endpoint,
                 "OTEL_METRICS_EXPORTER": "prometheus",
                 "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
                 "OTEL_EXPORTER_PROMETHEUS_PORT": str(scrape),
                 "OTEL_SERVICE_NAME": f"field-{tmp_path.name}"}
        with ExporterProcess(env(sim, tmp_path, **extra)) as proc:
            watched(proc)
            sim.set_events([started("USER", "Reboot", "User"),
                            started("HOST", "Redeploy", "Platform")])
            records = proc.wait_for_records(2, 30)
            logs = rotel.wait_for_logs(lambda r: r.event_name == P + "started", 2, 30)
            with urllib.request.urlopen(f"http://127.0.0.1:{scrape}/metrics", timeout=5) as r:
                scraped = r.read().decode()
            assert proc.terminate() == 0
    by_id = {r["EventId"]: r for r in records}
    # Console (and Event Hubs: the same object per message).
    user, host = by_id["USER"], by_id["HOST"]
    assert (user["Transition"], user["Unannounced"], user["OutcomeBasis"]) == (
        "started", False, "user_initiated")
    assert user["PreviousStatus"] is None and user["EventSource"] == "User"
    assert (host["Transition"], host["Unannounced"], host["OutcomeBasis"]) == (
        "started", True, "continuous_watch")
    # OTLP: an ordinary start (WARN) against the surprise (ERROR).
    otlp = {r.attributes[P + "id"]: r for r in logs}
    assert otlp["USER"].severity_text == "WARN" and otlp["HOST"].severity_text == "ERROR"
    assert otlp["USER"].attributes[P + "unannounced"] is False
    assert otlp["USER"].attributes[P + "outcome_basis"] == "user_initiated"
    assert otlp["USER"].body.endswith("user-initiated and approved automatically, so never "
                                      "Scheduled)")
    # Prometheus: only the host failure carries the label the unannounced alert keys on (the
    # exposition writes an absent label as "" once a family has it; PromQL reads both alike).
    pending = [line for line in scraped.splitlines()
               if line.startswith("azure_scheduled_events_pending{")]
    flagged = [line for line in pending if 'unannounced="true"' in line]
    assert len(flagged) == 1 and 'source="Platform"' in flagged[0], "\n".join(pending)
    assert any('source="User"' in line for line in pending), "\n".join(pending)


# --- documents that are not what they seem ----------------------------------------------------

@pytest.mark.timeout(120)
def test_an_empty_200_is_neither_a_document_nor_no_events(sim: Simulator,
                                                         tmp_path: Path) -> None:
    health = free_port()
    sim.set_raw_document(b"")  # the very first answer
    with ExporterProcess(env(sim, tmp_path, SEE_HEALTH_ADDR=f"127.0.0.1:{health}")) as proc:
        proc.wait_for(lambda: "invalid_document" in proc.stderr(), 30, "the empty body")
        wait_until(lambda: answers(f"http://127.0.0.1:{health}/readyz"), 10, "/readyz")
        status, body = get_json(f"http://127.0.0.1:{health}/readyz")
        assert status == 503 and body["imds_last_outcome"] == "invalid_document", body
        sim.set_raw_document(None)
        sim.set_events([event("A")])
        proc.wait_for_records(1, 30)
        sim.set_raw_document(b"")  # again, with an event pending: it must not end it
        count = len(sim.requests)
        assert sim.wait_for_requests(count + 4, 30)  # (retried with backoff: 0.2, 0.4, 0.8 s)
        sim.set_raw_document(None)
        assert sim.wait_for_requests(count + 8, 30)
        assert proc.terminate() == 0
    assert transitions(proc.records()) == [("A", "scheduled")]


@pytest.mark.timeout(120)
def test_incarnation_0_is_a_document(sim: Simulator, tmp_path: Path) -> None:
    sim.set_events([event("A")], incarnation=0)
    with ExporterProcess(env(sim, tmp_path)) as proc:
        first = proc.wait_for_records(1, 30)[0]
        assert (first["Transition"], first["DocumentIncarnation"]) == ("scheduled", 0)
        sim.set_events([], incarnation=1)  # consecutive: a watched cancellation
        records = proc.wait_for_records(2, 30)
        assert proc.terminate() == 0
    assert [(r["Transition"], r["OutcomeBasis"]) for r in records] == [
        ("scheduled", "first_document"), ("cancelled", "consecutive_absence")]


@pytest.mark.timeout(120)
def test_the_same_document_for_many_polls_says_nothing_new(sim: Simulator,
                                                           tmp_path: Path) -> None:
    health = free_port()
    with ExporterProcess(env(sim, tmp_path, SEE_HEALTH_ADDR=f"127.0.0.1:{health}")) as proc:
        watched(proc)
        sim.set_events([event("A")])
        proc.wait_for_records(1, 30)
        start = len(sim.requests)
        assert sim.wait_for_requests(start + 60, 60)  # 60 polls of one unchanged document
        assert get_json(f"http://127.0.0.1:{health}/readyz")[0] == 200
        assert proc.terminate() == 0
    statuses = [e.status for e in sim.requests[start:start + 60]]
    assert statuses.count(304) >= 58, statuses  # ETag: the body is not even sent again
    assert transitions(proc.records()) == [("A", "scheduled")]


# --- what a verdict or a number means ---------------------------------------------------------

def test_a_5_s_freeze_started_for_minutes_reports_the_window_not_the_pause() -> None:
    """At field scale, on an injected clock (milliseconds): the documented 5 s Freeze kept
    Started for 4 min 10 s, its unchanged document polled every second meanwhile, says nothing
    until it leaves, then reports the window it was Started, beside the 5 s it announced."""
    freeze = parse_document(json.dumps({"DocumentIncarnation": 2, "Events": [
        event("F", EventStatus="Started", NotBefore="", DurationInSeconds=5)]}).encode())
    scheduled = parse_document(json.dumps({"DocumentIncarnation": 1, "Events": [
        event("F", DurationInSeconds=5)]}).encode())
    t0, window = datetime(2022, 4, 11, 22, 20, tzinfo=timezone.utc), 4 * 60 + 10
    state, _ = track(TrackerState(), scheduled, t0, gap_threshold=3.0)
    state, (start,) = track(state, freeze, t0 + timedelta(seconds=1), gap_threshold=3.0)
    assert start.kind.value == "started"
    for second in range(2, 1 + window):  # the same document, as a 200 and as a 304
        state, said = track(state, freeze, t0 + timedelta(seconds=second), gap_threshold=3.0)
        assert said == ()
        state = note_unchanged(state, t0 + timedelta(seconds=second, milliseconds=500))
    gone = parse_document(b'{"DocumentIncarnation": 3, "Events": []}')
    _, (done,) = track(state, gone, t0 + timedelta(seconds=1 + window), gap_threshold=3.0)
    record = to_columns(make_record(done, InstanceInfo(vm_name="vm-test")))
    assert (record["Transition"], record["OutcomeBasis"]) == ("completed", "observed_start")
    assert (record["ElapsedSeconds"], record["DurationInSeconds"]) == (window, 5)
    assert body(make_record(done, InstanceInfo(vm_name="vm-test"))) == (
        "Freeze completed for vm-test (Started for 4 min 10 s: the platform's window around "
        "the 5 s impact)")


#: Polls of the unchanged Started document the simulator must see before the event leaves.
WINDOW_POLLS = 10


@pytest.mark.timeout(120)
def test_a_freeze_started_for_a_while_reports_the_window_not_the_pause(
        sim: Simulator, tmp_path: Path) -> None:
    """Through the process: the simulator keeps a 1 s Freeze Started for WINDOW_POLLS polls
    (a poll never comes sooner than the interval, so for at least 2 s). Nothing is said while
    it stays Started; when it leaves, ElapsedSeconds is the span the simulator saw between the
    poll that first got it Started and the poll that got it gone, not the 1 s pause."""
    path = "/metadata/scheduledevents"
    with ExporterProcess(env(sim, tmp_path)) as proc:
        watched(proc)
        sim.set_events([event("F", DurationInSeconds=1)])
        proc.wait_for_records(1, 30)
        sim.clear_requests()
        sim.set_events([event("F", EventStatus="Started", NotBefore="", DurationInSeconds=1)])
        proc.wait_for_records(2, 30)
        seen = len(sim.requests)
        # The platform keeps it Started for its window (minutes on Azure).
        assert sim.wait_for_requests(seen + WINDOW_POLLS, 30, method="GET", path_prefix=path)
        assert len(proc.records()) == 2, "something said while it stayed Started"
        sim.set_events([])
        records = proc.wait_for_records(3, 30)
        assert proc.terminate() == 0
    documents = [r for r in sim.requests if r.path.startswith(path) and r.status == 200]
    assert len(documents) == 2, "exactly two new documents: Started, then gone"
    span = documents[1].monotonic - documents[0].monotonic
    assert span >= WINDOW_POLLS * 0.2
    done = records[2]
    assert done["Transition"] == "completed" and done["DurationInSeconds"] == 1
    assert done["ElapsedSeconds"] == pytest.approx(span, abs=0.2), (done, span)
    assert done["ElapsedSeconds"] > done["DurationInSeconds"]
    said = (f"Freeze completed for vm-test (Started for {round(done['ElapsedSeconds'])} s: the "
            f"platform's window around the 1 s impact)")
    assert said in proc.stderr(), proc.stderr()[-800:]


@pytest.mark.timeout(120)
def test_notice_below_the_documented_minimum_is_measured_and_said(sim: Simulator,
                                                                 tmp_path: Path) -> None:
    with ExporterProcess(env(sim, tmp_path)) as proc:
        watched(proc)
        soon = datetime.now(timezone.utc) + timedelta(minutes=5, seconds=19)
        sim.set_events([event("F", NotBefore=format_datetime(soon, usegmt=True))])
        (record,) = proc.wait_for_records(1, 30)
        assert proc.terminate() == 0
    assert 316 <= record["NoticeSeconds"] <= 320 and record["OutcomeBasis"] == "continuous_watch"
    assert "(5 s impact; notice 5 min 1" in proc.stderr()
    assert ", below the documented 15 min)" in proc.stderr()


@pytest.mark.timeout(120)
def test_an_empty_or_changing_description_is_kept_as_sent(sim: Simulator,
                                                         tmp_path: Path) -> None:
    with ExporterProcess(env(sim, tmp_path)) as proc:
        watched(proc)
        sim.set_events([event("A", Description=""),
                        event("B", Description="Host OS update")])
        proc.wait_for_records(2, 30)
        sim.set_events([event("A", Description="Live migration"),
                        event("B", Description="Host OS update")])
        records = proc.wait_for_records(3, 30)
        assert proc.terminate() == 0
    assert [(r["EventId"], r["Transition"], r["Description"]) for r in records] == [
        ("A", "scheduled", ""), ("B", "scheduled", "Host OS update"),
        ("A", "updated", "Live migration")]
    assert records[2]["Changes"] == {"Description": ["", "Live migration"]}


@pytest.mark.timeout(120)
def test_410_for_longer_than_documented_is_retried_briskly_and_said_once(
        sim: Simulator, tmp_path: Path) -> None:
    health = free_port()
    sim.set_events([event("A")])
    sim.push_fault(Fault.gone_for(12))  # scaled down from the 2-3 minutes seen on VMs
    with ExporterProcess(env(sim, tmp_path, SEE_HEALTH_ADDR=f"127.0.0.1:{health}",
                             SEE_STALENESS_LIMIT="5")) as proc:
        started_at = time.monotonic()
        wait_until(lambda: answers(f"http://127.0.0.1:{health}/readyz"), 10, "/readyz")
        wait_until(lambda: get_json(f"http://127.0.0.1:{health}/readyz")[0] == 503 and
                   time.monotonic() - started_at > 6, 30, "not ready while only 410 comes")
        proc.wait_for_records(1, 40)
        waited = time.monotonic() - started_at
        assert proc.terminate() == 0
    gone = [e for e in sim.requests if e.status == 410]
    assert len(gone) >= 3, "retried, not given up"
    gaps = [b.monotonic - a.monotonic for a, b in itertools.pairwise(gone)]
    assert max(gaps) <= 5.5, gaps  # capped at 5 s for 410
    assert waited < 12 + 8, waited  # the first document soon after the window
    lines = [line for line in proc.stderr().splitlines() if "410 Gone" in line]
    assert len(lines) == 1 and "seen up to 3 after a start" in lines[0], lines
