"""A symlink planted in the state directory never redirects a write of ours."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scheduled_events_exporter.delivery.dead_letter import FILE_NAME, DeadLetterFile
from scheduled_events_exporter.platforms.durable import append_durably, write_atomically


def test_append_refuses_a_planted_symlink(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.write_bytes(b"untouched")
    link = tmp_path / "state" / "sink.log"
    link.parent.mkdir()
    link.symlink_to(target)
    with pytest.raises(OSError):
        append_durably(link, b"x\n")
    assert target.read_bytes() == b"untouched"


def test_atomic_write_replaces_the_link_not_its_target(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.write_bytes(b"untouched")
    link = tmp_path / "state.json"
    link.symlink_to(target)
    write_atomically(link, b"{}")
    assert target.read_bytes() == b"untouched"
    assert not link.is_symlink() and link.read_bytes() == b"{}"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_dead_letter_probe_uses_an_unpredictable_exclusive_name(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.write_bytes(b"untouched")
    state = tmp_path / "state"
    state.mkdir()
    # The old, predictable probe name, planted as a link: must not be written through.
    (state / f".{FILE_NAME}.probe").symlink_to(target)
    (state / FILE_NAME).symlink_to(target)
    letters = DeadLetterFile(state)
    with pytest.raises(OSError), letters.watch.guard():
        append_durably(letters.path, b"x\n")
    assert letters.fault is not None
    letters.probe()
    assert target.read_bytes() == b"untouched"
    assert letters.fault is None  # the probe wrote its own fresh file and removed it
    leftovers = [p.name for p in state.iterdir() if not p.is_symlink()]
    assert leftovers == [], leftovers
    assert os.readlink(state / FILE_NAME) == str(target)


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
