"""Dead letters back into their sinks' spools, once the cause is fixed (``redeliver``).

A message queue's dead-letter queue has a redrive (SQS's message-move task, for one); ours is
``dead-letter.jsonl``. :func:`plan` reads it (and ``dead-letter.jsonl.1``) and picks the letters
asked for: every one, or one sink's, one EventId's, those since a time; each must still be a
record this release can read and must not have been redelivered before. :func:`apply` appends
them to their sink's spool, in their original order, with their original ``log.record.uid``
and new sequence numbers after everything the state directory has used (the exporter takes
its next sequence number past every spool's), and then marks each letter ``redelivered`` (the
time and the new sequence number) by rewriting the dead-letter files atomically. The exporter
delivers them at its next start, as any spooled record.

The caller holds the state directory's lock: the exporter reads its spools only at start, so
the two never write them at once. A crash between the append and the marking leaves the
letters unmarked: run again, they are appended again and delivered twice, with the same
``log.record.uid`` (at least once, as everywhere).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from scheduled_events_exporter.codec import decode_record
from scheduled_events_exporter.delivery.dead_letter import FILE_NAME
from scheduled_events_exporter.delivery.spool import Spool
from scheduled_events_exporter.platforms.durable import remove_durably, write_atomically
from scheduled_events_exporter.records import TransitionRecord, rfc3339

#: The sinks a letter may name (a spool is made only for these).
SINKS = frozenset({"console", "otlp", "eventhubs"})
#: Why a letter put back before is skipped (said as a count, not a line each).
ALREADY = "already redelivered"


@dataclass(frozen=True, slots=True)
class Selection:
    """Which letters to take (``None``: any)."""

    sink: str | None = None
    event_id: str | None = None
    #: Letters written at or after this time.
    since: datetime | None = None


@dataclass(frozen=True, slots=True)
class Letter:
    """One line of a dead-letter file, as found."""

    path: Path
    #: 0-based line number in that file.
    line: int
    sink: str
    status: str
    time: str
    event_id: str
    transition: str
    record_id: str


@dataclass(frozen=True, slots=True)
class Taken:
    """A letter :func:`apply` puts back, with the record it holds."""

    letter: Letter
    record: TransitionRecord


@dataclass(frozen=True, slots=True)
class Skipped:
    """A letter asked for that cannot be put back, and why."""

    letter: Letter
    reason: str


@dataclass(frozen=True, slots=True)
class Plan:
    """What :func:`apply` would do."""

    taken: tuple[Taken, ...]
    skipped: tuple[Skipped, ...]

    @property
    def redelivered_before(self) -> int:
        """How many of the skipped letters were put back before (said as a count: they pile
        up over the weeks)."""
        return sum(1 for skip in self.skipped if skip.reason == ALREADY)


def letter_files(directory: Path) -> list[Path]:
    """The dead-letter files, oldest first."""
    return [p for p in (directory / f"{FILE_NAME}.1", directory / FILE_NAME) if p.exists()]


def _lines(path: Path) -> list[bytes]:
    data = path.read_bytes()
    # Only whole lines: a letter a crash cut short is not one.
    return data[:data.rfind(b"\n") + 1].splitlines(keepends=True)


def plan(directory: Path, selection: Selection) -> Plan:
    """The letters of ``directory`` that ``selection`` asks for, in the order they were
    written: those that can be put back, and those that cannot, with the reason."""
    taken: list[Taken] = []
    skipped: list[Skipped] = []
    for path in letter_files(directory):
        for number, raw in enumerate(_lines(path)):
            try:
                item = json.loads(raw)
            except (ValueError, RecursionError):
                continue  # not a letter (damage); nothing to put back
            if not isinstance(item, dict):
                continue
            letter = Letter(path, number, _text(item, "sink"), _text(item, "status"),
                            _text(item, "time"), _text(item, "event_id"),
                            _text(item, "transition"), _text(item, "record_id"))
            if not _selected(letter, selection):
                continue
            why, record = _readable(item, letter)
            if record is None:
                skipped.append(Skipped(letter, why))
            else:
                taken.append(Taken(letter, record))
    return Plan(tuple(taken), tuple(skipped))


def apply(directory: Path, plan: Plan, now: datetime) -> list[tuple[Taken, int]]:
    """Append the plan's records to their sinks' spools (fsynced), then mark their letters
    ``redelivered``. Returns each with its new sequence number. ``OSError`` when a file
    cannot be written (what was appended before it stays appended)."""
    if not plan.taken:
        return []
    spool_dir = directory / "spool"
    spools = {name: Spool(spool_dir, name) for name in _spool_names(spool_dir, plan.taken)}
    for spool in spools.values():
        spool.load()  # its last sequence number (and a torn tail cut off)
    seq = max([_state_seq(directory), *(s.last_seq for s in spools.values())])
    done: list[tuple[Taken, int]] = []
    by_sink: dict[str, list[TransitionRecord]] = {}
    for item in plan.taken:
        seq += 1
        by_sink.setdefault(item.letter.sink, []).append(replace(item.record, seq=seq))
        done.append((item, seq))
    for sink, records in by_sink.items():
        spools[sink].append(records)
    _mark(done, rfc3339(now))
    return done


def _mark(done: Sequence[tuple[Taken, int]], when: str) -> None:
    marks: dict[Path, dict[int, int]] = {}
    for item, seq in done:
        marks.setdefault(item.letter.path, {})[item.letter.line] = seq
    for path, lines in marks.items():
        rewritten = []
        for number, raw in enumerate(_lines(path)):
            if number in lines:
                item = json.loads(raw)
                item["redelivered"] = {"time": when, "seq": lines[number]}
                raw = json.dumps(item, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
            rewritten.append(raw)
        write_atomically(path, b"".join(rewritten))


def _spool_names(spool_dir: Path, taken: Sequence[Taken]) -> list[str]:
    names = {t.letter.sink for t in taken}
    names.update(p.stem for p in spool_dir.glob("*.log") if p.stem in SINKS)
    return sorted(names)


def _state_seq(directory: Path) -> int:
    try:
        seq = json.loads((directory / "state.json").read_bytes()).get("seq")
    except (OSError, ValueError, AttributeError):
        return 0
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else 0


def _text(item: dict[str, object], key: str) -> str:
    value = item.get(key)
    return value if isinstance(value, str) else ""


def _selected(letter: Letter, selection: Selection) -> bool:
    if selection.sink is not None and letter.sink != selection.sink:
        return False
    if selection.event_id is not None and letter.event_id != selection.event_id:
        return False
    if selection.since is not None:
        try:
            written = datetime.fromisoformat(letter.time.replace("Z", "+00:00"))
        except ValueError:
            return False
        if written < selection.since:
            return False
    return True


def _readable(item: dict[str, object], letter: Letter
              ) -> tuple[str, TransitionRecord | None]:
    """The record a letter holds, or why there is none to put back."""
    if "redelivered" in item:
        return ALREADY, None
    if letter.sink not in SINKS:
        return f"names no sink this release has ({letter.sink!r})", None
    raw = item.get("record")
    if raw is None and letter.status == "unreadable":
        payload = item.get("payload")
        raw = payload.get("record") if isinstance(payload, dict) else None
    if raw is None:
        return ("written by a release before redeliver: it holds the record as sent, not as "
                "stored"), None
    try:
        return "", decode_record(raw)
    except (ValueError, TypeError, RecursionError) as exc:
        return f"this release cannot read it either ({str(exc)[:200]})", None


#: A redelivery asked for at the exporter's next start (``redeliver --at-next-start``).
REQUEST_FILE = "redeliver-request.json"


def request(directory: Path, selection: Selection, now: datetime) -> Path:
    """Ask the exporter to redeliver ``selection`` at its next start, under its own lock (for
    a container whose exporter cannot be stopped by hand: restart it). Replaces an earlier
    request. Returns the request file."""
    path = directory / REQUEST_FILE
    data = {"sink": selection.sink, "event_id": selection.event_id,
            "since": rfc3339(selection.since) if selection.since else None,
            "requested_at": rfc3339(now)}
    write_atomically(path, json.dumps(data, separators=(",", ":")).encode() + b"\n")
    return path


def perform_request(directory: Path, now: datetime) -> tuple[Plan, list[tuple[Taken, int]]] | None:
    """At start, with the lock held and before any spool is read: carry out a pending
    request, then remove it. ``None`` when there is none; ``ValueError`` for a request this
    release cannot read (left in place); ``OSError`` when a file cannot be written."""
    path = directory / REQUEST_FILE
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as exc:
        raise ValueError(f"{path}: expected the JSON redeliver --at-next-start writes ({exc})"
                         ) from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    since = data.get("since")
    try:
        selection = Selection(
            data.get("sink") if isinstance(data.get("sink"), str) else None,
            data.get("event_id") if isinstance(data.get("event_id"), str) else None,
            datetime.fromisoformat(since.replace("Z", "+00:00")) if isinstance(since, str)
            else None)
    except ValueError:
        raise ValueError(f"{path}: since {since!r} is not an RFC 3339 time") from None
    chosen = plan(directory, selection)
    done = apply(directory, chosen, now)
    # Marked before removed: a crash in between repeats the request, which skips what it
    # already put back.
    remove_durably(path)
    return chosen, done
