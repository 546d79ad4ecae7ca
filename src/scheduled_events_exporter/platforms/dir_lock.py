"""One exporter per state directory: an exclusive lock on ``exporter.lock`` inside it, held for
the life of the process and released by the OS when the process ends, however it ends.

Two exporters on one directory would both poll IMDS, both write ``state.json`` and both append
to the spools: each would report what the other already reported, and one's state file would
overwrite the other's. That happens when a DaemonSet update overlaps two pods on a node, when
two chart releases share a ``hostPath``, or when a service is started again while the old
process is still draining. The lock is advisory, which is enough: only exporters take it.

POSIX: ``flock(LOCK_EX | LOCK_NB)`` on the open file (held per open file, so even a second
open in the same process is refused; gone with the last descriptor). Windows: ``msvcrt.locking``
of one byte far past the holder's line, so the holder's line stays readable while it is held.
The holder writes one line into the file (pid, host, since when) for the refusal to name.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Final

LOCK_FILE: Final = "exporter.lock"
#: Where the Windows lock byte sits: past any holder line, so reading the line never meets it.
WINDOWS_LOCK_OFFSET: Final = 1 << 20

#: Takes the lock on the open descriptor without waiting; ``False`` while another holds it.
TryLock = Callable[[int], bool]


class DirectoryBusy(Exception):
    """Another process holds the state directory."""

    def __init__(self, directory: Path, holder: str) -> None:
        super().__init__(f"state directory {directory} is in use by another exporter "
                         f"({holder or 'holder unknown'})")
        self.directory = directory
        self.holder = holder


if sys.platform != "win32":
    import fcntl

    def _try_lock(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    _OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
else:
    import msvcrt

    def _try_lock(fd: int) -> bool:
        return windows_try_lock(fd, msvcrt.locking, msvcrt.LK_NBLCK)

    _OPEN_FLAGS = (os.O_RDWR | os.O_CREAT | int(getattr(os, "O_BINARY", 0))
                   | int(getattr(os, "O_NOINHERIT", 0)))


def windows_try_lock(fd: int, locking: Callable[[int, int, int], None], mode: int,
                     seek: Callable[[int, int, int], int] = os.lseek) -> bool:
    """``msvcrt.locking`` of the byte at :data:`WINDOWS_LOCK_OFFSET` (it locks from the current
    position); ``False`` at once when another process holds it: with ``LK_NBLCK`` the C runtime
    does not retry (only ``LK_LOCK`` does, ten times a second apart; Microsoft's "_locking
    constants" page), it fails with ``EACCES`` or ``EDEADLOCK``. The waiting is
    :func:`acquire`'s own loop, every 0.1 s, the same on both systems."""
    seek(fd, WINDOWS_LOCK_OFFSET, os.SEEK_SET)
    try:
        locking(fd, mode, 1)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EDEADLOCK):
            return False
        raise
    return True


class DirectoryLock:
    """The held lock; :meth:`release` (or the end of the process) gives it up."""

    def __init__(self, fd: int, path: Path) -> None:
        self._fd: int | None = fd
        self.path = path

    def release(self) -> None:
        """Give the directory up (closing the descriptor drops the lock)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)  # no stale holder line for the next reader
            os.close(fd)


def holder(directory: Path) -> str:
    """The line the holder wrote: pid, host and since when (empty when unknown)."""
    try:
        with open(directory / LOCK_FILE, "rb") as handle:
            return handle.read(200).decode("utf-8", "replace").strip()
    except OSError:
        return ""


def acquire(directory: Path, *, wait: float = 0.0, try_lock: TryLock = _try_lock,
            clock: Callable[[], float] = time.monotonic,
            sleep: Callable[[float], object] = time.sleep,
            waiting: Callable[[str], None] = lambda _holder: None,
            cancelled: Callable[[], bool] = lambda: False) -> DirectoryLock:
    """Take ``directory``'s lock, waiting up to ``wait`` seconds for a holder to go
    (``waiting`` is told once, with the holder, when it has to); :class:`DirectoryBusy` if it
    is still held then, or when ``cancelled()`` says to stop waiting. ``OSError`` when the
    lock file cannot be opened."""
    path = directory / LOCK_FILE
    fd = os.open(path, _OPEN_FLAGS, 0o600)
    try:
        deadline = clock() + wait
        told = False
        while not try_lock(fd):
            if clock() >= deadline or cancelled():
                raise DirectoryBusy(directory, holder(directory))
            if not told:
                waiting(holder(directory))
                told = True
            sleep(min(0.1, max(0.0, deadline - clock())))
        since = datetime.now(timezone.utc).isoformat(timespec="seconds")
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since {since}\n".encode())
    except BaseException:
        os.close(fd)
        raise
    return DirectoryLock(fd, path)


#: File systems whose locks live on a server (NFS, SMB/CIFS as Azure Files mounts, FUSE
#: as blobfuse): a crashed holder's lock outlives it there (an NFSv4 lease about 90 s).
REMOTE_FILE_SYSTEMS: Final = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph",
                                        "glusterfs", "lustre"})


def remote_file_system(directory: Path, mounts: Path = Path("/proc/self/mounts")) -> str:
    """The type of the file system ``directory`` is on when its locks live on a server (see
    :data:`REMOTE_FILE_SYSTEMS`, and any FUSE file system), else ``""`` (also where the mount
    table cannot be read: Windows, or no /proc)."""
    try:
        table = mounts.read_text()
    except OSError:
        return ""
    target = os.path.realpath(directory)
    best, kind = "", ""
    for line in table.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        # The mount table escapes space, tab, newline and backslash as octal (\040).
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    if kind in REMOTE_FILE_SYSTEMS or kind.startswith("fuse"):
        return kind
    return ""
