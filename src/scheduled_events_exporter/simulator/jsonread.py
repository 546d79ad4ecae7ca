"""Checked reads of decoded JSON for the simulator's files: every problem names where and what.

Scenario and fault definitions are user input (``simulate --scenario my.json``); a wrong type
must be a :class:`ScenarioError` naming the key, the expectation and the value, never a
``KeyError`` three calls later.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TypeVar

T = TypeVar("T")


class ScenarioError(ValueError):
    """A scenario (or fault) definition that cannot be used; the message names what and where."""


def opt(data: Mapping[str, object], key: str, kind: type[T], expected: str,
         where: str) -> T | None:
    """``data[key]`` checked against ``kind`` (JSON booleans are never numbers); None if absent."""
    value = data.get(key)
    if value is None:
        return None
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        raise ScenarioError(f"{where}: expected {key!r} to be {expected}, got {short(value)}")
    return value


def req(data: Mapping[str, object], key: str, kind: type[T], expected: str, where: str) -> T:
    if key not in data:
        raise ScenarioError(f"{where}: expected {key!r} to be {expected}, got nothing")
    value = opt(data, key, kind, expected, where)
    if value is None:
        raise ScenarioError(f"{where}: expected {key!r} to be {expected}, got None")
    return value


def number(data: Mapping[str, object], key: str, where: str, default: float | None) -> float:
    if key not in data and default is not None:
        return default
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        got = "nothing" if key not in data else short(value)
        raise ScenarioError(f"{where}: expected {key!r} to be a number, got {got}")
    return float(value)


def freeze(value: object) -> object:
    """Read-only copy of decoded JSON: objects become mapping proxies, lists become tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: object) -> object:
    """Plain, mutable, JSON-serialisable copy of a frozen value."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw(v) for v in value]
    return value


def short(value: object, limit: int = 80) -> str:
    text = repr(thaw(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."
