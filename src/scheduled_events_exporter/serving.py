"""Limits shared by the exporter's two small HTTP servers (health probes, Prometheus scrape).

A scanner or a slowloris client must not cost the exporter a thread and a file descriptor per
socket for ever: at most :data:`MAX_CONNECTIONS` are served at once (beyond that a connection is
closed at once), and a connection idle for :data:`IDLE_TIMEOUT` seconds is dropped.
"""

from __future__ import annotations

import socketserver
import threading
from typing import Any, Final

IDLE_TIMEOUT: Final = 5.0
MAX_CONNECTIONS: Final = 32


class ConnectionCap(socketserver.ThreadingMixIn):
    """Mix in before the server class: bounded concurrent connections, daemon threads."""

    daemon_threads = True
    _slots: threading.BoundedSemaphore | None = None

    def process_request(self, request: Any, client_address: Any) -> None:
        if self._slots is None:
            self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # type: ignore[attr-defined]
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            assert self._slots is not None
            self._slots.release()
