"""Environment files in systemd's ``EnvironmentFile=`` syntax (``check-config --env-file`` and
``--unit``).

The service reads its configuration from such a file (config/systemd/), so ``check-config``
must read it the way systemd does, or it checks something else than what the service gets. The
syntax is systemd.exec(5)'s, as systemd's own parser implements it (``parse_env_file_internal``
in src/basic/env-file.c, v254 and later; Debian 12's 252 differs only in a comment line that
ends with a backslash, which there swallows the next line too):

* a line is ``KEY=VALUE``; blank lines, lines starting with ``#`` or ``;`` (after blanks) and
  lines without ``=`` are ignored; blanks around the key and around an unquoted value go;
* an unquoted value keeps its inner blanks; a backslash keeps the next character, and a
  backslash at the end of a line joins the next line;
* ``'...'`` keeps everything verbatim, newlines included; ``"..."`` too, except that a
  backslash before ``"``, ``\\``, `````` ` ````` or ``$`` keeps just that character, before a
  newline joins the lines, before anything else stays a backslash; a quoted part and what
  follows it on the line are joined (``A="x"y`` is ``xy``);
* a later assignment of a key replaces an earlier one;
* the parser works on bytes and checks UTF-8 per key and per value, when it hands the pair on
  (``check_utf8ness_and_warn`` in env-file.c): a key or a value that is not UTF-8 fails the
  whole file, whatever its log line says ("ignoring"), and the service does not start; a
  comment or a line without ``=`` is never decoded, so a Latin-1 byte there is no error.
  systemd's UTF-8 is strict: no surrogates and no noncharacters (U+FDD0..U+FDEF, U+xFFFE,
  U+xFFFF: ``unichar_is_valid`` in src/basic/utf8.c);
* a NUL byte anywhere refuses the file (``read_full_stream`` cannot tell where it ends);
* systemd then drops (with a log line nobody reads) an assignment whose name is not a valid
  variable name: those come back as :attr:`EnvFile.ignored`, to be said. A value may hold any
  control character but NUL since systemd 248 (pull request 18129, ``env_value_is_valid``;
  every distribution docs/vm.md names ships a later one): the exporter's own checks judge it.

Pure: bytes in, values and notes out; :func:`read_env_file` adds the file, read with the bounds
:func:`read_bounded` keeps.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from scheduled_events_exporter.redact import scrub

_BLANK: Final = frozenset(b" \t\n\r")
_NEWLINE: Final = frozenset(b"\n\r")
_COMMENT: Final = frozenset(b"#;")
#: What a backslash escapes inside double quotes (systemd's SHELL_NEED_ESCAPE).
_DOUBLE_QUOTE_ESCAPES: Final = frozenset(b'"\\`$')
_VALID_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Code points systemd's UTF-8 check refuses although Python decodes them (``unichar_is_valid``).
_NONCHARACTER = re.compile("[\ufdd0-\ufdef" + "".join(
    chr(plane << 16 | low) for plane in range(17) for low in (0xFFFE, 0xFFFF)) + "]")
#: The most check-config reads of one file. systemd stops at 64 MiB; a configuration file of
#: more than this is a mistake (or a device or a link to one), not something to parse.
MAX_FILE_BYTES: Final = 4 * 1024 * 1024
_MIB: Final = MAX_FILE_BYTES // (1024 * 1024)
_KINDS: Final = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                 (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class EnvFileError(ValueError):
    """The file cannot be used at all (unreadable, not UTF-8, a NUL byte): systemd refuses it
    too, and the service does not start."""


@dataclass(frozen=True, slots=True)
class EnvFile:
    """What an environment file sets, and the assignments systemd would drop."""

    values: dict[str, str]
    #: One note per dropped assignment: ``line N: ...`` (never its value: it may be a secret).
    ignored: tuple[str, ...] = ()


def systemd_utf8(data: bytes) -> str:
    """``data`` decoded as systemd's ``utf8_is_valid`` accepts it; UnicodeDecodeError (its
    ``start`` the offending byte) for what systemd refuses, noncharacters included."""
    text = data.decode("utf-8")
    bad = _NONCHARACTER.search(text)
    if bad is not None:
        at = len(text[:bad.start()].encode("utf-8"))
        raise UnicodeDecodeError("utf-8", data, at, at + len(bad.group().encode("utf-8")),
                                 f"the noncharacter U+{ord(bad.group()):04X}")
    return text


def assignment_problem(name: str) -> str:
    """Why systemd drops an assignment to ``name`` from a service's environment
    (``env_assignment_is_valid`` in src/basic/env-util.c: the name; a UTF-8 value of any
    characters passes), or "" when it keeps it."""
    if not _VALID_NAME.fullmatch(name):
        # (A byte order mark is no blank to systemd: it becomes part of the first name.)
        why = ("starts with a byte order mark; save the file without it" if
               name.startswith("\ufeff") else "expected letters, digits and '_', not "
               "starting with a digit")
        return f"{scrub(name[:40])!r} is not a valid variable name ({why})"
    return ""


def parse_env_file(text: str) -> EnvFile:
    """The assignments of ``text`` as systemd's ``EnvironmentFile=`` reads them (a lone
    surrogate in ``text`` stands for bytes that are not UTF-8)."""
    return parse_env_bytes(text.encode("utf-8", "surrogatepass"))


def parse_env_bytes(data: bytes) -> EnvFile:
    """The assignments of the file ``data`` as systemd's ``EnvironmentFile=`` reads them;
    :class:`EnvFileError` when systemd refuses the whole file."""
    if b"\0" in data:
        line = data.count(b"\n", 0, data.index(b"\0")) + 1
        raise EnvFileError(f"line {line}: a NUL byte; expected a text file")
    pairs: list[tuple[int, bytes, bytes]] = []
    state = "pre_key"
    key = bytearray()
    value = bytearray()
    key_end = value_end = -1  # where trailing blanks start, or -1
    line = start = 1

    def push() -> None:
        name = bytes(key[:key_end] if key_end >= 0 else key)
        raw = bytes(value[:value_end] if state == "value" and value_end >= 0 else value)
        pairs.append((start, name, raw))

    for char in data:
        if state == "pre_key":
            if char in _COMMENT:
                state = "comment"
            elif char not in _BLANK:
                state, key, key_end, start = "key", bytearray((char,)), -1, line
        elif state == "key":
            if char in _NEWLINE:
                state = "pre_key"  # a line without '=': ignored, never decoded
            elif char == 0x3D:  # =
                state, value, value_end = "pre_value", bytearray(), -1
            else:
                if char not in _BLANK:
                    key_end = -1
                elif key_end < 0:
                    key_end = len(key)
                key.append(char)
        elif state == "pre_value":
            if char in _NEWLINE:
                push()
                state = "pre_key"
            elif char == 0x27:  # '
                state = "single"
            elif char == 0x22:  # "
                state = "double"
            elif char == 0x5C:  # backslash
                state = "value_escape"
            elif char not in _BLANK:
                state = "value"
                value.append(char)
        elif state == "value":
            if char in _NEWLINE:
                push()
                state = "pre_key"
            elif char == 0x5C:
                state, value_end = "value_escape", -1
            else:
                if char not in _BLANK:
                    value_end = -1
                elif value_end < 0:
                    value_end = len(value)
                value.append(char)
        elif state == "value_escape":
            state = "value"
            if char not in _NEWLINE:
                value.append(char)
        elif state == "single":
            if char == 0x27:
                state = "pre_value"
            else:
                value.append(char)
        elif state == "double":
            if char == 0x22:
                state = "pre_value"
            elif char == 0x5C:
                state = "double_escape"
            else:
                value.append(char)
        elif state == "double_escape":
            state = "double"
            if char in _DOUBLE_QUOTE_ESCAPES:
                value.append(char)
            elif char != 0x0A:
                value.extend((0x5C, char))
        elif state == "comment":
            if char == 0x5C:
                state = "comment_escape"
            elif char in _NEWLINE:
                state = "pre_key"
        elif state == "comment_escape":
            state = "pre_key" if char in _NEWLINE else "comment"
        if char == 0x0A:
            line += 1
    if state in ("pre_value", "value", "value_escape", "single", "double", "double_escape"):
        push()
    values: dict[str, str] = {}
    ignored = []
    for number, raw_name, raw_value in pairs:
        name = _decoded(raw_name, number, "a variable name")
        text_value = _decoded(raw_value, number, f"the value of {scrub(name[:40])}")
        problem = assignment_problem(name)
        if problem:
            ignored.append(f"line {number}: {problem}; systemd ignores the line")
        else:
            values.pop(name, None)  # a later assignment wins, and its place in the order
            values[name] = text_value
    return EnvFile(values, tuple(ignored))


def _decoded(raw: bytes, line: int, what: str) -> str:
    try:
        return systemd_utf8(raw)
    except UnicodeDecodeError as exc:
        byte = (f"{exc.reason} at byte {exc.start + 1}" if exc.reason.startswith("the non")
                else f"byte {raw[exc.start]:#04x}")
        raise EnvFileError(f"line {line}: not UTF-8 in {what} ({byte}): systemd refuses the "
                           "whole file; expected UTF-8 text (a comment may hold any bytes)"
                           ) from None


def read_bounded(path: Path, *, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them; OSError (with a
    ``strerror`` to show) otherwise. A FIFO is not waited on, a device not read forever."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(21, "Is a directory")
        kind = next((what for test, what in _KINDS if test(mode)), "")
        if kind:
            raise OSError(0, f"{kind}, not a regular file")  # errno 0: our refusal
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise OSError(0, f"larger than {limit // (1024 * 1024)} MiB")  # errno 0: ours
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_env_file(path: Path) -> EnvFile:
    """:func:`parse_env_bytes` of the file at ``path``; :class:`EnvFileError` (one line that
    says what was expected) when it cannot be read or systemd would refuse it."""
    try:
        data = read_bounded(path)
    except OSError as exc:
        if isinstance(exc, PermissionError):
            expected = ("a readable file (the service's file is mode 0600: run check-config "
                        "with sudo)")
        elif exc.errno:  # missing, a directory, ...
            expected = "a readable file"
        else:  # what read_bounded refuses: a FIFO, a device, too large
            expected = f"an environment file (a regular file of at most {_MIB} MiB)"
        raise EnvFileError(f"{exc.strerror or exc}; expected {expected}") from None
    return parse_env_bytes(data)
