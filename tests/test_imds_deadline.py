"""A whole IMDS request, body included, ends within its timeout: a body trickled a byte at a
time cannot hold the poll loop (the read timeout alone applies per socket read)."""

from __future__ import annotations

import socket
import threading
import time

from scheduled_events_exporter.imds import ImdsClient
from scheduled_events_exporter.model import Outcome


def trickling_server(stop: threading.Event) -> int:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: 1000\r\n\r\n{")
                for _ in range(400):  # bounded: at most 400 bytes, one every 0.25 s
                    if stop.wait(0.25):
                        break
                    try:
                        conn.sendall(b" ")
                    except OSError:
                        break
        listener.close()

    threading.Thread(target=serve, daemon=True).start()
    return int(listener.getsockname()[1])


def test_a_trickled_body_is_cut_at_the_request_timeout() -> None:
    stop = threading.Event()
    port = trickling_server(stop)
    try:
        client = ImdsClient(f"http://127.0.0.1:{port}", first_timeout=2.0, timeout=2.0,
                            clock=time.monotonic)
        began = time.monotonic()
        result = client.fetch_events()
        took = time.monotonic() - began
        assert result.outcome is Outcome.TIMEOUT, result
        assert took < 4.0, f"the request held the poll {took:.1f} s"
        assert "no complete answer" in (result.error or "")
    finally:
        stop.set()
