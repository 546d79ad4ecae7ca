"""The state file (docs/semantics.md#reliability): what a restart must remember, written atomically.

It holds the tracker state, the last record sequence number, and an *outbox*: the records of
the last committed document. The poll loop commits the state (with its records) before handing
the records to the sinks' spools; a crash between the two is repaired at start by re-spooling
the outbox (spool appends are idempotent by sequence number). So a restart neither repeats nor
forgets a transition.

The file evolves like the spool: an outbox record this release cannot read (a transition kind
a newer release added) does not make the file unusable; it is handed over to be dead-lettered
(``PersistedState.unreadable``) and the rest loads. Fields a newer release wrote, at the top
level and inside every value, are kept and written back. Damage costs only what is damaged: a
tracker entry this release cannot read is left out of tracking and written back as it was, and
the outbox is read whatever else in the file cannot be (:meth:`StateStore.load`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
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
from scheduled_events_exporter.model import UnknownFields, UnreadableItem
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
#: by development builds before the first release: such a file is moved away unread, as one
#: that is not JSON.
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
    its format changed in a way this one cannot follow. Left where it is (moving it away would
    lose what it remembers): the exporter refuses to start and says what to do."""


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
        """The saved state; ``None`` when there is none, or when nothing in it can be read (not
        JSON, not an object, a schema no release wrote, too large): then the file is moved to
        ``state.json.corrupt-<time>`` and said.

        Damage inside a readable file costs only what is damaged (docs/semantics.md,
        "Compatibility"), each said once here: a tracker entry this release cannot read is
        left out of tracking and kept in ``TrackerState.unreadable_events``, to be written back
        as it was; an approval that is not an EventId is left out; an unreadable ``seq`` is
        taken from the outbox; a tracker that cannot be read at all (not an object, a field of
        another type) is left out, with a copy of the file kept as ``state.json.corrupt-<time>``.
        The outbox is read whatever else is damaged, record by record: one this release cannot
        read is returned in ``unreadable``. Fields a newer release added are kept (said once,
        at INFO); fields an older release did not write take their defaults; an older released
        schema is migrated. Raises :class:`NewerStateFile` for a schema newer than
        ``SCHEMA_VERSION``."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("state file %s cannot be read (%s): this start knows no events, and "
                        "reports the pending ones as new", self.path, exc)
            return None
        try:
            if size > MAX_STATE_BYTES:
                raise ValueError(f"{size} bytes, expected at most {MAX_STATE_BYTES}")
            raw = self.path.read_bytes()
            data = json.loads(raw.decode("utf-8"))
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
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            aside = self.path.with_name(f"{STATE_FILE}.corrupt-{int(time.time())}")
            try:
                replace_durably(self.path, aside)
            except OSError:
                aside = self.path
            log.warning(
                "state file %s is unusable (%s); moved to %s: this start knows no events "
                "(it reports the pending ones as new) and has no outbox to repair",
                self.path,
                str(exc)[:200],
                aside.name,
            )
            return None
        return self._read(data, raw)

    def _read(self, data: dict[str, object], raw: bytes) -> PersistedState:
        """The parts of a readable file, each on its own: damage in one costs only that."""
        ignored: set[str] = set()
        records, unreadable = _read_outbox(data.get("outbox", []), ignored)
        seq = data.get("seq", 0)
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
            # The last number taken is in the outbox (the last commit's records) or in a
            # sink's spool; the start numbers after the highest of those.
            numbers = [r.seq for r in records] + [u.seq for u in unreadable if u.seq is not None]
            log.error("state file %s: seq %.40r is not a sequence number; numbering continues "
                      "after the outbox's highest (%d) and every sink's spool, the rest of "
                      "the state is kept", self.path, seq, max(numbers, default=0))
            seq = max(numbers, default=0)
        approvals = self._read_approvals(data.get("approvals", []))
        tracker = self._read_tracker(data, ignored, raw)
        platform = self._read_platform(data.get("platform"), ignored)
        unknown = tuple((key, value) for key, value in data.items() if key not in KNOWN_KEYS)
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
        return PersistedState(tracker=tracker, seq=seq, outbox=records, approvals=approvals,
                              unreadable=unreadable, platform=platform, unknown_fields=unknown)

    def _read_platform(self, raw: object, ignored: set[str]) -> PlatformState | None:
        """The platform command's memory; when it cannot be read, said, and started afresh
        (a message the queue delivers again may then make its records a second time, with the
        same ``log.record.uid``)."""
        if raw is None:
            return None
        try:
            return decode_platform(raw, ignored)
        except (ValueError, TypeError, RecursionError) as exc:
            log.error("state file %s: the platform memory cannot be read (%s); it starts "
                      "afresh, the rest of the state is kept", self.path, str(exc)[:300])
            return None

    def _read_tracker(self, data: dict[str, object], ignored: set[str],
                      raw: bytes) -> TrackerState:
        """The tracker, its unreadable entries kept aside in it (each said once); an empty
        one when it cannot be read at all."""
        seen: set[str] = set()
        try:
            if "tracker" not in data:
                raise ValueError("tracker: missing")
            tracker = decode_state(data["tracker"], seen)
        except (ValueError, TypeError, RecursionError) as exc:
            aside = self.path.with_name(f"{STATE_FILE}.corrupt-{int(time.time())}")
            try:
                # A copy: the file itself stays until the next save replaces it, so a crash
                # before then still finds its outbox.
                write_atomically(aside, raw)
                kept = f"a copy of the file is kept as {aside.name}"
            except OSError as copy_failed:
                kept = f"no copy of the file could be kept ({copy_failed})"
            log.error("state file %s: its tracker cannot be read (%s): this start knows no "
                      "events (it reports the pending ones as new), %s; its outbox, sequence "
                      "number and approvals are kept", self.path, str(exc)[:300], kept)
            return TrackerState()
        ignored.update(seen)
        kept_items = []
        for item in tracker.unreadable_events:
            name = _event_id(item)
            if item.key is not None and item.key in tracker.events:
                log.error("state file %s: tracker entry for EventId %s cannot be read (%s); "
                          "another entry for the same EventId can, and only that one is kept",
                          self.path, name, item.reason[:300])
                continue
            log.error("state file %s: tracker entry for EventId %s cannot be read (%s): it is "
                      "not tracked (while IMDS lists the event, it is reported as new) and is "
                      "kept in the file as it is; the rest of the state is kept",
                      self.path, name, item.reason[:300])
            kept_items.append(item)
        if len(kept_items) < len(tracker.unreadable_events):
            tracker = replace(tracker, unreadable_events=tuple(kept_items))
        return tracker

    def _read_approvals(self, value: object) -> tuple[str, ...]:
        """The EventIds whose approval IMDS accepted; anything else in the list is said once
        and left out."""
        if not isinstance(value, list):
            log.error("state file %s: approvals: expected a list of EventIds, got %s; no "
                      "approval is remembered, the rest of the state is kept", self.path,
                      type(value).__name__)
            return ()
        approvals = tuple(a for a in value if isinstance(a, str))
        if len(approvals) < len(value):
            wrong = [f"approvals[{i}]: {type(a).__name__}" for i, a in enumerate(value)
                     if not isinstance(a, str)]
            log.error("state file %s: approvals that are not EventIds are left out (%s), "
                      "the rest of the state is kept", self.path, ", ".join(wrong[:5]))
        return approvals

    def save(self, state: PersistedState) -> None:
        """Write the state atomically; a failure is logged once per streak and raised as
        ``OSError`` (the previous file is left intact)."""
        data = {
            "schema": SCHEMA_VERSION,
            "saved_at": time.time(),
            "seq": state.seq,
            "tracker": encode_state(state.tracker),
            # Entries this release cannot read go back as they were, after the records, until
            # a start has dead-lettered them for every sink.
            "outbox": [*(encode_record(r) for r in state.outbox),
                       *(_raw_entry(u) for u in state.unreadable)],
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

    The outbox it writes is every committed record that some sink's spool may still lack: the
    poll's new records, and those of earlier saves that ``settled()`` (the highest sequence
    number durable in every sink's spool, or delivered) has not passed yet. So a spool that
    cannot be written (its records held in memory) never leaves a record only in memory: the
    state file keeps it until the spool has it. A failed save (disk full, read-only volume) is
    logged once per streak by the store and retried at every poll; its records ride along in
    the next save's outbox.
    """

    HEARTBEAT = 60.0

    def __init__(
        self,
        store: StateStore,
        count_failure: Callable[[str, str, int], None],
        approvals: Callable[[], Iterable[str]] = tuple,
        unknown_fields: UnknownFields = (),
        *,
        settled: Callable[[], int] | None = None,
        outbox: tuple[TransitionRecord, ...] = (),
        unreadable: tuple[UnreadableLine, ...] = (),
    ) -> None:
        """``unknown_fields``: the loaded file's top-level fields a newer release wrote,
        written back at every save. ``settled``: how far every sink's spool has the records
        (``None``: each save's outbox is its own records only). ``outbox``: the loaded file's
        records, kept until ``settled`` passes them; ``unreadable``: its entries this release
        could not read and the start could not dead-letter, written back as they were."""
        self._store = store
        self._unknown = unknown_fields
        self._approvals = approvals
        self._count_failure = count_failure
        self._settled = settled
        self._last_save = -float("inf")
        self._unsaved: tuple[TransitionRecord, ...] = outbox
        self._failed = False
        self._unreadable = unreadable

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
        kept = self._unsaved
        if self._settled is not None and kept:
            settled = self._settled()
            kept = tuple(r for r in kept if r.seq > settled)
        if not changed and not self._failed and now - self._last_save < self.HEARTBEAT:
            return  # the file holds what some spool may lack: nothing new to keep
        outbox = (*kept, *records)
        try:
            self._store.save(
                PersistedState(
                    tracker=state,
                    seq=seq,
                    outbox=outbox,
                    approvals=tuple(sorted(self._approvals())),
                    unreadable=self._unreadable,
                    unknown_fields=self._unknown,
                )
            )
        except OSError:  # logged once per streak by the store
            self._unsaved = outbox
            self._failed = True
            self._count_failure("state", "state", 1)
            return
        # Saved: what some spool may still lack rides along in the next save too.
        self._unsaved = outbox if self._settled is not None else ()
        self._failed = False
        self._last_save = now


def _raw_entry(entry: UnreadableLine) -> object:
    """An outbox entry this release could not read, as the file held it."""
    content = entry.content
    return content.get("record") if isinstance(content, dict) else content


def _event_id(item: UnreadableItem) -> str:
    """The EventId an unreadable tracker entry names, as far as it can be read."""
    name = item.key
    if name is None and isinstance(item.raw, list) and len(item.raw) == 2 \
            and isinstance(item.raw[1], dict) and isinstance(item.raw[1].get("event"), dict):
        name = item.raw[1]["event"].get("event_id")
    return repr(name[:100]) if isinstance(name, str) else "(unreadable)"


def _read_outbox(outbox: object, ignored: set[str]
                 ) -> tuple[tuple[TransitionRecord, ...], tuple[UnreadableLine, ...]]:
    """The outbox's records, and those this release cannot read (each as the spool line it
    would have been, ``{"seq": n, "record": ...}``, so a dead letter has one shape). An outbox
    that is not a list is one entry this release cannot read."""
    if not isinstance(outbox, list):
        return (), (UnreadableLine(None, {"seq": None, "record": outbox},
                                   f"outbox: expected a list of records, got "
                                   f"{type(outbox).__name__}"),)
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


def read_outbox(directory: Path) -> tuple[int, tuple[TransitionRecord, ...]]:
    """The state file's ``seq`` and the outbox records this release can read, read only (for
    ``redeliver``, which must not number anything below them); ``(0, ())`` when there is no
    usable file (the exporter's next start then says why, and sets nothing aside here)."""
    try:
        data = json.loads((directory / STATE_FILE).read_bytes())
    except (OSError, ValueError, RecursionError):
        return 0, ()
    if not isinstance(data, dict):
        return 0, ()
    seq = data.get("seq", 0)
    outbox = data.get("outbox", [])
    records, _ = _read_outbox(outbox if isinstance(outbox, list) else [], set())
    valid = isinstance(seq, int) and not isinstance(seq, bool) and seq >= 0
    return (seq if valid else 0), records
