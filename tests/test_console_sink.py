"""The console sink writes one JSON object per line, whatever stdout's encoding: a Windows
service's redirected stdout is in the ANSI code page, where text outside it would fail every
write (and the record would be retried for ever)."""

from __future__ import annotations

import io
import json

import pytest
from opentelemetry.sdk.resources import Resource

from scheduled_events_exporter.config import Config
from scheduled_events_exporter.model import ScheduledEvent, Transition, TransitionKind
from scheduled_events_exporter.records import make_record
from scheduled_events_exporter.sinks.console import ConsoleSink
from tests.test_records import AT, NOT_BEFORE, VM

DESCRIPTION = "Wartung 维护 — ホスト"


def record(seq: int) -> object:
    event = ScheduledEvent(f"E-{seq}", "Scheduled", "Reboot", "VirtualMachine", ("WestNO_0",),
                           NOT_BEFORE, description=DESCRIPTION)
    return make_record(Transition(TransitionKind.SCHEDULED, AT, 2, event, notice=900.0), VM,
                       seq=seq)


@pytest.mark.parametrize("encoding", ["utf-8", "cp1252", "ascii"])
def test_every_line_is_json_with_the_text_intact(encoding: str) -> None:
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding=encoding, write_through=True)
    sink = ConsoleSink(Config(), lambda *_: None, stream=stream)
    sink.start(Resource.get_empty())
    sink.submit([record(1), record(2)])  # type: ignore[list-item]
    assert sink.shutdown(10), "not delivered"  # a shutdown delivers what is queued first
    lines = raw.getvalue().decode(encoding).splitlines()
    assert [json.loads(line)["Description"] for line in lines] == [DESCRIPTION] * 2
    assert ("维护" in lines[0]) == (encoding == "utf-8")  # escaped only where it must be
