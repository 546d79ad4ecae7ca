"""The fleet simulator: many VMs, each its own IMDS on its own port, served from one thread."""

from __future__ import annotations

import json
import urllib.request

import pytest

from scheduled_events_exporter.simulator.fleet import Fleet


def get(url: str) -> dict[str, object]:
    request = urllib.request.Request(url, headers={"Metadata": "true"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


def test_each_vm_is_its_own_imds() -> None:
    with Fleet(3, prefix="vm-t-") as fleet:
        urls = [vm.url for vm in fleet.vms]
        assert len(set(urls)) == 3
        ids = {get(f"{u}/metadata/instance?api-version=2021-02-01")["compute"]["vmId"]  # type: ignore[index]
               for u in urls}
        assert len(ids) == 3
        event = {"EventId": "E1", "EventStatus": "Scheduled", "EventType": "Freeze",
                 "ResourceType": "VirtualMachine", "Resources": ["vm-t-00001"], "NotBefore": "",
                 "Description": "", "EventSource": "Platform", "DurationInSeconds": 5}
        fleet.set_events([[], [event], []])
        docs = [get(f"{u}/metadata/scheduledevents?api-version=2020-07-01") for u in urls]
        assert [len(d["Events"]) for d in docs] == [0, 1, 0]  # type: ignore[arg-type]
        assert [vm.vm_name for vm in fleet.vms] == ["vm-t-00000", "vm-t-00001", "vm-t-00002"]
        assert all(vm.wait_for_requests(2, 1) for vm in fleet.vms)
    for url in urls:  # stopped: nobody answers any more
        try:
            get(f"{url}/metadata/scheduledevents?api-version=2020-07-01")
        except OSError:
            continue
        raise AssertionError(f"{url} still answers after stop()")


def test_an_empty_fleet_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1 VM"):
        Fleet(0)
