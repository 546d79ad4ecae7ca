"""One exporter per state directory on a real Windows: the ``msvcrt`` byte lock refuses a
second holder (another process included) and leaves the holder's line readable. (The decision
logic with faked OS calls: tests/test_state_dir_lock.py.)"""

from __future__ import annotations

import subprocess
import sys

import pytest

if sys.platform != "win32":
    pytest.skip("real Windows only (the CI's Windows job); tests/test_state_dir_lock.py "
                "runs the same logic with faked OS calls", allow_module_level=True)

import os
from pathlib import Path

from scheduled_events_exporter.platforms import dir_lock


def test_a_second_holder_is_refused_and_reads_the_first_ones_line(tmp_path: Path) -> None:
    held = dir_lock.acquire(tmp_path)
    try:
        with pytest.raises(dir_lock.DirectoryBusy, match=rf"pid {os.getpid()} on "):
            dir_lock.acquire(tmp_path)
        other = subprocess.run(
            [sys.executable, "-c", "import sys, pathlib; "
             "from scheduled_events_exporter.platforms import dir_lock as d\n"
             "try:\n d.acquire(pathlib.Path(sys.argv[1]))\nexcept d.DirectoryBusy:\n sys.exit(3)",
             str(tmp_path)], timeout=60, check=False)
        assert other.returncode == 3
    finally:
        held.release()
    dir_lock.acquire(tmp_path).release()
