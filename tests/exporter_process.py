"""Run the real exporter as a subprocess for integration tests, and read what it prints."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any


def free_port() -> int:
    """A port nobody listens on right now (loopback)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def clean_env(**values: str) -> dict[str, str]:
    """The test process environment without inherited SEE_*/OTEL_* settings, plus ``values``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SEE_", "OTEL_"))}
    env.update(values)
    return env


class ExporterProcess:
    """``scheduled-events-exporter run`` in a subprocess; stdout lines and stderr collected."""

    def __init__(self, env: Mapping[str, str], *, args: tuple[str, ...] = ("run",),
                 command: Sequence[str] | None = None) -> None:
        """Run ``python -m scheduled_events_exporter *args``, or ``command`` when given (e.g.
        the exporter inside a sandbox)."""
        self.env = dict(env)
        self.stdout_lines: list[str] = []
        self.stderr_lines: list[str] = []
        self._cond = threading.Condition()
        self._closed_streams = 0
        self.proc = subprocess.Popen(
            list(command) if command else [sys.executable, "-m", "scheduled_events_exporter",
                                           *args],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for stream, sink in (
            (self.proc.stdout, self.stdout_lines),
            (self.proc.stderr, self.stderr_lines),
        ):
            threading.Thread(target=self._pump, args=(stream, sink), daemon=True).start()

    def _pump(self, stream: Any, sink: list[str]) -> None:
        for line in stream:
            with self._cond:
                sink.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._closed_streams += 1
            self._cond.notify_all()

    def wait_for_output_end(self, timeout: float) -> None:
        """Wait until the process closed stdout and stderr and both were read to the end."""
        self.wait_for(lambda: self._closed_streams == 2, timeout, "end of output")

    def wait_for(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        """Wait until ``predicate()`` holds (re-checked on every line printed, and every 0.1 s)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"timed out after {timeout} s waiting for {what}; stderr tail:\n"
                        + "\n".join(self.stderr_lines[-15:])
                    )
                self._cond.wait(min(remaining, 0.1))

    def wait_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Like :meth:`wait_for` but returns False instead of raising at the deadline."""
        try:
            self.wait_for(predicate, timeout, "condition")
        except AssertionError:
            return False
        return True

    def records(self) -> list[dict[str, Any]]:
        """The console sink's JSON objects so far."""
        with self._cond:
            lines = list(self.stdout_lines)
        return [json.loads(line) for line in lines if line.startswith("{")]

    def wait_for_records(self, count: int, timeout: float) -> list[dict[str, Any]]:
        """Wait for at least ``count`` console records."""
        self.wait_for(lambda: len(self.records()) >= count, timeout, f"{count} console records")
        return self.records()

    def stderr(self) -> str:
        with self._cond:
            return "\n".join(self.stderr_lines)

    def terminate(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
            raise AssertionError(f"exporter did not exit within {timeout} s of SIGTERM; its "
                                 f"stderr ends: {self.stderr()[-2000:]}") from None

    def kill(self) -> None:
        """SIGKILL (a crash)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)

    def __enter__(self) -> ExporterProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def wait_until(condition: Callable[[], bool], timeout: float, what: str,
               interval: float = 0.02) -> None:
    """Re-check ``condition`` until it holds; fail naming ``what`` after ``timeout`` seconds.

    For conditions nothing notifies about (another process's state); prefer a Condition or
    :meth:`ExporterProcess.wait_for` when something does.
    """
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def get_json(url: str, timeout: float = 2.0) -> tuple[int, dict[str, Any]]:
    """GET a JSON endpoint; returns (status, body) for 2xx and 5xx alike."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def answers(url: str, status: int | None = None) -> bool:
    """Whether a JSON endpoint answers at all (or with ``status``): False while nothing listens
    yet, for :func:`wait_until`."""
    try:
        got = get_json(url)[0]
    except OSError:
        return False
    return status is None or got == status


def state_dir(tmp_path: Path) -> str:
    path = tmp_path / "state"
    path.mkdir(exist_ok=True)
    return str(path)
