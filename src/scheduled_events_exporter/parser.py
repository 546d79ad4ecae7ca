"""IMDS Scheduled Events document parser: bytes in, :class:`Document` or :class:`DocumentError` out.

Tolerant of what the platform may add (unknown fields are ignored, optional fields get the
documented defaults) and strict about what would make us lie: a document that is not an object
with an integer ``DocumentIncarnation`` and a list of well-formed events is an error, never
"no events".
"""

from __future__ import annotations

import functools
import json
import re
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from typing import Final

from scheduled_events_exporter.model import Anomaly, Document, ScheduledEvent

#: A real document is a few KB; anything far larger is hostile or broken.
MAX_DOCUMENT_BYTES: Final = 4 * 1024 * 1024
MAX_EVENTS: Final = 2_000
#: Bounds for strings we keep in state and ship (Description can be long but not megabytes).
MAX_STRING: Final = 8 * 1024
MAX_RESOURCES: Final = 1_000
_EXCERPT: Final = 120
#: A JSON ``\\ud800``-style escape yields a lone surrogate: a ``str`` no UTF-8 encoder accepts.
_SURROGATE: Final = re.compile("[\ud800-\udfff]")


class DocumentError(ValueError):
    """The response body is not a usable Scheduled Events document."""

    def __init__(self, reason: str, raw: bytes = b"") -> None:
        self.reason = reason
        self.excerpt = excerpt(raw)
        super().__init__(f"{reason} (body starts: {self.excerpt!r})" if raw else reason)


def excerpt(raw: bytes) -> str:
    """A short printable prefix of a body for error messages."""
    text = raw[:_EXCERPT].decode("utf-8", errors="replace")
    return "".join(ch if ch.isprintable() else "?" for ch in text)


_RFC1123 = re.compile(
    r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), (\d{2}) (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) "
    r"(\d{4}) (\d{2}):(\d{2}):(\d{2}) GMT"
)
# ISO 8601 / RFC 3339 as IMDS-adjacent tools write it. One grammar on every Python: 3.10's
# datetime.fromisoformat rejects "Z" and most fraction lengths that 3.11 accepts.
_ISO = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})"
    r"(?:[Tt ](\d{2}):(\d{2})(?::(\d{2})(?:[.,](\d{1,9}))?)?)?"
    r"([Zz]|[+-]\d{2}(?::?\d{2})?)?"
)
_MONTHS: Final = {m: i for i, m in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1)}


@functools.lru_cache(maxsize=4096)
def parse_not_before(text: str) -> datetime | None:
    """NotBefore as RFC 1123 (documented), ISO 8601/RFC 3339, or empty → UTC datetime or None.

    Returns ``None`` for empty or unparseable text; the caller keeps the raw text. The
    documented form takes a fast path, and results are cached: the same NotBefore comes back
    in every changed document while its event is pending.
    """
    match = _RFC1123.fullmatch(text)
    if match is not None:
        day, month, year, hour, minute, second = match.groups()
        try:
            return datetime(int(year), _MONTHS[month], int(day), int(hour), int(minute),
                            int(second), tzinfo=timezone.utc)
        except ValueError:
            return None
    text = text.strip()
    if not text or len(text) > 64:
        return None
    moment: datetime | None = None
    if text[0].isdigit():
        try:
            moment = _parse_iso(text)
        except (ValueError, OverflowError):
            return None
    else:
        try:
            moment = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    if moment is None:
        return None
    if moment.tzinfo is None:
        # IMDS times are UTC ("GMT"); a naive ISO value is read the same way.
        moment = moment.replace(tzinfo=timezone.utc)
    try:
        return moment.astimezone(timezone.utc)
    except (OverflowError, ValueError):
        return None


def _parse_iso(text: str) -> datetime | None:
    match = _ISO.fullmatch(text)
    if match is None:
        return None
    year, month, day, hour, minute, second, fraction, offset = match.groups()
    micros = int((fraction or "0")[:6].ljust(6, "0"))
    tz: timezone | None = None
    if offset is not None:
        if offset in ("Z", "z"):
            tz = timezone.utc
        else:
            digits = offset[1:].replace(":", "")
            delta = timedelta(hours=int(digits[:2]), minutes=int(digits[2:] or "0"))
            tz = timezone(-delta if offset[0] == "-" else delta)
    return datetime(int(year), int(month), int(day), int(hour or 0), int(minute or 0),
                    int(second or 0), micros, tzinfo=tz)


def parse_document(raw: bytes) -> Document:
    """Parse a response body. Raises :class:`DocumentError` for anything unusable."""
    if len(raw) > MAX_DOCUMENT_BYTES:
        raise DocumentError(
            f"document is {len(raw)} bytes, expected at most {MAX_DOCUMENT_BYTES}", raw
        )
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DocumentError(f"body is not UTF-8 ({exc.reason} at byte {exc.start})", raw) from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise DocumentError("JSON nested too deeply", raw) from None
    except ValueError as exc:
        raise DocumentError(f"body is not JSON ({exc})", raw) from None
    if not isinstance(data, dict):
        raise DocumentError(f"expected a JSON object, got {type(data).__name__}", raw)
    incarnation = data.get("DocumentIncarnation")
    if not _is_int(incarnation):
        raise DocumentError(
            f"expected DocumentIncarnation to be an integer, got {_describe(incarnation)}", raw
        )
    events_raw = data.get("Events")
    if not isinstance(events_raw, list):
        raise DocumentError(f"expected Events to be a list, got {_describe(events_raw)}", raw)
    if len(events_raw) > MAX_EVENTS:
        raise DocumentError(f"{len(events_raw)} events, expected at most {MAX_EVENTS}", raw)
    # One event per EventId; a repeated one keeps its first position and its last content,
    # as a repeated key in a JSON object does (the platform never sends it, fixtures do).
    events: dict[str, ScheduledEvent] = {}
    anomalies: list[Anomaly] = []
    for index, item in enumerate(events_raw):
        try:
            event = _parse_event(item)
        except _EventError as exc:
            raise DocumentError(f"Events[{index}]: {exc}", raw) from None
        repaired = _valid_unicode(event)
        if repaired is not event:
            anomalies.append(Anomaly(
                "invalid_unicode",
                f"Events[{index}] has text that is not valid Unicode (a lone surrogate escape): "
                "replaced with U+FFFD"))
        if repaired.event_id in events:
            anomalies.append(Anomaly(
                "duplicate_event_id",
                f"Events[{index}] repeats EventId {repaired.event_id[:64]!r}: the last one is "
                "kept"))
        events[repaired.event_id] = repaired
    assert isinstance(incarnation, int)
    return Document(incarnation=_clamp(incarnation), events=tuple(events.values()),
                    anomalies=tuple(anomalies))


def parse_event(item: object) -> ScheduledEvent:
    """One event object, as an entry of the IMDS document's ``Events`` (the platform's own record
    carries the same fields in its ``properties``), its text made valid Unicode. Raises
    ``ValueError`` saying what was expected and what was seen."""
    return _valid_unicode(_parse_event(item))


def _valid_unicode(event: ScheduledEvent) -> ScheduledEvent:
    """``event`` with every lone surrogate replaced by U+FFFD (the same object when clean).

    Decided here once so that no later stage (record ids, JSON, protobuf, logs, /metrics) meets
    text it cannot encode; the replacement character shows the reader where it was.
    """
    texts = (event.event_id, event.status, event.event_type, event.resource_type,
             event.not_before_raw, event.description, event.source, *event.resources)
    if not any(_SURROGATE.search(t) for t in texts):
        return event

    def fix(text: str) -> str:
        return _SURROGATE.sub("\ufffd", text)

    return ScheduledEvent(
        event_id=fix(event.event_id), status=fix(event.status), event_type=fix(event.event_type),
        resource_type=fix(event.resource_type), resources=tuple(fix(r) for r in event.resources),
        not_before=event.not_before, not_before_raw=fix(event.not_before_raw),
        description=fix(event.description), source=fix(event.source), duration=event.duration)


class _EventError(ValueError):
    pass


def _clamp(value: int) -> int:
    # Absurd values are kept "as sent" but bounded to what OTLP's int64 and Kusto's int carry.
    return max(-(2**62), min(2**62, value))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _describe(value: object) -> str:
    if value is None:
        return "nothing"
    shown = repr(value)
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return f"{type(value).__name__} {shown}"


def _string(item: dict[str, object], key: str, *, required: bool = False) -> str:
    value = item.get(key)
    if value is None:
        if required:
            raise _EventError(f"missing {key}")
        return ""
    if not isinstance(value, str):
        raise _EventError(f"expected {key} to be a string, got {_describe(value)}")
    if len(value) > MAX_STRING:
        # Kept, but bounded: state and every shipped record carry this text.
        return value[:MAX_STRING] + "…[truncated]"
    return value


def _parse_event(item: object) -> ScheduledEvent:
    if not isinstance(item, dict):
        raise _EventError(f"expected an object, got {_describe(item)}")
    event_id = _string(item, "EventId", required=True)
    if not event_id.strip():
        raise _EventError("EventId is empty")
    if len(event_id) > 256:
        raise _EventError(f"EventId is {len(event_id)} characters, expected at most 256")
    status = _string(item, "EventStatus", required=True)
    resources_raw = item.get("Resources", [])
    if resources_raw is None:
        resources_raw = []
    if not isinstance(resources_raw, list) or not all(isinstance(r, str) for r in resources_raw):
        raise _EventError(
            f"expected Resources to be a list of strings, got {_describe(resources_raw)}"
        )
    if len(resources_raw) > MAX_RESOURCES:
        raise _EventError(f"{len(resources_raw)} Resources, expected at most {MAX_RESOURCES}")
    duration_raw = item.get("DurationInSeconds", -1)
    if duration_raw is None:
        duration_raw = -1
    if isinstance(duration_raw, float) and duration_raw.is_integer():
        duration_raw = int(duration_raw)
    if not _is_int(duration_raw):
        raise _EventError(
            f"expected DurationInSeconds to be an integer, got {_describe(duration_raw)}"
        )
    assert isinstance(duration_raw, int)
    not_before_text = _string(item, "NotBefore")
    not_before = parse_not_before(not_before_text)
    unparsed = not_before is None and bool(not_before_text.strip())
    return ScheduledEvent(
        event_id=event_id,
        status=status,
        event_type=_string(item, "EventType"),
        resource_type=_string(item, "ResourceType"),
        resources=tuple(r[:MAX_STRING] for r in resources_raw),
        not_before=not_before,
        not_before_raw=not_before_text[:256] if unparsed else "",
        description=_string(item, "Description"),
        source=_string(item, "EventSource"),
        duration=_clamp(duration_raw),
    )
