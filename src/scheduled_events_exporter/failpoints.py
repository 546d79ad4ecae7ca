"""Crash points for the reliability tests (``SEE_FAILPOINT=...``, testing only).

``name:n``: the process dies with ``os._exit(137)`` (as if SIGKILLed) the n-th time it passes
the named point, so tests can crash it exactly between two durability steps.

``torn_write:FILE:n:BYTES``: the process dies in the middle of the n-th durable write to a file
whose name contains ``FILE`` (``otlp.log``, ``state.json``, ``console.ack``...), after ``BYTES``
bytes of it reached the file and before its fsync: the torn write a crash leaves
(platforms/durable.py's step seam). Unset in production: the check is one dictionary lookup.
"""

from __future__ import annotations

import os
import sys
import threading

from scheduled_events_exporter.platforms import durable

#: The poll's (and the platform command's) durability steps; ``before_delete``: the platform
#: command, its records in every spool, before it deletes a queue message.
POINTS = ("before_commit", "after_commit", "after_spool", "after_deliver", "before_delete")
TORN_WRITE = "torn_write"

_armed: dict[str, int] = {}
_lock = threading.Lock()


def arm(spec: str) -> None:
    """Arm ``name:n`` (``n`` defaults to 1) or ``torn_write:FILE:n:BYTES``; anything else is an
    error."""
    if spec.startswith(f"{TORN_WRITE}:"):
        _arm_torn_write(spec)
        return
    name, _, count = spec.partition(":")
    if name not in POINTS:
        raise ValueError(f"SEE_FAILPOINT={spec!r}: expected one of {', '.join(POINTS)}[:n] or "
                         f"{TORN_WRITE}:FILE:n:BYTES")
    _armed[name] = int(count or 1)


def hit(name: str) -> None:
    """Die here if this point is armed and its count is reached."""
    if not _armed:
        return
    with _lock:
        left = _armed.get(name)
        if left is None:
            return
        if left > 1:
            _armed[name] = left - 1
            return
    _die(name)


def _die(name: str) -> None:
    sys.stderr.write(f"failpoint {name}: exiting\n")
    sys.stderr.flush()
    os._exit(137)


def _arm_torn_write(spec: str) -> None:
    try:
        _, file, count, size = spec.split(":")
        left, keep = int(count), int(size)
        if not file or left < 1 or keep < 0:
            raise ValueError
    except ValueError:
        raise ValueError(f"SEE_FAILPOINT={spec!r}: expected {TORN_WRITE}:FILE:n:BYTES (n >= 1, "
                         "BYTES >= 0)") from None
    remaining = [left]

    def tear(step: durable.DiskStep) -> None:
        if step.kind != "write" or file not in step.path.name:
            return
        with _lock:
            remaining[0] -= 1
            if remaining[0]:
                return
        durable.write_all(step.fd, step.data[:keep])
        _die(f"{TORN_WRITE} after {min(keep, len(step.data))} of {len(step.data)} bytes of "
             f"{step.path.name}")

    durable.set_step_hook(tear)


if os.environ.get("SEE_FAILPOINT"):
    arm(os.environ["SEE_FAILPOINT"])
