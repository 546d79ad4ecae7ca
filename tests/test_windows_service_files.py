"""The shipped Windows service definition and hook sample say what docs/windows.md says."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WINDOWS = REPO / "config" / "windows"


def seconds(text: str) -> float:
    value, unit = re.fullmatch(r"\s*(\d+)\s*(sec|secs|min|mins)?\s*", text).groups()  # type: ignore[union-attr]
    return float(value) * (60 if unit and unit.startswith("min") else 1)


def test_windows_service_definition_runs_the_exporter_and_stops_it_gracefully() -> None:
    service = ET.parse(WINDOWS / "scheduled-events-exporter-service.xml").getroot()
    assert service.findtext("id") == "scheduled-events-exporter"
    assert service.findtext("executable", "").endswith(r"\Scripts\python.exe")
    assert service.findtext("arguments") == "-m scheduled_events_exporter run"
    assert service.findtext("startmode") == "Automatic"
    assert service.find("onfailure").get("action") == "restart"  # type: ignore[union-attr]
    assert service.findtext("stopparentprocessfirst") == "true"  # Ctrl+C reaches us first
    env = {e.get("name"): e.get("value") for e in service.iter("env")}
    # The stop must fit: drain + watchdog grace within WinSW's stoptimeout.
    assert seconds(service.findtext("stoptimeout", "")) > float(env["SEE_SHUTDOWN_TIMEOUT"]) + 5
    assert service.find("serviceaccount/user").text == "LocalService"  # type: ignore[union-attr]
    readme = (REPO / "README.md").read_text()
    for name in env:
        assert f"`{name}`" in readme, f"{name} is not a documented variable"


def test_windows_hook_sample_reads_the_event_from_stdin_and_exits_0() -> None:
    hook = (WINDOWS / "leave-load-balancer.ps1").read_text()
    assert "[Console]::In.ReadToEnd() | ConvertFrom-Json" in hook
    assert hook.rstrip().endswith("exit 0")
    xml = (WINDOWS / "scheduled-events-exporter-service.xml").read_text()
    docs = (REPO / "docs" / "windows.md").read_text()
    assert "leave-load-balancer.ps1" in xml and "leave-load-balancer.ps1" in docs
