"""Scenario files for the IMDS simulator (SPEC §9): faults, loading, validation, rendering.

A scenario is a JSON file in ``config/scenarios/`` (shipped inside the package as
``scheduled_events_exporter/simulator/scenario_files/*.json``): a list of steps, each replacing
the whole Events list at a virtual time, played at a speed factor. This module has no HTTP in
it; the simulator imports it, never the reverse, which is why :class:`Fault` (shared by both)
lives here.
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
from typing import Literal, TypeVar, cast

if sys.version_info >= (3, 11):
    from importlib.resources.abc import Traversable
else:  # pragma: no cover - Python 3.10
    from importlib.abc import Traversable

DEFAULT_VM_NAME = "vm-sim-0"
T = TypeVar("T")

FaultKind = Literal["status", "delay", "body"]
_FAULT_KINDS: tuple[str, ...] = ("status", "delay", "body")
_FAULT_TARGETS = ("scheduledevents", "instance")
_FAULT_METHODS = ("GET", "POST", "*")
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")


class ScenarioError(ValueError):
    """A scenario (or fault) definition that cannot be used; the message names what and where."""


@dataclass(frozen=True)
class Fault:
    """One injected misbehaviour of the simulated IMDS.

    ``kind``: ``"status"`` answers ``status`` (default 500) with ``body`` (default a JSON
    error); ``"body"`` answers ``status`` (default 200) with ``body`` as ``content_type``;
    ``"delay"`` answers normally. Every kind first waits ``delay`` real seconds.

    A fault is used by the next ``count`` requests that match ``target`` and ``method`` and are
    otherwise valid (Metadata header, api-version). With ``duration`` > 0 it is used instead by
    every such request during ``duration`` real seconds counted from the first one it hits (IMDS
    answers 410 for up to 70 s after first use). ``retry_after`` adds a ``Retry-After`` header.
    """

    kind: FaultKind
    status: int = 0  # 0 means the kind's default: 500 for "status", 200 otherwise
    body: bytes = b""
    content_type: str = "application/json"
    delay: float = 0.0
    count: int = 1
    target: str = "scheduledevents"
    method: str = "GET"
    duration: float = 0.0
    retry_after: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in _FAULT_KINDS:
            raise ValueError(f"fault: expected kind to be one of {_FAULT_KINDS}, got {self.kind!r}")
        if self.status == 0:
            object.__setattr__(self, "status", 500 if self.kind == "status" else 200)
        if not 100 <= self.status <= 599:
            raise ValueError(f"fault: expected status in 100..599, got {self.status!r}")
        if self.count < 1:
            raise ValueError(f"fault: expected count >= 1, got {self.count!r}")
        if self.delay < 0 or self.duration < 0:
            raise ValueError(f"fault: expected delay and duration >= 0, got {self.delay}, "
                             f"{self.duration}")
        if self.target not in _FAULT_TARGETS:
            raise ValueError(f"fault: expected target in {_FAULT_TARGETS}, got {self.target!r}")
        if self.method not in _FAULT_METHODS:
            raise ValueError(f"fault: expected method in {_FAULT_METHODS}, got {self.method!r}")
        if self.retry_after is not None and self.retry_after < 0:
            raise ValueError(f"fault: expected retry_after >= 0, got {self.retry_after!r}")

    @classmethod
    def gone_for(cls, seconds: float) -> Fault:
        """410 Gone for ``seconds`` from the first request it hits (IMDS warming up)."""
        return cls("status", status=410, duration=seconds)

    @classmethod
    def throttled(cls, retry_after: int = 1, count: int = 1) -> Fault:
        """429 Too Many Requests with a ``Retry-After`` header."""
        return cls("status", status=429, retry_after=retry_after, count=count)

    @classmethod
    def server_error(cls, status: int = 500, count: int = 1) -> Fault:
        """A 5xx answer with a JSON error body."""
        return cls("status", status=status, count=count)

    @classmethod
    def slow(cls, delay: float, count: int = 1) -> Fault:
        """The normal answer, after ``delay`` seconds (the slow first call of a cold IMDS)."""
        return cls("delay", delay=delay, count=count)

    @classmethod
    def html(cls, count: int = 1) -> Fault:
        """200 with an HTML page, as a captive proxy or a wrong endpoint would answer."""
        page = b"<html><head><title>Sign in</title></head><body>Proxy login</body></html>"
        return cls("body", body=page, content_type="text/html", count=count)

    @classmethod
    def truncated(cls, count: int = 1) -> Fault:
        """200 with JSON cut off mid-document."""
        cut = b'{"DocumentIncarnation": 7, "Events": [{"EventId": "C70'
        return cls("body", body=cut, count=count)

    @classmethod
    def wrong_types(cls, count: int = 1) -> Fault:
        """200 with valid JSON whose fields have the wrong types."""
        return cls("body", body=b'{"DocumentIncarnation": "x", "Events": {}}', count=count)

    @classmethod
    def from_mapping(cls, data: object) -> Fault:
        """Build a fault from its JSON form (``body`` is a string there, encoded as UTF-8)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"fault: expected an object, got {data!r}")
        known = {"kind", "status", "body", "content_type", "delay", "count", "target", "method",
                 "duration", "retry_after"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"fault: expected keys among {sorted(known)}, got {unknown}")
        w = "fault"
        kind = _req(data, "kind", str, f"one of {_FAULT_KINDS}", w)
        status = _opt(data, "status", int, "an integer", w)
        count = _opt(data, "count", int, "an integer", w)
        return cls(
            kind=cast(FaultKind, kind),
            status=0 if status is None else status,
            body=(_opt(data, "body", str, "a string", w) or "").encode(),
            content_type=_opt(data, "content_type", str, "a string", w) or "application/json",
            delay=_number(data, "delay", w, 0.0),
            count=1 if count is None else count,
            target=_opt(data, "target", str, "a string", w) or "scheduledevents",
            method=_opt(data, "method", str, "a string", w) or "GET",
            duration=_number(data, "duration", w, 0.0),
            retry_after=_opt(data, "retry_after", int, "an integer", w),
        )


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
            event = cast(dict[str, object], _thaw(template))
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
        raise ScenarioError(f"{where}: expected a JSON object at the top, got {_short(data)}")
    known = {"name", "description", "vm_name", "speed", "instance", "steps"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ScenarioError(f"{where}: expected keys among {sorted(known)}, got {unknown}")
    name = _opt(data, "name", str, "a string", where) or label
    where = f"scenario {name}"
    speed = _number(data, "speed", where, 1.0)
    if speed <= 0:
        raise ScenarioError(f"{where}: expected 'speed' > 0, got {speed!r}")
    instance = _opt(data, "instance", dict, "an object", where) or {}
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in instance.items()):
        raise ScenarioError(f"{where}: expected 'instance' to map strings to strings, "
                            f"got {_short(instance)}")
    raw_steps = _req(data, "steps", list, "a list", where)
    if not raw_steps:
        raise ScenarioError(f"{where}: expected 'steps' to hold at least one step, got []")
    steps: list[Step] = []
    for number, raw in enumerate(raw_steps, start=1):
        step = _parse_step(raw, f"{where} step {number}")
        if steps and step.at < steps[-1].at:
            raise ScenarioError(f"{where} step {number}: expected 'at' >= {steps[-1].at:g} "
                                f"(the previous step's), got {step.at:g}")
        steps.append(step)
    return Scenario(
        name=name,
        description=_opt(data, "description", str, "a string", where) or "",
        steps=tuple(steps),
        vm_name=_opt(data, "vm_name", str, "a string", where) or DEFAULT_VM_NAME,
        speed=speed,
        instance=MappingProxyType(dict(instance)),
        source=source,
    )


def _parse_step(raw: object, where: str) -> Step:
    if not isinstance(raw, Mapping):
        raise ScenarioError(f"{where}: expected an object, got {_short(raw)}")
    known = {"at", "events", "incarnation", "fault", "note"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ScenarioError(f"{where}: expected keys among {sorted(known)}, got {unknown}")
    at = _number(raw, "at", where, None)
    if at < 0:
        raise ScenarioError(f"{where}: expected 'at' >= 0, got {at:g}")
    incarnation = _opt(raw, "incarnation", int, "an integer", where)
    if incarnation is not None and incarnation < 0:
        raise ScenarioError(f"{where}: expected 'incarnation' >= 0, got {incarnation}")
    fault = None
    if raw.get("fault") is not None:
        try:
            fault = Fault.from_mapping(raw["fault"])
        except ValueError as exc:
            raise ScenarioError(f"{where}: {exc}") from exc
    events = _req(raw, "events", list, "a list", where)
    templates = [_parse_event(e, f"{where} event {n}") for n, e in enumerate(events, start=1)]
    ids = [str(t["EventId"]).casefold() for t in templates]
    if len(set(ids)) != len(ids):
        got = [t["EventId"] for t in templates]
        raise ScenarioError(f"{where}: expected distinct EventIds, got {got}")
    return Step(at=at, events=tuple(templates), incarnation=incarnation, fault=fault,
                note=_opt(raw, "note", str, "a string", where) or "")


_EVENT_STRINGS = ("EventId", "EventStatus", "EventType", "ResourceType", "Description",
                  "EventSource")


def _parse_event(raw: object, where: str) -> Mapping[str, object]:
    if not isinstance(raw, Mapping):
        raise ScenarioError(f"{where}: expected an object, got {_short(raw)}")
    for key in ("EventId", "EventStatus"):
        if key not in raw:
            raise ScenarioError(f"{where}: expected an {key!r} field, got keys {sorted(raw)}")
    for key in _EVENT_STRINGS:
        _opt(raw, key, str, "a string", where)
    resources_ = _opt(raw, "Resources", list, "a list of strings", where) or []
    if not all(isinstance(r, str) for r in resources_):
        raise ScenarioError(f"{where}: expected 'Resources' to be a list of strings, "
                            f"got {_short(resources_)}")
    _opt(raw, "DurationInSeconds", int, "an integer", where)
    not_before = raw.get("NotBefore", "")
    if isinstance(not_before, Mapping):
        offset = not_before.get("in")
        if set(not_before) != {"in"} or isinstance(offset, bool) or \
                not isinstance(offset, (int, float)) or offset < 0:
            raise ScenarioError(f"{where}: expected 'NotBefore' {{\"in\": seconds >= 0}}, "
                                f"got {_short(not_before)}")
    elif not isinstance(not_before, str):
        raise ScenarioError(f"{where}: expected 'NotBefore' to be a string or {{\"in\": seconds}}, "
                            f"got {_short(not_before)}")
    return cast(Mapping[str, object], _freeze(raw))


def _opt(data: Mapping[str, object], key: str, kind: type[T], expected: str,
         where: str) -> T | None:
    """``data[key]`` checked against ``kind`` (JSON booleans are never numbers); None if absent."""
    value = data.get(key)
    if value is None:
        return None
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        raise ScenarioError(f"{where}: expected {key!r} to be {expected}, got {_short(value)}")
    return value


def _req(data: Mapping[str, object], key: str, kind: type[T], expected: str, where: str) -> T:
    if key not in data:
        raise ScenarioError(f"{where}: expected {key!r} to be {expected}, got nothing")
    value = _opt(data, key, kind, expected, where)
    if value is None:
        raise ScenarioError(f"{where}: expected {key!r} to be {expected}, got None")
    return value


def _number(data: Mapping[str, object], key: str, where: str, default: float | None) -> float:
    if key not in data and default is not None:
        return default
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        got = "nothing" if key not in data else _short(value)
        raise ScenarioError(f"{where}: expected {key!r} to be a number, got {got}")
    return float(value)


def _freeze(value: object) -> object:
    """Read-only copy of decoded JSON: objects become mapping proxies, lists become tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: object) -> object:
    """Plain, mutable, JSON-serialisable copy of a frozen value."""
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_thaw(v) for v in value]
    return value


def _short(value: object, limit: int = 80) -> str:
    text = repr(_thaw(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."
