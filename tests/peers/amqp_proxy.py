"""Byte-level TCP proxy between the azure-eventhub SDK and the Proton test peer.

Why it exists: azure-eventhub 5.15.1's pure-Python AMQP decoder reads performative fields by
position (``frame[10]``, ``frame[0][1]``...), so it breaks on Proton's compact encoding, which
omits trailing null fields (legal AMQP 1.0). The proxy re-encodes every peer→client performative
(and the composites nested in it: error, source, target, delivery states) as a full-length list by
appending nulls. Semantics are unchanged: an absent field and a null field mean the same thing.
Client→peer bytes pass through untouched.

The proxy also gives the peer its outage controls: closing the listener and every proxied
connection looks to the SDK exactly like the hub going away, and re-binding the same port brings it
back. ``blackhole`` mode accepts TCP but never answers, which is how a half-dead network path looks.

The module ends with the peer's message-decoding helpers (Event Hubs batches, entity addresses),
kept here so that neither module grows past 400 lines.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from proton import Data, Message

__all__ = [
    "AmqpFrameProxy",
    "batch_messages",
    "body_bytes",
    "pad_performative",
    "parse_entity",
    "plain_map",
]

# Full field counts of the AMQP 1.0 composites the peer can send, keyed by descriptor code.
_FULL_LENGTH: dict[int, int] = {
    0x10: 10,  # open
    0x11: 8,  # begin
    0x12: 14,  # attach
    0x13: 11,  # flow
    0x14: 11,  # transfer
    0x15: 6,  # disposition
    0x16: 3,  # detach
    0x17: 1,  # end
    0x18: 1,  # close
    0x1D: 3,  # error
    0x23: 2,  # received
    0x25: 1,  # rejected
    0x27: 3,  # modified
    0x28: 11,  # source
    0x29: 7,  # target
    0x40: 1,  # sasl-mechanisms
    0x41: 3,  # sasl-init
    0x42: 1,  # sasl-challenge
    0x43: 1,  # sasl-response
    0x44: 2,  # sasl-outcome
}
_FIXED_WIDTH = {0x4: 0, 0x5: 1, 0x6: 2, 0x7: 4, 0x8: 8, 0x9: 16}
_AMQP_HEADER = b"AMQP"
_DATA_SECTION = 0x75
_BODY_SECTIONS = frozenset({0x75, 0x76, 0x77})  # data, amqp-sequence, amqp-value


def _skip(buf: bytes, i: int) -> int:
    """Return the offset just past the encoded AMQP value starting at ``buf[i]``."""
    code = buf[i]
    if code == 0x00:  # described: descriptor, then value
        return _skip(buf, _skip(buf, i + 1))
    category = code >> 4
    if category in _FIXED_WIDTH:
        return i + 1 + _FIXED_WIDTH[category]
    if category in (0xA, 0xC, 0xE):  # 1-byte size prefix (str8, list8, array8...)
        return i + 2 + buf[i + 1]
    if category in (0xB, 0xD, 0xF):  # 4-byte size prefix
        return i + 5 + int(struct.unpack_from(">I", buf, i + 1)[0])
    raise ValueError(f"unknown AMQP constructor 0x{code:02x}")


def _elements(buf: bytes) -> list[bytes]:
    """Split an encoded list (list0, list8 or list32) into its encoded elements."""
    code = buf[0]
    if code == 0x45:
        return []
    if code == 0xC0:
        count, i = buf[2], 3
    elif code == 0xD0:
        count, i = struct.unpack_from(">I", buf, 5)[0], 9
    else:
        raise ValueError(f"not a list: 0x{code:02x}")
    out = []
    for _ in range(count):
        end = _skip(buf, i)
        out.append(buf[i:end])
        i = end
    return out


def pad_performative(value: bytes) -> bytes:
    """Re-encode one described composite as a full-length list32, recursively.

    ``value`` must be exactly one encoded value. Anything that is not a known composite (or is not
    list-encoded) is returned unchanged.
    """
    if len(value) < 3 or value[0] != 0x00 or value[1] != 0x53 or value[2] not in _FULL_LENGTH:
        return value
    body = value[3:]
    if body[0] not in (0x45, 0xC0, 0xD0):
        return value
    fields = [pad_performative(e) for e in _elements(body)]
    fields += [b"\x40"] * (_FULL_LENGTH[value[2]] - len(fields))
    payload = b"".join(fields)
    return value[:3] + b"\xd0" + struct.pack(">II", len(payload) + 4, len(fields)) + payload


def _rewrite_frame(frame: bytes) -> bytes:
    """Pad the performative of one complete frame; keep any transfer payload that follows."""
    doff = frame[4] * 4
    if len(frame) <= doff:  # empty (heartbeat) frame
        return frame
    body = frame[doff:]
    end = _skip(body, 0)
    new_body = pad_performative(body[:end]) + body[end:]
    return struct.pack(">I", doff + len(new_body)) + frame[4:doff] + new_body


class _FrameRewriter:
    """Incremental peer→client stream parser: protocol headers pass, frames get padded."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> bytes:
        """Consume bytes from the peer; return the bytes to forward to the client."""
        self._buf += data
        out = []
        while len(self._buf) >= 8:
            if self._buf.startswith(_AMQP_HEADER):
                out.append(self._buf[:8])
                self._buf = self._buf[8:]
                continue
            size = struct.unpack_from(">I", self._buf)[0]
            if len(self._buf) < size:
                break
            out.append(_rewrite_frame(self._buf[:size]))
            self._buf = self._buf[size:]
        return b"".join(out)


class AmqpFrameProxy:
    """Loopback TCP proxy in front of an AMQP peer; can be closed and re-opened on the same port.

    ``backend_port`` is called per accepted connection, so the backend may move between restarts.
    """

    def __init__(self, backend_port: Callable[[], int], port: int = 0) -> None:
        self._backend_port = backend_port
        self._port = port
        self.blackhole = False
        self.accepted = 0
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._listener: socket.socket | None = None

    @property
    def port(self) -> int:
        """The client-facing port (stable across close/open once first bound)."""
        return self._port

    def open(self) -> None:
        """Bind (re-bind after :meth:`close`) the listening socket and start accepting."""
        if self._listener is not None:
            return
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # SO_REUSEADDR so a restart can re-bind while old connections sit in TIME_WAIT.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self._port))
        listener.listen(16)
        self._port = listener.getsockname()[1]
        self._listener = listener
        self._spawn(self._accept_loop, listener)

    def close(self) -> None:
        """Stop listening and drop every proxied connection; idempotent."""
        listener, self._listener = self._listener, None
        if listener is not None:
            _hard_close(listener)  # shutdown() wakes the thread blocked in accept()
        with self._lock:
            sockets, self._sockets = self._sockets, set()
            threads, self._threads = self._threads, []
        for sock in sockets:
            _hard_close(sock)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout=5)

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True, name="amqp-proxy")
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _track(self, sock: socket.socket) -> bool:
        with self._lock:
            if self._listener is None:  # closed meanwhile: refuse to leak it
                return False
            self._sockets.add(sock)
            return True

    def _accept_loop(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # listener closed
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if not self._track(client):
                _hard_close(client)
                return
            self.accepted += 1
            if self.blackhole:
                self._spawn(self._pump, client, None, None)
                continue
            try:
                backend = socket.create_connection(("127.0.0.1", self._backend_port()), timeout=5)
            except OSError:
                _hard_close(client)
                continue
            backend.settimeout(None)
            backend.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if not self._track(backend):
                _hard_close(backend)
                _hard_close(client)
                return
            self._spawn(self._pump, client, backend, None)
            self._spawn(self._pump, backend, client, _FrameRewriter())

    @staticmethod
    def _pump(
        src: socket.socket, dst: socket.socket | None, rewriter: _FrameRewriter | None
    ) -> None:
        """Copy src→dst until either side ends; ``dst=None`` swallows the bytes (blackhole)."""
        try:
            while data := src.recv(65536):
                if dst is not None:
                    dst.sendall(rewriter.feed(data) if rewriter else data)
        except (OSError, ValueError):
            pass
        for sock in (src, dst):
            if sock is not None:
                _hard_close(sock)


def _hard_close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


# -- message decoding for the peer ----------------------------------------------------------------
def plain_map(mapping: Any) -> dict[str, Any]:
    """A Proton map (``symbol`` keys) as a dict with plain ``str`` keys."""
    return {str(k): v for k, v in (mapping or {}).items()}


def body_bytes(body: Any) -> bytes:
    """A message body as bytes (data sections already are; an amqp-value string is encoded)."""
    return bytes(body) if isinstance(body, bytes | memoryview) else str(body).encode()


def split_sections(encoded: bytes) -> list[tuple[int, Any]]:
    """Split an encoded message into (descriptor, value) sections using Proton's decoder."""
    data, rest = Data(), encoded
    while rest:
        rest = rest[data.decode(rest) :]
    data.rewind()
    sections = []
    while data.next():
        described = data.get_object()
        if described is None:  # a bare null where a section should be: nothing to keep
            continue
        value = described.value
        # Proton hands out memoryviews into Data's own buffer, which dies with ``data``: copy.
        if isinstance(value, memoryview):
            value = bytes(value)
        sections.append((int(described.descriptor), value))
    return sections


def batch_messages(encoded: bytes) -> list[Message] | None:
    """The messages of an Event Hubs batch, or None when ``encoded`` is a plain message.

    Proton's Python binding does not expose a delivery's message-format, so a batch is recognised
    structurally: its body is only data sections, each holding a complete encoded message with
    a body. A JSON (or any text) event body never starts with the 0x00 described-type byte.
    """
    sections = split_sections(encoded)
    bodies = [value for code, value in sections if code in _BODY_SECTIONS]
    if not bodies or any(code != _DATA_SECTION for code, _ in sections if code in _BODY_SECTIONS):
        return None
    inner = []
    for raw in bodies:
        if not isinstance(raw, bytes) or not raw.startswith(b"\x00\x53"):
            return None
        try:
            if not any(code in _BODY_SECTIONS for code, _ in split_sections(raw)):
                return None
            message = Message()
            message.decode(raw)
        except Exception:  # not an AMQP message after all: treat the outer one as plain
            return None
        inner.append(message)
    return inner


def parse_entity(address: str) -> tuple[str, str | None] | None:
    """``amqps://host/hub[/Partitions/n]`` → (hub, partition id); None if not an entity address."""
    parsed = urlparse(address)
    parts = [p for p in parsed.path.split("/") if p]
    if not parsed.scheme or not parts:
        return None
    if len(parts) == 1:
        return parts[0], None
    if len(parts) == 3 and parts[1].lower() == "partitions":
        return parts[0], parts[2]
    return None
