"""HTTP/1.1 served on the event loop's own thread (``serve --http-engine loop``).

granian parses HTTP in Rust on a thread of its own and hands each request to
the event loop: every answer wakes that thread again with a system call (a
quarter of a node's main thread under load, py-spy). This server parses with
httptools on the loop itself and writes answers straight to the socket; a
plain key read whose whole answer is kept (:mod:`tablecast.query.kept_answers`) is
answered while its headers are parsed, without a task. A request a client sends
again byte for byte is not parsed again: it is answered with the kept answer
its bytes got before while that is still kept, or goes on from its remembered
parse (:mod:`tablecast.http.repeated_requests`). Everything else runs
the same RSGI app as under granian, through the small subset of RSGI the app
uses (:class:`_Proto`).

A WebSocket upgrade (the watch route's) is handed to
:mod:`tablecast.http.http1_websocket`. Not served here: HTTP/2 (granian's;
an h2c upgrade gets 400). Requests of one connection are answered in order,
one at a time.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import ssl
from collections import deque
from collections.abc import AsyncIterator
from time import perf_counter
from typing import Any

import httptools

from tablecast.http import listen
from tablecast.http.http1_websocket import GOING_AWAY, WRITE_WAIT_S, WebSocket
from tablecast.http.repeated_requests import Parsed, RepeatedRequests
from tablecast.query.answer_bytes import head, sized_head
from tablecast.query.errors import ApiError
from tablecast.query.kept_answers import JSON, Entry
from tablecast.query.request import Scope, WebSocketScope

log = logging.getLogger(__name__)

#: a request's headers must arrive within this long, and an idle connection is closed after it
HEADER_TIMEOUT_S = 10.0
#: how often connections are checked for that
SWEEP_S = 1.0
#: bytes a request's line and headers may take (more is refused; a read chunk can hold
#: a whole request and the start of the next, so this is well over one chunk)
MAX_HEAD = 1 << 20
#: requests of one connection waiting their turn before it is read no further
MAX_QUEUED = 32
#: connections the kernel holds for us before we accept them (granian's too); it clamps this
#: to net.core.somaxconn (4096 by default since Linux 5.4). At 1024, 10,000 clients connecting
#: at once overflowed it (tens of thousands of ListenOverflows, measured) and the clients
#: dropped waited out SYN retries: seconds-long first requests, counted as timeouts
LISTEN_BACKLOG = 65_535
#: a port another socket listens on is looked at this often, this far apart, before a
#: node refuses it (the kernel kills a dead node's read processes, not at once)
OTHERS_CHECKS = 20
OTHERS_WAIT_S = 0.1
#: how long a stopping server waits for requests under way
STOP_GRACE_S = 5.0
#: body bytes buffered ahead of the app before the request is refused (the app's own
#: limit, MAX_BODY, is smaller: this only bounds what an app that never reads can hold)
MAX_BUFFERED = 2 << 20


def received_path(raw: bytes) -> str:
    """A request target's path as routes take it: percent-encoding kept (routes decode each
    part, so a key's %2F stays in the key), bytes that are not UTF-8 replaced."""
    return raw.decode("utf-8", "replace")


class _Headers(dict[str, str]):
    """Request headers by lower-case name (the first of repeated ones), as RSGI's."""


_Scope = Scope
_WebSocketScope = WebSocketScope


class _Stream:
    """A chunked response body the app writes as it goes (server-sent events)."""

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn

    def send_bytes(self, data: bytes) -> None:
        if data:
            self._conn.write(b"%x\r\n%s\r\n" % (len(data), data))

    def buffered(self) -> int:
        """Bytes written that the kernel has not taken yet: a watch's reader that does not
        keep up shows here (tablecast.live.sinks cuts it off by this)."""
        transport = self._conn.transport
        return 0 if transport is None else transport.get_write_buffer_size()


class _Proto:
    """One request's RSGI protocol object: its body in, its answer out."""

    def __init__(self, conn: _Connection, keep_alive: bool, head_only: bool = False) -> None:
        self._conn = conn
        self.keep_alive = keep_alive
        #: a HEAD request: the answer's headers say its length, no body follows
        self.head_only = head_only
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.complete = False
        self.arrived: asyncio.Event | None = None
        self.answered = False
        self.streaming = False

    # -- the body --------------------------------------------------------------
    def _feed(self, chunk: bytes | None) -> None:
        if chunk is None:
            self.complete = True
        else:
            self.chunks.append(chunk)
            self.buffered += len(chunk)
        if self.arrived is not None:
            self.arrived.set()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            while self.chunks:
                chunk = self.chunks.popleft()
                self.buffered -= len(chunk)
                yield chunk
            if self.complete:
                return
            self.arrived = asyncio.Event()
            await self.arrived.wait()

    def arrived_body(self) -> bytes | None:
        """The whole body, if all of it has arrived (most do with their head); None if not."""
        if not self.complete:
            return None
        body = b"".join(self.chunks)
        self.chunks.clear()
        self.buffered = 0
        return body

    async def client_disconnect(self) -> None:
        await asyncio.shield(self._conn.gone)

    # -- the answer ------------------------------------------------------------
    def response_bytes(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.response_lines(status, b"", body, headers)

    def response_lines(
        self, status: int, lines: bytes, body: bytes, headers: list[tuple[str, str]] | None = None
    ) -> None:
        """An answer whose headers come as their wire lines (a peer's: coalesce.py)."""
        if self.answered:
            return
        self.answered = True
        head = sized_head(status, headers or [], len(body), not self.keep_alive, lines)
        self._conn.write(head if self.head_only else head + body)  # one write: one system call

    def response_stream(self, status: int, headers: list[tuple[str, str]]) -> _Stream:
        self.answered = self.streaming = self._conn.streaming = True
        self.keep_alive = False  # a stream ends with its connection
        self._conn.write(head(status, headers, b"transfer-encoding: chunked\r\n"))
        return _Stream(self._conn)


class _Connection(asyncio.Protocol):
    def __init__(self, server: LoopServer, relayed: bool = False) -> None:
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.client = ""
        self.scheme = server.scheme
        #: piped from a read process (readers/relay.py): its first line says who the client is
        self.preamble: bytearray | None = bytearray() if relayed else None
        self.gone: asyncio.Future[None] = server.loop.create_future()
        self.url = b""
        self.headers = _Headers()
        self.proto: _Proto | None = None  # the request being parsed
        self.queue: deque[tuple[_Scope, _Proto]] = deque()  # waiting their turn
        self.busy = False
        #: reading stopped because too many requests wait their turn
        self.paused = False
        #: the client reads its answers slower than it asks: nothing more is read or started
        #: until the transport's buffer drains (it is bounded by the transport's high-water mark)
        self.write_blocked = False
        #: a check that drops the connection if its client reads nothing is scheduled
        self.stall_check = False
        #: the answer under way is a stream (it ends with the connection)
        self.streaming = False
        #: since when the connection waits for a request's headers (None: it does not)
        self.waiting_since: float | None = server.loop.time()
        #: bytes received while waiting for headers
        self.head_bytes = 0
        #: set while the transport takes more writes (cleared while its buffer is full)
        self.writable = asyncio.Event()
        self.writable.set()
        self.ws: WebSocket | None = None  # an upgraded connection's WebSocket
        self.ws_scope: _Scope | None = None
        self.ws_task: asyncio.Task[None] | None = None
        #: a short-path forward's peer, path, headers and start, until its answer comes
        self.forwarding: tuple[Any, str, _Headers, float] | None = None
        #: the parser is between requests: a chunk read now starts a request (or several)
        self.between = True
        #: the request being parsed or answered keeps the connection open after it
        self.keep_alive = True
        #: requests begun in the chunk being parsed
        self.begun = 0
        #: the parse of the request just parsed, if one to remember (repeated_requests.py)
        self.parsed: Parsed | None = None
        #: the kept answer it got
        self.kept: Entry | None = None
        #: or the app's plan it was forwarded on
        self.planned: Any = None
        #: the parser is parsing a chunk: a request whose head it parses starts once its
        #: message or the chunk is parsed, whichever comes first
        self.parsing = False
        #: a request waits for its message or the chunk to be parsed to start
        self.deferred = False

    # -- connection ------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if len(self.server.connections) >= self.server.max_connections:
            self.server.turned_away()
            transport.close()  # before it holds a file the node needs (stores, Kafka, peers)
            return
        peer = transport.get_extra_info("peername")
        self.client = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else ""
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.queue.clear()  # nobody to answer
        if not self.gone.done():
            self.gone.set_result(None)
        if self.proto is not None:
            self.proto._feed(None)
        if self.ws is not None:
            self.ws.connection_lost()
        self.writable.set()  # writers waiting for room find the connection gone

    def pause_writing(self) -> None:
        self.writable.clear()
        transport = self.transport
        if self.ws is not None or transport is None:
            return  # a WebSocket's writers wait for room themselves (drained)
        # a client that pipelines requests and reads no answers would make us buffer every
        # answer: read no more of its requests until it reads, and drop it if it never does
        self.write_blocked = True
        transport.pause_reading()
        if not self.stall_check and not self.streaming:
            # a stream's writer judges its reader itself (a watch cuts a slow one off and
            # ends its stream, which the client reads to its end to resume)
            self.stall_check = True
            self._drop_if_stalled(transport, -1)

    def resume_writing(self) -> None:
        self.writable.set()
        if not self.write_blocked:
            return
        self.write_blocked = False
        if self.transport is not None and not self.paused:
            self.transport.resume_reading()
        if not self.busy and self.queue:
            self._start()

    async def drained(self) -> None:
        """Wait while the transport's buffer is full (a WebSocket's writes wait for the client)."""
        await self.writable.wait()

    def data_received(self, data: bytes) -> None:
        if self.preamble is not None:
            data = self._after_preamble(data)
            if not data:
                return
        if self.ws is not None:
            self.ws.data_received(data)
            return
        fresh = self.between
        if fresh:  # a request seen before byte for byte: what it got, or how it parsed
            try:
                idle = not self.busy and not self.queue and not self.write_blocked
                if idle:
                    kept = self.server.app.kept_request(data)
                    if kept is not None:
                        self.write(kept.whole())
                        self.waiting_since = self.server.loop.time()
                        return
                parsed = self.server.repeated.get(data)
                if parsed is not None:  # as if the parser had just made it
                    plan = parsed.plan
                    if plan is not None and idle:
                        if self._forward(plan, parsed.path, parsed.headers):
                            return
                        self.server.repeated.plan(data, None)  # _headed decides again
                    self.headers = parsed.headers
                    self.kept = self.planned = None
                    self._headed(parsed.method, parsed.path, parsed.query, True)
                    self.on_message_complete()
                    if self.kept is not None:
                        self.server.app.keep_request(data, self.kept)
                    elif self.planned is not None:
                        self.server.repeated.plan(data, self.planned)
                    return
            except Exception:  # a bug here or in the app: a 500, and the connection closes
                log.exception("request failed")
                self.headers = _Headers()  # never the remembered one, which is shared
                self.refuse(ApiError("internal", "the request failed; the node's log says why"))
                return
        self.begun = 0
        try:
            # counted from the last complete head on (on_headers_complete starts it over): a
            # keep-alive connection's kept answers leave it waiting for a head after every
            # request, and counting every byte it ever sent refused it after 1 MiB of heads
            self.head_bytes += len(data)
            self.parsing = True
            try:
                self.parser.feed_data(data)
            finally:
                self.parsing = False
            if self.deferred:
                self._start_deferred()
            parsed = self.parsed
            if fresh and parsed is not None and self.begun == 1 and self.between:
                parsed.plan = self.planned
                self.server.repeated.remember(data, parsed)
                if self.kept is not None:
                    self.server.app.keep_request(data, self.kept)
            if self.waiting_since is None:
                self.head_bytes = 0  # in a body, or answering: no head is being waited for
            elif self.head_bytes > MAX_HEAD:
                self.refuse(ApiError("bad_request", "the request's headers are too large"))
        except httptools.HttpParserUpgrade as e:
            if self.deferred:  # a request before the upgrade is answered first
                self._start_deferred()
            if self.ws is None:
                only = "only a GET's WebSocket upgrade is served (h2c: --http-engine granian)"
                self.refuse(ApiError("bad_request", only))
            else:  # what followed the handshake is the WebSocket's
                if len(data) > e.args[0]:
                    self.ws.data_received(data[e.args[0] :])
                self._start_websocket()
        except httptools.HttpParserError:
            if self.deferred:  # the requests before the malformed one are answered first
                self._start_deferred()
            self.refuse(ApiError("bad_request", "malformed HTTP request"))

    def _after_preamble(self, data: bytes) -> bytes:
        """Take a relayed connection's first line (``TABLECAST-RELAY scheme client``);
        what follows it is the client's."""
        preamble = self.preamble
        assert preamble is not None
        preamble += data
        end = preamble.find(b"\r\n")
        if end < 0:
            if len(preamble) > 512:
                self.abort()
            return b""
        parts = bytes(preamble[:end]).decode("latin-1").split(" ")
        if len(parts) != 3 or parts[0] != "TABLECAST-RELAY":
            self.abort()
            return b""
        self.scheme, self.client = parts[1], parts[2]
        self.preamble = None
        return bytes(preamble[end + 2 :])

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def close(self) -> None:
        """Close once what is buffered is written; drop it if the client reads none of that
        for WRITE_WAIT_S (a stalled stream's reader would hold the connection for ever)."""
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.close()
            self._drop_if_stalled(transport, -1)

    def _drop_if_stalled(self, transport: asyncio.Transport, before: int) -> None:
        waiting = transport.get_write_buffer_size()
        if not waiting or self.gone.done():
            self.stall_check = False
            return
        if before != -1 and waiting >= before:  # nothing read since the last look
            transport.abort()
            return
        self.server.loop.call_later(WRITE_WAIT_S, self._drop_if_stalled, transport, waiting)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def refuse(self, error: ApiError) -> None:
        """The API's error answer, then the connection closes (its stream cannot go on)."""
        body = error.body()
        self.write(sized_head(error.status, [JSON], len(body), True) + body)
        self.close()

    # -- parsing -----------------------------------------------------------------
    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))

    def on_message_begin(self) -> None:
        self.between = False
        self.begun += 1
        self.parsed = self.kept = self.planned = None

    def on_message_complete(self) -> None:
        self.between = self.keep_alive
        if self.proto is not None:
            self.proto._feed(None)
            self.proto = None
        self.url = b""
        self.headers = _Headers()
        if self.deferred:  # its body is whole: it starts before the next request's head
            self._start_deferred()

    def on_headers_complete(self) -> None:
        method = self.parser.get_method().decode()
        raw_path, _, query = self.url.partition(b"?")
        path = received_path(raw_path)
        headers = self.headers
        if self.parser.should_upgrade():  # served once the parser stops on it (data_received)
            self.waiting_since = None
            self.head_bytes = 0
            self.keep_alive = False  # what follows is not a request
            websocket = headers.get("upgrade", "").lower() == "websocket"
            if websocket and method == "GET" and not self.busy and not self.queue:
                self.ws = WebSocket(self, self.url.decode("latin-1"), headers)
                self.ws_scope = self._scope(_WebSocketScope, method, path, query)
            return
        keep_alive = self.parser.should_keep_alive()
        if "expect" in headers:
            if headers["expect"].lower() == "100-continue":
                self.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # curl waits a second for it
        elif keep_alive and "content-length" not in headers and "transfer-encoding" not in headers:
            self.parsed = Parsed(method, path, query, headers)
        self._headed(method, path, query, keep_alive)

    def _headed(self, method: str, path: str, query: bytes, keep_alive: bool) -> None:
        """Go on with a request whose head is parsed (its headers in self.headers)."""
        self.waiting_since = None
        self.head_bytes = 0
        self.keep_alive = keep_alive
        if (
            keep_alive
            and not self.busy
            and not self.queue
            and not self.write_blocked
            and method == "GET"
            and not query
        ):
            kept = self.server.app.kept(path, self.headers)
            if kept is not None:  # the hot path: no request objects, no task
                self.write(kept.whole())
                self.kept = kept
                self.proto = None
                self.waiting_since = self.server.loop.time()
                return
            plan = self.server.app.forward_plan(path, self.headers)
            # a plain read of a peer's partition: no task either
            if plan is not None and self._forward(plan, path, self.headers):
                self.planned = plan  # the same bytes again go the same way
                return
        proto = _Proto(self, keep_alive, method == "HEAD")
        scope = self._scope(_Scope, method, path, query)
        self.proto = proto
        self.queue.append((scope, proto))
        if not self.busy and not self.write_blocked:
            if self.parsing:
                # once its whole message or the chunk is parsed: a body that came with its
                # head (a peer's batch does) is then whole, and is answered without a wait
                self.deferred = True
            else:
                self._start()
        elif len(self.queue) >= MAX_QUEUED and self.transport is not None:
            self.paused = True  # a client that pipelines without reading waits for us
            self.transport.pause_reading()

    def _forward(self, plan: Any, path: str, headers: _Headers | dict[str, str]) -> bool:
        """Send the plain read of `path` being answered on the app's short path of
        forwards (`plan`); False, and nothing sent, when the app's usual way must take it."""
        started = perf_counter()
        member = self.server.app.forward(plan, self)
        if member is None:
            return False
        self.waiting_since = None
        self.head_bytes = 0
        self.keep_alive = True
        self.proto = None
        self.busy = True
        # the next request's headers replace these before the answer comes
        self.forwarding = (member, path, headers, started)
        return True

    def _scope(self, kind: type[_Scope], method: str, path: str, query: bytes) -> _Scope:
        return kind(method, path, query.decode("latin-1"), self.headers, self.client, self.scheme)

    def on_body(self, body: bytes) -> None:
        proto = self.proto
        if proto is not None:
            proto._feed(body)
            if proto.buffered > MAX_BUFFERED:
                self.refuse(ApiError("payload_too_large", "the body is too large"))

    def _start_websocket(self) -> None:
        assert self.ws is not None and self.ws_scope is not None
        malformed = self.ws.malformed()
        if malformed is not None:
            self.refuse(malformed)
            return
        self.waiting_since = None  # a watch's keep-alive messages keep it open, not requests
        self.ws_task = self.server.loop.create_task(self.server.app(self.ws_scope, self.ws))
        self.ws_task.add_done_callback(self._websocket_done)

    def _websocket_done(self, task: asyncio.Task[None]) -> None:
        ws = self.ws
        assert ws is not None
        if not task.cancelled() and task.exception() is not None:
            log.error("WebSocket failed", exc_info=task.exception())
        if not ws.answered:  # the app neither accepted nor refused it
            ws.close(500)
        else:
            ws.close(1011 if task.cancelled() or task.exception() else 1000)

    # -- answering in order ------------------------------------------------------
    def answered(self, status: int, wire: bytes) -> None:
        """A short-path forward's answer (query/short_path.py): the peer's whole response,
        written as it came; one it could not give (503) goes the router's way."""
        forwarding = self.forwarding
        if forwarding is None:
            return
        if status == 503:
            self._forward_failed(forwarding)
            return
        self.forwarding = None
        self.write(wire)
        self.server.app.forwarded(status, forwarding[3])
        self.busy = False
        if self._goes_on(True):
            self._start()

    def unanswered(self, error: Exception) -> None:
        """A short-path forward its peer did not answer: the router's way."""
        if self.forwarding is not None:
            self._forward_failed(self.forwarding)

    def _forward_failed(self, forwarding: tuple[Any, str, _Headers, float]) -> None:
        self.forwarding = None
        member, path, headers, started = forwarding
        proto = _Proto(self, True)
        scope = _Scope("GET", path, "", headers, self.client, self.scheme)
        try:
            rest = self.server.app.forward_failed(scope, proto, member, started)
        except Exception:
            log.exception("request failed")
            rest = None
        if rest is None:
            self._finished(None, proto)
            return
        task = self.server.loop.create_task(rest)
        task.add_done_callback(lambda t: self._finished(t, proto))

    def _start_deferred(self) -> None:
        self.deferred = False
        if not self.busy and not self.write_blocked and self.queue:
            self._start()

    def _start(self) -> None:
        """Start the queued requests in turn while each is answered at once (most reads are),
        in a loop rather than a call per request: a client may pipeline thousands in one
        chunk. One that a task or a future answers starts the next as it ends."""
        while True:
            scope, proto = self.queue.popleft()
            self.busy = True
            if self.paused and len(self.queue) < MAX_QUEUED // 2 and self.transport is not None:
                self.paused = False
                if not self.write_blocked:
                    self.transport.resume_reading()
            try:
                rest = self.server.app.begin(scope, proto)
            except Exception:
                log.exception("request failed")
                rest = None
            if rest is not None:
                self._answer_later(rest, proto)
                return
            self._ended(None, proto)  # answered already: most reads
            if not self._goes_on(proto.keep_alive):
                return

    def _answer_later(self, rest: Any, proto: _Proto) -> None:
        if isinstance(rest, asyncio.Future):  # answered by its own callback (a forwarded read)
            rest.add_done_callback(lambda _: self._finished(None, proto))
            return
        task = self.server.loop.create_task(rest)
        task.add_done_callback(lambda t: self._finished(t, proto))

    def _finished(self, task: asyncio.Task[None] | None, proto: _Proto) -> None:
        self._ended(task, proto)
        if self._goes_on(proto.keep_alive):
            self._start()

    def _ended(self, task: asyncio.Task[None] | None, proto: _Proto) -> None:
        """A request's answer is complete: a 500 if it gave none, a stream's last chunk."""
        self.busy = False
        if task is not None and not task.cancelled() and task.exception() is not None:
            log.error("request failed", exc_info=task.exception())
        if not proto.answered:
            failed = ApiError("internal", "the request failed; the node's log says why")
            proto.response_bytes(failed.status, [JSON], failed.body())
        elif proto.streaming:
            self.write(b"0\r\n\r\n")

    def _goes_on(self, keep_alive: bool) -> bool:
        """After an answer, whether the next queued request starts now; if not, the connection
        closes, waits for its writes to drain (resume_writing starts it), or waits for the
        next request's headers (or the rest of an unread body) within the timeout."""
        if not keep_alive:
            self.close()
            return False
        if not self.queue:
            self.waiting_since = self.server.loop.time()
            return False
        return not self.write_blocked


class LoopServer:
    """Serve `app` on host:port from this event loop: an
    :class:`~tablecast.http.app.HttpApp`, of which it calls ``kept`` (a plain key read's
    kept answer, before a request object is made), ``kept_request`` and ``keep_request``
    (that answer by the request's bytes), ``forward_plan`` and ``forward`` (the short
    path to a peer) and ``begin`` (everything else)."""

    def __init__(
        self, app: Any, ssl_context: ssl.SSLContext | None = None, max_connections: int = 100_000
    ) -> None:
        self.app = app
        #: connections served at once; more are closed as they come
        self.max_connections = max_connections
        self._warned = float("-inf")
        self.ssl = ssl_context
        self.scheme = "https" if ssl_context else "http"
        self.loop = asyncio.get_running_loop()
        self.connections: set[_Connection] = set()
        self.repeated = RepeatedRequests()
        self._servers: list[asyncio.base_events.Server] = []
        self._relays: list[asyncio.base_events.Server] = []
        self._sweeper: asyncio.TimerHandle = self.loop.call_later(SWEEP_S, lambda: None)

    async def start(
        self,
        host: str,
        port: int,
        backlog: int = LISTEN_BACKLOG,
        listeners: int | None = None,
        share: bool = False,
    ) -> None:
        """Listen on host:port with `listeners` sockets sharing it (by default as many as
        :func:`~tablecast.http.listen.listeners_for` this backlog); `share`: other
        processes of this node's will listen on it too (its read processes)."""
        if listeners is None:
            listeners = listen.listeners_for(backlog)
        # one socket binds as it always has, exclusively
        shared = listeners > 1 or share or None
        try:
            for _ in range(listeners):
                server = await self.loop.create_server(
                    lambda: _Connection(self),
                    host,
                    port,
                    ssl=self.ssl,
                    backlog=backlog,
                    reuse_port=shared,
                )
                self._servers.append(server)
                port = self.port  # port 0: the others bind the port the first one got
            if shared and await self._others_stay(port):
                raise OSError(errno.EADDRINUSE, f"another process listens on port {port} too")
        except OSError:
            for server in self._servers:
                server.close()
            raise
        self._sweep()

    async def _others_stay(self, port: int) -> bool:
        """Whether another socket listens on `port` beside ours, and goes on doing so for
        a moment: the read processes of a node killed just before still exit."""
        for _ in range(OTHERS_CHECKS):
            if not listen.others_listening(port, self._inodes()):
                return False
            await asyncio.sleep(OTHERS_WAIT_S)
        return True

    async def start_relay(self, path: str) -> None:
        """Also serve connections piped from this node's read processes, on a Unix socket
        only this user may open (the preamble it trusts names the client)."""
        server = await self.loop.create_unix_server(lambda: _Connection(self, True), path)
        os.chmod(path, 0o600)
        self._relays.append(server)

    @property
    def listeners(self) -> int:
        return len(self._servers)

    @property
    def port(self) -> int:
        """The port listened on."""
        return int(self._servers[0].sockets[0].getsockname()[1])

    def _inodes(self) -> set[int]:
        return {os.fstat(s.fileno()).st_ino for server in self._servers for s in server.sockets}

    def turned_away(self) -> None:
        now = self.loop.time()
        if now - self._warned > 60:  # once a minute, not once per connection
            self._warned = now
            log.warning("%d connections open: new ones are closed", self.max_connections)

    def _sweep(self) -> None:
        """Close connections that waited for headers too long (one timer, not one per request)."""
        limit = self.loop.time() - HEADER_TIMEOUT_S
        for conn in [c for c in self.connections if (c.waiting_since or limit) < limit]:
            conn.close()
        self._sweeper = self.loop.call_later(SWEEP_S, self._sweep)

    async def stop(self) -> None:
        """Take no new connections, give requests under way a moment, close the rest."""
        self._sweeper.cancel()
        for server in self._servers + self._relays:
            server.close()
        for conn in self.connections:
            if conn.ws is not None:
                conn.ws.close(GOING_AWAY)
        deadline = self.loop.time() + STOP_GRACE_S
        while any(c.busy for c in self.connections) and self.loop.time() < deadline:
            await asyncio.sleep(0.05)
        for conn in list(self.connections):
            conn.close()
