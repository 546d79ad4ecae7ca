"""Per-sink on-disk spool: records wait here until their sink acknowledges them
(docs/semantics.md#reliability).

An append-only log of JSON lines (``<sink>.log``, each ``{"seq": n, "record": {...}}``) plus an
acknowledgement cursor (``<sink>.ack``, the highest delivered sequence number). Appends are
fsynced and idempotent by sequence number. Every line ends with a newline, written last: bytes
after the last newline are the tail of an append a crash cut short (it never returned, and its
records are still in the state file's outbox). That torn tail is cut off, fsynced, before
anything is appended after it (at load, and again after an append that failed half-way), or
completed with its newline when it is a whole line that only lost its newline. A line that is
whole but cannot be read as a record (another release's form this one cannot follow, or damage)
is never dropped: :meth:`Spool.load` hands it to its caller, which moves it to the dead-letter
file, and only then is it removed from the log; compaction keeps any line it cannot parse. The
log is compacted (rewritten atomically with only pending lines) once everything in it is
delivered or it has grown past a bound, so the file stays small in steady state.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

from scheduled_events_exporter.codec import UnreadableLine, decode_record, encode_record
from scheduled_events_exporter.platforms.durable import append_durably, mend_tail, write_atomically
from scheduled_events_exporter.platforms.files import FILES
from scheduled_events_exporter.records import TransitionRecord
from scheduled_events_exporter.write_faults import WriteFault, WriteWatch

log = logging.getLogger(__name__)

COMPACT_BYTES = 4 * 1024 * 1024

__all__ = ["COMPACT_BYTES", "Reject", "Spool", "UnreadableLine", "waiting_elsewhere",
           "waiting_ids"]

#: Called with each unreadable line; raises ``OSError`` when it could not keep it (the line
#: then stays in the log and is offered again at the next start).
Reject = Callable[[UnreadableLine], None]


class Spool:
    """The durable queue of one sink."""

    def __init__(self, directory: Path, sink: str, *, compact_bytes: int = COMPACT_BYTES) -> None:
        self.sink = sink
        FILES.make_dirs(directory)
        self.log_path = directory / f"{sink}.log"
        self.ack_path = directory / f"{sink}.ack"
        self._compact_bytes = compact_bytes
        self._lock = threading.Lock()
        self.acked = self._read_ack()
        self.last_seq = self.acked
        self._pending: list[TransitionRecord] = []
        self._loaded = False
        # Unreadable lines still in the log (the dead-letter file could not take them yet):
        # every rewrite keeps them whatever their sequence number, they are offered again at
        # each acknowledgement and at the next start, and the ack cursor on disk stays below
        # them (else the next start would take them for delivered and never offer them).
        self._held: dict[bytes, UnreadableLine] = {}
        # Records refused for good whose letters are not written yet (the dead-letter file
        # could not take them): kept by every rewrite, the cursor on disk below them.
        self._kept: set[int] = set()
        self._reject: Reject | None = None
        self.watch = WriteWatch(self.log_path, f"spool of sink {sink}",
                                "its records are held in memory (a crash now would lose them)")

    @property
    def fault(self) -> WriteFault | None:
        """Why the last spool write failed, while it does."""
        return self.watch.fault

    def load(self, reject: Reject | None = None) -> list[TransitionRecord]:
        """Records appended but not acknowledged, in order (read once, at start).

        A torn tail (an append a crash cut short) is cut off first. Each whole line that cannot
        be read as a record goes to ``reject`` and, once it has taken them all, out of the log;
        without ``reject`` such lines stay where they are."""
        with self._lock:
            if self._loaded:
                return list(self._pending)
            self._loaded = True
            self._mend_tail_logged()
            pending: dict[int, TransitionRecord] = {}
            unreadable: list[tuple[int, UnreadableLine]] = []
            ignored: set[str] = set()
            lines = self._whole_lines()
            for number, line in enumerate(lines, 1):
                try:
                    item = json.loads(line)
                except (ValueError, RecursionError):
                    unreadable.append((number - 1, UnreadableLine(
                        None, line.decode("utf-8", "replace").rstrip("\n")[:4096],
                        f"line {number} is not JSON")))
                    continue
                seq = _seq_of(item)
                if seq is None:
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
            if ignored:
                log.info("spool %s: keeping fields this release does not know (a newer release "
                         "wrote them): %s", self.sink, ", ".join(sorted(ignored)))
            self._held = {lines[index]: what for index, what in unreadable}
            self._reject = reject
            self._offer_held()
            self._pending = [r for _, r in sorted(pending.items())]
            return list(self._pending)

    def _whole_lines(self) -> list[bytes]:
        """The log's lines that end with a newline (a torn tail, if it could not be cut off,
        is left out: it is not a line)."""
        try:
            data = self.log_path.read_bytes()
        except FileNotFoundError:
            return []
        return data[:data.rfind(b"\n") + 1].splitlines(keepends=True)

    def _mend_tail_logged(self) -> None:
        try:
            with self.watch.guard():
                self._mend_tail()
        except OSError:
            pass  # the watch logged it; the next append tries again first

    def _mend_tail(self) -> None:
        """Make the log end with a newline before anything is appended: bytes after the last
        newline are an append a crash cut short. Cut them off (fsynced), or, when they are a
        whole line that only lost its newline, complete it. ``OSError`` when it cannot."""
        done, size = mend_tail(self.log_path, lambda tail: _line_seq(tail) is not None)
        if done == "completed":
            log.warning("spool %s: its last line had lost its newline in a crash; completed it",
                        self.sink)
        elif done == "cut":
            log.warning("spool %s: cut off the last %d bytes, a line a crash left unfinished "
                        "(its append never returned; its records are appended again from the "
                        "state file)", self.sink, size)

    def _offer_held(self) -> None:
        """Hand each held unreadable line to the caller's ``reject``, then rewrite the log
        without those it took (they are in the dead-letter file now)."""
        if not self._held or self._reject is None:
            return
        taken: list[bytes] = []
        for line, what in self._held.items():
            try:
                self._reject(what)
            except OSError:
                break  # kept in the log: offered again at the next ack or start
            taken.append(line)
        if not taken:
            return
        kept = [line for line in self._whole_lines() if line not in taken]
        for line in taken:
            del self._held[line]
        try:
            with self.watch.guard():
                write_atomically(self.log_path, b"".join(kept))
        except OSError:
            return  # the dead-letter file has them and the log still does: offered again

    def append(self, records: Sequence[TransitionRecord]) -> list[TransitionRecord]:
        """Durably append the records not already here; returns those actually appended.

        Raises ``OSError`` (disk full, read-only) after cutting off whatever part of the lines
        reached the file, so a later append never lands after a torn line (and should that cut
        fail too, the next append cuts it first).
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
            with self.watch.guard():
                # Checked before every append, not once: a failed append may leave a tail its
                # cut back could not remove (a read only disk), and reading the last block
                # costs nothing beside the append's fsync.
                self._mend_tail()
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

    def remove(self, seqs: Collection[int]) -> None:
        """Take back the lines of ``seqs`` (a put-back that could not finish): the log is
        rewritten without them, and the highest sequence number is what it was before they
        were appended. Raises ``OSError`` when the log cannot be rewritten."""
        with self._lock, self.watch.guard():
            kept = [line for line in self._whole_lines() if _line_seq(line) not in seqs]
            write_atomically(self.log_path, b"".join(kept))
            remaining = [seq for line in kept if (seq := _line_seq(line)) is not None]
            self.last_seq = max([self.acked, *remaining])
            self._pending = [r for r in self._pending if r.seq not in seqs]

    def hold(self, seq: int) -> None:
        """Keep the record of ``seq`` here, whatever is acknowledged after it, until
        :meth:`release`: it was refused for good and its letter is not durable yet."""
        with self._lock:
            self._kept.add(seq)

    def release(self, seq: int) -> None:
        """The letter of ``seq`` is durable: the record may leave (the cursor moves past it).
        Raises ``OSError`` when the cursor cannot be written (the next ack writes it)."""
        with self._lock:
            self._kept.discard(seq)
            if self.acked:
                with self.watch.guard(self.ack_path):
                    self._write_ack(self.acked)

    def probe(self, seq: int) -> None:
        """Write the ack cursor (at least ``seq``) even when it did not change: after a write
        failure, tells whether the disk is writable again although nothing waits to be written.
        Raises ``OSError`` while it is not."""
        with self._lock, self.watch.guard(self.ack_path):
            self._write_ack(max(seq, self.acked))

    def _write_ack(self, seq: int) -> None:
        self._offer_held()  # the dead-letter file may take them now
        held = [what.seq for what in self._held.values() if what.seq is not None]
        held.extend(self._kept)
        # Below a held line the cursor must not pass: the next start offers it again.
        cursor = min(seq, min(held) - 1) if held else seq
        write_atomically(self.ack_path, str(max(cursor, 0)).encode())
        self.acked = seq
        if seq >= self.last_seq and not self._held and not self._kept:
            # All delivered: the log restarts empty (the common, steady-state case).
            write_atomically(self.log_path, b"")
            return
        try:
            size = self.log_path.stat().st_size
        except FileNotFoundError:
            return
        if size > self._compact_bytes or seq >= self.last_seq:
            # Re-read under the lock so lines appended since the caller looked are kept; a
            # line whose sequence number cannot be read is kept too (it is not ours to drop),
            # a torn tail is not (it is not a line).
            kept = [line for line in self._whole_lines() if line in self._held
                    or (line_seq := _line_seq(line)) is None or line_seq > seq
                    or line_seq in self._kept]
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


def waiting_ids(directory: Path, sink: str) -> dict[str, int]:
    """The record ids ``sink``'s spool holds above its ack cursor, with the sequence number of
    the last line holding each; read only (nothing is cut or rewritten: ``redeliver
    --dry-run`` reads it too); empty when it cannot be read."""
    try:
        data = (directory / f"{sink}.log").read_bytes()
        cursor = _cursor((directory / f"{sink}.ack").read_text().strip()) \
            if (directory / f"{sink}.ack").exists() else 0
    except (OSError, ValueError):
        return {}
    out: dict[str, int] = {}
    for line in data[:data.rfind(b"\n") + 1].splitlines():
        try:
            item = json.loads(line)
        except (ValueError, RecursionError):
            continue
        seq = _seq_of(item)
        record = item.get("record") if isinstance(item, dict) else None
        rid = record.get("record_id") if isinstance(record, dict) else None
        if seq is not None and seq > cursor and isinstance(rid, str):
            out[rid] = seq
    return out


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


def _line_seq(line: bytes) -> int | None:
    """The sequence number of a spool line, ``None`` when it is not a line of ours."""
    try:
        return _seq_of(json.loads(line))
    except (ValueError, RecursionError):
        return None


def _seq_of(item: object) -> int | None:
    """A decoded line's sequence number, ``None`` when it has no usable one."""
    seq = item.get("seq") if isinstance(item, dict) else None
    return seq if isinstance(seq, int) and not isinstance(seq, bool) and seq >= 0 else None
