"""The Windows boot identity on a real Windows: the instant derived from ``GetTickCount64``
(``platforms/win32.py``) is the same across readings, so a restart in the same boot is no
reboot. (The comparison rules themselves: tests/test_windows_platform.py.)"""

from __future__ import annotations

import sys

import pytest

if sys.platform != "win32":
    pytest.skip("real Windows only (the CI's Windows job); tests/test_windows_platform.py "
                "runs the same logic with faked OS calls", allow_module_level=True)

import time
from datetime import datetime, timezone
from pathlib import Path

from scheduled_events_exporter.boot import (
    DEFAULT_BOOT_ID_FILE,
    WINDOWS_PREFIX,
    continuing,
    host_boot_id,
    same_boot,
)
from scheduled_events_exporter.config import load_config
from scheduled_events_exporter.platforms import win32


def test_the_tick_count_counts_milliseconds() -> None:
    first = win32.tick_count_ms()
    time.sleep(0.5)
    elapsed = win32.tick_count_ms() - first
    assert 400 <= elapsed <= 5000, elapsed  # its resolution is 10-16 ms
    assert first > 0


def test_the_boot_instant_is_stable_across_two_readings() -> None:
    first = host_boot_id(None)
    time.sleep(1.5)
    second = host_boot_id(None)
    assert first is not None and second is not None
    assert first.startswith(WINDOWS_PREFIX) and second.startswith(WINDOWS_PREFIX)
    assert same_boot(first, second), (first, second)
    assert continuing(first, second) == first  # a restart now would carry the saved one on
    instant = datetime.strptime(first[len(WINDOWS_PREFIX):], "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=timezone.utc)
    assert datetime(2000, 1, 1, tzinfo=timezone.utc) < instant < datetime.now(timezone.utc)


def test_the_configuration_takes_the_boot_instant_not_a_file(tmp_path: Path) -> None:
    assert DEFAULT_BOOT_ID_FILE is None
    config = load_config({"SEE_STATE_DIR": str(tmp_path / "state")})
    assert config.boot_id_file is None and config.boot_evidence
    assert host_boot_id(config.boot_id_file, enabled=config.boot_evidence) is not None
