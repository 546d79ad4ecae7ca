"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings as hypothesis_settings

from scheduled_events_exporter.simulator import Simulator
from tests.budget import SCALE

if TYPE_CHECKING:
    from tests.peers.azurite import Azurite

if SCALE > 1:
    # Property tests without a number of their own draw fewer too (tests/budget.py).
    hypothesis_settings.register_profile("scaled", max_examples=max(10, 100 // SCALE))
    hypothesis_settings.load_profile("scaled")


@pytest.fixture
def sim() -> Iterator[Simulator]:
    """A simulated IMDS on loopback for a VM named ``vm-test``."""
    with Simulator(vm_name="vm-test") as simulator:
        yield simulator


@pytest.fixture(scope="module")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """Azurite, Microsoft's Storage emulator, on a free loopback port for the module."""
    from tests.peers.azurite import Azurite

    emulator = Azurite(tmp_path_factory.mktemp("azurite"))
    yield emulator
    emulator.stop()


# --- where the suite's time goes (CI's budget is 20 minutes on two cores) ------------------
_FILE_SECONDS: dict[str, float] = {}
#: Each file's first start and last stop (epoch seconds, from the reports).
_FILE_SPAN: dict[str, tuple[float, float]] = {}


#: The slowest files of the last runs, slowest first (the summary below prints them). With
#: ``--no-loadscope-reorder`` (.ci/run) xdist hands files to workers in collection order: the
#: longest started first leave no long one to start last, alone, while the other workers have
#: nothing left (the longest-first rule). Without it xdist puts the files with the most tests
#: first, and two files of a few long tests (outage, kill storm) ran last, one after the other,
#: the CPU mostly idle for their two and a half minutes.
SLOWEST_FIRST = (
    "test_image.py", "test_os_packages.py", "test_joints.py", "test_chart.py",
    "test_otlp_conformance.py", "test_vm_walkthrough.py", "test_outage.py", "test_process.py",
    "test_build_version.py", "test_eventhubs_sink.py", "test_cli.py", "test_kill_storm.py",
    "test_memory_bounds.py", "test_lock.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The known slow files first, each file's tests in their order (a stable sort)."""
    rank = {name: n for n, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Sum each file's setup, call and teardown times (reported by every xdist worker to the
    controller, so the sum covers the whole run)."""
    path = report.nodeid.split("::")[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration
    first, last = _FILE_SPAN.get(path, (report.start, report.stop))
    _FILE_SPAN[path] = (min(first, report.start), max(last, report.stop))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The ten slowest files: with ``--dist loadfile`` a file runs on one worker, so the
    slowest file is the floor of the run's wall time."""
    if not _FILE_SECONDS:
        return
    slowest = sorted(_FILE_SECONDS.items(), key=lambda item: -item[1])[:10]
    terminalreporter.write_line("slowest files (setup + call + teardown, seconds): " + ", ".join(
        f"{path.removeprefix('tests/')} {seconds:.0f}" for path, seconds in slowest))
    # The files that ended last, with when they started (seconds into pytest): a long file
    # that starts late is the tail a reordering of SLOWEST_FIRST can cut.
    begun = min(first for first, _ in _FILE_SPAN.values())
    last = sorted(_FILE_SPAN.items(), key=lambda item: -item[1][1])[:6]
    spans = ", ".join(
        f"{path.removeprefix('tests/')} {first - begun:.0f}-{stop - begun:.0f}"
        for path, (first, stop) in last)
    terminalreporter.write_line(f"files that ended last (start-end, seconds into pytest): {spans}")
