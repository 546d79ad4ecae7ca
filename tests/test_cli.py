"""The installed console script as a new user meets it: help, version, configuration errors,
check-config, an IMDS that refuses connections, and the demo."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from scheduled_events_exporter import __version__
from scheduled_events_exporter.simulator import Simulator
from tests.exporter_process import ExporterProcess, clean_env, free_port, wait_until

SCRIPT = str(Path(sys.executable).with_name("scheduled-events-exporter"))


def run(*args: str, env: dict[str, str] | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SCRIPT, *args], env=env or clean_env(SEE_STATE_DIR=""),
                          capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.parametrize("args", [("--help",), ("-h",), ("run", "--help"),
                                  ("check-config", "--help"), ("version", "--help"),
                                  ("demo", "--help"), ("simulate", "--help"),
                                  ("probe", "--help"), ("init-state-dir", "--help")])
def test_every_command_answers_help(args: tuple[str, ...]) -> None:
    done = run(*args)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: scheduled-events-exporter"), done.stdout
    assert "Traceback" not in done.stderr


def test_top_level_help_lists_the_commands_and_the_default() -> None:
    text = run("--help").stdout
    for command in ("run", "check-config", "demo", "simulate", "version"):
        assert f"\n  {command} " in text
    assert "default" in text and "SEE_" in text


def test_run_help_names_the_variables_it_reads() -> None:
    text = run("run", "--help").stdout
    for name in ("SEE_IMDS_ENDPOINT", "SEE_SINKS", "SEE_STATE_DIR", "OTEL_EXPORTER_OTLP_"):
        assert name in text


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_init_state_dir_creates_and_hands_over_the_directory(tmp_path: Path) -> None:
    target = tmp_path / "host" / "state"
    done = run("init-state-dir", "--owner", "12345:23456", str(target))
    assert done.returncode == 0, done.stderr
    st = target.stat()
    assert (st.st_uid, st.st_gid, oct(st.st_mode & 0o7777)) == (12345, 23456, "0o700")
    # Again, already right: nothing to change, still 0. Then the image's user by default.
    assert run("init-state-dir", "--owner", "12345:23456", str(target)).returncode == 0
    target.chmod(0o755)
    done = run("init-state-dir", str(target))
    assert done.returncode == 0 and "65532:65532, mode 0700" in done.stdout
    st = target.stat()
    assert (st.st_uid, st.st_gid, oct(st.st_mode & 0o7777)) == (65532, 65532, "0o700")


def test_init_state_dir_refuses_a_symlink_and_bad_arguments(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    (tmp_path / "link").symlink_to(elsewhere)
    done = run("init-state-dir", str(tmp_path / "link"))
    assert done.returncode == 1 and "link" in done.stderr, done.stderr
    assert oct(elsewhere.stat().st_mode & 0o7777) == "0o755"
    for args in ((), ("--owner", "nonroot", "/x"), ("a", "b"), ("--owner",)):
        done = run("init-state-dir", *args)
        assert done.returncode == 2 and "expected" in done.stderr, (args, done.stderr)


@pytest.mark.parametrize("args", [("--version",), ("version",)])
def test_version(args: tuple[str, ...]) -> None:
    done = run(*args)
    assert (done.returncode, done.stdout.strip()) == (0, __version__)


@pytest.mark.parametrize(("variable", "value"), [
    ("SEE_POLL_INTERVAL", "fast"),
    ("SEE_IMDS_ENDPOINT", "http://:99999"),
    ("SEE_SINKS", "kafka"),
    ("SEE_CLOCK_START", "yesterday"),
    ("SEE_APPROVE_HOOK_ENV", "A B"),
])
def test_a_bad_value_is_one_line_and_exit_2(variable: str, value: str) -> None:
    for command in ("run", "check-config"):
        done = run(command, env=clean_env(SEE_STATE_DIR="", SEE_HEALTH_ADDR="",
                                          **{variable: value}))
        assert done.returncode == 2, (command, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"configuration error: {variable}="), lines
        assert "Traceback" not in done.stderr


def test_unknown_command_and_arguments_are_one_line_and_exit_2() -> None:
    for args in (("bogus",), ("run", "--verbose"), ("check-config", "extra")):
        done = run(*args)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_signal_endpoint_is_checked_against_that_signals_protocol() -> None:
    done = run("check-config", env=clean_env(
        SEE_STATE_DIR="", SEE_SINKS="otlp", OTEL_EXPORTER_OTLP_METRICS_PROTOCOL="grpc",
        OTEL_EXPORTER_OTLP_METRICS_ENDPOINT="http://collector:4318"))
    assert done.returncode == 0
    assert done.stderr.startswith("configuration warning: OTEL_EXPORTER_OTLP_METRICS_ENDPOINT "
                                  "uses port 4318, the OTLP/http port, with the grpc protocol")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_check_config_refuses_a_state_dir_run_could_not_create() -> None:
    # Root is told "writable" by os.access in /proc, where no directory can be made.
    env = clean_env(SEE_STATE_DIR="/proc/no-such-state")
    for command in ("check-config", "run"):
        done = run(command, env=env, timeout=30)
        assert done.returncode == 2, (command, done.stderr)
        assert "SEE_STATE_DIR='/proc/no-such-state': expected a writable directory" in \
            done.stderr, done.stderr


def test_check_config_changes_nothing(tmp_path: Path) -> None:
    target = tmp_path / "not" / "yet" / "state"
    done = run("check-config", env=clean_env(SEE_STATE_DIR=str(target)))
    assert done.returncode == 0, done.stderr
    assert f"SEE_STATE_DIR={target}" in done.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.timeout(60)
def test_a_refused_imds_connection_is_a_connection_error_within_seconds(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    env = clean_env(SEE_IMDS_ENDPOINT=f"http://127.0.0.1:{port}", SEE_SINKS="console",
                    SEE_STATE_DIR="", SEE_HEALTH_ADDR="", SEE_POLL_INTERVAL="1",
                    OTEL_METRICS_EXPORTER="prometheus",
                    OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
                    OTEL_EXPORTER_PROMETHEUS_PORT=str(free_port()))
    with ExporterProcess(env) as proc:
        proc.wait_for(lambda: "IMDS request failed" in proc.stderr(), 10, "the failure line")
        line = next(x for x in proc.stderr_lines if "IMDS request failed" in x)
        assert "(connection_error)" in line and f"127.0.0.1:{port}" in line, line
        assert "Connection refused" in line and "timeout" not in line, line
        scrape_port = env["OTEL_EXPORTER_PROMETHEUS_PORT"]
        import urllib.request

        def counted() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{scrape_port}/metrics",
                                        timeout=2) as answer:
                text = answer.read().decode()
            return 'outcome="connection_error"' in text and 'outcome="timeout"' not in text

        wait_until(counted, 10, "the connection_error outcome in /metrics")
        startup = next(x for x in proc.stderr_lines if "polling http" in x)
        assert "records to: console" in startup and "metrics to: Prometheus" in startup


@pytest.mark.timeout(60)
def test_the_startup_line_names_the_ports_actually_bound() -> None:
    """Port 0 means "any free port": the start-up line must say which one was chosen."""
    env = clean_env(SEE_IMDS_ENDPOINT=f"http://127.0.0.1:{free_port()}", SEE_SINKS="console",
                    SEE_STATE_DIR="", SEE_HEALTH_ADDR="127.0.0.1:0", SEE_POLL_INTERVAL="1",
                    OTEL_METRICS_EXPORTER="prometheus",
                    OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
                    OTEL_EXPORTER_PROMETHEUS_PORT="0")
    with ExporterProcess(env) as proc:
        proc.wait_for(lambda: "polling http" in proc.stderr(), 10, "the start-up line")
        startup = next(x for x in proc.stderr_lines if "polling http" in x)
        # Which build runs comes first (the version that names its commit).
        assert f"scheduled_events_exporter: scheduled-events-exporter {__version__} polling " \
               "http://127.0.0.1:" in startup, startup
        health = re.search(r"health: http://127\.0\.0\.1:(\d+)/healthz", startup)
        scrape = re.search(r"Prometheus http://127\.0\.0\.1:(\d+)/metrics", startup)
        assert health and scrape, startup
        assert int(health.group(1)) > 0 and int(scrape.group(1)) > 0, startup
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{health.group(1)}/healthz",
                                        timeout=5) as answer:
                status = answer.status
        except urllib.error.HTTPError as exc:  # 503 is an answer too: the port is ours
            status = exc.code
        assert status in (200, 503)


@pytest.mark.parametrize("args", [("--speed", "-5"), ("--speed", "0"), ("--speed", "nan"),
                                  ("--interval", "0"), ("--scenario", "no-such-scenario")])
def test_demo_bad_arguments_are_one_line_and_exit_2(args: tuple[str, ...]) -> None:
    done = run("demo", *args, timeout=30)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert "SEE_" not in done.stderr  # it names the option the user gave, not a variable


@pytest.mark.timeout(120)
def test_demo_ends_with_a_summary_in_real_and_scenario_time() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SEE_", "OTEL_"))}
    done = run("demo", "--speed", "150", "--interval", "0.2", env=env, timeout=100)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = done.stderr[done.stderr.index("demo summary"):]
    assert "x150" in summary
    assert "Freeze" in summary and "scheduled -> started -> completed (observed_start)" in summary
    assert "Redeploy" in summary and "cancelled (consecutive_absence)" in summary
    # 15 min of scenario notice at x150 passes in 6 s of real time: both are printed. NotBefore
    # has whole seconds (RFC 1123) and first sight is up to a poll late: +-1.2 s, i.e. +-3 min.
    pattern = r"Freeze \w+ for vm-sim-0: .*notice [4-7]\.\d s \[1[2-8] min\]"
    assert re.search(pattern, summary), summary
    assert "pending events now 0" in summary


@pytest.mark.parametrize(("values", "named"), [
    ({"OTEL_METRICS_EXPORTER": "prometheus", "OTEL_EXPORTER_PROMETHEUS_PORT": "8080",
      "SEE_HEALTH_ADDR": "0.0.0.0:8080"}, "OTEL_EXPORTER_PROMETHEUS_PORT=8080"),
    ({"OTEL_RESOURCE_ATTRIBUTES": "team=sre,oops"}, "OTEL_RESOURCE_ATTRIBUTES="),
    ({"SEE_SINKS": "otlp", "OTEL_EXPORTER_OTLP_CERTIFICATE": "/no/such/ca.pem"},
     "OTEL_EXPORTER_OTLP_CERTIFICATE="),
    ({"OTEL_EXPORTER_PROMETHEUS_PORT": ""}, "OTEL_EXPORTER_PROMETHEUS_PORT=''"),
    ({"OTEL_METRICS_EXPORTER": "prometheus", "OTEL_EXPORTER_PROMETHEUS_HOST": "not a host!"},
     "OTEL_EXPORTER_PROMETHEUS_HOST="),
    ({"SEE_IMDS_ENDPOINT": "http://169.254.169.254:99999"}, "port must be a number"),
])
def test_check_config_catches_what_run_would_fail_on(values: dict[str, str], named: str) -> None:
    env = clean_env(SEE_STATE_DIR="", **values)
    for command in ("check-config", "run"):
        done = run(command, env=env, timeout=30)
        assert done.returncode == 2, (command, done.stderr)
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith("configuration error:") and named in line, line


def test_grpc_on_the_http_port_is_a_warning() -> None:
    done = run("check-config", env=clean_env(
        SEE_STATE_DIR="", SEE_SINKS="otlp", OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
        OTEL_EXPORTER_OTLP_ENDPOINT="http://collector:4318"))
    assert done.returncode == 0
    assert done.stderr.startswith("configuration warning: OTEL_EXPORTER_OTLP_ENDPOINT uses port "
                                  "4318")


def test_check_config_and_errors_never_print_a_secret() -> None:
    planted = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "https://alice:planted-1@collector:4318",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "x-api-key=planted-2",
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer planted-3",
        "SEE_APPROVE": "all",
        "SEE_APPROVE_HOOK": "curl -H 'Authorization: Bearer planted-4' https://drain/",
        "SEE_SINKS": "otlp",
    }
    done = run("check-config", env=clean_env(SEE_STATE_DIR="", **planted))
    assert done.returncode == 0, done.stderr
    assert "planted" not in done.stdout + done.stderr, done.stdout
    assert "OTEL_EXPORTER_OTLP_ENDPOINT=https://<redacted>@collector:4318" in done.stdout
    bad = run("check-config", env=clean_env(
        SEE_STATE_DIR="", SEE_IMDS_ENDPOINT="http://bob:planted-5@host:99999"))
    assert bad.returncode == 2 and "planted" not in bad.stderr, bad.stderr


@pytest.mark.parametrize(("protocol", "endpoint"), [("grpc", "http://localhost:4317"),
                                                    ("http/protobuf", "http://localhost:4318")])
def test_check_config_shows_where_otlp_records_go_by_default(protocol: str,
                                                             endpoint: str) -> None:
    done = run("check-config", env=clean_env(SEE_STATE_DIR="", SEE_SINKS="otlp",
                                             OTEL_EXPORTER_OTLP_PROTOCOL=protocol))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert f"OTEL_EXPORTER_OTLP_ENDPOINT={endpoint} (default)" in lines
    assert "OTEL_METRIC_EXPORT_INTERVAL=60000 (default)" in lines


TEMPORALITY = "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE"
AGGREGATION = "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION"


@pytest.mark.parametrize(("more", "shown"), [
    ({}, [f"{TEMPORALITY}=cumulative (default)",
          f"{AGGREGATION}=explicit_bucket_histogram (default)"]),
    ({TEMPORALITY: "delta", AGGREGATION: "base2_exponential_bucket_histogram"},
     [f"{TEMPORALITY}=delta", f"{AGGREGATION}=base2_exponential_bucket_histogram"]),
    # The otlp sink sends no metrics: nothing is aggregated for it, so no line.
    ({"OTEL_METRICS_EXPORTER": "prometheus"}, []),
], ids=["defaulted", "set", "otlp metrics off"])
def test_check_config_shows_the_metrics_temporality_and_histogram_aggregation(
        more: dict[str, str], shown: list[str]) -> None:
    """Which rules file and dashboard setting a route needs follows from these two
    (docs/consumption.md, "Pick a route"): check-config says them even when defaulted."""
    done = run("check-config", env=clean_env(SEE_STATE_DIR="", SEE_SINKS="otlp", **more))
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines()
             if line.startswith((TEMPORALITY, AGGREGATION))]
    assert lines == shown


@pytest.mark.parametrize(("protocol", "endpoint", "said"), [
    ("grpc", "http://collector:4317/v1/logs", "has a path ('/v1/logs') that gRPC ignores"),
    ("http/protobuf", "http://collector:4318/v1/metrics",
     "ends in /v1/metrics, but the SDK appends /v1/logs and /v1/metrics to it"),
])
def test_an_endpoint_path_the_sdk_would_misuse_is_a_warning(protocol: str, endpoint: str,
                                                            said: str) -> None:
    done = run("check-config", env=clean_env(
        SEE_STATE_DIR="", SEE_SINKS="otlp", OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint))
    assert done.returncode == 0
    assert done.stderr.startswith(f"configuration warning: OTEL_EXPORTER_OTLP_ENDPOINT {said}")


def test_a_plain_endpoint_gets_no_warning() -> None:
    for protocol, endpoint in (("grpc", "https://collector:4317/"), ("grpc", "127.0.0.1:4317"),
                               ("grpc", "collector:14317"),
                               ("http/protobuf", "http://collector:4318/")):
        done = run("check-config", env=clean_env(
            SEE_STATE_DIR="", SEE_SINKS="otlp", OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
            OTEL_EXPORTER_OTLP_ENDPOINT=endpoint))
        # gRPC's own line, that the grpc extra must be named in every install, is not about
        # the endpoint (tests/test_missing_extras.py).
        said = [line for line in done.stderr.splitlines()
                if "OTLP over gRPC works here because grpcio is installed" not in line]
        assert (done.returncode, said) == (0, []), done.stderr


def test_probe_asks_the_health_server_where_see_health_addr_puts_it(sim: Simulator) -> None:
    port = free_port()
    env = clean_env(SEE_IMDS_ENDPOINT=sim.url, SEE_SINKS="console", SEE_STATE_DIR="",
                    SEE_HEALTH_ADDR=f"0.0.0.0:{port}", SEE_POLL_INTERVAL="0.2")
    with ExporterProcess(env) as proc:
        wait_until(lambda: run("probe", env=env, timeout=30).returncode == 0, 30, "healthz")
        ready = run("probe", "readyz", env=env, timeout=30)
        assert ready.returncode == 0 and '"status": "ready"' in ready.stdout, ready
        # Another port than the health server's: nothing answers there.
        elsewhere = run("probe", env={**env, "SEE_HEALTH_ADDR": f"127.0.0.1:{free_port()}"},
                        timeout=30)
        assert elsewhere.returncode == 1 and "Connection refused" in elsewhere.stderr
        assert proc.terminate() == 0
    disabled = run("probe", env={**env, "SEE_HEALTH_ADDR": ""}, timeout=30)
    assert disabled.returncode == 2 and "SEE_HEALTH_ADDR" in disabled.stderr


def test_run_help_names_exactly_the_variables_of_the_table() -> None:
    from scheduled_events_exporter.config import SETTINGS

    text = run("run", "--help").stdout
    named = set(re.findall(r"\b(?:SEE|OTEL)_[A-Z0-9_]*[A-Z0-9]\b", text))
    assert named == {row.name for row in SETTINGS}


# ------------------------------------------------ check-config --env-file, as the service sees it

SYSTEMD_ENV = Path(__file__).parent.parent / "config" / "systemd" / "scheduled-events-exporter.env"


def test_check_config_reads_an_env_file_as_systemd_does(tmp_path: Path) -> None:
    env_file = tmp_path / "env"
    env_file.write_text('# the service reads this\n; and this is a comment too\n\n'
                        'SEE_SINKS="otlp"\n  OTEL_EXPORTER_OTLP_ENDPOINT = http://collector:4318 \n'
                        "SEE_POLL_INTERVAL='2'\n", encoding="utf-8")
    # The file wins over the shell, as EnvironmentFile= over the unit's Environment=.
    done = run("check-config", "--env-file", str(env_file),
               env=clean_env(SEE_STATE_DIR="", SEE_POLL_INTERVAL="7"))
    assert done.returncode == 0, done.stderr
    assert "SEE_SINKS=otlp\n" in done.stdout and "SEE_POLL_INTERVAL=2\n" in done.stdout
    assert "OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318\n" in done.stdout
    assert done.stderr == ""


def test_the_shipped_env_file_checks_clean(tmp_path: Path) -> None:
    """As shipped it names no sink (the service waits for one: the unit's ExecCondition=); with
    its OTLP lines uncommented, as docs/vm.md says, it checks clean too."""
    done = run("check-config", "--env-file", str(SYSTEMD_ENV), env=clean_env(SEE_STATE_DIR=""))
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert "SEE_HEALTH_ADDR=127.0.0.1:8080" in done.stdout
    text = SYSTEMD_ENV.read_text(encoding="utf-8")
    assert "\n#SEE_SINKS=otlp\n" in text and "\nSEE_SINKS=" not in text
    edited = tmp_path / "env"
    edited.write_text(re.sub(r"^#((?:SEE_SINKS|OTEL_EXPORTER_OTLP_\w+)=)", r"\1", text,
                             flags=re.M), encoding="utf-8")
    done = run("check-config", "--env-file", str(edited), env=clean_env(SEE_STATE_DIR=""))
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert "SEE_SINKS=otlp\n" in done.stdout
    assert "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318\n" in done.stdout


def test_an_env_file_problem_is_one_line_and_exit_2(tmp_path: Path) -> None:
    latin = tmp_path / "latin1"
    latin.write_bytes(b"SEE_SINKS=console\nSEE_LOG_LEVEL=caf\xe9\n")
    dropped = tmp_path / "dropped"
    dropped.write_text("SEE_SINKS=console\n1SEE_LOG_LEVEL=debug\n", encoding="utf-8")
    for args, expected, code in (
        (("--env-file", str(tmp_path / "missing")), "No such file or directory", 2),
        (("--env-file", str(tmp_path)), "Is a directory", 2),
        (("--env-file", str(latin)), "line 2: not UTF-8", 2),
        (("--env-file",), "expected [--unit FILE] [--env-file FILE]...", 2),
        (("--envfile", str(latin)), "expected [--unit FILE] [--env-file FILE]...", 2),
        (("--env-file", str(dropped)), "line 2: '1SEE_LOG_LEVEL' is not a valid variable name",
         0),
    ):
        done = run("check-config", *args)
        assert done.returncode == code, (args, done.stderr)
        assert expected in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.splitlines()) == 1, done.stderr


def test_an_env_file_in_latin1_is_read_where_systemd_reads_no_text(tmp_path: Path) -> None:
    """systemd checks UTF-8 per name and value: a comment (or a line it ignores) written in
    Latin-1 is no error, a value is."""
    env_file = tmp_path / "env"
    env_file.write_bytes("# Exportateur: r\u00e9glages du service\nSEE_SINKS=console\n"
                         .encode("latin-1"))
    done = run("check-config", "--env-file", str(env_file))
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert "SEE_SINKS=console\n" in done.stdout


def as_nobody(*command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``command`` as uid/gid 65534 (what systemd's DynamicUser= is to the files it meets)."""
    return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                           *command], env=env, capture_output=True, text=True, timeout=60,
                          check=False)


def nobody_runs_python() -> str:
    if sys.platform == "win32" or os.geteuid() != 0:
        return "needs root, to run a command as another user"
    try:
        done = as_nobody(sys.executable, "-c", "", env=clean_env())
    except FileNotFoundError:
        return "needs setpriv (util-linux)"
    return "" if done.returncode == 0 else f"uid 65534 cannot run {sys.executable} here"


@pytest.mark.skipif(bool(nobody_runs_python()), reason=nobody_runs_python() or "-")
def test_check_config_as_another_user_behind_a_0700_directory() -> None:
    """systemd's DynamicUser= puts the state under /var/lib/private (0700): an administrator's
    check-config without sudo meets it. One line, exit 2, as run gives; never a traceback."""
    import tempfile

    # Not pytest's tmp_path: its parents are 0700 themselves. Only "private" is, here.
    with tempfile.TemporaryDirectory(prefix="see-") as top:
        Path(top).chmod(0o755)
        private = Path(top) / "private"
        private.mkdir(mode=0o700)
        env = clean_env(SEE_STATE_DIR=str(private / "see"), SEE_HEALTH_ADDR="",
                        SEE_IMDS_ENDPOINT=f"http://127.0.0.1:{free_port()}")
        for command in ("check-config", "run"):
            done = as_nobody(SCRIPT, command, env=env)
            assert done.returncode == 2, (command, done.stderr)
            assert done.stderr == (f"configuration error: SEE_STATE_DIR='{private}/see': "
                                   "expected a writable directory (Permission denied)\n")
        env_file = Path(top) / "env"
        env_file.write_text("SEE_SINKS=console\n", encoding="utf-8")
        env_file.chmod(0o600)
        done = as_nobody(SCRIPT, "check-config", "--env-file", str(env_file), env=env)
        assert done.returncode == 2
        assert done.stderr == (f"check-config: --env-file {env_file}: Permission denied; "
                               "expected a readable file (the service's file is mode 0600: run "
                               "check-config with sudo)\n")


# ------------------------------------------------------------------------ silent no-ops, said

def test_a_misspelt_name_is_named_with_the_closest_known_one() -> None:
    done = run("check-config", env=clean_env(
        SEE_STATE_DIR="", SEE_POLL_INTERVALL="5", OTEL_EXPORTER_OTLP_ENDPIONT="http://c:4318",
        OTEL_METRIC_EXPORT_TIMEOUT="5000", SEE_NOTHING_LIKE_IT="1",
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="http://c:4318", SEE_EVENT_ID="from a hook"))
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        "configuration warning: OTEL_EXPORTER_OTLP_ENDPIONT is set, but the exporter reads no "
        "variable of that name: it has no effect; did you mean OTEL_EXPORTER_OTLP_ENDPOINT? "
        "(run --help lists the variables)",
        "configuration warning: OTEL_METRIC_EXPORT_TIMEOUT is set, but the exporter reads no "
        "variable of that name: it has no effect; unset it (run --help lists the variables)",
        "configuration warning: SEE_NOTHING_LIKE_IT is set, but the exporter reads no variable "
        "of that name: it has no effect; unset it (run --help lists the variables)",
        "configuration warning: SEE_POLL_INTERVALL is set, but the exporter reads no variable "
        "of that name: it has no effect; did you mean SEE_POLL_INTERVAL? (run --help lists the "
        "variables)",
    ]


def test_settings_of_an_unselected_sink_are_said_without_their_values() -> None:
    secret = "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=s;SharedAccessKey=pl4nted"
    done = run("check-config", env=clean_env(
        SEE_STATE_DIR="", SEE_SINKS="otlp", SEE_EVENTHUB_CONNECTION_STRING=secret,
        SEE_EVENTHUB_NAME="hub", OTEL_METRICS_EXPORTER="prometheus"))
    assert done.returncode == 0, done.stderr
    assert "pl4nted" not in done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        "configuration warning: SEE_EVENTHUB_CONNECTION_STRING, SEE_EVENTHUB_NAME are set, but "
        "SEE_SINKS=otlp does not include eventhubs: nothing is sent there; expected eventhubs in "
        "SEE_SINKS, or them unset",
        "configuration warning: OTEL_METRICS_EXPORTER=prometheus leaves out otlp while "
        "SEE_SINKS=otlp includes it: the otlp sink sends log records only, no metrics; expected "
        "OTEL_METRICS_EXPORTER=otlp,prometheus to send metrics both ways",
    ]
    otlp_off = run("check-config", env=clean_env(
        SEE_STATE_DIR="", SEE_SINKS="console", OTEL_EXPORTER_OTLP_HEADERS="api-key=pl4nted"))
    assert otlp_off.stderr == (
        "configuration warning: OTEL_EXPORTER_OTLP_HEADERS is set, but SEE_SINKS=console does "
        "not include otlp: nothing is sent there; expected otlp in SEE_SINKS, or it unset\n")
    # Deliberate choices say nothing: no metrics at all, or both ways.
    for exporters in ("none", "otlp,prometheus"):
        quiet = run("check-config", env=clean_env(SEE_STATE_DIR="", SEE_SINKS="otlp",
                                                  OTEL_METRICS_EXPORTER=exporters))
        assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr


@pytest.mark.timeout(60)
def test_run_gives_the_same_warnings_at_start() -> None:
    env = clean_env(SEE_STATE_DIR="", SEE_HEALTH_ADDR="", SEE_SINKS="console",
                    SEE_IMDS_ENDPOINT=f"http://127.0.0.1:{free_port()}",
                    SEE_POLL_INTERVALL="5", SEE_EVENTHUB_NAMESPACE="ns.servicebus.windows.net")
    checked = run("check-config", env=env).stderr.splitlines()
    assert len(checked) == 2, checked
    with ExporterProcess(env) as proc:
        proc.wait_for(lambda: all(line in proc.stderr_lines for line in checked), 20,
                      "the warnings check-config gives")


def test_a_bare_check_config_says_the_units_file_was_not_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from scheduled_events_exporter import cli

    unit_file = tmp_path / "env"  # stands in for /etc/scheduled-events-exporter/env
    monkeypatch.setattr(cli, "SYSTEMD_ENV_FILE", str(unit_file))
    service = tmp_path / "scheduled-events-exporter.service"  # and the installed unit
    monkeypatch.setattr(cli, "SYSTEMD_UNIT_FILE", str(service))
    for name in [n for n in os.environ if n.startswith(("SEE_", "OTEL_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SEE_STATE_DIR", "")
    assert cli.main(["check-config"]) == 0
    assert capsys.readouterr().err == ""
    unit_file.write_text("SEE_SINKS=otlp\n", encoding="utf-8")
    assert cli.main(["check-config"]) == 0
    assert capsys.readouterr().err == (
        f"configuration warning: {unit_file} exists and was not read: the service reads it, this "
        f"check did not; expected check-config --env-file {unit_file}\n")
    assert cli.main(["check-config", "--env-file", str(unit_file)]) == 0
    assert capsys.readouterr().err == ""
    # With the unit installed, the unit is what to read: its Environment= lines too.
    service.write_text(f"[Service]\nEnvironmentFile=-{unit_file}\nEnvironment=SEE_STATE_DIR=\n",
                       encoding="utf-8")
    assert cli.main(["check-config"]) == 0
    assert capsys.readouterr().err == (
        f"configuration warning: {unit_file} exists and was not read: the service reads it, this "
        f"check did not; expected check-config --unit {service}\n")
    assert cli.main(["check-config", "--unit", str(service)]) == 0
    assert capsys.readouterr().err == ""
