"""The state directory's files are written safely: never through a planted symlink, temporary
files created exclusively under unpredictable names (docs/security.md)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from scheduled_events_exporter.state import append_durably, write_atomically


def test_append_refuses_to_follow_a_planted_symlink(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("precious\n")
    (tmp_path / "otlp.log").symlink_to(target)
    with pytest.raises(OSError) as info:
        append_durably(tmp_path / "otlp.log", b"record\n")
    assert info.value.errno == errno.ELOOP
    assert target.read_text() == "precious\n"


def test_atomic_write_replaces_a_planted_link_not_its_target(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("precious\n")
    (tmp_path / "state.json").symlink_to(target)
    write_atomically(tmp_path / "state.json", b"{}")
    assert target.read_text() == "precious\n"
    assert not (tmp_path / "state.json").is_symlink()
    assert (tmp_path / "state.json").read_bytes() == b"{}"


def test_temporary_names_are_unpredictable_and_exclusive(tmp_path: Path) -> None:
    # Links planted under every name the old scheme used (pid-based) change nothing.
    target = tmp_path / "elsewhere"
    target.write_text("precious\n")
    for pid in (os.getpid(), os.getpid() + 1):
        (tmp_path / f".state.json.{pid}.tmp").symlink_to(target)
    for _ in range(3):
        write_atomically(tmp_path / "state.json", b"{}")
    assert target.read_text() == "precious\n"
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")
                 and not p.is_symlink()]
    assert leftovers == []
