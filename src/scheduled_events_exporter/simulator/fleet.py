"""Many simulated VMs in one process: a fleet for load tests (``bench/fleet.py``).

Each VM is a full :class:`~.service.Simulator` (its own loopback port, name, vmId, events and
request log), so an exporter pointed at one sees exactly one VM's IMDS. One selector thread
accepts for all of them (a thread per simulator would wake 20 times a second each); each
keep-alive connection then gets its own handler thread, as with a single simulator.
"""

from __future__ import annotations

import selectors
import threading
from collections.abc import Mapping, Sequence
from types import TracebackType

from scheduled_events_exporter.simulator.server import Server
from scheduled_events_exporter.simulator.service import Simulator

__all__ = ["Fleet"]


class Fleet:
    """``count`` simulators named ``<prefix><index>`` served by one accept thread."""

    def __init__(self, count: int, *, prefix: str = "vm-fleet-",
                 instance: Mapping[str, str] | None = None) -> None:
        if count < 1:
            raise ValueError(f"count: expected at least 1 VM, got {count}")
        self.vms: list[Simulator] = [Simulator(vm_name=f"{prefix}{i:05d}", instance=instance)
                                     for i in range(count)]
        self._selector = selectors.DefaultSelector()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind every VM's port and start accepting."""
        for vm in self.vms:
            server = vm.start(serve=False)
            self._selector.register(server, selectors.EVENT_READ, server)
        self._thread = threading.Thread(target=self._serve, name="imds-fleet", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._selector.select(timeout=0.1):
                server: Server = key.data
                server.handle_request()  # accept and hand the connection to its own thread

    def stop(self) -> None:
        """Stop accepting, then stop every VM (dropping open keep-alive connections)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        for vm in self.vms:
            vm.stop()
        self._selector.close()

    def set_events(self, events_per_vm: Sequence[Sequence[Mapping[str, object]]]) -> None:
        """Give VM ``i`` the events ``events_per_vm[i]`` (as close together as one loop)."""
        for vm, events in zip(self.vms, events_per_vm, strict=True):
            vm.set_events(events)

    def __enter__(self) -> Fleet:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
