"""The host's boot identity: evidence that a pending Reboot or Redeploy of this VM ran.

Linux gives every boot a random id in ``/proc/sys/kernel/random/boot_id``; a container shares
the host kernel, so it reads the VM's own. Windows has no such id: its identity is the boot
instant, the wall clock minus the milliseconds since the system started (``GetTickCount64``,
64 bits: no wrap after 49.7 days as the 32-bit count had), to the second. That instant moves
with the wall clock (a time sync after the boot shifts it by the correction), so two readings
name the same boot when they are at most :data:`SAME_BOOT_TOLERANCE` apart (two boots are a
whole reboot apart, never seconds). When the exporter dies with its VM and comes back to a
document without the event, a changed identity proves the reboot happened (docs/lifecycle.md).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Final

log = logging.getLogger(__name__)

#: Linux's boot id; Windows has no file (its identity is the boot instant, see above).
DEFAULT_BOOT_ID_FILE: Final = (None if sys.platform == "win32"
                               else Path("/proc/sys/kernel/random/boot_id"))
#: A boot id is a 36-character UUID; anything much longer is not one.
_MAX_BYTES: Final = 256
WINDOWS_PREFIX: Final = "windows-boot:"
#: Seconds within which two Windows boot instants are the same boot (clock corrections).
SAME_BOOT_TOLERANCE: Final = 5.0
_INSTANT: Final = "%Y-%m-%dT%H:%M:%SZ"


def read_boot_id(path: Path | None) -> str | None:
    """The boot id in ``path`` (stripped), or ``None`` when unavailable (not Linux, no /proc,
    disabled): then a reboot is never claimed as evidence."""
    if path is None:
        return None
    try:
        with open(path, "rb") as handle:
            raw = handle.read(_MAX_BYTES + 1)
    except OSError as exc:
        log.info("host boot id not available from %s (%s): a reboot cannot serve as "
                 "evidence that a Reboot or Redeploy ran", path, exc.strerror or exc)
        return None
    text = raw[:_MAX_BYTES].decode("ascii", "replace").strip()
    return text or None


def boot_instant_id(wall: float, uptime_ms: int) -> str:
    """The Windows boot identity: ``windows-boot:`` and the boot instant in UTC, to the
    second (``wall`` is Unix time, ``uptime_ms`` the tick count)."""
    instant = datetime.fromtimestamp(int(wall - uptime_ms / 1000.0), timezone.utc)
    return WINDOWS_PREFIX + instant.strftime(_INSTANT)


def same_boot(previous: str | None, current: str | None) -> bool:
    """Whether two boot identities name the same boot (Windows instants with tolerance)."""
    if previous is None or current is None:
        return previous == current
    if previous.startswith(WINDOWS_PREFIX) and current.startswith(WINDOWS_PREFIX):
        try:
            a, b = (datetime.strptime(x[len(WINDOWS_PREFIX):], _INSTANT)
                    for x in (previous, current))
        except ValueError:
            return previous == current
        return abs((a - b).total_seconds()) <= SAME_BOOT_TOLERANCE
    return previous == current


def continuing(previous: str | None, current: str | None) -> str | None:
    """The identity to carry on with at a start: the saved one when it names this same boot
    (so a Windows instant read again a second apart is no reboot), else the current one."""
    return previous if previous is not None and same_boot(previous, current) else current


def host_boot_id(path: Path | None, *, enabled: bool = True,
                 wall: Callable[[], float] = time.time,
                 tick_ms: Callable[[], int] | None = None) -> str | None:
    """This host's boot identity now: the file's id when ``path`` is set (Linux), else on
    Windows the boot instant; ``None`` when disabled or unknown."""
    if path is not None:
        return read_boot_id(path)
    if not enabled:
        return None
    if tick_ms is None:
        if sys.platform != "win32":
            return None
        from scheduled_events_exporter.platforms import win32

        tick_ms = win32.tick_count_ms
    try:
        return boot_instant_id(wall(), tick_ms())
    except OSError as exc:
        log.info("host boot instant not available (%s): a reboot cannot serve as evidence",
                 exc)
        return None
