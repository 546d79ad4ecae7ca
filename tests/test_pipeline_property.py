"""A property over the whole pipeline: no document, however odd, makes any stage raise.

parse → track (with evidence) → record → every sink's rendering (console line, Event Hubs
message, OTLP log record and its protobuf encoding, the dead-letter payload) → metrics (the
counters, the gauges' collection, the Prometheus text). Strings come from the whole Unicode
range, lone surrogates and control characters included; numbers from absurd ranges.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource

from scheduled_events_exporter.model import InstanceInfo
from scheduled_events_exporter.parser import DocumentError, parse_document
from scheduled_events_exporter.records import for_log, make_record, to_columns
from scheduled_events_exporter.sinks.console import render
from scheduled_events_exporter.sinks.eventhubs import transition_message
from scheduled_events_exporter.sinks.otlp_proto import logs_request, metrics_request
from scheduled_events_exporter.telemetry import GaugeSnapshot, Telemetry
from scheduled_events_exporter.tracker import Evidence, TrackerState, track

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
text = st.one_of(
    st.text(max_size=30),
    st.text(alphabet=st.characters(codec=None, blacklist_categories=()), max_size=12),
    st.sampled_from(["Scheduled", "Started", "Freeze", "Reboot", "Platform", "User", "",
                     "Mon, 11 Apr 2022 22:26:58 GMT", "2022-04-11T22:26:58Z", "\ud800",
                     "a\x00b", "\u2028", "\x1b[31m"]),
)
value = st.one_of(text, st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
                  st.none(), st.booleans(), st.lists(text, max_size=3))
#: Well-formed events with hostile text (most examples), and anything at all (some).
good_event = st.fixed_dictionaries(
    {"EventId": st.one_of(st.sampled_from(["A", "B", "C"]), text.map(lambda t: "E" + t)),
     "EventStatus": st.one_of(text, st.sampled_from(["Scheduled", "Started"])),
     "EventType": text, "ResourceType": text, "Resources": st.lists(text, max_size=4),
     "NotBefore": st.one_of(text, st.sampled_from(["Mon, 11 Apr 2022 22:26:58 GMT", ""])),
     "Description": text, "EventSource": text,
     "DurationInSeconds": st.one_of(st.integers(-(2**70), 2**70), st.none())},
)
wild_event = st.fixed_dictionaries(
    {"EventId": st.one_of(text, st.sampled_from(["A", "B", "C"]))},
    optional={"EventStatus": text, "EventType": text, "ResourceType": text,
              "Resources": st.one_of(st.lists(text, max_size=4), value),
              "NotBefore": value, "Description": value, "EventSource": text,
              "DurationInSeconds": value, "Extra": value},
)
# Weighted by a drawn index (one_of flattens nested alternatives, which would let the many
# malformed shapes crowd out the well-formed ones).
event = st.sampled_from([0, 0, 0, 1]).flatmap(lambda k: wild_event if k else good_event)
wellformed = st.fixed_dictionaries({
    "DocumentIncarnation": st.integers(-5, 2**65) | st.integers(0, 8),
    "Events": st.lists(event, max_size=5),
})
malformed = st.fixed_dictionaries({"DocumentIncarnation": value, "Events": value})
document = st.sampled_from([0, 0, 0, 1]).flatmap(lambda k: malformed if k else wellformed)


def raw(doc: object) -> bytes:
    # json.dumps escapes lone surrogates as \udXXX, which is what a hostile IMDS would send.
    return json.dumps(doc).encode()


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(document, min_size=1, max_size=5), st.sampled_from(["vm1", "", "\ud800"]))
def test_no_document_makes_any_stage_raise(docs: list[object], boot: str) -> None:
    reader = InMemoryMetricReader()
    telemetry = Telemetry(readers=[reader], wall=lambda: T0)
    resource = Resource.create({})
    instance = InstanceInfo(vm_name="vm1", vm_id="id")
    state = TrackerState()
    for step, doc in enumerate(docs):
        try:
            parsed = parse_document(raw(doc))
        except DocumentError as exc:
            for_log(str(exc)).encode()
            continue
        state, transitions = track(state, parsed, T0 + timedelta(seconds=step), gap_threshold=3,
                                   evidence=Evidence(boot_id=boot or None, vm_name="vm1"))
        records = [make_record(t, instance, seq=i) for i, t in enumerate(transitions, 1)]
        for record in records:
            render(record).encode("utf-8")
            json.dumps(to_columns(record), ensure_ascii=False).encode("utf-8")
            transition_message(record)
            for_log(record.record_id).encode()
            telemetry.record_transition(record)
        if records:
            logs_request(records, resource).SerializeToString()
        for anomaly in parsed.anomalies:
            telemetry.record_anomaly(anomaly.kind)
        telemetry.publish(GaugeSnapshot(events=tuple(k.event for k in state.events.values()),
                                        vm_name="vm1", incarnation=state.incarnation))
        metrics_request(reader.get_metrics_data()).SerializeToString()  # type: ignore[arg-type]
        telemetry.per_event_metrics()
