"""Domain values ↔ JSON-ready objects, for the state file and the spool, derived from the
frozen dataclasses themselves.

Every field of a dataclass is written under its own name, and read back by the type its
annotation declares: ``str``, ``int`` (never a bool), ``float``, ``bool``, ``datetime`` (ISO
8601 with an offset), an ``Enum`` (its value), ``X | None``, ``tuple[X, ...]``,
``Mapping[str, X]`` (a list of ``[key, value]`` pairs, so the order survives), a union of
JSON types, and nested dataclasses.

The files evolve (docs/semantics.md#compatibility): a field a reader does not know was written
by a newer release. It is kept in the value's ``unknown_fields`` (model.UnknownFields) and
written back after the known ones, so an upgrade, a rollback and an upgrade again lose nothing
(``decode``'s ``ignored`` names them, so the caller can say so once); a value without that field
skips them. A field a reader misses was not yet written by an older release and takes its
default. Everything else stays strict: a value of another type, or a missing field that has no
default, raises ``ValueError`` naming where it is, so a damaged file is detected instead of
half-loaded. A new field is one line in its dataclass, with a default (so older files still
read), and nothing here.

One exception to "the whole value or nothing": a collection whose dataclass declares a field
for its unreadable items (``metadata={model.ITEMS_OF: name}``; the tracker's ``events``) is
read item by item. An item that does not have the declared shape is left out and kept in that
field as a :class:`~scheduled_events_exporter.model.UnreadableItem` (as read, with the reason),
and written back after the items that were read; the collection itself must still be a list.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from scheduled_events_exporter.model import ITEMS_OF, UnreadableItem
from scheduled_events_exporter.records import TransitionRecord
from scheduled_events_exporter.tracker import PlatformState, TrackerState

#: The field of a value that holds what a newer release wrote (model.UnknownFields).
UNKNOWN = "unknown_fields"

T = TypeVar("T")
Json = dict[str, Any]


Encoder = Callable[[Any], Any]
Decoder = Callable[[object], Any]
#: Where the decode under way notes the fields it skipped (``None``: nobody asked).
_IGNORED: ContextVar[set[str] | None] = ContextVar("codec_ignored", default=None)


def encode(value: Any) -> Any:
    """``value`` as JSON-ready data (dataclasses as objects of their fields)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _encoder(type(value))(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Mapping):
        return [[key, encode(item)] for key, item in value.items()]
    if isinstance(value, (tuple, list)):
        return [encode(item) for item in value]
    return value


def decode(kind: type[T], data: object, where: str = "",
           ignored: set[str] | None = None) -> T:
    """Read ``data`` back as ``kind`` (a dataclass); ``ValueError`` naming the field when it
    does not have the declared shape. Fields no dataclass here declares (a newer release
    wrote them) are skipped and, when ``ignored`` is given, added to it as ``Type.field``."""
    token = _IGNORED.set(ignored)
    try:
        return typing.cast(T, _decoder(typing.cast(Any, kind))(data))
    except _Bad as bad:
        raise ValueError(f"{where or kind.__name__}{''.join(reversed(bad.path))}: "
                         f"{bad.message}") from None
    finally:
        _IGNORED.reset(token)


# The converters are built once per type from its annotations (a state file of 400 events is
# written at every change, so walking the annotations per value would cost milliseconds).

class _Bad(ValueError):
    """A value of the wrong shape; ``path`` (innermost first) grows as it leaves each
    container, so the location is spelt only when something is wrong."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.path: list[str] = []


def _at(segment: str, bad: _Bad) -> _Bad:
    bad.path.append(segment)
    return bad


def _identity(value: Any) -> Any:
    return value


@functools.cache
def _encoder(hint: Any) -> Encoder:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        alternatives = [a for a in args if a is not type(None)]
        if len(alternatives) == 1:
            inner = _encoder(alternatives[0])
            return inner if inner is _identity else (
                lambda value: None if value is None else inner(value))
        return encode  # a union of JSON types, or anything else: by the value's own type
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        hints = typing.get_type_hints(hint)
        fields = tuple((f.name, _encoder(hints[f.name])) for f in dataclasses.fields(hint)
                       if f.name != UNKNOWN and ITEMS_OF not in f.metadata)
        # (collection, the field holding the items of it that could not be read)
        kept = tuple((f.metadata[ITEMS_OF], f.name) for f in dataclasses.fields(hint)
                     if ITEMS_OF in f.metadata)
        keeps = any(f.name == UNKNOWN for f in dataclasses.fields(hint))
        if not keeps and not kept:
            return lambda value: {name: convert(getattr(value, name)) for name, convert in fields}

        def write(value: Any) -> Any:
            out = {name: convert(getattr(value, name)) for name, convert in fields}
            for collection, holder in kept:
                if items := getattr(value, holder):
                    # Where they were read, as they were read, after the items read.
                    out[collection] = [*out[collection], *(item.raw for item in items)]
            for name, item in getattr(value, UNKNOWN) if keeps else ():
                # A newer release's field, as it wrote it; never one this release writes.
                out.setdefault(name, item)
            return out
        return write
    if origin in (tuple, list):
        item = _encoder(args[0])
        return list if item is _identity else (lambda value: [item(i) for i in value])
    if origin in (Mapping, dict, typing.Mapping):
        item = _encoder(args[1])
        return lambda value: [[key, item(i)] for key, i in value.items()]
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return lambda value: value.value
    if hint is datetime:
        return datetime.isoformat
    if hint in (str, int, float, bool):
        return _identity
    return encode


@functools.cache
def _decoder(hint: Any) -> Decoder:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return _union_decoder(args)
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return _dataclass_decoder(hint)
    if origin in (tuple, list) and (origin is list or (len(args) == 2 and args[1] is ...)):
        return _sequence_decoder(_decoder(args[0]), origin)
    if origin in (Mapping, dict, typing.Mapping):
        return _mapping_decoder(_decoder(args[0]), _decoder(args[1]))
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _enum_decoder(hint)
    if hint is datetime:
        return _read_time
    if hint is float:
        return _read_number
    if hint in (str, int, bool):
        return functools.partial(_expect, hint)
    raise TypeError(f"no JSON form for {hint!r}")  # a new field type: a bug here


def _dataclass_decoder(kind: type) -> Decoder:
    hints = typing.get_type_hints(kind)
    holders = {f.metadata[ITEMS_OF]: f.name for f in dataclasses.fields(kind)
               if ITEMS_OF in f.metadata}
    names = [f.name for f in dataclasses.fields(kind)
             if f.name != UNKNOWN and ITEMS_OF not in f.metadata]
    keeps = any(f.name == UNKNOWN for f in dataclasses.fields(kind))
    fields = tuple((name, _decoder(hints[name])) for name in names if name not in holders)
    # Collections read item by item: (name, reader, the field their unreadable items go to).
    tolerant = tuple((name, _items_decoder(hints[name], name), holder)
                     for name, holder in holders.items())
    expected = frozenset(names)
    # A field with a default may be missing (an older release did not write it yet); one
    # without cannot, so a file that lost it is damaged, not old.
    required = [f.name for f in dataclasses.fields(kind) if f.name in expected
                and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]

    def read(data: object) -> Any:
        if not isinstance(data, dict):
            raise _Bad(f"expected an object, got {type(data).__name__}")
        present = fields
        values: dict[str, Any] = {}
        if data.keys() != expected:  # the common case is exact: no per-field lookups then
            missing = [n for n in required if n not in data]
            if missing:
                raise _Bad(f"expected the fields {names}, missing {missing} (which have no "
                           "default)")
            unknown = [name for name in data if name not in expected]
            if unknown and (note := _IGNORED.get()) is not None:
                note.update(f"{kind.__name__}.{name}" for name in unknown)
            if unknown and keeps:
                values[UNKNOWN] = tuple((name, data[name]) for name in unknown)
            present = tuple((name, convert) for name, convert in fields if name in data)
        for name, convert in present:
            try:
                values[name] = convert(data[name])
            except _Bad as bad:
                raise _at(f".{name}", bad) from None
        for name, items, holder in tolerant:
            if name in data:
                try:
                    values[name], values[holder] = items(data[name])
                except _Bad as bad:
                    raise _at(f".{name}", bad) from None
        return kind(**values)
    return read


def _items_decoder(hint: Any, name: str) -> Callable[[object], tuple[Any, tuple[Any, ...]]]:
    """A collection read item by item: (the items read, an UnreadableItem for each of the
    others). Only a value that is not a list at all raises."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    mapping = origin in (Mapping, dict, typing.Mapping)
    if not mapping and not (origin in (tuple, list)
                            and (origin is list or (len(args) == 2 and args[1] is ...))):
        raise TypeError(f"{name}: only a list, a tuple[X, ...] or a mapping keeps its "
                        f"unreadable items, not {hint!r}")  # a declaration error: a bug here
    key = _decoder(args[0]) if mapping else None
    item = _decoder(args[1] if mapping else args[0])

    def read(data: object) -> tuple[Any, tuple[Any, ...]]:
        read_items: dict[Any, Any] = {}
        listed: list[Any] = []
        unreadable: list[UnreadableItem] = []
        for i, raw in enumerate(_expect(list, data)):
            known: str | None = None
            try:
                if not mapping:
                    listed.append(item(raw))
                    continue
                if key is None or not (isinstance(raw, list) and len(raw) == 2):
                    raise _Bad("expected a [key, value] pair")
                got = key(raw[0])
                known = got if isinstance(got, str) else None
                read_items[got] = item(raw[1])
            except _Bad as bad:
                where = f"{name}[{i}]{''.join(reversed(bad.path))}"
                unreadable.append(UnreadableItem(raw, f"{where}: {bad.message}", known))
        if not mapping:
            return (tuple(listed) if origin is tuple else listed), tuple(unreadable)
        return read_items, tuple(unreadable)
    return read


def _sequence_decoder(item: Decoder, origin: type) -> Decoder:
    def read(data: object) -> Any:
        items = _expect(list, data)
        out = []
        for i, value in enumerate(items):
            try:
                out.append(item(value))
            except _Bad as bad:
                raise _at(f"[{i}]", bad) from None
        return tuple(out) if origin is tuple else out
    return read


def _mapping_decoder(key: Decoder, item: Decoder) -> Decoder:
    def read(data: object) -> Any:
        out = {}
        for i, pair in enumerate(_expect(list, data)):
            try:
                if not (isinstance(pair, list) and len(pair) == 2):
                    raise _Bad("expected a [key, value] pair")
                out[key(pair[0])] = item(pair[1])
            except _Bad as bad:
                raise _at(f"[{i}]", bad) from None
        return out
    return read


def _union_decoder(args: tuple[Any, ...]) -> Decoder:
    optional = type(None) in args
    alternatives = [_decoder(a) for a in args if a is not type(None)]
    shown = " | ".join(getattr(a, "__name__", str(a)) for a in args)

    def read(data: object) -> Any:
        if data is None and optional:
            return None
        if len(alternatives) == 1:  # X | None: X's own error says what is wrong inside it
            return alternatives[0](data)
        for alternative in alternatives:
            try:
                return alternative(data)
            except _Bad:
                continue
        raise _Bad(f"expected {shown}, got {type(data).__name__}")
    return read


def _enum_decoder(kind: type[enum.Enum]) -> Decoder:
    def read(data: object) -> Any:
        try:
            return kind(data)
        except (ValueError, TypeError):
            raise _Bad(f"expected one of {[m.value for m in kind]}, got {data!r}") from None
    return read


def _read_time(data: object) -> datetime:
    text = _expect(str, data)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise _Bad(f"expected an ISO 8601 time, got {text[:40]!r}") from None
    if moment.tzinfo is None:
        raise _Bad(f"expected a time with a UTC offset, got {text!r}")
    return moment


def _read_number(data: object) -> float:
    if isinstance(data, (int, float)) and not isinstance(data, bool):
        return float(data)
    raise _Bad(f"expected a number, got {type(data).__name__}")


def _expect(kind: type[T], data: object) -> T:
    # bool is an int in Python, never in these files.
    if not isinstance(data, kind) or (kind is int and isinstance(data, bool)):
        raise _Bad(f"expected {kind.__name__}, got {type(data).__name__}")
    return data


@dataclass(frozen=True, slots=True)
class UnreadableLine:
    """A whole entry of a file (a spool line, an outbox record) that is not a record this
    release can read: another release's form it cannot follow, or damage. Never dropped: it
    goes to the dead-letter file with ``reason``."""

    #: Its sequence number, when the entry says one.
    seq: int | None
    #: The entry as JSON, or as text when it is not JSON at all.
    content: object
    #: Why it cannot be read (what was expected, what was seen).
    reason: str


def encode_state(state: TrackerState) -> Json:
    """A :class:`TrackerState` as a JSON object (events in first-seen order)."""
    encoded: Json = encode(state)
    return encoded


def decode_state(data: object, ignored: set[str] | None = None) -> TrackerState:
    """Inverse of :func:`encode_state` (``ignored``: see :func:`decode`)."""
    return decode(TrackerState, data, "state", ignored)


def encode_platform(state: PlatformState) -> Json:
    """A :class:`PlatformState` (the platform command's memory) as a JSON object."""
    encoded: Json = encode(state)
    return encoded


def decode_platform(data: object, ignored: set[str] | None = None) -> PlatformState:
    """Inverse of :func:`encode_platform` (``ignored``: see :func:`decode`)."""
    return decode(PlatformState, data, "platform", ignored)


def encode_record(record: TransitionRecord) -> Json:
    """A :class:`TransitionRecord` as a JSON object (lossless)."""
    encoded: Json = encode(record)
    return encoded


def decode_record(data: object, ignored: set[str] | None = None) -> TransitionRecord:
    """Inverse of :func:`encode_record` (``ignored``: see :func:`decode`)."""
    return decode(TransitionRecord, data, "record", ignored)
