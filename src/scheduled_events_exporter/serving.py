"""Limits shared by the exporter's two small HTTP servers (health probes, Prometheus scrape).

A scanner or a slowloris client must not cost the exporter a thread and a file descriptor per
socket for ever: at most :data:`MAX_CONNECTIONS` are served at once (beyond that a connection is
closed at once), and a connection idle for :data:`IDLE_TIMEOUT` seconds is dropped.

An idle server costs nothing: ``socketserver``'s ``serve_forever`` wakes every ``poll_interval``
(0.5 s) to look for a shutdown request, 120 wake-ups a minute per server, a tenth of the
whole exporter's idle CPU. :meth:`ConnectionCap.serve` instead sleeps until a connection or
:meth:`ConnectionCap.stop_serving` (which writes to a socket pair the loop also watches).
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import socketserver
import threading
from typing import Any, Final

IDLE_TIMEOUT: Final = 5.0
MAX_CONNECTIONS: Final = 32


class ConnectionCap(socketserver.ThreadingMixIn):
    """Mix in before the server class: bounded concurrent connections, daemon threads."""

    daemon_threads = True
    #: What ``handle_request`` waits for a connection: nothing, ``serve`` already saw one.
    timeout: float | None = 0
    _slots: threading.BoundedSemaphore | None = None
    _wake: tuple[socket.socket, socket.socket] | None = None
    _stopping = False
    _stopped: threading.Event | None = None

    def serve(self) -> None:
        """Serve until :meth:`stop_serving`, with no periodic wake-up while idle."""
        self._wake = self._wake or socket.socketpair()
        self._stopped = self._stopped or threading.Event()
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(self, selectors.EVENT_READ)  # type: ignore[arg-type]
                selector.register(self._wake[0], selectors.EVENT_READ)
                while not self._stopping:
                    for key, _ in selector.select():
                        if key.fd != self._wake[0].fileno() and not self._stopping:
                            # The public one-request call; with ``timeout`` 0 it never waits
                            # (the socket is readable, or the connection went away meanwhile).
                            self.handle_request()  # type: ignore[attr-defined]
        finally:
            self._stopped.set()

    def stop_serving(self, timeout: float = 5.0) -> None:
        """Make :meth:`serve` return (wait up to ``timeout`` s for it), then close the pair."""
        self._stopping = True
        wake = self._wake
        if wake is None:
            return
        with contextlib.suppress(OSError):
            wake[1].send(b"\0")
        if self._stopped is not None:
            self._stopped.wait(timeout)
        for end in wake:
            end.close()

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
