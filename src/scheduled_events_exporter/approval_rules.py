"""Approval rules and decisions (docs/semantics.md#approval-opt-in), pure: no I/O, no clock, no
threads.

:func:`parse_rules` reads the rules of ``SEE_APPROVE`` (the configuration's table of settings
reads the ``SEE_APPROVE*`` variables into an :class:`ApprovalConfig`); :func:`decide` says, for
one event of a document, whether this VM should approve it, skip it (and why), or has nothing
to say. The I/O side (hook, POST, its thread) is
:mod:`scheduled_events_exporter.approval_worker`.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Final, Literal

from scheduled_events_exporter.model import STATUS_SCHEDULED, ScheduledEvent
from scheduled_events_exporter.platforms.shell import Command

RuleKind = Literal["user", "freeze", "type", "all"]
Multi = Literal["leader", "any"]
#: Outcome labels, in the order the metric documentation lists them: ``approved`` and the
#: ``approval_skipped`` reasons of docs/semantics.md#approval-opt-in.
Outcome = Literal["approved", "dry_run", "not_leader", "not_self", "hook_failed", "post_failed"]

#: What SEE_APPROVE holds.
RULES_EXPECTED: Final = "a comma-separated list of user, freeze<=N, type:<EventType>, all"
_FREEZE: Final = re.compile(r"freeze\s*<=\s*(\d{1,10})", re.IGNORECASE)
_EVENT_TYPE: Final = re.compile(r"[A-Za-z][A-Za-z0-9]{0,63}")


@dataclass(frozen=True, slots=True)
class Rule:
    """One ``SEE_APPROVE`` item.

    ``freeze`` uses ``max_duration`` (0 ≤ DurationInSeconds ≤ it, inclusive); ``type`` uses
    ``event_type`` (compared case-insensitively).
    """

    kind: RuleKind
    max_duration: int = 0
    event_type: str = ""

    @property
    def text(self) -> str:
        """The canonical spelling, as reported in approval records (``freeze<=9``)."""
        if self.kind == "freeze":
            return f"freeze<={self.max_duration}"
        if self.kind == "type":
            return f"type:{self.event_type}"
        return self.kind

    def matches(self, event: ScheduledEvent) -> bool:
        """Whether the rule selects ``event`` (status and guard rails are :func:`decide`'s job)."""
        if self.kind == "all":
            return True
        if self.kind == "user":
            return event.source.casefold() == "user"
        if self.kind == "freeze":
            # -1 means "unknown impact": never approve a Freeze whose length nobody told us.
            return (
                event.event_type.casefold() == "freeze"
                and 0 <= event.duration <= self.max_duration
            )
        return event.event_type.casefold() == self.event_type.casefold()


@dataclass(frozen=True, slots=True)
class ApprovalConfig:
    """Validated approval settings; ``None`` in place of it means approval is off."""

    rules: tuple[Rule, ...]
    multi: Multi = "leader"
    dry_run: bool = False
    #: A shell command line, or an argument vector run without a shell (the exec form).
    hook: Command = ""
    hook_timeout: float = 60.0


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do about one event that matched a rule.

    ``reason`` is the outcome label: ``approved`` for ``action == "approve"``, else the skip
    reason (``not_self``, ``not_leader``, ``dry_run``). ``detail`` is a short human explanation.
    """

    event_id: str
    action: Literal["approve", "skip"]
    reason: Outcome
    rule: str
    detail: str = ""


def parse_rules(text: str) -> tuple[tuple[Rule, ...], list[str]]:
    """The rules of a ``SEE_APPROVE`` value and, for each item that is not one, what was
    expected instead (``freeze<=N with N ...``, with ``, got 'item'`` when the value has
    several items)."""
    value = text.strip()
    rules: list[Rule] = []
    wrong: list[str] = []

    def problem(expected: str, item: str) -> None:
        # Name the offending item only when the value has several: 'x': expected ..., got 'x'
        # would say the same thing twice.
        got = "" if item == value else f", got {item!r}"
        wrong.append(f"expected {expected}{got}")

    for part in value.split(","):
        item = part.strip()
        word = item.lower()
        rule: Rule | None = None
        if not item:
            problem(f"{RULES_EXPECTED}, without empty items", item)
        elif word in ("user", "all"):
            rule = Rule("user" if word == "user" else "all")
        elif word.startswith("freeze"):
            match = _FREEZE.fullmatch(item)
            if match is None:
                problem("freeze<=N with N a whole number of seconds >= 0 (e.g. freeze<=9)", item)
            else:
                rule = Rule("freeze", max_duration=int(match.group(1)))
        elif word.startswith("type:"):
            name = item[len("type:") :].strip()
            if _EVENT_TYPE.fullmatch(name) is None:
                problem(
                    "type:<EventType> with an event type such as Reboot, Redeploy, Freeze, "
                    "Preempt or Terminate",
                    item,
                )
            else:
                rule = Rule("type", event_type=name)
        else:
            problem(RULES_EXPECTED, item)
        if rule is None:
            continue
        if rule in rules:
            problem("each rule once", item)
            continue
        rules.append(rule)
    return tuple(rules), wrong


def leader(resources: Iterable[str]) -> str | None:
    """The VM that approves a multi-VM event: the first name sorted case-insensitively."""
    # Ties between names differing only in case (not distinct VMs on Azure) break stably.
    return min(resources, key=lambda r: (r.casefold(), r), default=None)


def decide(
    event: ScheduledEvent,
    *,
    vm_name: str,
    config: ApprovalConfig,
    already_approved: Collection[str],
) -> Decision | None:
    """This VM's approval decision on ``event``, or ``None`` when there is nothing to record.

    ``None`` when no rule matches (no approval record, docs/semantics.md#approval-opt-in), when
    the event is not
    ``Scheduled`` (a Started event needs no approval and is no longer a decision), and when
    this exporter already approved it successfully (never POST or report it twice). Otherwise
    the guard rails apply in this order: ``not_self``, ``not_leader`` (several Resources, this
    VM not the leader, ``multi == "leader"``), ``dry_run``; and if none refuses, ``approve``.

    Pure: the caller reports each (EventId, reason) once, e.g. with :class:`ReportOnce`, since
    the same document is offered every poll.
    """
    rule = next((r for r in config.rules if r.matches(event)), None)
    if rule is None or event.status != STATUS_SCHEDULED:
        # Unknown statuses are tracked like Scheduled but never approved: we cannot know
        # what a POST would mean for them.
        return None
    if event.event_id in already_approved:
        return None
    text = rule.text

    def skip(reason: Outcome, detail: str) -> Decision:
        return Decision(event.event_id, "skip", reason, text, f"{detail} (rule {text})")

    if not event.affects(vm_name):
        return skip("not_self", f"{vm_name or 'this VM (name unknown)'} is not in Resources")
    names = {r.casefold() for r in event.resources}
    first = leader(event.resources)
    is_leader = (first or "").casefold() == vm_name.casefold()
    if len(names) > 1 and config.multi == "leader" and not is_leader:
        return skip("not_leader", f"{first} approves events for {len(names)} VMs")
    if config.dry_run:
        return skip("dry_run", "would approve; SEE_APPROVE_DRY_RUN is set")
    return Decision(event.event_id, "approve", "approved", text, f"rule {text}")


class ReportOnce:
    """Remembers which (EventId, reason) pairs were reported, so a decision repeated on every
    poll yields one record. Not thread-safe: one owner (the approval worker)."""

    def __init__(self) -> None:
        self._seen: set[tuple[str, str]] = set()

    def first(self, event_id: str, reason: str) -> bool:
        """True the first time this pair is seen (and remembers it)."""
        key = (event_id, reason)
        if key in self._seen:
            return False
        self._seen.add(key)
        return True

    def retain(self, event_ids: Collection[str]) -> None:
        """Forget events no longer in the document (bounds memory over months of events)."""
        self._seen = {k for k in self._seen if k[0] in event_ids}
