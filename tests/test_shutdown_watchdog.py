"""A shutdown that cannot finish still ends, within ``SEE_SHUTDOWN_TIMEOUT`` plus a grace.

Every step of the drain has a deadline of its own; the watchdog bounds what none of them covers
(a library call that never returns, a thread that keeps the interpreter from exiting). The real
CLI runs with a ``sitecustomize`` that starts a non-daemon thread which never ends, so the
interpreter cannot exit after a clean drain: without the watchdog the process would hang after
SIGTERM forever.
"""

from __future__ import annotations

import threading
from pathlib import Path

from scheduled_events_exporter.app import EXIT_STUCK, SHUTDOWN_GRACE, exit_if_stuck
from scheduled_events_exporter.simulator import Simulator
from tests.exporter_process import ExporterProcess, clean_env, state_dir

NEVER_ENDS = '''
import threading
threading.Thread(target=threading.Event().wait, name="never-ends", daemon=False).start()
'''


def test_watchdog_ends_the_process_with_its_exit_code() -> None:
    ended = threading.Event()
    codes: list[int] = []

    def end(code: int) -> None:
        codes.append(code)
        ended.set()

    timer = exit_if_stuck(0.05, end=end)
    assert timer.daemon  # a clean exit never waits for it
    assert ended.wait(10)
    assert codes == [EXIT_STUCK]


def test_a_stuck_exit_ends_after_the_timeout_and_the_grace(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NEVER_ENDS)
    with Simulator() as sim:
        env = clean_env(PYTHONPATH=str(site), SEE_IMDS_ENDPOINT=sim.url, SEE_SINKS="console",
                        SEE_POLL_INTERVAL="1", SEE_HEALTH_ADDR="", SEE_SHUTDOWN_TIMEOUT="1",
                        SEE_STATE_DIR=state_dir(tmp_path))
        with ExporterProcess(env) as proc:
            assert sim.wait_for_requests(1, 30, method="GET")
            code = proc.terminate(timeout=1 + SHUTDOWN_GRACE + 20)
    assert code == EXIT_STUCK, proc.stderr()
    assert "shutdown did not finish within 6 s" in proc.stderr()
    assert "records not delivered stay in the spool" in proc.stderr()
    assert "stopped" in proc.stderr()  # the drain itself finished; only the exit was stuck
