"""Packaging promises that can be checked without a Docker engine or an index."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_dockerfile_is_non_root_read_only_friendly_and_health_checked() -> None:
    text = (REPO / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and not users[-1].startswith(("root", "0")), users
    assert re.search(r'^HEALTHCHECK .*?CMD \["scheduled-events-exporter", "probe"\]', text,
                     re.M | re.S)
    assert 'ENTRYPOINT ["scheduled-events-exporter"]' in text and 'CMD ["run"]' in text
    assert "SEE_STATE_DIR=/var/lib/scheduled-events-exporter" in text
    assert 'VOLUME ["/var/lib/scheduled-events-exporter"]' in text
    # A read-only root filesystem: Python must not try to write bytecode next to the code.
    assert "PYTHONDONTWRITEBYTECODE=1" in text


@pytest.mark.timeout(300)
def test_wheel_carries_the_scenarios_and_the_console_script(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                    "-q", "-w", str(tmp_path), str(REPO)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("azure_scheduled_events_exporter-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(n for n in names if n.endswith("entry_points.txt"))
        assert "scheduled-events-exporter = scheduled_events_exporter.cli:main" in (
            archive.read(entry_points).decode())
    scenarios = {p.name for p in (REPO / "config" / "scenarios").glob("*.json")}
    packaged = {Path(n).name for n in names if "/scenario_files/" in n and n.endswith(".json")}
    assert scenarios and packaged == scenarios
