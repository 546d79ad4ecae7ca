"""Every point where a crash can land while dead letters are put back (``redeliver``, or the
request the exporter carries out at start), each followed by the restart's own redelivery.

The run is recorded through platforms/durable.py's step seam, as tests/test_crash_points.py
records the durable core: a request left by ``redeliver --at-next-start`` is carried out on a
state directory with a pending spool line and letters for two sinks (one without a spool yet):
the spools are appended to (one created), the letters marked ``redelivered`` (an atomic
rewrite), the request removed. tests/crashdisk.py rebuilds the disk as a crash before each step
would leave it (kill -9, power loss, each write torn at 16 offsets per line); the exporter's
start then carries out what is left of the request, and the test checks:

* every letter's record is pending in its sink's spool, and its letter is marked with the
  sequence number of a pending line holding that record (same ``log.record.uid``);
* a record is pending once, also when the crash came after its spool line was written and
  before its letter's mark was: the rerun finds it waiting and only marks the letter;
* what was pending before is pending once, in order; no letter is lost or torn;
* the request is gone, and a second start finds nothing to do.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest

from scheduled_events_exporter.codec import encode_record
from scheduled_events_exporter.delivery import redrive
from scheduled_events_exporter.delivery.dead_letter import DeadLetter
from scheduled_events_exporter.delivery.redrive import Selection
from scheduled_events_exporter.delivery.spool import Spool
from scheduled_events_exporter.model import InstanceInfo, ScheduledEvent, Transition, TransitionKind
from scheduled_events_exporter.platforms.durable import set_step_hook
from scheduled_events_exporter.records import TransitionRecord
from tests.crashdisk import Disk, Recorder, crash_points, digest, write_out

AT = datetime(2026, 11, 27, 10, tzinfo=timezone.utc)
NOW = datetime(2026, 11, 28, 8, 30, tzinfo=timezone.utc)
#: The letters put back: (seq, sink).
LETTERS = ((1, "otlp"), (2, "eventhubs"), (3, "otlp"))
PENDING = 10


def record(seq: int) -> TransitionRecord:
    event = ScheduledEvent(f"E{seq}", "Scheduled", "Reboot", resources=("vm",))
    return TransitionRecord(Transition(TransitionKind.SCHEDULED, AT, seq, event),
                            InstanceInfo(vm_name="vm"), f"rid-{seq}", True, "0.1.0", seq)


def letter(seq: int, sink: str) -> bytes:
    return DeadLetter(time="2026-11-27T10:00:00.000Z", sink=sink, status="HTTP 400",
                      reason="refused", event_id=f"E{seq}", transition="scheduled",
                      record_id=f"rid-{seq}", seq=seq, payload={"sent": seq},
                      record=encode_record(record(seq))).to_json()


def state_dir(root: Path) -> None:
    """Letters to put back, a spool line not yet delivered, and the request."""
    (root / "spool").mkdir(parents=True)
    (root / "dead-letter.jsonl").write_bytes(b"".join(letter(s, k) for s, k in LETTERS))
    line = {"seq": PENDING, "record": encode_record(record(PENDING))}
    (root / "spool" / "otlp.log").write_bytes(json.dumps(line).encode() + b"\n")
    (root / "spool" / "otlp.ack").write_text(str(PENDING - 1))
    (root / "state.json").write_text(json.dumps({"schema": 2, "seq": PENDING}))
    redrive.request(root, Selection(), NOW)


def pending(root: Path, sink: str) -> list[TransitionRecord]:
    return Spool(root / "spool", sink).load()


def whole_lines(data: bytes) -> list[bytes]:
    return data[:data.rfind(b"\n") + 1].splitlines()


def spooled_ids(files: dict[str, bytes], sink: str) -> set[str]:
    """The records a crashed disk's spool holds in whole lines."""
    out = set()
    for raw in whole_lines(files.get(f"spool/{sink}.log", b"")):
        out.add(json.loads(raw)["record"]["record_id"])
    return out


def marked_ids(files: dict[str, bytes]) -> set[str]:
    return {item["record_id"] for raw in whole_lines(files.get("dead-letter.jsonl", b""))
            if "redelivered" in (item := json.loads(raw))}


def work_dirs(base: Path) -> Iterator[Path]:
    n = 0
    while True:
        n += 1
        yield base / str(n)


def check_restart(root: Path, crashed: dict[str, bytes]) -> None:
    # The exporter's start: the request first, under its lock, before any spool is read.
    redrive.perform_request(root, NOW)
    assert not (root / redrive.REQUEST_FILE).exists()
    assert redrive.perform_request(root, NOW) is None, "a second start redelivered again"
    letters = [json.loads(x) for x in (root / "dead-letter.jsonl").read_bytes().splitlines()]
    assert [x["record_id"] for x in letters] == [f"rid-{s}" for s, _ in LETTERS]
    for sink in ("otlp", "eventhubs"):
        records = pending(root, sink)
        seqs = [r.seq for r in records]
        assert seqs == sorted(set(seqs)), f"{sink}: out of order or repeated numbers {seqs}"
        counts = Counter(r.record_id for r in records)
        by_seq = {r.seq: r.record_id for r in records}
        ours = {f"rid-{s}" for s, k in LETTERS if k == sink}
        expected = set(ours) | ({f"rid-{PENDING}"} if sink == "otlp" else set())
        assert set(counts) == expected, (sink, counts)
        if sink == "otlp":
            assert counts[f"rid-{PENDING}"] == 1
        for item in letters:
            if item["sink"] != sink:
                continue
            rid = str(item["record_id"])
            mark = item["redelivered"]
            assert by_seq.get(mark["seq"]) == rid, f"{rid} marked with seq {mark['seq']}"
            # Twice only if the crashed disk held its line but not yet its mark.
            # Once, also when the crash came after its spool line and before its mark: the
            # rerun finds it waiting in the spool and only marks the letter.
            assert counts[rid] == 1, (rid, counts[rid], rid in spooled_ids(crashed, sink),
                                      rid in marked_ids(crashed))


def test_every_crash_point_of_a_redelivery(capsys: pytest.CaptureFixture[str]) -> None:
    base = Path(tempfile.mkdtemp(dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    try:
        root = base / "run"
        state_dir(root)
        initial = Disk.of(root)
        recorder = Recorder(root)
        previous = set_step_hook(recorder)
        try:
            result = redrive.perform_request(root, NOW)
        finally:
            set_step_hook(previous)
        assert result is not None and len(result[1]) == len(LETTERS)
        kinds = Counter(s.kind for s in recorder.steps)
        assert {"create", "write", "fsync", "rename", "unlink", "dirsync"} <= set(kinds), kinds
        seen: set[str] = set()
        points = Counter[str]()
        spots = work_dirs(base)
        for point, files in crash_points(initial, recorder.steps):
            points[point.view] += 1
            key = digest(files)
            if key in seen:
                continue
            seen.add(key)
            where = next(spots)
            write_out(files, where)
            check_restart(where, files)
            shutil.rmtree(where)
        # Enough to have reached inside every write: the appends, the mark's rewrite.
        assert points["torn"] >= 16 * 3 and len(seen) > 20, (points, len(seen))
        with capsys.disabled():
            print(f"\nredelivery crash points: {sum(points.values())} ({dict(points)}), "
                  f"{len(seen)} distinct disks restarted")
    finally:
        shutil.rmtree(base, ignore_errors=True)
