"""Write faults under the state directory (disk full, read-only volume), one streak at a time.

A full or read-only state volume must not stop the exporter: it keeps polling and delivering
from memory. Each file writer (the state file, a sink's spool, the dead-letter file) owns a
:class:`WriteWatch` that logs the first failure and the recovery of each streak (one line each,
not one per poll; :mod:`.streak`) and tells ``/readyz`` which file cannot be written and why.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from scheduled_events_exporter.streak import Streak

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WriteFault:
    """A file that could not be written at its last attempt."""

    file: str
    #: e.g. ``ENOSPC: No space left on device``
    error: str
    #: Monotonic time of the first failure of the streak.
    since: float
    failures: int


def describe_os_error(exc: OSError) -> str:
    """``ENOSPC: No space left on device`` (errno name first: what to search for)."""
    name = errno.errorcode.get(exc.errno or 0, "") if exc.errno else ""
    text = exc.strerror or str(exc) or type(exc).__name__
    return f"{name}: {text}" if name else text


class WriteWatch:
    """The write health of one file (or one family of files, e.g. a spool's log and cursor)."""

    def __init__(self, path: Path, what: str, consequence: str,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._what = what
        self._consequence = consequence
        self._monotonic = monotonic
        self._streak = Streak(clock=monotonic)
        self._fault: WriteFault | None = None

    def failed(self, exc: OSError, path: Path | None = None) -> None:
        """Note a failed write; the first of a streak is logged (with what it means)."""
        file = str(path or self.path)
        error = describe_os_error(exc)
        first = self._streak.hit()
        run = self._streak.current
        self._fault = WriteFault(file, error, run.since if run else self._monotonic(),
                                 run.count if run else 1)
        if first:
            log.error("cannot write the %s %s (%s); %s; retrying until it is writable again",
                      self._what, file, error, self._consequence)

    def succeeded(self) -> None:
        """Note a successful write; ends (and logs the end of) a failure streak."""
        if self._fault is None:  # the common case: nothing to end, nothing to log
            return
        previous, self._fault = self._fault, None
        ended = self._streak.clear()
        if ended is not None:
            log.warning("the %s %s is writable again after %d failed writes in %.0f s",
                        self._what, previous.file, ended.count,
                        self._monotonic() - ended.since)

    @contextlib.contextmanager
    def guard(self, path: Path | None = None) -> Iterator[None]:
        """Around one write of ``path`` (default: the watched file): an ``OSError`` is noted
        with :meth:`failed` and raised again; a write that completes ends the streak."""
        try:
            yield
        except OSError as exc:
            self.failed(exc, path)
            raise
        self.succeeded()

    @property
    def fault(self) -> WriteFault | None:
        """The current fault, if the last write failed."""
        return self._fault
