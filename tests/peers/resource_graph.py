"""A loopback stand-in for Resource Graph's ``POST /providers/Microsoft.ResourceGraph/resources``:
it serves rows in pages of the documented response format (``totalRecords``, ``count``,
``resultTruncated``, ``facets``, ``$skipToken``, ``data``: Azure/azure-rest-api-specs,
Microsoft.ResourceGraph 2024-04-01, ``ResourcesFirstPageQuery``/``ResourcesNextPageQuery``),
honours the request's ``$top`` and ``$skipToken``, and answers what a test scripts first (a 429
with ``Retry-After``, a 500) before each page. Every request is kept."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: (status, headers) to answer instead of a page; ``None``: serve the page.
Script = Callable[[int], tuple[int, dict[str, str]] | None]


class ResourceGraphStandIn:
    """Serves ``rows`` page by page; ``script(n)`` may refuse the n-th request (1-based)."""

    def __init__(self, rows: list[dict[str, Any]], page_rows: int = 1000,
                 script: Script | None = None,
                 quota: dict[str, str] | None = None) -> None:
        """``quota``: the throttling headers every page carries (default: quota left)."""
        self.rows = rows
        self.page_rows = page_rows
        self.script: Script = script or (lambda n: None)
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            disable_nagle_algorithm = True

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                with outer._lock:
                    outer.requests.append({"path": self.path, **body})
                    outer.headers.append(dict(self.headers))
                    number = len(outer.requests)
                refusal = outer.script(number)
                if refusal is not None:
                    status, headers = refusal
                    self._send(status, {"error": {"code": "Throttled" if status == 429
                                                  else "InternalError"}}, headers)
                    return
                options = body.get("options", {})
                top = min(int(options.get("$top", 1000)), outer.page_rows)
                start = int(options.get("$skipToken") or 0)
                page = outer.rows[start:start + top]
                answer: dict[str, Any] = {
                    "totalRecords": len(outer.rows), "count": len(page),
                    "resultTruncated": "false", "facets": [], "data": page}
                if start + top < len(outer.rows):
                    answer["$skipToken"] = str(start + top)
                self._send(200, answer, quota or {"x-ms-user-quota-remaining": "14"})

            def _send(self, status: int, body: object, headers: dict[str, str]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> ResourceGraphStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
