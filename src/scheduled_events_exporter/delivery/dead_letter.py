"""The dead-letter file: records a sink rejected permanently, kept instead of retried forever.

A record the collector or hub will never accept (HTTP 400/413, gRPC INVALID_ARGUMENT, a message
larger than the hub allows) would otherwise block every record behind it. The delivery worker
moves it here and goes on. ``SEE_STATE_DIR/dead-letter.jsonl`` holds one JSON object per line:
``time`` (RFC 3339), ``sink``, ``status`` (``"400"``, ``"INVALID_ARGUMENT"``,
``"message_too_large"``), ``reason``, ``event_id``, ``transition``, ``record_id``, ``seq`` and
``payload``: the record as the sink would have sent it (the OTLP/JSON request for ``otlp``, the
docs/semantics.md#sinks object for ``eventhubs`` and ``console``), so it can be inspected, and
``record``: the record as the spool stores it, so that ``scheduled-events-exporter redeliver``
(:mod:`.redrive`) can put it back into its sink's spool, with its ``log.record.uid``, once the
cause is fixed; it then marks the line ``redelivered``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import ClassVar

from scheduled_events_exporter.codec import encode_record
from scheduled_events_exporter.platforms.durable import (
    append_durably,
    mend_tail,
    remove_durably,
    replace_durably,
    write_all,
)
from scheduled_events_exporter.platforms.files import FILES
from scheduled_events_exporter.records import TransitionRecord, rfc3339, to_columns
from scheduled_events_exporter.write_faults import WriteFault, WriteWatch

log = logging.getLogger(__name__)

FILE_NAME = "dead-letter.jsonl"
#: Past this size the file becomes the newest of the older generations
#: (``dead-letter.jsonl.1``; each older one moves up a number), so that a collector that
#: rejects everything cannot fill the state volume.
MAX_BYTES = 8 * 1024 * 1024
#: Files kept, the one written to included: at most about ``GENERATIONS * MAX_BYTES`` on disk
#: (32 MiB: what the two files of 16 MiB before took, within the chart's 64 MiB emptyDir beside
#: the spools).
#: Only when every older generation is taken is the oldest removed, and never silently: its
#: letters are counted per sink, logged at ERROR, counted in
#: ``export.failures{signal="dead_letter_dropped"}`` and shown in ``/readyz``.
GENERATIONS = 4


def generation(directory: Path, number: int) -> Path:
    """The file of generation ``number`` (0: the one written to; higher: older)."""
    return directory / (FILE_NAME if number == 0 else f"{FILE_NAME}.{number}")


def generations(directory: Path) -> list[Path]:
    """Every dead-letter file kept in ``directory``, oldest first (what ``redeliver`` reads)."""
    return [p for p in (generation(directory, n) for n in range(GENERATIONS - 1, -1, -1))
            if p.exists()]


@dataclass(frozen=True, slots=True)
class Removed:
    """What the bound removed to make room: the oldest generation and the letters it held."""

    path: Path
    letters: int
    #: Letters ``redeliver`` had not put back.
    unredelivered: int
    #: Letters per sink.
    by_sink: dict[str, int]


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One permanently rejected record."""

    time: str
    sink: str
    status: str
    reason: str
    event_id: str
    transition: str
    record_id: str
    seq: int
    payload: object
    #: The record as the spool stores it (codec.encode_record), so that ``redeliver`` can put
    #: it back into its sink's spool; ``None`` for an unreadable line (its ``payload`` is that
    #: line).
    record: object = None

    def to_json(self) -> bytes:
        """One JSON line (ends with a newline)."""
        fields: dict[str, object] = {
            "time": self.time,
            "sink": self.sink,
            "status": self.status,
            "reason": self.reason,
            "event_id": self.event_id,
            "transition": self.transition,
            "record_id": self.record_id,
            "seq": self.seq,
            "payload": self.payload,
        }
        if self.record is not None:
            fields["record"] = self.record
        return json.dumps(
            fields,
            separators=(",", ":"),
            ensure_ascii=False,
            default=str,
        ).encode() + b"\n"


def rejected(sink: str, record: TransitionRecord, status: str, reason: str,
             payload: Callable[[TransitionRecord], object]) -> DeadLetter:
    """The letter of a record ``sink`` refused for good, with ``payload(record)`` (what the sink
    would have sent; the record's columns when even that cannot be rendered)."""
    try:
        rendered = payload(record)
    except Exception as exc:  # never let rendering a rejected record stop the worker
        rendered = {"unrenderable": f"{type(exc).__name__}: {exc}"[:300],
                    "columns": to_columns(record)}
    event = record.transition.event
    return DeadLetter(time=rfc3339(datetime.now(timezone.utc)), sink=sink, status=status,
                      reason=reason[:500], event_id=event.event_id if event else "",
                      transition=record.transition.kind.value, record_id=record.record_id,
                      seq=record.seq, payload=rendered, record=encode_record(record))


def unreadable(sink: str, seq: int | None, content: object, reason: str,
               source: str = "the spool") -> DeadLetter:
    """The letter of an entry of ``source`` (a spool line, or an outbox record of the state
    file shaped as one) this release cannot read (docs/semantics.md#compatibility):
    ``content`` whole, and whatever identifies it where the entry still has its usual shape."""
    record = content.get("record") if isinstance(content, dict) else None
    transition = record.get("transition") if isinstance(record, dict) else None
    event = transition.get("event") if isinstance(transition, dict) else None

    def text(holder: object, key: str) -> str:
        value = holder.get(key) if isinstance(holder, dict) else None
        return value if isinstance(value, str) else ""

    return DeadLetter(time=rfc3339(datetime.now(timezone.utc)), sink=sink, status="unreadable",
                      reason=f"{source} holds an entry this release cannot read: {reason}"[:500],
                      event_id=text(event, "event_id"), transition=text(transition, "kind"),
                      record_id=text(record, "record_id"), seq=-1 if seq is None else seq,
                      payload=content)


def refused_message(source: str, kind: str, reason: str, message_id: str,
                    content: str) -> DeadLetter:
    """The letter of a message the platform command could not read (``kind``: not_json,
    not_an_event, unknown_schema, too_large, dequeued_too_often): the message as received, in
    ``payload``, with its queue message id in ``record_id``; no ``record`` (there is none to
    redeliver), so ``redeliver`` skips it."""
    return DeadLetter(time=rfc3339(datetime.now(timezone.utc)), sink=source, status=kind,
                      reason=reason[:500], event_id="", transition="", record_id=message_id,
                      seq=-1, payload=content)


class DeadLetterFile:
    """Appends :class:`DeadLetter` lines to ``directory/dead-letter.jsonl`` (fsynced)."""

    #: One writer at a time per process, every sink's worker and ``redeliver``'s marks.
    lock = threading.Lock()
    #: Letters the bound removed since start, per file and sink: every sink writes the one
    #: file through an object of its own, and each sink's status says how many of its own.
    _removed: ClassVar[dict[Path, dict[str, int]]] = {}

    def __init__(self, directory: Path) -> None:
        self.path = directory / FILE_NAME
        self.watch = WriteWatch(self.path, "dead-letter file",
                                "the rejected record is kept in its spool until it can be")

    @property
    def fault(self) -> WriteFault | None:
        """Why the last append failed, while it does."""
        return self.watch.fault

    def removed_of(self, sink: str) -> int:
        """How many of ``sink``'s letters the bound removed since start."""
        with self.lock:
            return self._removed.get(self.path, {}).get(sink, 0)

    def append(self, letter: DeadLetter) -> Removed | None:
        """Append one line; raises ``OSError`` (logged once per streak by the watch). Returns
        what the bound removed to make room, if it had to (the caller says and counts it).

        A letter a crash cut short at the end of the file is cut off first (or completed, when
        only its newline was lost), so the next letter never merges with it."""
        data = letter.to_json()
        removed = None
        with self.lock, self.watch.guard():
            FILES.make_dirs(self.path.parent)
            # Before every append (a failed one may leave a tail it could not cut back).
            done, size = mend_tail(self.path, _whole_letter)
            if done:
                log.warning("dead-letter file %s: %s the last %d bytes, a letter a crash "
                            "left unfinished", self.path, done, size)
            if _size(self.path) + len(data) > MAX_BYTES:
                removed = self._rotate()
            append_durably(self.path, data)
        return removed

    def _rotate(self) -> Removed | None:
        """Make the file written to the newest older generation. Only renames into a free
        number, from the highest down, so a crash between two renames leaves every letter in
        some generation; the oldest is removed only when every number is taken."""
        directory = self.path.parent
        free = next((n for n in range(1, GENERATIONS) if not generation(directory, n).exists()),
                    None)
        removed = None
        if free is None:
            free = GENERATIONS - 1
            removed = _count(generation(directory, free))
            remove_durably(generation(directory, free))
            counts = self._removed.setdefault(self.path, {})
            for sink, count in removed.by_sink.items():
                counts[sink] = counts.get(sink, 0) + count
        for number in range(free - 1, 0, -1):
            replace_durably(generation(directory, number), generation(directory, number + 1))
        replace_durably(self.path, generation(directory, 1))
        return removed

    def probe(self) -> None:
        """After a failed append: write and remove a small file next to it, to learn (and show
        in ``/readyz``) that the disk is writable again before the next rejected record."""
        if self.watch.fault is None:
            return
        # Unpredictable and created exclusively, never through a planted symlink.
        probe = self.path.with_name(f".{FILE_NAME}.{secrets.token_hex(8)}.probe")
        # Still failing: the watch keeps the fault (and logged the streak once).
        with self.lock, contextlib.suppress(OSError), self.watch.guard():
            fd = FILES.open_new(probe)
            try:
                write_all(fd, b"probe\n")
                os.fsync(fd)
            finally:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(probe)


def _count(path: Path) -> Removed:
    """The letters of a generation about to be removed, counted per sink."""
    letters = unredelivered = 0
    by_sink: dict[str, int] = {}
    try:
        data = path.read_bytes()
    except OSError:
        data = b""
    for line in data.splitlines():
        try:
            item = json.loads(line)
        except (ValueError, RecursionError):
            item = None
        if not isinstance(item, dict):
            continue
        letters += 1
        sink = item.get("sink") if isinstance(item.get("sink"), str) else "unknown"
        by_sink[str(sink)] = by_sink.get(str(sink), 0) + 1
        if "redelivered" not in item:
            unredelivered += 1
    return Removed(path, letters, unredelivered, by_sink)


def _whole_letter(tail: bytes) -> bool:
    try:
        return isinstance(json.loads(tail), dict)
    except (ValueError, RecursionError):
        return False


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
