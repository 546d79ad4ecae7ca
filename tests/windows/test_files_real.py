"""``platforms/files.py`` on a real NTFS volume: reparse points refused before and after the
open, exclusive creation, renames retried while another handle holds the file, the protected ACL
of the state directory read back from the file system. (On Linux the same decisions run against
faked OS calls: tests/test_windows_platform.py.)"""

from __future__ import annotations

import sys

import pytest

if sys.platform != "win32":
    pytest.skip("real Windows only (the CI's Windows job); tests/test_windows_platform.py "
                "runs the same logic with faked OS calls", allow_module_level=True)

import errno
import os
import threading
from pathlib import Path

from scheduled_events_exporter.config import ConfigError, load_config
from scheduled_events_exporter.platforms.durable import append_durably, write_atomically
from scheduled_events_exporter.platforms.files import FILES, WindowsFiles
from tests.windows import win

#: SYSTEM, Administrators, the owner (OWNER RIGHTS): files.PRIVATE_DIR_SDDL's trustees.
PRIVATE_TRUSTEES = {"SY", "BA", "OW"}


def test_the_windows_implementation_is_the_one_chosen() -> None:
    assert isinstance(FILES, WindowsFiles)


def test_appends_reach_a_plain_file_byte_for_byte_and_are_not_inherited(tmp_path: Path) -> None:
    path = tmp_path / "spool.log"
    append_durably(path, b"one\n")
    append_durably(path, b"two\n")
    fd = FILES.open_append(path)
    try:
        assert not os.get_inheritable(fd)  # a hook started meanwhile does not get it
        os.write(fd, b"three\n")
    finally:
        os.close(fd)
    # O_BINARY: in the C runtime's text mode every \n would have become \r\n.
    assert path.read_bytes() == b"one\ntwo\nthree\n"


def test_a_junction_is_refused_before_anything_is_opened(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    win.junction(tmp_path / "spool.log", elsewhere)
    with pytest.raises(OSError) as caught:
        FILES.open_append(tmp_path / "spool.log")
    assert caught.value.errno == errno.ELOOP and "reparse point" in str(caught.value)
    assert list(elsewhere.iterdir()) == []


def test_a_symbolic_link_is_refused_and_its_target_left_alone(tmp_path: Path) -> None:
    target = tmp_path / "precious.txt"
    target.write_bytes(b"keep\n")
    win.file_symlink(tmp_path / "dead-letter.jsonl", target)
    with pytest.raises(OSError) as caught:
        append_durably(tmp_path / "dead-letter.jsonl", b"record\n")
    assert caught.value.errno == errno.ELOOP
    assert target.read_bytes() == b"keep\n"


@pytest.mark.parametrize("swap", ["another file", "a symbolic link"])
def test_a_name_swapped_between_the_look_and_the_open_is_refused(tmp_path: Path,
                                                                 swap: str) -> None:
    path = tmp_path / "spool.log"
    path.write_bytes(b"ours\n")
    other = tmp_path / "other.log"
    other.write_bytes(b"not ours\n")
    if swap == "a symbolic link":
        win.file_symlink(tmp_path / "probe-link", other)  # skips where links are not allowed
    opened: list[int] = []

    def swap_then_open(name: Path, flags: int, mode: int) -> int:
        # What another process could do between WindowsFiles' look (lstat) and its open.
        os.replace(name, tmp_path / "ours-moved.log")
        if swap == "another file":
            os.replace(other, name)
        else:
            os.symlink(other, name)
        opened.append(os.open(name, flags, mode))
        return opened[-1]

    with pytest.raises(OSError) as caught:
        WindowsFiles(open_fd=swap_then_open).open_append(path)
    assert caught.value.errno == errno.ELOOP
    with pytest.raises(OSError):
        os.fstat(opened[0])  # the descriptor of the wrong file was closed, never written
    assert path.read_bytes() == b"not ours\n"
    assert (tmp_path / "ours-moved.log").read_bytes() == b"ours\n"


def test_new_files_never_open_an_existing_name(tmp_path: Path) -> None:
    fd = FILES.open_new(tmp_path / ".state.json.new.tmp")
    try:
        os.write(fd, b"{}\n")
    finally:
        os.close(fd)
    assert (tmp_path / ".state.json.new.tmp").read_bytes() == b"{}\n"
    with pytest.raises(FileExistsError):
        FILES.open_new(tmp_path / ".state.json.new.tmp")
    directory = tmp_path / "d"
    directory.mkdir()
    win.junction(tmp_path / "j", directory)
    with pytest.raises(OSError):
        FILES.open_new(tmp_path / "j")
    target = tmp_path / "precious.txt"
    target.write_bytes(b"keep\n")
    win.file_symlink(tmp_path / "link.tmp", target)
    with pytest.raises(FileExistsError):
        FILES.open_new(tmp_path / "link.tmp")
    assert target.read_bytes() == b"keep\n"


def test_a_dangling_symbolic_link_is_not_followed_by_an_exclusive_create(tmp_path: Path) -> None:
    # O_EXCL is CREATE_NEW: the name exists (as a link), so nothing may be created where the
    # link points.
    missing = tmp_path / "planted" / "target.json"
    missing.parent.mkdir()
    win.file_symlink(tmp_path / ".state.json.x.tmp", missing)
    with pytest.raises(FileExistsError):
        FILES.open_new(tmp_path / ".state.json.x.tmp")
    assert not missing.exists()


def _hold(path: Path, seconds: float) -> threading.Timer:
    """Keep ``path`` open for ``seconds`` the way another program would: Python opens files
    without FILE_SHARE_DELETE, so renaming over it fails meanwhile (a virus scanner's or the
    indexer's handle does the same)."""
    holder = open(path, "rb")  # noqa: SIM115 (closed by the timer)
    timer = threading.Timer(seconds, holder.close)
    timer.start()
    return timer


def test_a_replace_held_up_by_another_handle_is_retried(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    target.write_bytes(b"old")
    source = tmp_path / "new.tmp"
    source.write_bytes(b"new")
    attempts: list[str] = []

    def counting_replace(src: Path, dst: Path) -> None:
        try:
            os.replace(src, dst)
        except PermissionError:
            attempts.append("refused")
            raise
        attempts.append("done")

    _hold(target, 0.3)
    WindowsFiles(rename=counting_replace).replace(source, target)
    assert attempts[0] == "refused" and attempts[-1] == "done", attempts
    assert target.read_bytes() == b"new"


def test_a_state_write_waits_out_a_short_hold_and_fails_cleanly_on_a_long_one(
        tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    target.write_bytes(b"old")
    short_hold = _hold(target, 0.3)
    write_atomically(target, b"new")  # the retries (0.75 s in all) outlast the hold
    short_hold.join()
    assert target.read_bytes() == b"new"

    long_hold = _hold(target, 5.0)
    try:
        with pytest.raises(PermissionError):
            write_atomically(target, b"newer")
    finally:
        long_hold.join()
    assert target.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temp file left behind


def test_the_state_directory_gets_the_protected_acl_and_its_files_inherit_it(
        tmp_path: Path) -> None:
    state = tmp_path / "vendor" / "scheduled-events-exporter"
    FILES.make_dirs(state)
    control, aces = win.dacl(state)
    shown = f"{win.dacl_sddl(state)}\n{win.icacls(state)}"
    assert "P" in control, shown  # protected: nothing inherited from the parent
    assert {ace.trustee for ace in aces} == PRIVATE_TRUSTEES, shown
    for ace in aces:
        assert ace.kind == "A" and ace.rights == "FA", shown
        assert "OI" in ace.flags and "CI" in ace.flags and "ID" not in ace.flags, shown

    write_atomically(state / "state.json", b"{}")
    _, file_aces = win.dacl(state / "state.json")
    shown = f"{win.dacl_sddl(state / 'state.json')}\n{win.icacls(state / 'state.json')}"
    assert {ace.trustee for ace in file_aces} == PRIVATE_TRUSTEES, shown
    assert all("ID" in ace.flags for ace in file_aces), shown  # inherited, nothing added


def test_the_default_state_directory_is_created_private_under_programdata(
        tmp_path: Path) -> None:
    config = load_config({"PROGRAMDATA": str(tmp_path)})
    assert config.state_dir == tmp_path / "scheduled-events-exporter"
    control, aces = win.dacl(config.state_dir)
    shown = f"{win.dacl_sddl(config.state_dir)}\n{win.icacls(config.state_dir)}"
    assert "P" in control and {ace.trustee for ace in aces} == PRIVATE_TRUSTEES, shown


def test_a_junction_as_the_state_directory_is_a_configuration_error(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    win.junction(tmp_path / "state", real)
    with pytest.raises(ConfigError) as caught:
        load_config({"SEE_STATE_DIR": str(tmp_path / "state")})
    assert any(p.startswith("SEE_STATE_DIR=") and "junction" in p
               for p in caught.value.problems), caught.value.problems
