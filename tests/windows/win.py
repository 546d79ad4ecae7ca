"""Windows API calls the real-Windows tests use to look at what the exporter did (security
descriptors, processes, links); the exporter's own bindings are in ``platforms/win32.py``.
Imported only by the modules of this package, after they have skipped on other systems."""

from __future__ import annotations

import sys

if sys.platform != "win32":
    raise ImportError("tests.windows.win is for Windows only")

import ctypes
import os
import re
import subprocess
from ctypes import wintypes
from dataclasses import dataclass
from pathlib import Path

import pytest

_advapi32 = ctypes.WinDLL("advapi32", use_last_error=True)
_kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)

_advapi32.GetNamedSecurityInfoW.restype = wintypes.DWORD
_advapi32.GetNamedSecurityInfoW.argtypes = [
    wintypes.LPCWSTR, ctypes.c_int, wintypes.DWORD, ctypes.POINTER(ctypes.c_void_p),
    ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p),
    ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p)]
_advapi32.ConvertSecurityDescriptorToStringSecurityDescriptorW.restype = wintypes.BOOL
_advapi32.ConvertSecurityDescriptorToStringSecurityDescriptorW.argtypes = [
    ctypes.c_void_p, wintypes.DWORD, wintypes.DWORD, ctypes.POINTER(ctypes.c_void_p),
    ctypes.POINTER(wintypes.ULONG)]
_kernel32.LocalFree.restype = ctypes.c_void_p
_kernel32.LocalFree.argtypes = [ctypes.c_void_p]
_kernel32.OpenProcess.restype = wintypes.HANDLE
_kernel32.OpenProcess.argtypes = [wintypes.DWORD, wintypes.BOOL, wintypes.DWORD]
_kernel32.WaitForSingleObject.restype = wintypes.DWORD
_kernel32.WaitForSingleObject.argtypes = [wintypes.HANDLE, wintypes.DWORD]
_kernel32.CloseHandle.restype = wintypes.BOOL
_kernel32.CloseHandle.argtypes = [wintypes.HANDLE]

_SE_FILE_OBJECT = 1
_DACL_SECURITY_INFORMATION = 0x4
_SDDL_REVISION_1 = 1
_SYNCHRONIZE = 0x00100000
_PROCESS_QUERY_LIMITED_INFORMATION = 0x1000
_WAIT_TIMEOUT = 0x102
_ERROR_ACCESS_DENIED = 5


@dataclass(frozen=True)
class Ace:
    """One access control entry as SDDL writes it: ``(A;OICI;FA;;;SY)``."""

    kind: str
    flags: str
    rights: str
    trustee: str


def dacl_sddl(path: Path) -> str:
    """The DACL of ``path`` in SDDL (``D:P(A;OICI;FA;;;SY)...``), read from the file system."""
    descriptor = ctypes.c_void_p()
    status = _advapi32.GetNamedSecurityInfoW(str(path), _SE_FILE_OBJECT,
                                             _DACL_SECURITY_INFORMATION, None, None, None,
                                             None, ctypes.byref(descriptor))
    if status != 0:
        raise ctypes.WinError(status)
    try:
        text = ctypes.c_void_p()
        if not _advapi32.ConvertSecurityDescriptorToStringSecurityDescriptorW(
                descriptor, _SDDL_REVISION_1, _DACL_SECURITY_INFORMATION, ctypes.byref(text),
                None):
            raise ctypes.WinError(ctypes.get_last_error())
        try:
            return ctypes.wstring_at(text)
        finally:
            _kernel32.LocalFree(text)
    finally:
        _kernel32.LocalFree(descriptor)


def dacl(path: Path) -> tuple[str, list[Ace]]:
    """The DACL's control flags (``P``: protected, nothing inherited; ``AI``) and its entries."""
    sddl = dacl_sddl(path)
    assert sddl.startswith("D:"), sddl
    control = sddl[2:].split("(", 1)[0]
    aces = []
    for body in re.findall(r"\(([^)]*)\)", sddl):
        fields = body.split(";")
        aces.append(Ace(fields[0], fields[1], fields[2], fields[5]))
    return control, aces


def icacls(path: Path) -> str:
    """What ``icacls`` shows (for failure messages: names in the system's language)."""
    done = subprocess.run(["icacls", str(path)], capture_output=True, text=True, check=False,
                          timeout=30)
    return done.stdout + done.stderr


def process_running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not ended."""
    handle = _kernel32.OpenProcess(_SYNCHRONIZE | _PROCESS_QUERY_LIMITED_INFORMATION, False,
                                   pid)
    if not handle:
        return ctypes.get_last_error() == _ERROR_ACCESS_DENIED  # there, but not ours to open
    try:
        return bool(_kernel32.WaitForSingleObject(handle, 0) == _WAIT_TIMEOUT)
    finally:
        _kernel32.CloseHandle(handle)


def junction(link: Path, target: Path) -> None:
    """A directory junction (no privilege needed, unlike a symbolic link)."""
    done = subprocess.run(["cmd", "/c", "mklink", "/J", str(link), str(target)],
                          capture_output=True, text=True, check=False, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr


def file_symlink(link: Path, target: Path) -> None:
    """A symbolic link to a file, or skip where this account may not create one (it needs
    SeCreateSymbolicLinkPrivilege or developer mode; CI runs as an administrator)."""
    try:
        os.symlink(target, link)
    except OSError as exc:
        pytest.skip(f"cannot create a symbolic link here: {exc}")
