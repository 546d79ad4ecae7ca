"""systemd's EnvironmentFile= syntax as check-config --env-file reads it (systemd.exec(5); the
cases follow systemd's own parser, src/basic/env-file.c)."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduled_events_exporter.env_file import EnvFileError, parse_env_file, read_env_file

NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True)
# What systemd keeps in a value: any character but NUL and the control characters other than
# tab and newline (an assignment with one is dropped).
VALUE_CHARS = st.characters(blacklist_categories=("Cs",), blacklist_characters="\0\r\x0b\x0c"
                            "".join(map(chr, [*range(1, 9), *range(14, 32), 127])))
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
    parsed = parse_env_file(text)
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


def test_dropped_assignments_are_said_without_their_value() -> None:
    parsed = parse_env_file("1A=x\nSEE_SINKS=otlp\nB=a\x01secret\n\ufeffC=1\n")
    assert parsed.values == {"SEE_SINKS": "otlp"}
    assert [n.split(":")[0] for n in parsed.ignored] == ["line 1", "line 3", "line 4"]
    assert "not a valid variable name" in parsed.ignored[0]
    assert "control character" in parsed.ignored[1] and "secret" not in parsed.ignored[1]
    assert "byte order mark" in parsed.ignored[2]


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
