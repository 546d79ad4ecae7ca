"""The ``platform`` command's own settings (SEE_PLATFORM_*): their values and how each is read.

The rows of ``config.SETTINGS`` name these variables (so ``check-config``, ``--help`` and the
unknown-name warnings know them); what a valid value is lives here, beside the defaults.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

#: Resource Graph's endpoint (SEE_PLATFORM_RESOURCE_GRAPH_ENDPOINT changes it for a test's
#: local stand-in; a bearer token is only ever sent over https).
GRAPH_ENDPOINT = "https://management.azure.com"
BACKFILL_CHOICES = ("off", "start")
_GUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_QUEUE_NAME = re.compile(r"[a-z0-9](?:[a-z0-9]|-(?!-)){1,61}[a-z0-9]")
QUEUE_URL_EXPECTED = ("https://<account>.queue.core.windows.net/<queue> (the queue's URL, read "
                      "with DefaultAzureCredential; no SAS in it: use "
                      "SEE_PLATFORM_QUEUE_CONNECTION_STRING for a key or a SAS)")
QUEUE_NAME_EXPECTED = ("a queue name: 3-63 lower-case letters, digits and single hyphens, "
                       "starting and ending with a letter or digit")


@dataclass(frozen=True, slots=True)
class PlatformSettings:
    """Where the platform's record is read from, and how (each field's default is its
    variable's)."""

    queue_url: str = ""
    queue_connection_string: str = ""
    queue_name: str = ""
    #: Seconds between receives while the queue is empty (a full batch is followed at once).
    poll_interval: float = 5.0
    #: Seconds a received message stays invisible to other readers; a crash before its delete
    #: brings it back after this long.
    visibility_timeout: int = 120
    #: A message received more often than this is dead-lettered unread (a poison message).
    max_dequeue: int = 10
    #: ``start``: read Resource Graph once at every start, before the queue.
    backfill: str = "off"
    #: Subscriptions Resource Graph is asked about (none: every one the credential sees).
    subscriptions: tuple[str, ...] = ()
    graph_endpoint: str = GRAPH_ENDPOINT

    @property
    def configured(self) -> bool:
        """A queue is named, one way or the other."""
        return bool(self.queue_url or self.queue_connection_string or self.queue_name)


def queue_url(text: str) -> str:
    """``https://<host>/<queue>``: the account's queue endpoint and the queue's name, nothing
    else (a SAS in the query would be a secret in a setting that is not one)."""
    parts = urlsplit(text)
    segments = [s for s in parts.path.split("/") if s]
    if parts.scheme != "https" or not parts.hostname or parts.query or parts.fragment \
            or parts.username or len(segments) != 1 or not _QUEUE_NAME.fullmatch(segments[0]):
        raise ValueError(text)
    return text.rstrip("/")


def queue_name(text: str) -> str:
    """A Storage queue name (Azure's rules)."""
    if not _QUEUE_NAME.fullmatch(text):
        raise ValueError(text)
    return text


def subscriptions(text: str) -> tuple[str, ...]:
    """A comma list of subscription ids (GUIDs), each once."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items or len(set(i.lower() for i in items)) != len(items) \
            or not all(_GUID.fullmatch(i) for i in items):
        raise ValueError(text)
    return tuple(items)


def graph_endpoint(text: str) -> str:
    """An https:// URL with no path (or http:// to a loopback stand-in, for tests)."""
    parts = urlsplit(text)
    local = parts.hostname in ("127.0.0.1", "localhost", "::1")
    if not (parts.scheme == "https" or (parts.scheme == "http" and local)) \
            or not parts.hostname or parts.path not in ("", "/") or parts.query \
            or parts.fragment or parts.username:
        raise ValueError(text)
    return text.rstrip("/")
