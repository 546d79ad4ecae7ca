"""A local AMQP 1.0 stand-in for Azure Event Hubs that the real ``azure-eventhub`` SDK talks to.

Apache Qpid Proton (its reactor ``Container``, on a background thread) speaks AMQP; the
:class:`~.amqp_proxy.AmqpFrameProxy` in front of it owns the port the SDK connects to (that module
says why it is needed). Implemented: SASL ANONYMOUS; the ``$cbs`` put-token exchange;
``$management`` READ of ``com.microsoft:eventhub`` / ``com.microsoft:partition``; sender links to
``amqps://host:port/<hub>[/Partitions/<n>]`` whose transfers are decoded (``send_batch`` batches
split into their events), recorded as :class:`ReceivedMessage` and settled ``accepted``.
Usage: ``with AmqpPeer() as peer:`` then
``EventHubProducerClient.from_connection_string(peer.connection_string("hub"), retry_total=0)``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from proton import Condition, Delivery, Endpoint, Handler, Link, Message, Sender
from proton.reactor import ApplicationEvent, Container, EventInjector

from .amqp_proxy import AmqpFrameProxy, batch_messages, body_bytes, parse_entity, plain_map

__all__ = ["AmqpPeer", "ReceivedMessage"]

_CBS = "$cbs"
_MANAGEMENT = "$management"
_CREDIT = 100  # link credit granted to the SDK's senders, topped up when half is used
_ACTIVE = Endpoint.LOCAL_ACTIVE | Endpoint.REMOTE_ACTIVE


@dataclass(frozen=True)
class ReceivedMessage:
    """One event as the hub stored it (a batch yields one of these per inner message)."""

    body: bytes
    application_properties: dict[str, Any]
    partition_key: str | None
    address: str  # the sender link's target, e.g. ``amqps://127.0.0.1:5672/hub``
    annotations: dict[str, Any] = field(default_factory=dict)  # message annotations
    hub: str = ""
    partition_id: str | None = None  # set when the SDK sent to ``<hub>/Partitions/<n>``
    batched: bool = False  # arrived inside a 0x80013700 batch (``send_batch``)


def _status(code: int, description: str) -> dict[str, Any]:
    """Response properties. CBS reads ``status-description``, but 5.15.1's management path reads
    ``statusDescription`` (it passes the field name under a keyword nobody reads): send both."""
    keys = ("status-description", "statusDescription")
    return {"status-code": code, **dict.fromkeys(keys, description)}


def _not_found(entity: str) -> str:
    return f"The messaging entity '{entity}' could not be found."


class _PeerHandler(Handler):
    """Proton event handler; runs only on the container thread."""

    def __init__(self, peer: AmqpPeer) -> None:
        super().__init__()
        self._peer = peer
        self.container: Container | None = None  # set right after the Container is built
        self._tags = 0

    # -- connection and session lifecycle: accept everything, echo closes ---------------------
    def on_connection_bound(self, event: Any) -> None:
        # The SDK always starts with a SASL header; ANONYMOUS needs no credentials.
        sasl = event.transport.sasl()
        sasl.allow_insecure_mechs = True
        sasl.allowed_mechs("ANONYMOUS")

    def _echo_open(self, event: Any) -> None:
        event.context.open()  # the connection or session the SDK just opened

    def _echo_close(self, event: Any) -> None:
        event.context.close()  # the link, session or connection the SDK just closed

    on_connection_remote_open = on_session_remote_open = _echo_open
    on_link_remote_close = on_session_remote_close = on_connection_remote_close = _echo_close

    def on_peer_stop(self, event: Any) -> None:
        """Injected by :meth:`AmqpPeer.stop` so shutdown happens on the container thread."""
        self._peer._acceptor.close()
        if self._peer._injector is not None:
            self._peer._injector.close()
        if self.container is not None:
            self.container.stop()

    # -- links --------------------------------------------------------------------------------
    def on_link_remote_open(self, event: Any) -> None:
        link = event.link
        # The attach reply must carry non-null source and target or the SDK drops the link.
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        if link.is_sender:  # the SDK's $cbs / $management response links
            link.open()
            return
        address = link.remote_target.address or ""
        if address in (_CBS, _MANAGEMENT):
            link.open()
            link.flow(_CREDIT)
            return
        entity = parse_entity(address)
        link.max_message_size = self._peer.max_message_size
        link.open()
        if entity is None or not self._peer._knows_hub(entity[0]):
            # Like the service: attach, then detach with amqp:not-found.
            link.condition = Condition("amqp:not-found", _not_found(address))
            link.close()
            return
        link.flow(_CREDIT)

    def on_delivery(self, event: Any) -> None:
        link, delivery = event.link, event.delivery
        if not link.is_receiver or not delivery.readable or delivery.partial:
            return  # dispositions of our own (pre-settled) replies need nothing
        encoded = link.recv(delivery.pending)
        link.advance()
        address = link.remote_target.address or ""
        if link.state & Endpoint.LOCAL_CLOSED:
            # pyamqp sends without waiting for credit, so a transfer can follow a refused attach.
            delivery.update(Delivery.REJECTED)
            delivery.settle()
            return
        try:
            if address == _CBS:
                self._on_cbs(link, encoded)
            elif address == _MANAGEMENT:
                self._on_management(link, encoded)
            else:
                self._on_event(address, encoded)
            delivery.update(Delivery.ACCEPTED)
        except Exception as exc:  # an exception here would kill the reactor thread: report it
            self._peer._note_error(exc)
            delivery.update(Delivery.REJECTED)
        delivery.settle()
        if link.credit < _CREDIT // 2:
            link.flow(_CREDIT - link.credit)

    # -- request/response nodes ---------------------------------------------------------------
    def _reply(
        self, request_link: Link, request: Message, props: dict[str, Any], body: Any = None
    ) -> None:
        """Answer on the peer's sender link for the same node (``$cbs`` or ``$management``)."""
        node = request_link.remote_target.address
        reply_link = None
        candidate = request_link.connection.link_head(_ACTIVE)
        while candidate is not None:
            if isinstance(candidate, Sender) and candidate.source.address == node:
                reply_link = candidate
                if candidate.remote_target.address == request.reply_to:
                    break
            candidate = candidate.next(_ACTIVE)
        if reply_link is None:
            return  # the SDK always opens its response link first; nothing to answer on
        response = Message(correlation_id=request.id, properties=props, body=body)
        self._tags += 1
        delivery = response.send(reply_link, tag=str(self._tags))
        delivery.settle()  # pre-settled: the SDK does not need to acknowledge responses

    def _on_cbs(self, link: Link, encoded: bytes) -> None:
        request = Message()
        request.decode(encoded)
        props = plain_map(request.properties)
        self._peer._note_auth(str(props.get("name", "")), str(props.get("type", "")))
        if self._peer.reject_auth:
            self._reply(link, request, _status(401, "Unauthorized (reject_auth)"))
        else:
            self._reply(link, request, _status(200, "OK"))

    def _on_management(self, link: Link, encoded: bytes) -> None:
        request = Message()
        request.decode(encoded)
        props = plain_map(request.properties)
        hub = str(props.get("name", ""))
        kind = str(props.get("type", ""))
        partitions = [str(i) for i in range(self._peer.partition_count)]
        now_ms = int(time.time() * 1000)
        if props.get("operation") != "READ" or not self._peer._knows_hub(hub):
            self._reply(link, request, _status(404, _not_found(hub)))
            return
        body: dict[str, Any] = {"name": hub, "type": kind, "created_at": now_ms}
        if kind == "com.microsoft:eventhub":
            body |= {"partition_count": len(partitions), "partition_ids": partitions}
        else:  # com.microsoft:partition
            body |= {"partition": str(props.get("partition", "0")), "is_partition_empty": True}
            body |= {"begin_sequence_number": 0, "last_enqueued_sequence_number": -1}
            body |= {"last_enqueued_offset": "-1", "last_enqueued_time_utc": now_ms}
        self._reply(link, request, _status(200, "OK"), body)

    # -- events -------------------------------------------------------------------------------
    def _on_event(self, address: str, encoded: bytes) -> None:
        hub, partition_id = parse_entity(address) or ("", None)
        inner = batch_messages(encoded)
        if inner is None:
            plain = Message()
            plain.decode(encoded)
            messages, batched = [plain], False
        else:
            messages, batched = inner, True
        records = []
        for message in messages:
            annotations = plain_map(message.annotations)
            key = annotations.get("x-opt-partition-key")
            records.append(
                ReceivedMessage(
                    body=body_bytes(message.body),
                    application_properties=plain_map(message.properties),
                    partition_key=None if key is None else str(key),
                    address=address,
                    annotations=annotations,
                    hub=hub,
                    partition_id=partition_id,
                    batched=batched,
                )
            )
        self._peer._record(records)


class AmqpPeer:
    """Event Hubs stand-in on 127.0.0.1; a context manager. All controls are thread-safe.

    :param hubs: hub names that exist; attaching to any other is refused with ``amqp:not-found``
        (and management READs answer 404). ``None`` accepts every name.
    :param reject_auth: answer every CBS put-token with 401, so the SDK raises
        ``AuthenticationError``. May be toggled while running.
    :param blackhole: accept TCP but never answer a byte; the SDK then blocks (in SASL) until the
        caller's own timeout. May be toggled while running (affects new connections).
    :param partition_count: partitions reported by management READ.
    :param max_message_size: advertised on sender links; the SDK sizes batches from it.
    :param port: client-facing port; 0 picks a free one on the first :meth:`start`.
    """

    def __init__(
        self,
        *,
        hubs: Iterable[str] | None = None,
        reject_auth: bool = False,
        blackhole: bool = False,
        partition_count: int = 2,
        max_message_size: int = 1024 * 1024,
        port: int = 0,
    ) -> None:
        self.hubs = None if hubs is None else frozenset(hubs)
        self.reject_auth = reject_auth
        self.partition_count = partition_count
        self.max_message_size = max_message_size
        self._cond = threading.Condition()
        self._received: list[ReceivedMessage] = []
        self._auth_requests: list[tuple[str, str]] = []
        self._errors: list[Exception] = []
        self._backend_port = 0
        self._proxy = AmqpFrameProxy(lambda: self._backend_port, port)
        self._proxy.blackhole = blackhole
        self._thread: threading.Thread | None = None
        self._acceptor: Any = None
        self._injector: EventInjector | None = None

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> AmqpPeer:
        """Start Proton and the proxy; after :meth:`stop` it comes back on the same port."""
        if self._thread is not None:
            return self
        handler = _PeerHandler(self)
        container = Container(handler)
        container.container_id = f"amqp-peer-{uuid.uuid4()}"
        handler.container = container  # the handler stops the reactor from its own thread
        self._acceptor = self._listen(container)
        self._injector = EventInjector()
        container.selectable(self._injector)
        self._thread = threading.Thread(target=container.run, daemon=True, name="amqp-peer")
        self._thread.start()
        self._proxy.open()
        return self

    def stop(self) -> None:
        """Drop every connection and stop listening (the SDK sees the hub vanish); idempotent.

        Received messages are kept, so a test can stop, start and keep counting.
        """
        self._proxy.close()  # first, so Proton sees EOF on every backend connection
        thread, self._thread = self._thread, None
        if thread is None:
            return
        assert self._injector is not None
        self._injector.trigger(ApplicationEvent("peer_stop"))
        thread.join(timeout=10)
        if not thread.is_alive():  # Proton never closes the injector's wake-up pipe itself
            for fd in self._injector.pipe:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def pause(self) -> None:
        """Simulate an outage: refuse connections and drop current ones; Proton keeps running."""
        self._proxy.close()

    def resume(self) -> None:
        """End an outage started by :meth:`pause`: listen again on the same port."""
        if self._thread is not None:
            self._proxy.open()

    def __enter__(self) -> AmqpPeer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _listen(self, container: Container) -> Any:
        """Listen on a free loopback port for the proxy (racing other binders, hence retries)."""
        for _ in range(20):
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            with contextlib.suppress(OSError):
                acceptor = container.listen(f"127.0.0.1:{port}")
                self._backend_port = port
                return acceptor
        raise OSError("no free port for the AMQP peer")

    # -- test controls ------------------------------------------------------------------------
    @property
    def port(self) -> int:
        """The port the SDK connects to (0 until the first :meth:`start`)."""
        return self._proxy.port

    @property
    def blackhole(self) -> bool:
        """Whether new connections are accepted and then ignored."""
        return self._proxy.blackhole

    @blackhole.setter
    def blackhole(self, value: bool) -> None:
        self._proxy.blackhole = value

    @property
    def connections_accepted(self) -> int:
        """TCP connections accepted so far (shows that a client reconnected)."""
        return self._proxy.accepted

    def connection_string(self, hub: str) -> str:
        """An Event Hubs connection string for ``hub`` on this peer (plain TCP, emulator mode)."""
        return (
            f"Endpoint=sb://127.0.0.1:{self.port};SharedAccessKeyName=test;"
            f"SharedAccessKey=dGVzdA==;UseDevelopmentEmulator=true;EntityPath={hub}"
        )

    @property
    def received(self) -> list[ReceivedMessage]:
        """A snapshot of every event received so far, in arrival order."""
        with self._cond:
            return list(self._received)

    @property
    def auth_requests(self) -> list[tuple[str, str]]:
        """(audience, token type) of every CBS put-token, e.g. ``("sb://host:port/hub", ...)``."""
        with self._cond:
            return list(self._auth_requests)

    @property
    def errors(self) -> list[Exception]:
        """Exceptions raised while handling deliveries (those deliveries were rejected)."""
        with self._cond:
            return list(self._errors)

    def clear(self) -> None:
        """Forget received messages and auth requests."""
        with self._cond:
            self._received.clear()
            self._auth_requests.clear()

    def wait_for(self, count: int, timeout: float) -> bool:
        """Block until at least ``count`` events were received; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self._received) >= count, timeout)

    # -- called from the container thread -----------------------------------------------------
    def _knows_hub(self, hub: str) -> bool:
        return self.hubs is None or hub in self.hubs

    def _record(self, messages: list[ReceivedMessage]) -> None:
        with self._cond:
            self._received.extend(messages)
            self._cond.notify_all()

    def _note_error(self, exc: Exception) -> None:
        with self._cond:
            self._errors.append(exc)

    def _note_auth(self, audience: str, token_type: str) -> None:
        with self._cond:
            self._auth_requests.append((audience, token_type))
            self._cond.notify_all()
