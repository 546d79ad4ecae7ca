"""The parts of the install a route may need beyond the core, and the line that says so.

``pip install azure-scheduled-events-exporter`` is the core: IMDS, the console sink, OTLP over
HTTP and the Prometheus scrape. OTLP over gRPC needs the ``grpc`` extra (grpcio); the Event
Hubs sink needs the ``eventhubs`` extra (azure-eventhub, and azure-identity for managed
identity); the ``platform`` command needs the ``platform`` extra (azure-storage-queue, and
azure-identity for managed identity and Resource Graph). The slim image is the core alone; the
default image has every extra. A route whose extra is missing is a configuration problem, found
before anything starts and said in one line (:func:`problem`), never an ``ImportError`` from
inside a sink.

The line says how to add the extra to *this* install (:class:`Install`): the pip of the
interpreter that runs (a VM's ``/opt/scheduled-events-exporter/bin/python -m pip``, not
whichever ``pip`` comes first on the ``PATH``), the extra's lock by its absolute path when the
source tree is known, and, in an image, which has no pip and cannot gain a package, the image
that has the extra instead.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

DISTRIBUTION: Final = "azure-scheduled-events-exporter"
#: A file in the image's virtualenv (``sys.prefix``) naming the target the image was built as
#: (the Dockerfile writes it: ``slim``, or ``default`` once the extras are added). Only an image
#: has it: its virtualenv has no pip, and what it lacks comes with another image.
IMAGE_MARKER: Final = "image-target"


@dataclass(frozen=True, slots=True)
class Extra:
    """An extra of the distribution: its name and what it installs, as (import name,
    distribution) pairs."""

    name: str
    modules: tuple[tuple[str, str], ...]

    @property
    def install(self) -> str:
        """The pip requirement that adds it, quoted for a shell."""
        return f"'{DISTRIBUTION}[{self.name}]'"

    @property
    def lock(self) -> str:
        """Its lock, relative to the source tree."""
        return f"requirements/extra-{self.name}.lock"


GRPC: Final = Extra("grpc", (("grpc", "grpcio"),))
EVENTHUBS: Final = Extra("eventhubs", (("azure.eventhub", "azure-eventhub"),
                                       ("azure.identity", "azure-identity")))
PLATFORM: Final = Extra("platform", (("azure.storage.queue", "azure-storage-queue"),
                                     ("azure.identity", "azure-identity")))


@dataclass(frozen=True, slots=True)
class Install:
    """What the advice needs to know of the running exporter's install."""

    #: The interpreter that runs (``sys.executable``): its environment is the one to add to.
    python: str
    #: Whether pip is importable by it (a virtualenv made ``--without-pip``, or by uv, has none).
    pip: bool
    #: The source tree it was installed from (holding ``requirements/``), when known.
    source: Path | None
    #: The image target it was built as (:data:`IMAGE_MARKER`), ``""`` outside an image.
    image: str


def _importable(module: str) -> bool:
    """Whether ``module`` can be found, without importing it (gRPC's import alone costs
    ~0.35 s, which check-config need not pay). A parent package is imported to look inside."""
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package missing, or an import hook that refuses it
        return False


def _source_tree() -> Path | None:
    """The source tree this exporter runs from or was installed from, if it still has its
    ``requirements/``: a checkout's ``src/`` (an editable install), else the directory pip or
    uv recorded (PEP 610 ``direct_url.json``, for ``pip install DIR``). A wheel built
    elsewhere (docs/vm.md builds one in a temporary clone) records only the wheel: unknown."""
    # Imported here, when a line is composed: every command imports this module (through
    # config), the image's HEALTHCHECK probe included, and these cost ~70 ms together.
    import importlib.metadata
    import json
    from urllib.parse import urlsplit
    from urllib.request import url2pathname

    candidates = [Path(__file__).resolve().parents[2]]
    try:
        recorded = importlib.metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
        direct = json.loads(recorded or "{}")
    except (importlib.metadata.PackageNotFoundError, ValueError, OSError):
        direct = {}
    url = direct.get("url", "") if isinstance(direct, dict) else ""
    if isinstance(url, str) and url.startswith("file:") and "dir_info" in direct:
        candidates.append(Path(url2pathname(urlsplit(url).path)))
    return next((c for c in candidates if (c / "requirements" / "runtime.lock").is_file()),
                None)


def here() -> Install:
    """The running exporter's install."""
    try:
        image = (Path(sys.prefix) / IMAGE_MARKER).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        image = ""
    return Install(python=sys.executable, pip=_importable("pip"), source=_source_tree(),
                   image=image)


def missing(extra: Extra, modules: tuple[str, ...] | None = None) -> list[str]:
    """The distributions of ``extra`` (of those providing ``modules``, if given) that are not
    installed."""
    return [distribution for module, distribution in extra.modules
            if (modules is None or module in modules) and not _importable(module)]


def _word(text: str) -> str:
    """``text`` as one word of a command line (a path with a space in double quotes, which
    both a POSIX shell and PowerShell read)."""
    return text if re.fullmatch(r"[\w@%+=:,./\\-]+", text) else f'"{text}"'


def pip_command(install: Install) -> str:
    """The pip that installs into ``install``'s environment."""
    if install.pip:
        return f"{_word(install.python)} -m pip"
    # pip 22.3 and later install into another interpreter's environment.
    return f"pip --python {_word(install.python)}"


def ways_to_add(extra: Extra, install: Install) -> str:
    """The ways to add ``extra`` to ``install``: pip by name, or its lock with hashes."""
    pip = pip_command(install)
    lock = install.source / extra.lock if install.source else None
    if lock is not None and lock.is_file():
        hashed = f": {pip} install --require-hashes --no-deps -r {_word(str(lock))}"
    else:  # only the clone it was built from has the lock: said so, not a bare relative path
        hashed = (f", run in the exporter's source tree: {pip} install --require-hashes "
                  f"--no-deps -r {extra.lock}")
    return f"{pip} install {extra.install}, or with the hashes CI tests{hashed}"


def outside_core(setting: str, route: str, extra: Extra, present: list[str],
                 install: Install | None = None) -> str:
    """The warning for a route that works here only because its extra's packages are
    installed (``""`` in an image, whose build installs its extras every time).

    Whether the extra was *asked for* is not recorded: pip writes no requested extras into an
    installation (``importlib.metadata`` shows the distribution's ``Requires-Dist`` with their
    ``extra ==`` markers, ``REQUESTED`` only says a distribution was named itself, and
    ``direct_url.json`` names the source, not its extras). So a VM upgraded with ``pip install
    -U .`` over a release that had grpcio in the core keeps grpcio undeclared, and nothing
    tells it from an install that named the extra: the warning says what a fresh install needs,
    for every install outside an image."""
    install = here() if install is None else install
    if install.image:
        return ""
    names = " and ".join(present)
    verb, they, them = ("are", "they", "them") if len(present) > 1 else ("is", "it", "it")
    return (f"{setting}: {route} works here because {names} {verb} installed, but {they} "
            f"{verb} not part of the core: the {extra.name} extra brings {them}, and whether "
            f"this install asked for that extra is recorded nowhere (pip install -U over a "
            f"release that had {them} in the core leaves {them} installed without the extra); "
            f"a fresh install without the extra refuses this route: expected the extra named "
            f"in every install and upgrade ({ways_to_add(extra, install)})")


def problem(setting: str, route: str, extra: Extra, absent: list[str], instead: str,
            install: Install | None = None) -> str:
    """The one configuration problem line for a route whose extra is missing: which setting
    asked for the route, what is not installed, and the ways out for this install."""
    install = here() if install is None else install
    names = " and ".join(absent)
    verb = "are" if len(absent) > 1 else "is"
    if install.image:
        # No pip, a read-only root, and a container that starts afresh: pip is no way out.
        image = ("the slim image has the core alone" if install.image == "slim"
                 else f"this image ({install.image}) has it not")
        return (f"{setting}: {route} needs {names}, which {verb} not in this image ({image}, "
                f"and no pip to add the {extra.name} extra); expected the default image, which "
                f"has every extra (the same tag without -slim; the chart's "
                f"image.flavor=default), or an image built with it (the Dockerfile's default "
                f"target, docs/container.md), or {instead}")
    return (f"{setting}: {route} needs {names}, which {verb} not installed (the {extra.name} "
            f"extra); expected it installed into this exporter's environment "
            f"({ways_to_add(extra, install)}) or {instead}")
