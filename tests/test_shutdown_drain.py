"""What a stop says of records it could not deliver: what kept them, as it was.

A delivery worker sends nothing before a pause ends (the collector's requested one, or our
backoff after failures), so when that pause outlasts the shutdown timeout the drain ends at
once: "draining sinks (up to 10 s)", then within milliseconds the records left. The line says
so, with the pause, rather than claiming a timeout that was never waited for (app.not_drained,
called by Exporter.stop); a drain that did run out of time while still failing says that.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from scheduled_events_exporter.app import not_drained
from scheduled_events_exporter.delivery.outcome import SinkStatus
from scheduled_events_exporter.simulator import Simulator
from tests.exporter_process import ExporterProcess, answers, free_port, wait_until
from tests.peers.otlp_standin import OtlpHttpStandIn, Reply
from tests.test_otlp_conformance import event, otlp_env, readyz

KEPT = "they are kept in the spool and delivered, in order, after the restart"


def not_delivered_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "records not delivered" in line]


def paused_seconds(env: dict[str, str]) -> float:
    seconds: float = readyz(env)[1]["sinks"]["otlp"]["paused_seconds"]
    return seconds


@pytest.mark.timeout(60)
def test_a_pause_the_collector_asked_for_is_named_and_not_waited_for(
        sim: Simulator, tmp_path: Path) -> None:
    with OtlpHttpStandIn(lambda ids: Reply(429, (("Retry-After", "30"),))) as collector:
        env = otlp_env(sim, tmp_path, collector.endpoint, "http/protobuf",
                       SEE_SHUTDOWN_TIMEOUT="10")
        with ExporterProcess(env) as proc:
            sim.set_events([event("S-1")])
            collector.wait_requests(lambda log: len(log) >= 1, 30, "the throttled request")
            wait_until(lambda: paused_seconds(env) > 20, 10, "the 30 s pause in /readyz")
            started = time.monotonic()
            assert proc.terminate() == 0
            took = time.monotonic() - started
    (line,) = not_delivered_lines(proc.stderr())
    assert re.search(r"sink otlp: 1 records not delivered: the collector asked for a pause of "
                     r"30 s \(\d+\.\d s of it still to run\), longer than the shutdown timeout "
                     rf"left, so the drain did not wait for it; {KEPT}$", line), line
    assert "before the shutdown timeout" not in line, line
    assert took < 5, f"the stop took {took:.1f} s although nothing could be sent"


@pytest.mark.timeout(90)
def test_a_backoff_past_the_timeout_with_the_collector_down_is_named_with_its_failures(
        sim: Simulator, tmp_path: Path) -> None:
    # Nothing listens there: every attempt is refused, and the backoff doubles (0.5 s, 1 s,
    # 2 s, ...) until the next attempt is further away than the 2 s shutdown timeout.
    env = otlp_env(sim, tmp_path, f"http://127.0.0.1:{free_port()}", "http/protobuf",
                   SEE_SHUTDOWN_TIMEOUT="2")
    with ExporterProcess(env) as proc:
        wait_until(lambda: answers(f"http://{env['SEE_HEALTH_ADDR']}/readyz"), 30,
                   "the health server")
        sim.set_events([event("S-2")])
        wait_until(lambda: paused_seconds(env) > 3, 60, "a backoff longer than the timeout")
        assert proc.terminate() == 0
    (line,) = not_delivered_lines(proc.stderr())
    assert re.search(r"sink otlp: 1 records not delivered: the next attempt was not due before "
                     r"the shutdown timeout \(in \d+\.\d s, the backoff after \d+ failed "
                     r"attempts; last: .+\), so the drain did not wait for it; "
                     rf"{KEPT}$", line), line
    assert "asked for a pause" not in line, line


def status(**fields: object) -> SinkStatus:
    base: dict[str, object] = {"name": "otlp", "pending": 6, "oldest_wait": 1.0,
                               "consecutive_failures": 0, "last_error": "", "dropped": 0}
    return SinkStatus(**{**base, **fields})  # type: ignore[arg-type]


def test_each_reason_in_its_words() -> None:
    asked = status(paused_for=7.9, pause_asked=8.0, consecutive_failures=1,
                   last_error="HTTP 429")
    assert not_drained(asked, 8.9, kept=True) == (
        "sink otlp: 6 records not delivered before the shutdown timeout, still failing (last: "
        f"HTTP 429); {KEPT}"), "a pause shorter than the time left was waited for"
    assert not_drained(asked, 7.8, kept=True) == (
        "sink otlp: 6 records not delivered: the collector asked for a pause of 8 s (7.9 s of "
        f"it still to run), longer than the shutdown timeout left, so the drain did not wait "
        f"for it; {KEPT}")
    backoff = status(name="eventhubs", paused_for=12.25, consecutive_failures=1,
                     last_error="connection refused")
    assert not_drained(backoff, 8.0, kept=False) == (
        "sink eventhubs: 6 records not delivered: the next attempt was not due before the "
        "shutdown timeout (in 12.2 s, the backoff after 1 failed attempt; last: connection "
        "refused), so the drain did not wait for it; they are lost (SEE_STATE_DIR is empty: no "
        "spool)")
    assert not_drained(status(), 0.0, kept=True) == (
        f"sink otlp: 6 records not delivered before the shutdown timeout (still being sent); "
        f"{KEPT}")
