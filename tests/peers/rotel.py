"""Test peer: the real ``rotel`` OTLP collector (``rotel==0.0.1a15``) on free loopback ports,
its detailed debug dump parsed into :class:`ReceivedLog`/:class:`ReceivedMetric` records."""

import contextlib
import os
import pathlib
import re
import select
import socket
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Self

import rotel

ROTEL_AGENT = pathlib.Path(rotel.__file__).parent / "rotel-agent"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_AGENT_LOG = re.compile(r"^(\d{4}-\d\d-\d\dT\S+\s+(TRACE|DEBUG|INFO|WARN|ERROR)\b|ERROR: )")
_LABEL = re.compile(r"^(\s+-> |\s+(Trace|Span) ID|InstrumentationScope |[A-Z][\w ]*( #\d|:))")
_ARROW = re.compile(r"^\s+-> (.+?):(?: (.*))?$")
_SCALAR = re.compile(r"(Int|Double|Bool)\(([^()]*)\)")
_BYTES = re.compile(r"Bytes\(\[([0-9, ]*)\]\)")
_MAP_KEY = re.compile(r"([^:]*?):(?=Str\(|Int\(|Double\(|Bool\(|Bytes\(|Slice\(|Map\(|Empty)")


@dataclass(frozen=True)
class ReceivedLog:
    """A log record; severity_number None = UNSPECIFIED; body: Str text or rotel's notation (typed
    in body_value); timestamp_ns 0 = unset; arrival_time: time.time() when rotel printed it."""

    event_name: str
    severity_number: int | None
    severity_text: str
    body: str
    attributes: dict[str, object]
    resource: dict[str, object]
    scope: str
    timestamp_ns: int = 0
    observed_timestamp_ns: int = 0
    arrival_time: float = 0.0
    body_value: object = None


@dataclass(frozen=True)
class Point:
    """A data point: ``value`` (Gauge/Sum) or count/sum/min/max/bounds/bucket_counts."""

    attributes: dict[str, object]
    value: float | None = None
    count: int | None = None
    sum: float | None = None
    min: float | None = None
    max: float | None = None
    bounds: tuple[float, ...] = ()
    bucket_counts: tuple[int, ...] = ()
    start_time_ns: int = 0
    time_ns: int = 0
    #: How many exemplars the point carried (their content is not parsed).
    exemplars: int = 0


@dataclass(frozen=True)
class ReceivedMetric:
    """One metric of one export request; ``kind``: Gauge, Sum, Histogram, ExponentialHistogram."""

    name: str
    description: str
    unit: str
    kind: str
    points: list[Point]
    resource: dict[str, object]
    scope: str = ""
    is_monotonic: bool | None = None
    temporality: str = ""
    arrival_time: float = 0.0


def _alternatives(s: str, i: int) -> Iterator[tuple[object, int]]:
    """Yield every (value, end) reading of rotel's AnyValue notation starting at ``s[i]``."""
    if s.startswith("Empty", i):
        yield None, i + 5
    elif m := _SCALAR.match(s, i):
        kind, raw = m.groups()
        value = int(raw) if kind == "Int" else float(raw) if kind == "Double" else raw == "true"
        yield value, m.end()
    elif m := _BYTES.match(s, i):
        yield bytes(int(b) for b in m.group(1).split(",") if b.strip()), m.end()
    elif s.startswith("Str(", i):  # strings are unescaped: try every ")" as the closing one
        yield from ((s[i + 4 : j], j + 1) for j in range(i + 4, len(s)) if s[j] == ")")
    elif s.startswith(("Slice(", "Map("), i):
        keyed, start = s.startswith("Map(", i), s.index("(", i) + 1
        if s.startswith(")", start):
            yield ({} if keyed else []), start + 1
        yield from _elements(s, start, keyed, ())


def _elements(s: str, i: int, keyed: bool,
              acc: tuple[tuple[str, object], ...]) -> Iterator[tuple[object, int]]:
    """Yield readings of the remaining ``k:v, ...)`` / ``v, ...)`` items of a Map or Slice."""
    key = ""
    if keyed:
        if not (m := _MAP_KEY.match(s, i)):
            return
        key, i = m.group(1), m.end()
    for value, j in _alternatives(s, i):
        items = (*acc, (key, value))
        if s.startswith(")", j):
            yield (dict(items) if keyed else [v for _, v in items]), j + 1
        if s.startswith(", ", j):
            yield from _elements(s, j + 2, keyed, items)


def parse_value(text: str) -> object:
    """rotel's Str/Int/Double/Bool/Slice/Map/Bytes/Empty notation → Python (unknown: the text)."""
    for value, end in _alternatives(text, 0):
        if end == len(text):
            return value
    return text


def _num(text: str | None) -> float | None:
    return float(text) if text and text.strip() else None


class DumpParser:
    """Incremental line parser for rotel's ``--debug-log-verbosity detailed`` dump."""

    def __init__(self, on_record: Callable[[ReceivedLog | ReceivedMetric], None],
                 on_agent_line: Callable[[str], None]) -> None:
        self._on_record, self._on_agent_line = on_record, on_agent_line
        self._resource: dict[str, object] = {}
        self._scope = ""
        self._rec: dict[str, Any] | None = None  # the log record or metric being built
        self._fields: dict[str, Any] = {}  # where "Key: value" lines go (record or data point)
        self._attrs: dict[str, Any] | None = self._resource  # where "-> k: v" lines go
        self._pending: tuple[dict[str, Any], str, str] | None = None  # (target, key, raw value)

    def feed(self, line: str, now: float) -> None:
        """Consume one line (without its newline) that was read at wall-clock time ``now``."""
        line = _ANSI.sub("", line).rstrip("\r")
        if (p := self._pending) and p[2].count("(") > p[2].count(")") and not _LABEL.match(line):
            self._pending = (p[0], p[1], p[2] + "\n" + line)  # continuation of a multi-line Str
            return
        self._commit()
        rec, arrow = self._rec, _ARROW.match(line)
        if _AGENT_LOG.match(line):
            self._on_agent_line(line)
        elif m := re.match(r"(Resource|Scope)(Log|Metric)s? #", line):
            self.flush()
            if m.group(1) == "Resource":
                self._resource = self._attrs = {}
        elif line.startswith("InstrumentationScope "):
            self._scope = line.removeprefix("InstrumentationScope ").partition(" ")[0]
        elif line.startswith(("LogRecord #", "Metric #")):
            self.flush()
            self._rec = self._fields = {"attributes": {}, "descriptor": {}, "points": [],
                                        "arrival_time": now, "is_log": line[0] == "L"}
            self._attrs = None
        elif arrow and self._attrs is not None:
            key, value = arrow.group(1), arrow.group(2) or ""
            if rec is not None and self._attrs is rec["descriptor"]:
                self._attrs[key] = value  # descriptor values are plain text
            else:
                self._pending = (self._attrs, key, value)
        elif rec is None or arrow:
            return
        elif re.match(r"\w*DataPoints #", line):
            self._fields = {"attributes": {}, "bounds": [], "bucket_counts": []}
            rec["points"].append(self._fields)
            self._attrs = self._fields["attributes"]
        elif line.startswith("Exemplar #"):
            self._fields["exemplars"] = self._fields.get("exemplars", 0) + 1
        elif line.startswith("Flags:"):
            self.flush()
        elif line.startswith("ExplicitBounds #"):
            self._fields["bounds"].append(float(line.rpartition(": ")[2]))
        elif m := re.match(r"Buckets? .*, Count: (\d+)$", line):
            self._fields["bucket_counts"].append(int(m.group(1)))
        elif line.startswith("Body: "):
            self._pending = (rec, "Body", line.removeprefix("Body: "))
        elif ": " not in line:  # section header: Attributes:, Descriptor:, Exemplars...
            self._attrs = {"Attributes:": rec["attributes"], "Descriptor:": rec["descriptor"],
                           "Data point attributes:": self._fields.get("attributes")}.get(line)
        else:
            key, _, value = line.partition(": ")
            self._fields[key.strip()] = value

    def _commit(self) -> None:
        if self._pending is not None:
            (target, key, raw), self._pending = self._pending, None
            target[key] = parse_value(raw)
            if target is self._rec and key == "Body":
                target["Body_raw"] = raw

    def flush(self) -> None:
        """Emit the record being built (the dump has no end marker after the last metric)."""
        self._commit()
        rec, self._rec, self._fields = self._rec, None, {}
        if rec is None:
            return
        if rec["is_log"]:
            body, sev = rec.get("Body"), re.search(r"\((\d+)\)", rec.get("SeverityNumber", ""))
            self._on_record(ReceivedLog(  # fields in declaration order
                rec.get("EventName", ""), (int(sev.group(1)) or None) if sev else None,
                rec.get("SeverityText", ""), body if isinstance(body, str) else rec["Body_raw"],
                rec["attributes"], self._resource, self._scope, int(rec.get("Timestamp", 0)),
                int(rec.get("ObservedTimestamp", 0)), rec["arrival_time"], body))
            return
        points = [Point(
            p["attributes"], _num(p.get("Value")), int(p["Count"]) if "Count" in p else None,
            _num(p.get("Sum")), _num(p.get("Min")), _num(p.get("Max")), tuple(p["bounds"]),
            tuple(p["bucket_counts"]), int(p.get("StartTimestamp", 0)), int(p.get("Timestamp", 0)),
            p.get("exemplars", 0),
        ) for p in rec["points"]]
        d, monotonic = rec["descriptor"], rec["descriptor"].get("IsMonotonic")
        self._on_record(ReceivedMetric(
            d.get("Name", ""), d.get("Description", ""), d.get("Unit", ""), d.get("DataType", ""),
            points, self._resource, self._scope, None if monotonic is None else monotonic == "true",
            d.get("AggregationTemporality", ""), rec["arrival_time"]))


def _free_ports() -> tuple[int, int]:
    """Two distinct free loopback ports (a bound socket's port is never reused by port 0)."""
    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", 0))
        b.bind(("127.0.0.1", 0))
        return a.getsockname()[1], b.getsockname()[1]


def _connectable(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class RotelReceiver:
    """A ``rotel-agent`` to await records on; ports and records are kept across restarts."""

    def __init__(self, startup_timeout: float = 10.0, binary: pathlib.Path = ROTEL_AGENT,
                 batching: bool = False, netns: str | None = None,
                 ports: tuple[int, int] | None = None) -> None:
        """``batching``: keep rotel's default batching (a 200 ms batch timeout), as a collector
        run with its defaults would; off (the default here), every request is printed at once.
        ``netns``: run it in that network namespace (``/proc/PID/ns/net``, e.g. a pod's, so
        its ports are on the pod's loopback) on the given ``ports`` (gRPC, http)."""
        self._binary, self._startup_timeout = binary, startup_timeout
        self._batching = batching
        self._netns = netns
        self._cond = threading.Condition()  # guards everything below; notified on every record
        self._logs: list[ReceivedLog] = []
        self._metrics: list[ReceivedMetric] = []
        self._agent_output: deque[str] = deque(maxlen=200)  # the current rotel's own log lines
        self._ports: tuple[int, int] | None = ports
        self._running: tuple[subprocess.Popen[bytes], threading.Thread] | None = None

    def start(self) -> Self:
        """Start rotel and wait until both ports accept (a lost port race is retried)."""
        if self._running:
            return self
        fixed, deadline = self._ports is not None, time.monotonic() + self._startup_timeout
        while time.monotonic() < deadline:
            # (On this machine's loopback another collector may hold 4317/4318; a namespace
            # of its own, such as a pod's, is free.)
            while self._ports is None or (not self._netns and {4317, 4318} & set(self._ports)):
                self._ports = _free_ports()
            if self._launch(deadline):
                return self
            self._ports = self._ports if fixed else None  # first start lost a race: new ports
            with self._cond:
                self._cond.wait(0.05)  # brief back-off before retrying
        raise RuntimeError(f"rotel did not start on {self._ports}: {list(self._agent_output)[-5:]}")

    def restart(self) -> None:
        """Stop and start again on the same ports."""
        self.stop()
        self.start()

    def stop(self) -> None:
        """Terminate rotel (idempotent); its ports stop accepting connections."""
        if not self._running:
            return
        (proc, reader), self._running = self._running, None
        with proc:  # on exit: closes the pipe, reaps the process
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            proc.kill()  # no-op once it has exited
            reader.join(timeout=5)  # reads up to EOF

    def _launch(self, deadline: float) -> bool:
        """Run rotel on ``self.ports``; True once both accept, False if it exited or timed out."""
        grpc_port, http_port = self.ports
        args = f"start --exporter blackhole --otlp-grpc-endpoint 127.0.0.1:{grpc_port} " \
            f"--otlp-http-endpoint 127.0.0.1:{http_port} --debug-log logs --debug-log metrics " \
            "--debug-log-verbosity detailed" + ("" if self._batching else " --disable-batching")
        env = {k: v for k, v in os.environ.items() if not k.startswith("ROTEL_")}
        enter = ["nsenter", f"--net={self._netns}"] if self._netns else []
        proc = subprocess.Popen([*enter, str(self._binary), *args.split()],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=env)
        state = {"eof": False}
        self._running = (proc, threading.Thread(target=self._read, args=(proc, state), daemon=True))
        with self._cond:  # rotel logs "Starting Rotel." once both ports are bound
            self._agent_output.clear()
            self._running[1].start()
            while not state["eof"] and (left := deadline - time.monotonic()) > 0:
                started = any("Starting Rotel" in line for line in self._agent_output)
                # (In another namespace its ports cannot be tried from here; it logs "Starting"
                # once they are bound.)
                bound = self._netns or (_connectable(grpc_port) and _connectable(http_port))
                if started and bound:
                    return True
                self._cond.wait(min(left, 0.01) if started else left)
        self.stop()
        return False

    def _read(self, proc: subprocess.Popen[bytes], state: dict[str, bool]) -> None:
        """Reader thread: parse rotel's stdout; flush the pending metric when output pauses."""
        assert proc.stdout is not None
        fd, buf = proc.stdout.fileno(), b""
        parser = DumpParser(self._add, self._agent_output.append)
        while True:
            if not select.select([fd], [], [], 0.05)[0]:
                with self._cond:
                    parser.flush()
                continue
            chunk, now = os.read(fd, 1 << 16), time.time()
            *lines, buf = (buf + chunk).split(b"\n") if chunk else [buf, b""]
            with self._cond:
                for raw in lines:
                    parser.feed(raw.decode("utf-8", "replace"), now)
                self._cond.notify_all()
                if not chunk:
                    parser.flush()
                    state["eof"] = True
                    return

    def _add(self, record: ReceivedLog | ReceivedMetric) -> None:
        target: list[Any] = self._logs if isinstance(record, ReceivedLog) else self._metrics
        target.append(record)
        self._cond.notify_all()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def ports(self) -> tuple[int, int]:
        """(gRPC port, HTTP port)."""
        assert self._ports is not None, "receiver never started"
        return self._ports

    @property
    def grpc_endpoint(self) -> str:
        """``http://127.0.0.1:P1`` for the gRPC exporters."""
        return f"http://127.0.0.1:{self.ports[0]}"

    @property
    def http_endpoint(self) -> str:
        """``http://127.0.0.1:P2``; append ``/v1/logs`` or ``/v1/metrics`` for http exporters."""
        return f"http://127.0.0.1:{self.ports[1]}"

    @property
    def logs(self) -> list[ReceivedLog]:
        """Snapshot of every log record received so far, in arrival order."""
        with self._cond:
            return list(self._logs)

    @property
    def metrics(self) -> list[ReceivedMetric]:
        """Snapshot of every metric received so far, in arrival order (periodic re-exports too)."""
        with self._cond:
            return list(self._metrics)

    def latest_metric(self, name: str) -> ReceivedMetric | None:
        """The most recently received metric called ``name``, or None."""
        with self._cond:
            return next((m for m in reversed(self._metrics) if m.name == name), None)

    def wait_for_logs(self, predicate: Callable[[ReceivedLog], bool] | None = None, count: int = 1,
                      timeout: float = 10.0) -> list[ReceivedLog]:
        """Wait for ``count`` logs matching ``predicate``; return all matches."""
        found: list[ReceivedLog] = []
        scanned = [0]

        def ready() -> bool:  # looks only at the logs that arrived since the last wake-up
            found.extend(filter(predicate, self._logs[scanned[0]:]))
            scanned[0] = len(self._logs)
            return len(found) >= count

        with self._cond:
            if self._cond.wait_for(ready, timeout):
                return found
            seen = [(x.event_name, x.severity_text, x.body[:60], x.attributes) for x in self._logs]
            raise AssertionError(f"expected {count} matching log(s) within {timeout}s, {len(found)}"
                                 f" matched; {len(seen)} arrived, last 10: {seen[-10:]}; rotel: "
                                 f"{list(self._agent_output)[-5:]}")

    def wait_for_metric(self, name: str, predicate: Callable[[ReceivedMetric], bool] | None = None,
                        timeout: float = 10.0) -> ReceivedMetric:
        """Wait for a metric ``name`` matching ``predicate``; return the latest match."""
        pred = predicate or (lambda _: True)
        with self._cond:
            if self._cond.wait_for(lambda: any(m.name == name and pred(m) for m in self._metrics),
                                   timeout):
                return [m for m in self._metrics if m.name == name and pred(m)][-1]
            same = [m.points for m in self._metrics if m.name == name][-3:]
            raise AssertionError(
                f"no metric {name!r} matching the predicate within {timeout}s; names arrived: "
                f"{sorted({m.name for m in self._metrics})}; last points of {name!r}: {same}; "
                f"rotel: {list(self._agent_output)[-5:]}")

