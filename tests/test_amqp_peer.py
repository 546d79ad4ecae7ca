"""The local AMQP peer against the real azure-eventhub SDK: no mocks anywhere.

These tests pin down both the peer and the SDK behaviour the Event Hubs sink relies on: which
exception each failure raises, how quickly it does so with ``retry_total=0``, and that one
producer client recovers by itself once the hub is back on the same port.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("azure.eventhub")
pytest.importorskip("proton")

from azure.eventhub import EventData, EventHubProducerClient
from azure.eventhub._pyamqp._decode import decode_frame
from azure.eventhub.exceptions import AuthenticationError, ConnectError

try:
    from tests.peers.amqp_peer import AmqpPeer
    from tests.peers.amqp_proxy import pad_performative
except ImportError:  # tests/ is not a package here: pytest put tests/ itself on sys.path
    from peers.amqp_peer import AmqpPeer  # type: ignore[no-redef,import-not-found]
    from peers.amqp_proxy import pad_performative  # type: ignore[no-redef,import-not-found]

HUB = "hub"


@pytest.fixture
def peer() -> Iterator[AmqpPeer]:
    with AmqpPeer(hubs={HUB}, partition_count=4) as running:
        yield running
        assert running.errors == []


@pytest.fixture
def producers() -> Iterator[list[EventHubProducerClient]]:
    """Producers a test creates; closed at teardown so no SDK connection outlives the test."""
    created: list[EventHubProducerClient] = []
    yield created
    for client in created:
        client.close()


def _producer(
    peer: AmqpPeer, producers: list[EventHubProducerClient], hub: str = HUB
) -> EventHubProducerClient:
    # retry_total=0: one attempt, so failures surface in ~1 s instead of ~12-24 s.
    conn_str = peer.connection_string(hub)
    client = EventHubProducerClient.from_connection_string(conn_str, retry_total=0)
    producers.append(client)
    return client


def _send(client: EventHubProducerClient, events: list[dict[str, Any]], **batch: Any) -> None:
    data_batch = client.create_batch(**batch)
    for event in events:
        data = EventData(json.dumps(event))
        data.properties = {"RecordKind": "transition", "Seq": event["seq"]}
        data_batch.add(data)
    client.send_batch(data_batch)


@pytest.mark.timeout(60)
def test_send_batch_records_bodies_properties_and_partition_key(
    peer: AmqpPeer, producers: list[EventHubProducerClient]
) -> None:
    client = _producer(peer, producers)
    events = [{"seq": i, "EventId": f"E-{i}"} for i in range(3)]
    _send(client, events, partition_key="vm-1")

    assert peer.wait_for(3, timeout=10)
    received = peer.received
    assert [json.loads(m.body) for m in received] == events
    assert [m.application_properties for m in received] == [
        {"RecordKind": "transition", "Seq": i} for i in range(3)
    ]
    assert {m.partition_key for m in received} == {"vm-1"}
    assert all(m.batched and m.hub == HUB and m.partition_id is None for m in received)
    assert received[0].address == f"amqps://127.0.0.1:{peer.port}/{HUB}"
    audience = f"sb://127.0.0.1:{peer.port}/{HUB}"
    assert peer.auth_requests[0] == (audience, "servicebus.windows.net:sastoken")

    # A second batch reuses the same client and, as it turns out, the same TCP connection.
    _send(client, [{"seq": 3}, {"seq": 4}], partition_key="vm-1")
    assert peer.wait_for(5, timeout=10)
    assert [json.loads(m.body)["seq"] for m in peer.received] == [0, 1, 2, 3, 4]
    assert peer.connections_accepted == 1


@pytest.mark.timeout(60)
def test_single_event_partition_id_and_management_reads(
    peer: AmqpPeer, producers: list[EventHubProducerClient]
) -> None:
    client = _producer(peer, producers)
    assert client.get_partition_ids() == ["0", "1", "2", "3"]
    assert client.get_partition_properties("2")["id"] == "2"

    client.send_event(EventData(b"plain"), partition_key="vm-2")
    _send(client, [{"seq": 7}], partition_id="2")

    assert peer.wait_for(2, timeout=10)
    single, to_partition = peer.received
    assert (single.body, single.partition_key, single.batched) == (b"plain", "vm-2", False)
    assert to_partition.partition_id == "2"
    assert to_partition.address.endswith(f"/{HUB}/Partitions/2")
    assert json.loads(to_partition.body) == {"seq": 7}


@pytest.mark.timeout(60)
def test_rejected_token_raises_authentication_error(
    peer: AmqpPeer, producers: list[EventHubProducerClient]
) -> None:
    peer.reject_auth = True
    client = _producer(peer, producers)
    started = time.monotonic()
    with pytest.raises(AuthenticationError):
        _send(client, [{"seq": 0}], partition_key="vm-1")
    assert time.monotonic() - started < 10
    assert peer.received == []
    assert peer.auth_requests  # the put-token did reach the peer


@pytest.mark.timeout(60)
def test_unknown_hub_is_refused(peer: AmqpPeer, producers: list[EventHubProducerClient]) -> None:
    client = _producer(peer, producers, hub="no-such-hub")
    # The attach is refused with amqp:not-found; the SDK's recovery path then asks $management,
    # gets 404 and raises ConnectError (ErrorCondition.NotFound).
    with pytest.raises(ConnectError, match="404"):
        _send(client, [{"seq": 0}], partition_key="vm-1")
    assert peer.received == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("down", "up"), [("stop", "start"), ("pause", "resume")])
def test_outage_fails_fast_and_same_client_recovers_on_same_port(
    peer: AmqpPeer, producers: list[EventHubProducerClient], down: str, up: str
) -> None:
    client = _producer(peer, producers)
    _send(client, [{"seq": 0}], partition_key="vm-1")
    assert peer.wait_for(1, timeout=10)
    port = peer.port

    getattr(peer, down)()
    started = time.monotonic()
    with pytest.raises(ConnectError):
        _send(client, [{"seq": 1}], partition_key="vm-1")
    assert time.monotonic() - started < 10

    getattr(peer, up)()
    assert peer.port == port
    _send(client, [{"seq": 2}], partition_key="vm-1")  # the same client reconnects by itself
    assert peer.wait_for(2, timeout=10)
    assert [json.loads(m.body)["seq"] for m in peer.received] == [0, 2]
    assert peer.connections_accepted >= 2


@pytest.mark.timeout(60)
def test_blackhole_hangs_the_sdk_until_the_connection_drops(
    peer: AmqpPeer, producers: list[EventHubProducerClient]
) -> None:
    peer.blackhole = True
    client = _producer(peer, producers)
    outcome: list[BaseException] = []

    def send() -> None:
        try:
            _send(client, [{"seq": 0}], partition_key="vm-1")
        except BaseException as exc:  # recorded for the assertion on the test thread
            outcome.append(exc)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    sender.join(timeout=2.0)  # deadline, not a sleep: the SDK must still be blocked after it
    assert sender.is_alive(), "the SDK returned although the peer never answered"
    assert peer.connections_accepted == 1

    peer.stop()  # dropping the TCP connection is what finally unblocks the SDK
    sender.join(timeout=15)
    assert not sender.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], ConnectError)
    assert peer.received == []


@pytest.mark.timeout(10)
def test_wait_for_times_out_without_messages(peer: AmqpPeer) -> None:
    started = time.monotonic()
    assert peer.wait_for(1, timeout=0.2) is False
    assert time.monotonic() - started < 2


def test_stop_is_idempotent_and_start_reuses_the_port() -> None:
    peer = AmqpPeer()
    peer.stop()  # never started: no-op
    peer.start()
    port = peer.port
    peer.stop()
    peer.stop()
    with peer:
        assert peer.port == port
    assert "UseDevelopmentEmulator=true;EntityPath=x" in peer.connection_string("x")


def test_pad_performative_makes_compact_frames_readable_by_the_sdk() -> None:
    # A compact attach as Proton encodes it: name, handle, role and nothing after, whereas the
    # SDK reads fields up to frame[13] by position.
    compact_attach = b"\x00\x53\x12\xc0\x08\x03\xa1\x01n\x52\x01\x41"
    frame_type, fields = decode_frame(memoryview(pad_performative(compact_attach)))
    assert frame_type == 0x12
    assert fields == [b"n", 1, True] + [None] * 11
    # Values that are not known composites pass through untouched.
    assert pad_performative(b"\xa1\x01n") == b"\xa1\x01n"
