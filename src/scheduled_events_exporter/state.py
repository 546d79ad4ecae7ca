"""The state file (docs/semantics.md#reliability): what a restart must remember, written atomically.

It holds the tracker state, the last record sequence number, and an *outbox*: the records of
the last committed document. The poll loop commits the state (with its records) before handing
the records to the sinks' spools; a crash between the two is repaired at start by re-spooling
the outbox (spool appends are idempotent by sequence number). So a restart neither repeats nor
forgets a transition.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from scheduled_events_exporter.codec import decode_record, decode_state, encode_record, encode_state
from scheduled_events_exporter.platforms.files import FILES, write_atomically
from scheduled_events_exporter.records import TransitionRecord
from scheduled_events_exporter.tracker import TrackerState
from scheduled_events_exporter.write_faults import WriteFault, WriteWatch

log = logging.getLogger(__name__)

#: 2: every field of the domain values under its own name (codec.py derives them); a file of
#: schema 1 (a development build) is set aside once, and the exporter starts afresh.
SCHEMA_VERSION = 2
STATE_FILE = "state.json"
#: A state file is a few KB; one far larger is not ours (or is damaged).
MAX_STATE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class PersistedState:
    """Everything the state file carries."""

    tracker: TrackerState
    seq: int = 0
    outbox: tuple[TransitionRecord, ...] = ()
    approvals: tuple[str, ...] = ()


class StateStore:
    """Loads and saves :class:`PersistedState` in ``directory/state.json``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / STATE_FILE
        FILES.make_dirs(directory)
        self.watch = WriteWatch(self.path, "state file",
                                "the previous state file stays intact and a restart would "
                                "not know what was seen since")

    @property
    def fault(self) -> WriteFault | None:
        """Why the last save failed, while it does."""
        return self.watch.fault

    def load(self) -> PersistedState | None:
        """The saved state; ``None`` when there is none or it is unusable (then set aside)."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("state file %s unreadable (%s); starting fresh", self.path, exc)
            return None
        try:
            if size > MAX_STATE_BYTES:
                raise ValueError(f"{size} bytes, expected at most {MAX_STATE_BYTES}")
            data = json.loads(self.path.read_bytes().decode("utf-8"))
            if not isinstance(data, dict):
                raise ValueError(f"expected a JSON object, got {type(data).__name__}")
            if data.get("schema") != SCHEMA_VERSION:
                raise ValueError(f"schema {data.get('schema')!r}, expected {SCHEMA_VERSION}")
            seq = data.get("seq", 0)
            if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
                raise ValueError("seq: expected a non-negative integer")
            approvals = data.get("approvals", [])
            if not isinstance(approvals, list) or not all(isinstance(a, str) for a in approvals):
                raise ValueError("approvals: expected a list of strings")
            return PersistedState(
                tracker=decode_state(data["tracker"]),
                seq=seq,
                outbox=tuple(decode_record(r) for r in data.get("outbox", [])),
                approvals=tuple(approvals),
            )
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            aside = self.path.with_name(f"{STATE_FILE}.corrupt-{int(time.time())}")
            try:
                FILES.replace(self.path, aside)
            except OSError:
                aside = self.path
            log.warning(
                "state file %s is unusable (%s); moved to %s, starting fresh",
                self.path,
                str(exc)[:200],
                aside.name,
            )
            return None

    def save(self, state: PersistedState) -> None:
        """Write the state atomically; a failure is logged once per streak and raised as
        ``OSError`` (the previous file is left intact)."""
        data = {
            "schema": SCHEMA_VERSION,
            "saved_at": time.time(),
            "seq": state.seq,
            "tracker": encode_state(state.tracker),
            "outbox": [encode_record(r) for r in state.outbox],
            "approvals": list(state.approvals),
        }
        with self.watch.guard():
            write_atomically(self.path, json.dumps(data, separators=(",", ":")).encode())


class StateCommitter:
    """Saves the state file when the tracker state changed, and at least every minute.

    Called by the poll thread only (it also makes the last commit at stop), so no lock: one
    writer cannot write an older state last.

    A failed save (disk full, read-only volume) is logged once per streak by the store and
    retried at every poll; the records of failed saves ride along in the next save's outbox,
    so once the disk is writable again a crash still cannot lose them.
    """

    HEARTBEAT = 60.0

    def __init__(
        self,
        store: StateStore,
        count_failure: Callable[[str, str, int], None],
        approvals: Callable[[], Iterable[str]] = tuple,
    ) -> None:
        self._store = store
        self._approvals = approvals
        self._count_failure = count_failure
        self._last_save = -float("inf")
        self._unsaved: tuple[TransitionRecord, ...] = ()

    def commit(
        self,
        state: TrackerState,
        records: tuple[TransitionRecord, ...],
        seq: int,
        *,
        changed: bool,
    ) -> None:
        """Write the state file (with ``records`` as its outbox) when it is due."""
        now = time.monotonic()
        if not changed and not self._unsaved and now - self._last_save < self.HEARTBEAT:
            return
        outbox = (*self._unsaved, *records)
        try:
            self._store.save(
                PersistedState(
                    tracker=state,
                    seq=seq,
                    outbox=outbox,
                    approvals=tuple(sorted(self._approvals())),
                )
            )
        except OSError:  # logged once per streak by the store
            self._unsaved = outbox
            self._count_failure("state", "state", 1)
            return
        self._unsaved = ()
        self._last_save = now
