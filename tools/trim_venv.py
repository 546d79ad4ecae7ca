"""Trim the image's virtualenv to what runs, keeping everything that does (the Dockerfile's
build stages run it after each install; docs/container.md has the figures).

``python tools/trim_venv.py VENV`` (run by the virtualenv's own interpreter, so the bytecode is
its version's) does three things to ``VENV``'s site-packages:

* **strips the shared objects** (``strip --strip-unneeded``: the symbol tables and debugging
  sections that some wheels ship; the dynamic symbols a loader needs stay). gRPC's is stripped
  already, cryptography's (14.4 MB) is not.
* **removes type stubs** (``*.pyi``): read by type checkers, never by the interpreter.
* **removes the Azure SDKs' asyncio clients** (every ``aio`` package under ``azure/``: the
  Event Hubs, identity and Storage queue SDKs' async twins, about 0.9 MB of bytecode): the
  exporter uses their synchronous clients only, and no module outside an ``aio`` package
  imports one except under ``TYPE_CHECKING`` (azure-core's own async modules, which its sync
  pipeline imports, are not in an ``aio`` package and stay). This keeps the default image,
  which carries the platform command's Storage queue SDK too, within its 100 MB.
* **ships the dependencies as bytecode only**: each ``.py`` outside the exporter's own package
  is compiled to a ``.pyc`` beside it (its original path kept in the code objects, so a
  traceback still names the file and line) and the source removed. The interpreter imports such
  a module from the ``.pyc`` directly; the root file system is read-only at run time, so
  bytecode must be there anyway, and a source beside it is read only to print a traceback's
  line. The exporter's own package keeps its sources, compiled beside them into
  ``__pycache__`` (checked by hash, never by time stamp).

Run again after more distributions are installed, it handles only what is new. The image tests
run every route (console, OTLP over HTTP and gRPC, Event Hubs, the Prometheus scrape, approval
hooks) on the trimmed images.
"""

from __future__ import annotations

import compileall
import py_compile
import shutil
import subprocess
import sys
from pathlib import Path

#: Top-level packages that keep their sources: the exporter's own.
KEEP_SOURCES = ("scheduled_events_exporter",)
_HASHED = py_compile.PycInvalidationMode.UNCHECKED_HASH


def site_packages(venv: Path) -> Path:
    """The virtualenv's one ``lib/pythonX.Y/site-packages``."""
    (found,) = venv.glob("lib/python3*/site-packages")
    return found


def strip_shared_objects(site: Path) -> int:
    """Strip every extension module; the bytes saved."""
    strip = shutil.which("strip")
    if strip is None:
        raise SystemExit("trim_venv: strip not found (binutils); the Dockerfile installs it")
    saved = 0
    for library in sorted(site.rglob("*.so")):
        before = library.stat().st_size
        subprocess.run([strip, "--strip-unneeded", str(library)], check=True)
        saved += before - library.stat().st_size
    return saved


def remove_stubs(site: Path) -> int:
    """Remove the type stubs; the bytes removed."""
    removed = 0
    for stub in sorted(site.rglob("*.pyi")):
        removed += stub.stat().st_size
        stub.unlink()
    return removed


def remove_async_clients(site: Path) -> int:
    """Remove the ``aio`` packages of the Azure SDKs; the bytes removed."""
    azure = site / "azure"
    if not azure.is_dir():
        return 0
    removed = 0
    # Deepest first, so a package inside another is gone before its parent is looked at.
    for package in sorted(azure.rglob("aio"), key=lambda p: len(p.parts), reverse=True):
        is_package = any((package / name).exists() for name in ("__init__.py", "__init__.pyc"))
        if package.is_dir() and is_package:
            removed += _size(package)
            shutil.rmtree(package)
    return removed


def bytecode_only(site: Path) -> int:
    """Compile every dependency's source to a ``.pyc`` beside it and remove the source and any
    ``__pycache__``; the bytes of source removed."""
    removed = 0
    for entry in sorted(site.iterdir()):
        if entry.name in KEEP_SOURCES or entry.name.endswith((".dist-info", ".data")):
            continue
        if entry.is_dir():
            sources = sorted(entry.rglob("*.py"))
        else:
            sources = [entry] if entry.suffix == ".py" else []
        for source in sources:
            # dfile: the name tracebacks and warnings give; the interpreter never reads it.
            py_compile.compile(str(source), cfile=str(source.with_suffix(".pyc")),
                               dfile=str(source), doraise=True, invalidation_mode=_HASHED)
            removed += source.stat().st_size
            source.unlink()
        if entry.is_dir():
            for cache in sorted(entry.rglob("__pycache__"), reverse=True):
                shutil.rmtree(cache)
    if (site / "__pycache__").is_dir():  # what top-level modules had compiled
        shutil.rmtree(site / "__pycache__")
    return removed


def compile_kept(site: Path) -> None:
    """Bytecode for the packages that keep their sources, checked by hash (the root is
    read-only at run time: nothing is compiled then)."""
    for name in KEEP_SOURCES:
        if (site / name).is_dir() and not compileall.compile_dir(
                str(site / name), quiet=1, workers=0, invalidation_mode=_HASHED):
            raise SystemExit(f"trim_venv: {name} did not compile")


def _size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python tools/trim_venv.py VENV", file=sys.stderr)
        return 2
    site = site_packages(Path(argv[0]))
    stripped = strip_shared_objects(site)
    stubs = remove_stubs(site)
    asynchronous = remove_async_clients(site)
    sources = bytecode_only(site)
    compile_kept(site)
    print(f"trim_venv: {site}: {stripped / 1e6:.2f} MB of symbols stripped, "
          f"{stubs / 1e6:.2f} MB of stubs, {asynchronous / 1e6:.2f} MB of the Azure SDKs' "
          f"asyncio clients and {sources / 1e6:.2f} MB of dependency sources removed "
          f"(compiled beside them); {_size(site) / 1e6:.2f} MB in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
