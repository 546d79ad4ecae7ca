"""What ``/readyz`` and ``/healthz`` answer (docs/semantics.md#reliability), as pure functions
of what the exporter knows: readiness is the exporter's own work (fresh IMDS data, an accepted
api-version); a failing sink or an unwritable state file is reported in the body and decides
the status only when ``SEE_READINESS_INCLUDES`` names it."""

from __future__ import annotations

import pytest

from scheduled_events_exporter.config import READINESS_CHECKS as DOWNSTREAM_CHECKS
from scheduled_events_exporter.delivery.outcome import SinkStatus
from scheduled_events_exporter.health import HealthInputs, liveness, readiness
from scheduled_events_exporter.model import Outcome
from scheduled_events_exporter.write_faults import WriteFault

NOW = 1000.0
LIMIT = 30.0
STATE_FAULT = WriteFault(file="/state/state.json", error="ENOSPC: No space left on device",
                         since=NOW - 50, failures=12)


def sink(name: str = "otlp", *, oldest_wait: float = 0.0, config_error: str = "") -> SinkStatus:
    return SinkStatus(name=name, pending=3 if oldest_wait else 0, oldest_wait=oldest_wait,
                      consecutive_failures=5 if oldest_wait else 0, last_error="", dropped=0,
                      config_error=config_error)


def inputs(*, good_age: float | None = 1.0, sinks: tuple[SinkStatus, ...] = (),
           faults: tuple[WriteFault, ...] = (), includes: frozenset[str] = frozenset(),
           outcome: str = Outcome.OK.value, last_tick_age: float = 0.5) -> HealthInputs:
    return HealthInputs(
        last_tick=lambda: NOW - last_tick_age, started=NOW - 100,
        last_good=lambda: None if good_age is None else NOW - good_age,
        last_outcome=lambda: outcome, sink_status=lambda: sinks, poll_interval=1.0,
        request_timeout=130.0, staleness_limit=LIMIT, monotonic=lambda: NOW,
        write_faults=lambda: faults, includes=includes)


DOWNSTREAM_FAILURES = {
    "sinks": {"sinks": (sink(oldest_wait=LIMIT + 1),)},
    "sinks (configuration)": {"sinks": (sink(config_error="authentication failed (HTTP 401)"),)},
    "storage": {"faults": (STATE_FAULT,)},
}


@pytest.mark.parametrize("failure", DOWNSTREAM_FAILURES, ids=str)
def test_downstream_failure_is_reported_but_leaves_the_exporter_ready(failure: str) -> None:
    ok, body = readiness(inputs(**DOWNSTREAM_FAILURES[failure]))  # type: ignore[arg-type]
    assert ok and body["status"] == "ready" and body["reasons"] == []
    assert len(body["warnings"]) == 1, body  # type: ignore[arg-type]
    assert body["readiness_includes"] == []


@pytest.mark.parametrize("failure", DOWNSTREAM_FAILURES, ids=str)
def test_downstream_failure_decides_readiness_when_included(failure: str) -> None:
    check = failure.split()[0]
    ok, body = readiness(inputs(**DOWNSTREAM_FAILURES[failure],  # type: ignore[arg-type]
                                includes=frozenset({check})))
    assert not ok and body["status"] == "not ready"
    assert len(body["reasons"]) == 1 and body["warnings"] == [], body  # type: ignore[arg-type]
    # The other check stays a warning only.
    other = next(c for c in DOWNSTREAM_CHECKS if c != check)
    ok, body = readiness(inputs(**DOWNSTREAM_FAILURES[failure],  # type: ignore[arg-type]
                                includes=frozenset({other})))
    assert ok and body["warnings"]


def test_the_reasons_name_the_sink_and_the_file() -> None:
    every = frozenset(DOWNSTREAM_CHECKS)
    ok, body = readiness(inputs(sinks=(sink("eventhubs", oldest_wait=31.0), sink("otlp")),
                                faults=(STATE_FAULT,), includes=every))
    assert not ok
    assert body["reasons"] == ["sink eventhubs failing",
                               "cannot write /state/state.json: ENOSPC: No space left on device"]
    assert body["sinks"]["otlp"]["failing"] is False  # type: ignore[index]
    assert body["storage"] == {"writable": False, "faults": [{
        "file": "/state/state.json", "error": "ENOSPC: No space left on device",
        "failing_for_seconds": 50.0, "failed_writes": 12}]}


def test_an_idle_sink_is_not_failing_however_long_it_has_been_idle() -> None:
    ok, body = readiness(inputs(sinks=(sink(),), includes=frozenset(DOWNSTREAM_CHECKS)))
    assert ok and body["warnings"] == []


@pytest.mark.parametrize("includes", [frozenset(), frozenset(DOWNSTREAM_CHECKS)],
                         ids=["imds only", "downstream too"])
def test_stale_or_missing_imds_data_is_never_ready(includes: frozenset[str]) -> None:
    assert readiness(inputs(good_age=LIMIT, includes=includes))[0]
    ok, body = readiness(inputs(good_age=LIMIT + 0.5, includes=includes))
    assert not ok and body["reasons"] == ["last good IMDS document 30.5 s ago"]
    ok, body = readiness(inputs(good_age=None, includes=includes))
    assert not ok and body["reasons"] == ["no good IMDS document yet"]


def test_a_refused_api_version_is_not_ready_at_once() -> None:
    ok, body = readiness(inputs(outcome=Outcome.API_VERSION_REFUSED.value))
    assert not ok and "SEE_IMDS_API_VERSION" in body["reasons"][0]  # type: ignore[index]


def test_liveness_ignores_everything_downstream_and_imds_staleness() -> None:
    # /healthz keeps its promise: only a wedged poll loop fails it.
    assert liveness(inputs(good_age=None, sinks=(sink(oldest_wait=500.0),),
                           faults=(STATE_FAULT,)))[0]
    ok, body = liveness(inputs(last_tick_age=1000.0))
    assert not ok and body["status"] == "stalled"


def test_a_sink_refused_for_its_configuration_says_what_to_fix() -> None:
    # A redirect or a refused credential is not a slow collector: the warning says so.
    ok, body = readiness(inputs(sinks=(sink("otlp", config_error="OTLP collector answered "
                                            "HTTP 308: redirected to https://x.example/"),)))
    assert ok
    assert body["warnings"] == ["sink otlp failing: OTLP collector answered HTTP 308: "
                                "redirected to https://x.example/"]
