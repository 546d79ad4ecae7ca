"""The state file (docs/semantics.md#reliability): what a restart must remember, written atomically.

It holds the tracker state, the last record sequence number, and an *outbox*: the records of
the last committed document. The poll loop commits the state (with its records) before handing
the records to the sinks' spools; a crash between the two is repaired at start by re-spooling
the outbox (spool appends are idempotent by sequence number). So a restart neither repeats nor
forgets a transition.

The file evolves like the spool: an outbox record this release cannot read (a transition kind
a newer release added) does not make the file unusable; it is handed over to be dead-lettered
(``PersistedState.unreadable``) and the rest loads. Fields a newer release wrote, at the top
level and inside every value, are kept and written back.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from scheduled_events_exporter.codec import (
    UnreadableLine,
    decode_platform,
    decode_record,
    decode_state,
    encode_platform,
    encode_record,
    encode_state,
)
from scheduled_events_exporter.model import UnknownFields
from scheduled_events_exporter.platforms.durable import replace_durably, write_atomically
from scheduled_events_exporter.platforms.files import FILES
from scheduled_events_exporter.records import TransitionRecord
from scheduled_events_exporter.tracker import PlatformState, TrackerState
from scheduled_events_exporter.write_faults import WriteFault, WriteWatch

log = logging.getLogger(__name__)

#: 2: every field of the domain values under its own name (codec.py derives them). An additive
#: change (a new field with a default) keeps the number: older and newer releases both read
#: the file (docs/semantics.md#compatibility). A change that is not additive bumps it and adds
#: a migration from every earlier released schema to ``MIGRATIONS``. Schema 1 was written only
#: by development builds before the first release: such a file is set aside, as a damaged one.
SCHEMA_VERSION = 2
#: schema → function turning that schema's top-level object into the next schema's. Empty:
#: 2 is the first released schema (0.1.0).
MIGRATIONS: dict[int, Callable[[dict[str, object]], dict[str, object]]] = {}
#: The first schema a release wrote; older ones were never released and are not migrated.
FIRST_RELEASED_SCHEMA = 2
STATE_FILE = "state.json"
#: The state file's top-level keys this release writes.
KNOWN_KEYS = frozenset({"schema", "saved_at", "seq", "tracker", "outbox", "approvals",
                        "platform"})
#: A state file is a few KB; one far larger is not ours (or is damaged).
MAX_STATE_BYTES = 64 * 1024 * 1024


class NewerStateFile(Exception):
    """The state file has a schema newer than this release reads: a newer release wrote it and
    its format changed in a way this one cannot follow. Not set aside (that would lose what it
    remembers): the exporter refuses to start and says what to do."""


@dataclass(frozen=True, slots=True)
class PersistedState:
    """Everything the state file carries."""

    tracker: TrackerState
    seq: int = 0
    outbox: tuple[TransitionRecord, ...] = ()
    approvals: tuple[str, ...] = ()
    #: Outbox records this release cannot read (read only; never written back: they go to
    #: the dead-letter file at start, for each sink whose spool does not have them yet).
    unreadable: tuple[UnreadableLine, ...] = ()
    #: The platform command's memory (pending and ended events, delivery ids), under the
    #: top-level key ``platform``; ``None`` in the sidecar's file (an additive key: a release
    #: without it keeps it as a field it does not know).
    platform: PlatformState | None = None
    #: Top-level fields a newer release wrote, written back as they were.
    unknown_fields: UnknownFields = field(default=(), compare=False, repr=False)


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
        """The saved state; ``None`` when there is none or it is damaged (then set aside).

        Fields a newer release added are kept (said once, at INFO); fields an older release
        did not write take their defaults; an older released schema is migrated; an outbox
        record this release cannot read is returned in ``unreadable``, the rest loads. Raises
        :class:`NewerStateFile` for a schema newer than ``SCHEMA_VERSION``."""
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
            schema = data.get("schema")
            if not isinstance(schema, int) or isinstance(schema, bool) or schema < 1:
                raise ValueError(f"schema {schema!r}, expected a schema number")
            if schema > SCHEMA_VERSION:
                raise NewerStateFile(
                    f"state file {self.path} has schema {schema}, written by a newer release; "
                    f"this release reads schemas {FIRST_RELEASED_SCHEMA} to {SCHEMA_VERSION}. "
                    "Run the newer release again, or move the file away to start without it "
                    "(pending events are then reported again as new)")
            if schema < FIRST_RELEASED_SCHEMA:
                raise ValueError(f"schema {schema}, written by a development build before "
                                 f"the first release (this release reads {FIRST_RELEASED_SCHEMA}"
                                 f" to {SCHEMA_VERSION})")
            while schema < SCHEMA_VERSION:
                data, schema = MIGRATIONS[schema](data), schema + 1
            seq = data.get("seq", 0)
            if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
                raise ValueError("seq: expected a non-negative integer")
            approvals = data.get("approvals", [])
            if not isinstance(approvals, list) or not all(isinstance(a, str) for a in approvals):
                raise ValueError("approvals: expected a list of strings")
            outbox = data.get("outbox", [])
            if not isinstance(outbox, list):
                raise ValueError("outbox: expected a list of records")
            ignored: set[str] = set()
            if "tracker" not in data:
                raise ValueError("tracker: missing")
            records, unreadable = _read_outbox(outbox, ignored)
            unknown = tuple((key, value) for key, value in data.items()
                            if key not in KNOWN_KEYS)
            platform = data.get("platform")
            loaded = PersistedState(
                tracker=decode_state(data["tracker"], ignored),
                seq=seq,
                outbox=records,
                approvals=tuple(approvals),
                unreadable=unreadable,
                platform=None if platform is None else decode_platform(platform, ignored),
                unknown_fields=unknown,
            )
            ignored.update(f"state.{key}" for key, _ in unknown)
            if ignored:
                log.info("state file %s: keeping fields this release does not know (a newer "
                         "release wrote them; they are written back as they are): %s",
                         self.path, ", ".join(sorted(ignored)))
            for entry in unreadable:
                log.warning("state file %s: its outbox holds a record this release cannot read "
                            "(%s); it goes to the dead-letter file of every sink that has not "
                            "spooled it, the rest of the state is kept", self.path,
                            entry.reason[:300])
            return loaded
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            aside = self.path.with_name(f"{STATE_FILE}.corrupt-{int(time.time())}")
            try:
                replace_durably(self.path, aside)
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
        if state.platform is not None:
            data["platform"] = encode_platform(state.platform)
        for key, value in state.unknown_fields:
            data.setdefault(key, value)  # a newer release's, as it wrote it
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
        unknown_fields: UnknownFields = (),
    ) -> None:
        """``unknown_fields``: the loaded file's top-level fields a newer release wrote,
        written back at every save."""
        self._store = store
        self._unknown = unknown_fields
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
                    unknown_fields=self._unknown,
                )
            )
        except OSError:  # logged once per streak by the store
            self._unsaved = outbox
            self._count_failure("state", "state", 1)
            return
        self._unsaved = ()
        self._last_save = now


def _read_outbox(outbox: list[object], ignored: set[str]
                 ) -> tuple[tuple[TransitionRecord, ...], tuple[UnreadableLine, ...]]:
    """The outbox's records, and those this release cannot read (each as the spool line it
    would have been, ``{"seq": n, "record": ...}``, so a dead letter has one shape)."""
    records: list[TransitionRecord] = []
    unreadable: list[UnreadableLine] = []
    for index, raw in enumerate(outbox):
        try:
            records.append(decode_record(raw, ignored))
        except (ValueError, TypeError, RecursionError) as exc:
            seq = raw.get("seq") if isinstance(raw, dict) else None
            if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
                seq = None
            unreadable.append(UnreadableLine(seq, {"seq": seq, "record": raw},
                                             f"outbox entry {index}: {str(exc)[:500]}"))
    return tuple(records), tuple(unreadable)
