"""How many examples a property test draws: its own number on the main interpreter, divided by
``SEE_HYPOTHESIS_SCALE`` where a run only needs to show the same code works (the other Pythons,
the dependency floors: .ci/other-pythons.sh and .ci/dependency-floors.sh set 5). The search for
a counterexample is the main run's job; theirs is to run every property at all."""

from __future__ import annotations

import os

SCALE = max(1, int(os.environ.get("SEE_HYPOTHESIS_SCALE", "1") or "1"))


def examples(count: int) -> int:
    """``count`` on the main run; a fraction of it (at least 10) where the scale says so."""
    return max(10, count // SCALE) if SCALE > 1 else count
