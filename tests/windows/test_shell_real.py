"""The approval hook through ``hook.run_hook`` on a real Windows: Windows PowerShell under
``-EncodedCommand``, its exit code, the event as JSON on its stdin, the environment allow-list,
and the timeout (or a cancel) killing the hook's whole process tree through its job object.
(On Linux the same decisions run against fakes: tests/test_windows_platform.py.)"""

from __future__ import annotations

import sys

import pytest

if sys.platform != "win32":
    pytest.skip("real Windows only (the CI's Windows job); tests/test_windows_platform.py "
                "runs the same logic with faked OS calls", allow_module_level=True)

import re
import threading
import time
from pathlib import Path

from scheduled_events_exporter.hook import HookResult, run_hook
from scheduled_events_exporter.model import ScheduledEvent
from scheduled_events_exporter.platforms import win32
from scheduled_events_exporter.platforms.shell import SHELL, Shell, WindowsShell
from tests.exporter_process import wait_until
from tests.windows import win

EVENT = ScheduledEvent("E-WIN-1", "Scheduled", "Freeze", "VirtualMachine", ("vm-win",),
                       description="Host server is undergoing maintenance.",
                       source="Platform", duration=5)
#: Progress records would otherwise be written among the output in some hosts.
QUIET = "$ProgressPreference = 'SilentlyContinue'\n"


class RealJobs:
    """The job object calls of ``platforms/win32.py``, as the shipped shell uses them."""

    def create_job(self) -> int:
        return win32.create_job()

    def open_process(self, pid: int) -> int:
        return win32.open_process(pid)

    def assign_to_job(self, job: int, process: int) -> None:
        win32.assign_to_job(job, process)

    def terminate_job(self, job: int) -> None:
        win32.terminate_job(job)

    def close_handle(self, handle: int) -> None:
        win32.close_handle(handle)

    def resume_process(self, process: int) -> None:
        win32.resume_process(process)


def run(command: str, *, timeout: float = 60, shell: Shell = SHELL,
        cancel: threading.Event | None = None) -> HookResult:
    return run_hook(command, EVENT, timeout, cancel=cancel or threading.Event(), shell=shell)


def ps_quote(text: str) -> str:
    """A PowerShell single-quoted string (nothing inside is expanded)."""
    return "'" + text.replace("'", "''") + "'"


def test_the_shipped_shell_is_windows_powershell_in_a_job() -> None:
    assert isinstance(SHELL, WindowsShell) and SHELL.name == "Windows PowerShell"


@pytest.mark.parametrize("code", [0, 3, 255])
def test_the_exit_code_reaches_the_exporter(code: int) -> None:
    result = run(f"exit {code}")
    assert result.exit_code == code and not result.timed_out, result
    assert result.ok is (code == 0)


def test_the_event_arrives_as_json_on_stdin() -> None:
    # The form docs/windows.md gives hook authors.
    result = run(QUIET + '$e = [Console]::In.ReadToEnd() | ConvertFrom-Json\n'
                 'Write-Output ("id={0} type={1} resources={2} duration={3} source={4}" -f '
                 '$e.EventId, $e.EventType, ($e.Resources -join ","), $e.DurationInSeconds, '
                 '$e.EventSource)\n'
                 'if ($e.EventType -eq "Freeze") { exit 0 } else { exit 4 }')
    assert result.exit_code == 0, result
    assert "id=E-WIN-1 type=Freeze resources=vm-win duration=5 source=Platform" in (
        result.output), result.output


def test_the_command_reaches_powershell_as_written() -> None:
    # Quotes, $, &, |, ;, %, ^ and <> would each mean something to cmd or the C runtime.
    result = run(QUIET + "Write-Output 'quotes \" and '' $notexpanded & | ; % ^ <>'")
    assert result.exit_code == 0, result
    assert "quotes \" and ' $notexpanded & | ; % ^ <>" in result.output, result.output


def test_the_hook_sees_the_allow_list_and_never_a_secret(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    monkeypatch.setenv("SEE_EVENTHUB_CONNECTION_STRING",
                       "Endpoint=sb://x.servicebus.windows.net/;SharedAccessKey=TOPSECRET")
    monkeypatch.setenv("AZURE_CLIENT_SECRET", "TOPSECRET")
    monkeypatch.setenv("UNLISTED_SETTING", "no")
    monkeypatch.setenv("MYTOOL_HOME", r"C:\mytool")
    # Asked for by name (in other case), and one of the exporter's secrets: never passed on.
    monkeypatch.setenv("SEE_APPROVE_HOOK_ENV", "MyTool_Home,SEE_EVENTHUB_CONNECTION_STRING")
    result = run(QUIET + 'Write-Output ("event=" + $env:SEE_EVENT_ID + "/" + $env:SEE_EVENT_TYPE)\n'
                 'Write-Output ("mytool=" + $env:MYTOOL_HOME)\n'
                 'Write-Output ("names=" + ((Get-ChildItem Env:).Name -join ","))')
    assert result.exit_code == 0, result
    found = re.search(r"names=(.*)", result.output)
    assert found, result.output
    names = {name.strip().upper() for name in found.group(1).split(",")}
    assert {"SYSTEMROOT", "PATH", "TEMP", "SEE_EVENT_ID", "SEE_EVENT_RESOURCES",
            "MYTOOL_HOME"} <= names, names
    assert not names & {"SEE_EVENTHUB_CONNECTION_STRING", "AZURE_CLIENT_SECRET",
                        "UNLISTED_SETTING", "SEE_APPROVE_HOOK_ENV"}, names
    assert "TOPSECRET" not in result.output
    assert "event=E-WIN-1/Freeze" in result.output and r"mytool=C:\mytool" in result.output


#: A grandchild that writes a heartbeat every 0.1 s for as long as it lives.
GRANDCHILD = """\
import sys
import time

while True:
    with open(sys.argv[1], "a") as beat:
        beat.write(".")
    time.sleep(0.1)
"""


def tree_hook(tmp_path: Path) -> tuple[str, Path]:
    """A hook that starts a detached Python process (Start-Process), prints its id, and then
    sleeps far longer than any test waits."""
    script, beat = tmp_path / "grandchild.py", tmp_path / "beat.txt"
    script.write_text(GRANDCHILD, encoding="utf-8")
    arguments = f'"{script}" "{beat}"'
    command = (QUIET + f"$p = Start-Process -FilePath {ps_quote(sys.executable)} "
               f"-ArgumentList {ps_quote(arguments)} -PassThru -WindowStyle Hidden\n"
               'Write-Output ("GRANDCHILD=" + $p.Id)\n'
               "Start-Sleep -Seconds 600")
    return command, beat


def assert_tree_gone(result: HookResult, beat: Path) -> None:
    assert result.timed_out and result.exit_code is None, result
    found = re.search(r"GRANDCHILD=(\d+)", result.output)
    assert found, f"the hook never started its grandchild: {result.output}"
    pid = int(found.group(1))
    wait_until(beat.exists, 10, "the grandchild's first heartbeat")
    wait_until(lambda: not win.process_running(pid), 10, f"grandchild {pid} to be gone")
    size = beat.stat().st_size
    time.sleep(1.0)
    assert beat.stat().st_size == size, "the grandchild still writes its heartbeat"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["the job object alone", "the shell as shipped"])
def test_the_timeout_kills_the_hook_and_everything_it_started(tmp_path: Path, how: str) -> None:
    command, beat = tree_hook(tmp_path)
    taskkills: list[list[str]] = []
    shell: Shell = (WindowsShell(RealJobs(), taskkill=taskkills.append)
                    if how == "the job object alone" else SHELL)
    started = time.monotonic()
    result = run(command, timeout=20, shell=shell)
    assert time.monotonic() - started < 45, "killed at its timeout, not at its own end"
    assert_tree_gone(result, beat)
    assert taskkills == [], "the job ended the tree; the taskkill fallback was not needed"


@pytest.mark.timeout(120)
def test_a_cancel_kills_the_hook_tree_too(tmp_path: Path) -> None:
    command, beat = tree_hook(tmp_path)
    cancel = threading.Event()
    threading.Timer(12.0, cancel.set).start()
    started = time.monotonic()
    result = run(command, timeout=300, cancel=cancel)
    assert time.monotonic() - started < 40
    assert_tree_gone(result, beat)
