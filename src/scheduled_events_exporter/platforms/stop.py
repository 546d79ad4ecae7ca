"""Which requests from the OS mean "stop": drain, persist, exit.

POSIX: SIGTERM (``docker stop``, the kubelet, systemd) and SIGINT (Ctrl-C).

Windows never sends SIGTERM. Ctrl-C (what a service wrapper such as WinSW sends to stop the
service) and Ctrl-Break arrive through Python's handlers as SIGINT and SIGBREAK. Closing the
console window, logging off and shutting down arrive as console control events, on a thread of
their own, and Windows ends the process as soon as that handler returns (or after about 5 s):
so the handler asks for the stop and waits for the shutdown to finish, up to the time Windows
gives. In session 0 (a service) a logoff is a user leaving, not the machine stopping: it is
ignored, as Microsoft asks of services.

Either way a second request exits at once (exit code 128 + the signal number).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, Final

#: Console control events (``SetConsoleCtrlHandler``).
CTRL_C: Final = 0
CTRL_BREAK: Final = 1
CTRL_CLOSE: Final = 2
CTRL_LOGOFF: Final = 5
CTRL_SHUTDOWN: Final = 6
#: How long the close, logoff and shutdown handler waits for the drain: Windows ends a console
#: process about 5 s after such an event, whatever the handler does.
WINDOWS_GRACE: Final = 4.5
_SIGBREAK: Final = int(getattr(signal, "SIGBREAK", 21))

SignalSetter = Callable[[int, Callable[[int, FrameType | None], Any]], object]


def request_handler(stop: threading.Event,
                    exit_now: Callable[[int], None] = os._exit
                    ) -> Callable[[int, FrameType | None], None]:
    """A signal handler: the first signal requests a graceful stop, a second exits at once."""

    def handle(signum: int, _frame: FrameType | None) -> None:
        if stop.is_set():
            exit_now(128 + signum)
        stop.set()

    return handle


def console_handler(stop: threading.Event, finished: threading.Event, *, in_service: bool,
                    grace: float = WINDOWS_GRACE) -> Callable[[int], bool]:
    """The Windows console control handler (True: handled here)."""

    def handle(event: int) -> bool:
        if event in (CTRL_C, CTRL_BREAK):
            return False  # Python's SIGINT / SIGBREAK handlers take these
        if event == CTRL_LOGOFF and in_service:
            return True  # a user logging off; the service goes on
        stop.set()
        # Returning ends the process: give the shutdown the time Windows allows.
        finished.wait(grace)
        return True

    return handle


def install_posix(stop: threading.Event, *, signals: SignalSetter = signal.signal,
                  exit_now: Callable[[int], None] = os._exit) -> None:
    """SIGTERM and SIGINT request the stop."""
    handler = request_handler(stop, exit_now)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signals(signum, handler)


def install_windows(stop: threading.Event, finished: threading.Event, *,
                    set_console_handler: Callable[[Callable[[int], bool]], None],
                    session_id: Callable[[], int],
                    signals: SignalSetter = signal.signal,
                    exit_now: Callable[[int], None] = os._exit) -> None:
    """Ctrl-C and Ctrl-Break as signals; close, logoff and shutdown as console events."""
    handler = request_handler(stop, exit_now)
    for signum in (signal.SIGINT, _SIGBREAK):
        signals(signum, handler)
    try:
        in_service = session_id() == 0
    except OSError:
        in_service = False
    set_console_handler(console_handler(stop, finished, in_service=in_service))


def install(stop: threading.Event, finished: threading.Event) -> None:
    """Make this OS's stop requests set ``stop``; ``finished`` is set when the shutdown is
    done (Windows' console handler waits for it)."""
    if sys.platform == "win32":
        from scheduled_events_exporter.platforms import win32

        install_windows(stop, finished, set_console_handler=win32.set_console_handler,
                        session_id=win32.session_id)
    else:
        install_posix(stop)


#: How often the main thread looks up from waiting for the stop on Windows (see wait_for).
WINDOWS_WAKE: Final = 0.5
#: POSIX: the longest the main thread sleeps without a signal (a stop set without one).
POSIX_WAKE: Final = 60.0


def wait_for(stop: threading.Event, *, windows: bool = sys.platform == "win32",
             wake: float = WINDOWS_WAKE) -> None:
    """Block the main thread until ``stop`` is set.

    Python runs a signal handler only in the main thread, once that thread comes back to the
    interpreter. A plain ``Event.wait()`` comes back only when the OS interrupts the wait itself,
    which it does only when it delivers the signal to the main thread: Linux may hand a
    process's SIGTERM to any thread that does not block it (a sink's, the poller's, one of
    gRPC's), and the handler then waited forever (seen: about one stop in ten with gRPC's
    threads, under load). So on POSIX the main thread sleeps in ``select`` on a pipe that
    ``signal.set_wakeup_fd`` makes the C-level handler write to, from whichever thread took
    the signal: it wakes at once, and not at all while idle. Windows never interrupts the wait
    (python/cpython#74157): there the wait is cut into short timed ones."""
    if windows:
        _wait_in_steps(stop, wake)
    else:
        _wait_for_signal(stop)


def _wait_in_steps(stop: threading.Event, wake: float) -> None:
    while not stop.wait(wake):
        pass


if sys.platform != "win32":
    import select

    def _wait_for_signal(stop: threading.Event) -> None:
        readable, writable = os.pipe()
        os.set_blocking(readable, False)
        os.set_blocking(writable, False)
        previous = signal.set_wakeup_fd(writable, warn_on_full_buffer=False)
        try:
            while not stop.is_set():
                select.select([readable], [], [], POSIX_WAKE)
                # Back in the interpreter: a handler the signal left pending has run by now.
                with contextlib.suppress(BlockingIOError):
                    os.read(readable, 512)
        finally:
            signal.set_wakeup_fd(previous)
            os.close(readable)
            os.close(writable)
else:

    def _wait_for_signal(stop: threading.Event) -> None:
        _wait_in_steps(stop, WINDOWS_WAKE)  # (no select on a pipe there)
