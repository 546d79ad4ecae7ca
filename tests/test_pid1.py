"""The init the exporter becomes when it is PID 1 (pure parts; tests/test_image.py runs it as
PID 1 of a real container): exit status, reaping until the exporter ends, forwarding signals."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from scheduled_events_exporter.pid1 import FORWARDED, exit_status, split_if_pid1, supervise


@pytest.fixture
def restore_handlers() -> Iterator[None]:
    saved = {signum: signal.getsignal(signum) for signum in FORWARDED}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def test_exit_status_is_the_code_or_128_plus_the_signal() -> None:
    assert exit_status(0) == 0
    assert exit_status(3 << 8) == 3
    assert exit_status(signal.SIGKILL) == 128 + signal.SIGKILL
    assert exit_status(signal.SIGTERM) == 128 + signal.SIGTERM


def test_orphans_are_reaped_until_the_exporter_ends(restore_handlers: None) -> None:
    ends = iter([(101, 0), (102, signal.SIGKILL), (7, 2 << 8), (103, 0)])
    waited: list[int] = []

    def waitpid(pid: int, options: int) -> tuple[int, int]:
        assert (pid, options) == (-1, 0)  # any child, blocking: orphans included
        end = next(ends)
        waited.append(end[0])
        return end

    assert supervise(7, waitpid=waitpid, kill=lambda *_: None) == 2
    assert waited == [101, 102, 7], "it returns as soon as the exporter ended"


def test_stop_signals_are_forwarded_to_the_exporter(restore_handlers: None) -> None:
    sent: list[tuple[int, int]] = []
    calls = iter(range(3))

    def waitpid(_pid: int, _options: int) -> tuple[int, int]:
        if next(calls) == 0:
            signal.raise_signal(signal.SIGTERM)  # podman stop / the kubelet
            signal.raise_signal(signal.SIGINT)
            return 55, 0
        return 9, 0

    def kill(pid: int, signum: int) -> None:
        sent.append((pid, signum))
        if signum == signal.SIGINT:
            raise ProcessLookupError  # it ended meanwhile: not an error

    assert supervise(9, waitpid=waitpid, kill=kill) == 0
    assert sent == [(9, signal.SIGTERM), (9, signal.SIGINT)]


def test_no_children_left_is_a_failure_not_a_hang(restore_handlers: None) -> None:
    def waitpid(_pid: int, _options: int) -> tuple[int, int]:
        raise ChildProcessError

    assert supervise(9, waitpid=waitpid, kill=lambda *_: None) == 1


def test_a_process_that_is_not_pid_1_does_not_fork() -> None:
    before = os.getpid()
    split_if_pid1(getpid=lambda: 4242)
    assert os.getpid() == before
