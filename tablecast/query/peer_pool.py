"""Pooled keep-alive HTTP/1.1 connections to the other nodes, for forwarding.

Forwarding sits on the hot path of every query a node does not own, so it
uses plain asyncio transports and httptools' parser (the one uvicorn uses)
instead of a general-purpose client: a pooled connection costs one write and
one parse per request. Peers are tablecast nodes, which always answer with a
Content-Length, so nothing else needs to be understood.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import ssl
from collections.abc import Callable, Iterable
from urllib.parse import unquote, urlsplit

import httptools

from tablecast.cluster.signing import Signer
from tablecast.query.errors import ApiError

#: the header that carries a peer's signature of an internal call (see :func:`signed_parts`)
SIGNATURE = "x-tablecast-signature"
#: a pooled connection idle longer is not reused: nodes close keep-alive connections idle
#: for 10 s (process.HEADER_TIMEOUT_MS), and one closing as a request goes out would fail it
MAX_IDLE_S = 5.0

#: status, headers (names in lower case, latin-1 text as HTTP sends it), body
Response = tuple[int, list[tuple[str, str]], bytes]

#: what may not stand in a header line sent to a peer
_UNSAFE_IN_HEADERS = re.compile(r"[\x00\r\n]").search


class PeerHosts:
    """The addresses the cluster's nodes call from, as far as their URLs tell: without the
    cluster secret, what a forwarded request says of its caller is believed only from these.

    A URL's host that is a name is resolved off the event loop when the members change;
    until then its node's requests are counted by their own address, as any client's.
    """

    def __init__(self, urls: Callable[[], Iterable[str]]) -> None:
        self._urls = urls
        self._seen: frozenset[str] = frozenset()
        self._hosts: frozenset[str] = frozenset()
        self._resolving: asyncio.Future[None] | None = None

    def holds(self, host: str) -> bool:
        urls = frozenset(self._urls())
        if urls != self._seen:
            self._seen = urls
            self._refresh(urls)
        return host in self._hosts

    def _refresh(self, urls: frozenset[str]) -> None:
        literal, names = set(), set()
        for url in urls:
            host = urlsplit(url).hostname or ""
            try:
                literal.add(str(ipaddress.ip_address(host)))
            except ValueError:
                names.add(host)
        self._hosts = frozenset(literal)
        if names:
            loop = asyncio.get_running_loop()
            self._resolving = loop.run_in_executor(None, self._resolve, names, urls)

    def _resolve(self, names: set[str], urls: frozenset[str]) -> None:
        found = set()
        for name in names:
            try:
                found.update(str(a[4][0]) for a in socket.getaddrinfo(name, None))
            except OSError:
                continue
        if urls == self._seen:  # else the members changed meanwhile: a newer lookup runs
            self._hosts = self._hosts | found


class PeerUnavailable(Exception):
    """The peer could not be reached or did not answer in time."""


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[Response] | None = None
        self.headers: list[tuple[str, str]] = []
        self.body: list[bytes] = []
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(PeerUnavailable(f"bad response: {e}"))

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower().decode("latin-1"), value.decode("latin-1")))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        waiter, self.waiter = self.waiter, None
        answer = (self.parser.get_status_code(), self.headers, b"".join(self.body))
        self.headers, self.body = [], []
        if not self.parser.should_keep_alive():
            self.close()
        if waiter is not None and not waiter.done():
            waiter.set_result(answer)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(PeerUnavailable("connection closed"))

    def _fail(self, exc: Exception) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def signed_parts(method: str, target: str, body: bytes) -> tuple[bytes, bytes, bytes]:
    """What a signature covers: the method, the decoded path with its query, the body.

    Decoded, because the receiving server sees the path decoded: both ends must
    sign the same bytes.
    """
    path, sep, query = target.partition("?")
    return method.encode(), (unquote(path) + sep + query).encode(), body


def received_parts(method: str, path: str, query: str, body: bytes) -> tuple[bytes, bytes, bytes]:
    """What a signature covers, as the receiver has the request (its path as received,
    :class:`~tablecast.query.request.Scope`): decoded once, as the sender signed it."""
    path = unquote(path) if "%" in path else path
    return method.encode(), (path + "?" + query if query else path).encode(), body


class PeerPool:
    """Idle connections per peer, reused across requests (keep-alive).

    Peers with an ``https://`` URL are called over TLS, verified against
    `ssl_context` (the cluster's CA); with a cluster secret every call is signed.
    """

    def __init__(
        self,
        max_idle_per_peer: int = 64,
        ssl_context: ssl.SSLContext | None = None,
        signer: Signer | None = None,
    ) -> None:
        #: per peer, idle connections and when each went idle (monotonic)
        self._idle: dict[tuple[str, int, bool], list[tuple[_Connection, float]]] = {}
        self._peers: dict[str, tuple[str, int, bool]] = {}
        self._max_idle = max_idle_per_peer
        self._ssl = ssl_context
        self._signer = signer if signer is not None and signer.enabled else None

    async def request(
        self,
        base_url: str,
        method: str,
        target: str,
        headers: list[tuple[str, str]],
        body: bytes = b"",
        timeout: float = 2.0,
    ) -> Response:
        peer = self._peers.get(base_url)
        if peer is None:
            parts = urlsplit(base_url)
            tls = parts.scheme == "https"
            port = parts.port or (443 if tls else 80)
            peer = self._peers[base_url] = (parts.hostname or "127.0.0.1", port, tls)
        host, port, tls = peer
        head = (
            f"{method} {target} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-length: {len(body)}\r\n"
        )
        lines = "".join(f"{k}: {v}\r\n" for k, v in headers)
        if _UNSAFE_IN_HEADERS(lines.replace("\r\n", "")):
            # what a client sent goes on in these headers: never a line of its own making
            raise ApiError("bad_request", "a header holds a control character")
        head += lines
        if self._signer is not None:
            head += f"{SIGNATURE}: {self._signer.sign(*signed_parts(method, target, body))}\r\n"
        try:
            raw = (head + "\r\n").encode("latin-1") + body
        except UnicodeEncodeError:
            raise ApiError("bad_request", "a header is not Latin-1") from None
        loop = asyncio.get_running_loop()
        conn: _Connection | None = None
        waiter = loop.create_future()
        # a timer, not asyncio.timeout(): this runs once per forwarded request
        timer = loop.call_later(timeout, _expire, waiter)
        try:
            conn = self._idle_connection(peer)
            if conn is None:
                try:
                    async with asyncio.timeout(timeout):  # a peer dropping packets: not minutes
                        conn = await self._connect(peer)
                except TimeoutError:
                    raise PeerUnavailable("no connection in time") from None
            conn.waiter = waiter
            assert conn.transport is not None
            conn.transport.write(raw)
            answer = await waiter
        except (OSError, TimeoutError, PeerUnavailable) as e:
            if conn is not None:
                conn.close()  # a late answer must never reach the next request
            if waiter.done():
                waiter.exception()  # its timer's, if it fired before the connection failed
            raise PeerUnavailable(f"{base_url}: {e or type(e).__name__}") from None
        finally:
            timer.cancel()
        if not conn.closed:
            idle = self._idle.setdefault(peer, [])
            if len(idle) < self._max_idle:
                idle.append((conn, loop.time()))
            else:
                conn.close()
        return answer

    def _idle_connection(self, peer: tuple[str, int, bool]) -> _Connection | None:
        idle = self._idle.get(peer)
        if idle:
            fresh_since = asyncio.get_running_loop().time() - MAX_IDLE_S
            while idle:
                conn, since = idle.pop()  # the most recently used first
                if not conn.closed and since > fresh_since:
                    return conn
                conn.close()
        return None

    async def _connect(self, peer: tuple[str, int, bool]) -> _Connection:
        loop = asyncio.get_running_loop()
        host, port, tls = peer
        if tls:
            context = self._ssl or ssl.create_default_context()
            _, conn = await loop.create_connection(
                _Connection, host, port, ssl=context, server_hostname=host
            )
        else:
            _, conn = await loop.create_connection(_Connection, host, port)
        return conn

    def close(self) -> None:
        for conns in self._idle.values():
            for conn, _ in conns:
                conn.close()
        self._idle.clear()


def _expire(waiter: asyncio.Future[Response]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError("no answer in time"))
