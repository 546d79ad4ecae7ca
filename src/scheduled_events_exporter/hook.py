"""The approval hook (docs/semantics.md#approval-opt-in): ``SEE_APPROVE_HOOK`` run with the event,
bounded in time.

A hook drains a node, checkpoints a job or leaves a load balancer before Azure may start the
maintenance; only exit status 0 lets the approver POST. This module knows how to run one safely
(own process group, killed at the timeout, secrets removed from its environment, output kept
short); when to run it is :mod:`.approval_worker`'s business.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import timezone
from email.utils import format_datetime

from scheduled_events_exporter.config import SECRET_VARIABLES
from scheduled_events_exporter.model import ScheduledEvent
from scheduled_events_exporter.platforms.shell import SHELL, Command, Shell
from scheduled_events_exporter.records import rfc3339


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


def hook_environment(
    event: ScheduledEvent, base: Mapping[str, str], *, drop: Collection[str] = (),
    shell: Shell = SHELL,
) -> dict[str, str]:
    """The hook's environment: from ``base`` only what the OS's shell needs (``Shell.inherits``:
    PATH, HOME, the locale, ...; on Windows SystemRoot, TEMP, ...) and the names the user lists
    in ``SEE_APPROVE_HOOK_ENV`` (never those in ``drop``, the exporter's own secrets), plus
    ``SEE_EVENT_*``. A hook may well log its environment: an allow-list keeps
    ``AZURE_CLIENT_SECRET``, OTLP headers and the like out of it."""
    fold = str.upper if shell.case_insensitive else str
    wanted = {fold(n.strip()) for n in base.get("SEE_APPROVE_HOOK_ENV", "").split(",")
              if n.strip()}
    dropped = {fold(n) for n in drop}
    env = {k: v for k, v in base.items()
           if (shell.inherits(k) or fold(k) in wanted) and fold(k) not in dropped}
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
    command: Command, event: ScheduledEvent, timeout: float, *, cancel: threading.Event,
    shell: Shell = SHELL,
) -> HookResult:
    """Run ``command`` with the OS's shell (``/bin/sh -c``; Windows PowerShell), or an argument
    vector as it is, with the event on stdin; kill its whole process tree at ``timeout`` or
    when ``cancel`` is set. Its output goes to the result (never to our stdout, which is the
    console sink's)."""
    started = time.monotonic()
    try:
        running = shell.start(command, hook_environment(event, os.environ, drop=SECRET_VARIABLES,
                                                        shell=shell))
    except (OSError, ValueError) as exc:
        # ValueError: a NUL byte in an event field cannot be passed in an environment; that
        # event's hook fails, the other events of the document are decided as usual.
        return HookResult(None, time.monotonic() - started, error=f"cannot start the hook: {exc}")
    output = bytearray()
    try:
        ended = running.exchange(
            json.dumps(event_json(event)).encode() + b"\n", output,
            lambda: cancel.is_set() or time.monotonic() >= started + timeout)
        if not ended:
            running.kill_tree()
    finally:
        running.close()
    text = output.decode("utf-8", errors="replace").strip()
    return HookResult(running.proc.returncode if ended else None, time.monotonic() - started,
                      timed_out=not ended, output=text)


