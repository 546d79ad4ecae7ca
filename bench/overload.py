"""A burst against a collector under overload, and against a real size limit.

The real exporter process (``SEE_SINKS=otlp``, logs only, ``SEE_POLL_INTERVAL=0.3``, a state
directory on disk) polls the in-process :class:`Simulator`; the scripted OTLP peers of
``tests/peers/otlp_standin.py`` answer and log every request (time, size, records, verdict).
Over gRPC a request refused by the server's own receive limit never reaches the service, so a
server interceptor counts every call the peer saw, refused by size included.

Scenarios, each over gRPC and http/protobuf:

* **overload**: after one accepted record (``BASE``), the collector answers every logs request
  for 2 s with gRPC ``RESOURCE_EXHAUSTED`` without ``RetryInfo`` (a memory limiter's or a
  quota's answer), or HTTP 503 without ``Retry-After``; a burst of ``BURST`` events of
  ``PADDING`` bytes each (one IMDS document, about 2.4 MB) is published as the 2 s start.
* **size-limit**: the peer takes at most 1 MiB per request (HTTP 413 before reading the body, as
  the Collector's ``max_request_body_size``; gRPC's own ``grpc.max_receive_message_length``) and
  accepts everything else; the same burst, with one record larger than the limit in its middle.

Then, in both, a second burst of ``SECOND`` records once the first is settled and the overload
over (1 s after its end at the earliest): do requests carry whole batches again (overload), and
does the learnt limit hold without new refusals (size-limit)?

Figures per run: logs requests the peer saw from the burst until it was settled (refused and
accepted); time from publishing the burst to its last record accepted (*to deliver*) and to the
last record accepted or dead-lettered (*to settle*, from the dead letters' own millisecond
times); burst records delivered (unique) and duplicates; lines of ``dead-letter.jsonl``; the
records of each accepted request; the same for the second burst; ``/readyz``'s request bound
where the code has one.

``--code DIR`` (another tree's ``src/``, e.g. ``git archive f3c7d3e src | tar -x -C DIR``) or
``--commit SHA`` (extracted the same way into a temporary directory) runs that code as
*before* beside this tree's, run by run, alternating which goes first; both use this
interpreter and its dependencies. ``--runs`` (default 3) runs per scenario, protocol and code;
medians with min and max. Results: ``bench/results/overload.json``.

``python bench/overload.py [--runs 3] [--code DIR | --commit SHA] [--quick]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime
from io import BytesIO
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
from benchlib import (
    REPO,
    ExporterProcess,
    SummaryRow,
    exporter_env,
    make_event,
    median,
    print_table,
    save_results,
    temp_state_dir,
    wait_first_poll,
)

from scheduled_events_exporter.simulator import Simulator
from tests.exporter_process import get_json
from tests.peers.otlp_standin import OtlpGrpcStandIn, OtlpHttpStandIn, Reply

VM = "vm-bench"
#: Records in the first burst, bytes of resource names in each (about 12 KB a record).
BURST = 200
PADDING = 12_000
#: Records in the second burst (it must fit beside the first and the large record in one IMDS
#: document of at most 4 MiB).
SECOND = 50
#: Resource names are cut at 8 KiB by the parser: the padding goes in names of this size.
CHUNK = 6_000
OVERLOAD = 2.0
LIMIT = 1024 * 1024
#: The record over the limit (size-limit scenario), in the middle of the burst.
LARGE = 1_050_000
IMDS_MAX = 4 * 1024 * 1024
SETTLE_TIMEOUT = 180.0
LOGS_EXPORT = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"
SCENARIOS = ("overload", "size-limit")
PROTOCOLS = ("grpc", "http/protobuf")


def padded_event(event_id: str, padding: int) -> dict[str, object]:
    """A Scheduled event whose record holds about ``padding`` bytes of resource names."""
    names = [VM]
    left = padding
    while left > 0:
        prefix = f"{event_id}-{len(names):04d}-"
        take = min(CHUNK, left)
        names.append(prefix + "x" * max(0, take - len(prefix)))
        left -= take
    return {**make_event(event_id, vm_name=VM), "Resources": names}


def document_bytes(events: Sequence[dict[str, object]]) -> int:
    """The IMDS document's size as the simulator serves it (compact JSON)."""
    return len(json.dumps({"DocumentIncarnation": 1, "Events": list(events)},
                          separators=(",", ":")).encode())


@dataclass(frozen=True)
class Call:
    """One logs request as the peer saw it (gRPC: from the interceptor, before any limit)."""

    arrival: float
    records: int | None  # None: refused before it was read (a size limit)
    verdict: str | None  # None: accepted


class _CountCalls(grpc.ServerInterceptor):  # type: ignore[misc]
    """A gRPC server interceptor noting when each logs call started (monotonic seconds): it runs
    when the call's headers arrive, before gRPC's core reads (and may refuse) the message."""

    def __init__(self, calls: list[float]) -> None:
        self.calls = calls

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        if details.method == LOGS_EXPORT:
            self.calls.append(time.monotonic())
        return continuation(details)


@contextmanager
def counting_grpc_server(calls: list[float]) -> Iterator[None]:
    """While the stand-in builds its server, give it a :class:`_CountCalls` (the stand-in takes
    no interceptors, and a size refusal happens in gRPC's core, before the service sees it)."""
    real = grpc.server

    def server(*args: Any, **kwargs: Any) -> Any:
        kwargs["interceptors"] = [*(kwargs.get("interceptors") or ()), _CountCalls(calls)]
        return real(*args, **kwargs)

    grpc.server = server
    try:
        yield
    finally:
        grpc.server = real


@dataclass(frozen=True)
class Phase:
    """What one burst cost: requests, time, records."""

    expected: int
    requests: int
    refused: int
    accepted: int
    #: Refusals that never reached the service (gRPC's receive limit).
    refused_by_limit: int
    #: Seconds from publishing the burst to its last record accepted / to it being settled
    #: (delivered or dead-lettered); None if nothing was delivered.
    deliver_s: float | None
    settle_s: float
    delivered: int
    duplicates: int
    dead_lettered: int
    #: Records of each accepted request, in order.
    per_request: tuple[int, ...]
    #: Seconds from publishing the burst to each refusal.
    refusals_at: tuple[float, ...]


@dataclass(frozen=True)
class Run:
    """One run of one scenario, protocol and code."""

    scenario: str
    protocol: str
    code: str
    run: int
    first: Phase
    second: Phase
    #: /readyz's request bound at the end (bytes; None: this code does not show one).
    request_bytes: int | None
    halving_lines: int
    exit_code: int
    #: Bytes of the last IMDS document (at most 4 MiB).
    document_bytes: int


def dead_letters(state: str) -> list[dict[str, Any]]:
    """Whole lines of the dead-letter file (the exporter may be appending one)."""
    path = Path(state) / "dead-letter.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().split("\n")[:-1]]


def wall_of(stamp: str) -> float:
    """An RFC 3339 ``...Z`` time of the dead-letter file as seconds since the epoch."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def calls_since(collector: OtlpGrpcStandIn | OtlpHttpStandIn, grpc_calls: list[float] | None,
                since: float, until: float) -> list[Call]:
    """Logs requests the peer saw in ``[since, until]``, in order."""
    served = [Call(r.arrival, r.records, None if r.verdict is None else str(r.verdict))
              for r in list(collector.log) if since <= r.arrival <= until]
    if grpc_calls is None:
        return served
    # Over gRPC the service's log lacks what the receive limit refused. One request is in
    # flight at a time, so each served request belongs to the last call that started before
    # it; the calls left over were refused before the service saw them.
    started = sorted(t for t in list(grpc_calls) if since <= t <= until)
    refused_early = list(started)
    for request in served:
        mine = [t for t in refused_early if t <= request.arrival]
        if mine:
            refused_early.remove(mine[-1])
    limit = [Call(t, None, "RESOURCE_EXHAUSTED (receive limit)") for t in refused_early]
    return sorted([*served, *limit], key=lambda c: c.arrival)


def settle(collector: OtlpGrpcStandIn | OtlpHttpStandIn, state: str, ids: set[str],
           timeout: float) -> None:
    """Wait until every EventId of ``ids`` was accepted or dead-lettered (or fail naming it)."""
    deadline = time.monotonic() + timeout
    size = -1
    dead: set[str] = set()
    while True:
        path = Path(state) / "dead-letter.jsonl"
        now_size = path.stat().st_size if path.exists() else 0
        if now_size != size:  # read the file again only when it grew
            size = now_size
            dead = {str(d["event_id"]) for d in dead_letters(state)}
        delivered = {a.event_id for a in list(collector.accepted)}
        left = ids - delivered - dead
        if not left:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(left)} of {len(ids)} records neither delivered nor "
                               f"dead-lettered after {timeout} s")
        collector.wait_until(lambda a: ids <= {x.event_id for x in a}, 0.1)


def phase(collector: OtlpGrpcStandIn | OtlpHttpStandIn, grpc_calls: list[float] | None,
          state: str, ids: Sequence[str], start: float, start_wall: float,
          letters_before: int) -> Phase:
    """The figures of one burst published at ``start`` (monotonic) / ``start_wall``."""
    wanted = set(ids)
    accepted = [a for a in list(collector.accepted) if a.event_id in wanted]
    letters = dead_letters(state)[letters_before:]
    last_letter = max((wall_of(str(d["time"])) - start_wall for d in letters), default=None)
    deliver = max((a.arrival for a in accepted), default=None)
    deliver_s = None if deliver is None else deliver - start
    settle_s = max(x for x in (deliver_s, last_letter, 0.0) if x is not None)
    calls = calls_since(collector, grpc_calls, start, start + settle_s + 0.5)
    unique = {a.uid for a in accepted}
    return Phase(
        expected=len(wanted),
        requests=len(calls),
        refused=sum(1 for c in calls if c.verdict is not None),
        accepted=sum(1 for c in calls if c.verdict is None),
        refused_by_limit=sum(1 for c in calls if c.records is None),
        deliver_s=None if deliver_s is None else round(deliver_s, 3),
        settle_s=round(settle_s, 3),
        delivered=len(unique),
        duplicates=len(accepted) - len(unique),
        dead_lettered=len(letters),
        per_request=tuple(c.records or 0 for c in calls if c.verdict is None),
        refusals_at=tuple(round(c.arrival - start, 3) for c in calls if c.verdict is not None),
    )


def measure(scenario: str, protocol: str, code: str, label: str, number: int,
            overload: float = OVERLOAD) -> Run:
    """One run: the exporter of ``code`` (a ``src/`` directory; "" for this tree), the
    collector refusing for ``overload`` seconds in the overload scenario."""
    busy_until = [0.0]

    def answer(ids: list[str]) -> Reply | None:
        if time.monotonic() < busy_until[0]:
            return Reply("RESOURCE_EXHAUSTED" if protocol == "grpc" else 503)
        return None

    limit = LIMIT if scenario == "size-limit" else None
    grpc_calls: list[float] | None = [] if protocol == "grpc" else None
    with ExitStack() as stack:
        state = stack.enter_context(temp_state_dir())
        sim = stack.enter_context(Simulator(vm_name=VM))
        collector: OtlpGrpcStandIn | OtlpHttpStandIn
        if grpc_calls is not None:
            with counting_grpc_server(grpc_calls):
                collector = OtlpGrpcStandIn(answer, max_bytes=limit)
        else:
            collector = OtlpHttpStandIn(answer, max_bytes=limit)
        stack.enter_context(collector)
        env = exporter_env(
            sim.url, state,
            SEE_SINKS="otlp",
            SEE_POLL_INTERVAL="0.3",
            OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint,
            OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
            OTEL_EXPORTER_OTLP_INSECURE="true",
            # Logs only: a metric export would share the collector's answers and its requests.
            OTEL_METRICS_EXPORTER="none",
        )
        if code:
            env["PYTHONPATH"] = code
        proc = stack.enter_context(ExporterProcess(env))
        wait_first_poll(sim)
        base = make_event("BASE", vm_name=VM)
        sim.set_events([base])
        collector.wait_for(lambda a: any(x.event_id == "BASE" for x in a), 60, "BASE accepted")

        burst = [padded_event(f"A-{i:03d}", PADDING) for i in range(BURST)]
        if scenario == "size-limit":
            burst.insert(BURST // 2, padded_event("LARGE", LARGE))
        second = [padded_event(f"B-{i:03d}", PADDING) for i in range(SECOND)]
        size = document_bytes([base, *burst, *second])
        if size > IMDS_MAX:
            raise ValueError(f"the IMDS document would hold {size} bytes, more than IMDS's "
                             f"{IMDS_MAX}: fewer or smaller events")

        ids = [str(e["EventId"]) for e in burst]
        start, start_wall = time.monotonic(), time.time()
        if scenario == "overload":
            busy_until[0] = start + overload
        sim.set_events([base, *burst])
        settle(collector, state, set(ids), SETTLE_TIMEOUT + overload)
        first = phase(collector, grpc_calls, state, ids, start, start_wall, 0)

        # The second burst comes once the overload is over (and a poll later), whenever the
        # first one settled: it shows the request size the code came out of the overload with.
        time.sleep(max(0.0, busy_until[0] + 1.0 - time.monotonic()))
        letters = len(dead_letters(state))
        ids2 = [str(e["EventId"]) for e in second]
        start2, start2_wall = time.monotonic(), time.time()
        sim.set_events([base, *burst, *second])
        settle(collector, state, set(ids2), SETTLE_TIMEOUT)
        after = phase(collector, grpc_calls, state, ids2, start2, start2_wall, letters)

        _status, body = get_json(f"http://{env['SEE_HEALTH_ADDR']}/readyz")
        bound = body.get("sinks", {}).get("otlp", {}).get("request_bytes")
        exit_code = proc.terminate()
        halvings = sum(1 for line in proc.stderr_lines if "refused for its size" in line)
    return Run(scenario, protocol, label, number, first, after, bound, halvings, exit_code,
               size)


def extract(commit: str, into: Path) -> str:
    """``git archive COMMIT src`` of this repository under ``into``; returns its ``src/``."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "src"], check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        if hasattr(tarfile, "data_filter"):  # every Python since 3.11.4
            tar.extractall(into, filter="data")
        else:  # our own history
            tar.extractall(into)
    return str(into / "src")


def spread(values: Sequence[float | None]) -> str:
    """``median [min–max]`` of the values given (``-`` for none)."""
    got = [v for v in values if v is not None]
    if not got:
        return "-"
    low, high, middle = _show(min(got)), _show(max(got)), _show(median(got))
    return middle if low == high else f"{middle} [{low}–{high}]"


def _show(value: float) -> str:
    return f"{int(value)}" if float(value).is_integer() else f"{value:.2f}"


def shape(per_request: Sequence[int]) -> str:
    """Records per accepted request, runs of equal counts written ``N×k``."""
    parts: list[str] = []
    i = 0
    while i < len(per_request):
        j = i
        while j < len(per_request) and per_request[j] == per_request[i]:
            j += 1
        parts.append(f"{per_request[i]}" + (f"×{j - i}" if j - i > 1 else ""))
        i = j
    return ", ".join(parts) or "-"


def table(runs: Sequence[Run]) -> list[list[object]]:
    """One row per scenario, protocol and code: medians [min–max] over the runs."""
    rows: list[list[object]] = []
    for scenario in SCENARIOS:
        for protocol in PROTOCOLS:
            for code in sorted({r.code for r in runs}, key=lambda c: c != "before"):
                mine = [r for r in runs if (r.scenario, r.protocol, r.code)
                        == (scenario, protocol, code)]
                if not mine:
                    continue
                f = [r.first for r in mine]
                s = [r.second for r in mine]
                rows.append([
                    scenario, protocol, code, len(mine),
                    spread([p.requests for p in f]),
                    spread([p.refused for p in f]),
                    spread([p.accepted for p in f]),
                    spread([p.deliver_s for p in f]),
                    spread([p.settle_s for p in f]),
                    spread([p.delivered for p in f]),
                    spread([p.dead_lettered for p in f]),
                    " | ".join(shape(p.per_request) for p in f),
                    spread([p.requests for p in s]),
                    " | ".join(shape(p.per_request) for p in s),
                    spread([r.request_bytes for r in mine]),
                ])
    return rows


HEADERS = ["scenario", "protocol", "code", "runs", "requests", "refused", "accepted",
           "to deliver s", "to settle s", "delivered", "dead-lettered",
           "records per accepted request", "2nd burst requests", "2nd burst records per request",
           "request bound B"]


def summary(runs: Sequence[Run]) -> list[SummaryRow]:
    """The issue's figures for this tree's code, beside the code before (when run)."""
    rows = []
    for scenario in SCENARIOS:
        for protocol in PROTOCOLS:
            now = [r for r in runs if (r.scenario, r.protocol, r.code) == (scenario, protocol,
                                                                             "after")]
            old = [r for r in runs if (r.scenario, r.protocol, r.code) == (scenario, protocol,
                                                                             "before")]
            if not now:
                continue
            dead = [r.first.dead_lettered for r in now]
            wanted = 0 if scenario == "overload" else 1
            rows.append(SummaryRow(
                "overload", f"{scenario}, {protocol}: requests / to deliver s / dead-lettered "
                f"(of {now[0].first.expected})", f"dead-lettered {wanted}",
                f"{median([r.first.requests for r in now]):g} / "
                f"{median([r.first.deliver_s or float('nan') for r in now]):.2f} / "
                f"{median(dead):g}",
                (f"before: {median([r.first.requests for r in old]):g} / "
                 f"{median([r.first.deliver_s or float('nan') for r in old]):.2f} / "
                 f"{median([r.first.dead_lettered for r in old]):g}") if old else "",
                "", all(d == wanted for d in dead)))
            whole = [max(r.second.per_request, default=0) for r in now]
            rows.append(SummaryRow(
                "overload", f"{scenario}, {protocol}: records per request, {SECOND}-record "
                "burst afterwards", f"{SECOND} (overload)" if scenario == "overload" else "",
                spread(whole),
                f"before: {spread([max(r.second.per_request, default=0) for r in old])}"
                if old else "", "",
                all(w == SECOND for w in whole) if scenario == "overload" else None))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--runs", type=int, default=3, help="runs per scenario, protocol, code")
    parser.add_argument("--code", default="", help="another tree's src/ to run as 'before'")
    parser.add_argument("--commit", default="", help="git archive this commit's src/ as "
                        "'before' (instead of --code)")
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=SCENARIOS)
    parser.add_argument("--protocols", nargs="+", choices=PROTOCOLS, default=PROTOCOLS)
    parser.add_argument("--quick", action="store_true", help="one run each")
    parser.add_argument("--overload", type=float, default=OVERLOAD,
                        help=f"seconds of refusals (default {OVERLOAD:g}; another length writes "
                        "overload_<N>s.json)")
    args = parser.parse_args()
    runs_wanted = 1 if args.quick else args.runs
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="see-bench-before-") as scratch:
        before = args.code or (extract(args.commit, Path(scratch)) if args.commit else "")
        codes = [("after", "")] + ([("before", os.path.abspath(before))] if before else [])
        for number in range(1, runs_wanted + 1):
            for scenario in args.scenarios:
                for protocol in args.protocols:
                    # Alternate which code goes first, so neither always meets a warmer machine.
                    order = codes if number % 2 else codes[::-1]
                    for label, code in order:
                        print(f"run {number}: {scenario}, {protocol}, {label} ...", flush=True)
                        result = measure(scenario, protocol, code, label, number,
                                         args.overload)
                        f = result.first
                        print(f"    requests {f.requests} (refused {f.refused}), delivered "
                              f"{f.delivered}/{f.expected} in {f.deliver_s} s, dead-lettered "
                              f"{f.dead_lettered}; per request {shape(f.per_request)}; 2nd "
                              f"burst {shape(result.second.per_request)}", flush=True)
                        runs.append(result)
    print_table(f"A {BURST}-record burst ({PADDING} B each): {args.overload:g} s overload, and a "
                f"{LIMIT} B limit with one {LARGE} B record; medians [min–max]", HEADERS,
                table(runs))
    name = "overload" if args.overload == OVERLOAD else f"overload_{args.overload:g}s"
    save_results(name, {"quick": args.quick, "code": args.code, "commit": args.commit,
                        "burst": BURST, "padding": PADDING, "second": SECOND,
                        "overload_s": args.overload, "limit": LIMIT, "large": LARGE,
                        "runs": [asdict(r) for r in runs]}, summary(runs))


if __name__ == "__main__":
    main()
