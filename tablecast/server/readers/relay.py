"""A read process's client connections: the plain key reads it answers itself, and a byte
pipe to its node for everything else.

The kernel hands a new connection to any socket listening on the node's port,
the node's or a read process's. A read process answers the requests it can
(:class:`~tablecast.server.readers.answer.Answerer`) in order; at the first it
cannot, it connects to the node's relay socket (a Unix socket only this user
may open), sends one preamble line saying who the client is and whether it
came over TLS, then everything the client sent from that request on, and from
then on passes bytes both ways until either side closes. The node serves that
connection as its own (its routing, auth, rate limits, watches, WebSockets):
the read process never parses what it does not answer.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from tablecast.server.answers import JSON
from tablecast.server.errors import ApiError
from tablecast.server.http1 import HEADER_TIMEOUT_S, MAX_HEAD, SWEEP_S, sized_head
from tablecast.server.local import RETRY_AFTER
from tablecast.server.readers.answer import Answerer

log = logging.getLogger(__name__)

#: the relay's first line: the scheme the client used and its address
PREAMBLE = b"TABLECAST-RELAY %s %s\r\n"
#: bytes a client may send ahead while the pipe to the node is being opened
MAX_PENDING = 4 << 20


class Clients:
    """What a read process's connections share: the answerer, the node's relay socket, and
    the connections themselves (for the idle sweep and the stop)."""

    def __init__(
        self, answerer: Answerer, relay_path: str, scheme: str, max_connections: int
    ) -> None:
        self.answerer = answerer
        self.relay_path = relay_path
        self.scheme = scheme.encode()
        self.max_connections = max_connections
        self.loop = asyncio.get_running_loop()
        self.connections: set[ClientConnection] = set()
        self._sweeper = self.loop.call_later(SWEEP_S, self._sweep)

    def _sweep(self) -> None:
        """Close connections that waited for a request's head too long (the node does this
        for the ones it serves through the pipe)."""
        limit = self.loop.time() - HEADER_TIMEOUT_S
        for conn in [c for c in self.connections if (c.waiting_since or limit) < limit]:
            conn.close()
        self._sweeper = self.loop.call_later(SWEEP_S, self._sweep)

    def close(self) -> None:
        self._sweeper.cancel()
        for conn in list(self.connections):
            conn.close()


class ClientConnection(asyncio.Protocol):
    def __init__(self, clients: Clients) -> None:
        self.clients = clients
        self.transport: asyncio.Transport | None = None
        self.client = b""
        self.buffer = bytearray()
        #: since when it waits for a request's head (None: piped to the node)
        self.waiting_since: float | None = clients.loop.time()
        self.upstream: asyncio.Transport | None = None
        #: what the client sent while the pipe was being opened (None: not piping)
        self.pending: list[bytes] | None = None
        self.pending_bytes = 0

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        if len(self.clients.connections) >= self.clients.max_connections:
            transport.close()
            return
        peer = transport.get_extra_info("peername")
        self.client = f"{peer[0]}:{peer[1]}".encode() if isinstance(peer, tuple) else b""
        self.clients.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.clients.connections.discard(self)
        if self.upstream is not None:
            self.upstream.close()

    def data_received(self, data: bytes) -> None:
        if self.waiting_since is None:  # piped
            self._to_node(data)
            return
        buffer = self.buffer
        buffer += data
        answer = self.clients.answerer.answer
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > MAX_HEAD:
                    self._pipe()  # the node refuses it as it refuses its own
                return
            wire = answer(bytes(buffer[:end]))
            if wire is None:
                self._pipe()
                return
            del buffer[: end + 4]
            self.transport.write(wire)  # type: ignore[union-attr]
            if not buffer:
                self.waiting_since = self.clients.loop.time()
                return

    def eof_received(self) -> bool | None:
        if self.upstream is not None:  # the client sent all it will: the node answers it still
            self.upstream.write_eof()
            return True
        return None

    def pause_writing(self) -> None:  # the client reads slower than it is answered
        (self.upstream or self.transport).pause_reading()  # type: ignore[union-attr]

    def resume_writing(self) -> None:
        (self.upstream or self.transport).resume_reading()  # type: ignore[union-attr]

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # -- the pipe to the node ---------------------------------------------------------
    def _pipe(self) -> None:
        self.waiting_since = None
        self.pending = [PREAMBLE % (self.clients.scheme, self.client), bytes(self.buffer)]
        self.pending_bytes = len(self.buffer)
        self.buffer = bytearray()
        self.clients.loop.create_task(self._connect())

    def _to_node(self, data: bytes) -> None:
        if self.upstream is not None:
            self.upstream.write(data)
            return
        assert self.pending is not None
        self.pending.append(data)
        self.pending_bytes += len(data)
        if self.pending_bytes > MAX_PENDING and self.transport is not None:
            self.transport.pause_reading()  # resumed once the pipe is open

    async def _connect(self) -> None:
        loop = self.clients.loop
        try:
            upstream, _ = await loop.create_unix_connection(
                lambda: _Upstream(self), self.clients.relay_path
            )
        except OSError as e:
            log.warning("cannot reach the node's relay socket: %s", e)
            error = ApiError("partition_unavailable", "the node is not answering", RETRY_AFTER)
            body = error.body()
            if self.transport is not None:
                head = sized_head(error.status, [JSON, *error.headers], len(body), True)
                self.transport.write(head + body)
            self.clients.answerer.stats.record("relayed", error.status, 0.0)
            self.close()
            return
        if self.transport is None or self.transport.is_closing():
            upstream.close()
            return
        self.upstream = upstream  # type: ignore[assignment]
        upstream.write(b"".join(self.pending or ()))
        self.pending = None
        self.transport.resume_reading()


class _Upstream(asyncio.Protocol):
    """The node's side of a piped client connection."""

    def __init__(self, client: ClientConnection) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        transport = self.client.transport
        if transport is not None:
            transport.write(data)

    def eof_received(self) -> bool | None:
        self.client.close()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()

    def pause_writing(self) -> None:  # the node reads slower than the client sends
        if self.client.transport is not None:
            self.client.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.client.transport is not None:
            self.client.transport.resume_reading()
