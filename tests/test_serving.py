"""The small HTTP servers sleep while idle and still stop at once.

``socketserver.serve_forever`` wakes every 0.5 s to look for a shutdown request; on an idle
exporter those wake-ups were a tenth of its CPU. ``ConnectionCap.serve`` sleeps until a
connection or ``stop_serving``. Counted, not timed: the serving thread's voluntary context
switches over an idle second and a half (``/proc/self/task/<tid>/status``).
"""

from __future__ import annotations

import socket
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from scheduled_events_exporter.scrape import ScrapeEndpoint
from scheduled_events_exporter.serving import ConnectionCap


class _Server(ConnectionCap, ThreadingHTTPServer):
    pass


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "5")
        self.end_headers()
        self.wfile.write(b"hello")

    def log_message(self, format: str, *args: object) -> None:
        pass


def switches(native_id: int) -> int:
    with open(f"/proc/self/task/{native_id}/status") as handle:
        for line in handle:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches line")


def free(port: int) -> bool:
    """Nobody listens on ``port`` (SO_REUSEADDR: connections in TIME_WAIT do not count)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))
        probe.listen()
    return True


def get(port: int) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as response:
        return bytes(response.read())


@pytest.mark.skipif(sys.platform != "linux", reason="counts context switches in /proc")
def test_idle_server_does_not_wake_and_stops_at_once() -> None:
    server = _Server(("127.0.0.1", 0), _Hello)
    port = server.server_address[1]
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    assert get(port) == b"hello"
    assert thread.native_id is not None
    time.sleep(0.2)  # let the request's own wake-ups settle
    before = switches(thread.native_id)
    time.sleep(1.5)  # serve_forever(0.5) would wake three times here
    assert switches(thread.native_id) - before == 0
    assert get(port) == b"hello"  # still serving after the quiet spell
    started = time.monotonic()
    server.stop_serving()
    thread.join(5)
    assert not thread.is_alive()
    assert time.monotonic() - started < 5
    server.server_close()
    assert free(port)


def test_stop_before_serve_starts_makes_serve_return() -> None:
    server = _Server(("127.0.0.1", 0), _Hello)
    server.stop_serving()
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    thread.join(5)
    assert not thread.is_alive()
    server.server_close()


def test_scrape_endpoint_stops_and_frees_its_port() -> None:
    scrape = ScrapeEndpoint("127.0.0.1", 0)
    scrape.start(list)
    get_metrics(scrape.port)  # answers 200 (urlopen raises on anything else)
    scrape.stop()
    assert free(scrape.port)


def get_metrics(port: int) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return bytes(response.read())
