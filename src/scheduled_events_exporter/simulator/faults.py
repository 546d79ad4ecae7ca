"""Faults the simulated IMDS injects (docs/semantics.md#simulator): 410 windows, 429, 5xx, slow
answers, bad bodies.

Used directly by tests (``sim.push_fault(Fault.throttled())``) and by scenario files; the
HTTP face (:mod:`.server`) applies them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, cast

from scheduled_events_exporter.simulator.jsonread import number, opt, req

FaultKind = Literal["status", "delay", "body"]
_FAULT_KINDS: tuple[str, ...] = ("status", "delay", "body")
_FAULT_TARGETS = ("scheduledevents", "instance")
_FAULT_METHODS = ("GET", "POST", "*")

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
        kind = req(data, "kind", str, f"one of {_FAULT_KINDS}", w)
        status = opt(data, "status", int, "an integer", w)
        count = opt(data, "count", int, "an integer", w)
        return cls(
            kind=cast(FaultKind, kind),
            status=0 if status is None else status,
            body=(opt(data, "body", str, "a string", w) or "").encode(),
            content_type=opt(data, "content_type", str, "a string", w) or "application/json",
            delay=number(data, "delay", w, 0.0),
            count=1 if count is None else count,
            target=opt(data, "target", str, "a string", w) or "scheduledevents",
            method=opt(data, "method", str, "a string", w) or "GET",
            duration=number(data, "duration", w, 0.0),
            retry_after=opt(data, "retry_after", int, "an integer", w),
        )
