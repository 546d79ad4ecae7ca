"""Domain values ↔ JSON-ready objects, for the state file and the spool, derived from the
frozen dataclasses themselves.

Every field of a dataclass is written under its own name, and read back by the type its
annotation declares: ``str``, ``int`` (never a bool), ``float``, ``bool``, ``datetime`` (ISO
8601 with an offset), an ``Enum`` (its value), ``X | None``, ``tuple[X, ...]``,
``Mapping[str, X]`` (a list of ``[key, value]`` pairs, so the order survives), a union of
JSON types, and nested dataclasses. Decoding is strict on every field: a missing field, an
unknown one or a value of another type raises ``ValueError`` naming where it is, so a damaged
file is detected (and set aside) instead of half-loaded. A new field is one line in its
dataclass, nothing here.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from collections.abc import Mapping
from datetime import datetime
from typing import Any, TypeVar

from scheduled_events_exporter.records import TransitionRecord
from scheduled_events_exporter.tracker import TrackerState

T = TypeVar("T")
Json = dict[str, Any]


def encode(value: Any) -> Any:
    """``value`` as JSON-ready data (dataclasses as objects of their fields)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Mapping):
        return [[key, encode(item)] for key, item in value.items()]
    if isinstance(value, (tuple, list)):
        return [encode(item) for item in value]
    return value


def decode(kind: type[T], data: object, where: str = "") -> T:
    """Read ``data`` back as ``kind`` (a dataclass); ``ValueError`` naming the field when it
    does not have the declared shape."""
    return typing.cast(T, _decode(kind, data, where or kind.__name__))


@functools.cache
def _hints(kind: type) -> dict[str, Any]:
    return typing.get_type_hints(kind)


def _decode(hint: Any, data: object, where: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return _decode_union(args, data, where)
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected an object, got {type(data).__name__}")
        names = [f.name for f in dataclasses.fields(hint)]
        missing = [n for n in names if n not in data]
        unknown = sorted(set(data) - set(names))
        if missing or unknown:
            raise ValueError(f"{where}: expected the fields {names}, missing {missing}, "
                             f"unknown {unknown}")
        hints = _hints(hint)
        return hint(**{n: _decode(hints[n], data[n], f"{where}.{n}") for n in names})
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return tuple(_decode(args[0], item, f"{where}[{i}]")
                     for i, item in enumerate(_expect(list, data, where)))
    if origin is list:
        return [_decode(args[0], item, f"{where}[{i}]")
                for i, item in enumerate(_expect(list, data, where))]
    if origin in (Mapping, dict, typing.Mapping):
        pairs = _expect(list, data, where)
        out = {}
        for i, pair in enumerate(pairs):
            if not (isinstance(pair, list) and len(pair) == 2):
                raise ValueError(f"{where}[{i}]: expected a [key, value] pair")
            out[_decode(args[0], pair[0], f"{where}[{i}]")] = _decode(args[1], pair[1],
                                                                      f"{where}[{i}]")
        return out
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(data)
        except ValueError:
            raise ValueError(f"{where}: expected one of {[m.value for m in hint]}, "
                             f"got {data!r}") from None
    if hint is datetime:
        text = _expect(str, data, where)
        moment = datetime.fromisoformat(text)
        if moment.tzinfo is None:
            raise ValueError(f"{where}: expected a time with a UTC offset, got {text!r}")
        return moment
    if hint is float:
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            return float(data)
        raise ValueError(f"{where}: expected a number, got {type(data).__name__}")
    if hint in (str, int, bool):
        return _expect(hint, data, where)
    raise TypeError(f"{where}: no JSON form for {hint!r}")  # a new field type: a bug here


def _decode_union(args: tuple[Any, ...], data: object, where: str) -> Any:
    if data is None and type(None) in args:
        return None
    alternatives = [a for a in args if a is not type(None)]
    if len(alternatives) == 1:  # X | None: X's own error says what is wrong inside it
        return _decode(alternatives[0], data, where)
    for alternative in alternatives:
        try:
            return _decode(alternative, data, where)
        except ValueError:
            continue
    shown = " | ".join(getattr(a, "__name__", str(a)) for a in args)
    raise ValueError(f"{where}: expected {shown}, got {type(data).__name__}")


def _expect(kind: type[T], data: object, where: str) -> T:
    # bool is an int in Python, never in these files.
    if not isinstance(data, kind) or (kind is int and isinstance(data, bool)):
        raise ValueError(f"{where}: expected {kind.__name__}, got {type(data).__name__}")
    return data


def encode_state(state: TrackerState) -> Json:
    """A :class:`TrackerState` as a JSON object (events in first-seen order)."""
    encoded: Json = encode(state)
    return encoded


def decode_state(data: object) -> TrackerState:
    """Inverse of :func:`encode_state`."""
    return decode(TrackerState, data, "state")


def encode_record(record: TransitionRecord) -> Json:
    """A :class:`TransitionRecord` as a JSON object (lossless)."""
    encoded: Json = encode(record)
    return encoded


def decode_record(data: object) -> TransitionRecord:
    """Inverse of :func:`encode_record`."""
    return decode(TransitionRecord, data, "record")
