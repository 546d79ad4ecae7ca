"""Writes under the state directory that nobody can redirect, and that survive a crash.

POSIX: ``O_NOFOLLOW`` refuses a planted symlink at open, ``O_EXCL`` creates a temp name only if
it is new, the directory is fsynced after a rename. Windows has neither ``O_NOFOLLOW`` nor a
directory to fsync: a new file is created with ``CREATE_NEW`` semantics (``O_EXCL``: it never
opens an existing name, a link included); an append refuses a path that is a reparse point
(symlink or junction) before it opens and checks after it opened that it got the file it looked
at; a rename that antivirus or the indexer holds open for a moment is retried; NTFS journals
the rename itself. Files are created owner-only: mode 0600 on POSIX; on Windows the state
directory the exporter creates gets a protected ACL (SYSTEM, Administrators, its owner), which
the files in it inherit.
"""

from __future__ import annotations

import errno
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final, Protocol

#: ``FILE_ATTRIBUTE_REPARSE_POINT``: symlinks and junctions (``stat_result.st_file_attributes``).
REPARSE_POINT: Final = 0x400
#: SYSTEM, Administrators and the directory's owner, full control, inherited by everything in
#: it; ``P``: nothing inherited from ``%ProgramData%`` (where Users may read by default).
PRIVATE_DIR_SDDL: Final = "D:P(A;OICI;FA;;;SY)(A;OICI;FA;;;BA)(A;OICI;FA;;;OW)"
_REPLACE_TRIES: Final = 5
#: The Microsoft C runtime's flags (os has them only on Windows): no \n -> \r\n translation,
#: not inherited by child processes (the hook).
WINDOWS_FLAGS: Final = int(getattr(os, "O_BINARY", 0)) | int(getattr(os, "O_NOINHERIT", 0))


class Files(Protocol):
    """The file operations the state directory's writers use."""

    def open_new(self, path: Path) -> int:
        """A new file for writing (fails if the name exists, whatever it is)."""

    def open_append(self, path: Path) -> int:
        """``path`` for appending, created if missing; never through a link."""

    def replace(self, source: Path, target: Path) -> None:
        """Rename ``source`` over ``target`` (``target`` itself, never what it links to)."""

    def sync_dir(self, path: Path) -> None:
        """Make a rename in directory ``path`` durable."""

    def make_dirs(self, path: Path) -> None:
        """Create ``path`` (and missing parents) for the exporter's own files."""

    def check_dir(self, path: Path) -> str:
        """Why ``path`` must not be used as a state directory, or ``""``."""


if sys.platform != "win32":  # (O_NOFOLLOW and directory fsync exist only there)

    class PosixFiles:
        """Linux and other POSIX systems."""

        def open_new(self, path: Path) -> int:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)

        def open_append(self, path: Path) -> int:
            # O_NOFOLLOW: a symlink planted in the state directory must not redirect our writes.
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)

        def replace(self, source: Path, target: Path) -> None:
            os.replace(source, target)

        def sync_dir(self, path: Path) -> None:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

        def make_dirs(self, path: Path) -> None:
            path.mkdir(parents=True, exist_ok=True)

        def check_dir(self, path: Path) -> str:
            return ""


class WindowsFiles:
    """Windows; the OS calls are injectable so the decisions are tested anywhere."""

    def __init__(
        self,
        *,
        lstat: Callable[[Path], os.stat_result] = os.lstat,
        fstat: Callable[[int], os.stat_result] = os.fstat,
        open_fd: Callable[[Path, int, int], int] = os.open,
        close_fd: Callable[[int], None] = os.close,
        rename: Callable[[Path, Path], None] = os.replace,
        sleep: Callable[[float], None] = time.sleep,
        create_private_directory: Callable[[str, str], None] | None = None,
        mkdir: Callable[[Path], None] = lambda p: p.mkdir(),
        flags: int = WINDOWS_FLAGS,
    ) -> None:
        self._lstat, self._fstat, self._open, self._close = lstat, fstat, open_fd, close_fd
        self._rename, self._sleep, self._mkdir = rename, sleep, mkdir
        self._create_private = create_private_directory
        self._flags = flags

    def open_new(self, path: Path) -> int:
        return self._open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | self._flags, 0o600)

    def open_append(self, path: Path) -> int:
        before = self._link_or_stat(path)
        fd = self._open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | self._flags, 0o600)
        try:
            opened, now = self._fstat(fd), self._link_or_stat(path)
            # Swapped for a link between the look and the open: not the file we looked at.
            if now is None or (opened.st_ino, opened.st_dev) != (now.st_ino, now.st_dev) or (
                    before is not None and (before.st_ino, before.st_dev) != (now.st_ino,
                                                                              now.st_dev)):
                raise OSError(errno.ELOOP, "the file changed while it was opened "
                              "(a link put in its place?)", str(path))
        except BaseException:
            self._close(fd)
            raise
        return fd

    def _link_or_stat(self, path: Path) -> os.stat_result | None:
        try:
            st = self._lstat(path)
        except FileNotFoundError:
            return None
        if getattr(st, "st_file_attributes", 0) & REPARSE_POINT:
            raise OSError(errno.ELOOP, "refusing a reparse point (symbolic link or junction) "
                          "under the state directory", str(path))
        return st

    def replace(self, source: Path, target: Path) -> None:
        for attempt in range(_REPLACE_TRIES):
            try:
                self._rename(source, target)
                return
            except PermissionError:
                # A scanner or the search indexer may hold the old file open for a moment.
                if attempt == _REPLACE_TRIES - 1:
                    raise
                self._sleep(0.05 * 2 ** attempt)

    def sync_dir(self, path: Path) -> None:
        """Nothing to do: NTFS journals the rename; a directory cannot be opened to flush."""

    def make_dirs(self, path: Path) -> None:
        missing: list[Path] = []
        probe = path
        while self._link_or_stat(probe) is None and probe.parent != probe:
            missing.append(probe)
            probe = probe.parent
        for directory in reversed(missing):
            try:
                if directory == path and self._create_private is not None:
                    self._create_private(str(directory), PRIVATE_DIR_SDDL)
                else:
                    self._mkdir(directory)
            except FileExistsError:
                pass
        self._link_or_stat(path)  # it may have been there all along: never a link

    def check_dir(self, path: Path) -> str:
        try:
            self._link_or_stat(path)
        except OSError:
            return ("expected a real directory, not a junction or symbolic link (the state "
                    "directory holds what a restart must not lose; point SEE_STATE_DIR at the "
                    "target itself)")
        return ""


# The implementation for this OS, chosen once.
if sys.platform == "win32":
    from scheduled_events_exporter.platforms import win32

    FILES: Final[Files] = WindowsFiles(create_private_directory=win32.create_private_directory)
else:
    FILES: Final[Files] = PosixFiles()
