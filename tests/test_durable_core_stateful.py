"""A stateful property test of the durable core (hypothesis ``RuleBasedStateMachine``).

The state file, one sink's spool and ack cursor, and the dead-letter file, on real files, driven
as the exporter drives them: a poll commits its records to the state file, then appends them to
the spool; delivery takes the oldest pending records (a refused one goes to the dead-letter
file) and acknowledges them. Between those, hypothesis crashes the process at a random disk
step of a random operation (the write cut after a random number of bytes, with what reached the
file kept, as after kill -9), restarts the core as the exporter does (load the state, load the
spool, which cuts a torn tail and dead-letters what it cannot read, re-append the outbox), or
lets another release write a line into the spool. After every step it checks the files against
a model: every committed record not yet acknowledged is pending, in order and once; nothing is
invented; the files parse whole; the state is never set aside; only the refused records and the
other release's lines are dead-lettered. At the end everything is delivered, and each record
was delivered exactly once, except those whose acknowledgement a crash interrupted.

CI runs a bounded number of examples; ``SEE_STATEFUL_EXAMPLES=N`` runs more (the nightly job).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from scheduled_events_exporter.codec import UnreadableLine, encode_record
from scheduled_events_exporter.delivery import dead_letter as letters
from scheduled_events_exporter.delivery.dead_letter import DeadLetterFile
from scheduled_events_exporter.delivery.spool import Spool
from scheduled_events_exporter.model import InstanceInfo, ScheduledEvent, Transition, TransitionKind
from scheduled_events_exporter.platforms.durable import (
    DiskStep,
    PowerLoss,
    set_step_hook,
    write_all,
)
from scheduled_events_exporter.records import TransitionRecord, to_columns
from scheduled_events_exporter.state import PersistedState, StateStore
from scheduled_events_exporter.tracker import TrackerState

AT = datetime(2026, 11, 27, tzinfo=timezone.utc)
EXAMPLES = int(os.environ.get("SEE_STATEFUL_EXAMPLES", "120"))
BASE = Path("/dev/shm") if Path("/dev/shm").is_dir() else None


def record(seq: int) -> TransitionRecord:
    event = ScheduledEvent(f"E{seq}", "Scheduled", "Freeze", resources=("vm",))
    return TransitionRecord(Transition(TransitionKind.SCHEDULED, AT, seq, event),
                            InstanceInfo(vm_name="vm"), f"rid-{seq}", True, "0.1.0", seq)


@dataclass
class Tear:
    """Raise :class:`PowerLoss` at the ``at``-th disk step from now, after ``keep`` bytes of it
    when it is a write."""

    at: int
    keep: int
    fired: bool = False

    def __call__(self, step: DiskStep) -> None:
        self.at -= 1
        if self.at > 0 or self.fired:
            return
        self.fired = True
        if step.kind == "write":
            write_all(step.fd, step.data[:self.keep])
        raise PowerLoss


class DurableCore(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="see-stateful-", dir=BASE))
        self.next_seq = 1
        #: seq → record id of every record whose commit returned (the model's durable set).
        self.committed: dict[int, str] = {}
        #: Records whose commit a crash interrupted: durable only if the restart finds them.
        self.maybe: dict[int, str] = {}
        self.poison: set[str] = set()
        self.foreign: set[str] = set()
        self.acked = 0
        self.delivered: Counter[str] = Counter()
        #: Records a crash may make us deliver again (their ack was interrupted).
        self.repeatable: set[str] = set()
        self.in_flight_ack: list[str] = []
        #: The dead-letter file cannot be written (a full disk) during the next start.
        self.letters_full = False
        self.start()

    def teardown(self) -> None:
        try:
            set_step_hook(None)
            self.check_end()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    # --- the core, as the exporter assembles it -------------------------------------------

    def start(self) -> None:
        self.store = StateStore(self.root)
        self.spool = Spool(self.root / "spool", "otlp", compact_bytes=2000)
        self.letters = DeadLetterFile(self.root)
        persisted = self.store.load()
        assert not list(self.root.glob("state.json.corrupt-*")), "the state was set aside"
        self.pending = self.spool.load(self._reject_unreadable)
        if persisted is not None:
            for line in persisted.unreadable:
                if line.seq is None or line.seq > self.spool.last_seq:
                    self._reject_unreadable(line)
            self.pending.extend(self.spool.append(persisted.outbox))

    def _reject_unreadable(self, line: UnreadableLine) -> None:
        if self.letters_full:
            raise OSError(28, "No space left on device")
        self.letters.append(letters.unreadable("otlp", line.seq, line.content, line.reason))

    def crash_and_restart(self) -> None:
        set_step_hook(None)
        # What a restart finds decides the interrupted operations.
        for seq, rid in self.maybe.items():
            if seq <= self.spool_last_seq_on_disk() or rid in self.outbox_on_disk():
                self.committed[seq] = rid
        self.maybe.clear()
        self.acked = self.ack_on_disk()
        self.start()

    # --- what the files say ---------------------------------------------------------------

    def ack_on_disk(self) -> int:
        path = self.root / "spool" / "otlp.ack"
        return int(path.read_text() or 0) if path.exists() else 0

    def log_lines(self) -> list[dict[str, object]]:
        path = self.root / "spool" / "otlp.log"
        text = path.read_bytes() if path.exists() else b""
        return [json.loads(x) for x in text[:text.rfind(b"\n") + 1].splitlines()]

    def spool_last_seq_on_disk(self) -> int:
        seqs = [int(str(x["seq"])) for x in self.log_lines()]
        return max([self.ack_on_disk(), *seqs])

    def outbox_on_disk(self) -> set[str]:
        path = self.root / "state.json"
        if not path.exists():
            return set()
        return {str(r["record_id"]) for r in json.loads(path.read_text())["outbox"]}

    def letters_on_disk(self) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        for name in ("dead-letter.jsonl.1", "dead-letter.jsonl"):
            path = self.root / name
            if path.exists():
                text = path.read_text()
                out.extend(json.loads(x) for x in text[:text.rfind("\n") + 1].splitlines())
        return out

    # --- rules ------------------------------------------------------------------------------

    @rule(count=st.integers(1, 3), poisoned=st.booleans())
    def poll(self, count: int, poisoned: bool) -> None:
        """A poll with transitions: commit them to the state file, then spool them."""
        batch = tuple(record(self.next_seq + i) for i in range(count))
        self.next_seq += count
        if poisoned:
            self.poison.add(batch[-1].record_id)
        self.store.save(PersistedState(TrackerState(incarnation=batch[-1].seq),
                                       seq=batch[-1].seq, outbox=batch))
        self.committed.update((r.seq, r.record_id) for r in batch)
        self.pending.extend(self.spool.append(batch))

    @precondition(lambda self: self.pending)
    @rule(count=st.integers(1, 4))
    def deliver(self, count: int) -> None:
        """Deliver (or dead-letter, when refused) the oldest records, then acknowledge."""
        batch, self.pending = self.pending[:count], self.pending[count:]
        self.in_flight_ack = [r.record_id for r in batch]
        for r in batch:
            if r.record_id in self.poison:
                self.letters.append(letters.rejected("otlp", r, "HTTP 400", "refused",
                                                     to_columns))
            else:
                self.delivered[r.record_id] += 1
        self.spool.ack(batch[-1].seq)
        self.in_flight_ack = []
        self.acked = batch[-1].seq

    @rule(at=st.integers(1, 10), keep=st.integers(0, 1200),
          during=st.sampled_from(["poll", "deliver", "restart"]), count=st.integers(1, 3))
    def crash(self, at: int, keep: int, during: str, count: int) -> None:
        """The power goes at a disk step of an operation (a write cut after ``keep`` bytes);
        then the exporter starts again."""
        tear = Tear(at, keep)
        set_step_hook(tear)
        first = self.next_seq
        try:
            if during == "poll":
                self.poll(count, False)
            elif during == "deliver" and self.pending:
                self.deliver(count)
            else:
                self.start()
        except PowerLoss:
            if during == "poll":
                # The commit or the append was cut: the records are durable only if the state
                # file's rename or the spool line made it.
                for seq in range(first, self.next_seq):
                    if seq not in self.committed:
                        self.maybe[seq] = f"rid-{seq}"
            if during == "deliver":
                self.repeatable.update(self.in_flight_ack)
                self.in_flight_ack = []
        finally:
            set_step_hook(None)
        self.crash_and_restart()

    @rule(full=st.booleans())
    def restart(self, full: bool) -> None:
        """A clean restart (an upgrade, a rollback); ``full``: the dead-letter file cannot be
        written meanwhile, so lines this release cannot read stay in the spool, and every
        rewrite of it (compaction, emptying) must keep them."""
        self.letters_full = full
        try:
            self.crash_and_restart()
        finally:
            self.letters_full = False

    @rule(full=st.booleans())
    def line_of_another_release(self, full: bool) -> None:
        """Stopped; another release appends a line of a kind this one does not know; started
        (``full``: with the dead-letter file unwritable, see :meth:`restart`)."""
        seq = self.next_seq
        self.next_seq += 1
        data = encode_record(record(seq))
        data["record_id"] = f"rid-foreign-{seq}"
        data["transition"]["kind"] = "superseded"
        with (self.root / "spool" / "otlp.log").open("ab") as handle:
            handle.write(json.dumps({"seq": seq, "record": data}).encode() + b"\n")
        self.foreign.add(f"rid-foreign-{seq}")
        self.restart(full)

    # --- invariants -------------------------------------------------------------------------

    @invariant()
    def files_agree_with_the_model(self) -> None:
        log = self.root / "spool" / "otlp.log"
        if log.exists() and log.stat().st_size:
            assert log.read_bytes().endswith(b"\n"), "the running spool ends with a torn line"
        lines = self.log_lines()
        acked = self.ack_on_disk()
        assert acked >= self.acked - 0, (acked, self.acked)
        waiting = [(int(str(x["seq"])), str(x["record"]["record_id"]))  # type: ignore[index]
                   for x in lines if int(str(x["seq"])) > acked]
        seqs = [seq for seq, _ in waiting]
        assert seqs == sorted(set(seqs)), f"the spool repeats or reorders: {seqs}"
        known = {**self.committed, **self.maybe}
        for seq, rid in waiting:
            assert known.get(seq) == rid or rid in self.foreign, f"invented: {seq} {rid}"
        # Every committed record not acknowledged is waiting (in memory, as pending).
        pending = {r.seq for r in self.pending}
        for seq, rid in self.committed.items():
            if seq > acked:
                assert seq in pending, f"{rid} (committed) is not pending"
        lettered = {str(x["record_id"]) for x in self.letters_on_disk()}
        assert lettered <= self.poison | self.foreign, f"dead-lettered {lettered}"
        assert not list(self.root.glob("state.json.corrupt-*"))

    def check_end(self) -> None:
        self.crash_and_restart()  # the dead-letter file takes what it could not before
        while self.pending:
            self.deliver(4)
        lettered = {str(x["record_id"]) for x in self.letters_on_disk()}
        for rid in self.committed.values():
            if rid in self.poison:
                assert rid in lettered, f"{rid} was refused but not dead-lettered"
            else:
                assert self.delivered[rid] >= 1, f"{rid} was never delivered"
        for rid, times in self.delivered.items():
            assert times == 1 or rid in self.repeatable, f"{rid} delivered {times} times"
        assert self.foreign <= lettered, "a line of another release was dropped"


DurableCore.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestDurableCore = DurableCore.TestCase
