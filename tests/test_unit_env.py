"""``check-config --unit``: what a systemd unit gives its service, read as systemd reads it
(src/scheduled_events_exporter/unit_env.py names the systemd rule behind each case). Where
Debian's systemd is installed (``.ci/run`` installs it), ``systemd-analyze verify`` is the
oracle for which lines and words systemd drops and which units it refuses."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduled_events_exporter.unit_env import (
    MAX_LINE_BYTES,
    REFUSED,
    UnitEnvironment,
    UnitError,
    read_unit_environment,
)
from tests.exporter_process import clean_env

REPO = Path(__file__).resolve().parents[1]
SHIPPED_UNIT = REPO / "config" / "systemd" / "scheduled-events-exporter.service"
SHIPPED_ENV = REPO / "config" / "systemd" / "scheduled-events-exporter.env"
SCRIPT = str(Path(sys.executable).with_name("scheduled-events-exporter"))
NAME = "scheduled-events-exporter.service"


def unit(tmp_path: Path, service: str | bytes, name: str = NAME) -> Path:
    """A unit file ``name`` whose [Service] section is ``service`` (text, or the whole file as
    bytes)."""
    path = tmp_path / name
    if isinstance(service, bytes):
        path.write_bytes(service)
    else:
        path.write_text(f"[Unit]\nDescription=test\n\n[Service]\nExecStart=/bin/true\n"
                        f"{service}", encoding="utf-8")
    return path


def env_of(tmp_path: Path, service: str | bytes, name: str = NAME) -> UnitEnvironment:
    return read_unit_environment(unit(tmp_path, service, name))


def check(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SCRIPT, "check-config", *args], env=env or clean_env(),
                          capture_output=True, text=True, timeout=60, check=False)


# ------------------------------------------------------------------- the unit the project ships

def test_the_shipped_unit_gives_the_state_directory_and_the_env_files_settings(
        tmp_path: Path) -> None:
    """What the walkthrough passed by hand (SEE_STATE_DIR) now comes from the unit: %S is the
    system manager's /var/lib. The env file is read from where the unit says (moved here)."""
    env_file = tmp_path / "env"
    # As docs/vm.md has the operator do: the OTLP lines uncommented (shipped, it names no sink).
    env_file.write_text(re.sub(r"^#((?:SEE_SINKS|OTEL_EXPORTER_OTLP_\w+)=)", r"\1",
                               SHIPPED_ENV.read_text(encoding="utf-8"), flags=re.M),
                        encoding="utf-8")
    text = SHIPPED_UNIT.read_text(encoding="utf-8")
    assert "EnvironmentFile=-/etc/scheduled-events-exporter/env\n" in text
    moved = unit(tmp_path, text.replace("/etc/scheduled-events-exporter/env", str(env_file))
                 .encode())
    got = read_unit_environment(moved)
    assert got.notes == ()
    assert got.values["SEE_STATE_DIR"] == "/var/lib/scheduled-events-exporter"
    assert got.values["SEE_SINKS"] == "otlp"
    assert got.values["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://127.0.0.1:4318"
    # The same through the command, with a shell that sets things the service never gets.
    done = check("--unit", str(moved), env=clean_env(SEE_SINKS="console", SEE_POLL_INTERVAL="7"))
    assert done.returncode == 0, done.stderr
    assert "SEE_SINKS=otlp\n" in done.stdout and "SEE_POLL_INTERVAL=1\n" in done.stdout
    assert "SEE_STATE_DIR=/var/lib/scheduled-events-exporter\n" in done.stdout
    assert done.stderr == ""  # both shell variables are set by the unit's file too


def test_the_shipped_files_as_installed_say_the_service_waits_for_a_sink(tmp_path: Path) -> None:
    """The package's unit and environment file, untouched: the check passes (the defaults are
    valid) but says the unit's ExecCondition= keeps the service from starting."""
    env_file = tmp_path / "env"
    env_file.write_bytes(SHIPPED_ENV.read_bytes())
    text = SHIPPED_UNIT.read_text(encoding="utf-8")
    moved = unit(tmp_path, text.replace("/etc/scheduled-events-exporter/env", str(env_file))
                 .encode())
    [line] = [n for n, x in enumerate(text.splitlines(), 1) if x.startswith("ExecCondition=")]
    done = check("--unit", str(moved), env=clean_env(SEE_SINKS="otlp"))
    assert done.returncode == 0, done.stderr
    assert done.stderr == (
        "configuration warning: SEE_SINKS is set in this shell, but the service does not get "
        "this shell's environment: not checked; expected it in the unit or its environment "
        "file\n"
        f"configuration warning: {moved}:{line}: ExecCondition=: the service does not start "
        "while SEE_SINKS is empty, and neither the unit nor its environment files set it; "
        "expected SEE_SINKS naming a sink (a run by hand would use console)\n"), done.stderr


def test_a_shell_variable_the_unit_does_not_set_is_said_and_not_used(tmp_path: Path) -> None:
    path = unit(tmp_path, "Environment=SEE_STATE_DIR= SEE_SINKS=console\n")
    done = check("--unit", str(path), env=clean_env(SEE_LOG_LEVEL="debug"))
    assert done.returncode == 0, done.stderr
    assert "SEE_LOG_LEVEL=INFO\n" in done.stdout
    assert done.stderr == (
        "configuration warning: SEE_LOG_LEVEL is set in this shell, but the service does not "
        "get this shell's environment: not checked; expected it in the unit or its environment "
        "file\n")


def test_without_the_env_file_the_optional_line_is_said(tmp_path: Path) -> None:
    path = unit(tmp_path, f"EnvironmentFile=-{tmp_path}/missing\nEnvironment=SEE_STATE_DIR=\n")
    done = check("--unit", str(path))
    assert done.returncode == 0, done.stderr
    assert done.stderr == (
        f"configuration warning: {path}:6: EnvironmentFile=-{tmp_path}/missing: No such file "
        "or directory; optional ('-'): systemd skips it, and the service starts without its "
        "settings\n")


# ------------------------------------------------------------------------ systemd's order

def test_files_win_over_every_environment_line_and_later_wins_within_each(
        tmp_path: Path) -> None:
    (tmp_path / "one").write_text("A=from-one\nB=from-one\nC=from-one\n", encoding="utf-8")
    (tmp_path / "two").write_text("B=from-two\n", encoding="utf-8")
    got = env_of(tmp_path, f"EnvironmentFile={tmp_path}/one\n"
                           "Environment=A=early C=early D=early\n"
                           f"EnvironmentFile={tmp_path}/two\n"
                           "Environment=D=late E=late\n"
                           "Environment=E=later\n")
    assert got.values == {"A": "from-one", "B": "from-two", "C": "from-one", "D": "late",
                          "E": "later"}


def test_an_empty_assignment_resets_its_list_and_unset_comes_last(tmp_path: Path) -> None:
    (tmp_path / "one").write_text("A=1\nB=2\nC=3\n", encoding="utf-8")
    (tmp_path / "two").write_text("D=4\n", encoding="utf-8")
    got = env_of(tmp_path, "Environment=X=1 Y=2\nEnvironment=\nEnvironment=Z=3\n"
                           f"EnvironmentFile={tmp_path}/two\nEnvironmentFile=\n"
                           f"EnvironmentFile={tmp_path}/one\n"
                           "UnsetEnvironment=A C=not-its-value Z=3\n")
    assert got.values == {"B": "2", "C": "3"}


def test_pass_environment_is_said_not_read(tmp_path: Path) -> None:
    """PassEnvironment= takes the service manager's own variables, which check-config does not
    see (and the shell's are not the manager's)."""
    got = env_of(tmp_path, "PassEnvironment=SEE_SINKS HTTPS_PROXY\nEnvironment=A=1\n")
    assert got.values == {"A": "1"}
    assert got.notes == (f"{tmp_path / NAME}:6: PassEnvironment=: passes the service manager's "
                         "own SEE_SINKS HTTPS_PROXY, which check-config cannot see: not checked",)


def test_drop_ins_beside_the_unit_apply_after_it_in_name_order(tmp_path: Path) -> None:
    path = unit(tmp_path, "Environment=A=unit B=unit C=unit\n")
    dropins = tmp_path / f"{NAME}.d"
    dropins.mkdir()
    (dropins / "20-late.conf").write_text("[Service]\nEnvironment=B=20\n", encoding="utf-8")
    (dropins / "10-early.conf").write_text("[Service]\nEnvironment=B=10 C=10\n",
                                           encoding="utf-8")
    (dropins / "30-masked.conf").symlink_to("/dev/null")
    (dropins / "40-not-a-conf.txt").write_text("[Service]\nEnvironment=A=txt\n",
                                               encoding="utf-8")
    (dropins / "50-other-section.conf").write_text("[Install]\nEnvironment=A=install\n",
                                                   encoding="utf-8")
    assert read_unit_environment(path).values == {"A": "unit", "B": "20", "C": "10"}


# ---------------------------------------------------------------- Environment= quoting, escapes

@pytest.mark.parametrize(("line", "expected"), [
    ('Environment="VAR1=word1 word2" VAR2=word3 "VAR3=$word 5 6"',  # systemd.exec(5)'s example
     {"VAR1": "word1 word2", "VAR2": "word3", "VAR3": "$word 5 6"}),
    ("Environment='A=single quoted' B=x\"y z\"w", {"A": "single quoted", "B": "xy zw"}),
    ('Environment=A=\\x41\\102\\u00e9\\U0001F600\\s\\t\\\\ "B=\\"quoted\\" \\n"',
     {"A": "AB\u00e9\U0001f600 \t\\", "B": '"quoted" \n'}),
    ("Environment=A='\\x41'", {"A": "A"}),  # escapes are decoded inside single quotes too
    # Control characters are kept (systemd 248 and later).
    ("Environment=A=x\\ay B=\\x1b[0m C=\\177", {"A": "x\ay", "B": "\x1b[0m", "C": "\x7f"}),
    ("Environment=  A=1\t\tB=2  ", {"A": "1", "B": "2"}),
    ("Environment=A=a=b", {"A": "a=b"}),
    ("Environment=A=${B} B=$HOME", {"A": "${B}", "B": "$HOME"}),  # no variable expansion
    ("Environment=DIR=%S/x CACHE=%C LOG=%L ETC=%E RUN=%t TMP=%T VTMP=%V PCT=100%% END=5%",
     {"DIR": "/var/lib/x", "CACHE": "/var/cache", "LOG": "/var/log", "ETC": "/etc",
      "RUN": "/run", "TMP": "/tmp", "VTMP": "/var/tmp", "PCT": "100%", "END": "5%"}),
    ("Environment=H=%h U=%u UID=%U G=%g GID=%G",
     {"H": "/root", "U": "root", "UID": "0", "G": "root", "GID": "0"}),
    ("Environment=N=%n NN=%N P=%p I=%i J=%j",
     {"N": NAME, "NN": "scheduled-events-exporter", "P": "scheduled-events-exporter", "I": "",
      "J": "exporter"}),
])
def test_environment_words_as_systemd_splits_unquotes_and_unescapes_them(
        tmp_path: Path, line: str, expected: dict[str, str]) -> None:
    got = env_of(tmp_path, line + "\n")
    assert (got.values, got.notes) == (expected, ())


def test_an_instance_units_name_specifiers(tmp_path: Path) -> None:
    got = env_of(tmp_path, "Environment=N=%n P=%p I=%i J=%j\n", name="see-a@blue.service")
    assert got.values == {"N": "see-a@blue.service", "P": "see-a", "I": "blue", "J": "a"}


@pytest.mark.parametrize(("line", "expected", "note"), [
    # A syntax error: the words before it count, the rest of the line is dropped.
    ('Environment=A=1 B="unclosed C=3', {"A": "1"},
     'Environment=: an unclosed " quote: systemd ignores the rest of the line (words 2 on)'),
    ("Environment=A=1 B=a\\qb C=3", {"A": "1"}, "an escape systemd does not accept"),
    ("Environment=A=1 B=\\x00 C=3", {"A": "1"}, "an escape systemd does not accept"),
    ("Environment=A=1 B=\\UFFFFFFFF C=3", {"A": "1"}, "an escape systemd does not accept"),
    # A dropped word: the others count.
    ("Environment=A=1 1B=2 C=3", {"A": "1", "C": "3"},
     "word 2: '1B' is not a valid variable name"),
    ("Environment=A=1 B=%Z C=3", {"A": "1", "C": "3"},
     "word 2: an unknown specifier %Z: systemd ignores the word"),
    ("Environment=A=1 B=caf\\xe9 C=3", {"A": "1", "C": "3"},
     "word 2: its escapes make it not UTF-8: systemd ignores the word"),
    ("Environment=A=1 B=\\uD800 C=3", {"A": "1", "C": "3"}, "word 2: its escapes make it not"),
    ("Environment=A=1 secret-without-name C=3", {"A": "1", "C": "3"},
     "word 2: no '=' in it (expected NAME=value); systemd ignores the word"),
    ('Environment=A=1 "" C=3', {"A": "1", "C": "3"}, "word 2: no '=' in it"),
])
def test_what_systemd_drops_is_said_without_its_value(
        tmp_path: Path, line: str, expected: dict[str, str], note: str) -> None:
    got = env_of(tmp_path, line + "\n")
    assert got.values == expected
    (said,) = got.notes
    assert said.startswith(f"{tmp_path / NAME}:6: Environment=: ") and note in said, said
    assert "secret" not in said and "unclosed C" not in said


@pytest.mark.parametrize("letter", sorted(REFUSED))
def test_a_specifier_check_config_cannot_resolve_is_refused_in_one_line(
        tmp_path: Path, letter: str) -> None:
    path = unit(tmp_path, f"Environment=SEE_LOG_LEVEL=info HOST=%{letter}\n")
    with pytest.raises(UnitError) as caught:
        read_unit_environment(path)
    assert f"the specifier %{letter} ({REFUSED[letter]}) depends on the running system" \
        in str(caught.value)
    done = check("--unit", str(path))
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"check-config: --unit {path}: {path}:6: Environment=: ")
    assert "it resolves %%, %C, %E, %L, %S, %t, %T, %V, %h, %u, %g, %U, %G, %n, %N, %p, %i, " \
           "%j: expected one of those, or the value written out" in done.stderr


# ---------------------------------------------------------------------- the unit file's syntax

def test_the_unit_files_own_syntax(tmp_path: Path) -> None:
    data = (b"\xef\xbb\xbf[Unit]\r\n"
            b"# caf\xe9: a comment may hold any bytes\r\n"
            b"Environment=BEFORE=any-section\n"
            b"[Service]\n"
            b"  ; caf\xe9\n"
            b"Environment=A=1 \\\n"
            b"# a comment inside a continuation is skipped\n"
            b"    B=2\n"
            b"environment=C=keys-are-case-sensitive\n"
            b"Environment = D=4\r"
            b"Environment=E=5\0"
            b"Environment=F=6 \\\\\n"
            b"Environment=G=7\n"
            b"[Install]\n"
            b"Environment=H=not-the-service-section\n"
            b"[X-Ours]\n"
            b"Environment=I=nor-this-one\n"
            b"[Service]\n"
            b"Environment=J=10 \\")
    got = env_of(tmp_path, data)
    # (F's line ends in an escaped backslash: no continuation; that "\\" is a word of its own,
    # without '=', and dropped.)
    assert got.values == {"A": "1", "B": "2", "D": "4", "E": "5", "F": "6", "G": "7",
                          "J": "10"}


@pytest.mark.parametrize(("data", "wanted"), [
    (b"[Service]\nEnvironment=A=caf\xe9\n", ":2: not UTF-8 (byte 0xe9): systemd refuses to load"),
    ("[Service]\nEnvironment=A=\ufdd0\n".encode(), ":2: not UTF-8"),
    (b"[Service\nEnvironment=A=1\n", ":1: an invalid section header"),
    # The byte order mark goes before the comment test: this line is no comment to systemd.
    (b"\xef\xbb\xbf# caf\xe9\n[Service]\n", ":1: not UTF-8 (byte 0xe9)"),
    (b"[Ser\"vice]\nEnvironment=A=1\n", ":1: an invalid section header"),
    (b"[Service]\nEnvironment=" + b"x" * MAX_LINE_BYTES + b"\n",
     ":2: a line longer than 1 MiB: systemd refuses to load the unit"),
    (b"[Service]\nEnvironment=A=1 \\\n" + (b"x" * (MAX_LINE_BYTES // 2) + b" \\\n") * 3,
     ":2: a continued line longer than 1 MiB"),
    (b"# padding\n" * (4 * MAX_LINE_BYTES // 10 + 1), "larger than 4 MiB; expected a unit file"),
])
def test_a_unit_systemd_refuses_to_load_is_refused_in_one_line(
        tmp_path: Path, data: bytes, wanted: str) -> None:
    path = unit(tmp_path, data)
    done = check("--unit", str(path))
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"check-config: --unit {path}: ") and wanted in done.stderr
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr


@pytest.mark.timeout(30)
def test_a_unit_that_is_no_file_is_refused_without_reading_it(tmp_path: Path) -> None:
    masked = tmp_path / "masked.service"
    masked.symlink_to("/dev/null")
    zero = tmp_path / "zero.service"
    zero.symlink_to("/dev/zero")
    fifo = tmp_path / "fifo.service"
    os.mkfifo(fifo)
    for path, wanted in (
        (masked, "a character device, not a regular file (the unit is masked: a link to "
                 "/dev/null); expected a unit file"),
        (zero, "a character device, not a regular file; expected a unit file"),
        (fifo, "a FIFO, not a regular file; expected a unit file"),
        (tmp_path / "missing.service", "No such file or directory; expected a unit file"),
        (tmp_path, "Is a directory; expected a unit file"),
    ):
        done = check("--unit", str(path))
        assert (done.returncode, done.stderr) == (2, f"check-config: --unit {path}: {wanted}\n")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                    HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=400) | st.text(
    st.sampled_from(list("[]=\\\"'% \t\n\r#;ESNrvice-/ax0$\0")), max_size=200).map(
        lambda text: ("[Service]\nEnvironment=" + text).encode("utf-8")))
def test_any_bytes_give_values_or_one_line_never_a_crash(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / NAME
    path.write_bytes(data)
    try:
        got = read_unit_environment(path)
    except UnitError as exc:
        assert "\n" not in str(exc), exc
        return
    for name, value in got.values.items():
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name), name
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", value), value
    assert all("\n" not in note for note in got.notes), got.notes


# ------------------------------------------------------------------------- EnvironmentFile=

def test_environment_files_missing_refused_or_optional(tmp_path: Path) -> None:
    latin = tmp_path / "latin"
    latin.write_bytes(b"# caf\xe9 is fine in a comment\nSEE_SINKS=console\n")
    bad = tmp_path / "bad"
    bad.write_bytes(b"SEE_SINKS=console\nSEE_LOG_LEVEL=caf\xe9\n")
    ok = unit(tmp_path, f"EnvironmentFile={latin}\nEnvironmentFile=-{bad}\n"
                        "Environment=SEE_STATE_DIR=\n")
    done = check("--unit", str(ok))
    assert done.returncode == 0, done.stderr
    assert "SEE_SINKS=console\n" in done.stdout and "SEE_LOG_LEVEL=INFO\n" in done.stdout
    assert done.stderr == (
        f"configuration warning: {ok}:7: EnvironmentFile=-{bad}: line 2: not UTF-8 in the "
        "value of SEE_LOG_LEVEL (byte 0xe9): systemd refuses the whole file; expected UTF-8 "
        "text (a comment may hold any bytes); optional ('-'): systemd skips it, and the "
        "service starts without its settings\n")
    for line, wanted in (
        (f"EnvironmentFile={bad}", f"{bad}: line 2: not UTF-8 in the value of SEE_LOG_LEVEL"),
        (f"EnvironmentFile={tmp_path}/missing", f"{tmp_path}/missing: No such file or directory"),
        (f"EnvironmentFile={tmp_path}", f"{tmp_path}: Is a directory"),
        (f"EnvironmentFile={tmp_path}/none-*", f"{tmp_path}/none-*: no file matches"),
    ):
        path = unit(tmp_path, line + "\n")
        done = check("--unit", str(path))
        assert done.returncode == 2, (line, done.stderr)
        assert wanted in done.stderr and "systemd does not start the service" in done.stderr
        assert len(done.stderr.splitlines()) == 1


@pytest.mark.timeout(30)
def test_an_environment_file_that_is_no_file_is_refused_even_when_optional(
        tmp_path: Path) -> None:
    """What systemd would do with a FIFO or a device is not what check-config can tell by
    reading it: refused, without waiting or reading forever."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    huge = tmp_path / "huge"
    huge.write_bytes(b"#" * (4 * 1024 * 1024 + 1))
    for target, kind in ((fifo, "a FIFO"), (Path("/dev/zero"), "a character device")):
        path = unit(tmp_path, f"EnvironmentFile=-{target}\n")
        done = check("--unit", str(path))
        assert (done.returncode, done.stderr) == (2, (
            f"check-config: --unit {path}: {path}:6: EnvironmentFile=-{target}: {kind}, not a "
            "regular file; expected an environment file (a regular file of at most 4 MiB)\n"))
    path = unit(tmp_path, f"EnvironmentFile=-{huge}\n")
    done = check("--unit", str(path))
    assert done.returncode == 2 and ": larger than 4 MiB; expected an environment file" \
        in done.stderr, done.stderr


def test_wildcards_relative_paths_and_specifiers_in_environment_file(tmp_path: Path) -> None:
    conf = tmp_path / "conf.d"
    conf.mkdir()
    for name, text in (("10.env", "A=10\nB=10\n"), ("20.env", "B=20\n"), (".hidden.env", "A=h\n"),
                       ("30.txt", "A=txt\n")):
        (conf / name).write_text(text, encoding="utf-8")
    got = env_of(tmp_path, f"EnvironmentFile={conf}/*.env\n"
                           "EnvironmentFile=relative/env\n"
                           f"EnvironmentFile={conf}/../conf.d/10.env\n"
                           f"EnvironmentFile=-{tmp_path}//conf.d/./%p.env\n"
                           "EnvironmentFile=/etc/%Z\n")
    assert got.values == {"A": "10", "B": "20"}
    # (What the lines say first, then what loading the files found.)
    assert [n.split(": ", 1)[1] for n in got.notes] == [
        "EnvironmentFile=: the path is not absolute: systemd ignores the line; expected an "
        "absolute path",
        "EnvironmentFile=: the path holds '..': systemd ignores the line; expected an absolute "
        "path",
        "EnvironmentFile=: an unknown specifier %Z: systemd ignores the line",
        f"EnvironmentFile=-{tmp_path}/conf.d/scheduled-events-exporter.env: No such file or "
        "directory; optional ('-'): systemd skips it, and the service starts without its "
        "settings"]
    many = tmp_path / "many"
    many.mkdir()
    for i in range(65):
        (many / f"{i:02}.env").write_text(f"A={i}\n", encoding="utf-8")
    with pytest.raises(UnitError, match=r"matches 65 files; expected a few \(at most 64\)"):
        env_of(tmp_path, f"EnvironmentFile=-{many}/*.env\n")


def nobody_runs_python() -> str:
    if sys.platform == "win32" or os.geteuid() != 0 or shutil.which("setpriv") is None:
        return "needs root and setpriv, to run check-config as another user"
    return ""


@pytest.mark.skipif(bool(nobody_runs_python()), reason=nobody_runs_python() or "-")
def test_a_file_only_root_can_read_is_an_error_even_when_optional() -> None:
    """systemd reads it as root; check-config without sudo cannot know what it holds."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="see-") as top:
        Path(top).chmod(0o755)
        env_file = Path(top) / "env"
        env_file.write_text("SEE_SINKS=console\n", encoding="utf-8")
        env_file.chmod(0o600)
        path = Path(top) / NAME
        path.write_text(f"[Service]\nEnvironmentFile=-{env_file}\n", encoding="utf-8")
        path.chmod(0o644)
        done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                               SCRIPT, "check-config", "--unit", str(path)],
                              env=clean_env(), capture_output=True, text=True, timeout=60,
                              check=False)
    assert done.returncode == 2
    assert done.stderr == (f"check-config: --unit {path}: {path}:2: EnvironmentFile=-"
                           f"{env_file}: Permission denied; expected a readable file (systemd "
                           "reads it as root: run check-config with sudo)\n")


def test_the_options_are_checked(tmp_path: Path) -> None:
    path = unit(tmp_path, "Environment=SEE_STATE_DIR=\n")
    for args in (("--unit",), ("--unit", str(path), "--unit", str(path)),
                 ("--units", str(path))):
        done = check(*args)
        assert done.returncode == 2 and done.stderr.startswith(
            "check-config: expected [--unit FILE] [--env-file FILE]..."), done.stderr
    extra = tmp_path / "extra"
    extra.write_text("SEE_SINKS=console\n", encoding="utf-8")
    done = check("--unit", str(path), "--env-file", str(extra))
    assert done.returncode == 0 and "SEE_SINKS=console\n" in done.stdout, done.stderr


# ----------------------------------------------------- systemd itself, where it is installed

ANALYZE = shutil.which("systemd-analyze")


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze missing: .ci/run installs systemd")
def test_systemd_drops_the_lines_and_words_we_say_it_drops(tmp_path: Path) -> None:
    """``systemd-analyze verify`` logs every Environment=/EnvironmentFile= word or line it
    drops, with its line number: the same lines as our notes, no more, no fewer."""
    service = ("Environment=OK=1 1BAD=2 ALSO_OK=3\n"                 # 6: a word dropped
               'Environment=A=1 B="unclosed\n'                       # 7: rest dropped
               "Environment=C=a\\qb D=4\n"                           # 8: rest dropped
               "Environment=E=%Z F=%S\n"                             # 9: a word dropped
               "Environment=G=caf\\xe9\n"                            # 10: not UTF-8
               "Environment=H=a\\ab\n"                               # 11: kept (248 on)
               "EnvironmentFile=relative/path\n"                     # 12: not absolute
               "EnvironmentFile=/etc/%Z\n"                           # 13: unknown specifier
               "Environment=I=\\s J='x y' K=\\101\n"                 # 14: all kept
               "Environment=L=1 \\\n# comment\n  M=2\n"              # 15: kept, continued
               "[Install]\nEnvironment=N=1\n")                       # 19: another section
    path = unit(tmp_path, service)
    done = subprocess.run([ANALYZE, "verify", str(path)], capture_output=True, text=True,
                          errors="replace", timeout=60, check=False)
    dropped = {int(m.group(1)) for m in re.finditer(
        rf"{re.escape(str(path))}:(\d+): .*(?:ignoring|Unknown key)", done.stderr)}
    got = read_unit_environment(path)
    said = {int(n.split(":")[1]) for n in got.notes}
    assert dropped - {19} == said == {6, 7, 8, 9, 10, 12, 13}, (done.stderr, got.notes)
    assert got.values == {"OK": "1", "ALSO_OK": "3", "A": "1", "F": "/var/lib", "H": "a\ab",
                          "I": " ", "J": "x y", "K": "A", "L": "1", "M": "2"}
    # And what it refuses to load, it refuses (exit 1, "failed to load").
    for data in (b"[Service]\nExecStart=/bin/true\nEnvironment=A=caf\xe9\n",
                 b"[Service\nExecStart=/bin/true\n"):
        path.write_bytes(data)
        done = subprocess.run([ANALYZE, "verify", str(path)], capture_output=True, text=True,
                              errors="replace", timeout=60, check=False)
        assert done.returncode != 0 and "failed to load" in done.stderr, done.stderr
        with pytest.raises(UnitError, match="systemd refuses to load the unit"):
            read_unit_environment(path)
