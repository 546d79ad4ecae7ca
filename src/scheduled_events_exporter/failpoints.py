"""Crash points for the reliability tests (``SEE_FAILPOINT=name:n``, testing only).

The process dies with ``os._exit(137)`` (as if SIGKILLed) the n-th time it passes the named
point, so tests can crash it exactly between two durability steps. Unset in production: the
check is one dictionary lookup.
"""

from __future__ import annotations

import os
import sys
import threading

POINTS = ("before_commit", "after_commit", "after_spool", "after_deliver")

_armed: dict[str, int] = {}
_lock = threading.Lock()


def arm(spec: str) -> None:
    """Arm ``name:n`` (``n`` defaults to 1); an unknown name is an error."""
    name, _, count = spec.partition(":")
    if name not in POINTS:
        raise ValueError(f"SEE_FAILPOINT={spec!r}: expected one of {', '.join(POINTS)}[:n]")
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
    sys.stderr.write(f"failpoint {name}: exiting\n")
    sys.stderr.flush()
    os._exit(137)


if os.environ.get("SEE_FAILPOINT"):
    arm(os.environ["SEE_FAILPOINT"])
