"""Dead letters back into their sinks' spools, once the cause is fixed (``redeliver``).

A message queue's dead-letter queue has a redrive (SQS's message-move task, for one); ours is
``dead-letter.jsonl`` and its older generations. :func:`plan` reads them and picks the letters
asked for: every one, or one sink's, one EventId's, those since a time; each must still be a
record this release can read and must not have been redelivered before. :func:`apply` appends
them to their sink's spool, all or none, in their original order, with their original
``log.record.uid`` and new sequence numbers after the last one taken, and then marks each
letter ``redelivered`` (the time and the sequence number) by rewriting the dead-letter files
atomically. A letter whose record already waits in its spool (a crash came between the letter
and the record's acknowledgement, or between a put-back and its mark) is only marked.

Who numbers them: ``redeliver`` run by hand (the state directory's lock held, the exporter
stopped) numbers after the state file, its outbox and every spool, and first appends the
outbox's records to each spool it writes that lacks them; the exporter's start, and its poll
thread for a request that had to wait, number after what they took (delivery/start.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Protocol

from scheduled_events_exporter.codec import decode_record
from scheduled_events_exporter.delivery.dead_letter import DeadLetterFile, generations
from scheduled_events_exporter.delivery.spool import Spool, waiting_ids
from scheduled_events_exporter.platforms.durable import remove_durably, write_atomically
from scheduled_events_exporter.records import TransitionRecord, rfc3339
from scheduled_events_exporter.state import read_outbox

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
    """A letter :func:`apply` puts back, with the record it holds; ``waiting``: the sequence
    number under which its sink's spool already holds that record (a crash came between the
    letter and the record's acknowledgement, or between putting it back and marking it): then
    the letter is only marked, and the record is not appended a second time."""

    letter: Letter
    record: TransitionRecord
    waiting: int | None = None


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
    """The dead-letter files, oldest first: every generation the bound keeps."""
    return generations(directory)


def _lines(path: Path) -> list[bytes]:
    data = path.read_bytes()
    # Only whole lines: a letter a crash cut short is not one.
    return data[:data.rfind(b"\n") + 1].splitlines(keepends=True)


def plan(directory: Path, selection: Selection) -> Plan:
    """The letters of ``directory`` that ``selection`` asks for, in the order they were
    written: those that can be put back, and those that cannot, with the reason."""
    return _scan(directory, lambda letter: _selected(letter, selection))


def _scan(directory: Path, wanted: Callable[[Letter], bool]) -> Plan:
    taken: list[Taken] = []
    skipped: list[Skipped] = []
    waiting: dict[str, dict[str, int]] = {}
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
            if not wanted(letter):
                continue
            why, record = _readable(item, letter)
            if record is None:
                skipped.append(Skipped(letter, why))
                continue
            if letter.sink not in waiting:
                waiting[letter.sink] = waiting_ids(directory / "spool", letter.sink)
            # Already waiting in its spool (a crash came between the letter and its
            # acknowledgement, or between putting it back and the mark): the next start sends
            # it anyway, so it is marked, not appended again (that would send it twice).
            taken.append(Taken(letter, record, waiting[letter.sink].get(record.record_id)))
    return Plan(tuple(taken), tuple(skipped))


class Target(Protocol):
    """Where a sink's records go back: its spool (a running sink's worker, or the bare spool
    of a sink that is stopped or not configured)."""

    @property
    def last_seq(self) -> int:
        """The highest sequence number it holds."""
        ...

    def append_durably(self, records: Sequence[TransitionRecord]) -> None:
        """Append ``records`` (fsynced) or raise ``OSError`` having appended none of them."""
        ...

    def unappend(self, seqs: Collection[int]) -> None:
        """Take back the lines of ``seqs`` this call appended (``OSError`` when it cannot)."""
        ...

    def enqueue(self, records: Sequence[TransitionRecord]) -> None:
        """Hand the appended records over for delivery (nothing to do for a bare spool)."""
        ...


class SpoolTarget:
    """A bare spool as a :class:`Target`: no exporter reads it meanwhile (``redeliver`` holds
    the lock, or its sink is not configured)."""

    def __init__(self, spool: Spool) -> None:
        self.spool = spool
        spool.load()  # its last sequence number (and a torn tail cut off)

    @property
    def last_seq(self) -> int:
        """The spool's highest sequence number."""
        return self.spool.last_seq

    def append_durably(self, records: Sequence[TransitionRecord]) -> None:
        """Append to the spool (a failed append cuts back what reached the file)."""
        self.spool.append(records)

    def unappend(self, seqs: Collection[int]) -> None:
        """Rewrite the spool without those lines."""
        self.spool.remove(seqs)

    def enqueue(self, records: Sequence[TransitionRecord]) -> None:
        """Nothing: the exporter reads the spool at its next start."""


class Unapplied(OSError):
    """Letters could not be put back; ``partly`` says what stays changed, when the undo could
    not take it all back (empty: nothing changed)."""

    def __init__(self, message: str, partly: str = "") -> None:
        super().__init__(message + (f"; {partly}" if partly else "; nothing was changed"))
        self.partly = partly


def apply(directory: Path, plan: Plan, now: datetime, *, after: int | None = None,
          targets: Mapping[str, Target] | None = None) -> list[tuple[Taken, int]]:
    """Put the plan's records back, all or none: append them to their sinks' spools (fsynced),
    then mark their letters ``redelivered``, then hand them over. Returns each with its new
    sequence number, the first after ``after``.

    ``after``: the last sequence number the exporter took (the start's, or the poll thread's
    counter). ``None`` for ``redeliver`` run by hand: then the numbers follow the state file
    and every spool, and the records the state file's outbox holds are appended first to each
    spool they go to that lacks them (a crash between a commit and its spooling), so that no
    letter takes a number before them. ``targets``: the spools a running exporter writes (its
    workers); any other sink's spool is written bare.

    Raises :class:`Unapplied` when a file cannot be written, after taking back what it
    appended (its message says what stays changed if even that failed)."""
    if not plan.taken:
        return []
    spool_dir = directory / "spool"
    sinks = sorted({item.letter.sink for item in plan.taken})
    bare: dict[str, Target] = {}
    with DeadLetterFile.lock:
        # Under the dead-letter file's lock: no sink rotates it between the plan's line
        # numbers and the marks. The plan is read again here for the same reason.
        plan = _fresh(directory, plan)
        if not plan.taken:
            return []
        try:
            chosen: dict[str, Target] = {}
            for sink in sinks:
                target = (targets or {}).get(sink)
                if target is None:
                    target = bare[sink] = SpoolTarget(Spool(spool_dir, sink))
                chosen[sink] = target
            if after is None:
                after = _repair(directory, spool_dir, chosen)
        except OSError as exc:
            raise Unapplied(f"cannot prepare the spools: {exc}") from None
        seq = after
        done: list[tuple[Taken, int]] = []
        by_sink: dict[str, list[TransitionRecord]] = {}
        for item in plan.taken:
            if item.waiting is not None:
                done.append((item, item.waiting))
                continue
            seq += 1
            by_sink.setdefault(item.letter.sink, []).append(replace(item.record, seq=seq))
            done.append((item, seq))
        appended: list[str] = []
        try:
            for sink, records in by_sink.items():
                chosen[sink].append_durably(records)
                appended.append(sink)
            _mark(done, rfc3339(now))
        except _Unmarked as exc:
            # Some files were marked: their old content goes back first, or their letters'
            # records stay appended (marked letters are never put back again).
            kept = _unmark(exc.marked)
            stay = {seq for item, seq in done if item.letter.path in kept}
            taken_back = {sink: [r for r in records if r.seq not in stay]
                          for sink, records in by_sink.items()}
            partly = _undo(chosen, taken_back, appended)
            if stay:
                partly = "; ".join(x for x in (
                    f"{len(stay)} letters were marked and their records stay in the spool "
                    "(they go out at the next start)", partly) if x)
            raise Unapplied(f"cannot mark the letters: {exc}", partly) from None
        except OSError as exc:
            raise Unapplied(f"{exc}", _undo(chosen, by_sink, appended)) from None
    for sink, records in by_sink.items():
        chosen[sink].enqueue(records)
    return done


def _fresh(directory: Path, plan: Plan) -> Plan:
    """The plan's letters as the files hold them now (same selection by line identity)."""
    wanted = {(t.letter.sink, t.letter.record_id, t.letter.time) for t in plan.taken}
    again = _scan(directory, lambda letter: (letter.sink, letter.record_id, letter.time)
                  in wanted)
    return Plan(again.taken, plan.skipped)


def _repair(directory: Path, spool_dir: Path, targets: Mapping[str, Target]) -> int:
    """``redeliver`` run by hand: the state file's outbox into each target that lacks its
    records, before any letter; returns the last sequence number taken anywhere."""
    seq, outbox = read_outbox(directory)
    for target in targets.values():
        missing = [r for r in outbox if r.seq > target.last_seq]
        if missing:
            target.append_durably(missing)
    floor = max([seq, *(r.seq for r in outbox), *(t.last_seq for t in targets.values())])
    return max(floor, last_spooled(spool_dir, exclude=targets))


def _undo(targets: Mapping[str, Target], by_sink: Mapping[str, Sequence[TransitionRecord]],
          appended: Sequence[str]) -> str:
    """Take back the appends of a put-back that failed; what stays, said, when it cannot."""
    left = []
    for sink in appended:
        try:
            targets[sink].unappend({r.seq for r in by_sink[sink]})
        except OSError as exc:
            left.append(f"{len(by_sink[sink])} records stay in the spool of {sink} unmarked "
                        f"({exc}): they go out at the next start, and a later redeliver would "
                        "put them back again (with the same log.record.uid)")
    return "; ".join(left)


class _Unmarked(OSError):
    """Marking failed after ``marked`` files were rewritten (each with its content before)."""

    def __init__(self, error: OSError, marked: list[tuple[Path, bytes]]) -> None:
        super().__init__(str(error))
        self.marked = marked


def _mark(done: Sequence[tuple[Taken, int]], when: str) -> None:
    marks: dict[Path, dict[int, int]] = {}
    for item, seq in done:
        marks.setdefault(item.letter.path, {})[item.letter.line] = seq
    written: list[tuple[Path, bytes]] = []
    for path, lines in marks.items():
        try:
            before = path.read_bytes()
            rewritten = []
            for number, raw in enumerate(_lines(path)):
                if number in lines:
                    item = json.loads(raw)
                    item["redelivered"] = {"time": when, "seq": lines[number]}
                    raw = json.dumps(item, separators=(",", ":"),
                                     ensure_ascii=False).encode() + b"\n"
                rewritten.append(raw)
            write_atomically(path, b"".join(rewritten))
        except OSError as exc:
            raise _Unmarked(exc, written) from None
        written.append((path, before))


def _unmark(marked: Sequence[tuple[Path, bytes]]) -> set[Path]:
    """Write marked files back as they were; returns those that stay marked."""
    kept = set()
    for path, before in marked:
        try:
            write_atomically(path, before)
        except OSError:
            kept.add(path)
    return kept


def last_spooled(spool_dir: Path, exclude: Collection[str] = ()) -> int:
    """The highest sequence number in any sink's spool under ``spool_dir`` (but ``exclude``'s,
    whose spools their own objects hold), configured or not: a number below it cannot be taken
    again, or that sink's spool would skip it as already appended."""
    last = 0
    for name in _spool_names(spool_dir, ()):
        if name not in exclude:
            spool = Spool(spool_dir, name)
            spool.load()
            last = max(last, spool.last_seq)
    return last


def _spool_names(spool_dir: Path, taken: Sequence[Taken]) -> list[str]:
    names = {t.letter.sink for t in taken}
    names.update(p.stem for p in spool_dir.glob("*.log") if p.stem in SINKS)
    return sorted(names)


def _text(item: dict[str, object], key: str) -> str:
    value = item.get(key)
    return value if isinstance(value, str) else ""


def _selected(letter: Letter, selection: Selection) -> bool:
    if selection.sink is not None and letter.sink != selection.sink:
        return False
    if selection.event_id is not None and letter.event_id.lower() != selection.event_id.lower():
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


def read_request(directory: Path) -> Selection | None:
    """The pending ``--at-next-start`` request's selection; ``None`` when there is none;
    ``ValueError`` for one this release cannot read (``OSError`` for a file it cannot)."""
    path = directory / REQUEST_FILE
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"{path}: expected the JSON redeliver --at-next-start writes ({exc})"
                         ) from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    since = data.get("since")
    try:
        return Selection(
            data.get("sink") if isinstance(data.get("sink"), str) else None,
            data.get("event_id") if isinstance(data.get("event_id"), str) else None,
            datetime.fromisoformat(since.replace("Z", "+00:00")) if isinstance(since, str)
            else None)
    except ValueError:
        raise ValueError(f"{path}: since {since!r} is not an RFC 3339 time") from None


def perform_request(directory: Path, now: datetime, *, after: int | None = None,
                    targets: Mapping[str, Target] | None = None
                    ) -> tuple[Plan, list[tuple[Taken, int]]] | None:
    """Carry out a pending request (:func:`apply`, with ``after`` and ``targets``), then
    remove it. ``None`` when there is none; ``ValueError`` for a request this release cannot
    read; ``OSError`` when a file cannot be read or written (:class:`Unapplied`: nothing was
    put back). Either way the request stays, to be tried again."""
    selection = read_request(directory)
    if selection is None:
        return None
    chosen = plan(directory, selection)
    done = apply(directory, chosen, now, after=after, targets=targets)
    # Marked before removed: a crash in between repeats the request, which skips what it
    # already put back.
    remove_durably(directory / REQUEST_FILE)
    return chosen, done
