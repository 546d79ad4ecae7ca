"""The simulated IMDS's HTTP face: request checks, response shapes and the threaded server.

Pure protocol rules (what the real service answers to which request) live here as functions
over plain values, so :mod:`scheduled_events_exporter.simulator` only keeps state and threads.
Standard library only.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol
from urllib.parse import parse_qs, urlsplit

from scheduled_events_exporter.simulator.faults import Fault

SCHEDULED_EVENTS_PATH = "/metadata/scheduledevents"
INSTANCE_PATH = "/metadata/instance"
#: The documented Scheduled Events versions, oldest first (what IMDS served for years).
SCHEDULED_EVENTS_VERSIONS = ("2017-08-01", "2017-11-01", "2019-01-01", "2019-04-01", "2019-08-01",
                             "2020-07-01")
INSTANCE_VERSIONS = ("2017-08-01", "2017-12-01", "2018-10-01", "2019-06-01", "2019-08-15",
                     "2020-06-01", "2020-09-01", "2021-01-01", "2021-02-01", "2021-05-01",
                     "2021-12-13", "2023-07-01")
MAX_BODY = 64 * 1024
JSON_TYPE = "application/json; charset=utf-8"


@dataclass(frozen=True)
class RequestLogEntry:
    """One request the simulator answered (recorded just before the answer is written)."""

    monotonic: float
    wall: float
    method: str
    path: str
    query: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    status: int

    def header(self, name: str) -> str | None:
        """First value of header ``name`` (case-insensitive), or None."""
        return _header(self.headers, name)


@dataclass(frozen=True)
class Response:
    """An answer to write: ``content_type`` and ``Content-Length`` are added except on 304."""

    status: int
    body: bytes = b""
    content_type: str = JSON_TYPE
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Route:
    """A request that passed every IMDS check: which endpoint, at which api-version."""

    target: str  # "scheduledevents" or "instance", as Fault.target names them
    version: str


def _header(headers: Sequence[tuple[str, str]], name: str) -> str | None:
    return next((v for k, v in headers if k.lower() == name.lower()), None)


def error(status: int, message: str, **extra: object) -> Response:
    """A JSON error body in the service's ``{"error": ...}`` shape."""
    return Response(status, json.dumps({"error": message, **extra}).encode())


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address or ``localhost`` (the only hosts served)."""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_request(method: str, path: str, query: str, headers: Sequence[tuple[str, str]],
                  events_versions: Sequence[str] = SCHEDULED_EVENTS_VERSIONS) -> Route | Response:
    """The route of a valid request, else the error IMDS answers (in the service's order).
    ``events_versions``: the Scheduled Events versions served, oldest first."""
    versions: tuple[str, ...]
    methods: tuple[str, ...]
    if path == SCHEDULED_EVENTS_PATH:
        target, versions, methods = "scheduledevents", tuple(events_versions), ("GET", "POST")
    elif path == INSTANCE_PATH:
        target, versions, methods = "instance", INSTANCE_VERSIONS, ("GET",)
    else:
        return error(HTTPStatus.NOT_FOUND, "Not found")
    # IMDS refuses anything that looks proxied, and requires the header as an anti-SSRF proof.
    if _header(headers, "X-Forwarded-For") is not None:
        return error(HTTPStatus.BAD_REQUEST,
                     "Bad request. Request cannot contain X-Forwarded-For header")
    if (_header(headers, "Metadata") or "").lower() != "true":
        return error(HTTPStatus.BAD_REQUEST, "Bad request. Required metadata header not specified")
    version = parse_qs(query, keep_blank_values=True).get("api-version", [""])[0]
    if version not in versions:
        what = f"{version!r} is invalid" if version else "was not specified in the request"
        return error(HTTPStatus.BAD_REQUEST, f"Bad request. api-version {what}. For more "
                     "information refer to aka.ms/azureimds", **{"newest-versions":
                                                                 list(versions[:-4:-1])})
    if method not in methods:
        return error(HTTPStatus.METHOD_NOT_ALLOWED, f"Method not allowed: {method}")
    return Route(target, version)


def document_response(incarnation: int, events: Sequence[Mapping[str, object]], version: str,
                      if_none_match: str | None) -> Response:
    """The Scheduled Events document, with an ETag over what is sent, or 304 when it matches."""
    # Fields the docs list as added by later versions are absent from older answers.
    drop = set() if version >= "2020-07-01" else {"DurationInSeconds"}
    if version < "2019-08-01":
        drop.add("EventSource")
    if version < "2019-04-01":
        drop.add("Description")
    shaped = [{k: v for k, v in e.items() if k not in drop} for e in events]
    document = {"DocumentIncarnation": incarnation, "Events": shaped}
    body = json.dumps(document, separators=(",", ":")).encode()  # compact, as IMDS sends it
    # Content in the tag: after an incarnation reset the same number can carry other events.
    return _with_etag(f'"{incarnation}-{hashlib.sha256(body).hexdigest()[:16]}"', body,
                      if_none_match)


def raw_document_response(body: bytes, if_none_match: str | None) -> Response:
    """A recorded document served byte for byte (with an ETag over it, or 304)."""
    return _with_etag(f'"raw-{hashlib.sha256(body).hexdigest()[:16]}"', body, if_none_match)


def _with_etag(etag: str, body: bytes, if_none_match: str | None) -> Response:
    if if_none_match is not None:
        tags = [t.strip().removeprefix("W/") for t in if_none_match.split(",")]
        if "*" in tags or etag in tags:
            return Response(HTTPStatus.NOT_MODIFIED, headers=(("ETag", etag),))
    return Response(HTTPStatus.OK, body, headers=(("ETag", etag),))


def parse_start_requests(body: bytes) -> list[str] | Response:
    """EventIds of an approval body ``{"StartRequests": [{"EventId": ...}]}``, else a 400."""
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return error(HTTPStatus.BAD_REQUEST, f"Bad request. Body is not valid JSON: {exc}")
    starts = payload.get("StartRequests") if isinstance(payload, dict) else None
    if not isinstance(starts, list):
        starts = []
    ids = [s.get("EventId") if isinstance(s, dict) else None for s in starts]
    if not ids or not all(isinstance(i, str) for i in ids):
        seen = body[:200].decode(errors="replace")
        return error(HTTPStatus.BAD_REQUEST, 'Bad request. Expected {"StartRequests": '
                     f'[{{"EventId": "..."}}, ...]}}, got {seen}')
    return [str(i) for i in ids]


def start_events(events: list[dict[str, object]], ids: Sequence[str]) -> bool | Response:
    """Apply an approval in place: listed ``Scheduled`` events become ``Started`` with an empty
    NotBefore. True if anything changed; a 400 (and no change) if an EventId is unknown."""
    by_id = {str(e.get("EventId", "")).casefold(): e for e in events}
    unknown = [i for i in ids if i.casefold() not in by_id]
    if unknown:  # all or nothing, so a bad id never half-applies a request
        return error(HTTPStatus.BAD_REQUEST, f"Bad request. Unknown EventId: {unknown}")
    changed = False
    for event_id in ids:
        event = by_id[event_id.casefold()]
        if event.get("EventStatus") == "Scheduled":  # approving a Started event is a no-op
            event["EventStatus"], event["NotBefore"], changed = "Started", "", True
    return changed


@dataclass
class _Queued:
    fault: Fault
    remaining: int
    window_end: float | None = None  # opens with the first request the fault hits


class FaultQueue:
    """Queued faults in push order; not thread-safe (the simulator holds its lock around it)."""

    def __init__(self) -> None:
        self._queue: list[_Queued] = []

    def push(self, fault: Fault) -> None:
        """Queue ``fault`` behind those already queued."""
        self._queue.append(_Queued(fault, fault.count))

    def take(self, target: str, method: str, now: float) -> Fault | None:
        """The first queued fault matching the request, used up by one (or by its time window)."""
        for queued in list(self._queue):
            fault = queued.fault
            if fault.target != target or fault.method not in (method, "*"):
                continue
            if fault.duration > 0:
                if queued.window_end is None:
                    queued.window_end = now + fault.duration
                if now >= queued.window_end:
                    self._queue.remove(queued)
                    continue
            else:
                queued.remaining -= 1
                if queued.remaining <= 0:
                    self._queue.remove(queued)
            return fault
        return None


def fault_response(fault: Fault) -> Response:
    """The answer a ``status`` or ``body`` fault substitutes for the real one."""
    extra = () if fault.retry_after is None else (("Retry-After", str(fault.retry_after)),)
    body = fault.body or json.dumps({"error": HTTPStatus(fault.status).phrase}).encode()
    return Response(fault.status, body, fault.content_type, extra)


def instance_document(vm_name: str, overrides: Mapping[str, str]) -> dict[str, object]:
    """Instance metadata in the 2021-02-01 shape; ``overrides`` replace ``compute`` fields."""
    compute: dict[str, object] = {
        "azEnvironment": "AzurePublicCloud", "customData": "", "evictionPolicy": "",
        "isHostCompatibilityLayerVm": "false", "licenseType": "", "location": "westeurope",
        "name": vm_name, "offer": "0001-com-ubuntu-server-jammy", "osType": "Linux",
        "placementGroupId": "", "platformFaultDomain": "0", "platformUpdateDomain": "0",
        "priority": "Regular", "provider": "Microsoft.Compute", "publisher": "canonical",
        "resourceGroupName": "rg-sim", "sku": "22_04-lts-gen2",
        "subscriptionId": "00000000-0000-4000-8000-000000000000", "tags": "", "userData": "",
        "version": "22.04.202404080", "vmScaleSetName": "", "vmSize": "Standard_D2s_v5",
        "zone": "1", "tagsList": [], "publicKeys": [],
        # Derived from the name so a restarted simulator describes the same VM.
        "vmId": str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{vm_name}.vm-sim")),
        "plan": {"name": "", "product": "", "publisher": ""},
        "osProfile": {"adminUsername": "azureuser", "computerName": vm_name,
                      "disablePasswordAuthentication": "true"},
        "securityProfile": {"secureBootEnabled": "true", "virtualTpmEnabled": "true"},
    }
    compute.update(overrides)
    name, scale_set = str(compute["name"]), str(compute["vmScaleSetName"])
    if "resourceId" not in overrides:
        prefix = (f"/subscriptions/{compute['subscriptionId']}/resourceGroups/"
                  f"{compute['resourceGroupName']}/providers/Microsoft.Compute")
        # Uniform scale-set instances are named <scaleset>_<instance id>.
        compute["resourceId"] = (
            f"{prefix}/virtualMachineScaleSets/{scale_set}/virtualMachines/"
            f"{name.rpartition('_')[2]}" if scale_set else f"{prefix}/virtualMachines/{name}")
    mac = hashlib.sha256(name.encode()).hexdigest()[:6].upper()
    network = {"interface": [{
        "ipv4": {"ipAddress": [{"privateIpAddress": "10.0.0.4", "publicIpAddress": ""}],
                 "subnet": [{"address": "10.0.0.0", "prefix": "24"}]},
        "ipv6": {"ipAddress": []}, "macAddress": f"000D3A{mac}"}]}
    return {"compute": compute, "network": network}


class Backend(Protocol):
    """What the HTTP server needs from the simulator."""

    def now(self) -> float:
        """Wall clock for the request log."""

    def handle(self, method: str, path: str, query: str, headers: tuple[tuple[str, str], ...],
               body: bytes) -> Response:
        """Answer one request (may block for a delay fault)."""

    def record(self, entry: RequestLogEntry) -> None:
        """Append to the request log."""

    def track(self, conn: socket.socket, *, add: bool) -> None:
        """Register or forget an open client connection."""


class Server(ThreadingHTTPServer):
    """Threaded HTTP server answering for ``backend``."""

    daemon_threads = True  # a hung client never blocks interpreter exit

    def __init__(self, address: tuple[str, int], backend: Backend) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.backend = backend
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as urllib3 pools expect
    disable_nagle_algorithm = True  # else ~40 ms stalls per keep-alive request
    server_version = "IMDS-simulator/1.0"
    timeout = 300  # idle keep-alive connections do not pin a thread forever
    server: Server

    def setup(self) -> None:
        super().setup()
        self.server.backend.track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.backend.track(self.connection, add=False)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def version_string(self) -> str:
        return self.server_version  # no Python version in the Server header

    def log_message(self, format: str, *args: object) -> None:
        """Silent: the request log is the record, and stderr belongs to the caller."""

    def _serve(self, method: str) -> None:
        backend, arrival = self.server.backend, time.monotonic()
        wall, split = backend.now(), urlsplit(self.path)
        headers = tuple(self.headers.items())
        length = self.headers.get("Content-Length", "0").strip()
        if self.headers.get("Transfer-Encoding") or not length.isdigit() or int(length) > MAX_BODY:
            # Unframeable (or chunked, which no IMDS client sends): answer and drop the stream.
            self.close_connection = True
            body = b""
            response = error(HTTPStatus.BAD_REQUEST, "Bad request. Expected a Content-Length "
                             f"<= {MAX_BODY} and no Transfer-Encoding, got {length!r}")
        else:
            body = self.rfile.read(int(length))
            response = backend.handle(method, split.path, split.query, headers, body)
        backend.record(RequestLogEntry(arrival, wall, method, split.path, split.query, headers,
                                       body, response.status))
        try:
            self.send_response(response.status)
            for name, value in response.headers:
                self.send_header(name, value)
            if response.status != HTTPStatus.NOT_MODIFIED:  # a 304 has no body and no length
                self.send_header("Content-Type", response.content_type)
                self.send_header("Content-Length", str(len(response.body)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            if response.status != HTTPStatus.NOT_MODIFIED:
                self.wfile.write(response.body)
        except OSError:
            self.close_connection = True  # the client went away mid-answer
