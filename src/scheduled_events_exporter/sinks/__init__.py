"""Sinks: where transition records and metrics go.

:mod:`.base` defines what a sink is; :mod:`..delivery` (spool, worker, dead letters) is how
every sink's records get there;
:mod:`.console`, :mod:`.otlp` and :mod:`.eventhubs` are the sinks. Sink modules are imported
only when configured (:func:`create_sinks`): the gRPC and Event Hubs stacks cost tens of MB.
"""

from __future__ import annotations

from scheduled_events_exporter.config import Config
from scheduled_events_exporter.delivery.outcome import FailureCounter, SinkStatus
from scheduled_events_exporter.sinks.base import Sink

__all__ = ["Sink", "SinkStatus", "create_sinks"]


def create_sinks(config: Config, count_failure: FailureCounter) -> list[Sink]:
    """Build the configured sinks, importing only their modules."""
    sinks: list[Sink] = []
    for name in config.sinks:
        if name == "console":
            from scheduled_events_exporter.sinks.console import ConsoleSink

            sinks.append(ConsoleSink(config, count_failure))
        elif name == "otlp":
            from scheduled_events_exporter.sinks.otlp import OtlpSink

            sinks.append(OtlpSink(config, count_failure))
        elif name == "eventhubs":
            from scheduled_events_exporter.sinks.eventhubs import create_eventhubs_sink

            sinks.append(create_eventhubs_sink(config, count_failure))
    return sinks
