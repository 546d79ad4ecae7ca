"""The Windows implementations of the platform seams, run on Linux with the OS calls injected
(no Windows machine is available here): safe state writes, the hook's command line and process
tree, the stop requests, the boot instant, the defaults. What only a real Windows can show is
listed in docs/windows.md ("Not verified here")."""

from __future__ import annotations

import base64
import errno
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from scheduled_events_exporter.boot import (
    SAME_BOOT_TOLERANCE,
    boot_instant_id,
    continuing,
    host_boot_id,
    same_boot,
)
from scheduled_events_exporter.config import default_state_dir
from scheduled_events_exporter.hook import hook_environment
from scheduled_events_exporter.model import Document, ScheduledEvent
from scheduled_events_exporter.platforms import stop as stops
from scheduled_events_exporter.platforms.files import (
    PRIVATE_DIR_SDDL,
    REPARSE_POINT,
    WindowsFiles,
)
from scheduled_events_exporter.platforms.shell import (
    MAX_WINDOWS_COMMAND,
    WindowsRunning,
    WindowsShell,
    powershell_argv,
)
from scheduled_events_exporter.tracker import Evidence, TrackerState, track

# --- safe state writes ------------------------------------------------------------------------


def stat(ino: int, attributes: int = 0) -> Any:
    return SimpleNamespace(st_ino=ino, st_dev=1, st_file_attributes=attributes, st_size=0)


def key(path: Path | str) -> str:
    """A path as the fakes below file it: forward slashes on every OS (on Windows ``str`` of
    ``Path("C:/state")`` is ``C:\\state``)."""
    return Path(path).as_posix()


class FakeDisk:
    """lstat/fstat/open/close of a pretend NTFS: ``files`` maps a path (:func:`key`) to (inode,
    attributes)."""

    def __init__(self) -> None:
        self.files: dict[str, tuple[int, int]] = {}
        self.opened: list[tuple[str, int]] = []
        self.fds: dict[int, int] = {}
        self.closed: list[int] = []
        self.after_open: dict[str, tuple[int, int]] = {}  # what the path is once opened

    def lstat(self, path: Path) -> Any:
        if key(path) not in self.files:
            raise FileNotFoundError(errno.ENOENT, "no such file", str(path))
        return stat(*self.files[key(path)])

    def open(self, path: Path, flags: int, mode: int) -> int:
        self.opened.append((key(path), flags))
        ino = self.files.setdefault(key(path), (100 + len(self.files), 0))[0]
        fd = 10 + len(self.opened)
        self.fds[fd] = ino
        if key(path) in self.after_open:
            self.files[key(path)] = self.after_open[key(path)]
        return fd

    def fstat(self, fd: int) -> Any:
        return stat(self.fds[fd])

    def close(self, fd: int) -> None:
        self.closed.append(fd)

    def windows_files(self, **extra: Any) -> WindowsFiles:
        return WindowsFiles(lstat=self.lstat, fstat=self.fstat, open_fd=self.open,
                            close_fd=self.close, **extra)


def test_windows_append_opens_a_plain_file_binary_and_not_inherited() -> None:
    disk = FakeDisk()
    binary_noinherit = 1 << 28  # stands for O_BINARY | O_NOINHERIT, which Linux's os lacks
    files = disk.windows_files(flags=binary_noinherit)
    fd = files.open_append(Path("C:/state/spool/otlp.log"))
    assert fd == 11 and disk.closed == []
    (_, flags), = disk.opened
    assert flags & os.O_APPEND and flags & os.O_CREAT and not flags & os.O_EXCL
    assert flags & binary_noinherit


def test_windows_append_refuses_a_reparse_point() -> None:
    disk = FakeDisk()
    disk.files["C:/state/dead-letter.jsonl"] = (7, REPARSE_POINT)  # a symlink or junction
    with pytest.raises(OSError) as caught:
        disk.windows_files().open_append(Path("C:/state/dead-letter.jsonl"))
    assert caught.value.errno == errno.ELOOP and "reparse point" in str(caught.value)
    assert disk.opened == [], "never opened: a link is refused before anything is written"


def test_windows_append_refuses_a_file_swapped_for_a_link_while_it_was_opened() -> None:
    disk = FakeDisk()
    disk.files["C:/state/spool/x.log"] = (7, 0)
    disk.after_open["C:/state/spool/x.log"] = (8, REPARSE_POINT)
    with pytest.raises(OSError):
        disk.windows_files().open_append(Path("C:/state/spool/x.log"))
    assert disk.closed == [11], "the descriptor of the wrong file is closed, not written"


def test_windows_new_files_are_created_exclusively() -> None:
    disk = FakeDisk()
    disk.windows_files().open_new(Path("C:/state/.state.json.1a2b.tmp"))
    (_, flags), = disk.opened
    assert flags & os.O_EXCL and flags & os.O_CREAT  # CREATE_NEW: an existing name (a link) fails


def test_windows_rename_is_retried_while_a_scanner_holds_the_file() -> None:
    calls: list[tuple[Path, Path]] = []
    slept: list[float] = []

    def rename(source: Path, target: Path) -> None:
        calls.append((source, target))
        if len(calls) < 3:
            raise PermissionError(errno.EACCES, "The process cannot access the file")

    files = WindowsFiles(rename=rename, sleep=slept.append)
    files.replace(Path("a.tmp"), Path("state.json"))
    assert len(calls) == 3 and slept == [0.05, 0.1]

    def always(source: Path, target: Path) -> None:
        raise PermissionError(errno.EACCES, "denied")

    with pytest.raises(PermissionError):
        WindowsFiles(rename=always, sleep=lambda _: None).replace(Path("a"), Path("b"))


def test_windows_state_directory_is_created_private_and_a_junction_is_refused() -> None:
    disk = FakeDisk()
    disk.files["C:/ProgramData"] = (1, 0)
    made: list[str] = []
    private: list[tuple[str, str]] = []

    def mkdir(path: Path) -> None:
        made.append(key(path))
        disk.files[key(path)] = (50 + len(made), 0)

    def create_private(path: str, sddl: str) -> None:
        private.append((key(path), sddl))
        disk.files[key(path)] = (99, 0)

    files = disk.windows_files(mkdir=mkdir, create_private_directory=create_private)
    files.make_dirs(Path("C:/ProgramData/vendor/scheduled-events-exporter"))
    assert made == ["C:/ProgramData/vendor"]
    assert private == [("C:/ProgramData/vendor/scheduled-events-exporter", PRIVATE_DIR_SDDL)]
    assert PRIVATE_DIR_SDDL.startswith("D:P(")  # protected: nothing inherited from ProgramData
    assert files.check_dir(Path("C:/ProgramData/vendor/scheduled-events-exporter")) == ""
    disk.files["D:/elsewhere"] = (5, REPARSE_POINT)
    assert "not a junction or symbolic link" in files.check_dir(Path("D:/elsewhere"))
    with pytest.raises(OSError):
        files.make_dirs(Path("D:/elsewhere"))


def test_windows_default_state_directory_is_under_programdata() -> None:
    assert default_state_dir({"PROGRAMDATA": r"D:\ProgramData"}, windows=True) == Path(
        r"D:\ProgramData") / "scheduled-events-exporter"
    assert default_state_dir({"ProgramData": r"E:\PD"}, windows=True) == Path(
        r"E:\PD") / "scheduled-events-exporter"
    assert default_state_dir({}, windows=True) == Path(r"C:\ProgramData") / (
        "scheduled-events-exporter")


# --- the approval hook ------------------------------------------------------------------------

EVENT = ScheduledEvent("E1", "Scheduled", "Freeze", "VirtualMachine", ("vm1",), None,
                       source="Platform", duration=5)


@dataclass
class FakeJobs:
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    fail: set[str] = field(default_factory=set)
    on_terminate: Any = None

    def _call(self, name: str, *args: Any) -> None:
        self.calls.append((name, *args))
        if name in self.fail:
            raise OSError(5, f"{name} failed")

    def create_job(self) -> int:
        self._call("create_job")
        return 77

    def open_process(self, pid: int) -> int:
        self._call("open_process", pid)
        return 4242

    def assign_to_job(self, job: int, process: int) -> None:
        self._call("assign_to_job", job, process)

    def terminate_job(self, job: int) -> None:
        self._call("terminate_job", job)
        if self.on_terminate:
            self.on_terminate()

    def close_handle(self, handle: int) -> None:
        self._call("close_handle", handle)

    def resume_process(self, process: int) -> None:
        self._call("resume_process", process)


class FakePopen:
    """What WindowsShell hands to subprocess.Popen, and a process that ends at once."""

    instances: ClassVar[list[FakePopen]] = []

    def __init__(self, argv: list[str], **kwargs: Any) -> None:
        self.argv, self.kwargs = argv, kwargs
        self.pid, self.returncode = 4343, None
        self.stdin = self.stdout = None
        self.killed = False
        FakePopen.instances.append(self)

    def kill(self) -> None:
        self.killed = True

    def wait(self, timeout: float | None = None) -> int:
        self.returncode = 1
        return 1


def test_windows_hook_command_line_is_powershell_with_the_command_encoded() -> None:
    command = """$e = [Console]::In.ReadToEnd() | ConvertFrom-Json; if ($e.EventType -eq "Freeze") { exit 0 } else { exit 3 }"""  # noqa: E501
    argv = powershell_argv(command, r"C:\Windows")
    assert argv[0] == r"C:\Windows" + os.sep + os.path.join(
        "System32", "WindowsPowerShell", "v1.0", "powershell.exe")
    assert argv[1:-1] == ["-NoLogo", "-NoProfile", "-NonInteractive", "-ExecutionPolicy",
                          "Bypass", "-EncodedCommand"]
    # Quotes, dollars, pipes and braces travel untouched: base64 of UTF-16LE, no quoting rule.
    assert base64.b64decode(argv[-1]).decode("utf-16-le") == command
    assert all(c.isalnum() or c in "+/=" for c in argv[-1])


def test_windows_hook_starts_suspended_in_a_job_then_resumes() -> None:
    jobs, FakePopen.instances[:] = FakeJobs(), []
    shell = WindowsShell(jobs, popen=FakePopen)  # type: ignore[arg-type]
    shell.start("exit 0", {"SystemRoot": r"D:\Win", "PATH": r"C:\bin"})
    (proc,) = FakePopen.instances
    flags = proc.kwargs["creationflags"]
    assert flags & 0x4 and flags & 0x200 and flags & 0x08000000  # suspended, own group, no window
    assert proc.argv[0].startswith(r"D:\Win")  # PowerShell from the SystemRoot it was given
    assert proc.kwargs["env"] == {"SystemRoot": r"D:\Win", "PATH": r"C:\bin"}
    # A handle of its own to the process (4343's: 4242), in the job, resumed, then closed.
    assert jobs.calls == [("open_process", 4343), ("create_job",), ("assign_to_job", 77, 4242),
                          ("resume_process", 4242), ("close_handle", 4242)]


def test_windows_hook_tree_is_killed_through_its_job_at_the_timeout() -> None:
    jobs, FakePopen.instances[:] = FakeJobs(), []
    running = WindowsShell(jobs, popen=FakePopen).start("Start-Sleep 600", {})  # type: ignore[arg-type]
    running.kill_tree()
    running.close()
    assert ("terminate_job", 77) in jobs.calls and ("close_handle", 77) in jobs.calls


def test_windows_hook_without_a_job_falls_back_to_taskkill_of_the_tree() -> None:
    jobs, FakePopen.instances[:] = FakeJobs(fail={"assign_to_job"}), []
    killed: list[list[str]] = []
    running = WindowsShell(jobs, popen=FakePopen,  # type: ignore[arg-type]
                           taskkill=killed.append).start("x", {})
    assert ("close_handle", 77) in jobs.calls  # the unusable job is not kept
    assert ("resume_process", 4242) in jobs.calls  # it runs all the same
    running.kill_tree()
    assert killed == [["taskkill", "/T", "/F", "/PID", "4343"]]
    assert not any(c[0] == "terminate_job" for c in jobs.calls)


def test_windows_hook_that_cannot_resume_is_killed_and_reported() -> None:
    jobs, FakePopen.instances[:] = FakeJobs(fail={"resume_process"}), []
    with pytest.raises(OSError):
        WindowsShell(jobs, popen=FakePopen).start("x", {})  # type: ignore[arg-type]
    assert ("terminate_job", 77) in jobs.calls and FakePopen.instances[0].killed
    assert ("close_handle", 4242) in jobs.calls  # the process handle is not leaked


def test_windows_hook_that_cannot_be_opened_is_killed_and_reported() -> None:
    jobs, FakePopen.instances[:] = FakeJobs(fail={"open_process"}), []
    killed: list[list[str]] = []
    with pytest.raises(OSError):
        WindowsShell(jobs, popen=FakePopen,  # type: ignore[arg-type]
                     taskkill=killed.append).start("x", {})
    assert killed == [["taskkill", "/T", "/F", "/PID", "4343"]] and FakePopen.instances[0].killed
    assert not any(c[0] in ("create_job", "resume_process") for c in jobs.calls)


def test_windows_hook_environment_keeps_what_windows_needs_and_no_secret() -> None:
    base = {"SYSTEMROOT": r"C:\Windows", "PATH": r"C:\Windows\system32", "TEMP": r"C:\T",
            "PSMODULEPATH": "x", "USERPROFILE": "y", "AZURE_CLIENT_SECRET": "s3cret",
            "SEE_EVENTHUB_CONNECTION_STRING": "Endpoint=sb://x", "MYTOOL_HOME": "z",
            "SEE_APPROVE_HOOK_ENV": "MyTool_Home", "RANDOM": "no"}
    env = hook_environment(EVENT, base, drop={"SEE_EVENTHUB_CONNECTION_STRING"},
                           shell=WindowsShell(FakeJobs()))
    assert {"SYSTEMROOT", "PATH", "TEMP", "PSMODULEPATH", "USERPROFILE", "MYTOOL_HOME"} <= set(env)
    assert "AZURE_CLIENT_SECRET" not in env and "SEE_EVENTHUB_CONNECTION_STRING" not in env
    assert "RANDOM" not in env and env["SEE_EVENT_ID"] == "E1"


def test_windows_hook_command_length_is_checked_at_start() -> None:
    shell = WindowsShell(FakeJobs())
    assert shell.check("Remove-LBNode -Name $env:COMPUTERNAME") == ""
    assert "at most" in shell.check("x" * (MAX_WINDOWS_COMMAND + 1))


@pytest.mark.skipif(sys.platform == "win32", reason="uses a POSIX program as the hook")
def test_windows_hook_io_threads_feed_stdin_collect_output_and_give_up_on_time() -> None:
    # The thread-based exchange (Windows pipes cannot be select()ed), on a real process.
    proc = subprocess.Popen(["/bin/sh", "-c", "cat; echo done"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    running = WindowsRunning(proc, FakeJobs(), None, lambda argv: None)
    output = bytearray()
    assert running.exchange(b'{"EventId": "E1"}\n', output, lambda: False) is True
    running.close()
    assert output == b'{"EventId": "E1"}\ndone\n' and proc.returncode == 0

    slow = subprocess.Popen(["/bin/sh", "-c", "sleep 30"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    jobs = FakeJobs(on_terminate=lambda: os.killpg(slow.pid, signal.SIGKILL))
    running = WindowsRunning(slow, jobs, 77, lambda argv: None)
    deadline = time.monotonic() + 0.3
    started = time.monotonic()
    assert running.exchange(b"", bytearray(), lambda: time.monotonic() > deadline) is False
    running.kill_tree()
    running.close()
    assert time.monotonic() - started < 5 and slow.returncode is not None


# --- stop requests ----------------------------------------------------------------------------

def test_windows_ctrl_c_and_ctrl_break_are_left_to_pythons_signal_handlers() -> None:
    stop, finished = threading.Event(), threading.Event()
    handle = stops.console_handler(stop, finished, in_service=False)
    assert handle(stops.CTRL_C) is False and handle(stops.CTRL_BREAK) is False
    assert not stop.is_set()


class WatchedEvent(threading.Event):
    """An event that says when someone starts waiting on it (``waiting``)."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting.set()
        return super().wait(timeout)


@pytest.mark.parametrize("event", [stops.CTRL_CLOSE, stops.CTRL_SHUTDOWN, stops.CTRL_LOGOFF])
def test_windows_close_logoff_and_shutdown_stop_and_wait_for_the_drain(event: int) -> None:
    stop, finished = threading.Event(), WatchedEvent()
    handle = stops.console_handler(stop, finished, in_service=False, grace=10)
    order: list[str] = []

    def drain() -> None:
        # The shutdown runs once the stop is asked for, and ends only while the handler is
        # already waiting for it: a handler that returned without waiting is caught.
        if stop.wait(5) and finished.waiting.wait(5):
            order.append("drained")
            finished.set()

    drainer = threading.Thread(target=drain, daemon=True)
    drainer.start()
    assert handle(event) is True
    order.append("returned")
    assert stop.is_set() and order == ["drained", "returned"], "returned only after the drain"
    drainer.join(5)


def test_windows_handler_returns_within_the_time_windows_gives() -> None:
    stop, finished = threading.Event(), threading.Event()
    handle = stops.console_handler(stop, finished, in_service=False, grace=0.3)
    started = time.monotonic()
    assert handle(stops.CTRL_SHUTDOWN) is True
    assert 0.25 < time.monotonic() - started < 2  # the drain never finished: give up in time


def test_windows_service_ignores_a_users_logoff() -> None:
    stop, finished = threading.Event(), threading.Event()
    assert stops.console_handler(stop, finished, in_service=True)(stops.CTRL_LOGOFF) is True
    assert not stop.is_set()


def test_windows_install_registers_sigint_sigbreak_and_the_console_handler() -> None:
    registered: dict[int, Any] = {}
    handlers: list[Any] = []
    stop, finished = threading.Event(), threading.Event()
    exits: list[int] = []

    def session() -> int:
        raise OSError("not available")

    stops.install_windows(stop, finished, set_console_handler=handlers.append,
                          session_id=session, signals=lambda s, h: registered.__setitem__(s, h),
                          exit_now=exits.append)
    assert set(registered) == {signal.SIGINT, 21}  # SIGBREAK is 21 on Windows
    assert len(handlers) == 1
    # The shutdown, done as soon as the stop is asked for: the handler need not wait out its
    # grace (4.5 s) for a drain nobody runs.
    drainer = threading.Thread(target=lambda: stop.wait(5) and finished.set(), daemon=True)
    drainer.start()
    assert handlers[0](stops.CTRL_LOGOFF) is True  # session unknown: interactive, so it stops
    assert stop.is_set() and finished.is_set()
    drainer.join(5)
    registered[signal.SIGINT](signal.SIGINT, None)  # a second request: exit at once
    assert exits == [128 + signal.SIGINT]


# --- the boot instant -------------------------------------------------------------------------

WALL = datetime(2026, 11, 25, 12, 0, 0, tzinfo=timezone.utc).timestamp()


def test_windows_boot_instant_is_wall_clock_minus_the_tick_count() -> None:
    assert boot_instant_id(WALL, 3_600_000) == "windows-boot:2026-11-25T11:00:00Z"
    assert boot_instant_id(WALL + 0.9, 3_600_000) == "windows-boot:2026-11-25T11:00:00Z"
    # 60 days up: past 2**32 ms, where the 32-bit GetTickCount wrapped; the 64-bit one does not.
    sixty_days = 60 * 86_400_000
    assert sixty_days > 2**32
    expected = datetime(2026, 9, 26, 12, 0, 0, tzinfo=timezone.utc)
    assert boot_instant_id(WALL, sixty_days) == f"windows-boot:{expected:%Y-%m-%dT%H:%M:%SZ}"


def test_windows_boot_instant_is_stable_across_readings_and_clock_corrections() -> None:
    readings = [boot_instant_id(WALL + s, 3_600_000 + int(s * 1000) + jitter)
                for s, jitter in ((0, 0), (1.0, 7), (60.5, -3), (3600, 999))]
    assert all(same_boot(readings[0], r) for r in readings)
    corrected = boot_instant_id(WALL + SAME_BOOT_TOLERANCE - 1, 3_600_000)  # a time sync
    assert same_boot(readings[0], corrected)
    rebooted = boot_instant_id(WALL + 120, 10_000)  # up 10 s, two minutes later
    assert not same_boot(readings[0], rebooted)
    # Linux ids compare as they are; a mix never matches.
    assert same_boot("b1", "b1") and not same_boot("b1", readings[0])
    assert same_boot(None, None) and not same_boot(None, readings[0])


def test_windows_restart_in_the_same_boot_carries_the_saved_instant_on() -> None:
    saved = boot_instant_id(WALL, 3_600_000)
    again = boot_instant_id(WALL + 601.5, 4_200_000)  # ten minutes later, a second apart
    assert again != saved and continuing(saved, again) == saved
    after_reboot = boot_instant_id(WALL + 900, 30_000)
    assert continuing(saved, after_reboot) == after_reboot
    assert continuing(None, again) == again and continuing("linux-id", "linux-id") == "linux-id"


def test_windows_host_boot_id_from_the_tick_count_unless_disabled() -> None:
    assert host_boot_id(None, wall=lambda: WALL, tick_ms=lambda: 1000) == (
        "windows-boot:2026-11-25T11:59:59Z")
    assert host_boot_id(None, enabled=False, wall=lambda: WALL, tick_ms=lambda: 1000) is None


def test_windows_boot_instant_proves_a_reboot_to_the_tracker() -> None:
    reboot = ScheduledEvent("R1", "Scheduled", "Reboot", "VirtualMachine", ("vm1",),
                            datetime(2099, 1, 1, tzinfo=timezone.utc), source="Platform")
    t0 = datetime(2026, 11, 25, 12, 0, tzinfo=timezone.utc)
    before = boot_instant_id(WALL, 3_600_000)
    state, _ = track(TrackerState(), Document(1, (reboot,)), t0, gap_threshold=3,
                     evidence=Evidence(boot_id=before, vm_name="vm1"))
    after = boot_instant_id(WALL + 300, 60_000)  # back up for a minute, five minutes later
    _, out = track(replace(state, interrupted=True), Document(2, ()),
                   t0 + timedelta(minutes=5), gap_threshold=3,
                   evidence=Evidence(boot_id=after, vm_name="vm1"))
    assert [(t.kind.value, t.outcome_basis) for t in out] == [("completed", "host_rebooted")]


class CountingEvent(threading.Event):
    """An event that records each wait's timeout and is set on the third one."""

    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.timeouts.append(timeout)
        if len(self.timeouts) == 3:
            self.set()
        return self.is_set()


def test_windows_main_thread_waits_in_short_steps_so_ctrl_break_is_handled() -> None:
    # python/cpython#74157: an untimed wait never returns to the interpreter on Windows, so
    # Python's Ctrl-C/Ctrl-Break handlers would never run.
    event = CountingEvent()
    stops.wait_for(event, windows=True, wake=0.25)
    assert event.timeouts == [0.25, 0.25, 0.25]
