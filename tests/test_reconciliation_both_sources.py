"""One fleet's events through both observers, then the reconciliation on what they wrote.

The sidecar (``scheduled-events-exporter run``) watches the IMDS simulator; the fleet process
(``scheduled-events-exporter platform``) reads the platform's own record of the same events
from a real Storage queue (Azurite). Both print their records with the console sink, as the
Event Hubs sink would send them to ``AzureScheduledEvents_CL``. The agreement query's logic
(tests/consumption/reconciliation.py, the same table every pack's ``verdict-agreement.kql``
carries) then runs over the union:

* a Freeze the VM saw Scheduled, Started and gone (``completed`` on an observed start) that the
  platform recorded Completed: agree;
* a Reboot the VM saw Scheduled and gone before its NotBefore, with consecutive documents
  (``cancelled``) that the platform recorded Canceled: agree;
* a Redeploy that left IMDS while the sidecar missed documents (``outcome_unknown``) that the
  platform recorded Completed: expected, not a bug;
* a Reboot of another VM of the subscription, which has no exporter: ``uncovered-vms``.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from azure.storage.queue import QueueClient

from scheduled_events_exporter.simulator import Simulator
from tests.consumption import reconciliation as rc
from tests.exporter_process import ExporterProcess, clean_env, state_dir
from tests.peers.azurite import Azurite
from tests.test_platform_queue import SUBSCRIPTION as PLATFORM_SUBSCRIPTION
from tests.test_platform_queue import empty, event_grid, send

#: The simulator's instance metadata: the subscription and the VM the sidecar runs on.
SUBSCRIPTION = "00000000-0000-4000-8000-000000000000"
RESOURCE_GROUP = "rg-sim"
VM = "vm-test"
FAR = "Mon, 11 Apr 2099 22:26:58 GMT"


def imds_event(event_id: str, status: str, event_type: str) -> dict[str, Any]:
    return {"EventId": event_id, "EventStatus": status, "EventType": event_type,
            "ResourceType": "VirtualMachine", "Resources": [VM],
            "NotBefore": FAR if status == "Scheduled" else "", "Description": "",
            "EventSource": "Platform", "DurationInSeconds": 5 if event_type == "Freeze" else -1}


def platform_event(event_id: str, status: str, event_type: str, vm: str = VM,
                   minutes: float = 0) -> dict[str, Any]:
    """The platform's record of it, under the simulator's subscription and resource group, so
    that the two observers' VMs are the same VMs."""
    event = event_grid(event_id, status, event_type, vm=vm, minutes=minutes)
    text = (json.dumps(event).replace(PLATFORM_SUBSCRIPTION, SUBSCRIPTION)
            .replace("/resourceGroups/rg/", f"/resourceGroups/{RESOURCE_GROUP}/"))
    return dict(json.loads(text))


@pytest.mark.timeout(240)
def test_both_observers_records_reconcile(sim: Simulator, azurite: Azurite,
                                          tmp_path: Any) -> None:
    freeze, reboot, redeploy, elsewhere = (str(uuid.uuid4()) for _ in range(4))
    (tmp_path / "vm").mkdir()
    sidecar_env = clean_env(SEE_IMDS_ENDPOINT=sim.url, SEE_SINKS="console",
                            SEE_STATE_DIR=state_dir(tmp_path / "vm"), SEE_HEALTH_ADDR="",
                            SEE_POLL_INTERVAL="0.3")
    with ExporterProcess(sidecar_env) as sidecar:
        sim.set_events([imds_event(freeze, "Scheduled", "Freeze")])
        sidecar.wait_for_records(1, 30)
        sim.set_events([imds_event(freeze, "Started", "Freeze")])
        sidecar.wait_for_records(2, 30)
        sim.set_events([])
        sidecar.wait_for_records(3, 30)
        sim.set_events([imds_event(reboot, "Scheduled", "Reboot")])
        sidecar.wait_for_records(4, 30)
        sim.set_events([])
        sidecar.wait_for_records(5, 30)
        incarnation = sim.set_events([imds_event(redeploy, "Scheduled", "Redeploy")])
        sidecar.wait_for_records(6, 30)
        # The sidecar misses documents: the incarnation jumps, the event is gone.
        sim.set_events([], incarnation=incarnation + 3)
        sidecar.wait_for_records(7, 30)
        assert sidecar.terminate() == 0
    imds_records = sidecar.records()
    endings = {(r["EventId"], r["Transition"], r["OutcomeBasis"]) for r in imds_records
               if r["Transition"] in rc.SIDECAR_ENDINGS}
    assert endings == {(freeze, "completed", "observed_start"),
                       (reboot, "cancelled", "consecutive_absence"),
                       (redeploy, "outcome_unknown", "missed_documents")}, endings

    queue = QueueClient.from_connection_string(azurite.connection_string,
                                               f"q{uuid.uuid4().hex[:16]}")
    queue.create_queue()
    send(queue,
         platform_event(freeze, "Scheduled", "Freeze"),
         platform_event(freeze.upper(), "Started", "Freeze", minutes=15),
         platform_event(freeze, "Completed", "Freeze", minutes=16),
         platform_event(reboot, "Scheduled", "Reboot"),
         platform_event(reboot, "Canceled", "Reboot", minutes=2),
         platform_event(redeploy, "Scheduled", "Redeploy"),
         platform_event(redeploy, "Completed", "Redeploy", minutes=20),
         platform_event(elsewhere, "Scheduled", "Reboot", vm="db-vm-7"))
    platform_env = clean_env(SEE_STATE_DIR=str(tmp_path / "fleet"), SEE_HEALTH_ADDR="",
                             SEE_SINKS="console", SEE_SHUTDOWN_TIMEOUT="5",
                             SEE_PLATFORM_QUEUE_CONNECTION_STRING=azurite.connection_string,
                             SEE_PLATFORM_QUEUE_NAME=queue.queue_name,
                             SEE_PLATFORM_POLL_INTERVAL="0.2",
                             SEE_PLATFORM_VISIBILITY_TIMEOUT="2")
    with ExporterProcess(platform_env, args=("platform",)) as fleet:
        fleet.wait_for_records(8, 60)
        fleet.wait_for(lambda: empty(queue), 30, "the queue emptied")
        assert fleet.terminate() == 0
    queue.close()
    platform_records = fleet.records()
    assert {r["Observer"] for r in platform_records} == {"platform"}
    assert {r["Observer"] for r in imds_records} == {"imds"}

    both = [*imds_records, *platform_records]
    rows = {v.event_key: v for v in rc.verdicts(both) if v.sidecar_ending}
    assert {(k, v.verdict_class, v.platform_final) for k, v in rows.items()} == {
        (freeze, rc.AGREE, "Completed"), (reboot, rc.AGREE, "Canceled"),
        (redeploy, rc.EXPECTED, "Completed")}
    figures = rc.agreement(rc.verdicts(both))
    overall = figures[(SUBSCRIPTION.lower(), rc.ALL_TYPES)]
    assert overall.counts[rc.AGREE] == 2 and overall.counts[rc.EXPECTED] == 1
    assert overall.counts[rc.BUG] == 0
    uncovered = rc.uncovered_vms(both)
    assert [(u.subscription_id, u.resource_group, u.vm_name) for u in uncovered] == [
        (SUBSCRIPTION, RESOURCE_GROUP, "db-vm-7")]
