"""The exporter uses other libraries through their public interfaces only (docs/decisions.md,
"The OTLP route owns its requests"): no private module or name of a library is imported, no
``_``-prefixed attribute of a library's object is read, called or assigned, and no class of
ours overrides a library class's private method or reuses one of its private attributes.

The one exception is written down (docs/decisions.md, "One private name of another library"):
:data:`ALLOWED` lists it, so a second one fails here rather than in production.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import scheduled_events_exporter

SRC = Path(scheduled_events_exporter.__file__).parent
#: Top-level packages that are not ours.
LIBRARIES = ("opentelemetry", "grpc", "urllib3", "prometheus_client", "azure", "certifi",
             "google")
#: Names with a leading underscore that are public by definition: the namedtuple API, and the
#: standard library's ``os._exit`` (exit without running handlers, on purpose).
PUBLIC_UNDERSCORED = {"_replace", "_asdict", "_fields", "_make", "_exit"}
#: What ``abc`` and ``typing`` put on every class they make, ours included.
CLASS_MACHINERY = {"_abc_impl", "_is_protocol", "_is_runtime_protocol", "_abc_registry",
                   "_abc_cache", "_abc_negative_cache", "_abc_negative_cache_version"}
#: file → attributes: azure-eventhub 5.x's sockets, to unblock a call stuck in SASL.
ALLOWED = {"sinks/hub_sender.py": {"_producers", "_handler", "_connection", "_transport"}}


def sources() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "__pycache__" not in p.parts)


def relative(path: Path) -> str:
    return path.relative_to(SRC).as_posix()


def private_part(dotted: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in dotted.split("."))


def test_no_private_module_or_name_of_a_library_is_imported() -> None:
    found = []
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module.split(".")[0] not in LIBRARIES:
                    continue
                names = [a.name for a in node.names if a.name.startswith("_")]
                if private_part(node.module) or names:
                    found.append(f"{relative(path)}:{node.lineno} from {node.module} {names}")
            elif isinstance(node, ast.Import):
                found += [f"{relative(path)}:{node.lineno} import {a.name}" for a in node.names
                          if a.name.split(".")[0] in LIBRARIES and private_part(a.name)]
    assert found == []


def test_no_private_attribute_is_reached_on_an_object_that_is_not_ours() -> None:
    """``x._name`` with ``x`` not ``self``/``cls``: in this code base only the allowed ones."""
    found = []
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")):
                continue
            if node.attr.startswith("__") or node.attr in PUBLIC_UNDERSCORED:
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if node.attr in ALLOWED.get(relative(path), set()):
                continue
            found.append(f"{relative(path)}:{node.lineno} .{node.attr}")
    assert found == []


def library_classes_subclassed() -> list[tuple[type, type]]:
    pairs = []
    for info in pkgutil.walk_packages([str(SRC)], "scheduled_events_exporter."):
        if ".simulator" in info.name or info.name.endswith("__main__"):
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # a module of the other platform (win32 bindings)
            continue
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__:
                continue
            pairs += [(cls, base) for base in cls.__mro__[1:]
                      if base.__module__.split(".")[0] in LIBRARIES]
    return pairs


def test_subclasses_of_library_classes_touch_nothing_private_of_theirs() -> None:
    pairs = library_classes_subclassed()
    assert {base.__name__ for _, base in pairs} >= {
        "PeriodicExportingMetricReader", "MetricReader", "MetricExporter"}, "nothing examined"
    found = []
    for cls, base in pairs:
        overridden = [name for name in vars(cls) if name.startswith("_")
                      and not name.startswith("__") and name in vars(base)
                      and name not in CLASS_MACHINERY]
        found += [f"{cls.__name__} overrides {base.__name__}.{name}" for name in overridden]
        try:
            base_source = inspect.getsource(base)
        except (OSError, TypeError):  # a class written in C: no attributes of ours can clash
            continue
        theirs = set(re.findall(r"self\.(_[a-z]\w*)", base_source))
        ours = set(re.findall(r"self\.(_[a-z]\w*)\s*=", inspect.getsource(cls)))
        found += [f"{cls.__name__}.{name} is also {base.__name__}'s" for name in ours & theirs]
    assert found == []


@pytest.mark.parametrize("code", [
    "from opentelemetry.sdk._logs import LoggingHandler",
    "from opentelemetry.exporter.otlp.proto.common import _log_encoder",
])
def test_the_import_check_sees_a_private_import(code: str, tmp_path: Path) -> None:
    """The scan above is not vacuous: it would have caught the names it was written for."""
    tree = ast.parse(code)
    node = tree.body[0]
    assert isinstance(node, ast.ImportFrom) and node.module
    assert private_part(node.module) or any(a.name.startswith("_") for a in node.names)
