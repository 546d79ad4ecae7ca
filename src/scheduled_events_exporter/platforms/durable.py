"""Durable writes under the state directory, and the one seam where a crash test stops them.

Every write the exporter must not lose goes through these functions (the state file, each
sink's spool and ack cursor, the dead-letter file): an append (:func:`append_durably`), an
atomic replacement (:func:`write_atomically`), cutting a torn tail (:func:`truncate_durably`)
and a rename (:func:`replace_durably`). Each is a short sequence of steps (create, write,
fsync, rename, directory fsync), and a crash can land before, inside or after any of them.

Before each step a :class:`DiskStep` is offered to the hook a test installed with
:func:`set_step_hook` (none in production: one global lookup). The crash tests record the steps
of a run and rebuild the disk as it would be after a crash at each one, with a prefix of a
write, or with everything not yet fsynced lost (tests/crashdisk.py, tests/test_crash_points.py);
the process-level failpoint ``torn_write`` (:mod:`scheduled_events_exporter.failpoints`) dies
for real in the middle of a write. Like SQLite's crash-test file system, the model is that
data and names reach the disk only when fsynced: a new file's name needs its directory fsynced
too, which is why an append that creates its file syncs the directory.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from scheduled_events_exporter.platforms.files import FILES


@dataclass(frozen=True, slots=True)
class DiskStep:
    """One step of a durable write, offered to the step hook before it is taken."""

    #: ``create``, ``write``, ``fsync``, ``truncate``, ``rename``, ``unlink`` or ``dirsync``.
    kind: str
    path: Path
    #: ``write``: the bytes about to be written.
    data: bytes = b""
    #: ``write``: the offset they go to; ``truncate``: the new size.
    offset: int = 0
    #: ``rename``: the name ``path`` takes.
    target: Path | None = None
    #: The open file (``write``, ``fsync``, ``truncate``), for a hook that writes a prefix.
    fd: int = -1


class PowerLoss(BaseException):
    """Raised by a test's step hook: the world stops here. A ``BaseException``, so no error
    handling of the code under test runs (it would not run when the power goes either)."""


StepHook = Callable[[DiskStep], None]
_hook: StepHook | None = None
_hook_lock = threading.Lock()


def set_step_hook(hook: StepHook | None) -> StepHook | None:
    """Install ``hook`` (``None`` removes it); returns the previous one. Testing only."""
    global _hook
    with _hook_lock:
        previous, _hook = _hook, hook
    return previous


def _step(kind: str, path: Path, **details: object) -> None:
    hook = _hook
    if hook is not None:
        hook(DiskStep(kind, path, **details))  # type: ignore[arg-type]


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte is written: a nearly full disk first writes *part* of a
    buffer and only fails on the next call, so a single unchecked write can leave a torn file."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[written:]


def append_durably(path: Path, data: bytes) -> None:
    """Append ``data`` and fsync (and, when this created the file, fsync its directory: a new
    name is durable only then). On failure (a full or read-only disk) the file is cut back to
    its previous size, so a later append never lands after a torn line; ``OSError`` is raised.
    """
    created = not os.path.lexists(path)
    if created:
        _step("create", path)
    # Never through a link planted in the state directory.
    fd = FILES.open_append(path)
    try:
        size = os.fstat(fd).st_size
        try:
            _step("write", path, data=data, offset=size, fd=fd)
            write_all(fd, data)
            _step("fsync", path, fd=fd)
            os.fsync(fd)
        except OSError:
            with contextlib.suppress(OSError):  # best effort; the reader cuts a torn tail
                os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)
    if created:
        _step("dirsync", path.parent)
        FILES.sync_dir(path.parent)


def write_atomically(path: Path, data: bytes) -> None:
    """temp file + fsync + rename + directory fsync: readers see the old or the new file whole.

    On any failure (a full or read-only disk) the temp file is removed and ``path`` is left
    exactly as it was; the ``OSError`` is raised to the caller.
    """
    # An unpredictable name created exclusively, never through a symlink: nobody can make us
    # write elsewhere by planting a link under the name we are about to use. The rename then
    # replaces ``path`` itself, a link there included, never its target.
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    try:
        _step("create", tmp)
        fd = FILES.open_new(tmp)
        try:
            _step("write", tmp, data=data, offset=0, fd=fd)
            write_all(fd, data)
            _step("fsync", tmp, fd=fd)
            os.fsync(fd)
        finally:
            os.close(fd)
        _step("rename", tmp, target=path)
        FILES.replace(tmp, path)
    except BaseException as exc:
        if not isinstance(exc, PowerLoss):  # after a power loss nothing cleans up
            with contextlib.suppress(OSError):  # gone already, or the directory is read-only
                os.unlink(tmp)
        raise
    _step("dirsync", path.parent)
    FILES.sync_dir(path.parent)


def truncate_durably(path: Path, size: int) -> None:
    """Cut ``path`` (which exists) to ``size`` bytes and fsync; ``OSError`` on failure."""
    fd = FILES.open_append(path)
    try:
        _step("truncate", path, offset=size, fd=fd)
        os.ftruncate(fd, size)
        _step("fsync", path, fd=fd)
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(source: Path, target: Path) -> None:
    """Rename ``source`` over ``target`` and fsync the directory; ``OSError`` on failure."""
    _step("rename", source, target=target)
    FILES.replace(source, target)
    _step("dirsync", target.parent)
    FILES.sync_dir(target.parent)


def remove_durably(path: Path) -> None:
    """Remove ``path`` and fsync the directory (until then a power loss may bring the name
    back); ``OSError`` on failure, ``FileNotFoundError`` when it is gone already."""
    _step("unlink", path)
    os.unlink(path)
    _step("dirsync", path.parent)
    FILES.sync_dir(path.parent)


def end_of_last_line(path: Path, size: int, chunk: int = 64 * 1024) -> int:
    """The offset just past the last newline of ``path`` (0 when it has none), read from the
    end: a line can be megabytes long, the tail after it is usually nothing."""
    with path.open("rb") as handle:
        end = size
        while end > 0:
            start = max(0, end - chunk)
            handle.seek(start)
            at = handle.read(end - start).rfind(b"\n")
            if at >= 0:
                return start + at + 1
            end = start
    return 0


def mend_tail(path: Path, whole: Callable[[bytes], bool]) -> tuple[str, int]:
    """Make a file of newline-terminated lines end with a newline, before anything is appended
    to it: bytes after its last newline are an append a crash cut short. When ``whole(tail)``
    they are a complete line that only lost its newline, which is added; otherwise they are cut
    off. Returns (``"completed"``, ``"cut"`` or ``""``, bytes concerned); ``OSError`` when the
    file cannot be mended."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return "", 0
    end = end_of_last_line(path, size)
    if end == size:
        return "", 0
    with path.open("rb") as handle:
        handle.seek(end)
        tail = handle.read()
    if whole(tail):
        append_durably(path, b"\n")
        return "completed", size - end
    truncate_durably(path, end)
    return "cut", size - end
