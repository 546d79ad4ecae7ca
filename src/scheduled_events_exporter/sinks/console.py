"""Console sink: the SPEC §8 flat JSON object per transition, one per line on stdout."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import TextIO

from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import Resource

from scheduled_events_exporter.config import Config
from scheduled_events_exporter.records import TransitionRecord, to_columns
from scheduled_events_exporter.sinks import FailureCounter, SinkStatus, open_spool
from scheduled_events_exporter.sinks.delivery import DeliveryError, DeliveryWorker


def render(record: TransitionRecord) -> str:
    """One compact JSON line (the same object the Event Hubs sink sends)."""
    return json.dumps(to_columns(record), separators=(",", ":"), ensure_ascii=False)


class ConsoleSink:
    """Writes JSON lines to stdout for ``docker logs`` and local runs."""

    name = "console"

    def __init__(
        self, config: Config, count_failure: FailureCounter, stream: TextIO | None = None
    ) -> None:
        self._stream = stream if stream is not None else sys.stdout
        self._worker = DeliveryWorker(
            self.name,
            self._deliver,
            count_failure,
            max_records=config.spool_max_records,
            spool=open_spool(config, self.name),
        )

    def metric_readers(self) -> Sequence[MetricReader]:
        """The console carries transitions only."""
        return ()

    def start(self, resource: Resource) -> None:
        """Start the writer thread."""
        self._worker.start()

    def submit(self, records: Sequence[TransitionRecord]) -> None:
        """Queue records for writing."""
        self._worker.submit(records)

    def flush(self, timeout: float) -> bool:
        """Wait until queued lines are written."""
        return self._worker.flush(timeout)

    def shutdown(self, timeout: float) -> bool:
        """Write what is queued and stop."""
        return self._worker.stop(timeout)

    def status(self) -> SinkStatus:
        """Delivery health."""
        return self._worker.status()

    def _deliver(self, records: Sequence[TransitionRecord]) -> None:
        text = "".join(render(r) + "\n" for r in records)
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError) as exc:
            raise DeliveryError(f"cannot write to stdout: {exc}") from None
