"""The ``platform`` command: the platform's own record of scheduled events, a second source
beside IMDS (docs/ARCHITECTURE.md).

Azure publishes every status change of every scheduled event of a VM, scale set or availability
set whose scheduled events policy says so, to Event Grid (system topic
``Microsoft.ResourceNotifications.MaintenanceResources``) and to Resource Graph
(``maintenanceresources``). This package reads the Event Grid events from the Storage queue an
event subscription delivers them to, and Resource Graph for what the queue missed, and carries
them through the same tracker, records and sinks as the sidecar's:

``queue`` (the Storage queue: receive, delete, backoff) → ``envelope`` (a message's body → the
changes it carries, or the reason it is refused; pure) → ``arm`` (an ARM id → the VM, scale set
or availability set; pure) → ``tracker.track_platform`` → records → state commit → sinks'
spools → the message deleted (``loop``); ``resource_graph`` pages the backfill; ``service``
assembles it.
"""
