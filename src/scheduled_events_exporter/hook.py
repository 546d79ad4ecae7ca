"""The approval hook (docs/semantics.md#approval-opt-in): ``SEE_APPROVE_HOOK`` run with the event,
bounded in time.

A hook drains a node, checkpoints a job or leaves a load balancer before Azure may start the
maintenance; only exit status 0 lets the approver POST. This module knows how to run one safely
(own process group, killed at the timeout, secrets removed from its environment, output kept
short); when to run it is :mod:`.approver`'s business.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import timezone
from email.utils import format_datetime
from typing import Final

from scheduled_events_exporter.config import SECRET_VARIABLES
from scheduled_events_exporter.model import ScheduledEvent
from scheduled_events_exporter.records import rfc3339

_OUTPUT_TAIL: Final = 2048


@dataclass(frozen=True, slots=True)
class HookResult:
    """How one hook run ended. ``exit_code`` is ``None`` when it timed out or did not start."""

    exit_code: int | None
    duration: float
    timed_out: bool = False
    error: str = ""
    output: str = ""

    @property
    def ok(self) -> bool:
        """Only exit status 0 allows the POST."""
        return self.exit_code == 0 and not self.timed_out

    def describe(self) -> str:
        """``exit 3 after 0.2 s``, ``timeout after 1 s (process group killed)``, ..."""
        took = f"after {self.duration:.1f} s"
        if self.timed_out:
            return f"timeout {took} (process group killed)"
        if self.exit_code is None:
            return f"could not start: {self.error}"
        if self.exit_code < 0:
            return f"killed by signal {-self.exit_code} {took}"
        return f"exit {self.exit_code} {took}"


def event_json(event: ScheduledEvent) -> dict[str, object]:
    """The event with IMDS field names, as a hook reads it on stdin (NotBefore in RFC 1123)."""
    if event.not_before is not None:
        not_before = format_datetime(event.not_before.astimezone(timezone.utc), usegmt=True)
    else:
        not_before = event.not_before_raw
    return {
        "EventId": event.event_id,
        "EventStatus": event.status,
        "EventType": event.event_type,
        "ResourceType": event.resource_type,
        "Resources": list(event.resources),
        "NotBefore": not_before,
        "Description": event.description,
        "EventSource": event.source,
        "DurationInSeconds": event.duration,
    }


#: What a hook inherits from the exporter's environment: enough to run programs and read the
#: locale, nothing else (the exporter's credentials never reach it).
HOOK_BASE_VARIABLES = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE",
                                 "TZ", "TMPDIR", "KUBERNETES_SERVICE_HOST",
                                 "KUBERNETES_SERVICE_PORT"})


def hook_environment(
    event: ScheduledEvent, base: Mapping[str, str], *, drop: Collection[str] = ()
) -> dict[str, str]:
    """The hook's environment: from ``base`` only :data:`HOOK_BASE_VARIABLES`, ``LC_*`` and the
    names the user lists in ``SEE_APPROVE_HOOK_ENV`` (never those in ``drop``, the exporter's own
    secrets), plus ``SEE_EVENT_*``. A hook may well log its environment: an allow-list keeps
    ``AZURE_CLIENT_SECRET``, OTLP headers and the like out of it."""
    wanted = {n.strip() for n in base.get("SEE_APPROVE_HOOK_ENV", "").split(",") if n.strip()}
    env = {k: v for k, v in base.items()
           if (k in HOOK_BASE_VARIABLES or k.startswith("LC_") or k in wanted) and k not in drop}
    env.update(
        SEE_EVENT_ID=event.event_id,
        SEE_EVENT_TYPE=event.event_type,
        SEE_EVENT_STATUS=event.status,
        SEE_EVENT_SOURCE=event.source,
        SEE_EVENT_RESOURCES=",".join(event.resources),
        SEE_EVENT_NOT_BEFORE=rfc3339(event.not_before) if event.not_before else "",
        SEE_EVENT_DURATION=str(event.duration),
    )
    return env


def run_hook(
    command: str, event: ScheduledEvent, timeout: float, *, cancel: threading.Event
) -> HookResult:
    """Run ``/bin/sh -c command`` with the event on stdin; kill its process group at ``timeout``
    or when ``cancel`` is set. Its output goes to the result (never to our stdout, which is the
    console sink's)."""
    started = time.monotonic()
    try:
        # Its own session (process group), so a timeout kills whatever it spawned too.
        proc = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env=hook_environment(event, os.environ, drop=SECRET_VARIABLES),
                                start_new_session=True)
    except (OSError, ValueError) as exc:
        # ValueError: a NUL byte in an event field cannot be passed in an environment; that
        # event's hook fails, the other events of the document are decided as usual.
        return HookResult(None, time.monotonic() - started, error=f"cannot start the hook: {exc}")
    assert proc.stdin is not None and proc.stdout is not None
    pending = json.dumps(event_json(event)).encode() + b"\n"
    output = bytearray()
    timed_out = False
    # One loop feeds stdin, collects output and watches the clock. Not communicate(): it waits
    # for EOF on stdout, which a background child (`nohup x &`) can hold open long after the
    # hook itself exited 0.
    with selectors.DefaultSelector() as sel:
        for pipe, mask in ((proc.stdin, selectors.EVENT_WRITE),
                           (proc.stdout, selectors.EVENT_READ)):
            os.set_blocking(pipe.fileno(), False)
            sel.register(pipe, mask)
        while proc.poll() is None:
            if cancel.is_set() or time.monotonic() >= started + timeout:
                timed_out = True
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    # The shell is not reaped yet, so its pid (the group id) cannot be reused.
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                break
            for key, _ in sel.select(0.05):
                if key.fileobj is proc.stdin:
                    try:
                        pending = pending[os.write(proc.stdin.fileno(), pending) :]
                    except BlockingIOError:
                        continue
                    except OSError:  # the hook does not read stdin: fine
                        pending = b""
                    if not pending:
                        sel.unregister(proc.stdin)
                        proc.stdin.close()
                elif not _read_into(proc.stdout.fileno(), output):
                    sel.unregister(proc.stdout)
        _read_into(proc.stdout.fileno(), output)
    proc.stdin.close()
    proc.stdout.close()
    text = output.decode("utf-8", errors="replace").strip()
    return HookResult(None if timed_out else proc.returncode, time.monotonic() - started,
                      timed_out=timed_out, output=text)


def _read_into(fd: int, buffer: bytearray) -> bool:
    """Read what is available; False at EOF. Keeps only the tail (a chatty hook costs no RAM)."""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if not chunk:
            return False
        buffer += chunk
        del buffer[:-_OUTPUT_TAIL]
