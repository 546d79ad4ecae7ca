"""Secrets out of everything the exporter prints: check-config, configuration errors, logs.

Two layers. By name: a variable known or named to hold a secret (``*_HEADERS``, ``*_KEY``,
``*SECRET*``, ``*PASSWORD*``, ``*TOKEN*``, connection strings) is never shown at all. By shape:
any other value is shown with what looks like a credential inside it replaced: the userinfo of a
URL (``https://user:pass@host``), an ``Authorization``-style bearer or basic token, and
``key=value`` pairs whose key names a secret (``password=``, ``sig=``, ``SharedAccessKey=``...).
"""

from __future__ import annotations

import re
from typing import Final

REDACTED: Final = "<redacted>"

_SECRET_NAME = re.compile(r"(_HEADERS|_KEY|SECRET|PASSWORD|PASSWD|TOKEN|CONNECTION_STRING|"
                          r"CREDENTIAL)", re.IGNORECASE)
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]*@")
_SCHEME_TOKEN = re.compile(r"\b(?P<kind>Bearer|Basic|Token|SharedAccessSignature)\s+[^\s'\";,]+",
                           re.IGNORECASE)
_SECRET_PAIR = re.compile(
    r"(?P<key>[\w.-]{0,64}?(?:password|passwd|pwd|secret|token|apikey|api[_-]key|access[_-]?key|"
    r"sharedaccesskey|signature|sig|authorization|auth|credential)[\w.-]{0,64})"
    r"(?P<sep>\s*[=:]\s*)(?P<value>[^\s&;,'\"]+)", re.IGNORECASE)


def is_secret_name(name: str) -> bool:
    """Whether a variable of this name is never shown."""
    return bool(_SECRET_NAME.search(name))


#: Longer values are cut before scrubbing (nothing prints more; the patterns stay linear).
MAX_SCRUBBED = 4096


def scrub(text: str) -> str:
    """``text`` with every credential-shaped part replaced by :data:`REDACTED` (cut to
    :data:`MAX_SCRUBBED` characters first)."""
    text = text[:MAX_SCRUBBED]
    text = _USERINFO.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
    text = _SCHEME_TOKEN.sub(lambda m: f"{m.group('kind')} {REDACTED}", text)
    return _SECRET_PAIR.sub(lambda m: f"{m.group('key')}{m.group('sep')}{REDACTED}", text)


def shown(name: str, value: str) -> str:
    """How the value of variable ``name`` may be printed."""
    return REDACTED if is_secret_name(name) else scrub(value)
