"""The Scheduled Events API versions (docs/semantics.md#imds): which the exporter knows, what
each one's documents lack, and what IMDS says when it refuses the one we sent.

IMDS answers an ``api-version`` it does not serve with HTTP 400 and a JSON body that lists
the versions it does (``"newest-versions": [...]``), and it has refused versions it once
served. Pure functions: :mod:`.imds` classifies the answer, :mod:`.config` validates
``SEE_IMDS_API_VERSION``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import date
from typing import Final

#: The platform documentation's version table, oldest first, each with the document fields
#: that the versions before it lacked; the parser's defaults stand in for a missing field
#: (DurationInSeconds -1, EventSource and Description empty).
KNOWN: Final[Mapping[str, tuple[str, ...]]] = {
    "2017-08-01": ("Description", "EventSource", "DurationInSeconds"),  # Metadata header
    "2017-11-01": ("Description", "EventSource", "DurationInSeconds"),  # Preempt
    "2019-01-01": ("Description", "EventSource", "DurationInSeconds"),  # Terminate
    "2019-04-01": ("EventSource", "DurationInSeconds"),  # Description
    "2019-08-01": ("DurationInSeconds",),  # EventSource
    "2020-07-01": (),  # DurationInSeconds: the current version
}
DEFAULT: Final = "2020-07-01"
#: The oldest the exporter accepts: older ones were previews without the Metadata header.
OLDEST: Final = "2017-08-01"
_SHAPE: Final = re.compile(r"\d{4}-\d{2}-\d{2}")
#: IMDS lists a handful; anything past this is not a version list.
_MAX_OFFERED: Final = 50


def check(version: str) -> tuple[str, list[str]]:
    """Validate a configured version: (the version, warnings). Raises ``ValueError`` with the
    reason when it is not a date from :data:`OLDEST` on."""
    if not _SHAPE.fullmatch(version):
        raise ValueError(f"{version!r} is not a date")
    date.fromisoformat(version)  # raises for 2020-13-45
    if version < OLDEST:
        raise ValueError(f"{version} is older than {OLDEST}, the oldest this exporter reads")
    warnings: list[str] = []
    if version not in KNOWN:
        warnings.append(
            f"SEE_IMDS_API_VERSION={version} is not a version this exporter knows "
            f"({', '.join(KNOWN)}); its documents are read by the {DEFAULT} rules, fields "
            f"they do not have are ignored")
    elif KNOWN[version]:
        lacking = KNOWN[version]
        defaults = {"DurationInSeconds": "DurationInSeconds -1", "EventSource": "EventSource "
                    "empty", "Description": "Description empty"}
        cost = ("; without EventSource a user's automatically approved reboot cannot be told "
                "from a host failure (it looks unannounced)" if "EventSource" in lacking else "")
        warnings.append(
            f"SEE_IMDS_API_VERSION={version} documents lack {', '.join(lacking)}: records show "
            f"{', '.join(defaults[f] for f in lacking)}{cost}; prefer {DEFAULT} or newer when "
            f"IMDS offers it")
    return version, warnings


def offered(body: bytes) -> tuple[str, ...] | None:
    """The versions a 400 answer offers (``newest-versions``), or ``None`` when the body is
    not such an answer. Only well-formed version strings are kept (the body is IMDS's, or
    whatever answers in its place)."""
    try:
        data = json.loads(body[:65536].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    versions = data.get("newest-versions") if isinstance(data, dict) else None
    if not isinstance(versions, list):
        return None
    return tuple(v for v in versions[:_MAX_OFFERED] if isinstance(v, str) and _SHAPE.fullmatch(v))


def refusal(sent: str, offers: Sequence[str]) -> str:
    """One line: the version sent, the versions offered, what to do. The advice is the newest
    offered version from the current one on (later versions keep its fields), else the newest
    older one this exporter knows (saying what its documents lack)."""
    listed = ", ".join(offers) if offers else "none listed"
    current = sorted((v for v in offers if v >= DEFAULT), reverse=True)
    older = sorted((v for v in offers if v < DEFAULT and v in KNOWN), reverse=True)
    if current:
        newer = "" if current[0] in KNOWN else (
            f"; newer than this exporter knows, read by the {DEFAULT} rules")
        advice = f"set SEE_IMDS_API_VERSION={current[0]} (the newest offered{newer})"
    elif older:
        advice = (f"set SEE_IMDS_API_VERSION={older[0]} (the newest offered that this exporter "
                  f"knows; its documents lack {', '.join(KNOWN[older[0]])}) or upgrade the "
                  f"exporter")
    else:
        advice = "check SEE_IMDS_API_VERSION or upgrade the exporter"
    return (f"IMDS refuses api-version={sent} (HTTP 400) and offers: {listed}; {advice}. "
            f"No events are read until then")
