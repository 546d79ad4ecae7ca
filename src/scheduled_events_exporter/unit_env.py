"""What a systemd unit gives its service's environment (``check-config --unit``): the
``[Service]`` section's ``Environment=``, ``EnvironmentFile=`` and ``UnsetEnvironment=``
lines, in systemd's order, with systemd's quoting, and the specifiers this module resolves.

What decided each rule (systemd 252, Debian 12's, whose man pages are quoted; its source where
the pages are silent):

* The unit file (systemd.syntax(7); ``config_parse`` and ``parse_line`` in
  src/shared/conf-parser.c). A line ends at LF, CR, CRLF or NUL (``read_line``); one longer
  than 1 MiB makes systemd refuse the unit. A line whose first non-blank is ``#`` or ``;`` is a
  comment and is never decoded, also between a line that ends in a backslash and its
  continuation. A line ending in an unescaped backslash goes on with the next one, the
  backslash becoming a space. A byte order mark at the start of a line is dropped, once. Every
  other line must be UTF-8 (no noncharacters either), or systemd refuses the unit. ``[Name]``
  opens a section (a header without ``]``, or with a quote, a backslash or a control character,
  refuses the unit); in ``Key=Value`` the blanks around both are dropped; keys are
  case-sensitive, and only ``[Service]``'s count here.
* Drop-ins: ``FILE.d/*.conf`` beside FILE, in name order, after FILE (systemd.unit(5),
  "Description"; what ``systemctl edit`` writes); one that is a link to /dev/null is masked.
  Drop-ins in other directories (``/run/systemd/system``, ``/usr/lib/systemd/system``,
  ``service.d/``) are not read: ``systemctl cat`` lists every file systemd merges.
* ``Environment=`` (systemd.exec(5); ``config_parse_environ`` in src/core/load-fragment.c):
  an empty value resets the list. Otherwise the value is split into words at blanks
  (``extract_first_word`` with ``EXTRACT_CUNESCAPE|EXTRACT_UNQUOTE``, src/basic/extract-word.c):
  quotes, single or double and anywhere in a word, keep blanks in the word and are removed;
  the C escapes of systemd.syntax(7), "Quoting" (``\\a \\b \\f \\n \\r \\t \\v \\\\ \\" \\'
  \\s \\xNN \\NNN \\uNNNN \\UNNNNNNNN``) are decoded inside and outside quotes. An unknown escape,
  an escaped NUL, a code point \\U refuses, a trailing backslash or an unclosed quote ends the
  line there: the words before it count, the rest is dropped ("Invalid syntax, ignoring").
  Each word then has its specifiers resolved (an unknown one drops the word: "Failed to
  resolve specifiers") and must be ``NAME=value`` with a valid name and a UTF-8 value, which
  may hold control characters since systemd 248 (else dropped: "Invalid environment
  assignment"; ``env_assignment_is_valid``). A later assignment of a name wins.
* ``EnvironmentFile=`` (systemd.exec(5); ``config_parse_unit_env_file``, and
  ``exec_context_load_environment`` in src/core/execute.c): an empty value resets the list;
  specifiers are resolved in the whole value; a leading ``-`` makes the file optional; the
  path must be absolute and normalised (no ``..``), else the line is dropped; a wildcard
  matches files in name order (glob(3)). At every start systemd reads them in order, each in
  the ``EnvironmentFile=`` syntax (:mod:`.env_file`). A later file wins over an earlier one,
  and files win over every ``Environment=``, wherever the lines stand ("Settings from these
  files override settings made with Environment="). A file that is missing or that systemd
  refuses (not UTF-8, a NUL byte) keeps the service from starting ("Failed to load
  environment files"), unless it is optional: then it is skipped whole.
* ``UnsetEnvironment=`` removes ``NAME``, or exactly ``NAME=value``, as the very last step.
  ``PassEnvironment=`` passes variables of the service manager's own environment, which
  check-config cannot see: it is said, not read.
* What else a system service gets (the manager's ``DefaultEnvironment=``, ``$PATH``,
  ``$STATE_DIRECTORY``, ...) holds no variable the exporter reads, and the shell check-config
  runs in gives the service nothing.

Specifiers (systemd.unit(5), "Specifiers") are resolved as the system manager resolves them:
``%%``; the directories ``%C`` /var/cache, ``%E`` /etc, ``%L`` /var/log, ``%S`` /var/lib,
``%t`` /run, ``%T`` /tmp, ``%V`` /var/tmp (PID 1 has no ``$TMPDIR``); the manager's user,
root: ``%h`` /root, ``%u`` and ``%g`` root, ``%U`` and ``%G`` 0; and the unit's name, from
FILE's: ``%n``, ``%N``, ``%p``, ``%i``, ``%j``. Those whose value depends on the running system
or on unescaping a name (:data:`REFUSED`) are refused with one line: check-config cannot tell
what systemd would put there. A letter systemd does not know drops the word, as systemd does.

Nothing here writes; no value appears in a note or an error (it may be a secret).
"""

from __future__ import annotations

import glob
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from scheduled_events_exporter.env_file import (
    EnvFileError,
    assignment_problem,
    parse_env_bytes,
    read_bounded,
    systemd_utf8,
)
from scheduled_events_exporter.redact import scrub

#: systemd's LONG_LINE_MAX: a longer line (continued or not) makes it refuse the unit.
MAX_LINE_BYTES: Final = 1024 * 1024
#: More files than this from one wildcard is a mistake, not a configuration.
MAX_MATCHES: Final = 64
_PATH_MAX: Final = 4096
_BLANKS: Final = " \t\n\r"  # systemd's WHITESPACE
_BLANK_BYTES: Final = frozenset(b" \t\n\r")
_LINE_END = re.compile(rb"\r\n|[\r\n\0]")
_BOM: Final = b"\xef\xbb\xbf"
_GLOB = re.compile(r"[*?[]")
#: The system manager's values of the specifiers that do not depend on the unit.
_FIXED: Final = {"C": "/var/cache", "E": "/etc", "L": "/var/log", "S": "/var/lib", "t": "/run",
                 "T": "/tmp", "V": "/var/tmp", "h": "/root", "u": "root", "g": "root",
                 "U": "0", "G": "0"}
#: Specifiers systemd knows and check-config does not resolve, with what they stand for.
REFUSED: Final = {
    "a": "the architecture", "A": "the OS image version", "b": "the boot ID",
    "B": "the OS build ID", "d": "the credentials directory", "f": "the unescaped file name",
    "H": "the host name", "I": "the unescaped instance name",
    "J": "the unescaped last part of the prefix", "l": "the short host name",
    "m": "the machine ID", "M": "the OS image ID", "o": "the OS ID",
    "P": "the unescaped prefix", "q": "the pretty host name", "s": "the manager user's shell",
    "v": "the kernel release", "w": "the OS version ID", "W": "the OS variant ID",
    "y": "the unit file's path", "Y": "the unit file's directory"}
SUPPORTED: Final = "%%, " + ", ".join(f"%{k}" for k in [*_FIXED, "n", "N", "p", "i", "j"])
_ESCAPES: Final = {ord("a"): b"\a", ord("b"): b"\b", ord("f"): b"\f", ord("n"): b"\n",
                   ord("r"): b"\r", ord("t"): b"\t", ord("v"): b"\v", ord("\\"): b"\\",
                   ord('"'): b'"', ord("'"): b"'", ord("s"): b" "}
_HEX: Final = frozenset(b"0123456789abcdefABCDEF")
_OCTAL: Final = frozenset(b"01234567")


class UnitError(ValueError):
    """check-config cannot say what the service gets: the unit cannot be read, systemd would
    refuse to load it or to start the service, or it needs what check-config cannot resolve."""


@dataclass(frozen=True, slots=True)
class UnitEnvironment:
    """The variables the unit gives its service, and what was dropped or skipped on the way."""

    values: dict[str, str]
    #: One line each, ``FILE:LINE: ...`` (never a value).
    notes: tuple[str, ...] = ()


class _UnknownSpecifier(Exception):
    pass


@dataclass
class _Unit:
    """The lists systemd builds from the unit's lines, in their order."""

    name: str
    environment: dict[str, str]
    files: list[tuple[str, bool, str]]  # path, optional, where it was set
    unset: list[str]
    notes: list[str]
    #: Where an ``ExecCondition=`` tests SEE_SINKS (the packaged unit's "no sink, no start").
    sinks_condition: str = ""


def read_unit_environment(path: Path) -> UnitEnvironment:
    """What the unit at ``path`` (and its drop-ins beside it) gives the service's environment,
    as systemd's system manager composes it at start; :class:`UnitError` (one line) when that
    cannot be told."""
    unit = _Unit(path.name, {}, [], [], [])
    try:
        data = read_bounded(path, limit=4 * MAX_LINE_BYTES)
    except OSError as exc:
        masked = (" (the unit is masked: a link to /dev/null)"
                  if path.resolve() == Path("/dev/null") else "")
        raise UnitError(f"{exc.strerror or exc}{masked}; expected a unit file") from None
    _parse(data, str(path), unit)
    dropins = path.parent / f"{path.name}.d"
    for dropin in sorted(dropins.glob("*.conf")) if dropins.is_dir() else []:
        if dropin.resolve() == Path("/dev/null"):
            continue  # a masked drop-in
        try:
            _parse(read_bounded(dropin, limit=4 * MAX_LINE_BYTES), str(dropin), unit)
        except OSError as exc:
            raise UnitError(f"drop-in {dropin}: {exc.strerror or exc}; expected a unit file "
                            "fragment") from None
    values = dict(unit.environment)
    for file_path, optional, where in unit.files:
        for name, value in _load(file_path, optional, where, unit.notes).items():
            values.pop(name, None)
            values[name] = value
    for entry in unit.unset:
        name, eq, value = entry.partition("=")
        if name in values and (not eq or values[name] == value):
            del values[name]
    if unit.sinks_condition and not values.get("SEE_SINKS", "").strip():
        unit.notes.append(f"{unit.sinks_condition}: the service does not start while SEE_SINKS "
                          "is empty, and neither the unit nor its environment files set it; "
                          "expected SEE_SINKS naming a sink (a run by hand would use console)")
    return UnitEnvironment(values, tuple(unit.notes))


def _lines(data: bytes, where: str) -> list[tuple[int, bytes]]:
    """The unit's lines after comments, continuations and the byte order mark, each with the
    number of the line it starts on."""
    found: list[tuple[int, bytes]] = []
    continued: bytearray | None = None
    start = 0
    bom = False
    for number, raw in enumerate(_LINE_END.split(data), 1):
        if len(raw) > MAX_LINE_BYTES:
            raise UnitError(f"{where}:{number}: a line longer than 1 MiB: systemd refuses to "
                            "load the unit")
        if raw.lstrip(b" \t\n\r")[:1] in (b"#", b";"):
            continue
        if not bom and raw.startswith(_BOM):
            raw, bom = raw[len(_BOM):], True
        if continued is None:
            text, start = bytearray(raw), number
        else:
            if len(continued) + len(raw) > MAX_LINE_BYTES:
                raise UnitError(f"{where}:{start}: a continued line longer than 1 MiB: systemd "
                                "refuses to load the unit")
            text = continued + raw
        trailing = len(text) - len(text.rstrip(b"\\"))
        if trailing % 2:
            text[-1] = 0x20  # the backslash becomes a space, and the next line goes on
            continued = text
            continue
        found.append((start, bytes(text)))
        continued = None
    if continued is not None:
        found.append((start, bytes(continued)))
    return found


def _parse(data: bytes, where: str, unit: _Unit) -> None:
    section = ""
    for number, raw in _lines(data, where):
        stripped = raw.strip(b" \t\n\r")
        if not stripped:
            continue
        try:
            line = systemd_utf8(stripped)
        except UnicodeDecodeError as exc:
            raise UnitError(f"{where}:{number}: not UTF-8 (byte {stripped[exc.start]:#04x}): "
                            "systemd refuses to load the unit; expected UTF-8 text (a comment "
                            "may hold any bytes)") from None
        if line.startswith("["):
            name = line[1:-1]
            if not line.endswith("]") or re.search(r"[\x00-\x1f\x7f\"'\\]", name):
                raise UnitError(f"{where}:{number}: an invalid section header: systemd refuses "
                                "to load the unit; expected [Name]")
            section = name
            continue
        key, eq, value = line.partition("=")
        key, value = key.strip(_BLANKS), value.strip(_BLANKS)
        if section != "Service" or not eq or not key:
            continue
        at = f"{where}:{number}: {key}="
        if key == "Environment":
            _environment(value, at, unit)
        elif key == "EnvironmentFile":
            _environment_file(value, at, unit)
        elif key == "UnsetEnvironment":
            if not value:
                unit.unset.clear()
            unit.unset.extend(_assignments(value, at, unit, names_too=True))
        elif key == "ExecCondition" and re.search(r"\$\{?SEE_SINKS\b", value):
            unit.sinks_condition = at
        elif key == "PassEnvironment" and value:
            names = " ".join(scrub(w.decode("utf-8", "replace")) for w in _words(value)[0])
            unit.notes.append(f"{at}: passes the service manager's own {names}, which "
                              "check-config cannot see: not checked")


def _environment(value: str, at: str, unit: _Unit) -> None:
    if not value:
        unit.environment.clear()  # an empty assignment resets the list
        return
    for assignment in _assignments(value, at, unit, names_too=False):
        name, _, text = assignment.partition("=")
        unit.environment.pop(name, None)
        unit.environment[name] = text


def _assignments(value: str, at: str, unit: _Unit, *, names_too: bool) -> list[str]:
    """The words of ``value`` that systemd keeps, as ``NAME=value`` (or ``NAME``, for
    ``UnsetEnvironment=``); each dropped word and a syntax error said in ``unit.notes``."""
    words, error = _words(value)
    kept = []
    for position, word in enumerate(words, 1):
        try:
            text = systemd_utf8(_resolve(word, unit.name, at))
        except _UnknownSpecifier as exc:
            unit.notes.append(f"{at}: word {position}: an unknown specifier %{exc}: systemd "
                              "ignores the word")
            continue
        except UnicodeDecodeError:
            unit.notes.append(f"{at}: word {position}: its escapes make it not UTF-8: systemd "
                              "ignores the word")
            continue
        name, eq, _ = text.partition("=")
        if eq or names_too:
            problem = assignment_problem(name)
        else:  # (the word is not shown: it may be a secret without its name)
            problem = "no '=' in it (expected NAME=value)"
        if problem:
            unit.notes.append(f"{at}: word {position}: {problem}; systemd ignores the word")
            continue
        kept.append(text)
    if error:
        unit.notes.append(f"{at}: {error}: systemd ignores the rest of the line (words "
                          f"{len(words) + 1} on)")
    return kept


def _words(value: str) -> tuple[list[bytes], str]:
    """The words of ``value`` as ``extract_first_word(EXTRACT_CUNESCAPE|EXTRACT_UNQUOTE)``
    gives them, up to the first syntax error, and that error ("" without one)."""
    data = value.encode("utf-8")
    words: list[bytes] = []
    i, size = 0, len(data)
    while True:
        while i < size and data[i] in _BLANK_BYTES:
            i += 1
        if i >= size:
            return words, ""
        word = bytearray()
        quote = 0
        while True:
            if i >= size:
                if quote:
                    return words, f"an unclosed {chr(quote)} quote"
                words.append(bytes(word))
                return words, ""
            char = data[i]
            if char == 0x5C:  # backslash
                got = _unescape(data, i + 1)
                if got is None:
                    return words, "an escape systemd does not accept (expected one of \\a \\b " \
                                  "\\f \\n \\r \\t \\v \\\\ \\\" \\' \\s \\xNN \\NNN \\uNNNN " \
                                  "\\UNNNNNNNN, not NUL; \\\\ for a backslash)"
                word += got[0]
                i += 1 + got[1]
            elif quote:
                if char == quote:
                    quote = 0
                else:
                    word.append(char)
                i += 1
            elif char in (0x22, 0x27):
                quote = char
                i += 1
            elif char in _BLANK_BYTES:
                words.append(bytes(word))
                break
            else:
                word.append(char)
                i += 1


def _unescape(data: bytes, i: int) -> tuple[bytes, int] | None:
    """What the escape whose letter is ``data[i]`` stands for, and how many bytes it took
    (``cunescape_one``, src/basic/escape.c); None for what systemd refuses."""
    if i >= len(data):
        return None  # a trailing backslash
    letter = data[i]
    if letter in _ESCAPES:
        return _ESCAPES[letter], 1
    digits = {ord("x"): 2, ord("u"): 4, ord("U"): 8}.get(letter)
    if digits is not None:
        text = data[i + 1:i + 1 + digits]
        if len(text) < digits or not set(text) <= _HEX:
            return None
        code = int(text, 16)
        if code == 0:
            return None  # no NUL
        if letter == ord("x"):
            return bytes((code,)), 1 + digits
        if letter == ord("U") and (code >= 0x110000 or 0xD800 <= code <= 0xDFFF
                                   or 0xFDD0 <= code <= 0xFDEF or code & 0xFFFE == 0xFFFE):
            return None  # unichar_is_valid
        # (\u may name a surrogate: its bytes are then no UTF-8, and the word is dropped.)
        return chr(code).encode("utf-8", "surrogatepass"), 1 + digits
    text = data[i:i + 3]
    if len(text) == 3 and set(text) <= _OCTAL:
        code = int(text, 8)
        return (bytes((code,)), 3) if 0 < code <= 255 else None
    return None


def _name_specifiers(unit: str) -> dict[str, str]:
    without_suffix = unit.rpartition(".")[0] or unit
    prefix, _, instance = without_suffix.partition("@")
    return {"n": unit, "N": without_suffix, "p": prefix, "i": instance,
            "j": prefix.rpartition("-")[2]}


def _resolve(data: bytes, unit: str, at: str) -> bytes:
    """``data`` with its specifiers resolved; :class:`_UnknownSpecifier` for a letter systemd
    does not know, :class:`UnitError` for one check-config does not resolve."""
    if b"%" not in data:
        return data
    table = {**_FIXED, **_name_specifiers(unit)}
    out = bytearray()
    i = 0
    while i < len(data):
        if data[i] != 0x25:
            out.append(data[i])
            i += 1
            continue
        if i + 1 == len(data):
            out.append(0x25)  # a stray % at the end stays
            break
        letter = chr(data[i + 1])
        if letter == "%":
            out.append(0x25)
        elif letter in table:
            out += table[letter].encode("utf-8")
        elif letter in REFUSED:
            raise UnitError(f"{at}: the specifier %{letter} ({REFUSED[letter]}) depends on the "
                            "running system, and check-config cannot tell what systemd puts "
                            f"there; it resolves {SUPPORTED}: expected one of those, or the "
                            "value written out")
        else:
            raise _UnknownSpecifier(scrub(letter))
        i += 2
    return bytes(out)


def _environment_file(value: str, at: str, unit: _Unit) -> None:
    if not value:
        unit.files.clear()
        return
    try:
        resolved = systemd_utf8(_resolve(value.encode("utf-8"), unit.name, at))
    except _UnknownSpecifier as exc:
        unit.notes.append(f"{at}: an unknown specifier %{exc}: systemd ignores the line")
        return
    optional = resolved.startswith("-")
    path = resolved[1:] if optional else resolved
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not path.startswith("/") or ".." in parts or len(path) > _PATH_MAX:
        why = ("is not absolute" if not path.startswith("/") else
               "holds '..'" if ".." in parts else "is longer than PATH_MAX")
        unit.notes.append(f"{at}: the path {why}: systemd ignores the line; expected an "
                          "absolute path")
        return
    unit.files.append(("/" + "/".join(parts), optional, at))


def _load(path: str, optional: bool, at: str, notes: list[str]) -> dict[str, str]:
    """The variables of the file (or the files a wildcard matches) as systemd loads them at
    start; an optional one that systemd would skip is said in ``notes``."""
    shown = f"{at}{'-' if optional else ''}{path}"
    matches = sorted(glob.glob(path)) if _GLOB.search(path) else [path]
    if len(matches) > MAX_MATCHES:
        raise UnitError(f"{shown}: matches {len(matches)} files; expected a few (at most "
                        f"{MAX_MATCHES})")
    skipped = ("optional ('-'): systemd skips it, and the service starts without its "
               "settings")
    if not matches:
        if optional:
            notes.append(f"{shown}: no file matches; {skipped}")
            return {}
        raise UnitError(f"{shown}: no file matches: systemd does not start the service "
                        "(\"Failed to load environment files\"); expected the file, or '-' "
                        "before the path")
    values: dict[str, str] = {}
    for match in matches:
        try:
            parsed = parse_env_bytes(read_bounded(Path(match)))
        except (FileNotFoundError, IsADirectoryError, EnvFileError) as exc:
            problem = exc.strerror if isinstance(exc, OSError) else str(exc)
            if optional:
                notes.append(f"{shown}: {problem}; {skipped}")
                continue
            raise UnitError(f"{shown}: {problem}; the path has no '-' before it, so systemd "
                            "does not start the service (\"Failed to load environment files\")"
                            ) from None
        except OSError as exc:
            expected = ("a readable file (systemd reads it as root: run check-config with sudo)"
                        if isinstance(exc, PermissionError) else "a readable file" if exc.errno
                        else "an environment file (a regular file of at most 4 MiB)")
            raise UnitError(f"{shown}: {exc.strerror or exc}; expected {expected}") from None
        notes.extend(f"{match}: {note}" for note in parsed.ignored)
        for name, value in parsed.values.items():
            values.pop(name, None)
            values[name] = value
    return values
