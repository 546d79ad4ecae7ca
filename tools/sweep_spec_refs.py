"""Replace references to the external product specification ("SPEC §N") with the repository's
own documents. Run from the repository root: ``python tools/sweep_spec_refs.py``. Idempotent."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

TARGETS = {
    "1": "docs/semantics.md#what-it-is",
    "2": "docs/semantics.md#imds",
    "3": "docs/lifecycle.md",
    "4": "docs/semantics.md#records",
    "5": "docs/semantics.md#metrics",
    "6": "docs/semantics.md#reliability",
    "7": "docs/semantics.md#approval-opt-in",
    "8": "docs/semantics.md#sinks",
    "9": "docs/semantics.md#simulator",
    "10": "docs/semantics.md#platform-facts-the-dashboards-use",
}
REF = re.compile(r"SPEC ?§(\d+)((?:\s*(?:,|/|and)\s*§\d+)*)")


def _replace(match: re.Match[str]) -> str:
    numbers = [match.group(1), *re.findall(r"§(\d+)", match.group(2))]
    return ", ".join(TARGETS[n] for n in numbers)


def main() -> None:
    files = subprocess.run(["git", "ls-files", "src", "tests", "config", "docs", "README.md",
                            "BENCHMARKS.md", "bench"], capture_output=True, text=True,
                           check=True).stdout.split()
    for name in files:
        path = Path(name)
        if path.suffix not in {".py", ".md", ".kql", ".json", ".yaml", ".yml", ".service",
                               ".env", ".toml", ".txt"}:
            continue
        text = path.read_text(encoding="utf-8")
        new = REF.sub(_replace, text).replace("SPEC_INSTRUMENTS", "INSTRUMENTS")
        if new != text:
            path.write_text(new, encoding="utf-8")
            print(f"swept {name}")


if __name__ == "__main__":
    main()
