"""Whether a sink refuses what it is given (pure): the local signal of a collector that answers
every request with a permanent error.

Such a sink delivers nothing, yet it never looks stuck: each refused record goes to the
dead-letter file at once and its queue stays empty. Its own metric
(``export.failures{signal=dead_letter}``) travels to that same refusing collector. So the worker
notes every record's fate here, and ``/readyz`` calls the sink failing while its last
:data:`STREAK` records were all dead-lettered, until one is delivered. A VM sees a few records
a day (one event makes two or three), so the streak is short; the OTLP sink's metric exports,
refused for good :data:`METRIC_STREAK` times in a row, say the same within minutes.

Only a delivered record ends the streak (or a restart: it is kept in memory). A collector fixed
meanwhile is not evidence: an accepted metric export, or an empty request, says nothing of the
records a collector may refuse for their content (a log pipeline's schema, an attribute
limit), so the sink stays failing after the fix until the next record, or a dead letter
redelivered (``redeliver``, whose procedure restarts the exporter), gets through. The verdict
says so, since it can outlast the cause by hours (docs/semantics.md, "Reliability").
"""

from __future__ import annotations

from dataclasses import dataclass

#: Dead-lettered records in a row that make a sink failing.
STREAK = 2
#: Metric exports refused for good in a row that make a sink failing (one a minute by default).
METRIC_STREAK = 3


@dataclass
class Rejections:
    """The recent fate of one sink's records."""

    streak: int = 0
    last_status: str = ""

    def delivered(self, count: int) -> None:
        """``count`` records were accepted: the sink takes what it is given."""
        if count:
            self.streak = 0

    def dead_lettered(self, status: str) -> None:
        """One record was refused for good (``status``: what the peer answered)."""
        self.streak += 1
        self.last_status = status

    def verdict(self) -> str:
        """Why the sink counts as failing, or ``""``."""
        if self.streak < STREAK:
            return ""
        return (f"the last {self.streak} records were dead-lettered "
                f"({self.last_status or 'refused'}); failing until the sink delivers a record "
                f"(a new one, or a dead letter once redelivered) or the exporter restarts")
