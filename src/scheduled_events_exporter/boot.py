"""The host's boot identity: evidence that a pending Reboot or Redeploy of this VM ran.

Linux gives every boot a random id in ``/proc/sys/kernel/random/boot_id``; a container shares
the host kernel, so it reads the VM's own. When the exporter dies with its VM and comes back to
a document without the event, a changed id proves the reboot happened (docs/lifecycle.md).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Final

log = logging.getLogger(__name__)

DEFAULT_BOOT_ID_FILE: Final = Path("/proc/sys/kernel/random/boot_id")
#: A boot id is a 36-character UUID; anything much longer is not one.
_MAX_BYTES: Final = 256


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
