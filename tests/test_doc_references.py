"""The repository stands alone: every reference to a document (and a section of it) that the
code, the configuration and the docs make points at something the repository holds."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TEXT_SUFFIXES = {".py", ".md", ".kql", ".json", ".yaml", ".yml", ".service", ".env", ".toml"}
#: docs/x.md, docs/x.md#anchor, README.md#anchor, written bare or as a markdown link target.
DOC_REF = re.compile(r"(?<![\w/.-])((?:docs/)?[\w.-]+\.md)(#[\w-]+)?")
EXTERNAL = re.compile(r"SPEC ?§|\bSPEC\b(?!_)|\b[Ii]ssues? #?\d+\b")
#: A bare "§N" left over from a sweep names no document; only BENCHMARKS.md numbers its own
#: sections and refers to them that way.
BARE_SECTION = re.compile(r"§\s*\d")
SELF_NUMBERED = {"BENCHMARKS.md"}


def tracked() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    # The checker and the sweep tool spell the patterns they look for.
    own = {"tests/test_doc_references.py", "tools/sweep_spec_refs.py"}
    return [REPO / n for n in names if Path(n).suffix in TEXT_SUFFIXES
            and not n.startswith("tests/corpus/") and n not in own]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", path.read_text(), re.M)}


def resolve(source: Path, name: str) -> Path | None:
    for base in (source.parent, REPO, REPO / "docs"):
        candidate = (base / name).resolve()
        if candidate.is_file():
            return candidate
    return None


@pytest.mark.parametrize("path", tracked(), ids=lambda p: str(p.relative_to(REPO)))
def test_references_point_at_what_the_repository_holds(path: Path) -> None:
    text = path.read_text(encoding="utf-8", errors="replace")
    problems = []
    for number, line in enumerate(text.splitlines(), 1):
        if EXTERNAL.search(line) and \
                "opentelemetry-python issue" not in line and "Azure/AKS" not in line:
            problems.append(f"line {number}: cites a document the repository does not hold: "
                            f"{line.strip()[:100]}")
        if BARE_SECTION.search(line) and path.name not in SELF_NUMBERED \
                and not EXTERNAL.search(line):
            problems.append(f"line {number}: a bare section number names no document (link "
                            f"the section instead): {line.strip()[:100]}")
        for match in DOC_REF.finditer(line):
            name, anchor = match.group(1), match.group(2)
            if "://" in line[max(0, match.start() - 60):match.start()]:
                continue  # a URL of another site
            target = resolve(path, name)
            if target is None:
                if name.upper() != name or "/" in name:  # SPEC.md-style external names too
                    problems.append(f"line {number}: {name} does not exist")
                continue
            if anchor and anchor[1:] not in anchors(target):
                problems.append(f"line {number}: {name}{anchor}: no such section")
    assert not problems, "\n".join(problems)


def test_slug_matches_github() -> None:
    assert slug("Approval (opt-in)") == "approval-opt-in"
    assert slug("Verdicts on an event that left the document") == \
        "verdicts-on-an-event-that-left-the-document"
