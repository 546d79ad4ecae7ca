"""PID 1 of a container: when the exporter is started as the first process of its PID namespace,
it splits into a minimal init and the exporter.

Kubernetes' ``command:`` and Docker's ``ENTRYPOINT`` both make the exporter PID 1 unless an init
is configured. PID 1 owes the namespace two things a normal program does not do: it inherits
every orphan (an approval hook's ``nohup x &``, anything a ``kubectl exec`` left running) and
must reap it, or each becomes a zombie until the container ends; and the kernel delivers it only
the signals it handles. Reaping orphans inside the exporter itself would race with
:mod:`subprocess`, which waits for its own children (the hook) by pid: a ``waitpid(-1)`` that
took the hook's status first would turn its exit code into 0, an approval. So, like tini and
catatonit, the process forks: the parent stays behind as the init (forwards the stop signals,
reaps everything, exits with the exporter's status) and the child returns to run the command.
With an init already in place (``docker run --init``, ``podman run --init``, a pod sharing its
process namespace), the exporter is not PID 1 and nothing here happens.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable
from typing import Final

#: What the init passes on to the exporter (as tini does); SIGTERM is what ``docker stop``,
#: ``podman stop`` and the kubelet send.
FORWARDED: Final = frozenset(
    getattr(signal, name)
    for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
    if hasattr(signal, name))


def exit_status(wait_status: int) -> int:
    """A shell's view of a child's end: its exit code, or 128 + the signal that killed it."""
    code = os.waitstatus_to_exitcode(wait_status)  # -N when signal N ended it
    return 128 - code if code < 0 else code


def supervise(child: int, *, waitpid: Callable[[int, int], tuple[int, int]] = os.waitpid,
              kill: Callable[[int, int], None] = os.kill) -> int:
    """Reap every process that ends (the child and any orphan handed to us) until ``child``
    ends; return its exit status. Signals in :data:`FORWARDED` go to ``child``."""
    if sys.platform == "win32":  # no PID 1 there, and no POSIX signals to forward
        raise NotImplementedError("supervise() is POSIX only")

    def forward(signum: int, _frame: object) -> None:
        # ProcessLookupError: it has just ended; the next wait reports it.
        with contextlib.suppress(ProcessLookupError):
            kill(child, signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    while True:
        try:
            pid, status = waitpid(-1, 0)  # retried after a forwarded signal (PEP 475)
        except ChildProcessError:  # nothing left to wait for: cannot happen while child lives
            return 1
        if pid == child:
            return exit_status(status)


def split_if_pid1(*, getpid: Callable[[], int] = os.getpid) -> None:
    """If this process is PID 1, fork: return in the child, which goes on to run the command;
    the parent becomes the init and never returns (it exits with the child's status)."""
    if sys.platform == "win32" or getpid() != 1:
        return
    # Blocked across the fork, so a SIGTERM that arrives before the init's handlers are in place
    # is held for it rather than ignored (PID 1 ignores signals it has no handler for).
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    try:
        child = os.fork()
    except OSError as exc:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        print(f"PID 1: cannot fork the init ({exc}); running without one: orphans of "
              f"approval hooks will not be reaped", file=sys.stderr)
        return
    if child == 0:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        return
    sys.stdout.flush()
    os._exit(supervise(child))
