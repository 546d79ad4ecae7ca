"""The Windows API calls the exporter needs, through ctypes (no pywin32 dependency).

Imported only on Windows, by the Windows implementations of the seams; everything here is a
thin binding that raises ``OSError`` (with the Windows error code) on failure. The logic that
decides what to call lives in the seam modules, where tests inject fakes of these functions.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

if sys.platform == "win32":
    import ctypes
    from ctypes import wintypes

    _kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    _advapi32 = ctypes.WinDLL("advapi32", use_last_error=True)
    _ntdll = ctypes.WinDLL("ntdll")

    _kernel32.GetTickCount64.restype = ctypes.c_ulonglong
    _kernel32.GetTickCount64.argtypes = []
    _kernel32.CreateJobObjectW.restype = wintypes.HANDLE
    _kernel32.CreateJobObjectW.argtypes = [wintypes.LPVOID, wintypes.LPCWSTR]
    _kernel32.AssignProcessToJobObject.restype = wintypes.BOOL
    _kernel32.AssignProcessToJobObject.argtypes = [wintypes.HANDLE, wintypes.HANDLE]
    _kernel32.TerminateJobObject.restype = wintypes.BOOL
    _kernel32.TerminateJobObject.argtypes = [wintypes.HANDLE, wintypes.UINT]
    _kernel32.OpenProcess.restype = wintypes.HANDLE
    _kernel32.OpenProcess.argtypes = [wintypes.DWORD, wintypes.BOOL, wintypes.DWORD]
    _kernel32.CloseHandle.restype = wintypes.BOOL
    _kernel32.CloseHandle.argtypes = [wintypes.HANDLE]
    _kernel32.ProcessIdToSessionId.restype = wintypes.BOOL
    _kernel32.ProcessIdToSessionId.argtypes = [wintypes.DWORD, ctypes.POINTER(wintypes.DWORD)]
    _kernel32.CreateDirectoryW.restype = wintypes.BOOL
    _kernel32.CreateDirectoryW.argtypes = [wintypes.LPCWSTR, wintypes.LPVOID]
    _kernel32.LocalFree.restype = wintypes.HLOCAL
    _kernel32.LocalFree.argtypes = [wintypes.HLOCAL]
    _HANDLER = ctypes.WINFUNCTYPE(wintypes.BOOL, wintypes.DWORD)
    _kernel32.SetConsoleCtrlHandler.restype = wintypes.BOOL
    _kernel32.SetConsoleCtrlHandler.argtypes = [_HANDLER, wintypes.BOOL]
    _advapi32.ConvertStringSecurityDescriptorToSecurityDescriptorW.restype = wintypes.BOOL
    _advapi32.ConvertStringSecurityDescriptorToSecurityDescriptorW.argtypes = [
        wintypes.LPCWSTR, wintypes.DWORD, ctypes.POINTER(wintypes.LPVOID),
        ctypes.POINTER(wintypes.ULONG)]
    _ntdll.NtResumeProcess.restype = ctypes.c_long
    _ntdll.NtResumeProcess.argtypes = [wintypes.HANDLE]

    class _SecurityAttributes(ctypes.Structure):
        _fields_ = [("nLength", wintypes.DWORD), ("lpSecurityDescriptor", wintypes.LPVOID),
                    ("bInheritHandle", wintypes.BOOL)]

    #: Handlers must stay referenced for as long as Windows may call them.
    _installed: list[object] = []

    def _fail(what: str) -> OSError:
        code = ctypes.get_last_error()
        return OSError(0, f"{what} failed: {ctypes.FormatError(code)}", None, code)

    def tick_count_ms() -> int:
        """Milliseconds since the system started (``GetTickCount64``; sleep included)."""
        return int(_kernel32.GetTickCount64())

    def create_job() -> int:
        """A new, unnamed job object's handle."""
        handle = _kernel32.CreateJobObjectW(None, None)
        if not handle:
            raise _fail("CreateJobObjectW")
        return int(handle)

    #: What the hook runner does with its process: put it in a job, resume it, end it.
    _PROCESS_RIGHTS = 0x0100 | 0x0800 | 0x0001  # SET_QUOTA | SUSPEND_RESUME | TERMINATE

    def open_process(pid: int) -> int:
        """A handle to process ``pid`` with the rights a job and a resume need."""
        handle = _kernel32.OpenProcess(_PROCESS_RIGHTS, False, pid)
        if not handle:
            raise _fail("OpenProcess")
        return int(handle)

    def assign_to_job(job: int, process: int) -> None:
        """Put a process (and everything it starts from now on) into the job."""
        if not _kernel32.AssignProcessToJobObject(job, process):
            raise _fail("AssignProcessToJobObject")

    def terminate_job(job: int) -> None:
        """Kill every process in the job."""
        if not _kernel32.TerminateJobObject(job, 1):
            raise _fail("TerminateJobObject")

    def close_handle(handle: int) -> None:
        """Close a handle (errors ignored: nothing to do about them)."""
        _kernel32.CloseHandle(handle)

    def resume_process(process: int) -> None:
        """Resume every thread of a process created suspended."""
        status = int(_ntdll.NtResumeProcess(process))
        if status != 0:
            raise OSError(0, f"NtResumeProcess failed: NTSTATUS {status & 0xFFFFFFFF:#x}")

    def session_id() -> int:
        """The Terminal Services session of this process (0: services)."""
        import os

        value = wintypes.DWORD()
        if not _kernel32.ProcessIdToSessionId(os.getpid(), ctypes.byref(value)):
            raise _fail("ProcessIdToSessionId")
        return int(value.value)

    def set_console_handler(handler: Callable[[int], bool]) -> None:
        """Call ``handler(event)`` for console control events (it runs on a thread Windows
        creates; returning True means handled)."""
        routine = _HANDLER(lambda event: bool(handler(int(event))))
        if not _kernel32.SetConsoleCtrlHandler(routine, True):
            raise _fail("SetConsoleCtrlHandler")
        _installed.append(routine)

    def create_private_directory(path: str, sddl: str) -> None:
        """Create one directory with the security descriptor ``sddl`` (not inherited)."""
        descriptor = wintypes.LPVOID()
        if not _advapi32.ConvertStringSecurityDescriptorToSecurityDescriptorW(
                sddl, 1, ctypes.byref(descriptor), None):
            raise _fail("ConvertStringSecurityDescriptorToSecurityDescriptorW")
        try:
            attributes = _SecurityAttributes(ctypes.sizeof(_SecurityAttributes),
                                             descriptor, False)
            if not _kernel32.CreateDirectoryW(path, ctypes.byref(attributes)):
                code = ctypes.get_last_error()
                if code == 183:  # ERROR_ALREADY_EXISTS
                    raise FileExistsError(17, "directory exists", path)
                raise OSError(0, f"CreateDirectoryW failed: {ctypes.FormatError(code)}",
                              path, code)
        finally:
            _kernel32.LocalFree(descriptor)
