"""Scenario files for the IMDS simulator (docs/semantics.md#simulator): faults, loading,
validation, rendering.

A scenario is a JSON file in ``config/scenarios/`` (shipped inside the package as
``scheduled_events_exporter/simulator/scenario_files/*.json``): a list of steps, each replacing
the whole Events list at a virtual time, played at a speed factor. This module has no HTTP in
it; the simulator imports it, never the reverse. Faults a scenario injects are
:mod:`.faults`.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from email.utils import formatdate
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import cast

from scheduled_events_exporter.simulator.faults import Fault
from scheduled_events_exporter.simulator.jsonread import (
    ScenarioError,
    freeze,
    number,
    opt,
    req,
    short,
    thaw,
)

__all__ = ["DEFAULT_VM_NAME", "Fault", "Scenario", "ScenarioError", "Step", "list_scenarios",
           "load_scenario", "parse_scenario", "scenario_dir"]

if sys.version_info >= (3, 11):
    from importlib.resources.abc import Traversable
else:  # pragma: no cover - Python 3.10
    from importlib.abc import Traversable

DEFAULT_VM_NAME = "vm-sim-0"

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")


@dataclass(frozen=True)
class Step:
    """One scenario step: at virtual second ``at`` the Events list becomes ``events``.

    Events are read-only templates: ``NotBefore`` may be ``{"in": seconds}`` (virtual), rendered
    by :meth:`Scenario.render`.
    """

    at: float
    events: tuple[Mapping[str, object], ...]
    incarnation: int | None = None
    fault: Fault | None = None
    note: str = ""


@dataclass(frozen=True)
class Scenario:
    """A parsed scenario file. ``speed`` is the intended speed factor (virtual s per real s)."""

    name: str
    description: str
    steps: tuple[Step, ...]
    vm_name: str = DEFAULT_VM_NAME
    speed: float = 1.0
    instance: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    source: str = ""

    def real_duration(self, speed: float | None = None) -> float:
        """Real seconds from the start of playback to the last step at ``speed`` (default own)."""
        return self.steps[-1].at / (self.speed if speed is None else speed)

    def render(self, step: Step, *, start: float, speed: float, vm_name: str | None = None,
               id_map: Mapping[str, str] | None = None) -> list[dict[str, object]]:
        """The step's Events as IMDS serves them, for a playback that began at wall ``start``.

        ``{"in": s}`` becomes ``start + (step.at + s) / speed``, as RFC 1123 GMT (the documented
        form) rounded to the second. Using the step's nominal time, not the moment it was applied,
        keeps a NotBefore that later steps restate (``at + in`` unchanged) identical to the second.
        Resources naming the scenario's own VM become ``vm_name``, so a scenario keeps affecting
        "this VM" whatever it is called; ``id_map`` swaps EventIds (fresh ids for a replay).
        """
        rename = vm_name if vm_name and vm_name.casefold() != self.vm_name.casefold() else None
        rendered: list[dict[str, object]] = []
        for template in step.events:
            event = cast(dict[str, object], thaw(template))
            not_before = event.get("NotBefore")
            if isinstance(not_before, dict):
                when = start + (step.at + float(not_before["in"])) / speed
                event["NotBefore"] = formatdate(float(round(when)), usegmt=True)
            resources_ = event.get("Resources")
            if rename is not None and isinstance(resources_, list):
                own = self.vm_name.casefold()
                event["Resources"] = [rename if isinstance(r, str) and r.casefold() == own else r
                                      for r in resources_]
            if id_map is not None and isinstance(event.get("EventId"), str):
                event["EventId"] = id_map.get(cast(str, event["EventId"]), event["EventId"])
            rendered.append(event)
        return rendered


def scenario_dir() -> Traversable:
    """The directory holding the bundled scenario files (works installed and in a checkout)."""
    return resources.files("scheduled_events_exporter.simulator") / "scenario_files"


def list_scenarios() -> list[str]:
    """Names of the bundled scenarios, sorted."""
    return sorted(entry.name[: -len(".json")] for entry in scenario_dir().iterdir()
                  if entry.name.endswith(".json") and entry.is_file())


def load_scenario(name_or_path: str) -> Scenario:
    """Load a bundled scenario by name (``live-migration``) or any scenario file by path."""
    if name_or_path.endswith(".json") or "/" in name_or_path or "\\" in name_or_path:
        path = Path(name_or_path)
        label, source = path.stem, str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ScenarioError(f"scenario file {name_or_path}: cannot read it: {exc}") from exc
    else:
        entry = scenario_dir() / f"{name_or_path}.json"
        if not _NAME_RE.match(name_or_path) or not entry.is_file():
            raise ScenarioError(f"unknown scenario {name_or_path!r}: expected one of "
                                f"{', '.join(list_scenarios())}, or a path to a .json file")
        label, source, text = name_or_path, str(entry), entry.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"scenario {label}: invalid JSON at line {exc.lineno} column "
                            f"{exc.colno}: {exc.msg}") from exc
    return parse_scenario(data, label=label, source=source)


def parse_scenario(data: object, *, label: str, source: str = "") -> Scenario:
    """Validate a decoded scenario file; errors read "scenario X step 3: expected ..., got ..."."""
    where = f"scenario {label}"
    if not isinstance(data, Mapping):
        raise ScenarioError(f"{where}: expected a JSON object at the top, got {short(data)}")
    known = {"name", "description", "vm_name", "speed", "instance", "steps"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ScenarioError(f"{where}: expected keys among {sorted(known)}, got {unknown}")
    name = opt(data, "name", str, "a string", where) or label
    where = f"scenario {name}"
    speed = number(data, "speed", where, 1.0)
    if speed <= 0:
        raise ScenarioError(f"{where}: expected 'speed' > 0, got {speed!r}")
    instance = opt(data, "instance", dict, "an object", where) or {}
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in instance.items()):
        raise ScenarioError(f"{where}: expected 'instance' to map strings to strings, "
                            f"got {short(instance)}")
    raw_steps = req(data, "steps", list, "a list", where)
    if not raw_steps:
        raise ScenarioError(f"{where}: expected 'steps' to hold at least one step, got []")
    steps: list[Step] = []
    for index, raw in enumerate(raw_steps, start=1):
        step = _parse_step(raw, f"{where} step {index}")
        if steps and step.at < steps[-1].at:
            raise ScenarioError(f"{where} step {index}: expected 'at' >= {steps[-1].at:g} "
                                f"(the previous step's), got {step.at:g}")
        steps.append(step)
    return Scenario(
        name=name,
        description=opt(data, "description", str, "a string", where) or "",
        steps=tuple(steps),
        vm_name=opt(data, "vm_name", str, "a string", where) or DEFAULT_VM_NAME,
        speed=speed,
        instance=MappingProxyType(dict(instance)),
        source=source,
    )


def _parse_step(raw: object, where: str) -> Step:
    if not isinstance(raw, Mapping):
        raise ScenarioError(f"{where}: expected an object, got {short(raw)}")
    known = {"at", "events", "incarnation", "fault", "note"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ScenarioError(f"{where}: expected keys among {sorted(known)}, got {unknown}")
    at = number(raw, "at", where, None)
    if at < 0:
        raise ScenarioError(f"{where}: expected 'at' >= 0, got {at:g}")
    incarnation = opt(raw, "incarnation", int, "an integer", where)
    if incarnation is not None and incarnation < 0:
        raise ScenarioError(f"{where}: expected 'incarnation' >= 0, got {incarnation}")
    fault = None
    if raw.get("fault") is not None:
        try:
            fault = Fault.from_mapping(raw["fault"])
        except ValueError as exc:
            raise ScenarioError(f"{where}: {exc}") from exc
    events = req(raw, "events", list, "a list", where)
    templates = [_parse_event(e, f"{where} event {n}") for n, e in enumerate(events, start=1)]
    ids = [str(t["EventId"]).casefold() for t in templates]
    if len(set(ids)) != len(ids):
        got = [t["EventId"] for t in templates]
        raise ScenarioError(f"{where}: expected distinct EventIds, got {got}")
    return Step(at=at, events=tuple(templates), incarnation=incarnation, fault=fault,
                note=opt(raw, "note", str, "a string", where) or "")


_EVENT_STRINGS = ("EventId", "EventStatus", "EventType", "ResourceType", "Description",
                  "EventSource")


def _parse_event(raw: object, where: str) -> Mapping[str, object]:
    if not isinstance(raw, Mapping):
        raise ScenarioError(f"{where}: expected an object, got {short(raw)}")
    for key in ("EventId", "EventStatus"):
        if key not in raw:
            raise ScenarioError(f"{where}: expected an {key!r} field, got keys {sorted(raw)}")
    for key in _EVENT_STRINGS:
        opt(raw, key, str, "a string", where)
    resources_ = opt(raw, "Resources", list, "a list of strings", where) or []
    if not all(isinstance(r, str) for r in resources_):
        raise ScenarioError(f"{where}: expected 'Resources' to be a list of strings, "
                            f"got {short(resources_)}")
    opt(raw, "DurationInSeconds", int, "an integer", where)
    not_before = raw.get("NotBefore", "")
    if isinstance(not_before, Mapping):
        offset = not_before.get("in")
        if set(not_before) != {"in"} or isinstance(offset, bool) or \
                not isinstance(offset, (int, float)) or offset < 0:
            raise ScenarioError(f"{where}: expected 'NotBefore' {{\"in\": seconds >= 0}}, "
                                f"got {short(not_before)}")
    elif not isinstance(not_before, str):
        raise ScenarioError(f"{where}: expected 'NotBefore' to be a string or {{\"in\": seconds}}, "
                            f"got {short(not_before)}")
    return cast(Mapping[str, object], freeze(raw))
