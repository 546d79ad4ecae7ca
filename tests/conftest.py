"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from scheduled_events_exporter.simulator import Simulator


@pytest.fixture
def sim() -> Iterator[Simulator]:
    """A simulated IMDS on loopback for a VM named ``vm-test``."""
    with Simulator(vm_name="vm-test") as simulator:
        yield simulator
