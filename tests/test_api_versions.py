"""A refused api-version: IMDS answers 400 with the versions it serves (``newest-versions``).

Pure parts (the version table, reading the refusal, the advice), the client over real HTTP
against the simulator (classified by status and structure, never by the message text), and the
installed exporter: one log line that says what was sent, what is offered and what to do; its
own outcome; not ready at once; never "no events"; ready again when IMDS serves it again.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from scheduled_events_exporter import api_versions
from scheduled_events_exporter.imds import ImdsClient, PollResult
from scheduled_events_exporter.model import Outcome
from scheduled_events_exporter.simulator import Fault, Simulator
from tests.exporter_process import ExporterProcess, clean_env, free_port, get_json, state_dir
from tests.test_hostile import event

REFUSAL = (b'{"error": "Bad request. api-version \'2020-07-01\' is invalid. For more information '
           b'refer to aka.ms/azureimds", "newest-versions": ["2023-07-01", "2021-12-13", '
           b'"2021-02-01"]}')


# --- the version table and the refusal (pure) ------------------------------------------------

def test_the_documented_versions_and_what_older_ones_lack() -> None:
    assert api_versions.check("2020-07-01") == ("2020-07-01", [])
    version, warnings = api_versions.check("2019-08-01")
    assert version == "2019-08-01" and "DurationInSeconds" in warnings[0]
    _, warnings = api_versions.check("2017-11-01")
    assert "EventSource" in warnings[0] and "it looks unannounced" in warnings[0]
    _, warnings = api_versions.check("2024-05-01")  # newer than the table: usable, said so
    assert "not a version this exporter knows" in warnings[0]


@pytest.mark.parametrize("bad", ["latest", "{latest}", "2020-7-1", "2020-13-01", "2020-02-30",
                                 "2017-03-01", "2020-07-01;x", "2020-07-01 ", "٢٠٢٠-٠٧-٠١"])
def test_versions_that_are_not_accepted(bad: str) -> None:
    with pytest.raises(ValueError):
        api_versions.check(bad)


def test_offered_versions_are_read_from_the_structure_only() -> None:
    assert api_versions.offered(REFUSAL) == ("2023-07-01", "2021-12-13", "2021-02-01")
    # The wording alone never makes a refusal: no newest-versions, no refusal.
    assert api_versions.offered(b'{"error": "Bad request. api-version is invalid"}') is None
    for body in (b"", b"not json", b"[]", b'{"newest-versions": "2020-07-01"}', b"\xff\xfe",
                 b"[" * 100_000):
        assert api_versions.offered(body) is None, body
    # Hostile entries are dropped, the list is bounded.
    hostile = json.dumps({"newest-versions": [1, None, {"a": 1}, "x" * 10_000, "2021-01-01\n",
                                              "2021-01-01", *["2020-07-01"] * 1000]}).encode()
    kept = api_versions.offered(hostile)
    assert kept is not None and kept[0] == "2021-01-01" and len(kept) <= 50


def test_the_advice_names_the_version_to_set() -> None:
    # A version from the current one on keeps its fields: the newest such is the advice.
    line = api_versions.refusal("2020-07-01", ("2023-07-01", "2019-08-01", "2019-01-01"))
    assert line == ("IMDS refuses api-version=2020-07-01 (HTTP 400) and offers: 2023-07-01, "
                    "2019-08-01, 2019-01-01; set SEE_IMDS_API_VERSION=2023-07-01 (the newest "
                    "offered; newer than this exporter knows, read by the 2020-07-01 rules). "
                    "No events are read until then")
    # Only older ones: the newest this exporter knows, and what its documents lack.
    older = api_versions.refusal("2020-07-01", ("2019-08-01", "2019-01-01"))
    assert "set SEE_IMDS_API_VERSION=2019-08-01 (the newest offered that this exporter knows; " \
           "its documents lack DurationInSeconds) or upgrade the exporter" in older
    assert "offers: none listed; check SEE_IMDS_API_VERSION" in api_versions.refusal(
        "2020-07-01", ())


def test_an_older_versions_warning_names_only_what_it_lacks() -> None:
    (warning,) = api_versions.check("2019-08-01")[1]
    assert "lack DurationInSeconds: records show DurationInSeconds -1;" in warning
    assert "EventSource" not in warning and "Description" not in warning
    (warning,) = api_versions.check("2019-04-01")[1]
    assert "EventSource empty" in warning and "Description" not in warning


# --- the client over HTTP ---------------------------------------------------------------------

def _poll(sim: Simulator, api_version: str = api_versions.DEFAULT) -> PollResult:
    client = ImdsClient(sim.url, first_timeout=5, timeout=5, api_version=api_version)
    try:
        return client.fetch_events()
    finally:
        client.close()


def test_the_client_classifies_a_refusal_by_status_and_structure(sim: Simulator) -> None:
    sim.set_api_versions(["2021-02-01", "2021-12-13", "2023-07-01"])
    result = _poll(sim)
    assert result.outcome is Outcome.API_VERSION_REFUSED and result.status == 400
    assert result.offered == ("2023-07-01", "2021-12-13", "2021-02-01")
    assert sim.requests[-1].query == "api-version=2020-07-01"
    # The version the configuration names is the one sent.
    sim.set_api_versions(["2019-08-01"])
    sim.set_events([event("A")])
    result = _poll(sim, "2019-08-01")
    assert result.outcome is Outcome.OK
    assert result.document is not None and result.document.events[0].duration == -1


@pytest.mark.parametrize(("status", "body", "outcome"), [
    (400, b'{"error": "Bad request. api-version \'2020-07-01\' is invalid"}', Outcome.CLIENT_ERROR),
    (400, b"Bad request. api-version is invalid", Outcome.CLIENT_ERROR),
    (500, REFUSAL, Outcome.SERVER_ERROR),
    (404, REFUSAL, Outcome.CLIENT_ERROR),
    (400, REFUSAL, Outcome.API_VERSION_REFUSED),
])
def test_never_by_the_message_text(sim: Simulator, status: int, body: bytes,
                                   outcome: Outcome) -> None:
    sim.push_fault(Fault("status", status=status, body=body))
    assert _poll(sim).outcome is outcome


# --- the installed exporter -------------------------------------------------------------------

def test_a_refused_version_is_one_line_its_own_outcome_and_not_ready_at_once(
        sim: Simulator, tmp_path: Path) -> None:
    health, scrape = free_port(), free_port()
    sim.set_events([event("A")])
    sim.set_api_versions(["2021-02-01", "2023-07-01"])
    env = clean_env(SEE_IMDS_ENDPOINT=sim.url, SEE_SINKS="console",
                    SEE_STATE_DIR=state_dir(tmp_path), SEE_POLL_INTERVAL="0.2",
                    SEE_HEALTH_ADDR=f"127.0.0.1:{health}", OTEL_METRICS_EXPORTER="prometheus",
                    OTEL_EXPORTER_PROMETHEUS_PORT=str(scrape))
    with ExporterProcess(env) as proc:
        proc.wait_for(lambda: "IMDS refuses" in proc.stderr(), 30, "the refusal line")
        sim.wait_for_requests(6, 30)  # a few more refusals: still one line
        status, body = get_json(f"http://127.0.0.1:{health}/readyz")
        assert status == 503 and body["imds_last_outcome"] == "api_version_refused", body
        assert any("api-version" in reason for reason in body["reasons"]), body
        with urllib.request.urlopen(f"http://127.0.0.1:{scrape}/metrics", timeout=5) as answer:
            scraped = answer.read().decode()
        assert 'outcome="api_version_refused"' in scraped
        assert proc.records() == [], "a refusal is never read as a document"

        sim.set_api_versions(["2019-08-01", "2020-07-01"])  # served again
        records = proc.wait_for_records(1, 30)
        proc.wait_for(lambda: get_json(f"http://127.0.0.1:{health}/readyz")[0] == 200, 30,
                      "ready again")
        assert proc.terminate() == 0
    lines = [line for line in proc.stderr().splitlines() if "IMDS refuses" in line]
    assert len(lines) == 1, lines
    assert lines[0].endswith(
        "ERROR scheduled_events_exporter.poller: IMDS refuses api-version=2020-07-01 (HTTP 400) "
        "and offers: 2023-07-01, 2021-02-01; set SEE_IMDS_API_VERSION=2023-07-01 (the newest "
        "offered; newer than this exporter knows, read by the 2020-07-01 rules). No events are "
        "read until then"), lines[0]
    assert "has not given a document" not in proc.stderr()  # IMDS answered: no reminder
    assert "IMDS answering again after api_version_refused" in proc.stderr()
    assert [(r["EventId"], r["Transition"]) for r in records] == [("A", "scheduled")]


def test_check_config_validates_and_explains_the_version() -> None:
    def check(value: str) -> subprocess.CompletedProcess[str]:
        env = clean_env(SEE_IMDS_API_VERSION=value, SEE_STATE_DIR="")
        return subprocess.run([sys.executable, "-m", "scheduled_events_exporter",
                               "check-config"], env=env, capture_output=True, text=True,
                              timeout=60, check=False)

    good = check("2019-08-01")
    assert good.returncode == 0 and "SEE_IMDS_API_VERSION=2019-08-01" in good.stdout
    assert "lack DurationInSeconds" in good.stderr
    bad = check("latest")
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        "configuration error: SEE_IMDS_API_VERSION='latest': expected a Scheduled Events "
        "api-version, a date from 2017-08-01 on (default 2020-07-01) ('latest' is not a date)")
