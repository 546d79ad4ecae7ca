"""Azure Scheduled Events exporter: IMDS Scheduled Events as OpenTelemetry logs and metrics."""

from __future__ import annotations

import importlib

#: The release this source is, or leads to: the one number a release sets (docs/releasing.md;
#: the release workflow checks that the tag vX.Y.Z, this and the chart's appVersion agree).
RELEASE = "0.1.0"


def _built_version() -> str:
    """What setup.py wrote into ``_build.py`` at build time, or RELEASE+unknown for a source
    tree that was never built (or whose editable install predates a new RELEASE)."""
    try:
        built = str(importlib.import_module(f"{__name__}._build").VERSION)
    except (ImportError, AttributeError):
        return f"{RELEASE}+unknown"
    return built if built.partition("+")[0] == RELEASE else f"{RELEASE}+unknown"


#: What runs: RELEASE for a tagged release (``0.1.0``), RELEASE and the commit for any other
#: build (``0.1.0+g56159e4``). ``version``, the start line, ``service.version`` and the records'
#: ``ExporterVersion`` say it.
__version__ = _built_version()
