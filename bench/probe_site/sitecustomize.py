"""Loaded by every Python started with this directory on PYTHONPATH: installs bench/tail_probe."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tail_probe  # noqa: F401  (wraps the exporter's pipeline stages at import)
