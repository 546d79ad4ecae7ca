"""The durable writes step by step (platforms/durable.py), on real files: the steps each offers
to the crash tests' seam, in order, with the file they write and what they write there (the
crash-point enumeration in tests/test_crash_points.py rebuilds disks from exactly these), and
an append that fails half-way: the file is cut back to where it was."""

from __future__ import annotations

import errno
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from scheduled_events_exporter.platforms.durable import (
    DiskStep,
    PowerLoss,
    append_durably,
    end_of_last_line,
    mend_tail,
    remove_durably,
    replace_durably,
    set_step_hook,
    truncate_durably,
    write_all,
    write_atomically,
)
from tests.crashdisk import full_after, step_hook


@pytest.fixture
def steps() -> Iterator[list[DiskStep]]:
    taken: list[DiskStep] = []
    previous = set_step_hook(taken.append)
    try:
        yield taken
    finally:
        set_step_hook(previous)


def shape(steps: list[DiskStep]) -> list[tuple[object, ...]]:
    """Each step without its file descriptor (checked on its own: an open one, the same for
    the write and the fsync of one file)."""
    return [(s.kind, s.path, s.data, s.offset, s.target) for s in steps]


def same_open_file(steps: list[DiskStep], kinds: tuple[str, ...]) -> None:
    fds = {s.fd for s in steps if s.kind in kinds}
    assert len(fds) == 1 and min(fds) >= 0, [(s.kind, s.fd) for s in steps]
    assert all(s.fd == -1 for s in steps if s.kind not in kinds)


def test_an_append_that_creates_its_file_syncs_the_directory(tmp_path: Path,
                                                             steps: list[DiskStep]) -> None:
    path = tmp_path / "otlp.log"
    append_durably(path, b"one\n")
    assert path.read_bytes() == b"one\n"
    assert shape(steps) == [("create", path, b"", 0, None), ("write", path, b"one\n", 0, None),
                            ("fsync", path, b"", 0, None), ("dirsync", tmp_path, b"", 0, None)]
    same_open_file(steps, ("write", "fsync"))
    steps.clear()
    append_durably(path, b"two\n")
    assert path.read_bytes() == b"one\ntwo\n"
    assert shape(steps) == [("write", path, b"two\n", 4, None), ("fsync", path, b"", 0, None)]
    same_open_file(steps, ("write", "fsync"))


def test_an_atomic_write_goes_through_a_fresh_temporary_name(tmp_path: Path,
                                                              steps: list[DiskStep]) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(b"old")
    write_atomically(path, b"new")
    assert path.read_bytes() == b"new"
    tmp = steps[0].path
    assert re.fullmatch(r"\.state\.json\.[0-9a-f]{16}\.tmp", tmp.name) and tmp.parent == tmp_path
    assert shape(steps) == [("create", tmp, b"", 0, None), ("write", tmp, b"new", 0, None),
                            ("fsync", tmp, b"", 0, None), ("rename", tmp, b"", 0, path),
                            ("dirsync", tmp_path, b"", 0, None)]
    same_open_file(steps, ("write", "fsync"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_a_cut_and_a_rename_are_synced(tmp_path: Path, steps: list[DiskStep]) -> None:
    path = tmp_path / "otlp.log"
    path.write_bytes(b"whole\ntorn")
    truncate_durably(path, 6)
    assert path.read_bytes() == b"whole\n"
    assert shape(steps) == [("truncate", path, b"", 6, None), ("fsync", path, b"", 0, None)]
    same_open_file(steps, ("truncate", "fsync"))
    steps.clear()
    older = tmp_path / "dead-letter.jsonl.1"
    replace_durably(path, older)
    assert older.read_bytes() == b"whole\n" and not path.exists()
    assert shape(steps) == [("rename", path, b"", 0, older), ("dirsync", tmp_path, b"", 0, None)]
    assert all(s.fd == -1 for s in steps)
    steps.clear()
    remove_durably(older)
    assert not older.exists()
    assert shape(steps) == [("unlink", older, b"", 0, None), ("dirsync", tmp_path, b"", 0, None)]
    with pytest.raises(FileNotFoundError):
        remove_durably(older)


@pytest.mark.parametrize(("content", "whole", "result", "after", "kinds"), [
    (b"", False, ("", 0), b"", []),
    (b"a\nb\n", False, ("", 0), b"a\nb\n", []),
    (b"a\nbc", False, ("cut", 2), b"a\n", ["truncate", "fsync"]),
    (b"bc", False, ("cut", 2), b"", ["truncate", "fsync"]),
    (b"a\nbc", True, ("completed", 2), b"a\nbc\n", ["write", "fsync"]),
])
def test_a_tail_is_cut_or_completed(tmp_path: Path, steps: list[DiskStep], content: bytes,
                                    whole: bool, result: tuple[str, int], after: bytes,
                                    kinds: list[str]) -> None:
    path = tmp_path / "f"
    path.write_bytes(content)
    seen: list[bytes] = []

    def judge(tail: bytes) -> bool:
        seen.append(tail)
        return whole

    assert mend_tail(path, judge) == result
    assert path.read_bytes() == after
    assert [s.kind for s in steps] == kinds
    assert seen == ([content[content.rfind(b"\n") + 1:]] if kinds else [])


def test_a_missing_file_has_no_tail(tmp_path: Path, steps: list[DiskStep]) -> None:
    assert mend_tail(tmp_path / "absent", lambda _: True) == ("", 0)
    assert steps == [] and not (tmp_path / "absent").exists()


@pytest.mark.parametrize(("content", "chunk", "end"), [
    (b"", 4, 0), (b"abc", 4, 0), (b"abcdefghij", 4, 0), (b"\n", 4, 1), (b"ab\ncd", 4, 3),
    # The newline is chunks away from the end: read back chunk by chunk.
    (b"a\n" + b"x" * 11, 4, 2), (b"a\n" + b"x" * 11, 1, 2), (b"\n" + b"x" * 8, 4, 1),
    (b"a\nb\n", 2, 4), (b"a\nb\nc", 2, 4),
])
def test_the_end_of_the_last_line_is_found_from_the_end(tmp_path: Path, content: bytes,
                                                        chunk: int, end: int) -> None:
    path = tmp_path / "f"
    path.write_bytes(content)
    assert end_of_last_line(path, len(content), chunk) == end
    assert end_of_last_line(path, len(content)) == end


Hook = Callable[[DiskStep], None]


@pytest.mark.parametrize("prefix", [0, 1, 5])
def test_an_append_that_fails_half_way_is_cut_back(tmp_path: Path, prefix: int) -> None:
    path = tmp_path / "otlp.log"
    path.write_bytes(b"kept\n")
    with step_hook(full_after(prefix)), pytest.raises(OSError) as caught:
        append_durably(path, b"lost line\n")
    assert caught.value.errno == errno.ENOSPC
    assert path.read_bytes() == b"kept\n"


def test_an_append_whose_cut_back_fails_too_still_says_why_it_failed(tmp_path: Path) -> None:
    """The disk went read-only after the torn write: the cut fails as well, and the caller
    still learns of the write's failure (the next writer cuts the tail first)."""
    path = tmp_path / "otlp.log"
    path.write_bytes(b"kept\n")
    with step_hook(full_after(3, read_only=True)), pytest.raises(OSError) as caught:
        append_durably(path, b"lost line\n")
    assert caught.value.errno == errno.ENOSPC
    assert path.read_bytes() == b"kept\nlos"


def test_a_failed_atomic_write_leaves_the_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(b"old")
    with step_hook(full_after(2)), pytest.raises(OSError):
        write_atomically(path, b"new state")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]
    assert path.read_bytes() == b"old"


def test_a_power_loss_leaves_the_temporary_file_as_it_was(tmp_path: Path) -> None:
    """Nothing runs after the power goes: the crash tests' disks must see the temporary file
    the write left (its next start ignores it), not one our error handling removed."""
    path = tmp_path / "state.json"

    def power_cut(step: DiskStep) -> None:
        if step.kind == "rename":
            raise PowerLoss

    previous = set_step_hook(power_cut)
    try:
        with pytest.raises(PowerLoss):
            write_atomically(path, b"new")
    finally:
        set_step_hook(previous)
    [left] = list(tmp_path.iterdir())
    assert left.name.endswith(".tmp") and left.read_bytes() == b"new"


def test_an_atomic_write_that_fails_before_its_file_exists_says_why(tmp_path: Path) -> None:
    def no_space(step: DiskStep) -> None:
        if step.kind == "create":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    previous = set_step_hook(no_space)
    try:
        with pytest.raises(OSError) as caught:
            write_atomically(tmp_path / "state.json", b"new")
    finally:
        set_step_hook(previous)
    assert caught.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_FSIZE is POSIX")
def test_a_short_write_is_completed_or_fails_loudly(tmp_path: Path) -> None:
    """The kernel takes part of a buffer and refuses the rest (here: the file-size limit, as a
    nearly full disk does): the rest is written by the next call, whose failure is raised."""
    import resource
    import signal

    path = tmp_path / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, hard))
        try:
            with pytest.raises(OSError) as caught:
                write_all(fd, b"x" * 5000)
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    finally:
        signal.signal(signal.SIGXFSZ, handler)
        os.close(fd)
    assert caught.value.errno == errno.EFBIG
    assert path.stat().st_size == 1000


def test_a_write_that_makes_no_progress_is_a_full_disk(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # os.write returning 0 for a non-empty buffer: without a check the loop would spin forever.
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o600)
    monkeypatch.setattr(os, "write", lambda _fd, _data: 0)
    try:
        with pytest.raises(OSError) as caught:
            write_all(fd, b"x")
    finally:
        monkeypatch.undo()
        os.close(fd)
    assert (caught.value.errno, caught.value.strerror) == (errno.ENOSPC,
                                                          os.strerror(errno.ENOSPC))
