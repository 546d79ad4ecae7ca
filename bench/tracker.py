"""Parser and tracker cost per document, against ``json.loads`` of the same bytes.

Documents of 10, 100, 1000 and 10000 events (``parser.MAX_EVENTS``), encoded exactly as the
simulator (and IMDS) send them: compact JSON, RFC 1123 ``NotBefore``. Timed in-process with
``time.perf_counter`` per call; the median of many calls is reported (about 0.4 s of calls per
figure and round, 5 rounds over all sizes in turn; quick mode: one round of 0.15 s).

* ``json.loads``: the baseline (what any client pays to read the document);
* ``events ==``: comparing each parsed event with the same event of the previous document, a
  second baseline (the floor of change detection, touching the same objects as ``track``);
* ``parse_document``: bytes → ``Document`` (validation, NotBefore parsing, dataclasses);
* ``track`` on three kinds of document, each against the state the previous document left:
  ``new`` (every event appears: N ``scheduled`` transitions, the worst case),
  ``unchanged`` (same events, higher incarnation: no transition, the common 200),
  ``started`` (every event goes Scheduled → Started: N ``started`` transitions);
* ``parse + track (new)``: the whole per-document work of a poll that saw N new events.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from benchlib import (
    SummaryRow,
    events_document,
    median,
    parse_args,
    print_table,
    save_results,
)

from scheduled_events_exporter.parser import parse_document
from scheduled_events_exporter.simulator.server import document_response
from scheduled_events_exporter.tracker import TrackerState, track

SIZES = (10, 100, 1000, 10000)
TARGET_MS = 5.0
GAP = 3.0


def encode(events: list[dict[str, object]], incarnation: int) -> bytes:
    """The document bytes exactly as the simulator sends them."""
    return document_response(incarnation, events, "2020-07-01", None).body


def timed(fn: Callable[[], object], budget: float) -> tuple[float, int]:
    """Median seconds per call of ``fn`` over about ``budget`` seconds (at least 5 calls)."""
    fn()  # warm caches
    samples: list[float] = []
    deadline = time.perf_counter() + budget
    while len(samples) < 5 or time.perf_counter() < deadline:
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return median(samples), len(samples)


def measure(n: int, budget: float) -> dict[str, Any]:
    """All figures for documents of ``n`` events (milliseconds per call)."""
    events = events_document(n)
    raw_new = encode(events, 2)
    started = [{**e, "EventStatus": "Started", "NotBefore": ""} for e in events]
    raw_started = encode(started, 3)
    raw_unchanged = encode(events, 4)
    now = datetime.now(timezone.utc)
    empty = TrackerState(incarnation=1, last_good=now)
    doc_new = parse_document(raw_new)
    state_seen, transitions_new = track(empty, doc_new, now, gap_threshold=GAP)
    doc_started = parse_document(raw_started)
    doc_unchanged = parse_document(raw_unchanged)
    assert len(transitions_new) == n
    assert len(track(state_seen, doc_started, now, gap_threshold=GAP)[1]) == n
    assert not track(state_seen, doc_unchanged, now, gap_threshold=GAP)[1]

    def both() -> None:
        track(empty, parse_document(raw_new), now, gap_threshold=GAP)

    pairs = list(zip(doc_new.events, doc_unchanged.events, strict=True))
    figures = {
        "json.loads": timed(lambda: json.loads(raw_new), budget),
        # The least any change detection does: compare every event with its predecessor.
        "events ==": timed(lambda: [a == b for a, b in pairs], budget),
        "parse_document": timed(lambda: parse_document(raw_new), budget),
        "track new": timed(lambda: track(empty, doc_new, now, gap_threshold=GAP), budget),
        "track unchanged": timed(
            lambda: track(state_seen, doc_unchanged, now, gap_threshold=GAP), budget
        ),
        "track started": timed(
            lambda: track(state_seen, doc_started, now, gap_threshold=GAP), budget
        ),
        "parse + track new": timed(both, budget),
    }
    return {
        "events": n,
        "bytes": len(raw_new),
        "ms": {k: v[0] * 1000 for k, v in figures.items()},
        "calls": {k: v[1] for k, v in figures.items()},
    }


def main() -> None:
    args = parse_args(__doc__.splitlines()[0] if __doc__ else "")
    budget = 0.15 if args.quick else 0.4
    rounds = 1 if args.quick else 5
    per_size: dict[int, list[dict[str, Any]]] = {n: [] for n in SIZES}
    # Rounds go over every size in turn, so a noisy neighbour hits all sizes alike; each
    # figure is the median of the per-round medians.
    for index in range(rounds):
        print(f"round {index + 1}/{rounds} ...", flush=True)
        for n in SIZES:
            per_size[n].append(measure(n, budget))
    results = []
    for n, per_round in per_size.items():
        keys = per_round[0]["ms"].keys()
        results.append(
            {
                "events": n,
                "bytes": per_round[0]["bytes"],
                "ms": {k: median([r["ms"][k] for r in per_round]) for k in keys},
                "rounds": per_round,
            }
        )
    names = list(results[0]["ms"])
    print_table(
        "Per-document cost, median ms per call (baseline: json.loads of the same bytes)",
        ["events", "KiB", *names, "parse+track / json.loads"],
        [
            [
                r["events"],
                r["bytes"] / 1024,
                *(r["ms"][k] for k in names),
                r["ms"]["parse + track new"] / r["ms"]["json.loads"],
            ]
            for r in results
        ],
    )
    print_table(
        "Growth: microseconds per event (constant = linear)",
        ["events", *names],
        [[r["events"], *(1000 * r["ms"][k] / r["events"] for k in names)] for r in results],
    )
    by_n = {r["events"]: r["ms"] for r in results}
    growth = {k: by_n[10000][k] / by_n[1000][k] for k in names}
    print_table(
        "Growth ratio 10000 / 1000 events (10 = linear)",
        names,
        [[growth[k] for k in names]],
    )
    k1000 = by_n[1000]
    track_kinds = ("track new", "track unchanged", "track started")
    worst = max(track_kinds, key=lambda k: k1000[k])
    # Linear means: grows no faster than json.loads of the same bytes (which is linear by
    # construction; its own 1000 -> 10000 step shows the memory hierarchy, not the algorithm).
    normalised = {k: growth[k] / growth["json.loads"] for k in names}
    summary = [
        SummaryRow(
            "tracker",
            f"track(), 1000 events, slowest kind ({worst.removeprefix('track ')}) (ms)",
            f"<= {TARGET_MS:g}",
            f"{k1000[worst]:.2f}",
            f"json.loads {k1000['json.loads']:.2f}",
            f"{k1000[worst] / k1000['json.loads']:.1f}",
            k1000[worst] <= TARGET_MS,
        ),
        SummaryRow(
            "tracker",
            "parse_document + track(), 1000 new events (ms)",
            f"<= {TARGET_MS:g}",
            f"{k1000['parse + track new']:.2f}",
            f"json.loads {k1000['json.loads']:.2f}",
            f"{k1000['parse + track new'] / k1000['json.loads']:.1f}",
            k1000["parse + track new"] <= TARGET_MS,
        ),
        SummaryRow(
            "tracker",
            "parse_document / track new / unchanged / started, 1000 events (ms)",
            "-",
            " / ".join(f"{k1000[k]:.2f}" for k in ("parse_document", *track_kinds)),
            f"json.loads {k1000['json.loads']:.2f}",
            f"{k1000['parse_document'] / k1000['json.loads']:.1f}",
            None,
        ),
        SummaryRow(
            "tracker",
            "growth 1000 -> 10000 events, parse + track new (x)",
            "linear: <= 1.5x json.loads' growth",
            f"{growth['parse + track new']:.1f}",
            f"json.loads {growth['json.loads']:.1f}",
            f"{normalised['parse + track new']:.2f}",
            normalised["parse + track new"] <= 1.5,
        ),
        SummaryRow(
            "tracker",
            "growth 1000 -> 10000 events, track unchanged (x)",
            "linear: <= 1.5x growth of events ==",
            f"{growth['track unchanged']:.1f}",
            f"events == {growth['events ==']:.1f}",
            f"{growth['track unchanged'] / growth['events ==']:.2f}",
            growth["track unchanged"] / growth["events =="] <= 1.5,
        ),
    ]
    save_results(
        "tracker",
        {"quick": args.quick, "sizes": results, "growth": growth, "growth_vs_json": normalised},
        summary,
    )


if __name__ == "__main__":
    main()
