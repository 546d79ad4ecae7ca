"""Per-sink on-disk spool: records wait here until their sink acknowledges them
(docs/semantics.md#reliability).

An append-only log of JSON lines (``<sink>.log``, each ``{"seq": n, "record": {...}}``) plus an
acknowledgement cursor (``<sink>.ack``, the highest delivered sequence number). Appends are
fsynced and idempotent by sequence number; a torn last line after a crash is skipped. A line
that is whole but cannot be read as a record (another release's form this one cannot follow, or
damage) is never dropped: :meth:`Spool.load` hands it to its caller, which moves it to the
dead-letter file, and only then is it removed from the log. The log is compacted (rewritten
atomically with only pending lines) once everything in it is delivered
or it has grown past a bound, so the file stays small in steady state.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from scheduled_events_exporter.codec import decode_record, encode_record
from scheduled_events_exporter.platforms.files import FILES, append_durably, write_atomically
from scheduled_events_exporter.records import TransitionRecord
from scheduled_events_exporter.write_faults import WriteFault, WriteWatch

log = logging.getLogger(__name__)

COMPACT_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class UnreadableLine:
    """A whole spool line that is not a record this release can read."""

    #: Its sequence number, when the line says one.
    seq: int | None
    #: The line as JSON, or as text when it is not JSON at all.
    content: object
    #: Why it cannot be read (what was expected, what was seen).
    reason: str


#: Called with each unreadable line; raises ``OSError`` when it could not keep it (the line
#: then stays in the log and is offered again at the next start).
Reject = Callable[[UnreadableLine], None]


class Spool:
    """The durable queue of one sink."""

    def __init__(self, directory: Path, sink: str) -> None:
        self.sink = sink
        FILES.make_dirs(directory)
        self.log_path = directory / f"{sink}.log"
        self.ack_path = directory / f"{sink}.ack"
        self._lock = threading.Lock()
        self.acked = self._read_ack()
        self.last_seq = self.acked
        self._pending: list[TransitionRecord] = []
        self._loaded = False
        self.watch = WriteWatch(self.log_path, f"spool of sink {sink}",
                                "its records are held in memory (a crash now would lose them)")

    @property
    def fault(self) -> WriteFault | None:
        """Why the last spool write failed, while it does."""
        return self.watch.fault

    def load(self, reject: Reject | None = None) -> list[TransitionRecord]:
        """Records appended but not acknowledged, in order (read once, at start).

        Each whole line that cannot be read as a record goes to ``reject`` and, once it has
        taken them all, out of the log; without ``reject`` such lines stay where they are."""
        with self._lock:
            if self._loaded:
                return list(self._pending)
            self._loaded = True
            pending: dict[int, TransitionRecord] = {}
            unreadable: list[tuple[int, UnreadableLine]] = []
            torn: int | None = None
            ignored: set[str] = set()
            try:
                with self.log_path.open("rb") as handle:
                    lines = handle.readlines()
            except FileNotFoundError:
                lines = []
            for number, line in enumerate(lines, 1):
                try:
                    item = json.loads(line)
                except (ValueError, RecursionError):
                    if number == len(lines):
                        torn = number - 1  # a crash cut the last append: it was never acknowledged
                    else:
                        unreadable.append((number - 1, UnreadableLine(
                            None, line.decode("utf-8", "replace").rstrip("\n")[:4096],
                            f"line {number} is not JSON")))
                    continue
                seq = item.get("seq") if isinstance(item, dict) else None
                if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
                    unreadable.append((number - 1, UnreadableLine(
                        None, item, f"line {number}: expected an object with a sequence number "
                                    f"\"seq\", got {type(item).__name__}")))
                    continue
                self.last_seq = max(self.last_seq, seq)
                if seq <= self.acked:
                    continue  # delivered before: not even decoded
                try:
                    pending[seq] = decode_record(item.get("record"), ignored)
                except (ValueError, TypeError, RecursionError) as exc:
                    unreadable.append((number - 1, UnreadableLine(seq, item, str(exc)[:500])))
            if torn is not None:
                log.warning("spool %s: skipped its last line, cut short by a crash while it "
                            "was written (it was never acknowledged)", self.sink)
            if ignored:
                log.info("spool %s: ignoring fields this release does not know (a newer release "
                         "wrote them): %s", self.sink, ", ".join(sorted(ignored)))
            if unreadable and reject is not None:
                self._set_aside(lines, unreadable, torn, reject)
            self._pending = [r for _, r in sorted(pending.items())]
            return list(self._pending)

    def _set_aside(self, lines: list[bytes], unreadable: list[tuple[int, UnreadableLine]],
                   torn: int | None, reject: Reject) -> None:
        """Hand each unreadable line to ``reject``, then rewrite the log without those it took
        (and without a torn last line)."""
        taken: set[int] = set()
        for index, what in unreadable:
            try:
                reject(what)
            except OSError:
                break  # kept in the log: offered again at the next start
            taken.add(index)
        if not taken:
            return
        kept = [line if line.endswith(b"\n") else line + b"\n"
                for index, line in enumerate(lines) if index not in taken and index != torn]
        with self.watch.guard(self.log_path):
            write_atomically(self.log_path, b"".join(kept))

    def append(self, records: Sequence[TransitionRecord]) -> list[TransitionRecord]:
        """Durably append the records not already here; returns those actually appended.

        Raises ``OSError`` (disk full, read-only) after cutting off whatever part of the lines
        reached the file, so a later append never lands after a torn line.
        """
        with self._lock:
            fresh = [r for r in records if r.seq > self.last_seq]
            if not fresh:
                return []
            data = b"".join(
                json.dumps(
                    {"seq": r.seq, "record": encode_record(r)}, separators=(",", ":")
                ).encode()
                + b"\n"
                for r in fresh
            )
            with self.watch.guard(self.log_path):
                append_durably(self.log_path, data)
            self.last_seq = fresh[-1].seq
            return fresh

    def ack(self, seq: int) -> None:
        """Everything up to ``seq`` is delivered (or dropped). Raises ``OSError`` when the
        cursor cannot be written (the records were delivered; a stale cursor only repeats)."""
        with self._lock:
            if seq <= self.acked:
                return
            with self.watch.guard(self.ack_path):
                self._write_ack(seq)

    def probe(self, seq: int) -> None:
        """Write the ack cursor (at least ``seq``) even when it did not change: after a write
        failure, tells whether the disk is writable again although nothing waits to be written.
        Raises ``OSError`` while it is not."""
        with self._lock, self.watch.guard(self.ack_path):
            self._write_ack(max(seq, self.acked))

    def _write_ack(self, seq: int) -> None:
        write_atomically(self.ack_path, str(seq).encode())
        self.acked = seq
        if seq >= self.last_seq:
            # All delivered: the log restarts empty (the common, steady-state case).
            write_atomically(self.log_path, b"")
            return
        try:
            size = self.log_path.stat().st_size
        except FileNotFoundError:
            return
        if size > COMPACT_BYTES:
            # Re-read under the lock so lines appended since the caller looked are kept.
            with self.log_path.open("rb") as handle:
                kept = [line for line in handle if _line_seq(line) > seq]
            write_atomically(self.log_path, b"".join(kept))

    def _read_ack(self) -> int:
        try:
            text = self.ack_path.read_text().strip()
        except FileNotFoundError:
            return 0
        except OSError as exc:
            log.warning("spool %s: ack cursor unreadable (%s); redelivering from the start",
                        self.sink, exc)
            return 0
        try:
            return _cursor(text)
        except ValueError as exc:
            # Delivering again is better than losing: restart from the beginning of the log.
            log.warning(
                "spool %s: ack cursor unreadable (%s); redelivering from the start", self.sink, exc
            )
            return 0


def waiting_elsewhere(directory: Path, sinks: Collection[str]) -> list[tuple[str, int]]:
    """(sink, records) for every spool in ``directory`` of a sink not in ``sinks`` that still
    holds undelivered records: they wait until that sink is configured again."""
    if not directory.is_dir():
        return []
    found = []
    for path in sorted(directory.glob("*.log")):
        if path.stem not in sinks and (count := len(Spool(directory, path.stem).load())):
            found.append((path.stem, count))
    return found


def _cursor(text: str) -> int:
    """The ack cursor's sequence number: a bare integer (what every release so far writes), or
    an object with ``seq`` should a later release add to it."""
    try:
        return max(0, int(text or 0))
    except ValueError:
        data = json.loads(text)
    seq = data.get("seq") if isinstance(data, dict) else None
    if not isinstance(seq, int) or isinstance(seq, bool):
        raise ValueError(f"expected an integer or an object with \"seq\", got {text[:40]!r}")
    return max(0, seq)


def _line_seq(line: bytes) -> int:
    try:
        seq = json.loads(line)["seq"]
    except (ValueError, KeyError, TypeError):
        return -1
    return seq if isinstance(seq, int) else -1
