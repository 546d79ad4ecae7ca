"""``scheduled-events-exporter redeliver``: dead letters back into their sinks' spools.

Once what made a collector or a hub refuse records is fixed (a schema, a quota, a size limit),
the records in ``SEE_STATE_DIR/dead-letter.jsonl`` can be sent on: this command takes them
(all, or ``--sink``, ``--event-id``, ``--since``), puts them back into their sink's spool with
their original ``log.record.uid`` and in their original order (:mod:`.delivery.redrive`), and
marks them ``redelivered`` in the dead-letter file. ``--dry-run`` only lists them.

It takes the state directory's lock first, like ``run``: the exporter reads its spools only at
start, so it must be stopped meanwhile (``--wait`` waits for a stopping one); the records go
out at its next start.
"""

from __future__ import annotations

import os
import sys
from datetime import datetime, timezone
from pathlib import Path

from scheduled_events_exporter.config import default_state_dir
from scheduled_events_exporter.delivery import redrive
from scheduled_events_exporter.platforms import dir_lock

#: Another exporter (or redeliver) holds the state directory (as ``run``'s exit code).
EXIT_BUSY = 3
EXIT_USAGE = 2

HELP = """usage: scheduled-events-exporter redeliver [--sink NAME] [--event-id ID] [--since TIME]
              [--dry-run | --at-next-start] [--wait SECONDS] [--state-dir DIR]

Put dead-lettered records (SEE_STATE_DIR/dead-letter.jsonl and its older files, .1 to .3) back
into their sink's spool, with their original log.record.uid and in their original order, and
mark them "redelivered" in the dead-letter file; the exporter delivers them at its next start.
Run it once the cause is fixed (the collector's schema, limit or quota), with the exporter
stopped: it takes the state directory's lock, as "run" does.

  --sink NAME        only letters of this sink (otlp, eventhubs, console)
  --event-id ID      only letters of this EventId (in any letter case)
  --since TIME       only letters written at or after TIME (RFC 3339, e.g. 2026-11-27T10:00:00Z)
  --dry-run          list what would be put back, change nothing (the lock is not taken)
  --at-next-start    do not wait for the lock: leave the request in the state directory, and
                     the exporter carries it out at its next start, under its own lock (for a
                     container: request, then restart the pod)
  --wait SECONDS     wait up to SECONDS for a stopping exporter to free the directory (default 0)
  --state-dir DIR    the state directory (default: SEE_STATE_DIR, else the platform default;
                     the platform command's is its platform/ directory)

A letter is skipped, with the reason, when it was redelivered before, when this release cannot
read its record either, or when a release before this command wrote it (those letters hold the
record as sent, not as stored). It puts back all it takes or none: when a file cannot be written,
what it appended is taken back and it says so. Records a crash left in the state file's outbox go
into the spool first, so no letter is numbered before them. Exit codes: 0 done (also when nothing
matched); 1 a file could not be read or written (nothing changed, unless the line says what
stays); 2 wrong arguments; 3 the state directory is held by a running exporter.
"""


def main(args: list[str]) -> int:
    """Parse ``args`` and run; returns the exit code."""
    if args in (["-h"], ["--help"]):
        print(HELP, end="")
        return 0
    options: dict[str, str] = {}
    flags = {"--dry-run", "--at-next-start"}
    valued = {"--sink", "--event-id", "--since", "--wait", "--state-dir"}
    rest = list(args)
    while rest:
        name = rest.pop(0)
        if name in flags:
            options[name] = ""
        elif name in valued and rest:
            options[name] = rest.pop(0)
        else:
            return _usage(f"unexpected {name!r}" + (" without a value" if name in valued
                                                     else ""))
    try:
        selection = redrive.Selection(options.get("--sink"), options.get("--event-id"),
                                      _since(options.get("--since")))
        wait = float(options.get("--wait", "0"))
        if not 0 <= wait <= 3600:
            raise ValueError(f"--wait {wait}: expected 0 to 3600 seconds")
    except ValueError as exc:
        return _usage(str(exc))
    if selection.sink is not None and selection.sink not in redrive.SINKS:
        return _usage(f"--sink {selection.sink!r}: expected one of "
                      f"{', '.join(sorted(redrive.SINKS))}")
    if "--state-dir" not in options and "SEE_STATE_DIR" in os.environ and \
            not os.environ["SEE_STATE_DIR"].strip():
        print("redeliver: SEE_STATE_DIR is empty: state is off, so there are no spools and no "
              "dead-letter file (name the exporter's directory with --state-dir)",
              file=sys.stderr)
        return 1
    directory = Path(options.get("--state-dir") or os.environ.get("SEE_STATE_DIR", "").strip()
                     or default_state_dir(os.environ))
    if not directory.is_dir():
        print(f"redeliver: {directory}: no such state directory (expected SEE_STATE_DIR or "
              "--state-dir to name the exporter's)", file=sys.stderr)
        return 1
    try:
        directory = _as_owner(directory)
    except OSError as exc:
        print(f"redeliver: cannot become the owner of {directory}: {exc}", file=sys.stderr)
        return 1
    if "--dry-run" in options and "--at-next-start" in options:
        return _usage("--dry-run and --at-next-start exclude each other")
    if not redrive.letter_files(directory):
        elsewhere = (" (the platform command keeps its own in its platform/ directory: "
                     f"--state-dir {directory / 'platform'})"
                     if redrive.letter_files(directory / "platform") else "")
        print(f"redeliver: {directory} holds no dead-letter file: nothing was refused for good "
              f"there{elsewhere}", file=sys.stderr)
        return 0
    if "--dry-run" in options:
        return _report(redrive.plan(directory, selection), applied=None)
    if "--at-next-start" in options:
        chosen = redrive.plan(directory, selection)
        try:
            path = redrive.request(directory, selection, datetime.now(timezone.utc))
        except OSError as exc:
            print(f"redeliver: {directory}: {exc}", file=sys.stderr)
            return 1
        _report(chosen, applied=None)
        print(f"redeliver: requested in {path}; the exporter carries it out at its next "
              "start (restart it, or delete the pod)", file=sys.stderr)
        return 0
    try:
        lock = dir_lock.acquire(directory, wait=wait)
    except dir_lock.DirectoryBusy as busy:
        print(f"redeliver: cannot take the state directory: {busy}. The exporter reads its "
              "spools only at start: leave the request with --at-next-start and restart it (on "
              "Kubernetes: delete the pod, docs/kubernetes.md), or stop it (systemctl stop "
              "scheduled-events-exporter), run redeliver, start it again; --wait waits for one "
              "that is stopping", file=sys.stderr)
        return EXIT_BUSY
    except OSError as exc:
        print(f"redeliver: {directory}: {exc}", file=sys.stderr)
        return 1
    try:
        chosen = redrive.plan(directory, selection)
        applied = redrive.apply(directory, chosen, datetime.now(timezone.utc))
    except OSError as exc:
        # redrive.Unapplied says whether anything stays changed (its undo failed too).
        print(f"redeliver: could not put the letters back: {exc}", file=sys.stderr)
        return 1
    finally:
        lock.release()
    return _report(chosen, applied=applied)


def _as_owner(directory: Path) -> Path:
    """Run as the state directory's owner when started as root (POSIX): every file this command
    writes must stay the service's (a systemd unit's dynamic user, the image's 65532), or the
    exporter could no longer write its own spool. It changes into the directory first, as
    root, because its parents may be closed to that user (systemd keeps a dynamic user's state
    under a 0700 /var/lib/private), and from then on works on ``.``."""
    if sys.platform == "win32" or os.geteuid() != 0:
        return directory
    owner = directory.stat()
    if owner.st_uid == 0:
        return directory
    os.chdir(directory)
    os.setgroups([])
    os.setgid(owner.st_gid)
    os.setuid(owner.st_uid)
    print(f"redeliver: running as the state directory's owner (uid {owner.st_uid})",
          file=sys.stderr)
    return Path(".")


def _since(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"--since {text!r}: expected an RFC 3339 time, e.g. "
                         "2026-11-27T10:00:00Z") from None
    if moment.tzinfo is None:
        raise ValueError(f"--since {text!r}: expected a time with a UTC offset or Z")
    return moment


def _usage(problem: str) -> int:
    print(f"redeliver: {problem} (see 'scheduled-events-exporter redeliver --help')",
          file=sys.stderr)
    return EXIT_USAGE


def _report(chosen: redrive.Plan, applied: list[tuple[redrive.Taken, int]] | None) -> int:
    verb = "would redeliver" if applied is None else "redelivered"
    seqs = {id(item): seq for item, seq in applied or ()}
    for item in chosen.taken:
        letter = item.letter
        where = f" (spool seq {seqs[id(item)]})" if id(item) in seqs else ""
        print(f"{verb}: {letter.time} {letter.sink} {letter.status} EventId "
              f"{letter.event_id or '-'} {letter.transition} RecordId {letter.record_id}{where}")
    for skip in chosen.skipped:
        letter = skip.letter
        if skip.reason == redrive.ALREADY:
            continue  # counted in the summary: they pile up over the weeks
        print(f"skipped: {letter.time} {letter.sink} {letter.status} EventId "
              f"{letter.event_id or '-'} RecordId {letter.record_id or '-'}: {skip.reason}")
    print(summary(chosen, applied is not None), file=sys.stderr)
    return 0


def summary(chosen: redrive.Plan, applied: bool) -> str:
    """One line: how many records (would) go back to which spools, how many were skipped."""
    already = chosen.redelivered_before
    skipped = (f"{len(chosen.skipped)} skipped ({already} of them redelivered before)"
               if already else f"{len(chosen.skipped)} skipped")
    if not chosen.taken:
        return f"redeliver: nothing to put back, {skipped}"
    sinks = ", ".join(sorted({item.letter.sink for item in chosen.taken}))
    done = ("put back into the spool; they go out at the exporter's next start" if applied
            else "would be put back")
    return (f"redeliver: {len(chosen.taken)} dead-lettered records {done} (sinks: {sinks}), "
            f"{skipped}")
