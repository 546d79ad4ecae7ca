"""How the approval hook runs: its command line, what it inherits, its process tree.

A hook is a command line for the OS's shell (a ``str``) or an argument vector run without a
shell (a tuple of strings: Docker's exec form), for images that have no shell at all.

POSIX: ``/bin/sh -c COMMAND`` (or the argument vector itself) in a session of its own, so the
timeout kills the whole process group (``killpg``); stdin and stdout are pipes driven by one
``select`` loop (a background child that keeps stdout open never holds us).

Windows: ``COMMAND`` is PowerShell (Windows PowerShell 5.1, which every Windows Server has),
passed as ``-EncodedCommand`` (UTF-16LE, base64) so no quoting rule of ``cmd`` or of the C
runtime ever applies to it; an argument vector is started as given. It is started suspended in
a process group of its own and put into a job object before it runs a single instruction, so
every process it starts is in the job and the timeout kills them all (``TerminateJobObject``);
if the job cannot be made, ``taskkill /T /F`` kills the tree by parentage instead. Windows pipes
cannot be ``select``-ed: two threads feed stdin and collect stdout.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO, Final, Protocol, TypeAlias

#: A hook: a command line for the OS's shell, or an argument vector run without a shell.
Command: TypeAlias = "str | tuple[str, ...]"

#: The tail of the hook's output that is kept (a chatty hook costs no memory).
OUTPUT_TAIL: Final = 2048
#: Variables every hook inherits (beside SEE_EVENT_* and SEE_APPROVE_HOOK_ENV's list): enough
#: to run programs and read the locale; never the exporter's credentials.
POSIX_VARIABLES: Final = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG",
                                    "LANGUAGE", "TZ", "TMPDIR", "KUBERNETES_SERVICE_HOST",
                                    "KUBERNETES_SERVICE_PORT"})
#: What a Windows process needs to start at all (SystemRoot: sockets and PowerShell fail without
#: it) and to find its profile, temp and module paths. Names compare case-insensitively there.
WINDOWS_VARIABLES: Final = frozenset({
    "PATH", "PATHEXT", "SYSTEMROOT", "WINDIR", "SYSTEMDRIVE", "COMSPEC", "TEMP", "TMP",
    "USERPROFILE", "USERNAME", "USERDOMAIN", "COMPUTERNAME", "APPDATA", "LOCALAPPDATA",
    "PROGRAMDATA", "PROGRAMFILES", "PROGRAMFILES(X86)", "PROGRAMW6432", "COMMONPROGRAMFILES",
    "PSMODULEPATH", "NUMBER_OF_PROCESSORS", "PROCESSOR_ARCHITECTURE", "OS", "TZ"})
#: PowerShell's command line is at most 32767 characters; -EncodedCommand takes 8/3 per char.
MAX_WINDOWS_COMMAND: Final = 8000
_CREATE_SUSPENDED: Final = 0x00000004
_CREATE_NEW_PROCESS_GROUP: Final = 0x00000200
_CREATE_NO_WINDOW: Final = 0x08000000


class Running(Protocol):
    """A started hook."""

    @property
    def proc(self) -> subprocess.Popen[bytes]: ...

    def exchange(self, data: bytes, output: bytearray, stop: Callable[[], bool]) -> bool:
        """Feed ``data`` to stdin and collect output until the hook ends (True) or ``stop()``
        says to give up (False); ``output`` keeps only the last :data:`OUTPUT_TAIL` bytes."""

    def kill_tree(self) -> None:
        """Kill the hook and every process it started; reap the hook."""

    def close(self) -> None:
        """Release pipes and handles."""


class Shell(Protocol):
    """The OS's way to run a hook command line."""

    #: How the README and errors name it (``/bin/sh -c``, ``Windows PowerShell``).
    name: str
    #: Whether environment variable names ignore case (Windows).
    case_insensitive: bool

    def inherits(self, variable: str) -> bool:
        """Whether the hook inherits ``variable`` from the exporter by default."""

    def check(self, command: Command) -> str:
        """What is wrong with ``command`` as a hook here, or ``""``."""

    def start(self, command: Command, env: Mapping[str, str]) -> Running:
        """Start it (raises ``OSError`` or ``ValueError`` when it cannot start)."""


def check_argv(argv: tuple[str, ...], path: str | None) -> str:
    """An argument vector's program must exist where it will be looked for (``path``: the
    hook's PATH); said at start rather than at the first maintenance event."""
    if shutil.which(argv[0], path=path) is None:
        where = "is not an executable file" if os.sep in argv[0] or "/" in argv[0] else \
            f"is not found on PATH ({path or os.defpath})"
        return f"expected an executable program as the first element; {argv[0]!r} {where}"
    return ""


def keep_tail(buffer: bytearray, chunk: bytes) -> None:
    buffer += chunk
    del buffer[:-OUTPUT_TAIL]


# --- POSIX ----------------------------------------------------------------------------------

if sys.platform != "win32":  # (os.killpg, os.set_blocking and SIGKILL exist only there)
    import selectors
    import signal

    @dataclass
    class PosixRunning:
        proc: subprocess.Popen[bytes]

        def exchange(self, data: bytes, output: bytearray, stop: Callable[[], bool]) -> bool:
            proc, pending = self.proc, data
            assert proc.stdin is not None and proc.stdout is not None
            # One loop feeds stdin, collects output and watches the clock. Not communicate(): it
            # waits for EOF on stdout, which a background child (`nohup x &`) can hold open
            # long after the hook itself exited 0.
            with selectors.DefaultSelector() as sel:
                for pipe, mask in ((proc.stdin, selectors.EVENT_WRITE),
                                   (proc.stdout, selectors.EVENT_READ)):
                    os.set_blocking(pipe.fileno(), False)
                    sel.register(pipe, mask)
                while proc.poll() is None:
                    if stop():
                        return False
                    for key, _ in sel.select(0.05):
                        if key.fileobj is proc.stdin:
                            try:
                                pending = pending[os.write(proc.stdin.fileno(), pending):]
                            except BlockingIOError:
                                continue
                            except OSError:  # the hook does not read stdin: fine
                                pending = b""
                            if not pending:
                                sel.unregister(proc.stdin)
                                proc.stdin.close()
                        elif not _read_available(proc.stdout.fileno(), output):
                            sel.unregister(proc.stdout)
                _read_available(proc.stdout.fileno(), output)
            return True

        def kill_tree(self) -> None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                # The shell is not reaped yet, so its pid (the group id) cannot be reused.
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

        def close(self) -> None:
            for pipe in (self.proc.stdin, self.proc.stdout):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()

    def _read_available(fd: int, buffer: bytearray) -> bool:
        """Read what is available; False at EOF."""
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                return True
            except OSError:
                return False
            if not chunk:
                return False
            keep_tail(buffer, chunk)

    class PosixShell:
        name = "/bin/sh -c"
        case_insensitive = False

        def __init__(self, sh: str = "/bin/sh") -> None:
            self._sh = sh

        def inherits(self, variable: str) -> bool:
            return variable in POSIX_VARIABLES or variable.startswith("LC_")

        def check(self, command: Command) -> str:
            if isinstance(command, tuple):
                return check_argv(command, os.environ.get("PATH"))
            if not os.access(self._sh, os.X_OK):
                # A shell-less image (distroless): say which form or image works instead.
                return (f"a command line needs {self._sh}, which is not here (a shell-less "
                        "image); expected the exec form, a JSON array of strings such as "
                        '["/hooks/drain", "--grace", "60"], or the image with a shell (the '
                        "-shell tag)")
            # /bin/sh will run it; shlex catches the commonest breakage (an unclosed quote)
            # at start rather than at the first maintenance event.
            try:
                shlex.split(command)
            except ValueError as exc:
                return f"expected a command line for /bin/sh -c ({exc})"
            return ""

        def start(self, command: Command, env: Mapping[str, str]) -> Running:
            argv = list(command) if isinstance(command, tuple) else [self._sh, "-c", command]
            # Its own session (process group), so a timeout kills whatever it spawned too.
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, env=dict(env),
                                    start_new_session=True)
            return PosixRunning(proc)


# --- Windows --------------------------------------------------------------------------------

class JobApi(Protocol):
    """The Windows calls the hook's process tree needs (:mod:`.win32`; fakes in tests)."""

    def create_job(self) -> int: ...
    def open_process(self, pid: int) -> int: ...
    def assign_to_job(self, job: int, process: int) -> None: ...
    def terminate_job(self, job: int) -> None: ...
    def close_handle(self, handle: int) -> None: ...
    def resume_process(self, process: int) -> None: ...


def powershell_argv(command: str, system_root: str) -> list[str]:
    """Windows PowerShell running ``command`` as given: ``-EncodedCommand`` carries it in
    base64 (UTF-16LE), so no quoting rule applies on the way."""
    exe = os.path.join(system_root, "System32", "WindowsPowerShell", "v1.0", "powershell.exe")
    encoded = base64.b64encode(command.encode("utf-16-le")).decode("ascii")
    return [exe, "-NoLogo", "-NoProfile", "-NonInteractive", "-ExecutionPolicy", "Bypass",
            "-EncodedCommand", encoded]


@dataclass
class WindowsRunning:
    proc: subprocess.Popen[bytes]
    api: JobApi
    #: The job holding the hook's whole tree, or None (then taskkill /T walks the tree).
    job: int | None
    taskkill: Callable[[list[str]], object]
    _threads: list[threading.Thread] = field(default_factory=list)

    def exchange(self, data: bytes, output: bytearray, stop: Callable[[], bool]) -> bool:
        proc, lock = self.proc, threading.Lock()
        assert proc.stdin is not None and proc.stdout is not None
        stdin, stdout = proc.stdin, proc.stdout

        def feed() -> None:
            with contextlib.suppress(OSError):  # the hook does not read stdin: fine
                stdin.write(data)
            with contextlib.suppress(OSError):
                stdin.close()

        def collect() -> None:
            # Returns at EOF; a background process that keeps stdout open keeps this daemon
            # thread waiting, not the exporter.
            for chunk in iter(lambda: _read1(stdout), b""):
                with lock:
                    keep_tail(output, chunk)

        self._threads = [threading.Thread(target=t, name=f"hook-{t.__name__}", daemon=True)
                         for t in (feed, collect)]
        for thread in self._threads:
            thread.start()
        while proc.poll() is None:
            if stop():
                return False
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(0.05)
        self._threads[1].join(0.5)  # what the hook printed last
        return True

    def kill_tree(self) -> None:
        if self.job is not None:
            try:
                self.api.terminate_job(self.job)
            except OSError:
                self._taskkill()
        else:
            self._taskkill()
        with contextlib.suppress(OSError):
            self.proc.kill()  # already dead, normally; certain now
        self.proc.wait()

    def _taskkill(self) -> None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            self.taskkill(["taskkill", "/T", "/F", "/PID", str(self.proc.pid)])

    def close(self) -> None:
        if self.job is not None:
            self.api.close_handle(self.job)
            self.job = None
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


def _read1(stream: IO[bytes]) -> bytes:
    try:
        return stream.read1(65536)  # type: ignore[attr-defined, no-any-return]
    except (OSError, ValueError):
        return b""


class WindowsShell:
    """PowerShell hooks in a job object; ``api``, ``popen`` and ``taskkill`` are injectable."""

    name = "Windows PowerShell"
    case_insensitive = True

    def __init__(self, api: JobApi, *,
                 popen: Callable[..., subprocess.Popen[bytes]] = subprocess.Popen,
                 taskkill: Callable[[list[str]], object] = lambda argv: subprocess.run(
                     argv, capture_output=True, timeout=30, check=False)) -> None:
        self._api, self._popen, self._taskkill = api, popen, taskkill

    def inherits(self, variable: str) -> bool:
        return variable.upper() in WINDOWS_VARIABLES or variable.upper().startswith("LC_")

    def check(self, command: Command) -> str:
        if isinstance(command, tuple):
            return check_argv(command, os.environ.get("PATH"))
        if len(command) > MAX_WINDOWS_COMMAND:
            return (f"expected a PowerShell command of at most {MAX_WINDOWS_COMMAND} characters, "
                    f"got {len(command)} (put a longer one in a .ps1 file and call it: "
                    f"& 'C:\\path\\hook.ps1')")
        return ""

    def start(self, command: Command, env: Mapping[str, str]) -> Running:
        system_root = next((v for k, v in env.items() if k.upper() == "SYSTEMROOT"),
                           r"C:\Windows")
        argv = list(command) if isinstance(command, tuple) else powershell_argv(command,
                                                                                 system_root)
        proc = self._popen(
            argv, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=dict(env),
            # Suspended until it is in the job, so nothing it starts can escape the job; its
            # own process group, so the Ctrl-C that stops the exporter does not reach it.
            creationflags=_CREATE_SUSPENDED | _CREATE_NEW_PROCESS_GROUP | _CREATE_NO_WINDOW)
        running = WindowsRunning(proc, self._api, None, self._taskkill)
        try:
            # A handle of our own (OpenProcess), not subprocess's private one.
            handle = self._api.open_process(proc.pid)
        except OSError:
            running.kill_tree()
            running.close()
            raise
        try:
            try:
                running.job = self._api.create_job()
                self._api.assign_to_job(running.job, handle)
            except OSError:
                if running.job is not None:
                    self._api.close_handle(running.job)
                running.job = None  # taskkill /T at the timeout instead
            self._api.resume_process(handle)
        except OSError:
            running.kill_tree()
            running.close()
            raise
        finally:
            self._api.close_handle(handle)
        return running


class _Win32Jobs:
    """:class:`JobApi` on the real Windows API."""

    def __init__(self) -> None:
        if sys.platform != "win32":
            raise OSError("job objects exist only on Windows")
        from scheduled_events_exporter.platforms import win32

        self.create_job = win32.create_job
        self.open_process = win32.open_process
        self.assign_to_job = win32.assign_to_job
        self.terminate_job = win32.terminate_job
        self.close_handle = win32.close_handle
        self.resume_process = win32.resume_process


# The implementation for this OS, chosen once.
if sys.platform == "win32":
    SHELL: Final[Shell] = WindowsShell(_Win32Jobs())
else:
    SHELL: Final[Shell] = PosixShell()

