"""The demo's closing summary: what a newcomer should take away from the records it printed.

A pure function of the records (plus the scenario's speed), so it is tested without running
anything. Times are given twice: as they passed on this machine, and scaled to the scenario's own
clock ("15 min notice" in a scenario played at x30 passes in 30 real seconds).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from scheduled_events_exporter.model import Basis
from scheduled_events_exporter.records import TransitionRecord


@dataclass
class RecordCollector:
    """A :class:`~scheduled_events_exporter.poller.Submitter` that keeps every record."""

    records: list[TransitionRecord] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def submit(self, records: Sequence[TransitionRecord]) -> None:
        """Keep ``records`` (called on the poll thread)."""
        with self._lock:
            self.records.extend(records)

    def snapshot(self) -> list[TransitionRecord]:
        """The records so far, in order."""
        with self._lock:
            return list(self.records)


def _duration(seconds: float) -> str:
    seconds = abs(seconds)
    if seconds >= 90:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.1f} s"


def summarize(records: Sequence[TransitionRecord], speed: float) -> list[str]:
    """Lines describing each event (transitions, notice, impact) and the dashboard's view."""
    lines = ["demo summary (times on this machine; in brackets, on the scenario's clock at "
             f"x{speed:g}):"]
    by_event: dict[str, list[TransitionRecord]] = {}
    for record in records:
        event = record.transition.event
        if event is not None:
            by_event.setdefault(event.event_id, []).append(record)
    pending = peak = 0
    for record in records:
        kind = record.transition.kind.value
        if kind in ("scheduled", "started") and record.transition.previous_status is None:
            pending += 1
        elif record.transition.kind.is_end:
            pending -= 1
        peak = max(peak, pending)
    for event_id, own in by_event.items():
        event = own[0].transition.event
        assert event is not None
        # The basis where it tells something: every watched event has continuous_watch.
        chain = " -> ".join(
            r.transition.kind.value
            + (f" ({r.transition.outcome_basis})" if r.transition.outcome_basis
               and r.transition.outcome_basis != Basis.CONTINUOUS_WATCH else "")
            for r in own)
        notice = next((r.transition.notice for r in own if r.transition.notice is not None), None)
        notice_text = ("no notice (first seen already Started)" if notice is None
                       else f"notice {_duration(notice)} [{_duration(notice * speed)}]")
        impact = (f"impact {event.duration} s" if event.duration >= 0
                  else "impact duration unknown")
        lines.append(f"  {event.event_type or 'Event'} {event_id[:8]} for "
                     f"{', '.join(event.resources) or 'no resources'}: {chain}; {notice_text}; "
                     f"{impact}")
    if not by_event:
        lines.append("  no events were seen")
    lines.append(f"  dashboard: pending events now {pending} (peak {peak}); "
                 "azure.scheduled_events.time_to_not_before counted each NotBefore down while "
                 "it was Scheduled")
    return lines
