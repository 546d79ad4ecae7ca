"""systemd's EnvironmentFile= syntax as check-config --env-file reads it (systemd.exec(5); the
cases follow systemd's own parser, src/basic/env-file.c)."""

from __future__ import annotations

import os
import string
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduled_events_exporter.env_file import (
    MAX_FILE_BYTES,
    EnvFileError,
    parse_env_bytes,
    parse_env_file,
    read_env_file,
)

NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True)


def noncharacter(c: str) -> bool:
    """A code point systemd's UTF-8 check refuses (src/basic/utf8.c, unichar_is_valid)."""
    return 0xFDD0 <= ord(c) <= 0xFDEF or ord(c) & 0xFFFE == 0xFFFE


# Values written out verbatim: no NUL, none of the line ends and control characters that the
# quoting below would have to escape (systemd 248 and later keep any other), and no
# noncharacter (a file with one is refused whole).
VALUE_CHARS = st.characters(blacklist_categories=("Cs",), blacklist_characters="\0\r\x0b\x0c"
                            "".join(map(chr, [*range(1, 9), *range(14, 32), 127]))).filter(
                                lambda c: not noncharacter(c))
VALUES = st.text(VALUE_CHARS, max_size=40)


def double_quoted(value: str) -> str:
    return '"' + "".join("\\" + c if c in '"\\`$' else c for c in value) + '"'


@given(st.dictionaries(NAMES, VALUES, max_size=8))
def test_double_quoted_values_come_back_exactly(values: dict[str, str]) -> None:
    text = "".join(f"{name}={double_quoted(value)}\n" for name, value in values.items())
    assert parse_env_file(text).values == values


@given(st.dictionaries(NAMES, VALUES.filter(lambda v: "'" not in v), max_size=8),
       st.lists(st.sampled_from(["", "# a comment", "; another", "   ", "\t# indented",
                                 "no equals sign here"]), max_size=8))
def test_single_quoted_values_and_comment_lines_between(values: dict[str, str],
                                                        noise: list[str]) -> None:
    lines = [f"  {name} = '{value}'  " for name, value in values.items()]
    for i, extra in enumerate(noise):
        lines.insert(i % (len(lines) + 1), extra)
    assert parse_env_file("\n".join(lines)).values == values


@given(st.text(st.characters(blacklist_characters="\0"), max_size=200))
def test_any_text_parses_to_valid_names(text: str) -> None:
    try:
        parsed = parse_env_file(text)
    except EnvFileError as exc:
        # Only for a noncharacter or a lone surrogate in a name or a value (a comment may hold
        # either).
        assert "not UTF-8 in" in str(exc), exc
        assert any(noncharacter(c) or 0xD800 <= ord(c) <= 0xDFFF for c in text), exc
        return
    assert all(name.isidentifier() and name.isascii() for name in parsed.values)


@given(st.binary(max_size=300))
def test_any_bytes_parse_or_are_refused_in_one_line(data: bytes) -> None:
    try:
        parsed = parse_env_bytes(data)
    except EnvFileError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("line "), exc
        return
    assert all(name.isidentifier() and name.isascii() for name in parsed.values)


@given(st.dictionaries(NAMES, st.text(string.ascii_letters + string.digits + ":/.,=-_", min_size=1,
                                      max_size=30), max_size=8))
def test_plain_lines_are_what_they_say(values: dict[str, str]) -> None:
    text = "\r\n".join(f"{name}={value}" for name, value in values.items())
    assert parse_env_file(text).values == values


@pytest.mark.parametrize(("text", "expected"), [
    ("A=1\n# B=2\n; C=3\n\nD", {"A": "1"}),
    ("A=  two  words  \n", {"A": "two  words"}),
    ('A="  kept  "  \n', {"A": "  kept  "}),
    ("A='$HOME \\n \"x\"'", {"A": '$HOME \\n "x"'}),
    ('A="a\\"b\\\\c\\$d\\`e\\nf"', {"A": 'a"b\\c$d`e\\nf'}),
    ("A=one\\\ntwo\nB=x", {"A": "onetwo", "B": "x"}),
    ('A="multi\nline"', {"A": "multi\nline"}),
    ('A="x"y \'z\'', {"A": "xy 'z'"}),  # quotes count only where a value starts
    ('A="x" "y"', {"A": "xy"}),
    ("A=1\nA=2", {"A": "2"}),
    ("A=", {"A": ""}),
    ("A = b # not a comment", {"A": "b # not a comment"}),
    ("export A=1", {}),
])
def test_systemd_examples(text: str, expected: dict[str, str]) -> None:
    assert parse_env_file(text).values == expected


def test_dropped_assignments_are_said_and_control_characters_kept() -> None:
    """systemd drops an invalid name; since 248 it keeps a value with control characters
    (every systemd the supported distributions ship), for the exporter's own checks to judge."""
    parsed = parse_env_file("1A=x\nSEE_SINKS=otlp\nB=a\x01b\x1b[31m\x7f\n\ufeffC=1\n")
    assert parsed.values == {"SEE_SINKS": "otlp", "B": "a\x01b\x1b[31m\x7f"}
    assert [n.split(":")[0] for n in parsed.ignored] == ["line 1", "line 4"]
    assert "not a valid variable name" in parsed.ignored[0]
    assert "byte order mark" in parsed.ignored[1]


def test_unusable_files_are_one_line(tmp_path: Path) -> None:
    latin = tmp_path / "latin1"
    latin.write_bytes(b"A=1\nB=caf\xe9\n")
    nul = tmp_path / "nul"
    nul.write_bytes(b"A=1\nB=\0\n")
    for path, wanted in ((latin, "line 2: not UTF-8"), (nul, "line 2: a NUL byte"),
                         (tmp_path / "missing", "No such file"), (tmp_path, "Is a directory")):
        with pytest.raises(EnvFileError, match=wanted) as caught:
            read_env_file(path)
        assert "\n" not in str(caught.value)


# ------------------------------------------ UTF-8 per key and value, as systemd checks it

def test_bytes_that_are_not_utf8_matter_only_in_a_name_or_a_value() -> None:
    """systemd decodes nothing but the pairs it hands on (env-file.c, check_utf8ness_and_warn):
    a comment written in Latin-1, or a line it ignores, is no error."""
    data = ("# Configuration de l'exportateur, \u00e9crite en Latin-1\n".encode("latin-1")
            + b"; caf\xe9\nno equals sign in caf\xe9\nSEE_SINKS=otlp\n"
            + b"SEE_LOG_LEVEL=info # caf\xc3\xa9\n")
    assert parse_env_bytes(data).values == {"SEE_SINKS": "otlp",
                                            "SEE_LOG_LEVEL": "info # caf\u00e9"}


@pytest.mark.parametrize(("data", "wanted"), [
    (b"A=1\nSEE_LOG_LEVEL=caf\xe9\n",
     "line 2: not UTF-8 in the value of SEE_LOG_LEVEL (byte 0xe9)"),
    (b"A=1\n\n  caf\xe9=1\n", "line 3: not UTF-8 in a variable name (byte 0xe9)"),
    (b'A="multi\nline \xff"\n', "line 1: not UTF-8 in the value of A (byte 0xff)"),
    ("A=x\ufffe".encode(),
     "line 1: not UTF-8 in the value of A (the noncharacter U+FFFE at byte 2)"),
    ("A=\U0010ffff".encode(), "the noncharacter U+10FFFF"),
    (b"A=\xed\xa0\x80\n", "line 1: not UTF-8 in the value of A (byte 0xed)"),  # a surrogate
    (b"A=\xc0\xaf\n", "line 1: not UTF-8 in the value of A (byte 0xc0)"),  # overlong '/'
])
def test_a_name_or_value_that_is_not_utf8_refuses_the_file_without_showing_it(
        data: bytes, wanted: str) -> None:
    with pytest.raises(EnvFileError) as caught:
        parse_env_bytes(data)
    assert wanted in str(caught.value) and "systemd refuses the whole file" in str(caught.value)
    assert "caf" not in str(caught.value) and "multi" not in str(caught.value)


def test_valid_utf8_of_every_length_is_kept() -> None:
    value = "\u00e9\u20ac\U0001f600\U00020000\ufeff"  # 2, 3, 4 bytes; a BOM inside a value
    assert parse_env_bytes(f"A={value}\n".encode()).values == {"A": value}


# ------------------------------------------------------------- files that are not text files

@pytest.mark.timeout(20)
def test_a_fifo_a_device_and_a_huge_file_are_refused_without_reading_them_whole(
        tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # nobody writes: a read would wait forever
    zero = tmp_path / "zero"
    zero.symlink_to("/dev/zero")  # a read would never end
    huge = tmp_path / "huge"
    huge.write_bytes(b"# padding\n" * (MAX_FILE_BYTES // 10 + 1))
    for path, wanted in ((fifo, "a FIFO, not a regular file"),
                         (zero, "a character device, not a regular file"),
                         (huge, "larger than 4 MiB")):
        with pytest.raises(EnvFileError, match=wanted):
            read_env_file(path)
    exactly = tmp_path / "exactly"
    exactly.write_bytes(b"A=1\n" + b"#" * (MAX_FILE_BYTES - 5) + b"\n")
    assert read_env_file(exactly).values == {"A": "1"}
