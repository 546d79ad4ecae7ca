"""Azurite, Microsoft's Storage emulator (npm ``azurite``, installed into .ci/azurite by
.ci/install-azurite.sh): a real Storage queue on a free loopback port, for the platform
command's tests with the real azure-storage-queue SDK.

Missing tools skip the tests locally and fail them in CI (``CI=true``), as the consumption
tools do: a green CI must never hide a skipped check.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.exporter_process import free_port

REPO = Path(__file__).resolve().parents[2]
AZURITE = REPO / ".ci" / "azurite" / "node_modules" / ".bin" / "azurite-queue"
#: The emulator's well-known development account (Microsoft's Azurite documentation publishes
#: it: it opens nothing but a local emulator).
ACCOUNT = "devstoreaccount1"
KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
       "KBHBeksoGMGw==")


def require_azurite() -> None:
    """Skip without Azurite locally; in CI its absence is a failure."""
    if AZURITE.exists():
        return
    message = f"Azurite not installed ({AZURITE} missing): run `bash .ci/install-azurite.sh`"
    if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        pytest.fail(message)
    pytest.skip(message)


class Azurite:
    """``azurite-queue`` on a free loopback port with its data under ``location``."""

    def __init__(self, location: Path) -> None:
        require_azurite()
        self.port = free_port()
        location.mkdir(parents=True, exist_ok=True)
        self._log = (location / "azurite.log").open("wb")
        self.proc = subprocess.Popen(
            [str(AZURITE), "--silent", "--location", str(location), "--queueHost", "127.0.0.1",
             "--queuePort", str(self.port), "--skipApiVersionCheck", "--loose"],
            stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise AssertionError(f"azurite-queue did not listen on {self.port}: "
                                         f"{(location / 'azurite.log').read_text()[-2000:]}"
                                         ) from None
                time.sleep(0.1)

    @property
    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
                f"QueueEndpoint=http://127.0.0.1:{self.port}/{ACCOUNT};")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self._log.close()
