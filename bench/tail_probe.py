"""Diagnostic: the exporter (``run``) with a wall-clock stamp on stderr at each pipeline stage.

Used by ``bench/e2e_delay.py --probe`` to find where a slow change → record goes. Each stamp is
one line ``PROBE <stage> <time.time()> <thread>``; the stages of one poll that saw a change:
``fetched`` (IMDS answered), ``commit+``/``commit-`` (state file, fsync), ``spool+``/``spool-``
(spool append, fsync), ``submitted`` (handed to the sink), ``deliver+`` (the sink's worker
took the batch), ``export+``/``export-`` (the SDK exporter's call), ``metrics+``/``metrics-``
(a metric export). The probe wraps functions; it changes no behaviour.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from scheduled_events_exporter import imds, state
from scheduled_events_exporter.cli import main
from scheduled_events_exporter.sinks import otlp

try:
    from scheduled_events_exporter.delivery import spool
    from scheduled_events_exporter.delivery import worker as delivery
except ImportError:  # the code before the delivery package (bench/e2e_delay.py --code)
    from scheduled_events_exporter import spool  # type: ignore[no-redef]
    from scheduled_events_exporter.sinks import delivery  # type: ignore[no-redef]

try:
    from scheduled_events_exporter.sinks.on_change_reader import OnChangeMetricReader as Reader
except ImportError:  # the code before on-change metrics (bench/e2e_delay.py --code)
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader as Reader


def stamp(stage: str) -> None:
    sys.stderr.write(f"PROBE {stage} {time.time():.6f} {threading.current_thread().name}\n")
    sys.stderr.flush()


def around(owner: Any, name: str, stage: str, only: Callable[..., bool] | None = None) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        loud = only is None or only(*args, **kwargs)
        if loud:
            stamp(stage + "+")
        try:
            return original(*args, **kwargs)
        finally:
            if loud:
                stamp(stage + "-")

    setattr(owner, name, wrapper)


original_fetch = imds.ImdsClient.fetch_events


def fetch(self: Any) -> Any:
    result = original_fetch(self)
    if result.document is not None:
        stamp("fetched")
    return result


imds.ImdsClient.fetch_events = fetch  # type: ignore[method-assign]
around(state.StateCommitter, "commit", "commit",
       lambda self, state, records, seq, **kw: bool(records))
around(spool.Spool, "append", "spool")
around(delivery.DeliveryWorker, "submit", "submit", lambda self, records: bool(records))
around(otlp.OtlpSink, "_deliver", "deliver")
around(Reader, "_receive_metrics", "metrics")

if __name__ == "__main__":
    raise SystemExit(main(["run"]))
