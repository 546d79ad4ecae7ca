"""What differs between Linux (POSIX) and Windows, each behind one small interface.

Every OS-specific behaviour of the exporter lives in one module here, with a POSIX and a Windows
implementation, chosen once at import (``sys.platform``); the rest of the code calls the chosen
one and never looks at the OS itself (docs/ARCHITECTURE.md, "Platform seams"):

- :mod:`.files`: durable, safe writes under the state directory (no following a planted link,
  owner-only access, directory sync);
- :mod:`.shell`: the approval hook's command line, its environment and its process tree;
- :mod:`.dir_lock`: one exporter per state directory (``flock``; a Windows byte-range lock);
- :mod:`.stop`: which OS requests mean "stop now" (signals; Windows console events);
- :mod:`.win32`: the Windows API through ctypes, imported only on Windows (also the tick count
  that :mod:`scheduled_events_exporter.boot` turns into the Windows boot instant).

The Windows logic is plain Python with the OS calls injected, so it is unit-tested on Linux
(tests whose names contain ``windows``); only :mod:`.win32`'s bindings need Windows to run.
"""

from __future__ import annotations

import sys
from typing import Final

#: Decided once; every seam selects its implementation from it.
WINDOWS: Final = sys.platform == "win32"
