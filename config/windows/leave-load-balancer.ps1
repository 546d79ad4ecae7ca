# Approval hook (SEE_APPROVE_HOOK) for a Windows VM behind an Azure Load Balancer: leave the
# backend pool before the exporter approves the maintenance, so no request is lost to it.
#
# The exporter runs this with Windows PowerShell and waits for it (SEE_APPROVE_HOOK_TIMEOUT):
# exit 0 lets it approve the event; any other exit code, or the timeout, refuses the approval and
# the event starts at its NotBefore as usual. The event arrives as JSON on stdin (the fields of
# the IMDS document) and as SEE_EVENT_* environment variables.
#
#   SEE_APPROVE_HOOK = & 'C:\Program Files\scheduled-events-exporter\hooks\leave-load-balancer.ps1'
#
# The load balancer's health probe asks this VM for $ProbeFile (an HTTP probe on IIS here); once
# it is gone, the probe fails and the load balancer stops sending new connections after
# interval x unhealthy threshold seconds. Put the file back at start-up (a scheduled task "At
# startup") so the VM rejoins after the reboot.
param(
    [string]$ProbeFile = "C:\inetpub\wwwroot\health.html",
    [int]$ProbeSeconds = 15
)
$ErrorActionPreference = "Stop"

$scheduledEvent = [Console]::In.ReadToEnd() | ConvertFrom-Json
Write-Output ("{0} {1} for {2}, not before {3}" -f $scheduledEvent.EventType,
    $scheduledEvent.EventId, ($scheduledEvent.Resources -join ","), $scheduledEvent.NotBefore)

# A freeze of a few seconds is no reason to leave: connections survive it.
if ($scheduledEvent.EventType -eq "Freeze" -and $scheduledEvent.DurationInSeconds -ge 0 -and
        $scheduledEvent.DurationInSeconds -lt 9) {
    exit 0
}

if (Test-Path $ProbeFile) {
    Move-Item -Path $ProbeFile -Destination "$ProbeFile.maintenance" -Force
}
# Let the probe notice, and the connections in flight finish.
Start-Sleep -Seconds $ProbeSeconds
Write-Output "out of the load balancer ($env:COMPUTERNAME)"
exit 0
