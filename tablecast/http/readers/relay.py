"""A read process's client connections: the plain key reads it answers itself, the other
requests it hands to its node one at a time, and a byte pipe to the node for what cannot be
handed over one request at a time.

The kernel hands a new connection to any socket listening on the node's port,
the node's or a read process's. A read process answers the requests it can
(:class:`~tablecast.http.readers.key_reads.Answerer`) in order. For one it
cannot, it opens a connection to the node's relay socket (a Unix socket only
this user may open; one per client connection, kept while the client keeps
asking), whose preamble line says who the client is and whether it came over
TLS, sends the request there, passes the node's answer back as it comes, and
takes the connection back once the answer is complete (httptools finds its
end: a length, or the last chunk). So a keep-alive connection that once asked
for another node's key, or for a range, still has its next plain read
answered here. The node serves the relayed requests as its own (routing, auth,
rate limits, errors, streams). A request after which the connection is not
one request after another any more (an upgrade, a close, a chunked body,
HEAD, ``Expect``; see :func:`~tablecast.http.readers.heads.relayed_body_length`)
turns the connection into a plain pipe to the node until either side closes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httptools

from tablecast.http.http1 import HEADER_TIMEOUT_S, MAX_HEAD, SWEEP_S
from tablecast.http.readers.heads import relayed_body_length
from tablecast.http.readers.key_reads import Answerer
from tablecast.query.answer_bytes import sized_head
from tablecast.query.errors import ApiError
from tablecast.query.kept_answers import JSON
from tablecast.query.local import RETRY_AFTER

log = logging.getLogger(__name__)

#: the relay's first line: the scheme the client used and its address
PREAMBLE = b"TABLECAST-RELAY %s %s\r\n"
#: bytes a client may send ahead while a request is with the node
MAX_PENDING = 4 << 20
#: a relay connection idle this long is closed by the read process, well before the node
#: would close it as waiting too long for a head (a request sent into that close is lost)
UPSTREAM_IDLE_S = HEADER_TIMEOUT_S / 2

#: what a client connection is doing
READING, RELAYING, PIPED = range(3)


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
        self.client = ""
        self.buffer = bytearray()
        #: how much of the buffer's start is known to hold no head's end: a head sent a few
        #: bytes at a time is searched once in all, not once per packet from its start
        self.scanned = 0
        self.state = READING
        #: since when it waits for a request's head (None: a request is with the node)
        self.waiting_since: float | None = clients.loop.time()
        #: the relayed request's body bytes still to pass to the node
        self.body_left = 0
        self.upstream: _Upstream | None = None
        self._idle: asyncio.TimerHandle | None = None
        #: the client does not read its answers as fast as they come (pause_writing)
        self.write_paused = False

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        if len(self.clients.connections) >= self.clients.max_connections:
            transport.close()
            return
        peer = transport.get_extra_info("peername")
        self.client = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else ""
        self.clients.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.clients.connections.discard(self)
        self._drop_upstream()

    def data_received(self, data: bytes) -> None:
        if self.state == PIPED:
            self._to_node(data)
            return
        self.buffer += data
        if self.state == RELAYING:
            if self.body_left:
                self._pass_body()
            if len(self.buffer) > MAX_PENDING:
                self.transport.pause_reading()  # type: ignore[union-attr]  # until it is answered
            return
        self._serve()

    def _serve(self) -> None:
        """Answer the buffered requests in order, until one goes to the node."""
        buffer = self.buffer
        answer = self.clients.answerer.answer
        while True:
            # an end that began in the part searched before would have been found then
            end = buffer.find(b"\r\n\r\n", max(0, self.scanned - 3))
            if end < 0:
                self.scanned = len(buffer)
                if len(buffer) > MAX_HEAD:
                    self._pipe()  # the node refuses it as it refuses its own
                return
            self.scanned = 0  # the head is taken off the buffer's start, found or relayed
            head = bytes(buffer[:end])
            wire = answer(head, self.client)
            if wire is None:
                self._relay(head, end + 4)
                return
            del buffer[: end + 4]
            self.transport.write(wire)  # type: ignore[union-attr]
            if not buffer:
                self.waiting_since = self.clients.loop.time()
                return

    def eof_received(self) -> bool | None:
        if self.state == READING:
            return None  # nothing with the node: close
        # the client sent all it will: the node gets it all, answers it in order, and closes
        self._pipe()
        assert self.upstream is not None
        self.upstream.write_eof()
        return True

    def pause_writing(self) -> None:  # the client reads slower than it is answered
        self.write_paused = True
        self.transport.pause_reading()  # type: ignore[union-attr]
        if self.upstream is not None:
            self.upstream.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        self.transport.resume_reading()  # type: ignore[union-attr]
        if self.upstream is not None:
            self.upstream.resume_reading()

    def resume_reading(self) -> None:
        """Read the client again (paused while a request was with the node, or while the
        relay connection opened), unless it is not reading its answers."""
        transport = self.transport
        if transport is not None and not transport.is_closing() and not self.write_paused:
            transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # -- requests for the node ------------------------------------------------------
    def _relay(self, head: bytes, head_end: int) -> None:
        """Hand the request at the buffer's start to the node, alone if it can go alone."""
        length = relayed_body_length(head)
        if length is None:
            self._pipe()
            return
        self.state = RELAYING
        self.waiting_since = None
        self.body_left = length
        request = bytes(self.buffer[:head_end])
        del self.buffer[:head_end]
        self._to_node(request, expect_answer=True)
        self._pass_body()

    def _pass_body(self) -> None:
        size = min(self.body_left, len(self.buffer))
        if size:
            self._to_node(bytes(self.buffer[:size]))
            del self.buffer[:size]
            self.body_left -= size

    def answered(self, keep_alive: bool) -> None:
        """The node's answer to the relayed request is all passed on: take the next."""
        if not keep_alive or self.body_left:
            # the node closes after it, or answered before reading the whole body (a 413):
            # what the client sends next is the node's to make sense of, or nobody's
            self._pipe()
            return
        self.state = READING
        self.waiting_since = self.clients.loop.time()
        if self.upstream is not None:
            self._idle = self.clients.loop.call_later(UPSTREAM_IDLE_S, self._drop_upstream)
        self.resume_reading()
        if self.buffer:
            self._serve()

    def _pipe(self) -> None:
        """Everything the client sent from the buffer's start on, and will send, goes to the
        node as it is, and everything the node sends back to the client, until one closes."""
        self.state = PIPED
        self.waiting_since = None
        data, self.buffer = bytes(self.buffer), bytearray()
        self._to_node(data)  # opens the relay connection if none is open

    def _to_node(self, data: bytes, expect_answer: bool = False) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        upstream = self.upstream
        if upstream is None:
            upstream = self.upstream = _Upstream(self)
            upstream.pending.append(PREAMBLE % (self.clients.scheme, self.client.encode()))
            self.clients.loop.create_task(upstream.connect(self.clients.relay_path))
        upstream.piped = self.state == PIPED
        if expect_answer:
            upstream.expect_answer()
        upstream.write(data)
        if upstream.pending_bytes > MAX_PENDING and self.transport is not None:
            self.transport.pause_reading()  # resumed once the relay connection is open

    def _drop_upstream(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        upstream, self.upstream = self.upstream, None
        if upstream is not None:
            upstream.close()

    def upstream_lost(self, upstream: _Upstream) -> None:
        """The node closed its side: mid-request that ends the client's connection as it
        would have ended a direct one; between requests the next one opens another."""
        if upstream is not self.upstream:
            return
        self.upstream = None
        if self.state != READING:
            self.close()

    def unreachable(self) -> None:
        log.warning("cannot reach the node's relay socket %s", self.clients.relay_path)
        error = ApiError("partition_unavailable", "the node is not answering", RETRY_AFTER)
        body = error.body()
        if self.transport is not None:
            head = sized_head(error.status, [JSON, *error.headers], len(body), True)
            self.transport.write(head + body)
        self.clients.answerer.stats.record("relayed", error.status, 0.0)
        self.close()


class _Upstream(asyncio.Protocol):
    """A client connection's relay connection to the node: its requests go there, and the
    node's answers come back through here, parsed only to find where each one ends."""

    def __init__(self, client: ClientConnection) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None
        #: written before the connection was open
        self.pending: list[bytes] = []
        self.pending_bytes = 0
        #: passing bytes both ways without looking (no answer's end to find)
        self.piped = False
        self.parser: httptools.HttpResponseParser | None = None
        self.complete = False
        self.keep_alive = False
        self.closed = False
        #: the client's end came before the connection was open
        self.eof = False

    async def connect(self, path: str) -> None:
        loop = self.client.clients.loop
        try:
            await loop.create_unix_connection(lambda: self, path)
        except OSError:
            if not self.closed:
                self.client.unreachable()
            return

    def connection_made(self, transport: Any) -> None:
        if self.closed:
            transport.close()
            return
        self.transport = transport
        transport.write(b"".join(self.pending))
        self.pending, self.pending_bytes = [], 0
        if self.eof:
            self.write_eof()
        self.client.resume_reading()

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)
        elif data:
            self.pending.append(data)
            self.pending_bytes += len(data)

    def write_eof(self) -> None:
        if self.transport is None:
            self.eof = True
        elif self.transport.can_write_eof():
            self.transport.write_eof()

    def expect_answer(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.complete = False

    def on_headers_complete(self) -> None:
        # asked here: once the message is complete the parser has moved on to the next
        self.keep_alive = self.parser is not None and self.parser.should_keep_alive()

    def on_message_complete(self) -> None:
        self.complete = True

    def data_received(self, data: bytes) -> None:
        client = self.client
        if client.transport is not None:
            client.transport.write(data)
        if self.piped or self.parser is None:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            # not an answer it can follow (an upgrade, a stray byte): a pipe from now on
            self.parser = None
            client._pipe()
            return
        if self.complete:
            self.parser = None
            client.answered(self.keep_alive)

    def eof_received(self) -> bool | None:
        return None  # closes it: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.client.upstream_lost(self)

    def pause_writing(self) -> None:  # the node reads slower than the client sends
        if self.client.transport is not None:
            self.client.transport.pause_reading()

    def resume_writing(self) -> None:
        self.client.resume_reading()

    def pause_reading(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None:
            self.transport.resume_reading()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()
