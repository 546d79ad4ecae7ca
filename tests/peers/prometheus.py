"""Test peer: a real Prometheus server (Debian package ``prometheus``, ``/usr/bin/prometheus``) on
a free loopback port with a temporary TSDB, scraping given targets every second and evaluating
given rule files; queried through its HTTP API."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.exporter_process import free_port


class PromQLError(AssertionError):
    """Prometheus refused or failed to evaluate an expression."""


def skip_unless_installed(binary: str) -> Any:
    """A pytest mark skipping when ``binary`` is missing locally; in CI (``CI`` set) the test runs
    and fails instead, so a green CI run never hides a skipped Prometheus check."""
    in_ci = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
    missing = shutil.which(binary) is None and not Path(f"/usr/bin/{binary}").exists()
    return pytest.mark.skipif(missing and not in_ci,
                              reason=f"{binary} missing: bash .ci/install-consumption-tools.sh")


def prometheus_binary() -> str | None:
    """The server binary, or None when the Debian package is not installed."""
    return shutil.which("prometheus") or (
        "/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None
    )


class PrometheusServer:
    """``prometheus`` with a 1 s scrape and evaluation interval; stop it with :meth:`stop`."""

    def __init__(self, targets: Sequence[str], *, job: str = "scheduled-events-exporter",
                 rule_files: Sequence[Path] = (), binary: str | None = None) -> None:
        binary = binary or prometheus_binary()
        if binary is None:
            raise RuntimeError("prometheus server not installed (Debian package `prometheus`)")
        self._tmp = tempfile.TemporaryDirectory(prefix="prom-peer-")
        tmp = Path(self._tmp.name)
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s",
                       "scrape_timeout": "1s"},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": list(targets)}]}
            ],
        }
        (tmp / "prometheus.yml").write_text(json.dumps(config), encoding="utf-8")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = (tmp / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={tmp / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}",
             "--storage.tsdb.retention.time=1h", "--log.level=warn"],
            stdout=self._log, stderr=subprocess.STDOUT,
        )
        try:
            self._wait_ready(30.0)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}: {self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"prometheus not ready after {timeout} s: {self.log()}")
            time.sleep(0.1)

    def log(self) -> str:
        """What the server printed so far (warnings and errors)."""
        self._log.flush()
        return (Path(self._tmp.name) / "prometheus.log").read_text(encoding="utf-8")[-3000:]

    def api(self, path: str, **params: str) -> Any:
        """GET ``/api/v1/<path>``; the ``data`` of a success, :class:`PromQLError` otherwise."""
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
        if body.get("status") != "success":
            raise PromQLError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Evaluate ``expr`` now; the vector's samples (a scalar comes back as one sample)."""
        data = self.api("query", query=expr)
        if data["resultType"] == "vector":
            return list(data["result"])
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        raise PromQLError(f"{expr}: unexpected result type {data['resultType']}")

    def values(self, expr: str) -> dict[tuple[tuple[str, str], ...], float]:
        """``expr``'s samples as {sorted label pairs: value}."""
        return {tuple(sorted(s["metric"].items())): float(s["value"][1]) for s in self.query(expr)}

    def wait_for(self, expr: str, predicate: Callable[[list[dict[str, Any]]], bool],
                 timeout: float, what: str) -> list[dict[str, Any]]:
        """Re-evaluate ``expr`` until ``predicate(result)`` holds; fail naming ``what``."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if predicate(result):
                return result
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout} s waiting for {what}; {expr} = {result}; "
                    f"targets: {self.api('targets')['activeTargets']}"
                )
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop the server and remove its TSDB."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self._log.close()
        self._tmp.cleanup()

    def __enter__(self) -> PrometheusServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
