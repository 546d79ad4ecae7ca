"""Console sink: the docs/semantics.md#sinks flat JSON object per transition, one per line on
stdout."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import TextIO

from scheduled_events_exporter.config import Config
from scheduled_events_exporter.delivery.outcome import DeliveryError, FailureCounter
from scheduled_events_exporter.records import TransitionRecord, to_columns
from scheduled_events_exporter.sinks.worker_sink import WorkerSink


def render(record: TransitionRecord, *, ascii_only: bool = False) -> str:
    """One compact JSON line (the same object the Event Hubs sink sends)."""
    return json.dumps(to_columns(record), separators=(",", ":"), ensure_ascii=ascii_only)


def _is_utf8(stream: TextIO) -> bool:
    encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "").replace("_", "")
    return encoding == "utf8"


class ConsoleSink(WorkerSink):
    """Writes JSON lines to stdout for ``docker logs`` and local runs."""

    name = "console"

    def __init__(
        self, config: Config, count_failure: FailureCounter, stream: TextIO | None = None
    ) -> None:
        self._stream = stream if stream is not None else sys.stdout
        # Where stdout is not UTF-8 (a Windows service's redirected stdout is in the ANSI code
        # page), text outside it is written as JSON \u escapes: the same JSON, never a write
        # that fails for ever.
        self._ascii = not _is_utf8(self._stream)
        super().__init__(config, count_failure)

    def metrics_changed(self) -> None:
        """No metrics here."""

    def _deliver(self, records: Sequence[TransitionRecord]) -> None:
        text = "".join(render(r, ascii_only=self._ascii) + "\n" for r in records)
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError) as exc:
            raise DeliveryError(f"cannot write to stdout: {exc}") from None
