"""Document parser: documented shapes, tolerated extras, and everything that must be an error."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduled_events_exporter.parser import (
    MAX_DOCUMENT_BYTES,
    DocumentError,
    parse_document,
    parse_not_before,
)
from tests.budget import examples

DOC = {
    "DocumentIncarnation": 2,
    "Events": [
        {
            "EventId": "C7061BAC-AFDC-4513-B24B-AA5F13A16123",
            "EventStatus": "Scheduled",
            "EventType": "Freeze",
            "ResourceType": "VirtualMachine",
            "Resources": ["WestNO_0", "WestNO_1"],
            "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT",
            "Description": "Virtual machine is being paused because of a memory-preserving "
            "Live Migration operation.",
            "EventSource": "Platform",
            "DurationInSeconds": 5,
        }
    ],
}


def raw(doc: object) -> bytes:
    return json.dumps(doc).encode()


def test_documented_example() -> None:
    doc = parse_document(raw(DOC))
    assert doc.incarnation == 2
    (e,) = doc.events
    assert e.event_id == "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
    assert e.not_before == datetime(2022, 4, 11, 22, 26, 58, tzinfo=timezone.utc)
    assert e.resources == ("WestNO_0", "WestNO_1") and e.duration == 5 and e.source == "Platform"


def test_empty_events_and_bom_and_unknown_fields() -> None:
    body = b"\xef\xbb\xbf" + raw({"DocumentIncarnation": 1, "Events": [], "Future": {"x": 1}})
    assert parse_document(body).events == ()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Mon, 11 Apr 2022 22:26:58 GMT", datetime(2022, 4, 11, 22, 26, 58, tzinfo=timezone.utc)),
        ("2022-04-11T22:26:58Z", datetime(2022, 4, 11, 22, 26, 58, tzinfo=timezone.utc)),
        ("2022-04-11T23:26:58+01:00", datetime(2022, 4, 11, 22, 26, 58, tzinfo=timezone.utc)),
        ("2022-04-11T22:26:58.123456",
         datetime(2022, 4, 11, 22, 26, 58, 123456, tzinfo=timezone.utc)),
        ("", None),
        ("   ", None),
        ("tomorrow", None),
        ("Mon, 99 Apr 2022 22:26:58 GMT", None),
        ("9999-12-31T23:59:59Z", datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone.utc)),
        ("1970-01-01T00:00:00Z", datetime(1970, 1, 1, tzinfo=timezone.utc)),
        ("x" * 10_000, None),
    ],
)
def test_not_before_forms(text: str, expected: datetime | None) -> None:
    assert parse_not_before(text) == expected


def test_missing_optional_fields_get_documented_defaults() -> None:
    doc = parse_document(
        raw({"DocumentIncarnation": 1, "Events": [{"EventId": "X", "EventStatus": "Started"}]})
    )
    (e,) = doc.events
    assert (e.duration, e.resources, e.not_before, e.source, e.event_type) == (-1, (), None, "", "")


def test_unparseable_not_before_keeps_raw_text_and_the_document() -> None:
    body = json.loads(raw(DOC))
    body["Events"][0]["NotBefore"] = "next tuesday"
    (e,) = parse_document(raw(body)).events
    assert e.not_before is None and e.not_before_raw == "next tuesday"


def _with_event(**changes: object) -> bytes:
    body = json.loads(raw(DOC))
    body["Events"][0].update(changes)
    return raw(body)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "not JSON"),
        (b"<html><body>Service Unavailable</body></html>", "not JSON"),
        (raw(DOC)[:-10], "not JSON"),
        (b"\xff\xfe\x00garbage", "not UTF-8"),
        (b"[]", "expected a JSON object, got list"),
        (b"null", "expected a JSON object"),
        (raw({"Events": []}), "DocumentIncarnation to be an integer, got nothing"),
        (raw({"DocumentIncarnation": "x", "Events": {}}), "DocumentIncarnation to be an integer"),
        (raw({"DocumentIncarnation": True, "Events": []}), "DocumentIncarnation to be an integer"),
        (raw({"DocumentIncarnation": 1}), "Events to be a list, got nothing"),
        (raw({"DocumentIncarnation": 1, "Events": {}}), "Events to be a list"),
        (raw({"DocumentIncarnation": 1, "Events": ["x"]}), "Events[0]: expected an object"),
        (_with_event(EventId=None), "missing EventId"),
        (_with_event(EventId=""), "EventId is empty"),
        (_with_event(EventId=7), "EventId to be a string"),
        (_with_event(EventStatus=None), "missing EventStatus"),
        (_with_event(Resources="WestNO_0"), "Resources to be a list of strings"),
        (_with_event(Resources=[1]), "Resources to be a list of strings"),
        (_with_event(DurationInSeconds="5"), "DurationInSeconds to be an integer"),
        (_with_event(DurationInSeconds=1.5), "DurationInSeconds to be an integer"),
        (_with_event(NotBefore=5), "NotBefore to be a string"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    ],
)
def test_malformed_documents_are_errors_never_empty(body: bytes, message: str) -> None:
    with pytest.raises(DocumentError) as info:
        parse_document(body)
    assert message in str(info.value)


def test_a_repeated_event_id_keeps_one_event_and_the_rest_of_the_document() -> None:
    body = json.loads(raw(DOC))
    first = body["Events"][0]
    other = {**first, "EventId": "OTHER", "EventType": "Reboot"}
    body["Events"] = [first, other, {**first, "EventStatus": "Started", "NotBefore": ""}]
    doc = parse_document(raw(body))
    # One event per EventId, at its first position, with the last occurrence's content.
    assert [(e.event_id, e.status) for e in doc.events] == [
        ("C7061BAC-AFDC-4513-B24B-AA5F13A16123", "Started"), ("OTHER", "Scheduled")]
    (anomaly,) = doc.anomalies
    assert anomaly.kind == "duplicate_event_id" and "Events[2]" in anomaly.detail


@pytest.mark.parametrize("field", ["EventId", "EventStatus", "EventType", "ResourceType",
                                   "Description", "EventSource", "NotBefore", "Resources"])
def test_lone_surrogates_are_replaced_at_the_parser_so_no_later_stage_meets_them(
        field: str) -> None:
    body = json.loads(raw(DOC))
    event = body["Events"][0]
    event[field] = ["vm\ud800"] if field == "Resources" else event[field] + "\udfff"
    text = json.dumps(body).replace("\\\\ud800", "\\ud800").replace("\\\\udfff", "\\udfff")
    doc = parse_document(text.encode())
    (parsed,) = doc.events
    texts = [parsed.event_id, parsed.status, parsed.event_type, parsed.resource_type,
             parsed.description, parsed.source, parsed.not_before_raw, *parsed.resources]
    for value in texts:
        value.encode("utf-8")  # raises on a surrogate
    if field != "NotBefore":  # a date parser that stops at the surrogate loses nothing
        assert any("\ufffd" in value for value in texts)
        assert [a.kind for a in doc.anomalies] == ["invalid_unicode"]


def test_new_event_types_and_statuses_pass_through_unchanged() -> None:
    body = json.loads(raw(DOC))
    body["Events"][0].update(EventType="SpotRebalanceRecommendation", EventStatus="Advisory",
                             NewField={"x": 1})
    (event,) = parse_document(raw(body)).events
    assert (event.event_type, event.status) == ("SpotRebalanceRecommendation", "Advisory")
    assert not event.is_started


def test_oversized_document_is_rejected_before_decoding() -> None:
    with pytest.raises(DocumentError, match="expected at most"):
        parse_document(b" " * (MAX_DOCUMENT_BYTES + 1))


def test_huge_strings_are_bounded_and_absurd_numbers_clamped() -> None:
    body = _with_event(Description="d" * 1_000_000, DurationInSeconds=10**30)
    doc = json.loads(body)
    doc["DocumentIncarnation"] = -(10**40)
    (e,) = parse_document(raw(doc)).events
    assert len(e.description) < 10_000 and e.description.endswith("[truncated]")
    assert e.duration == 2**62
    assert parse_document(raw(doc)).incarnation == -(2**62)


def test_error_excerpt_is_short_and_printable() -> None:
    with pytest.raises(DocumentError) as info:
        parse_document(b"\x00\x01<html>" + b"x" * 5000)
    assert len(info.value.excerpt) <= 120 and info.value.excerpt.isprintable()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)
event_like = st.fixed_dictionaries(
    {},
    optional={
        "EventId": st.one_of(st.text(max_size=10), json_values),
        "EventStatus": st.one_of(st.sampled_from(["Scheduled", "Started"]), json_values),
        "Resources": st.one_of(st.lists(st.text(max_size=5), max_size=3), json_values),
        "NotBefore": st.one_of(st.text(max_size=40), json_values),
        "DurationInSeconds": st.one_of(st.integers(), json_values),
    },
)
documents = st.fixed_dictionaries(
    {},
    optional={
        "DocumentIncarnation": st.one_of(st.integers(), json_values),
        "Events": st.one_of(st.lists(event_like, max_size=4), json_values),
    },
)


@settings(max_examples=examples(1000), deadline=None)
@given(st.one_of(documents.map(raw), st.binary(max_size=200)))
def test_fuzz_only_document_errors_escape(body: bytes) -> None:
    try:
        doc = parse_document(body)
    except DocumentError:
        return
    assert isinstance(doc.incarnation, int)
    assert all(e.event_id.strip() for e in doc.events)


# --- the parser and the tracker together, fed thousands of generated documents ---

event_docs = st.lists(
    st.fixed_dictionaries(
        {
            "EventId": st.sampled_from(["A", "B", "C", "D"]),
            "EventStatus": st.sampled_from(["Scheduled", "Started", "Odd", ""]),
        },
        optional={
            "NotBefore": st.sampled_from(["", "Thu, 01 Jan 1970 00:00:00 GMT",
                                          "9999-12-31T23:59:59Z", "garbage", "2030-01-01T00:00Z"]),
            "DurationInSeconds": st.integers(-(2**70), 2**70),
            "Resources": st.lists(st.text(max_size=8), max_size=3),
            "Description": st.text(max_size=50),
        },
    ),
    max_size=4,
    unique_by=lambda e: e["EventId"],
)
chain = st.lists(
    st.one_of(
        st.tuples(st.integers(-(2**70), 2**70), event_docs).map(
            lambda t: raw({"DocumentIncarnation": t[0], "Events": t[1]})
        ),
        st.binary(max_size=64),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=examples(300), deadline=None)
@given(chain)
def test_fuzz_parse_then_track_never_raises_and_stays_bounded(bodies: list[bytes]) -> None:
    import tracemalloc
    from datetime import timedelta

    from scheduled_events_exporter.tracker import TrackerState, track

    state = TrackerState()
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    tracemalloc.start()
    try:
        for body in bodies:
            now += timedelta(seconds=1)
            try:
                doc = parse_document(body)
            except DocumentError:
                continue  # an error outcome: the known state must stay as it was
            state, transitions = track(state, doc, now, gap_threshold=3.0)
            assert set(state.events) == {e.event_id for e in doc.events}
            assert all(t.incarnation == doc.incarnation for t in transitions)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 5 * 1024 * 1024


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Forms Python 3.10's datetime.fromisoformat rejects: one grammar on every Python.
        ("2022-04-11T22:26:58Z", datetime(2022, 4, 11, 22, 26, 58, tzinfo=timezone.utc)),
        ("2022-04-11t22:26:58z", datetime(2022, 4, 11, 22, 26, 58, tzinfo=timezone.utc)),
        ("2022-04-11T22:26:58.1Z", datetime(2022, 4, 11, 22, 26, 58, 100000, tzinfo=timezone.utc)),
        ("2022-04-11T22:26:58.123456789Z",
         datetime(2022, 4, 11, 22, 26, 58, 123456, tzinfo=timezone.utc)),
        ("2022-04-11T23:26:58+0100", datetime(2022, 4, 11, 22, 26, 58, tzinfo=timezone.utc)),
        ("2022-04-11T20:26:58-02", datetime(2022, 4, 11, 22, 26, 58, tzinfo=timezone.utc)),
        ("2022-04-11 22:26", datetime(2022, 4, 11, 22, 26, tzinfo=timezone.utc)),
        ("2022-04-11", datetime(2022, 4, 11, tzinfo=timezone.utc)),
        ("2022-13-11T22:26:58Z", None),
        ("2022-04-11T25:26:58Z", None),
        ("2022-04-11T22:26:58+25:00", None),
        ("2022-04-11T22:26:58Zjunk", None),
        ("20220411T222658Z", None),
    ],
)
def test_iso_not_before_is_read_the_same_on_every_python(
    text: str, expected: datetime | None
) -> None:
    assert parse_not_before(text) == expected
