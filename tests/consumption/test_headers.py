"""Every consumption artefact starts with a short header saying what it is for (a comment, or the
description field of formats without comments)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.consumption import consumption_helpers as ch

DIRS = ("kql", "azure", "grafana", "prometheus", "otel-collector", "k8s", "systemd")
FILES = [
    *sorted(p for d in DIRS for p in (ch.CONFIG / d).rglob("*") if p.is_file()),
    ch.REPO / "docs" / "consumption.md",
    ch.REPO / ".ci" / "install-consumption-tools.sh",
    *sorted(Path(__file__).parent.glob("*.js")),
]


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ch.REPO)))
def test_file_has_header(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    suffix = path.suffix
    if suffix == ".json":
        data = ch.load_json(path)
        description = data.get("description") or data.get("metadata", {}).get("description")
        assert isinstance(description, str) and len(description) > 20
    elif suffix in (".kql", ".js", ".bicep"):
        assert text.startswith("// ")
    elif suffix == ".md":
        assert text.startswith("# ")
    elif suffix == ".sh":
        assert text.startswith("#!") and text.splitlines()[1].startswith("# ")
    else:
        assert text.startswith("# "), path
