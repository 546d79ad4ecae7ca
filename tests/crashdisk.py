"""A crash-test disk: record the steps of durable writes, rebuild the disk after a crash at any
of them (tests/test_crash_points.py).

The model is the one SQLite's crash tests and ALICE use for POSIX file systems: a file's data
is durable once the file is fsynced, a name (a created, renamed or removed file) once its
directory is. A crash at step ``j`` leaves one of these disks:

* ``process``: every step before ``j`` took effect (kill -9: the page cache survives);
* ``power``: only what was fsynced before ``j`` (data of files, names of directories): every
  unsynced write and every rename or creation not yet followed by its directory's fsync is lost;
* ``torn``: every step before ``j``, and the first ``k`` bytes of the write at ``j``.

The steps come from platforms/durable.py's step seam (:func:`set_step_hook`), in the order the
code took them; :class:`Recorder` also takes the test's own markers (a record became durable,
one was delivered) into the same sequence, so each crash point knows what had happened before.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from scheduled_events_exporter.platforms.durable import DiskStep, StepHook, set_step_hook


@contextmanager
def step_hook(hook: StepHook) -> Iterator[None]:
    """``hook`` sees every disk step taken inside the block; the previous hook comes back."""
    previous = set_step_hook(hook)
    try:
        yield
    finally:
        set_step_hook(previous)


def full_after(prefix: int, *, read_only: bool = False) -> StepHook:
    """A disk that takes ``prefix`` bytes of the next write, then is full; ``read_only``: and
    read-only from then on, so cutting the torn bytes back fails too (ftruncate on the open
    file refuses)."""

    def hook(step: DiskStep) -> None:
        if step.kind == "write":
            os.write(step.fd, step.data[:prefix])
            if read_only:
                readonly = os.open(step.path, os.O_RDONLY)
                os.dup2(readonly, step.fd)
                os.close(readonly)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    return hook


@dataclass(frozen=True)
class Step:
    """A recorded disk step (paths relative to the state directory) or a test marker."""

    kind: str
    path: str = ""
    data: bytes = b""
    offset: int = 0
    target: str = ""
    #: Markers: what the test noted (``durable``, ``delivered``, ``committed``, ``phase``).
    note: object = None


class Recorder:
    """The step hook: records every step under ``root`` (others, e.g. a test's own files,
    are not the code under test), and the test's markers, in one sequence."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.steps: list[Step] = []
        self._lock = threading.Lock()

    def __call__(self, step: DiskStep) -> None:
        try:
            path = str(step.path.relative_to(self.root))
        except ValueError:
            return
        target = str(step.target.relative_to(self.root)) if step.target is not None else ""
        with self._lock:
            self.steps.append(Step(step.kind, path, bytes(step.data), step.offset, target))

    def mark(self, kind: str, note: object) -> None:
        with self._lock:
            self.steps.append(Step(kind, note=note))


@dataclass
class _Inode:
    data: bytearray
    synced: bytes


@dataclass
class Disk:
    """The state directory's files as the recorded steps left them, in both views."""

    names: dict[str, _Inode] = field(default_factory=dict)
    #: The names as the last fsync of each directory left them (what survives a power loss).
    durable: dict[str, _Inode] = field(default_factory=dict)

    @classmethod
    def of(cls, directory: Path) -> Disk:
        """A disk holding ``directory``'s files, all of them durable."""
        disk = cls()
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                data = path.read_bytes()
                disk.names[str(path.relative_to(directory))] = _Inode(bytearray(data), data)
        disk.durable = dict(disk.names)
        return disk

    def copy(self) -> Disk:
        inodes = {id(i): _Inode(bytearray(i.data), i.synced)
                  for i in (*self.names.values(), *self.durable.values())}
        return Disk({n: inodes[id(i)] for n, i in self.names.items()},
                    {n: inodes[id(i)] for n, i in self.durable.items()})

    def apply(self, step: Step, upto: int | None = None) -> None:
        """Take one disk step (``upto``: only that many bytes of a write)."""
        if step.kind == "create":
            self.names.setdefault(step.path, _Inode(bytearray(), b""))
        elif step.kind == "write":
            data = step.data if upto is None else step.data[:upto]
            inode = self.names[step.path]
            if len(inode.data) < step.offset:
                inode.data.extend(b"\0" * (step.offset - len(inode.data)))
            inode.data[step.offset:step.offset + len(data)] = data
        elif step.kind == "fsync":
            inode = self.names[step.path]
            inode.synced = bytes(inode.data)
        elif step.kind == "truncate":
            del self.names[step.path].data[step.offset:]
        elif step.kind == "rename":
            self.names[step.target] = self.names.pop(step.path)
        elif step.kind == "unlink":
            del self.names[step.path]
        elif step.kind == "dirsync":
            folder = "" if step.path == "." else step.path
            def inside(name: str) -> bool:
                return str(Path(name).parent) == (folder or ".")
            self.durable = {n: i for n, i in self.durable.items() if not inside(n)}
            self.durable.update((n, i) for n, i in self.names.items() if inside(n))
        elif step.path:  # a marker has no path; a disk step of no known kind is a bug
            raise AssertionError(f"a disk step of unknown kind {step.kind!r} on {step.path}")

    def files(self, view: str) -> dict[str, bytes]:
        """``process``: every name with its data; ``power``: durable names, synced data."""
        if view == "process":
            return {n: bytes(i.data) for n, i in self.names.items()}
        return {n: i.synced for n, i in self.durable.items()}


def write_out(files: dict[str, bytes], directory: Path) -> None:
    """Materialise ``files`` as a state directory (the spool folder always exists)."""
    if directory.exists():
        shutil.rmtree(directory)
    (directory / "spool").mkdir(parents=True)
    for name, data in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def digest(files: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return h.hexdigest()


def offsets(data: bytes, per_line: int = 16) -> list[int]:
    """Where a torn write stops: a well-spread sample of ``per_line`` offsets inside every line
    of ``data`` (every offset of a line shorter than that), never 0 or the whole write (those
    are the crash points before and after it)."""
    out: set[int] = set()
    start = 0
    for line in data.splitlines(keepends=True):
        length = len(line)
        if length <= per_line:
            out.update(start + k for k in range(1, length + 1))
        else:
            out.update(start + 1 + (length - 1) * k // (per_line - 1) for k in range(per_line))
        start += length
    return sorted(o for o in out if 0 < o < len(data))


@dataclass(frozen=True)
class CrashPoint:
    """One disk a crash can leave: before step ``index`` (in ``view``), or ``torn`` after
    ``upto`` bytes of the write at ``index``."""

    index: int
    view: str
    upto: int = 0


def crash_points(initial: Disk, steps: list[Step]
                 ) -> Iterator[tuple[CrashPoint, dict[str, bytes]]]:
    """Every crash point of ``steps`` and the files it leaves, in order."""
    disk = initial.copy()
    for index, step in enumerate(steps):
        if step.path:  # a disk step (markers have none)
            yield CrashPoint(index, "process"), disk.files("process")
            yield CrashPoint(index, "power"), disk.files("power")
            if step.kind == "write":
                for upto in offsets(step.data):
                    torn = disk.copy()
                    torn.apply(step, upto)
                    yield CrashPoint(index, "torn", upto), torn.files("process")
            disk.apply(step)
    yield CrashPoint(len(steps), "process"), disk.files("process")
    yield CrashPoint(len(steps), "power"), disk.files("power")
