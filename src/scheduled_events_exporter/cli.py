"""Command line: ``run`` (default), ``platform``, ``check-config``, ``simulate``, ``demo``,
``probe``, ``init-state-dir``, ``redeliver``, ``version``."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from scheduled_events_exporter import __version__
from scheduled_events_exporter.pid1 import split_if_pid1

# Everything else is imported after split_if_pid1(): the init it leaves behind as PID 1 keeps
# only what was loaded before the fork (about 4 MB private instead of 9).
if TYPE_CHECKING:
    from scheduled_events_exporter.config import Config

EXIT_CONFIG = 2


def _load(env: dict[str, str] | None = None, *, create: bool = True,
          command: str = "run") -> Config | None:
    from scheduled_events_exporter.config import ConfigError, load_config

    try:
        config = load_config(env, create=create, command=command)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"configuration error: {problem}", file=sys.stderr)
        return None
    for warning in config.warnings:
        print(f"configuration warning: {warning}", file=sys.stderr)
    return config


def _run() -> int:
    config = _load()
    if config is None:
        return EXIT_CONFIG
    from scheduled_events_exporter.app import run, setup_logging
    from scheduled_events_exporter.platforms import stop as stop_requests

    setup_logging(config.log_level)
    stop, finished = threading.Event(), threading.Event()
    stop_requests.install(stop, finished)
    return run(config, stop, finished)


def _platform(backfill_only: bool) -> int:
    config = _load(command="platform")
    if config is None:
        return EXIT_CONFIG
    from scheduled_events_exporter.app import setup_logging
    from scheduled_events_exporter.platform_feed.service import run
    from scheduled_events_exporter.platforms import stop as stop_requests

    setup_logging(config.log_level)
    stop, finished = threading.Event(), threading.Event()
    stop_requests.install(stop, finished)
    return run(config, stop, finished, backfill_only=backfill_only)


def _probe(path: str) -> int:
    import urllib.error
    import urllib.request

    from scheduled_events_exporter.config import parse_addr

    raw = os.environ.get("SEE_HEALTH_ADDR", "0.0.0.0:8080").strip()
    try:
        host, port = parse_addr(raw) if raw else ("", 0)
    except ValueError:
        host = ""
    if not host:
        print(f"probe: SEE_HEALTH_ADDR={raw!r}: expected HOST:PORT of a running health server",
              file=sys.stderr)
        return EXIT_CONFIG
    host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}/{path}"
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            print(answer.read(4096).decode("utf-8", "replace"))
            return 0 if answer.status == 200 else 1
    except urllib.error.HTTPError as exc:
        print(exc.read(4096).decode("utf-8", "replace"))
        return 1
    except OSError as exc:
        print(f"probe: {url}: {exc}", file=sys.stderr)
        return 1


#: The image's user and group (uid 65532, "nonroot" as in distroless images).
IMAGE_OWNER = (65532, 65532)


def _init_state_dir(args: list[str]) -> int:
    """Create ``DIR`` if missing and hand it to ``UID:GID`` with mode 0700: the DaemonSet's
    root init step for a hostPath state directory (which the kubelet creates root-owned). It
    needs CAP_CHOWN (and CAP_FOWNER once the directory belongs to someone else), no shell, and
    touches nothing inside the directory. A symbolic link in its place is refused."""
    owner = IMAGE_OWNER
    if len(args) == 3 and args[0] == "--owner":
        uid, sep, gid = args[1].partition(":")
        if not (sep and uid.isdigit() and gid.isdigit()):
            print(f"init-state-dir: --owner {args[1]!r}: expected UID:GID, e.g. 65532:65532",
                  file=sys.stderr)
            return EXIT_CONFIG
        owner, args = (int(uid), int(gid)), args[2:]
    if len(args) != 1 or args[0].startswith("-"):
        print("init-state-dir: expected [--owner UID:GID] DIR (see --help)", file=sys.stderr)
        return EXIT_CONFIG
    if sys.platform == "win32":
        print("init-state-dir: POSIX only (on Windows the service creates its state directory "
              "with a protected ACL)", file=sys.stderr)
        return EXIT_CONFIG
    path = args[0]
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            st = os.fstat(fd)
            if (st.st_uid, st.st_gid) != owner or st.st_mode & 0o7777 != 0o700:
                # Mode first, while the caller may still own it; then the owner.
                os.fchmod(fd, 0o700)
                os.fchown(fd, *owner)
        finally:
            os.close(fd)
    except OSError as exc:
        print(f"init-state-dir: {path}: {exc.strerror or exc} (expected a directory this "
              "process may create and chown: root with CAP_CHOWN and CAP_FOWNER)",
              file=sys.stderr)
        return 1
    print(f"init-state-dir: {path} belongs to {owner[0]}:{owner[1]}, mode 0700")
    return 0


#: Where config/systemd/'s unit reads its environment file (EnvironmentFile=).
SYSTEMD_ENV_FILE = "/etc/scheduled-events-exporter/env"
#: Where docs/vm.md installs config/systemd/'s unit.
SYSTEMD_UNIT_FILE = "/etc/systemd/system/scheduled-events-exporter.service"
#: The names the exporter's settings have (what a shell could set and a service not get).
_OURS = ("SEE_", "OTEL_")


def _check_config(args: list[str]) -> int:
    from pathlib import Path

    from scheduled_events_exporter.env_file import EnvFileError, read_env_file
    from scheduled_events_exporter.unit_env import UnitError, read_unit_environment

    options = list(zip(args[0::2], args[1::2], strict=False))  # (odd: refused below)
    units = [value for option, value in options if option == "--unit"]
    files = [value for option, value in options if option == "--env-file"]
    if len(args) % 2 or len(units) > 1 or len(units) + len(files) != len(options):
        print("check-config: expected [--unit FILE] [--env-file FILE]... (see --help), got "
              f"{' '.join(args)!r}", file=sys.stderr)
        return EXIT_CONFIG
    env = dict(os.environ)
    notes: list[str] = []
    if units:
        # A system service gets its environment from its unit, nothing from this shell.
        shell = sorted(name for name in env if name.startswith(_OURS))
        env = {name: value for name, value in env.items() if not name.startswith(_OURS)}
        try:
            unit = read_unit_environment(Path(units[0]))
        except UnitError as exc:
            print(f"check-config: --unit {units[0]}: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        env.update(unit.values)
        notes.extend(f"{name} is set in this shell, but the service does not get this shell's "
                     "environment: not checked; expected it in the unit or its environment file"
                     for name in shell if name not in unit.values)
        notes.extend(unit.notes)
    for name in files:
        try:
            parsed = read_env_file(Path(name))
        except EnvFileError as exc:
            print(f"check-config: --env-file {name}: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        # As systemd: the file's assignments replace what the unit's Environment= set.
        env.update(parsed.values)
        notes.extend(f"{name}: {note}" for note in parsed.ignored)
    if not options and sys.platform != "win32" and os.path.isfile(SYSTEMD_ENV_FILE):
        how = (f"--unit {SYSTEMD_UNIT_FILE}" if os.path.isfile(SYSTEMD_UNIT_FILE)
               else f"--env-file {SYSTEMD_ENV_FILE}")
        notes.append(f"{SYSTEMD_ENV_FILE} exists and was not read: the service reads it, this "
                     f"check did not; expected check-config {how}")
    for note in notes:
        print(f"configuration warning: {note}", file=sys.stderr)
    # A platform setup (a queue named) is checked as the platform command checks it.
    platform = any(env.get(name, "").strip() for name in (
        "SEE_PLATFORM_QUEUE_URL", "SEE_PLATFORM_QUEUE_CONNECTION_STRING",
        "SEE_PLATFORM_QUEUE_NAME"))
    config = _load(env, create=False, command="platform" if platform else "run")
    if config is None:
        return EXIT_CONFIG
    from scheduled_events_exporter.config import extras_outside_core

    for warning in extras_outside_core(config, env):
        print(f"configuration warning: {warning}", file=sys.stderr)
    for line in config.describe(env):
        print(line)
    return 0


COMMANDS = {
    "run": "poll IMDS and ship every change (the default when no command is given)",
    "platform": "read the platform's own record of every VM's scheduled events (Event Grid "
                "through a Storage queue; Resource Graph with --backfill) and ship it as run "
                "ships IMDS's",
    "check-config": "validate the SEE_*/OTEL_* environment, print the effective configuration "
                    "(secrets redacted) and exit; changes nothing",
    "demo": "play a scenario against a simulated IMDS on loopback, console output, no Azure "
            "needed",
    "simulate": "serve a simulated IMDS on loopback for your own tests",
    "probe": "ask the running exporter's /healthz (or /readyz) where SEE_HEALTH_ADDR says: "
             "exit 0 when it answers 200 (the image's HEALTHCHECK; an exec probe)",
    "init-state-dir": "create a state directory and hand it to the image's user (65532) with "
                      "mode 0700: the DaemonSet's init step for a hostPath, no shell needed",
    "redeliver": "put dead-lettered records back into their sink's spool, with their "
                 "original log.record.uid, once the cause is fixed (the exporter stopped, or at "
                 "its next start)",
    "version": "print the version",
}

_TOP_HELP = f"""usage: scheduled-events-exporter [COMMAND] [--help] [--version]

Azure Scheduled Events -> OpenTelemetry log records and metrics (OTLP, Azure Event Hubs,
console). Configured by SEE_* and OTEL_* environment variables only (README, "Configuration").

commands:
{chr(10).join(f"  {name:{max(map(len, COMMANDS)) + 2}}{text}" for name, text in COMMANDS.items())}

Without a command it runs. "scheduled-events-exporter COMMAND --help" describes each one.
"""

_RUN_HELP = """usage: scheduled-events-exporter [run]

Poll the IMDS Scheduled Events document (SEE_IMDS_ENDPOINT, default http://169.254.169.254,
every SEE_POLL_INTERVAL seconds) and turn every change into a log record and metrics, shipped to
the sinks in SEE_SINKS (otlp, eventhubs, console). Runs until SIGTERM or SIGINT, then drains the
sinks within SEE_SHUTDOWN_TIMEOUT seconds.

Reads (the OTLP ones also per signal, with LOGS_ or METRICS_ after OTLP_, which wins):
{variables}.
The README's "Configuration" table says what each one means; "check-config" prints the
effective values.

Exit codes: 0 after a clean shutdown (records not delivered in time stay in the spool); 2 for a
configuration error (one line per problem on stderr; a restart cannot fix it); 1 when the start
failed for a reason that may pass (e.g. a port held by another process) or a shutdown was still
stuck SEE_SHUTDOWN_TIMEOUT + 5 s after the signal.
"""


def _run_help() -> str:
    import textwrap

    from scheduled_events_exporter.config import SETTINGS

    return _RUN_HELP.format(variables=textwrap.fill(", ".join(r.name for r in SETTINGS), 96))


_CHECK_HELP = """usage: scheduled-events-exporter check-config [--unit FILE] [--env-file FILE]...

Validate the configuration exactly as "run" would (the same variables: see "run --help"), print
the effective value of every setting with secrets redacted, and exit: 0 when "run" would start,
2 with one line per problem otherwise. It creates, writes and connects to nothing. A default in
effect is marked "(default)"; while the otlp sink sends metrics, that includes their temporality
and histogram aggregation (OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE,
OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION), which decide the rules file and the
dashboard setting of an Azure Monitor route (docs/consumption.md, "Pick a route").

--unit FILE: the environment a systemd service gets from its unit FILE (and FILE.d/*.conf):
its Environment= and EnvironmentFile= lines, in systemd's order and syntax, instead of this
shell's environment; for the service of docs/vm.md:
  sudo scheduled-events-exporter check-config \\
    --unit /etc/systemd/system/scheduled-events-exporter.service
--env-file FILE: also read FILE, in systemd's EnvironmentFile= syntax (KEY=VALUE lines,
comments, quotes), over this shell's environment (or the unit's), as the service gets it.
Warnings (stderr, as at "run" start) name what is set but has no effect: an unknown SEE_* or
OTEL_* name, settings of a sink SEE_SINKS does not select, lines systemd would ignore.
"""

_PROBE_HELP = """usage: scheduled-events-exporter probe [healthz|readyz]

GET the running exporter's /healthz (default) or /readyz at SEE_HEALTH_ADDR (default
0.0.0.0:8080, asked on 127.0.0.1 when it listens on every interface) and print the answer.
Exit codes: 0 when it answers 200; 1 otherwise (503, nothing listening, a timeout of 2 s);
2 when SEE_HEALTH_ADDR is empty (no health server) or invalid.
"""

_INIT_STATE_DIR_HELP = """usage: scheduled-events-exporter init-state-dir [--owner UID:GID] DIR

Create DIR if it is missing and give it to UID:GID (default 65532:65532, the image's user) with
mode 0700; nothing inside it is touched. For a Kubernetes init container that prepares a
hostPath state directory (the kubelet creates it root-owned): run as root with the CHOWN and
FOWNER capabilities only. Exit codes: 0 done; 1 the directory could not be made or changed
(the line says why); 2 wrong arguments.
"""

_PLATFORM_HELP = """usage: scheduled-events-exporter platform [--backfill]

A fleet-level process (one per subscription or team, not per VM): read the platform's own record
of scheduled events, which Azure publishes to Event Grid (system topic
Microsoft.ResourceNotifications.MaintenanceResources) and Resource Graph for every VM, scale set
and availability set whose scheduledEventsPolicy enables it, and ship it through the same
tracker, records and sinks as run (every record says observer=platform). It reads the Storage
queue an Event Grid subscription delivers to: SEE_PLATFORM_QUEUE_URL (DefaultAzureCredential),
or SEE_PLATFORM_QUEUE_CONNECTION_STRING and SEE_PLATFORM_QUEUE_NAME. A message is deleted only
once its records are in every sink's spool; one it cannot read goes to the dead-letter file.
Its files are in SEE_STATE_DIR/platform/ (required).

--backfill: read Resource Graph's maintenanceresources once (the latest status of each event:
what the queue missed), ship what is new to the state, and exit. SEE_PLATFORM_BACKFILL=start
does the same at every start, before the queue.

Reads the SEE_PLATFORM_* variables and run's (sinks, state, health, metrics; see run --help).
Exit codes as run's; 3 when another platform process holds its state directory.
"""

_VERSION_HELP = """usage: scheduled-events-exporter version

Print the exporter's version (also: scheduled-events-exporter --version).
"""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``scheduled-events-exporter`` console script."""
    split_if_pid1()  # in a container without an init: become one, go on in the child
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0].startswith("-"):
        if args and args[0] in ("-h", "--help"):
            print(_TOP_HELP, end="")
            return 0
        if args and args[0] in ("-V", "--version"):
            print(__version__)
            return 0
        command, rest = "run", args
    else:
        command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"scheduled-events-exporter: unknown command {command!r}; expected one of "
              f"{', '.join(COMMANDS)} (see --help)", file=sys.stderr)
        return EXIT_CONFIG
    if command == "simulate":
        from scheduled_events_exporter.simulator.cli import main as simulate

        return simulate(rest)
    if command == "demo":
        from scheduled_events_exporter.demo import main as demo

        return demo(rest)
    if command == "redeliver":
        from scheduled_events_exporter.redeliver import main as redeliver

        return redeliver(rest)
    helps = {"check-config": _CHECK_HELP, "version": _VERSION_HELP, "probe": _PROBE_HELP,
             "init-state-dir": _INIT_STATE_DIR_HELP, "platform": _PLATFORM_HELP}
    if rest in (["-h"], ["--help"]):
        print(helps[command] if command in helps else _run_help(), end="")
        return 0
    if command == "init-state-dir":
        return _init_state_dir(rest)
    if command == "probe" and rest in ([], ["healthz"], ["readyz"]):
        return _probe(rest[0] if rest else "healthz")
    if command == "check-config":
        return _check_config(rest)
    if command == "platform" and rest in ([], ["--backfill"]):
        return _platform(backfill_only=rest == ["--backfill"])
    if rest:
        print(f"scheduled-events-exporter {command}: unexpected arguments: {' '.join(rest)} "
              f"(it is configured by environment variables; see "
              f"'scheduled-events-exporter {command} --help')", file=sys.stderr)
        return EXIT_CONFIG
    if command == "version":
        print(__version__)
        return 0
    return _run()
