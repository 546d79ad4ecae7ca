"""The OTLP client against the OTLP specification, the real exporter process against scripted
OTLP/HTTP and OTLP/gRPC peers on loopback (tests/peers/otlp_standin.py). Each test is a row of
docs/otlp-conformance.md:

* throttling: the delay a 429/503 ``Retry-After`` (delta-seconds and the three HTTP-date forms,
  measured from the response's ``Date``) or a gRPC ``RetryInfo`` gives is waited for before
  the next attempt (the worker's own first backoff is at most 0.5 s, the
  scripted delays 2-3 s, so the two cannot be mistaken);
* no head-of-line blocking: a request over the peer's size limit (HTTP 413, gRPC's own
  ``RESOURCE_EXHAUSTED``) is split, a record too large alone is dead-lettered with one line, and
  the records behind it flow;
* a redirect is a configuration error: said once with its ``Location``, in ``/readyz``, the
  records kept until the endpoint is right;
* a partial success with nothing rejected but a message is said once;
* sizes (OTLP 1.11.0): an accepted export is delivered once whatever the size of its answer
  (over the 4 MiB the client reads, plain or compressed, or long gRPC trailers: delivered,
  never resent, never dead-lettered, its partial success said to be unknown); a refusal is
  read by its status whatever the size of its body or message (the request limit, which no
  IMDS document can reach, is tests/test_otlp_limits.py's);
* headers checked at start against the Baggage grammar, never shown; gRPC ``unix:`` targets;
  a timeout that looks like milliseconds named so.
"""

from __future__ import annotations

import email.utils
import itertools
import math
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from scheduled_events_exporter.simulator import Simulator
from tests.exporter_process import (
    ExporterProcess,
    answers,
    clean_env,
    free_port,
    get_json,
    state_dir,
    wait_until,
)
from tests.peers.otlp_standin import (
    Accepted,
    MetricsRequest,
    OtlpGrpcStandIn,
    OtlpHttpStandIn,
    Reply,
    Request,
)

VM = "vm-test"
FAR = "Mon, 11 Apr 2099 22:26:58 GMT"
SECRET = "s3cr3t-9f2c"


def event(event_id: str, status: str = "Scheduled", padding: int = 0) -> dict[str, Any]:
    """An IMDS event; ``padding`` adds that many bytes of resource names (8 KB each at most,
    as the parser keeps them), to make its record that large."""
    filler = [f"{event_id}-r{i:04d}-" + "x" * 8000 for i in range(math.ceil(padding / 8000))]
    return {
        "EventId": event_id,
        "EventStatus": status,
        "EventType": "Reboot",
        "ResourceType": "VirtualMachine",
        "Resources": [VM, *filler],
        "NotBefore": FAR if status == "Scheduled" else "",
        "Description": "",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }


def otlp_env(sim: Simulator, tmp_path: Path, endpoint: str, protocol: str,
             **more: str) -> dict[str, str]:
    return clean_env(
        SEE_IMDS_ENDPOINT=sim.url,
        SEE_SINKS="otlp",
        SEE_STATE_DIR=state_dir(tmp_path),
        SEE_HEALTH_ADDR=f"127.0.0.1:{free_port()}",
        SEE_POLL_INTERVAL="0.3",
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
        OTEL_EXPORTER_OTLP_INSECURE="true",
        **{"OTEL_EXPORTER_OTLP_TIMEOUT": "5", "OTEL_METRICS_EXPORTER": "none", **more},
    )


def dead_letters(tmp_path: Path) -> list[dict[str, Any]]:
    import json

    path = tmp_path / "state" / "dead-letter.jsonl"
    if not path.exists():
        return []
    # Only whole lines: the exporter may be in the middle of appending a 1 MB one.
    whole = path.read_text().split("\n")[:-1]
    return [json.loads(line) for line in whole]


def seen(accepted: list[Accepted]) -> list[tuple[str, str]]:
    return [(a.event_id, a.transition) for a in accepted]


def readyz(env: dict[str, str]) -> tuple[int, dict[str, Any]]:
    return get_json(f"http://{env['SEE_HEALTH_ADDR']}/readyz")


# --- Throttling --------------------------------------------------------------------------------

def http_date(seconds_ahead: float) -> str:
    """An IMF-fixdate ``seconds_ahead`` of the local clock."""
    return email.utils.formatdate(time.time() + seconds_ahead, usegmt=True)


def rfc850_date(seconds_ahead: float) -> str:
    """The obsolete RFC 850 form (``Sunday, 06-Nov-94 08:49:37 GMT``), written out by hand:
    strftime's names follow the locale."""
    t = time.gmtime(time.time() + seconds_ahead)
    day = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
    month = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
    return (f"{day[t.tm_wday]}, {t.tm_mday:02d}-{month[t.tm_mon - 1]}-{t.tm_year % 100:02d} "
            f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT")


def asctime_date(seconds_ahead: float) -> str:
    """C's asctime form (``Sun Nov  6 08:49:37 1994``, no zone: UTC)."""
    return time.asctime(time.gmtime(time.time() + seconds_ahead))


def skewed(form: Any, skew: float, delay: float) -> Reply:
    """A 429 from a server whose clock is ``skew`` seconds off ours: its ``Date`` and its
    ``Retry-After`` (``delay`` after its ``Date``) both on its own clock."""
    return Reply(429, (("Date", http_date(skew)), ("Retry-After", form(skew + delay))))


#: (protocol, the first answer, the least gap before the second attempt)
THROTTLES = [
    pytest.param("http/protobuf", lambda: Reply(429, (("Retry-After", http_date(3)),)), 1.9,
                 id="http-429-http-date"),
    pytest.param("http/protobuf", lambda: Reply(503, (("Retry-After", http_date(3)),)), 1.9,
                 id="http-503-http-date"),
    pytest.param("http/protobuf", lambda: Reply(429, (("Retry-After", "2"),)), 1.9,
                 id="http-429-delta-seconds"),
    pytest.param("http/protobuf", lambda: Reply(429, (("Retry-After", asctime_date(3)),)), 1.9,
                 id="http-429-asctime"),
    pytest.param("http/protobuf", lambda: Reply(503, (("Retry-After", rfc850_date(3)),)), 1.9,
                 id="http-503-rfc850"),
    # RFC 9110 10.2.3: a date is the server's, measured from its Date. An hour behind ours:
    # against the local clock it would be long past (no wait); an hour ahead: a 60 s wait.
    pytest.param("http/protobuf", lambda: skewed(asctime_date, -3600, 3), 1.9,
                 id="http-429-asctime-server-clock-an-hour-behind"),
    pytest.param("http/protobuf", lambda: skewed(http_date, 3600, 3), 1.9,
                 id="http-429-http-date-server-clock-an-hour-ahead"),
    pytest.param("grpc", lambda: Reply("UNAVAILABLE", retry_info=2.0), 1.9,
                 id="grpc-unavailable-retry-info"),
    pytest.param("grpc", lambda: Reply("RESOURCE_EXHAUSTED", retry_info=2.0), 1.9,
                 id="grpc-resource-exhausted-retry-info"),
]


@pytest.mark.parametrize(("protocol", "throttle", "least_gap"), THROTTLES)
@pytest.mark.timeout(60)
def test_a_throttled_request_is_retried_after_the_delay_the_collector_gave(
        sim: Simulator, tmp_path: Path, protocol: str, throttle: Any, least_gap: float) -> None:
    # The OTLP specification, "OTLP/HTTP Throttling" / "OTLP/gRPC Throttling":
    # the client SHOULD wait the Retry-After / RetryInfo delay before retrying.
    # The answer is made when the request arrives (an HTTP-date counts from then).
    script = [throttle]
    standin = OtlpGrpcStandIn if protocol == "grpc" else OtlpHttpStandIn
    with standin(lambda ids: script.pop(0)() if script else None) as collector:
        env = otlp_env(sim, tmp_path, collector.endpoint, protocol)
        with ExporterProcess(env) as proc:
            sim.set_events([event("T-1")])
            collector.wait_for(lambda a: ("T-1", "scheduled") in seen(a), 30, "T-1 after the "
                               "throttled attempt")
            assert proc.terminate() == 0
    first, second = collector.log[:2]
    assert first.verdict is not None and second.verdict is None
    gap = second.arrival - first.arrival
    assert gap >= least_gap, f"retried after {gap:.2f} s, the collector asked for more"
    assert gap < 10, f"retried after {gap:.2f} s"
    assert dead_letters(tmp_path) == []


# --- No head-of-line blocking ------------------------------------------------------------------

@pytest.mark.parametrize(("protocol", "shown"), [
    ("http/protobuf", "HTTP 413"),
    ("grpc", "gRPC RESOURCE_EXHAUSTED"),
])
@pytest.mark.timeout(90)
def test_a_request_too_large_is_split_and_a_record_too_large_alone_is_dead_lettered(
        sim: Simulator, tmp_path: Path, protocol: str, shown: str) -> None:
    # The OTLP specification, "Failures": an over-size request is not retried as is; gRPC's
    # RESOURCE_EXHAUSTED without RetryInfo is not retryable. The batch is halved; a record that
    # alone is over the limit is dead-lettered, and the records behind it are delivered.
    limit = 64 * 1024
    standin = OtlpGrpcStandIn if protocol == "grpc" else OtlpHttpStandIn
    with standin(max_bytes=limit) as collector:
        env = otlp_env(sim, tmp_path, collector.endpoint, protocol)
        with ExporterProcess(env) as proc:
            # Three records in one batch: two of 24 KB fit in pairs, not with the 100 KB one.
            document = [event("SMALL-1", padding=24_000), event("HUGE-1", padding=100_000),
                        event("SMALL-2", padding=24_000)]
            sim.set_events(document)
            collector.wait_for(lambda a: {("SMALL-1", "scheduled"), ("SMALL-2", "scheduled")}
                               <= set(seen(a)), 30, "both small records")
            wait_until(lambda: len(dead_letters(tmp_path)) == 1, 20, "the dead letter")
            # The event behind the refused one: delivered.
            sim.set_events([*document, event("AFTER-1")])
            collector.wait_for(lambda a: ("AFTER-1", "scheduled") in seen(a), 30,
                               "the record after the refused one")
            assert proc.terminate() == 0
    assert [e for e, _ in seen(collector.accepted) if e != "HUGE-1"] == [
        "SMALL-1", "SMALL-2", "AFTER-1"]
    assert "HUGE-1" not in {e for e, _ in seen(collector.accepted)}
    (letter,) = dead_letters(tmp_path)
    assert (letter["event_id"], letter["status"]) == ("HUGE-1", shown)
    lines = [line for line in proc.stderr_lines if "rejected the record" in line]
    assert len(lines) == 1, proc.stderr()
    size = int(re.search(r"about (\d+) bytes", lines[0]).group(1))  # type: ignore[union-attr]
    assert size > limit and shown in lines[0] and "EventId HUGE-1" in lines[0]
    # Split, never resent as is: no two refused requests of several records of the same size;
    # the record alone is tried once more after a backoff before it is dead-lettered.
    if protocol == "http/protobuf":
        refused = [r for r in collector.log if r.verdict == 413]
        sizes = [r.size for r in refused]
        repeated = {s for s in sizes if sizes.count(s) > 1}
        assert len(set(sizes)) >= 2 and len(repeated) == 1, collector.log  # split, then alone
        alone = [r for r in refused if r.size in repeated]
        assert len(alone) == 2 and alone[1].arrival - alone[0].arrival >= 0.2, collector.log


def _burst(sim: Simulator, tmp_path: Path, protocol: str) -> dict[str, float]:
    """5 MB of records in two polls against a 1 MiB limit: 7 events of 200 KB and one of
    1.1 MB, scheduled, then started (an IMDS document holds 4 MiB at most, so the burst takes
    two). Returns the figures (docs/otlp-conformance.md quotes them)."""
    limit = 1024 * 1024
    standin = OtlpGrpcStandIn if protocol == "grpc" else OtlpHttpStandIn
    ids = [f"B-{i:02d}" for i in range(7)]
    with standin(max_bytes=limit) as collector:
        env = otlp_env(sim, tmp_path, collector.endpoint, protocol)
        with ExporterProcess(env) as proc:
            start = time.monotonic()
            sim.set_events([*(event(i, padding=200_000) for i in ids),
                            event("BIG", padding=1_100_000)])
            proc.wait_for(lambda: proc.stderr().count(": azure.scheduled_event.") >= 8, 30,
                          "8 transitions read")
            sim.set_events([*(event(i, "Started", padding=200_000) for i in ids),
                            event("BIG", "Started", padding=1_100_000)])
            collector.wait_for(lambda a: len(seen(a)) >= 14, 60, "the 14 records that fit")
            wait_until(lambda: len(dead_letters(tmp_path)) == 2, 20, "BIG dead-lettered twice")
            elapsed = time.monotonic() - start
            assert proc.terminate() == 0
    log: list[Request] = collector.log
    sent = sum(r.size for r in log if r.verdict is None)
    return {"seconds": round(elapsed, 2), "requests_seen_by_peer": len(log),
            "requests_refused_seen_by_peer": sum(1 for r in log if r.verdict is not None),
            "requests_accepted": sum(1 for r in log if r.verdict is None),
            "largest_accepted_bytes": max(r.size for r in log if r.verdict is None),
            "bytes_delivered": sent, "dead_lettered": len(dead_letters(tmp_path)),
            "records_delivered": len(seen(collector.accepted)),
            "split_lines": sum(1 for line in proc.stderr_lines
                               if "refused for its size" in line)}


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
@pytest.mark.timeout(120)
def test_a_5_mb_burst_against_a_1_mib_limit_is_delivered_in_splits(
        sim: Simulator, tmp_path: Path, protocol: str) -> None:
    figures = _burst(sim, tmp_path, protocol)
    print(f"\n5 MB burst, {protocol}: {figures}", file=sys.stderr)
    assert figures["dead_lettered"] == 2
    assert figures["records_delivered"] == 14
    assert figures["bytes_delivered"] >= 14 * 200_000
    assert figures["largest_accepted_bytes"] <= 1024 * 1024
    # The limit is learnt once: after the first splits, requests pass at the first attempt.
    assert figures["split_lines"] <= 4, figures


# --- Large answers -----------------------------------------------------------------------------

def long_message(size: int) -> str:
    """A collector's partial-success warning of about ``size`` characters (one line per dropped
    attribute, as a verbose collector writes it)."""
    line = "attribute azure.scheduled_event.resources exceeds the limit and was truncated; "
    return (line * (size // len(line) + 1))[:size]


#: (protocol, the answer to every accepted request, what the exporter makes of it: "read" (a
#: long warning, read and shown bounded), "unread" (over the 4 MiB the client reads: the
#: records delivered, the partial success unknown), "plain" (nothing to say))
ANSWERS = [
    pytest.param("http/protobuf", Reply(partial=(0, long_message(100_000))), "read",
                 id="http-100kB"),
    pytest.param("http/protobuf", Reply(partial=(0, long_message(5_000_000))), "unread",
                 id="http-5MB"),
    # A few kB on the wire, 5 MB once decompressed: the limit is on what is decompressed.
    pytest.param("http/protobuf", Reply(partial=(0, long_message(5_000_000)), gzip=True),
                 "unread", id="http-5MB-gzip-encoded"),
    pytest.param("grpc", Reply(partial=(0, long_message(100_000))), "read", id="grpc-100kB"),
    pytest.param("grpc", Reply(partial=(0, long_message(5_000_000))), "unread", id="grpc-5MB"),
    pytest.param("grpc", Reply(partial=(0, long_message(5_000_000)), gzip=True), "unread",
                 id="grpc-5MB-compressed"),
    # Over gRPC's own metadata limit (16 KiB), which failed an accepted call on our side.
    pytest.param("grpc", Reply(trailers=(("x-collector-note", "n" * 100_000),)), "plain",
                 id="grpc-100kB-trailers"),
]


@pytest.mark.parametrize(("protocol", "reply", "kind"), ANSWERS)
@pytest.mark.timeout(90)
def test_an_accepted_export_is_delivered_once_whatever_the_size_of_its_answer(
        sim: Simulator, tmp_path: Path, protocol: str, reply: Reply, kind: str) -> None:
    # The protocol's response limit protects the client; it must not turn a request the
    # collector accepted into a refusal. 100 kB: over the 64 KiB the exporter once read, within
    # the 4 MiB it reads now (both protocols). 5 MB: over even that, the answer discarded
    # unread (over gRPC, the failure is gRPC's own receive limit on our side, not a refusal),
    # the specification's non-retryable error: for an accepted export, delivered, never sent
    # again, never dead-lettered, what it said unknown. Two events a few seconds apart, the
    # first batch holding two records.
    standin = OtlpGrpcStandIn if protocol == "grpc" else OtlpHttpStandIn
    with standin(lambda ids: reply) as collector:
        env = otlp_env(sim, tmp_path, collector.endpoint, protocol)
        with ExporterProcess(env) as proc:
            sim.set_events([event("L-1"), event("L-2")])
            collector.wait_for(lambda a: len(a) >= 2, 30, "L-1 and L-2")
            time.sleep(2)  # the scenario: the second event comes a few seconds later
            sim.set_events([event("L-1"), event("L-2"), event("L-3")])
            collector.wait_for(lambda a: ("L-3", "scheduled") in seen(a), 30, "L-3")
            wait_until(lambda: answers(f"http://{env['SEE_HEALTH_ADDR']}/readyz") and
                       readyz(env)[1]["sinks"]["otlp"]["pending"] == 0, 20,
                       "nothing pending")
            status = readyz(env)[1]["sinks"]["otlp"]
            assert proc.terminate() == 0
    assert seen(collector.accepted) == [("L-1", "scheduled"), ("L-2", "scheduled"),
                                        ("L-3", "scheduled")]
    assert [r.records for r in collector.log] == [2, 1], "each sent once, never split"
    assert dead_letters(tmp_path) == [] and status["dead_lettered"] == 0, status
    assert status["last_error"] == "" and status["consecutive_failures"] == 0, status
    assert all(len(line) < 1000 for line in proc.stderr_lines), "a long message logged whole"
    # The collector's words are shown, bounded (once per streak: both answers are alike).
    warned = [line for line in proc.stderr_lines if "with a warning" in line]
    unknown = [line for line in proc.stderr_lines if "is unknown" in line]
    if kind == "read":
        assert len(warned) == 1 and not unknown, proc.stderr()[-3000:]
        assert "accepted all 2 records with a warning" in warned[0]
        assert "attribute azure.scheduled_event.resources exceeds" in warned[0], warned[0]
        assert "100000 characters" in warned[0], warned[0]
    elif kind == "unread":
        assert len(unknown) == 1 and not warned, proc.stderr()[-3000:]
        ok = "gRPC OK" if protocol == "grpc" else "HTTP 200"
        assert (f"the collector accepted the request of 2 records ({ok}) but the response was "
                "larger than 4194304 bytes and was discarded unread: whether it dropped some "
                "of them (a partial success) is unknown; they count as delivered and are not "
                "sent again; counted in azure.scheduled_events.export.failures"
                '{signal="response_discarded"}') in unknown[0], unknown[0]
    else:
        assert not warned and not unknown, proc.stderr()[-3000:]


#: (protocol, the refusal, its status as the exporter names it, whether it is retried): a
#: refusal whose body (HTTP) or message (gRPC) is far larger than the client reads. Its
#: status decides, whatever the size; nothing beyond the limit is read.
REFUSALS = [
    pytest.param("http/protobuf", Reply(503, (("Retry-After", "2"),), body=b"x" * 5_000_000),
                 "HTTP 503", True, id="http-503-5MB-text"),
    pytest.param("http/protobuf", Reply(400, body=b"\x12" + b"\xff" * 4 + b"x" * 5_000_000),
                 "HTTP 400", False, id="http-400-5MB-protobuf"),
    pytest.param("grpc", Reply("UNAVAILABLE", retry_info=2.0, message="m" * 100_000),
                 "gRPC UNAVAILABLE", True, id="grpc-unavailable-retry-info-100kB-message"),
    pytest.param("grpc", Reply("INVALID_ARGUMENT", message="m" * 100_000),
                 "gRPC INVALID_ARGUMENT", False, id="grpc-invalid-argument-100kB-message"),
]


@pytest.mark.parametrize(("protocol", "refusal", "shown", "retried"), REFUSALS)
@pytest.mark.timeout(90)
def test_a_refusal_is_read_by_its_status_whatever_the_size_of_its_answer(
        sim: Simulator, tmp_path: Path, protocol: str, refusal: Reply, shown: str,
        retried: bool) -> None:
    # Three records in flight. Retryable: the first request is refused (with a 2 s pause),
    # then all is accepted. Not retryable: every request holding BAD is refused; BAD is
    # dead-lettered, the others and the event after it delivered.
    first = [True]

    def answer(ids: list[str]) -> Reply | None:
        if retried:
            refuse, first[0] = first[0], False
            return refusal if refuse else None
        return refusal if "BAD" in ids else None

    standin = OtlpGrpcStandIn if protocol == "grpc" else OtlpHttpStandIn
    with standin(answer) as collector:
        env = otlp_env(sim, tmp_path, collector.endpoint, protocol)
        with ExporterProcess(env) as proc:
            document = [event("GOOD-1"), event("BAD"), event("GOOD-2")]
            sim.set_events(document)
            good = {("GOOD-1", "scheduled"), ("GOOD-2", "scheduled")}
            collector.wait_for(lambda a: good <= set(seen(a)), 30, "the records")
            if not retried:
                wait_until(lambda: len(dead_letters(tmp_path)) == 1, 20, "BAD dead-lettered")
            sim.set_events([*document, event("AFTER")])
            collector.wait_for(lambda a: ("AFTER", "scheduled") in seen(a), 30, "AFTER")
            assert proc.terminate() == 0
    failed = [line for line in proc.stderr_lines if shown in line]
    assert failed and all(len(line) < 1500 for line in proc.stderr_lines), proc.stderr()[-3000:]
    assert not [line for line in proc.stderr_lines if "RESOURCE_EXHAUSTED" in line]
    if retried:
        assert seen(collector.accepted) == [("GOOD-1", "scheduled"), ("BAD", "scheduled"),
                                            ("GOOD-2", "scheduled"), ("AFTER", "scheduled")]
        first_try, second_try = collector.log[:2]
        assert second_try.arrival - first_try.arrival >= 1.9, "the pause asked for, waited"
        assert dead_letters(tmp_path) == []
    else:
        assert [e for e, _ in seen(collector.accepted)] == ["GOOD-1", "GOOD-2", "AFTER"]
        (letter,) = dead_letters(tmp_path)
        assert (letter["event_id"], letter["status"]) == ("BAD", shown), letter


# --- Metrics: delta counts kept ----------------------------------------------------------------

TRANSITIONS = "azure.scheduled_events.transitions"


def delta_points(requests: list[MetricsRequest], name: str) -> list[tuple[Any, int, int, int]]:
    """(attributes, start, end, value) of every point of the delta sum ``name`` in
    ``requests``, in arrival order."""
    out = []
    for sent in requests:
        for resource in sent.request.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name != name:
                        continue
                    assert metric.sum.aggregation_temporality == 1, "delta"  # DELTA
                    for point in metric.sum.data_points:
                        attrs = tuple(sorted((a.key, a.value.string_value)
                                             for a in point.attributes))
                        out.append((attrs, point.start_time_unix_nano, point.time_unix_nano,
                                    point.as_int))
    return out


@pytest.mark.parametrize(("protocol", "pause"), [
    ("http/protobuf", Reply(503, (("Retry-After", "2"),))),
    ("grpc", Reply("UNAVAILABLE", retry_info=2.0)),
], ids=["http", "grpc"])
@pytest.mark.timeout(90)
def test_delta_metrics_refused_for_8_s_add_up_to_every_transition(
        sim: Simulator, tmp_path: Path, protocol: str, pause: Reply) -> None:
    # With delta temporality the SDK resets its sums at every collection: a batch the collector
    # did not accept must be kept and sent later, or its counts are gone. Refused (with a
    # 2 s pause asked for each time) for 8 s from the first metric export, while three
    # transitions happen a few seconds apart; every export is read at a 1 s heartbeat.
    first: list[float] = []

    def metrics_answer() -> Reply | None:
        first[:] = first or [time.monotonic()]
        return pause if time.monotonic() - first[0] < 8 else None

    standin = OtlpGrpcStandIn if protocol == "grpc" else OtlpHttpStandIn
    with standin(metrics_answer=metrics_answer) as collector:
        env = otlp_env(sim, tmp_path, collector.endpoint, protocol,
                       OTEL_METRICS_EXPORTER="otlp", OTEL_METRIC_EXPORT_INTERVAL="1000",
                       OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE="delta")
        with ExporterProcess(env) as proc:
            collector.wait_metrics(lambda m: len(m) >= 1, 30, "the first metric export")
            sim.set_events([event("D-1")])
            collector.wait_for(lambda a: len(a) >= 1, 30, "D-1 scheduled")
            time.sleep(2)  # the scenario: transitions a few seconds apart, inside the refusal
            sim.set_events([event("D-1"), event("D-2")])
            collector.wait_for(lambda a: len(a) >= 2, 30, "D-2 scheduled")
            time.sleep(2)
            sim.set_events([event("D-2")])
            collector.wait_for(lambda a: len(a) >= 3, 30, "D-1 cancelled")
            assert time.monotonic() - first[0] < 8, "the transitions came after the refusal"
            transitions = len(collector.accepted)

            def counted(requests: list[MetricsRequest]) -> int:
                accepted = [m for m in requests if m.verdict is None]
                return sum(v for *_, v in delta_points(accepted, TRANSITIONS))

            collector.wait_metrics(lambda m: counted(m) >= transitions, 40,
                                   f"{transitions} transitions counted in accepted exports")
            assert proc.terminate() == 0
    requests = collector.metrics
    accepted = [m for m in requests if m.verdict is None]
    assert counted(requests) == transitions == 3, delta_points(accepted, TRANSITIONS)
    # Each point with its own window, in order: per series, no window overlaps the one before.
    points = delta_points(accepted, TRANSITIONS)
    for series in {attrs for attrs, *_ in points}:
        windows = [(start, end) for attrs, start, end, _ in points if attrs == series]
        assert all(start < end for start, end in windows), windows
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(windows)), windows
    # No earlier than the pause asked for: nothing sent within 2 s of a refusal.
    for before, after in itertools.pairwise(requests):
        if before.verdict is not None:
            assert after.arrival - before.arrival >= 1.9, (before, after)
    # Refused: the line says the delta points are kept (true for this temporality).
    line = next(x for x in proc.stderr_lines if "metric export failed" in x)
    assert "delta points are kept" in line, line


# --- Redirects ---------------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_a_redirect_is_a_configuration_error_said_once_and_the_records_wait(
        sim: Simulator, tmp_path: Path) -> None:
    moved = {"on": True}
    location = "https://collector.elsewhere.example/v1/logs"
    with OtlpHttpStandIn(lambda ids: Reply(308, (("Location", location),))
                         if moved["on"] else None) as collector:
        env = otlp_env(sim, tmp_path, collector.endpoint, "http/protobuf")
        with ExporterProcess(env) as proc:
            sim.set_events([event("R-1")])
            collector.wait_requests(lambda log: len(log) >= 3, 20, "three attempts")

            def warned() -> bool:
                status, body = readyz(env)
                return status == 200 and len(body["warnings"]) == 1 and \
                    body["warnings"][0].startswith("sink otlp failing: OTLP collector answered "
                                                   f"HTTP 308: redirected to {location}") and \
                    location in body["sinks"]["otlp"]["config_error"]

            # Ready (SEE_READINESS_INCLUDES has no "sinks"), with the sink in the warnings.
            wait_until(lambda: answers(f"http://{env['SEE_HEALTH_ADDR']}/readyz") and warned(),
                       20, "/readyz warning about the redirect")
            assert readyz(env)[1]["sinks"]["otlp"]["pending"] == 1
            lines = [line for line in proc.stderr_lines if "HTTP 308" in line]
            assert len(lines) == 1, proc.stderr()
            assert f"redirected to {location}" in lines[0]
            assert "OTEL_EXPORTER_OTLP_ENDPOINT" in lines[0]
            moved["on"] = False
            collector.wait_for(lambda a: ("R-1", "scheduled") in seen(a), 60, "R-1 after the fix")
            assert proc.terminate() == 0
    assert all(r.verdict in (308, None) for r in collector.log)
    assert dead_letters(tmp_path) == []


def test_a_redirect_gates_readiness_when_sinks_are_included(
        sim: Simulator, tmp_path: Path) -> None:
    with OtlpHttpStandIn(lambda ids: Reply(301, (("Location", "http://x.example/"),))
                         ) as collector:
        env = otlp_env(sim, tmp_path, collector.endpoint, "http/protobuf",
                       SEE_READINESS_INCLUDES="sinks")
        with ExporterProcess(env) as proc:
            sim.set_events([event("R-2")])
            wait_until(lambda: answers(f"http://{env['SEE_HEALTH_ADDR']}/readyz", 503) and
                       readyz(env)[1]["sinks"]["otlp"]["config_error"] != "", 20,
                       "not ready for the redirect")
            (reason,) = readyz(env)[1]["reasons"]
            assert reason.startswith("sink otlp failing: OTLP collector answered HTTP 301: "
                                     "redirected to http://x.example/"), reason
            assert proc.terminate() == 0


# --- Partial success ---------------------------------------------------------------------------

@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
@pytest.mark.timeout(60)
def test_a_partial_success_with_a_message_and_nothing_rejected_is_said_once(
        sim: Simulator, tmp_path: Path, protocol: str) -> None:
    # The OTLP specification, "Partial Success": a server MAY convey a warning in
    # error_message with nothing rejected; the client shows it.
    text = "attribute azure.scheduled_event.x is deprecated"
    standin = OtlpGrpcStandIn if protocol == "grpc" else OtlpHttpStandIn
    with standin(lambda ids: Reply(partial=(0, text))) as collector:
        env = otlp_env(sim, tmp_path, collector.endpoint, protocol)
        with ExporterProcess(env) as proc:
            sim.set_events([event("P-1")])
            collector.wait_for(lambda a: ("P-1", "scheduled") in seen(a), 30, "P-1 scheduled")
            sim.set_events([])
            collector.wait_for(lambda a: ("P-1", "cancelled") in seen(a), 30, "P-1 cancelled")
            assert proc.terminate() == 0
    # Accepted: neither request was sent again (a partial success MUST NOT be retried).
    assert [r.verdict for r in collector.log] == [None, None], collector.log
    lines = [line for line in proc.stderr_lines if text in line]
    assert len(lines) == 1, proc.stderr()
    assert "WARNING" in lines[0] and "accepted all 1 records with a warning" in lines[0]
    assert dead_letters(tmp_path) == []


# --- Configuration: headers, gRPC targets, timeout ---------------------------------------------

def check_config(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "scheduled_events_exporter", "check-config"],
                          env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("headers", "named"), [
    (f"api key={SECRET}", "header key 'api key'"),
    (f"x-api-key={SECRET}%0D%0AX-Injected:%201", "the value of header 'x-api-key'"),
])
@pytest.mark.parametrize("command", ["check-config", "run"])
@pytest.mark.timeout(60)
def test_a_malformed_header_stops_the_start_naming_the_key_never_the_value(
        sim: Simulator, tmp_path: Path, headers: str, named: str, command: str) -> None:
    # The exporter specification: OTEL_EXPORTER_OTLP_HEADERS in the W3C Baggage format (keys
    # are tokens, values percent-decoded).
    env = otlp_env(sim, tmp_path, f"http://127.0.0.1:{free_port()}", "http/protobuf",
                   OTEL_EXPORTER_OTLP_LOGS_HEADERS=headers)
    done = subprocess.run([sys.executable, "-m", "scheduled_events_exporter", command],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    said = done.stdout + done.stderr
    assert f"OTEL_EXPORTER_OTLP_LOGS_HEADERS: {named}" in said, said
    assert SECRET not in said


@pytest.mark.timeout(90)
def test_no_header_value_is_ever_printed(sim: Simulator, tmp_path: Path) -> None:
    # The collector answers every way that makes the exporter talk: a configuration error, a
    # redirect, a throttle, a refusal, a partial success; and check-config shows the settings.
    script = [Reply(401), Reply(308, (("Location", "http://x.example/"),)),
              Reply(429, (("Retry-After", "0"),)), Reply(400), Reply(partial=(1, "dropped"))]
    headers = f"authorization=Bearer%20{SECRET},x-tenant={SECRET}-t"
    with OtlpHttpStandIn(lambda ids: script.pop(0) if script else None) as collector:
        env = otlp_env(sim, tmp_path, collector.endpoint, "http/protobuf",
                       OTEL_EXPORTER_OTLP_HEADERS=headers, SEE_LOG_LEVEL="DEBUG")
        shown = check_config(env)
        assert shown.returncode == 0, shown.stderr
        with ExporterProcess(env) as proc:
            sim.set_events([event("H-1"), event("H-2")])
            collector.wait_for(lambda a: ("H-2", "scheduled") in seen(a), 60, "H-2")
            assert proc.terminate() == 0
    assert not script
    assert "OTEL_EXPORTER_OTLP_HEADERS=" in shown.stdout
    for text in (shown.stdout, shown.stderr, proc.stderr(), "\n".join(proc.stdout_lines)):
        assert SECRET not in text


@pytest.mark.skipif(sys.platform == "win32", reason="unix sockets: the Linux suite")
@pytest.mark.parametrize("form", ["unix:{path}", "unix://{path}"])
@pytest.mark.timeout(60)
def test_a_grpc_unix_socket_target_is_used_as_the_grpc_client_takes_it(
        sim: Simulator, tmp_path: Path, form: str) -> None:
    # The exporter specification: the gRPC endpoint SHOULD accept any form the gRPC client accepts.
    path = tmp_path / "otlp.sock"
    with OtlpGrpcStandIn(address=f"unix:{path}") as collector:
        env = otlp_env(sim, tmp_path, form.format(path=path), "grpc")
        with ExporterProcess(env) as proc:
            sim.set_events([event("U-1")])
            collector.wait_for(lambda a: ("U-1", "scheduled") in seen(a), 30, "U-1 over unix")
            assert proc.terminate() == 0


def test_a_timeout_that_looks_like_milliseconds_is_named_so(sim: Simulator,
                                                            tmp_path: Path) -> None:
    env = otlp_env(sim, tmp_path, "http://127.0.0.1:1", "http/protobuf",
                   OTEL_EXPORTER_OTLP_TIMEOUT="10000")
    done = check_config(env)
    assert done.returncode == 2
    assert ("OTEL_EXPORTER_OTLP_TIMEOUT='10000': expected a timeout in seconds (the Python "
            "SDK's unit), from 0.001 to 600; 10000 looks like milliseconds (the "
            "specification's unit): write 10 for 10 s") in done.stdout + done.stderr


# --- The table itself ---------------------------------------------------------------------------

def test_the_conformance_table_counts_and_tests_hold() -> None:
    """docs/otlp-conformance.md: its counts are the table's, and every test it names exists."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "otlp-conformance.md").read_text()
    rows = re.findall(r"^\| ([A-Z]\d+) \| (MUST NOT|MUST|SHOULD) \| [^|]+\| ([^|]+)\|([^|]+)\|"
                      r"([^|]+)\|$", doc, re.M)
    counts: dict[tuple[str, str], int] = {}
    for _, level, what, _, _ in rows:
        status = ("not applicable" if "Not applicable" in what else "not met"
                  if "**Not met**" in what else "another way"
                  if re.search(r"\*\*another way\*\*", what, re.I) else "met")
        key = ("MUST" if level.startswith("MUST") else "SHOULD", status)
        counts[key] = counts.get(key, 0) + 1
    for level, label in (("MUST", "MUST / MUST NOT"), ("SHOULD", "SHOULD")):
        numbers = r" \| (\d+)" * 5
        line = re.search(rf"^\| {re.escape(label)}{numbers} \|$", doc, re.M)
        assert line, label
        said = [int(x) for x in line.groups()]
        found = [counts.get((level, s), 0)
                 for s in ("met", "another way", "not met", "not applicable")]
        assert said == [sum(found), *found], (label, said, found)
    marked = doc.count("**SDK differs**") - 1  # the explanation names the mark once
    assert re.search(rf"differ from ours in {marked} rows", doc), marked
    tests_dir = Path(__file__).parent
    for file, name in set(re.findall(r"`?(test_\w+\.py)::(test_\w+)", doc)) | {
            (m.group(1), n) for m in re.finditer(r"`(test_\w+\.py)::test_\w+`((?:, `::test_\w+`)+)",
                                                 doc)
            for n in re.findall(r"::(test_\w+)", m.group(2))}:
        source = (tests_dir / file).read_text()
        assert f"def {name}(" in source, f"{file}::{name} named in the table does not exist"
