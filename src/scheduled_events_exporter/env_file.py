"""Environment files in systemd's ``EnvironmentFile=`` syntax (``check-config --env-file``).

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
* the file must be UTF-8; systemd then drops (with a log line nobody reads) an assignment
  whose name is not a valid variable name or whose value holds a control character other than
  tab and newline: those come back as :attr:`EnvFile.ignored`, to be said.

Pure: text in, values and notes out; :func:`read_env_file` adds the file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from scheduled_events_exporter.redact import scrub

_BLANK: Final = " \t\n\r"
_NEWLINE: Final = "\n\r"
_COMMENT: Final = "#;"
#: What a backslash escapes inside double quotes (systemd's SHELL_NEED_ESCAPE).
_DOUBLE_QUOTE_ESCAPES: Final = '"\\`$'
_VALID_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


class EnvFileError(ValueError):
    """The file cannot be used at all (unreadable, not UTF-8, a NUL byte): systemd refuses it
    too, and the service does not start."""


@dataclass(frozen=True, slots=True)
class EnvFile:
    """What an environment file sets, and the assignments systemd would drop."""

    values: dict[str, str]
    #: One note per dropped assignment: ``line N: ...`` (never its value: it may be a secret).
    ignored: tuple[str, ...] = ()


def parse_env_file(text: str) -> EnvFile:
    """The assignments of ``text`` as systemd's ``EnvironmentFile=`` reads them."""
    if "\0" in text:
        line = text.count("\n", 0, text.index("\0")) + 1
        raise EnvFileError(f"line {line}: a NUL byte; expected a text file")
    pairs: list[tuple[int, str, str]] = []
    state = "pre_key"
    key: list[str] = []
    value: list[str] = []
    key_end = value_end = -1  # where trailing blanks start, or -1
    line = start = 1

    def push() -> None:
        name = "".join(key[:key_end] if key_end >= 0 else key)
        text_value = "".join(value[:value_end] if state == "value" and value_end >= 0
                             else value)
        pairs.append((start, name, text_value))

    for char in text:
        if state == "pre_key":
            if char in _COMMENT:
                state = "comment"
            elif char not in _BLANK:
                state, key, key_end, start = "key", [char], -1, line
        elif state == "key":
            if char in _NEWLINE:
                state = "pre_key"  # a line without '=': ignored
            elif char == "=":
                state, value, value_end = "pre_value", [], -1
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
            elif char == "'":
                state = "single"
            elif char == '"':
                state = "double"
            elif char == "\\":
                state = "value_escape"
            elif char not in _BLANK:
                state = "value"
                value.append(char)
        elif state == "value":
            if char in _NEWLINE:
                push()
                state = "pre_key"
            elif char == "\\":
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
            if char == "'":
                state = "pre_value"
            else:
                value.append(char)
        elif state == "double":
            if char == '"':
                state = "pre_value"
            elif char == "\\":
                state = "double_escape"
            else:
                value.append(char)
        elif state == "double_escape":
            state = "double"
            if char in _DOUBLE_QUOTE_ESCAPES:
                value.append(char)
            elif char != "\n":
                value.extend(("\\", char))
        elif state == "comment":
            if char == "\\":
                state = "comment_escape"
            elif char in _NEWLINE:
                state = "pre_key"
        elif state == "comment_escape":
            state = "pre_key" if char in _NEWLINE else "comment"
        if char == "\n":
            line += 1
    if state in ("pre_value", "value", "value_escape", "single", "double", "double_escape"):
        push()
    values: dict[str, str] = {}
    ignored = []
    for number, name, text_value in pairs:
        if not _VALID_NAME.fullmatch(name):
            # (A byte order mark is no blank to systemd: it becomes part of the first name.)
            why = ("starts with a byte order mark; save the file without it" if
                   name.startswith("\ufeff") else "expected letters, digits and '_', not "
                   "starting with a digit")
            ignored.append(f"line {number}: {scrub(name[:40])!r} is not a valid variable "
                           f"name ({why}); systemd ignores the line")
        elif _CONTROL.search(text_value):
            ignored.append(f"line {number}: the value of {name} holds a control character; "
                           "systemd ignores the line")
        else:
            values.pop(name, None)  # a later assignment wins, and its place in the order
            values[name] = text_value
    return EnvFile(values, tuple(ignored))


def read_env_file(path: Path) -> EnvFile:
    """:func:`parse_env_file` of the file at ``path``; :class:`EnvFileError` (one line that
    says what was expected) when it cannot be read or is not UTF-8 text."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        hint = (" (the service's file is mode 0600: run check-config with sudo)"
                if isinstance(exc, PermissionError) else "")
        raise EnvFileError(f"{exc.strerror or exc}; expected a readable file{hint}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise EnvFileError(f"line {line}: not UTF-8 (byte {data[exc.start]:#04x}); expected "
                           "a UTF-8 text file, as systemd does") from None
    return parse_env_file(text)
