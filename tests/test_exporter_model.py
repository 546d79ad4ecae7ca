"""A stateful property test of the whole exporter where its parts meet (hypothesis
``RuleBasedStateMachine``): the real start sequence (delivery/start.py), the real poll loop
(``Poller``: track, commit, hand over), the real state committer, two sinks' real delivery
workers (driven one attempt at a time: ``DeliveryWorker.step``) with their spools and the
shared dead-letter file, and the real ``redeliver`` in both forms (by hand, and as a request
the next start carries out).

What hypothesis does between checks:

* polls of a document that gains, starts and loses events;
* a crash at any disk step of a poll, an attempt, a start or a ``redeliver`` (the write cut
  after some bytes, kept as kill -9 keeps it), or at the ``after_commit`` failpoint;
* ``redeliver`` by hand, and ``--at-next-start``;
* the dead-letter file's bound reached (it is small here: 2 files of 3 kB);
* the dead-letter file or a spool refusing every write (a full disk), then taking them again;
* each collector's next answers (accepted, refused for good, too large with proof, busy,
  ``RESOURCE_EXHAUSTED`` without ``RetryInfo``, a configuration error), one record it refuses
  whatever it is sent with, and a size limit that changes.

After every restart, every committed record (a commit that returned, or whose interrupted
commit the restart finds) is, for each sink: delivered, or waiting durably (its spool above
the cursor, or the state file's outbox), or in a dead-letter file ``redeliver`` reads, or among
the letters the bound removed and counted. At the end everything deliverable is delivered,
every record refused for good is in a dead-letter file (or counted), and a record is delivered
twice only after a crash that found its sink's ack cursor below it, or a ``redeliver`` that a
crash interrupted (docs/semantics.md, "Delivery").

CI runs 60 examples of up to 30 steps; ``SEE_MODEL_EXAMPLES=N`` runs more (the nightly job runs
2000).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from scheduled_events_exporter import failpoints
from scheduled_events_exporter.config import load_config
from scheduled_events_exporter.delivery import dead_letter as letters
from scheduled_events_exporter.delivery import redrive, start
from scheduled_events_exporter.delivery.dead_letter import DeadLetterFile
from scheduled_events_exporter.delivery.outcome import DeliveryError, FailureKind
from scheduled_events_exporter.delivery.spool import Spool
from scheduled_events_exporter.delivery.worker import DeliveryWorker
from scheduled_events_exporter.imds import PollResult
from scheduled_events_exporter.model import Document, InstanceInfo, Outcome, ScheduledEvent
from scheduled_events_exporter.platforms.durable import DiskStep, PowerLoss, set_step_hook
from scheduled_events_exporter.poller import Clock, Poller
from scheduled_events_exporter.records import TransitionRecord, approximate_size, to_columns
from scheduled_events_exporter.state import StateCommitter, StateStore
from scheduled_events_exporter.telemetry import Telemetry
from scheduled_events_exporter.tracker import TrackerState
from tests.test_durable_core_stateful import Tear

EXAMPLES = int(os.environ.get("SEE_MODEL_EXAMPLES", "60"))
BASE = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
SINKS = ("console", "otlp")
T0 = datetime(2026, 11, 27, tzinfo=timezone.utc)
CONFIG = load_config({"SEE_STATE_DIR": "", "SEE_POLL_INTERVAL": "1"}, create=False)
ANSWERS = {
    "accept": None,
    "400": (FailureKind.PERMANENT, "HTTP 400"),
    "413": (FailureKind.TOO_LARGE, "HTTP 413"),
    "503": (FailureKind.TRANSIENT, "HTTP 503"),
    "500": (FailureKind.TRANSIENT, "HTTP 500"),
    "exhausted": (FailureKind.EXHAUSTED, "gRPC RESOURCE_EXHAUSTED"),
    "401": (FailureKind.CONFIG, "HTTP 401"),
}


class SyncWorker(DeliveryWorker):
    """The delivery worker without its thread: the model calls :meth:`step`."""

    def start(self) -> None:
        self.open()


@dataclass
class Peer:
    """One sink's collector: the next answers, a record it always refuses, a size limit."""

    script: list[str] = field(default_factory=list)
    #: Record ids refused for good whatever they are sent with.
    poison: set[str] = field(default_factory=set)
    limit: int | None = None
    accepted: list[tuple[str, int]] = field(default_factory=list)

    def __call__(self, records: Sequence[TransitionRecord]) -> None:
        answer = ANSWERS[self.script.pop(0)] if self.script else None
        if answer is None and any(r.record_id in self.poison for r in records):
            answer = (FailureKind.PERMANENT, "HTTP 400")
        if answer is None and self.limit is not None and \
                sum(approximate_size(r) for r in records) > self.limit:
            answer = (FailureKind.TOO_LARGE, "HTTP 413")
        if answer is not None:
            raise DeliveryError("refused", answer[0], answer[1],
                                suspicious=answer[1] in ("HTTP 500", "gRPC RESOURCE_EXHAUSTED"))
        self.accepted.extend((r.record_id, r.seq) for r in records)


class Faults:
    """A step hook: writes to the dead-letter files or a spool refused (ENOSPC) while set,
    and a crash (``Tear``) armed for one operation."""

    def __init__(self) -> None:
        self.refused: set[str] = set()
        self.tear: Tear | None = None

    def __call__(self, step: DiskStep) -> None:
        if self.tear is not None:
            self.tear(step)
        name = step.path.name
        if step.kind in ("create", "write") and any(
                name.startswith(prefix) or name.startswith(f".{prefix}")
                for prefix in self.refused):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class ExporterModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="see-model-", dir=BASE))
        self.telemetry = Telemetry()
        self.peers = {sink: Peer() for sink in SINKS}
        self.faults = Faults()
        set_step_hook(self.faults)
        self.now = 0.0
        self.wall = T0
        self.events: list[ScheduledEvent] = []
        self.incarnation = 0
        self.serial = 0
        #: Record id → seq of every committed record (durable: each sink must account for it).
        self.committed: dict[str, int] = {}
        #: Records whose commit a crash interrupted: durable only if the restart finds them.
        self.maybe: dict[str, int] = {}
        #: (sink, record id) a crash or an interrupted redeliver allows to arrive twice.
        self.repeatable: set[tuple[str, str]] = set()
        self.boot()

    def teardown(self) -> None:
        try:
            self.check_end()
        finally:
            set_step_hook(None)
            failpoints.hit = self._real_hit
            shutil.rmtree(self.root, ignore_errors=True)

    # --- the exporter, assembled as app.py assembles it ------------------------------------

    _real_hit = staticmethod(failpoints.hit)

    def clock(self) -> float:
        return self.now

    def boot(self) -> None:
        """A start: the state loaded, the workers opened, then delivery/start.py's order."""
        self.store = StateStore(self.root)
        persisted = self.store.load()
        assert not list(self.root.glob("state.json.corrupt-*")), "the state was set aside"
        self.workers = {sink: SyncWorker(sink, self.peers[sink], lambda *_: None,
                                         max_records=10_000, spool=Spool(self.root / "spool",
                                                                         sink),
                                         dead_letter=DeadLetterFile(self.root),
                                         payload=to_columns, clock=self.clock,
                                         backoff=(0.5, 30.0))
                        for sink in SINKS}
        begun = start.begin(self.root, persisted, list(self.workers.values()), self.wall,
                            self.clock)
        self.committer = StateCommitter(
            self.store, lambda *_: None, settled=lambda: min(
                w.settled_seq() for w in self.workers.values()),
            outbox=persisted.outbox if persisted else (), unreadable=begun.unlettered)
        self.pending = begun.pending
        self.poller = Poller(CONFIG, self, list(self.workers.values()), self.telemetry,
                             instance=InstanceInfo(vm_name="vm"),
                             state=persisted.tracker if persisted else TrackerState(),
                             clock=Clock(wall=lambda: self.wall, monotonic=self.clock),
                             seq=begun.seq, commit=self, pending_request=begun.pending)

    # The poller's IMDS client and committer are the model (it notes what was committed).
    def fetch_events(self) -> PollResult:
        return PollResult(Outcome.OK, 0.01, 200,
                          Document(self.incarnation, tuple(self.events)))

    def commit(self, state: TrackerState, records: tuple[TransitionRecord, ...], seq: int, *,
               changed: bool) -> None:
        self.maybe.update((r.record_id, r.seq) for r in records)
        self.committer.commit(state, records, seq, changed=changed)
        for r in records:
            self.committed[r.record_id] = self.maybe.pop(r.record_id)

    def restart(self) -> None:
        """After a crash: what the disk holds now decides what the interrupted commit left."""
        self.faults.tear = None
        outbox = self.outbox_on_disk()
        spooled = {rid for sink in SINKS for rid, _ in self.spool_on_disk(sink)}
        for rid, seq in self.maybe.items():
            if rid in outbox or rid in spooled:
                self.committed[rid] = seq
        self.maybe.clear()
        self.restart_without_start()
        self.boot()
        self.check_accounted()

    @contextmanager
    def crashing(self, at: int | None, keep: int, after_commit: bool = False) -> Iterator[None]:
        """Run an operation that a crash may cut (at its ``at``-th disk step, or at the
        ``after_commit`` failpoint); a crash restarts the exporter."""
        self.faults.tear = Tear(at, keep) if at is not None else None

        def hit(name: str) -> None:
            if after_commit and name == "after_commit":
                raise PowerLoss

        failpoints.hit = hit
        try:
            yield
        except PowerLoss:
            failpoints.hit = self._real_hit
            event("a crash")
            self.restart()
        finally:
            failpoints.hit = self._real_hit
            self.faults.tear = None

    # --- what the files say ---------------------------------------------------------------

    def cursor_on_disk(self, sink: str) -> int:
        path = self.root / "spool" / f"{sink}.ack"
        try:
            return int(path.read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def spool_on_disk(self, sink: str) -> list[tuple[str, int]]:
        path = self.root / "spool" / f"{sink}.log"
        data = path.read_bytes() if path.exists() else b""
        out = []
        for line in data[:data.rfind(b"\n") + 1].splitlines():
            item = json.loads(line)
            out.append((str(item["record"]["record_id"]), int(item["seq"])))
        return out

    def outbox_on_disk(self) -> set[str]:
        path = self.root / "state.json"
        if not path.exists():
            return set()
        return {str(r["record_id"]) for r in json.loads(path.read_text()).get("outbox", [])
                if isinstance(r, dict)}

    def letters_on_disk(self) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        for path in letters.generations(self.root):
            data = path.read_bytes()
            out.extend(json.loads(x) for x in data[:data.rfind(b"\n") + 1].splitlines())
        return out

    # --- rules ------------------------------------------------------------------------------

    @rule(changes=st.lists(st.sampled_from(["appear", "appear", "start", "leave", "none"]),
                           min_size=1, max_size=4),
          crash=st.one_of(st.none(), st.integers(1, 16)), keep=st.integers(0, 400),
          after_commit=st.booleans())
    def poll(self, changes: list[str], crash: int | None, keep: int,
             after_commit: bool) -> None:
        """IMDS changes (an event appears, starts or leaves) before each of a few polls."""
        with self.crashing(crash, keep, after_commit):
            for change in changes:
                self.wall += timedelta(seconds=1)
                self.now += 1
                if change == "appear" or (change != "none" and not self.events):
                    self.serial += 1
                    self.events.append(ScheduledEvent(f"E{self.serial}", "Scheduled",
                                                      "Freeze", resources=("vm",)))
                elif change == "start":
                    first = self.events[0]
                    self.events[0] = ScheduledEvent(first.event_id, "Started", "Freeze",
                                                    resources=("vm",))
                elif change == "leave":
                    self.events.pop(0)
                self.incarnation += 1
                self.poller.poll_once()
                self.between_polls()

    @rule(changes=st.lists(st.sampled_from(["appear", "start", "leave"]), min_size=1,
                           max_size=4),
          answers=st.fixed_dictionaries({sink: st.lists(st.sampled_from(sorted(ANSWERS)),
                                                        max_size=4) for sink in SINKS}),
          attempts=st.integers(1, 6))
    def a_day(self, changes: list[str], answers: dict[str, list[str]], attempts: int) -> None:
        """The common run: a few polls, then each collector answers a few attempts."""
        self.poll(changes, None, 0, False)
        for sink in SINKS:
            self.deliver(sink, answers[sink], attempts, None, 0)

    def between_polls(self) -> None:
        """What the poll loop does after each poll: a waiting redeliver request again."""
        if self.pending is not None:
            self.now += 400.0  # its retry is due
            self.poller.seq = self.pending.retry(self.poller.seq, self.wall)

    @rule(sink=st.sampled_from(SINKS),
          answers=st.lists(st.sampled_from(sorted(ANSWERS)), max_size=6),
          attempts=st.integers(1, 8), crash=st.one_of(st.none(), st.integers(1, 6)),
          keep=st.integers(0, 400))
    def deliver(self, sink: str, answers: list[str], attempts: int, crash: int | None,
                keep: int) -> None:
        """The collector's next answers; attempts after each pause has passed."""
        self.peers[sink].script = list(answers)
        with self.crashing(crash, keep):
            for _ in range(attempts):
                self.now += 100.0  # past any pause (60 s at most)
                self.workers[sink].step()

    @rule(sink=st.sampled_from(SINKS))
    def poison_the_next(self, sink: str) -> None:
        """The collector will refuse the oldest record waiting, whatever it comes with."""
        waiting = [rid for rid, seq in self.spool_on_disk(sink)
                   if seq > self.cursor_on_disk(sink)]
        if waiting:
            self.peers[sink].poison.add(waiting[0])

    @rule(sink=st.sampled_from(SINKS), limit=st.one_of(st.none(), st.integers(600, 4000)))
    def limit_changes(self, sink: str, limit: int | None) -> None:
        self.peers[sink].limit = limit

    @rule(what=st.sampled_from(["dead-letter.jsonl", "console.", "otlp."]), on=st.booleans())
    def disk_refuses(self, what: str, on: bool) -> None:
        """A file refuses every write (a full disk), or takes them again."""
        (self.faults.refused.add if on else self.faults.refused.discard)(what)

    def has_letters(self) -> bool:
        return any(p.stat().st_size for p in letters.generations(self.root))

    @precondition(has_letters)
    @rule(crash=st.one_of(st.none(), st.integers(1, 10)), keep=st.integers(0, 400),
          sink=st.sampled_from([None, *SINKS]))
    def redeliver_by_hand(self, crash: int | None, keep: int, sink: str | None) -> None:
        """Stopped (a stop is a crash here: the model keeps nothing the disk does not), then
        ``redeliver``, then started."""
        chosen = redrive.plan(self.root, redrive.Selection(sink=sink))
        self.restart_without_start()
        self.faults.tear = Tear(crash, keep) if crash is not None else None
        try:
            redrive.apply(self.root, chosen, self.wall)
        except PowerLoss:
            for item in chosen.taken:  # its line may be written and its mark not
                self.repeatable.add((item.letter.sink, item.record.record_id))
        except OSError:
            pass  # all or none: a refused write changed nothing (checked at the restart)
        finally:
            self.faults.tear = None
        self.restart()

    @precondition(has_letters)
    @rule(crash=st.one_of(st.none(), st.integers(1, 12)), keep=st.integers(0, 400),
          sink=st.sampled_from([None, *SINKS]))
    def redeliver_at_next_start(self, crash: int | None, keep: int, sink: str | None) -> None:
        """``redeliver --at-next-start``, then a restart that carries it out (or not, on a
        full disk: then it waits, and the poll thread tries again)."""
        try:
            redrive.request(self.root, redrive.Selection(sink=sink), self.wall)
        except OSError:
            return
        for item in redrive.plan(self.root, redrive.Selection(sink=sink)).taken:
            self.repeatable.add((item.letter.sink, item.record.record_id))
        self.restart_without_start()
        with self.crashing(crash, keep):
            self.restart()

    def restart_without_start(self) -> None:
        """A crash (or a stop): a record settled above its sink's cursor on disk is sent
        again by the next start: one delivered, or one whose letter was written (if the
        collector takes it then, its letter may still be put back later)."""
        lettered = [(str(x["sink"]), str(x["record_id"]), int(str(x["seq"])))
                    for x in self.letters_on_disk() if "redelivered" not in x]
        for sink in SINKS:
            cursor = self.cursor_on_disk(sink)
            self.repeatable.update((sink, rid) for rid, seq in self.peers[sink].accepted
                                   if seq > cursor)
            self.repeatable.update((sink, rid) for s, rid, seq in lettered
                                   if s == sink and seq > cursor)

    @rule()
    def crash_now(self) -> None:
        self.restart()

    # --- invariants -------------------------------------------------------------------------

    @invariant()
    def files_are_whole(self) -> None:
        assert not list(self.root.glob("state.json.corrupt-*"))
        for sink in SINKS:
            cursor = self.cursor_on_disk(sink)
            seqs = [seq for _, seq in self.spool_on_disk(sink) if seq > cursor]
            assert seqs == sorted(set(seqs)), f"{sink}: the spool repeats or reorders {seqs}"

    def check_accounted(self) -> None:
        """Right after a start: nothing committed is only in memory."""
        outbox = self.outbox_on_disk()
        lettered = {(str(x["sink"]), str(x["record_id"])) for x in self.letters_on_disk()}
        for sink in SINKS:
            cursor = self.cursor_on_disk(sink)
            waiting = {rid for rid, seq in self.spool_on_disk(sink) if seq > cursor}
            accepted = {rid for rid, _ in self.peers[sink].accepted}
            missing = [rid for rid in self.committed if rid not in accepted
                       and rid not in waiting and rid not in outbox
                       and (sink, rid) not in lettered]
            removed = DeadLetterFile(self.root).removed_of(sink)
            assert len(missing) <= removed, f"{sink}: lost {missing} ({removed} counted)"

    def check_end(self) -> None:
        self.faults.refused.clear()
        for peer in self.peers.values():
            peer.script, peer.limit = [], None
        self.restart()
        for _ in range(400):
            self.now += 100.0
            if not any(w.step() for w in self.workers.values()):
                break
        self.between_polls()  # a waiting request goes now
        for _ in range(400):
            self.now += 100.0
            if not any(w.step() for w in self.workers.values()):
                break
        lettered = {(str(x["sink"]), str(x["record_id"])) for x in self.letters_on_disk()}
        event(f"letters at the end: {min(len(lettered), 5)}")
        event(f"committed at the end: {min(len(self.committed), 10) // 5 * 5}+")
        if any(DeadLetterFile(self.root).removed_of(s) for s in SINKS):
            event("letters removed at the bound")
        if any("redelivered" in x for x in self.letters_on_disk()):
            event("a letter redelivered")
        for sink in SINKS:
            peer = self.peers[sink]
            got = Counter(rid for rid, _ in peer.accepted)
            removed = DeadLetterFile(self.root).removed_of(sink)
            missing = [rid for rid in self.committed
                       if got[rid] == 0 and (sink, rid) not in lettered]
            assert len(missing) <= removed, f"{sink}: {missing} neither delivered nor lettered"
            for rid, times in got.items():
                assert times == 1 or (sink, rid) in self.repeatable, \
                    f"{sink}: {rid} delivered {times} times"


@pytest.fixture(autouse=True)
def small_dead_letter_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(letters, "MAX_BYTES", 3000)
    monkeypatch.setattr(letters, "GENERATIONS", 2)


ExporterModel.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                           HealthCheck.function_scoped_fixture])
TestExporterModel = ExporterModel.TestCase
