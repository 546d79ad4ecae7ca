"""bubblewrap sandboxes for the tests that need what a container engine does not give them
cheaply: a state volume as small as a tmpfs of a few KiB, filled from outside while the exporter
runs (``tests/test_disk_faults.py``). The image itself is built and run in
``tests/test_image.py``.

``bwrap`` (Debian package ``bubblewrap``) gives a process uid/gid 65532 (the image's user), a
read-only view of the whole filesystem (writes fail with EROFS) and one writable state volume.
The network is shared, so loopback peers (the simulator, collectors) stay reachable.
"""

from __future__ import annotations

import errno
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

STATE_MOUNT = "/var/lib/scheduled-events-exporter"


def require_bwrap() -> str:
    """The bwrap binary, or skip (``.ci/run`` installs it)."""
    path = shutil.which("bwrap")
    if path is None:
        pytest.skip("bubblewrap (bwrap) is not installed; .ci/run installs it")
    return path


def bwrap_command(command: Sequence[str], *, state: Path | None = None,
                  state_tmpfs_bytes: int | None = None, uid: int = 65532, gid: int = 65532,
                  own_network: bool = False, visible: Sequence[Path] = ()) -> list[str]:
    """``command`` as ``uid``/``gid`` with a read-only root and a writable state volume at
    :data:`STATE_MOUNT`: the host directory ``state`` bound there, or a tmpfs of
    ``state_tmpfs_bytes`` (a tiny disk the test can fill). ``own_network``: a private loopback
    (as in a container: its port 8080 is its own). ``visible``: host paths under /tmp (which
    the sandbox replaces by an empty tmpfs) to show read-only at the same place."""
    _mount_point()
    args = [require_bwrap(), "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--tmpfs", "/tmp", "--die-with-parent", "--unshare-user", "--uid", str(uid),
            "--gid", str(gid)]
    if own_network:
        args.append("--unshare-net")
    # The repository and the interpreter running the tests stay visible when they live under
    # /tmp themselves (a clone there: the tmpfs would hide them and nothing could start).
    own = [Path(sys.prefix).resolve(), Path(__file__).resolve().parents[1]]
    shown = [*visible, *(p for p in own if p.is_relative_to("/tmp"))]
    for path in dict.fromkeys(str(p) for p in shown):
        args += ["--ro-bind", path, path]
    if state_tmpfs_bytes is not None:
        args += ["--size", str(state_tmpfs_bytes), "--tmpfs", STATE_MOUNT]
    elif state is not None:
        args += ["--bind", str(state), STATE_MOUNT]
    return [*args, "--", *command]


def _mount_point() -> None:
    """bwrap cannot create the mount point on a read-only root: make it on the host, as the
    image's Dockerfile does (``mkdir -p /var/lib/scheduled-events-exporter``)."""
    if os.path.isdir(STATE_MOUNT):
        return
    try:
        os.makedirs(STATE_MOUNT, exist_ok=True)
    except OSError as exc:
        pytest.skip(f"cannot create the mount point {STATE_MOUNT} ({exc.strerror})")


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first), read from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                text = handle.read()
        except OSError:
            continue
        ppid = int(text[text.rindex(")") + 2:].split()[1])
        parents.setdefault(ppid, []).append(int(entry))
    out: list[int] = []
    todo = [pid]
    while todo:
        children = parents.get(todo.pop(0), [])
        out.extend(children)
        todo.extend(children)
    return out


def exporter_pid(sandbox_pid: int) -> int | None:
    """The exporter process (``python -m scheduled_events_exporter``) inside the sandbox."""
    for pid in descendants(sandbox_pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
        except OSError:
            continue
        if b"scheduled_events_exporter" in argv or any(
                a.endswith(b"scheduled-events-exporter") for a in argv[:2]):
            return pid
    return None


def volume(pid: int) -> Path:
    """The state volume as seen from outside through the sandboxed process's root."""
    return Path(f"/proc/{pid}/root{STATE_MOUNT}")


def fill(path: Path) -> int:
    """Write ``path`` until the filesystem is full (ENOSPC at a 1-byte write); bytes written."""
    written = 0
    with open(path, "wb", buffering=0) as handle:
        for chunk in (65536, 4096, 512, 1):
            try:
                while True:
                    written += handle.write(b"\0" * chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    return written
