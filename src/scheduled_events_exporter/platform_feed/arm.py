"""An ARM id → where a scheduled event happened (pure).

The platform names an event by its ARM id under the resource it belongs to:
``/subscriptions/<s>/resourceGroups/<rg>/providers/Microsoft.Compute/<kind>/<name>/providers/
microsoft.maintenance/scheduledevents/<EventId>``, where ``<kind>`` is ``virtualMachines``,
``virtualMachineScaleSets`` or ``availabilitySets`` (letter case varies between samples: ARM
names compare case-insensitively). An older Microsoft sample names the VM by an idmapping
alias instead (``/providers/microsoft.idmapping/aliases/default/namespaces/microsoft.compute/
types/virtualmachines/identifiers/vmssidorvmid/values/<vmId>/...``): then only its id is known.
"""

from __future__ import annotations

from scheduled_events_exporter.model import ArmScope, InstanceInfo, PlatformChange

#: ARM's spelling of the Compute types a scheduled event belongs to, by their casefold.
KINDS = {k.casefold(): k for k in ("virtualMachines", "virtualMachineScaleSets",
                                   "availabilitySets")}
VM = "virtualMachines"
SCALE_SET = "virtualMachineScaleSets"
#: Longest ARM id kept; real ones are a few hundred characters.
MAX_ID = 1024
#: Longest VmName (the instance names of Resources, comma-separated) a record carries.
MAX_NAMES = 4096


def scope_of(resource_id: str) -> ArmScope:
    """What ``resource_id`` says; an id it cannot read gives an empty scope (the record then
    carries what the event itself says: its Resources)."""
    if not resource_id or len(resource_id) > MAX_ID:
        return ArmScope()
    parts = resource_id.strip("/").split("/")
    folded = [p.casefold() for p in parts]

    def after(name: str, start: int = 0) -> int | None:
        for index in range(start, len(folded) - 1):
            if folded[index] == name:
                return index + 1
        return None

    subscription = after("subscriptions")
    group = after("resourcegroups")
    values = after("values")
    vm_id = (parts[values] if values is not None
             and any(p.endswith("idmapping") for p in folded[:values]) else "")
    kind = name = scope_id = ""
    providers = after("providers")
    if providers is not None and folded[providers] == "microsoft.compute" \
            and providers + 2 < len(parts):
        kind = KINDS.get(folded[providers + 1], parts[providers + 1])
        name = parts[providers + 2]
        scope_id = "/" + "/".join(parts[:providers + 3])
    return ArmScope(
        kind=kind,
        resource_id=scope_id,
        subscription_id=parts[subscription] if subscription is not None else "",
        resource_group=parts[group] if group is not None else "",
        name=name,
        vm_id=vm_id,
    )


def instance_for(change: PlatformChange) -> InstanceInfo:
    """The VM identity a platform record carries: subscription, resource group and ResourceId
    of the scope, region, the scale set's name for a scale set, and as VmName the instance
    names in Resources (comma-separated, as listed), or the VM's name when Resources is
    empty."""
    scope = change.scope
    names = ",".join(change.event.resources)[:MAX_NAMES]
    if not names and scope.kind == VM:
        names = scope.name
    return InstanceInfo(
        vm_name=names,
        vm_id=scope.vm_id,
        resource_id=scope.resource_id,
        subscription_id=scope.subscription_id,
        resource_group=scope.resource_group,
        region=change.region,
        scale_set_name=scope.name if scope.kind == SCALE_SET else "",
    )
