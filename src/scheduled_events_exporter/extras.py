"""The parts of the install a route may need beyond the core, and the line that says so.

``pip install azure-scheduled-events-exporter`` is the core: IMDS, the console sink, OTLP over
HTTP and the Prometheus scrape. OTLP over gRPC needs the ``grpc`` extra (grpcio); the Event
Hubs sink needs the ``eventhubs`` extra (azure-eventhub, and azure-identity for managed
identity); the ``platform`` command needs the ``platform`` extra (azure-storage-queue, and
azure-identity for managed identity and Resource Graph). The slim image is the core alone;
the default image has every extra. A route whose extra is missing is a configuration problem,
found before anything starts and said in one line (:func:`problem`), never an ``ImportError``
from inside a sink.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Final

DISTRIBUTION: Final = "azure-scheduled-events-exporter"


@dataclass(frozen=True, slots=True)
class Extra:
    """An extra of the distribution: its name and what it installs, as (import name,
    distribution) pairs."""

    name: str
    modules: tuple[tuple[str, str], ...]

    @property
    def install(self) -> str:
        """The pip command that adds it."""
        return f"pip install '{DISTRIBUTION}[{self.name}]'"


GRPC: Final = Extra("grpc", (("grpc", "grpcio"),))
EVENTHUBS: Final = Extra("eventhubs", (("azure.eventhub", "azure-eventhub"),
                                       ("azure.identity", "azure-identity")))
PLATFORM: Final = Extra("platform", (("azure.storage.queue", "azure-storage-queue"),
                                     ("azure.identity", "azure-identity")))


def _importable(module: str) -> bool:
    """Whether ``module`` can be found, without importing it (gRPC's import alone costs
    ~0.35 s, which check-config need not pay). A parent package is imported to look inside."""
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package missing, or an import hook that refuses it
        return False


def missing(extra: Extra, modules: tuple[str, ...] | None = None) -> list[str]:
    """The distributions of ``extra`` (of those providing ``modules``, if given) that are not
    installed."""
    return [distribution for module, distribution in extra.modules
            if (modules is None or module in modules) and not _importable(module)]


def problem(setting: str, route: str, extra: Extra, absent: list[str], instead: str) -> str:
    """The one configuration problem line for a route whose extra is missing: which setting
    asked for the route, what is not installed, and the two ways out."""
    names = " and ".join(absent)
    return (f"{setting}: {route} needs {names}, which {'are' if len(absent) > 1 else 'is'} "
            f"not installed (the {extra.name} extra); expected it installed ({extra.install}, "
            f"or with the hashes CI tests: pip install --require-hashes --no-deps -r "
            f"requirements/extra-{extra.name}.lock; in a container, the default image rather "
            f"than -slim) or {instead}")
