"""One exporter per state directory (docs/semantics.md, "One exporter per state directory").

A second exporter on a directory another one holds waits as long as the holder's shutdown can
take (SEE_SHUTDOWN_TIMEOUT plus the watchdog's grace): if the holder stops within that, the
second takes over; if not, it exits with code 3 and a line that names the directory and the
holder, having polled nothing and reported nothing.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from scheduled_events_exporter.app import EXIT_STATE_DIR_BUSY
from scheduled_events_exporter.platforms import dir_lock
from scheduled_events_exporter.simulator import Simulator
from tests.exporter_process import ExporterProcess, clean_env


def env_for(sim: Simulator, state: Path, **extra: str) -> dict[str, str]:
    return clean_env(SEE_IMDS_ENDPOINT=sim.url, SEE_POLL_INTERVAL="0.2",
                     SEE_STATE_DIR=str(state), SEE_SINKS="console", SEE_HEALTH_ADDR="",
                     SEE_SHUTDOWN_TIMEOUT="1", SEE_LOG_LEVEL="info",
                     OTEL_METRICS_EXPORTER="none", **extra)


def polling(proc: ExporterProcess) -> bool:
    return "polling " in proc.stderr()


@contextmanager
def holder(sim: Simulator, state: Path) -> Iterator[ExporterProcess]:
    """A first exporter that holds ``state`` and polls."""
    with ExporterProcess(env_for(sim, state)) as first:
        first.wait_for(lambda: polling(first), 20, "the first exporter polling")
        yield first


@pytest.mark.timeout(60)
def test_a_second_exporter_on_a_held_directory_exits_3_naming_the_holder(
        sim: Simulator, tmp_path: Path) -> None:
    state = tmp_path / "state"
    with holder(sim, state) as first:
        started = time.monotonic()
        with ExporterProcess(env_for(sim, state)) as second:
            code = second.proc.wait(timeout=30)
            waited = time.monotonic() - started
        assert code == EXIT_STATE_DIR_BUSY, second.stderr()
        err = second.stderr()
        assert f"state directory {state} is in use by another exporter" in err
        assert f"pid {first.proc.pid} on " in err, err
        assert "waiting up to 6 s" in err
        assert waited >= 6.0  # it waited for a stopping holder first
        assert not polling(second) and second.records() == []
        assert first.proc.poll() is None  # the holder was not disturbed
        assert first.terminate() == 0


@pytest.mark.timeout(60)
def test_a_second_exporter_takes_over_when_the_holder_stops(
        sim: Simulator, tmp_path: Path) -> None:
    state = tmp_path / "state"
    with holder(sim, state) as first, ExporterProcess(env_for(sim, state)) as second:
        second.wait_for(lambda: "is held by another exporter" in second.stderr(), 20,
                        "the second exporter waiting")
        assert not polling(second)
        assert first.terminate() == 0
        second.wait_for(lambda: polling(second), 20, "the second exporter taking over")
        assert f"pid {second.proc.pid} on " in (state / dir_lock.LOCK_FILE).read_text()
        assert second.terminate() == 0
    assert (state / dir_lock.LOCK_FILE).read_text() == ""  # released: no stale holder line


def test_the_lock_is_held_per_open_file_even_within_one_process(tmp_path: Path) -> None:
    held = dir_lock.acquire(tmp_path)
    with pytest.raises(dir_lock.DirectoryBusy, match=rf"pid {os.getpid()} on "):
        dir_lock.acquire(tmp_path)
    held.release()
    dir_lock.acquire(tmp_path).release()


def test_waiting_ends_early_when_cancelled(tmp_path: Path) -> None:
    held = dir_lock.acquire(tmp_path)
    told: list[str] = []
    started = time.monotonic()
    with pytest.raises(dir_lock.DirectoryBusy):
        dir_lock.acquire(tmp_path, wait=30, waiting=told.append, cancelled=lambda: bool(told))
    assert time.monotonic() - started < 5 and told and told[0].startswith("pid ")
    held.release()


def test_a_symlink_in_place_of_the_lock_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / dir_lock.LOCK_FILE).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):
        dir_lock.acquire(tmp_path)
    assert not (tmp_path / "elsewhere").exists()


def test_windows_locks_one_byte_past_the_holder_line_and_reads_a_refusal() -> None:
    calls: list[tuple[str, int, int]] = []

    def seek(fd: int, offset: int, how: int) -> int:
        calls.append(("seek", offset, how))
        return offset

    def locking(fd: int, mode: int, size: int) -> None:
        calls.append(("lock", mode, size))

    assert dir_lock.windows_try_lock(7, locking, 2, seek)
    assert calls == [("seek", dir_lock.WINDOWS_LOCK_OFFSET, os.SEEK_SET), ("lock", 2, 1)]

    def held(fd: int, mode: int, size: int) -> None:
        raise OSError(errno.EACCES, "Permission denied")

    assert not dir_lock.windows_try_lock(7, held, 2, seek)

    def broken(fd: int, mode: int, size: int) -> None:
        raise OSError(errno.EBADF, "Bad file descriptor")

    with pytest.raises(OSError):
        dir_lock.windows_try_lock(7, broken, 2, seek)


@pytest.mark.parametrize(("where", "kind"), [
    ("/var/lib/see", ""),                      # the root file system (ext4)
    ("/mnt/nfs/see", "nfs4"),
    ("/mnt/nfs/local/see", ""),                # a local mount inside the NFS one wins
    ("/mnt/azure files/see", "cifs"),          # \040 in the table is a space
    ("/mnt/blob/x", "fuse.blobfuse2"),
    ("/mnt/nfsother", ""),                     # a prefix of the name is not a parent
])
def test_a_state_directory_on_a_network_file_system_is_recognised(
        tmp_path: Path, where: str, kind: str) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "/dev/vda1 / ext4 rw 0 0\n"
        "server:/export /mnt/nfs nfs4 rw,vers=4.1 0 0\n"
        "/dev/vdb /mnt/nfs/local xfs rw 0 0\n"
        "//acct.file.core.windows.net/share /mnt/azure\\040files cifs rw 0 0\n"
        "blobfuse2 /mnt/blob fuse.blobfuse2 rw 0 0\n")
    assert dir_lock.remote_file_system(Path(where), mounts) == kind


def test_no_mount_table_means_no_warning(tmp_path: Path) -> None:
    assert dir_lock.remote_file_system(tmp_path, tmp_path / "absent") == ""
