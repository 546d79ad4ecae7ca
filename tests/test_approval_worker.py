"""The approval worker against the loopback IMDS simulator (docs/semantics.md#approval-opt-in,
docs/semantics.md#simulator): real HTTP, real hooks.

Every wait is on a condition with a deadline (``Approver.wait_idle``, the simulator's request
log, a file the hook writes); nothing sleeps and hopes.
"""

from __future__ import annotations

import http.client
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from scheduled_events_exporter.approval_rules import ApprovalConfig, Rule
from scheduled_events_exporter.approval_worker import Approver
from scheduled_events_exporter.model import Document, Transition, TransitionKind
from scheduled_events_exporter.parser import parse_document
from scheduled_events_exporter.simulator import Fault, RequestLogEntry, Simulator
from tests.exporter_process import wait_until

VM = "vm-sim-0"
EID = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
EID2 = "5F197CF0-33EF-48E4-9CE2-B8BEE551CD45"
NOT_BEFORE = "Mon, 11 Apr 2022 22:26:58 GMT"
USER_RULE = ApprovalConfig(rules=(Rule("user"),))
FAST_RETRIES = (0.05, 0.1, 0.2)

Factory = Callable[..., Approver]


def full(t: Transition) -> str:
    """The reason and its detail as one text, the way the log shows them."""
    if t.approval_reason:
        return f"{t.approval_reason}: {t.approval_detail}"
    return t.approval_detail or ""


def reboot(event_id: str = EID, *, source: str = "User", resources: tuple[str, ...] = (VM,),
           status: str = "Scheduled") -> dict[str, object]:
    return {"EventId": event_id, "EventStatus": status, "EventType": "Reboot",
            "ResourceType": "VirtualMachine", "Resources": list(resources),
            "NotBefore": NOT_BEFORE if status == "Scheduled" else "",
            "Description": "Virtual machine is going to be restarted as requested by "
                           "authorized user.", "EventSource": source, "DurationInSeconds": -1}


def fetch(sim: Simulator) -> Document:
    """One GET, as the poller would make it (the simulator logs it too)."""
    url = urlsplit(sim.url)
    conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=10)
    try:
        conn.request("GET", "/metadata/scheduledevents?api-version=2020-07-01",
                     headers={"Metadata": "true"})
        response = conn.getresponse()
        body = response.read()
        assert response.status == 200, body
        return parse_document(body)
    finally:
        conn.close()


def poll(sim: Simulator, approver: Approver) -> Document:
    """Fetch, offer, and wait until the approver has handled that document."""
    doc = fetch(sim)
    approver.offer(doc.events, doc.incarnation)
    assert approver.wait_idle(10), "approver did not finish handling the document in 10 s"
    return doc


def posts(sim: Simulator) -> list[RequestLogEntry]:
    return [r for r in sim.requests if r.method == "POST"]


def is_dead(pid: int) -> bool:
    """Gone or a zombie (in a container nobody may reap the orphaned grandchild)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def start_sleeping_hook(sim: Simulator, make: Factory, tmp_path: Path, *, hook_timeout: float
                        ) -> tuple[Approver, Document, int]:
    """An approver offered a user Reboot whose hook has started a 30 s sleep in its process
    group: (the approver, the document offered, the sleeper's pid)."""
    pid_file = tmp_path / "sleep.pid"
    hook = f"sleep 30 & echo $! > {pid_file}.tmp && mv {pid_file}.tmp {pid_file}; wait"
    sim.set_events([reboot()])
    approver = make(ApprovalConfig(rules=(Rule("user"),), hook=hook, hook_timeout=hook_timeout))
    doc = fetch(sim)
    approver.offer(doc.events, doc.incarnation)
    wait_until(pid_file.exists, 10, "the hook to start sleeping")
    return approver, doc, int(pid_file.read_text())


@pytest.fixture
def sim() -> Iterator[Simulator]:
    with Simulator(vm_name=VM) as s:
        yield s


@pytest.fixture
def make(sim: Simulator) -> Iterator[Factory]:
    made: list[Approver] = []

    def factory(config: ApprovalConfig = USER_RULE, **kw: object) -> Approver:
        kw.setdefault("already_approved", ())
        kw.setdefault("retry_delays", FAST_RETRIES)
        approver = Approver(config, endpoint=sim.url, timeout=5.0, vm_name=lambda: VM,
                            **kw)  # type: ignore[arg-type]
        made.append(approver)
        return approver

    yield factory
    for approver in made:
        approver.stop(5.0)


@pytest.mark.timeout(30)
def test_user_reboot_is_approved_exactly_once(
    sim: Simulator, make: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A proxy in the environment must not matter: IMDS is never reached through one.
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    sim.set_events([reboot(), reboot(EID2, resources=("vm-sim-1",))])
    outcomes: list[str] = []
    approver = make(on_outcome=outcomes.append)
    first = poll(sim, approver)
    results = approver.drain()
    for _ in range(15):  # many polls, and the stale Scheduled document offered again
        poll(sim, approver)
        approver.offer(first.events, first.incarnation)
        assert approver.wait_idle(10)
        results += approver.drain()

    assert len(posts(sim)) == 1
    post = posts(sim)[0]
    assert (post.path, post.query, post.status) == (
        "/metadata/scheduledevents", "api-version=2020-07-01", 200)
    assert post.body == b'{"StartRequests":[{"EventId":"' + EID.encode() + b'"}]}'
    assert post.header("Metadata") == "true"
    assert post.header("Content-Type") == "application/json"
    assert post.header("X-Forwarded-For") is None
    assert [e["EventStatus"] for e in sim.events] == ["Started", "Scheduled"]

    by_kind = {t.kind: t for t in results}
    assert len(results) == 2 and set(by_kind) == {TransitionKind.APPROVED,
                                                  TransitionKind.APPROVAL_SKIPPED}
    approved = by_kind[TransitionKind.APPROVED]
    assert approved.event is not None and approved.event.event_id == EID
    assert approved.event.status == "Scheduled" and approved.previous_status is None
    assert (approved.approval_status, approved.approval_reason) == (200, None)
    assert approved.approval_detail == "rule user"
    assert approved.incarnation == first.incarnation and approved.at.tzinfo is not None
    skipped = by_kind[TransitionKind.APPROVAL_SKIPPED]
    assert skipped.event is not None and skipped.event.event_id == EID2
    assert skipped.approval_reason == "not_self" and skipped.approval_status is None

    assert approver.approved_ids() == {EID}
    assert sorted(outcomes) == ["approved", "not_self"]  # each reported once, however often
    assert approver.drain() == []


@pytest.mark.timeout(30)
def test_dry_run_posts_nothing_and_reports_once(sim: Simulator, make: Factory) -> None:
    sim.set_events([reboot()])
    approver = make(ApprovalConfig(rules=(Rule("user"),), dry_run=True))
    results: list[Transition] = []
    for _ in range(5):
        poll(sim, approver)
        results += approver.drain()
    assert posts(sim) == []
    assert [(t.kind, t.approval_reason) for t in results] == [
        (TransitionKind.APPROVAL_SKIPPED, "dry_run")]
    assert full(results[0]) == (
        "dry_run: would approve; SEE_APPROVE_DRY_RUN is set (rule user)")
    assert sim.events[0]["EventStatus"] == "Scheduled"
    assert approver.approved_ids() == frozenset()


@pytest.mark.timeout(30)
def test_failing_hook_prevents_the_post(sim: Simulator, make: Factory) -> None:
    sim.set_events([reboot()])
    outcomes: list[str] = []
    approver = make(ApprovalConfig(rules=(Rule("user"),), hook="echo not ready >&2; exit 3"),
                    on_outcome=outcomes.append)
    results: list[Transition] = []
    for _ in range(3):
        poll(sim, approver)
        results += approver.drain()
    assert posts(sim) == []
    assert len(results) == 1 and results[0].kind is TransitionKind.APPROVAL_SKIPPED
    reason = full(results[0])
    assert reason.startswith("hook_failed: exit 3 after ") and reason.endswith(" s (rule user)")
    assert outcomes == ["hook_failed"]


@pytest.mark.timeout(30)
def test_hanging_hook_is_killed_and_never_delays_the_poll_loop(
    sim: Simulator, make: Factory, tmp_path: Path
) -> None:
    approver, doc, sleeper = start_sleeping_hook(sim, make, tmp_path, hook_timeout=1.0)
    started = time.monotonic()

    slowest, while_running, results = 0.0, 0, list[Transition]()
    while not results:
        assert time.monotonic() - started < 10, "the hook was not killed at its timeout"
        t0 = time.perf_counter()
        approver.offer(doc.events, doc.incarnation)
        results = approver.drain()
        slowest = max(slowest, time.perf_counter() - t0)
        while_running += not results
        approver.wait_idle(0.05)  # paces the loop; False while the hook runs
    waited = time.monotonic() - started

    assert slowest < 0.010, f"offer+drain took {slowest * 1000:.1f} ms while the hook ran"
    assert while_running >= 5
    assert 0.5 <= waited < 5
    assert len(results) == 1
    assert full(results[0]).startswith(
        "hook_failed: timeout after 1.0 s (process group killed)")
    wait_until(lambda: is_dead(sleeper), 5, "the hook's child to be killed with its group")
    assert posts(sim) == []


@pytest.mark.timeout(30)
def test_post_failing_four_times_is_reported_post_failed(sim: Simulator, make: Factory) -> None:
    sim.push_fault(Fault("status", status=500, method="POST", count=4))
    sim.set_events([reboot()])
    outcomes: list[str] = []
    approver = make(on_outcome=outcomes.append)
    poll(sim, approver)
    results = approver.drain()
    assert [r.status for r in posts(sim)] == [500, 500, 500, 500]  # 1 + 3 retries
    assert len(results) == 1 and results[0].kind is TransitionKind.APPROVAL_SKIPPED
    assert results[0].approval_status == 500
    assert full(results[0]).startswith(
        'post_failed: HTTP 500: {"error": "Internal Server Error"} after 4 attempts')
    for _ in range(3):  # reported once, never retried again for this event
        poll(sim, approver)
    assert approver.drain() == [] and len(posts(sim)) == 4
    assert approver.approved_ids() == frozenset()
    assert outcomes == ["post_failed"]


@pytest.mark.timeout(30)
def test_retry_succeeding_is_approved_with_its_attempt(sim: Simulator, make: Factory) -> None:
    sim.push_fault(Fault("status", status=503, method="POST", count=2))
    sim.set_events([reboot()])
    approver = make()
    poll(sim, approver)
    assert [r.status for r in posts(sim)] == [503, 503, 200]
    [result] = approver.drain()
    assert result.kind is TransitionKind.APPROVED and result.approval_status == 200
    assert result.approval_detail == "rule user; attempt 3"


@pytest.mark.timeout(30)
def test_retries_stop_when_the_event_leaves_the_document(sim: Simulator, make: Factory) -> None:
    sim.push_fault(Fault("status", status=500, method="POST", count=4))
    sim.set_events([reboot()])
    approver = make(retry_delays=(1.0, 1.0, 1.0))
    doc = fetch(sim)
    approver.offer(doc.events, doc.incarnation)
    assert sim.wait_for_requests(1, 10, method="POST")
    sim.set_events([])  # cancelled by the platform while we wait to retry
    poll(sim, approver)
    assert len(posts(sim)) == 1
    [result] = approver.drain()
    assert full(result).startswith("post_failed: HTTP 500")
    assert "not retried: the event is no longer Scheduled" in full(result)


@pytest.mark.timeout(30)
def test_a_restart_does_not_post_again(sim: Simulator, make: Factory) -> None:
    sim.set_events([reboot()])
    first = make()
    poll(sim, first)
    assert len(posts(sim)) == 1 and len(first.drain()) == 1
    first.stop(5.0)
    persisted = sorted(first.approved_ids())  # what the state file keeps
    # Azure has not started it yet: still Scheduled when the new process polls.
    sim.set_events([reboot()])
    second = make(already_approved=persisted)
    for _ in range(3):
        poll(sim, second)
    assert len(posts(sim)) == 1 and second.drain() == []
    assert second.approved_ids() == {EID}


@pytest.mark.timeout(30)
def test_hook_gets_the_event_on_stdin_and_in_its_environment(
    sim: Simulator, make: Factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SEE_EVENTHUB_CONNECTION_STRING", "Endpoint=sb://x/;SharedAccessKey=k")
    hook = (f"cat > {tmp_path}/event.json && printf %s \"$SEE_EVENT_ID\" > {tmp_path}/id "
            f"&& env > {tmp_path}/env")
    sim.set_events([reboot()])
    approver = make(ApprovalConfig(rules=(Rule("user"),), hook=hook))
    poll(sim, approver)
    assert json.loads((tmp_path / "event.json").read_text()) == sim.events[0] | {
        "EventStatus": "Scheduled", "NotBefore": NOT_BEFORE}
    assert (tmp_path / "id").read_text() == EID
    env = dict(line.split("=", 1) for line in (tmp_path / "env").read_text().splitlines()
               if "=" in line)
    assert env["SEE_EVENT_STATUS"] == "Scheduled" and env["SEE_EVENT_SOURCE"] == "User"
    assert env["SEE_EVENT_TYPE"] == "Reboot" and env["SEE_EVENT_RESOURCES"] == VM
    assert env["SEE_EVENT_NOT_BEFORE"] == "2022-04-11T22:26:58.000Z"
    assert env["SEE_EVENT_DURATION"] == "-1"
    assert "SEE_EVENTHUB_CONNECTION_STRING" not in env  # secrets stay with the exporter
    assert len(posts(sim)) == 1  # exit 0 allowed the POST, after the hook
    [result] = approver.drain()
    assert full(result).startswith("rule user; hook exit 0 after ")


@pytest.mark.timeout(30)
def test_an_exec_form_hook_runs_without_a_shell(sim: Simulator, make: Factory,
                                                tmp_path: Path) -> None:
    # Every argument reaches the program as given: no word splitting, no quoting, no $expansion.
    script = ("import json, os, sys; event = json.load(sys.stdin); "
              "open(sys.argv[1], 'w').write(json.dumps([event['EventId'], sys.argv[2], "
              "os.environ['SEE_EVENT_ID']]))")
    out = tmp_path / "argv.json"
    sim.set_events([reboot()])
    hook = (sys.executable, "-c", script, str(out), "$SEE_EVENT_ID 'not quoted'; exit 3")
    approver = make(ApprovalConfig(rules=(Rule("user"),), hook=hook))
    poll(sim, approver)
    assert json.loads(out.read_text()) == [EID, "$SEE_EVENT_ID 'not quoted'; exit 3", EID]
    assert len(posts(sim)) == 1
    [result] = approver.drain()
    assert full(result).startswith("rule user; hook exit 0 after ")


@pytest.mark.timeout(30)
def test_event_that_leaves_during_the_hook_is_not_posted(
    sim: Simulator, make: Factory, tmp_path: Path
) -> None:
    go, started = tmp_path / "go", tmp_path / "started"
    hook = f"touch {started}; while [ ! -e {go} ]; do sleep 0.02; done"
    sim.set_events([reboot()])
    approver = make(ApprovalConfig(rules=(Rule("user"),), hook=hook))
    doc = fetch(sim)
    approver.offer(doc.events, doc.incarnation)
    wait_until(started.exists, 10, "the hook to start")
    sim.set_events([])
    doc = fetch(sim)
    approver.offer(doc.events, doc.incarnation)
    go.touch()
    assert approver.wait_idle(10)
    assert posts(sim) == [] and approver.drain() == []


@pytest.mark.timeout(30)
def test_stop_kills_a_running_hook(sim: Simulator, make: Factory, tmp_path: Path) -> None:
    approver, _, sleeper = start_sleeping_hook(sim, make, tmp_path, hook_timeout=60.0)
    t0 = time.monotonic()
    approver.stop(5.0)
    assert time.monotonic() - t0 < 2.0
    wait_until(lambda: is_dead(sleeper), 5, "the hook to be killed")
    assert posts(sim) == [] and approver.drain() == []
