"""The wire under real overload, with several records in flight (docs/otlp-conformance.md):
the real exporter process against the scripted OTLP/HTTP and OTLP/gRPC peers.

* a pause a collector asks for (``Retry-After`` in each form, ``RetryInfo``) is a deadline: a
  second event queued during it sends nothing before it ends;
* ``RESOURCE_EXHAUSTED`` without ``RetryInfo`` after an accepted request is "busy": retried
  with backoff, nothing dead-lettered, everything delivered in order afterwards;
* a burst during a 2 s overload is split after backoffs, and the request bound grows back;
* an accepted request whose answer is larger than the client reads (a collector's long
  partial-success message; over gRPC, past its receive limit) is delivered once, not refused;
* a collector that refuses everything makes ``/readyz`` say the sink is failing
  (``redeliver``, which sends its dead letters on once it is fixed: tests/test_redeliver.py).
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import pytest

from scheduled_events_exporter.simulator import Simulator
from tests.exporter_process import ExporterProcess, wait_until
from tests.peers.otlp_standin import OtlpGrpcStandIn, OtlpHttpStandIn, Reply
from tests.test_otlp_conformance import (
    asctime_date,
    dead_letters,
    event,
    http_date,
    otlp_env,
    readyz,
    rfc850_date,
    seen,
)

PAUSE = 8.0


def pause_reply(form: str) -> Reply:
    """The first answer: a pause of PAUSE seconds, in ``form``."""
    if form == "grpc-retry-info":
        return Reply("UNAVAILABLE", retry_info=PAUSE)
    value = {"delta-seconds": str(int(PAUSE)), "imf-fixdate": http_date(PAUSE),
             "rfc850": rfc850_date(PAUSE), "asctime": asctime_date(PAUSE)}[form]
    return Reply(429, (("Retry-After", value),))


@pytest.mark.parametrize("form", ["delta-seconds", "imf-fixdate", "rfc850", "asctime",
                                  "grpc-retry-info"])
@pytest.mark.timeout(90)
def test_a_second_event_queued_during_a_pause_sends_nothing_before_its_deadline(
        sim: Simulator, tmp_path: Path, form: str) -> None:
    protocol = "grpc" if form.startswith("grpc") else "http/protobuf"
    standin = OtlpGrpcStandIn if protocol == "grpc" else OtlpHttpStandIn
    script = [lambda: pause_reply(form)]
    with standin(lambda ids: script.pop(0)() if script else None) as collector:
        env = otlp_env(sim, tmp_path, collector.endpoint, protocol)
        with ExporterProcess(env) as proc:
            sim.set_events([event("P-1")])
            collector.wait_requests(lambda log: len(log) >= 1, 30, "the paused request")
            refused_at = collector.log[0].arrival
            # Two events a few seconds apart: the second is queued 3 s into the pause.
            time.sleep(max(0.0, refused_at + 3.0 - time.monotonic()))
            sim.set_events([event("P-1"), event("P-2")])
            collector.wait_for(lambda a: {("P-1", "scheduled"), ("P-2", "scheduled")}
                               <= set(seen(a)), 40, "both records after the pause")
            assert proc.terminate() == 0
    first, second = collector.log[0], collector.log[1]
    assert first.verdict is not None and second.verdict is None, collector.log
    # An HTTP-date names a whole second, and the server's Date header (what the exporter
    # measures it from) is taken a moment later: the pause it says is PAUSE give or take one.
    slack = 1.3 if form in ("imf-fixdate", "rfc850", "asctime") else 0.3
    assert second.arrival - first.arrival >= PAUSE - slack, (
        f"sent {second.arrival - first.arrival:.2f} s into a {PAUSE} s pause")
    assert [e for e, _ in seen(collector.accepted)] == ["P-1", "P-2"]
    assert dead_letters(tmp_path) == []


@pytest.mark.timeout(90)
def test_resource_exhausted_without_retry_info_after_an_accepted_request_is_busy_not_too_large(
        sim: Simulator, tmp_path: Path) -> None:
    busy_until = [0.0]

    def answer(ids: list[str]) -> Reply | None:
        if time.monotonic() < busy_until[0]:
            return Reply("RESOURCE_EXHAUSTED")  # a memory limiter's answer: no RetryInfo
        return None

    with OtlpGrpcStandIn(answer) as collector:
        env = otlp_env(sim, tmp_path, collector.endpoint, "grpc")
        with ExporterProcess(env) as proc:
            sim.set_events([event("E-0")])
            collector.wait_for(lambda a: ("E-0", "scheduled") in seen(a), 30, "E-0 accepted")
            start = time.monotonic()
            busy_until[0] = start + 9.0
            sim.set_events([event("E-0"), event("E-1")])
            time.sleep(3.0)
            sim.set_events([event("E-0"), event("E-1"), event("E-2")])
            collector.wait_for(lambda a: {("E-1", "scheduled"), ("E-2", "scheduled")}
                               <= set(seen(a)), 60, "E-1 and E-2 after the overload")
            assert proc.terminate() == 0
    assert dead_letters(tmp_path) == []
    assert [e for e, _ in seen(collector.accepted)] == ["E-0", "E-1", "E-2"]
    during = [r for r in collector.log if start <= r.arrival < start + 9.0]
    assert len(during) <= 8, f"{len(during)} requests during the 9 s overload"
    assert all(r.verdict == "RESOURCE_EXHAUSTED" for r in during)
    assert not [line for line in proc.stderr_lines if "refused for its size" in line]


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
@pytest.mark.timeout(90)
def test_answers_larger_than_the_client_reads_deliver_every_record_once(
        sim: Simulator, tmp_path: Path, protocol: str) -> None:
    # 5 MB of words with every accepted request: past the 4 MiB the client reads of an answer.
    words = ("one line per dropped attribute, as a verbose collector writes it; " * 80_000)
    standin = OtlpGrpcStandIn if protocol == "grpc" else OtlpHttpStandIn
    with standin(lambda ids: Reply(partial=(0, words))) as collector:
        env = otlp_env(sim, tmp_path, collector.endpoint, protocol)
        with ExporterProcess(env) as proc:
            sim.set_events([event("L-0"), event("L-1"), event("L-2")])
            collector.wait_for(lambda a: len(seen(a)) >= 3, 30, "the first three")
            sim.set_events([event("L-0"), event("L-1"), event("L-2"), event("L-3"),
                            event("L-4")])
            collector.wait_for(lambda a: len(seen(a)) >= 5, 30, "the next two")
            wait_until(lambda: readyz(env)[1]["sinks"]["otlp"]["pending"] == 0, 10,
                       "everything acknowledged")
            assert proc.terminate() == 0
    assert [e for e, _ in seen(collector.accepted)] == [f"L-{i}" for i in range(5)]
    assert all(r.verdict is None for r in collector.log), "every request was accepted"
    assert dead_letters(tmp_path) == []
    assert [line for line in proc.stderr_lines if "discarded unread" in line], (
        "the answer's size is said")


def burst(prefix: str, count: int) -> list[dict[str, Any]]:
    return [event(f"{prefix}-{i:03d}", padding=12_000) for i in range(count)]


@pytest.mark.timeout(150)
def test_a_burst_during_a_two_second_overload_recovers_the_full_request_size(
        sim: Simulator, tmp_path: Path) -> None:
    busy_until = [0.0]

    def answer(ids: list[str]) -> Reply | None:
        return Reply("RESOURCE_EXHAUSTED") if time.monotonic() < busy_until[0] else None

    with OtlpGrpcStandIn(answer) as collector:
        env = otlp_env(sim, tmp_path, collector.endpoint, "grpc")
        with ExporterProcess(env) as proc:
            sim.set_events([event("BASE")])
            collector.wait_for(lambda a: ("BASE", "scheduled") in seen(a), 30, "a first record")
            first = burst("A", 100)
            busy_until[0] = time.monotonic() + 2.0
            sim.set_events([event("BASE"), *first])
            collector.wait_for(lambda a: len(seen(a)) >= 101, 60, "the first burst")
            split = len(collector.log)
            # Another burst after the overload: whole requests again.
            sim.set_events([event("BASE"), *first, *burst("B", 100)])
            collector.wait_for(lambda a: len(seen(a)) >= 201, 60, "the second burst")
            # The worker notes the success (and grows the bound) just after the answer.
            wait_until(lambda: readyz(env)[1]["sinks"]["otlp"]["pending"] == 0, 10,
                       "the second burst acknowledged")
            _status, body = readyz(env)
            assert proc.terminate() == 0
    assert dead_letters(tmp_path) == []
    assert any(r.verdict is not None for r in collector.log[:split]), "no overload met"
    second = [r for r in collector.log[split:] if r.verdict is None]
    assert [r.records for r in second] == [100], [r.records for r in second]
    sink = body["sinks"]["otlp"]
    assert sink["request_bytes"] == sink["max_request_bytes"], sink
    refused = [r for r in collector.log if r.verdict is not None]
    # Every halving waited first: no two refusals closer than the shortest backoff.
    gaps = [b.arrival - a.arrival for a, b in itertools.pairwise(refused)]
    assert all(gap >= 0.2 for gap in gaps), gaps


def failing_lines(body: dict[str, Any]) -> list[str]:
    return [w for w in [*body["warnings"], *body["reasons"]] if "sink otlp failing" in w]


@pytest.mark.parametrize("includes", ["", "sinks"])
@pytest.mark.timeout(90)
def test_a_collector_that_refuses_everything_makes_the_sink_failing(
        sim: Simulator, tmp_path: Path, includes: str) -> None:
    with OtlpHttpStandIn(lambda ids: 400) as collector:
        env = otlp_env(sim, tmp_path, collector.endpoint, "http/protobuf",
                       SEE_READINESS_INCLUDES=includes)
        with ExporterProcess(env) as proc:
            sim.set_events([event(f"R-{i}") for i in range(6)])
            wait_until(lambda: len(dead_letters(tmp_path)) >= 6, 40, "six dead letters")
            answers: list[tuple[int, dict[str, Any]]] = []

            def says_failing() -> bool:
                answers[:] = [readyz(env)]
                return bool(failing_lines(answers[0][1]))

            wait_until(says_failing, 60, "/readyz saying the sink is failing", interval=0.2)
            status, body = answers[0]
            said = failing_lines(body)
            assert proc.terminate() == 0
    assert said and "records were dead-lettered (HTTP 400)" in said[0], body
    assert body["sinks"]["otlp"]["rejecting"] and body["sinks"]["otlp"]["failing"]
    if includes:
        assert status == 503 and said[0] in body["reasons"]
    else:
        assert status == 200 and said[0] in body["warnings"]


@pytest.mark.timeout(90)
def test_a_fixed_collector_ends_the_failing_at_the_next_record_delivered_as_it_says(
        sim: Simulator, tmp_path: Path) -> None:
    """The streak ends on evidence only: after the collector's fix, /readyz still says the sink
    is failing, and what ends it; the next record delivered does (docs/semantics.md)."""
    refusing = [True]
    with OtlpHttpStandIn(lambda ids: 400 if refusing[0] else None) as collector:
        env = otlp_env(sim, tmp_path, collector.endpoint, "http/protobuf")
        with ExporterProcess(env) as proc:
            events = [event(f"F-{i}") for i in range(3)]
            sim.set_events(events)
            wait_until(lambda: len(dead_letters(tmp_path)) >= 3, 40, "three dead letters")
            wait_until(lambda: failing_lines(readyz(env)[1]), 30, "/readyz saying failing")
            refusing[0] = False  # the collector is fixed; nothing new has been sent yet
            said = failing_lines(readyz(env)[1])
            sim.set_events([*events, event("F-3")])  # a new transition, a new record
            wait_until(lambda: collector.accepted, 30, "the new record accepted")
            wait_until(lambda: not failing_lines(readyz(env)[1]), 10,
                       "/readyz no longer saying failing after a delivery")
            assert proc.terminate() == 0
    assert said == ["sink otlp failing: the last 3 records were dead-lettered (HTTP 400); "
                    "failing until the sink delivers a record (a new one, or a dead letter once "
                    "redelivered) or the exporter restarts"], said


@pytest.mark.timeout(90)
def test_refused_metric_exports_make_the_sink_failing_before_records_add_up(
        sim: Simulator, tmp_path: Path) -> None:
    # A VM sees a few records a day: one event, one record refused. The metric exports, every
    # heartbeat, are refused for good too: after METRIC_STREAK of them /readyz says so.
    with OtlpHttpStandIn(lambda ids: 400, metrics_answer=lambda: 400) as collector:
        env = otlp_env(sim, tmp_path, collector.endpoint, "http/protobuf",
                       OTEL_METRICS_EXPORTER="otlp", OTEL_METRIC_EXPORT_INTERVAL="1000")
        with ExporterProcess(env) as proc:
            sim.set_events([event("M-1")])
            wait_until(lambda: len(dead_letters(tmp_path)) == 1, 30, "one dead letter")
            found: list[str] = []

            def warned() -> bool:
                found[:] = [w for w in readyz(env)[1]["warnings"] if "sink otlp failing" in w]
                return bool(found)

            wait_until(warned, 30, "the warning")
            assert proc.terminate() == 0
    assert "metric exports were refused (HTTP 400" in found[0], found
    assert found[0].endswith("; failing until one is accepted (at the next change or "
                             "heartbeat)"), found
    assert len(collector.metrics) >= 3
