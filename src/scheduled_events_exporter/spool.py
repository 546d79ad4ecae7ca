"""Per-sink on-disk spool: records wait here until their sink acknowledges them
(docs/semantics.md#reliability).

An append-only log of JSON lines (``<sink>.log``, each ``{"seq": n, "record": {...}}``) plus an
acknowledgement cursor (``<sink>.ack``, the highest delivered sequence number). Appends are
fsynced and idempotent by sequence number; a torn last line after a crash is skipped. The log
is compacted (rewritten atomically with only pending lines) once everything in it is delivered
or it has grown past a bound, so the file stays small in steady state.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Collection, Sequence
from pathlib import Path

from scheduled_events_exporter.codec import decode_record, encode_record
from scheduled_events_exporter.platforms.files import FILES, append_durably, write_atomically
from scheduled_events_exporter.records import TransitionRecord
from scheduled_events_exporter.write_faults import WriteFault, WriteWatch

log = logging.getLogger(__name__)

COMPACT_BYTES = 4 * 1024 * 1024


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

    def load(self) -> list[TransitionRecord]:
        """Records appended but not acknowledged, in order (read once, at start)."""
        with self._lock:
            if self._loaded:
                return list(self._pending)
            self._loaded = True
            pending: dict[int, TransitionRecord] = {}
            skipped = 0
            try:
                with self.log_path.open("rb") as handle:
                    for line in handle:
                        try:
                            item = json.loads(line)
                            seq = item["seq"]
                            if not isinstance(seq, int):
                                raise ValueError("seq")
                            record = decode_record(item["record"])
                        except (ValueError, KeyError, TypeError, RecursionError):
                            skipped += 1
                            continue
                        self.last_seq = max(self.last_seq, seq)
                        if seq > self.acked:
                            pending[seq] = record
            except FileNotFoundError:
                pass
            if skipped:
                log.warning(
                    "spool %s: skipped %d unreadable lines (a torn write after a crash)",
                    self.sink,
                    skipped,
                )
            self._pending = [r for _, r in sorted(pending.items())]
            return list(self._pending)

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
            return max(0, int(self.ack_path.read_text().strip() or 0))
        except FileNotFoundError:
            return 0
        except (OSError, ValueError) as exc:
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


def _line_seq(line: bytes) -> int:
    try:
        seq = json.loads(line)["seq"]
    except (ValueError, KeyError, TypeError):
        return -1
    return seq if isinstance(seq, int) else -1
