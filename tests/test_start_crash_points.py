"""Every point where a crash can land during the exporter's start (delivery/start.py), on a
state directory that holds what the parts of the exporter leave each other: an outbox a crash
left unspooled (the ``after_commit`` failpoint), dead letters of a configured sink and of one
no longer configured, and a ``redeliver --at-next-start`` request.

The start is recorded through platforms/durable.py's step seam, as tests/test_crash_points.py
records the durable core: the spools are read, the outbox appended to each (``otlp`` and
``console``), the numbers counted, the request carried out (the letters appended to ``otlp``'s
spool through its worker and to ``eventhubs``'s bare spool, marked, the request removed).
tests/crashdisk.py rebuilds the disk as a crash before each step would leave it (kill -9, power
loss, each write torn at 16 offsets per line); the start then runs again on it, its workers
deliver everything, and the test checks:

* every outbox record is delivered to each configured sink, once, before any letter;
* every letter's record is delivered (or pending, for the sink not configured) with its
  original ``log.record.uid``, once, also when the crash came after its spool line and before
  its mark (the rerun finds the record waiting in the spool and only marks the letter);
* each sink's sequence numbers increase; nothing is set aside; the request is gone, and a
  second start puts nothing back.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import pytest

from scheduled_events_exporter.codec import encode_record, encode_state
from scheduled_events_exporter.delivery import redrive, start
from scheduled_events_exporter.delivery.dead_letter import DeadLetterFile
from scheduled_events_exporter.delivery.redrive import Selection
from scheduled_events_exporter.delivery.spool import Spool
from scheduled_events_exporter.delivery.worker import DeliveryWorker
from scheduled_events_exporter.platforms.durable import set_step_hook
from scheduled_events_exporter.records import TransitionRecord
from scheduled_events_exporter.state import StateStore
from scheduled_events_exporter.tracker import TrackerState
from tests.crashdisk import Disk, Recorder, crash_points, digest, write_out
from tests.test_redrive_crash_points import letter, marked_ids, record, spooled_ids

AT = datetime(2026, 11, 27, 10, tzinfo=timezone.utc)
NOW = datetime(2026, 11, 28, 8, 30, tzinfo=timezone.utc)
SINKS = ("console", "otlp")
#: Delivered before the crash (both spools acknowledged them).
DELIVERED = (1, 2)
#: Committed to the state file's outbox, never spooled: the crash came after the commit.
OUTBOX = (3, 4, 5)
#: Letters to put back: (their record's original seq, sink); eventhubs is not configured.
LETTERS = ((90, "otlp"), (91, "eventhubs"), (92, "otlp"))


def state_dir(root: Path) -> None:
    (root / "spool").mkdir(parents=True)
    for sink in SINKS:
        lines = [json.dumps({"seq": s, "record": encode_record(record(s))}) for s in DELIVERED]
        (root / "spool" / f"{sink}.log").write_text("".join(x + "\n" for x in lines))
        (root / "spool" / f"{sink}.ack").write_text(str(DELIVERED[-1]))
    state = {"schema": 2, "seq": OUTBOX[-1], "outbox": [encode_record(record(s))
                                                        for s in OUTBOX],
             "tracker": encode_state(TrackerState()), "approvals": []}
    (root / "state.json").write_text(json.dumps(state))
    (root / "dead-letter.jsonl").write_bytes(b"".join(letter(s, k) for s, k in LETTERS))
    redrive.request(root, Selection(), NOW)


class Collector:
    """Every configured sink's peer: takes what it is given once ``open`` is set."""

    def __init__(self, open_: bool) -> None:
        self.open = threading.Event()
        if open_:
            self.open.set()
        self.got: dict[str, list[TransitionRecord]] = {sink: [] for sink in SINKS}

    def worker(self, root: Path, sink: str) -> DeliveryWorker:
        def deliver(records: Sequence[TransitionRecord]) -> None:
            if not self.open.wait(5):
                raise OSError("held")
            self.got[sink].extend(records)
        return DeliveryWorker(sink, deliver, lambda *_: None, max_records=1000,
                              spool=Spool(root / "spool", sink),
                              dead_letter=DeadLetterFile(root), backoff=(0.001, 0.001))


def start_on(root: Path, collector: Collector) -> tuple[list[DeliveryWorker], start.Begun]:
    workers = [collector.worker(root, sink) for sink in SINKS]
    persisted = StateStore(root).load()
    begun = start.begin(root, persisted, workers, NOW)
    for worker in workers:
        worker.start()
    return workers, begun


def check_restart(root: Path, crashed: dict[str, bytes]) -> None:
    collector = Collector(open_=True)
    workers, begun = start_on(root, collector)
    try:
        assert begun.pending is None, begun.pending.fault if begun.pending else None
        for worker in workers:
            assert worker.flush(20), f"{worker.name}: not delivered"
    finally:
        for worker in workers:
            worker.stop(1)
    assert not (root / redrive.REQUEST_FILE).exists()
    assert not list(root.glob("state.json.corrupt-*"))
    letters = [json.loads(x) for x in (root / "dead-letter.jsonl").read_bytes().splitlines()]
    assert all("redelivered" in x for x in letters), "a letter was not put back"
    for sink in SINKS:
        got = collector.got[sink]
        seqs = [r.seq for r in got]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), (sink, seqs)
        counts = Counter(r.record_id for r in got)
        for seq in OUTBOX:
            assert counts[f"rid-{seq}"] == 1, (sink, seq, counts)
        first_letter = min((i for i, r in enumerate(got) if r.record_id in
                            {f"rid-{s}" for s, _ in LETTERS}), default=len(got))
        assert {r.record_id for r in got[:first_letter]} >= {f"rid-{s}" for s in OUTBOX}, \
            f"{sink}: a letter went before the outbox: {[r.record_id for r in got]}"
    delivered = {**collector.got, "eventhubs": Spool(root / "spool", "eventhubs").load()}
    for seq, sink in LETTERS:
        rid = f"rid-{seq}"
        count = Counter(r.record_id for r in delivered[sink])[rid]
        # Once, also when the crash came after its spool line and before its mark: the rerun
        # finds the record waiting in the spool and only marks the letter.
        assert count == 1, (rid, count, rid in spooled_ids(crashed, sink),
                            rid in marked_ids(crashed))
        [mark] = [x["redelivered"] for x in letters if x["record_id"] == rid]
        assert mark["seq"] in {r.seq for r in delivered[sink] if r.record_id == rid}
    # A second start finds nothing to do: no request, nothing pending, nothing put back.
    again_collector = Collector(open_=True)
    workers, begun = start_on(root, again_collector)
    for worker in workers:
        worker.flush(5)
        worker.stop(1)
    assert begun.pending is None and again_collector.got == {sink: [] for sink in SINKS}


def test_every_crash_point_of_the_start(capsys: pytest.CaptureFixture[str]) -> None:
    base = Path(tempfile.mkdtemp(dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    try:
        root = base / "run"
        state_dir(root)
        initial = Disk.of(root)
        recorder = Recorder(root)
        held = Collector(open_=False)  # nothing delivered (nor acknowledged) while recording
        previous = set_step_hook(recorder)
        try:
            workers, begun = start_on(root, held)
        finally:
            set_step_hook(previous)
            held.open.set()
            for worker in workers:
                worker.stop(1)
        assert begun.pending is None
        assert begun.seq == OUTBOX[-1] + len(LETTERS)
        kinds = Counter(s.kind for s in recorder.steps)
        assert {"create", "write", "fsync", "rename", "unlink", "dirsync"} <= set(kinds), kinds
        seen: set[str] = set()
        points = Counter[str]()
        for n, (point, files) in enumerate(crash_points(initial, recorder.steps)):
            points[point.view] += 1
            key = digest(files)
            if key in seen:
                continue
            seen.add(key)
            where = base / str(n)
            write_out(files, where)
            check_restart(where, files)
            shutil.rmtree(where)
        assert points["torn"] >= 16 * 4 and len(seen) > 40, (points, len(seen))
        with capsys.disabled():
            print(f"\nstart crash points: {sum(points.values())} ({dict(points)}), "
                  f"{len(seen)} distinct disks restarted")
    finally:
        shutil.rmtree(base, ignore_errors=True)
