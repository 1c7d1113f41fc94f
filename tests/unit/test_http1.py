"""The event loop's HTTP/1.1 and WebSocket server (http/http1.py, http1_websocket.py), over
real sockets, with a small app in place of the node's (the node's own routes run on it in
tests/integration: test_serving.py on both engines, the rest on the default)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import select
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tablecast.http import http1, http1_websocket, listen
from tablecast.http.http1 import LoopServer
from tablecast.query.answer_bytes import kept_alive
from tests.support.ws import WebSocket

JSON = [("content-type", "application/json")]


class Kept:
    def __init__(self, body: bytes) -> None:
        self.headers = [*JSON, ("x-kept", "1")]
        self.body = body
        self.wire: bytes | None = None

    def whole(self) -> bytes:
        if self.wire is None:
            self.wire = kept_alive(200, self.headers, self.body)
        return self.wire


class App:
    """Answers /echo (the body back), /slow (after a sleep), /stream (three chunks),
    /boom (raises); everything else now, with the path and query it saw."""

    def __init__(self) -> None:
        self.kept_paths = {"/kept": Kept(b'{"kept":true}'), "/kept1k": Kept(b"k" * 1000)}
        #: whole requests answered with a kept answer, as the node's kept answers hold them
        self.kept_requests: dict[bytes, Kept] = {}
        self.paths_seen: list[str] = []  # paths of the requests that reached begin()
        self.broken = False  # kept() of /kept-boom raises
        self.websockets = 0  # WebSockets the app was called for
        self.flood_ended: Exception | None = None
        self.forwards = 0  # reads sent on the short path of forwards
        self.plans_asked = 0  # calls of forward_plan
        self.forwarding = True

    def kept(self, path: str, headers: Any) -> Kept | None:
        if path == "/kept-boom" and self.broken:
            raise RuntimeError("a bug")
        return self.kept_paths.get(path)

    def kept_request(self, request: bytes) -> Kept | None:
        kept = self.kept_requests.get(request)
        # as the node's: only while that answer is still the path's
        return kept if kept is not None and kept in self.kept_paths.values() else None

    def keep_request(self, request: bytes, kept: Kept) -> None:
        self.kept_requests[request] = kept

    def forward_plan(self, path: str, headers: Any) -> str | None:
        self.plans_asked += 1
        return path if path.startswith("/fwd/") else None

    def forward(self, path: str, sink: Any) -> str | None:
        """/fwd/ok: a peer's answer after 10 ms; /fwd/fail: no answer (then forward_failed);
        none sent while `forwarding` is off."""
        if not self.forwarding:
            return None
        self.forwards += 1
        loop = asyncio.get_running_loop()
        if path == "/fwd/ok":
            wire = b"HTTP/1.1 200 OK\r\nx-peer: 1\r\ncontent-length: 13\r\n\r\nfrom the peer"
            loop.call_later(0.01, sink.answered, 200, wire)
        else:
            loop.call_soon(sink.unanswered, ConnectionError("the peer is gone"))
        return "peer-1"

    def forwarded(self, status: int, started: float) -> None:
        pass

    def forward_failed(self, scope: Any, proto: Any, failed: str, started: float) -> Any:
        return self._slow(proto, f"{failed} failed {scope.path}".encode())

    def begin(self, scope: Any, proto: Any) -> Awaitable[None] | None:
        self.paths_seen.append(scope.path)
        kept = self.kept(scope.path, scope.headers)  # as the node's app: kept answers first
        if kept is not None:
            proto.response_bytes(200, kept.headers, kept.body)
            return None
        if scope.path == "/echo":
            return self._echo(proto)
        if scope.path == "/slow":
            return self._slow(proto)
        if scope.path == "/stream":
            return self._stream(proto)
        if scope.path == "/bigstream":  # 8 MB at once, then the stream ends
            out = proto.response_stream(200, [("content-type", "text/event-stream")])
            for _ in range(800):
                out.send_bytes(b"x" * 10_000)
            return None
        if scope.path == "/boom":
            raise RuntimeError("a bug")
        if scope.path == "/whole":  # the body if all of it is there as the request starts
            body = proto.arrived_body()
            proto.response_bytes(200, JSON, b"not arrived" if body is None else body)
            return None
        if scope.path == "/1k":  # the app's answer, not a kept one
            proto.response_bytes(200, JSON, b"a" * 1000)
            return None
        seen = f"{scope.method} {scope.path} ?{scope.query_string} {scope.headers.get('x-a')}"
        proto.response_bytes(200, JSON, seen.encode())
        return None

    async def __call__(self, scope: Any, proto: Any) -> None:
        """WebSockets: /ws/refuse is refused with 403; the rest echo each message until closed."""
        assert scope.proto == "ws"
        self.websockets += 1
        if scope.path == "/ws/refuse":
            proto.close(403)
            return
        if scope.path == "/ws/late":  # a slow auth check before accepting
            await asyncio.sleep(0.5)
        transport = await proto.accept()
        if scope.path == "/ws/flood":  # messages until the server gives up on the client
            try:
                while True:
                    await transport.send_str("x" * 10_000)
            except ConnectionError as e:
                self.flood_ended = e
            return
        while (message := await transport.receive()).kind != 0:
            await transport.send_str(
                f'{{"echo": "{message.data}", "query": "{scope.query_string}"}}'
            )

    async def _echo(self, proto: Any) -> None:
        proto.response_bytes(200, JSON, b"".join([c async for c in proto]))

    async def _slow(self, proto: Any, answer: bytes = b"slow") -> None:
        await asyncio.sleep(0.01)
        proto.response_bytes(200, JSON, answer)

    async def _stream(self, proto: Any) -> None:
        out = proto.response_stream(200, [("content-type", "text/event-stream")])
        for i in range(3):
            out.send_bytes(b"data: %d\n\n" % i)
            await asyncio.sleep(0)


def _run(check: Callable[[int], Awaitable[None]], apps: list[App] | None = None) -> None:
    async def main() -> None:
        app = App()
        if apps is not None:
            apps.append(app)
        server = LoopServer(app)
        await server.start("127.0.0.1", 0)
        port = server.port
        try:
            await asyncio.wait_for(check(port), 10)
        finally:
            await server.stop()

    asyncio.run(main())


async def _exchange(port: int, raw: bytes) -> bytes:
    """Send `raw`, then read until the server closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    data = await reader.read()
    writer.close()
    return data


def _responses(data: bytes) -> list[tuple[int, bytes]]:
    """(status, body) of each response with a content-length, in order."""
    out = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        length = int(
            next(v for k, _, v in (x.partition(b": ") for x in lines[1:]) if k == b"content-length")
        )
        out.append((int(lines[0].split()[1]), rest[:length]))
        data = rest[length:]
    return out


def test_requests_of_one_connection_are_answered_in_order_also_when_pipelined() -> None:
    async def check(port: int) -> None:
        raw = (
            b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n"
            b"GET /a%2Fb/%41?q=1 HTTP/1.1\r\nhost: x\r\nX-A: first\r\nx-a: second\r\n\r\n"
            b"GET /kept HTTP/1.1\r\nhost: x\r\n\r\n"
            b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhello"
            b"GET /kept HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        )
        assert _responses(await _exchange(port, raw)) == [
            (200, b"slow"),
            # the path as sent (routes decode its parts), the first of repeated headers
            (200, b"GET /a%2Fb/%41 ?q=1 first"),
            (200, b'{"kept":true}'),
            (200, b"hello"),
            (200, b'{"kept":true}'),
        ]

    _run(check)


def test_forwarded_reads_are_answered_in_order_among_the_others() -> None:
    """A read forwarded on the short path holds its connection's place: pipelined requests
    behind it wait (and go the app's usual way, begin); a forward the peer did not answer
    goes the app's other way (forward_failed)."""

    async def check(port: int) -> None:
        raw = (
            b"GET /fwd/ok HTTP/1.1\r\nhost: x\r\n\r\n"
            b"GET /kept HTTP/1.1\r\nhost: x\r\n\r\n"
            b"GET /fwd/fail HTTP/1.1\r\nhost: x\r\n\r\n"
            b"GET /fwd/ok HTTP/1.1\r\nhost: x\r\n\r\n"
            b"GET /kept HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        )
        data = await _exchange(port, raw)
        assert _responses(data) == [
            (200, b"from the peer"),
            (200, b'{"kept":true}'),
            (200, b"GET /fwd/fail ? None"),
            (200, b"GET /fwd/ok ? None"),
            (200, b'{"kept":true}'),
        ]
        assert data.count(b"x-peer: 1\r\n") == 1
        raw = b"GET /fwd/fail HTTP/1.1\r\nhost: x\r\n\r\nGET /fwd/ok HTTP/1.1\r\nhost: x\r\n"
        data = await _exchange(port, raw + b"connection: close\r\n\r\n")
        assert _responses(data) == [(200, b"peer-1 failed /fwd/fail"), (200, b"GET /fwd/ok ? None")]

    _run(check)


def test_a_kept_answer_is_written_whole_and_remembered() -> None:
    apps: list[App] = []

    async def check(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /kept HTTP/1.1\r\nhost: x\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"x-kept: 1\r\n" in head
        assert await reader.readexactly(13) == b'{"kept":true}'
        writer.close()
        [app] = apps
        assert app.kept_paths["/kept"].wire == head + b'{"kept":true}'

    _run(check, apps)


def _begun(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Requests the parser has begun (one element each)."""
    begun: list[int] = []
    original = http1._Connection.on_message_begin

    def counted(self: Any) -> None:
        begun.append(1)
        original(self)

    monkeypatch.setattr(http1._Connection, "on_message_begin", counted)
    return begun


async def _asker(
    port: int, raw: bytes
) -> tuple[Callable[[], Awaitable[bytes]], asyncio.StreamWriter]:
    """A call that sends `raw` on a connection of its own and gives its answer's body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def ask() -> bytes:
        writer.write(raw)
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
        return await reader.readexactly(length)

    return ask, writer


def test_a_request_sent_again_byte_for_byte_is_not_parsed_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    begun = _begun(monkeypatch)
    apps: list[App] = []
    raw = b"GET /a?x=1 HTTP/1.1\r\nhost: x\r\nx-a: 1\r\n\r\n"
    other = raw.replace(b"/a?", b"/b?")

    async def check(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for request, seen in [(raw, b"/a"), (raw, b"/a"), (other, b"/b"), (raw, b"/a")]:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 OK\r\n")
            assert await reader.readexactly(len(b"GET /a ?x=1 1")) == b"GET " + seen + b" ?x=1 1"
        writer.close()
        [app] = apps
        assert app.paths_seen == ["/a", "/a", "/b", "/a"]  # each reached the app as parsed

    _run(check, apps)
    assert len(begun) == 2  # the first of each; the rest went on from their parse


def test_a_kept_answer_s_request_sent_again_is_answered_while_it_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    begun = _begun(monkeypatch)
    apps: list[App] = []
    raw = b"GET /kept HTTP/1.1\r\nhost: x\r\n\r\n"

    async def check(port: int) -> None:
        ask, writer = await _asker(port, raw)
        assert await ask() == b'{"kept":true}'
        [app] = apps
        assert list(app.kept_requests) == [raw]
        assert [await ask() for _ in range(3)] == [b'{"kept":true}'] * 3
        assert len(begun) == 1 and app.paths_seen == []  # neither parsed nor begun again
        app.kept_paths["/kept"] = Kept(b'{"kept":"anew"}')  # the old answer is kept no more
        assert await ask() == b'{"kept":"anew"}'
        assert await ask() == b'{"kept":"anew"}'
        writer.close()

    _run(check, apps)


def test_a_forwarded_request_sent_again_goes_the_same_way_unparsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Neither parsed nor looked up again while the app forwards it on the same plan; when
    the app sends it no more that way, the usual way."""
    begun = _begun(monkeypatch)
    apps: list[App] = []
    raw = b"GET /fwd/ok HTTP/1.1\r\nhost: x\r\n\r\n"

    async def check(port: int) -> None:
        ask, writer = await _asker(port, raw)
        assert [await ask() for _ in range(3)] == [b"from the peer"] * 3
        [app] = apps
        assert (len(begun), app.plans_asked, app.forwards) == (1, 1, 3)
        app.forwarding = False
        assert [await ask() for _ in range(2)] == [b"GET /fwd/ok ? None"] * 2
        assert app.paths_seen == ["/fwd/ok"] * 2 and app.plans_asked == 3
        app.forwarding = True
        assert [await ask() for _ in range(2)] == [b"from the peer"] * 2
        # planned again once, then sent on that plan
        assert (len(begun), app.plans_asked, app.forwards) == (1, 4, 5)
        writer.close()

    _run(check, apps)


@pytest.mark.parametrize(
    "chunks",
    [
        # two requests in one chunk, and a request in two
        [b"GET /a HTTP/1.1\r\nhost: x\r\n\r\nGET /b HTTP/1.1\r\nhost: x\r\n\r\n"],
        [b"GET /a HTTP/1.1\r\nho", b"st: x\r\n\r\n"],
        # a body, an expect, a connection that closes after it
        [b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nab"],
        [b"GET /a HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\n\r\n"],
        [b"GET /a HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"],
        [b"GET /a HTTP/1.0\r\nhost: x\r\n\r\n"],
    ],
)
def test_only_a_chunk_of_one_whole_plain_request_is_remembered(chunks: list[bytes]) -> None:
    servers: list[LoopServer] = []

    async def main() -> None:
        server = LoopServer(App())
        servers.append(server)
        await server.start("127.0.0.1", 0)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            for chunk in chunks:
                writer.write(chunk)
                await writer.drain()
                await asyncio.sleep(0.05)  # read apart
            writer.write(b"GET /last HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            data = await asyncio.wait_for(reader.read(), 5)
            answers = _responses(data.replace(b"HTTP/1.1 100 Continue\r\n\r\n", b""))
            assert len(answers) >= 1 and all(status == 200 for status, _ in answers)
            writer.close()
        finally:
            await server.stop()

    asyncio.run(main())
    assert len(servers[0].repeated) == 0


def _counted(repeated: Any) -> int:
    """What a RepeatedRequests should count: each request, and each header block once."""
    from tablecast.http import repeated_requests as rr

    requests = sum(rr._size(c, p) for c, p in repeated._parsed.items())
    return requests + sum(rr._block_size(b, s.headers) for b, s in repeated._blocks.items())


def test_remembered_requests_share_headers_and_stay_within_their_bound() -> None:
    from tablecast.http.repeated_requests import (
        BLOCK_OVERHEAD,
        HEADER_OVERHEAD,
        OVERHEAD,
        Parsed,
        RepeatedRequests,
    )

    chunks = [b"GET /k%04d HTTP/1.1\r\nhost: x\r\n\r\n" % i for i in range(1000)]
    block = BLOCK_OVERHEAD + HEADER_OVERHEAD + 2 * len(b"host: x\r\n\r\n")
    per_request = len(chunks[0]) + len("/k0000") + OVERHEAD
    repeated = RepeatedRequests(max_bytes=100 * per_request + block)
    for i, chunk in enumerate(chunks):
        repeated.remember(chunk, Parsed("GET", f"/k{i:04d}", b"", {"host": "x"}))
    assert 87 <= len(repeated) <= 100
    assert repeated._bytes == _counted(repeated) <= repeated.max_bytes
    kept = [c for c in chunks if repeated.get(c) is not None]
    assert kept == chunks[-len(kept) :]  # the newest: the oldest went first
    first, last = repeated.get(kept[0]), repeated.get(kept[-1])
    assert first is not None and last is not None and first.headers is last.headers
    assert len(repeated._blocks) == 1
    # a request line that does not end in CRLF is not remembered
    repeated.remember(b"GET /lf HTTP/1.1\nhost: x\r\n\r\n", Parsed("GET", "/lf", b"", {}))
    assert repeated.get(b"GET /lf HTTP/1.1\nhost: x\r\n\r\n") is None


def test_a_remembered_request_s_forward_plan_counts_towards_the_bound() -> None:
    """A plan can outlive the app's own record of it, held by the request alone."""
    from tablecast.http.repeated_requests import Parsed, RepeatedRequests

    chunks = [b"GET /k%04d HTTP/1.1\r\nhost: x\r\n\r\n" % i for i in range(1000)]
    repeated = RepeatedRequests(max_bytes=1 << 20)
    for i, chunk in enumerate(chunks[:10]):
        repeated.remember(chunk, Parsed("GET", f"/k{i:04d}", b"", {"host": "x"}))
    before = repeated._bytes
    repeated.plan(chunks[0], "plan")
    assert repeated._bytes > before and repeated._bytes == _counted(repeated)
    repeated.plan(chunks[0], None)
    assert repeated._bytes == before == _counted(repeated)
    repeated.plan(b"GET /never HTTP/1.1\r\n\r\n", "plan")  # not remembered: nothing
    assert repeated._bytes == before
    # remembered with its plan, or given one later: the bound holds either way
    repeated = RepeatedRequests(max_bytes=50_000)
    for i, chunk in enumerate(chunks):
        parsed = Parsed("GET", f"/k{i:04d}", b"", {"host": "x"}, plan="p" if i % 2 else None)
        repeated.remember(chunk, parsed)
        repeated.plan(chunks[max(0, i - 3)], "later")
        assert repeated._bytes == _counted(repeated) <= repeated.max_bytes
    assert 0 < len(repeated) < 1000


def test_header_blocks_count_with_their_headers_and_go_with_their_last_request() -> None:
    """Requests of many headers, each block its own: the bound holds what they really take."""
    from tablecast.http.repeated_requests import Parsed, RepeatedRequests

    repeated = RepeatedRequests(max_bytes=1 << 20)
    for n in range(2000):
        lines = [f"h{i}: {n}" for i in range(100)]
        chunk = ("GET /a HTTP/1.1\r\n" + "\r\n".join(lines) + "\r\n\r\n").encode()
        headers = dict(line.split(": ") for line in lines)
        repeated.remember(chunk, Parsed("GET", "/a", b"", headers))
        assert repeated._bytes == _counted(repeated) <= repeated.max_bytes
    assert 0 < len(repeated._blocks) == len(repeated) < 2000
    assert all(s.users == 1 for s in repeated._blocks.values())


def test_a_failure_answering_a_remembered_request_is_a_500_and_the_connection_closes() -> None:
    apps: list[App] = []
    raw = b"GET /kept-boom HTTP/1.1\r\nhost: x\r\n\r\n"

    async def check(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(raw)
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")  # remembered as it parsed
        [app] = apps
        app.broken = True
        writer.write(raw)
        rest = await reader.read()  # until the server closes
        assert b"HTTP/1.1 500 " in rest and b'"internal"' in rest
        writer.close()
        # the remembered headers were not touched: the next connection parses as before
        app.broken = False
        assert _responses(
            await _exchange(port, raw.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n"))
        ) == [(200, b"GET /kept-boom ? None")]

    _run(check, apps)


def test_a_chunked_body_and_a_streamed_answer() -> None:
    async def check(port: int) -> None:
        raw = (
            b"POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
            b"GET /x HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        )
        assert _responses(await _exchange(port, raw)) == [(200, b"abcde"), (200, b"GET /x ? None")]
        data = await _exchange(port, b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
        head, _, body = data.partition(b"\r\n\r\n")
        assert b"transfer-encoding: chunked" in head
        assert body == b"".join(b"9\r\ndata: %d\n\n\r\n" % i for i in range(3)) + b"0\r\n\r\n"

    _run(check)


def test_a_body_that_comes_with_its_head_is_whole_as_the_request_starts() -> None:
    """A peer's batch comes in one chunk, head and body: the app answers it at once, with
    no task waiting for the body; a body that comes later is read as it comes."""

    async def check(port: int) -> None:
        raw = b"POST /whole HTTP/1.1\r\nconnection: close\r\ncontent-length: 5\r\n\r\nhello"
        assert _responses(await _exchange(port, raw)) == [(200, b"hello")]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /whole HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"hello")
        writer.write(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"abc")
        writer.write(b"GET /x HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        data = await reader.read()
        writer.close()
        assert _responses(data) == [(200, b"not arrived"), (200, b"abc"), (200, b"GET /x ? None")]

    _run(check)


def test_requests_before_a_malformed_one_are_answered_before_it_is_refused() -> None:
    async def check(port: int) -> None:
        raw = (
            b"POST /whole HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nokNOT HTTP AT ALL\r\n\r\n"
        )
        answers = _responses(await _exchange(port, raw))
        assert answers[0] == (200, b"ok")
        assert [status for status, _ in answers[1:]] == [400]

    _run(check)


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"NOT HTTP AT ALL\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nhost: x\r\ncontent-length: -1\r\n\r\n", 400),
        # a WebSocket handshake without its key: the app is not called
        (
            b"GET /ws HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n",
            400,
        ),
        (b"GET / HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: h2c\r\n\r\n", 400),
    ],
)
def test_a_malformed_request_or_an_upgrade_is_refused_and_closed(raw: bytes, status: int) -> None:
    apps: list[App] = []

    async def check(port: int) -> None:
        [(got, body)] = _responses(await _exchange(port, raw))
        assert got == status and b'"error"' in body
        assert apps[0].websockets == 0

    _run(check, apps)


def test_an_app_failure_is_a_500_and_the_connection_goes_on() -> None:
    async def check(port: int) -> None:
        raw = (
            b"GET /boom HTTP/1.1\r\nhost: x\r\n\r\n"
            b"GET /after HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        )
        statuses = [s for s, _ in _responses(await _exchange(port, raw))]
        assert statuses == [500, 200]

    _run(check)


def test_a_body_too_large_to_buffer_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http1, "MAX_BUFFERED", 1000)

    async def check(port: int) -> None:
        # /x never reads its body; /slow keeps the connection busy while it arrives
        raw = (
            b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n"
            b"POST /x HTTP/1.1\r\nhost: x\r\ncontent-length: 5000\r\n\r\n" + b"x" * 5000
        )
        statuses = [s for s, _ in _responses(await _exchange(port, raw))]
        assert 413 in statuses

    _run(check)


def test_a_connection_silent_past_the_header_timeout_is_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(http1, "HEADER_TIMEOUT_S", 0.3)
    monkeypatch.setattr(http1, "SWEEP_S", 0.1)

    async def check(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /x HTTP/1.1\r\nhost: x\r\n")  # headers never end
        assert await asyncio.wait_for(reader.read(), 3) == b""
        writer.close()

    _run(check)


def test_headers_past_the_limit_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http1, "MAX_HEAD", 10_000)

    async def check(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /x HTTP/1.1\r\nhost: x\r\n")
        writer.write(b"".join(b"x-%d: %s\r\n" % (i, b"a" * 1000) for i in range(12)))
        [(status, body)] = _responses(await reader.read())
        assert status == 400 and b"too large" in body
        writer.close()

    _run(check)


def test_a_keep_alive_connection_s_heads_are_limited_one_by_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # kept answers leave the connection waiting for a head after each request: the limit
    # is on one head, not on every head the connection ever sent (it refused after 1 MiB)
    monkeypatch.setattr(http1, "MAX_HEAD", 10_000)

    async def check(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        request = b"GET /kept HTTP/1.1\r\nhost: x\r\n\r\n"
        for rounds in range(100):  # 100 writes of 20 pipelined requests: 6x the limit
            writer.write(request * 20)
            for _ in range(20):
                head = await reader.readuntil(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200"), (rounds, head)
                await reader.readexactly(len(b'{"kept":true}'))
        for _ in range(300):  # one at a time
            writer.write(request)
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
            await reader.readexactly(len(b'{"kept":true}'))
        writer.close()

    _run(check)


def test_many_pipelined_requests_are_all_answered_in_order() -> None:
    count = http1.MAX_QUEUED * 3  # past the point where the connection is read no further

    async def check(port: int) -> None:
        raw = b"".join(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n" for _ in range(count - 1))
        raw += b"GET /last HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        answers = _responses(await _exchange(port, raw))
        assert [b for _, b in answers] == [b"slow"] * (count - 1) + [b"GET /last ? None"]

    _run(check)


@pytest.mark.parametrize("first", [b"/slow", b"/x?q=0"])
def test_thousands_of_pipelined_requests_answered_at_once_are_answered_in_order(
    first: bytes,
) -> None:
    """Requests the app answers at once, pipelined in one chunk behind one a task answers
    (or not): each starts after the one before, none waits for a call stack to unwind."""
    count = 3000

    async def check(port: int) -> None:
        raw = b"GET " + first + b" HTTP/1.1\r\nhost: x\r\n\r\n"
        raw += b"".join(b"GET /x?q=%d HTTP/1.1\r\nhost: x\r\n\r\n" % i for i in range(1, count))
        raw += b"GET /kept HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        answers = _responses(await _exchange(port, raw))
        head = b"slow" if first == b"/slow" else b"GET /x ?q=0 None"
        want = [head] + [b"GET /x ?q=%d None" % i for i in range(1, count)] + [b'{"kept":true}']
        assert [b for _, b in answers] == want

    _run(check)


@pytest.mark.parametrize("path", ["/kept1k", "/1k"])
def test_a_client_that_pipelines_and_never_reads_is_held_to_a_bound_then_dropped(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kept answers (written while their heads are parsed) and the app's alike: what the
    node buffers for a client that reads nothing stays bounded, others are answered, and
    the client is dropped once it has read nothing for the write wait."""
    monkeypatch.setattr(http1, "WRITE_WAIT_S", 1.0)
    servers: list[LoopServer] = []
    request = f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode()
    flood = request * (10_000_000 // len(request))  # 10 MB of requests

    def send_all(sock: socket.socket) -> int:
        sent = 0
        with contextlib.suppress(OSError):  # the node stops reading, then drops us
            while sent < len(flood):
                sent += sock.send(flood[sent : sent + 65536])
        return sent

    async def check(port: int) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        sock.settimeout(3.0)
        sending = asyncio.create_task(asyncio.to_thread(send_all, sock))
        most_buffered = most_queued = 0
        for _ in range(15):  # 1.5 s: the node has long stopped reading by then
            await asyncio.sleep(0.1)
            for conn in list(servers[0].connections):
                if conn.transport is not None:
                    most_buffered = max(most_buffered, conn.transport.get_write_buffer_size())
                most_queued = max(most_queued, len(conn.queue))
        # another client is answered meanwhile
        answers = _responses(
            await _exchange(port, b"GET /kept HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        )
        assert answers == [(200, b'{"kept":true}')]
        sent = await sending
        assert sent < len(flood)  # the node stopped reading long before 10 MB
        # the transport's high-water mark and one answer; one read's requests queued at most
        assert most_buffered < 256 * 1024, most_buffered
        assert most_queued < 10_000, most_queued
        for _ in range(50):  # dropped: it read nothing for the write wait
            if not servers[0].connections:
                break
            await asyncio.sleep(0.1)
        assert not servers[0].connections
        sock.close()

    async def main() -> None:
        server = LoopServer(App())
        servers.append(server)
        await server.start("127.0.0.1", 0)
        try:
            await asyncio.wait_for(check(server.port), 20)
        finally:
            await server.stop()

    asyncio.run(main())


def test_head_has_no_body_and_expect_100_continue_is_answered() -> None:
    async def check(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"HEAD /x HTTP/1.1\r\nhost: x\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"content-length: 14\r\n" in head
        # the next answer follows the head at once: no body came between
        writer.write(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n")
        writer.write(b"expect: 100-continue\r\nconnection: close\r\n\r\n")
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"hi")
        assert _responses(await reader.read()) == [(200, b"hi")]
        writer.close()

    _run(check)


def _frame(opcode: int, payload: bytes, fin: bool = True) -> bytes:
    """A client's masked frame (the mask of zeros leaves the payload as it is)."""
    return bytes([(0x80 if fin else 0) | opcode, 0x80 | len(payload)]) + b"\0" * 4 + payload


def test_a_websocket_is_upgraded_and_its_messages_come_whole() -> None:
    def client(port: int) -> list[Any]:
        ws = WebSocket(f"http://127.0.0.1:{port}/ws", params={"q": "1"})
        assert ws.status == 101  # and its sec-websocket-accept is right (the client checks)
        got = []
        ws.sock.sendall(_frame(0x1, b"one"))
        got.append(ws.receive())
        # a message in three fragments, a ping between them
        ws.sock.sendall(_frame(0x1, b"t", fin=False) + _frame(0x9, b"p") + _frame(0x0, b"w", False))
        ws.sock.sendall(_frame(0x0, b"o"))
        got.append(ws.receive())
        ws.close()
        return got

    async def check(port: int) -> None:
        assert await asyncio.to_thread(client, port) == [
            {"echo": "one", "query": "q=1"},
            {"echo": "two", "query": "q=1"},
        ]

    _run(check)


def test_a_websocket_refused_by_the_app_gets_its_status_and_the_spec_error() -> None:
    async def check(port: int) -> None:
        raw = (
            b"GET /ws/refuse HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: websocket\r\n"
            b"sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\r\n"
        )
        [(status, body)] = _responses(await _exchange(port, raw))
        assert status == 403 and b'"forbidden"' in body

    _run(check)


def test_a_websocket_client_that_floods_before_it_is_accepted_is_cut_off() -> None:
    async def check(port: int) -> None:
        raw = (
            b"GET /ws/late HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: websocket\r\n"
            b"sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\r\n"
        )
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(raw)
        try:
            for _ in range(40):  # 1.2 MiB of frames before the app accepts (it waits 0.5 s)
                writer.write(_frame(0x1, b"x" * 100) * 300)
                await writer.drain()
            got = await reader.read()
        except ConnectionError:
            got = b""
        writer.close()
        assert b"101" not in got  # cut off before the app's accept answered

    _run(check)


def test_a_stopping_server_closes_its_websockets_with_going_away() -> None:
    async def main() -> None:
        server = LoopServer(App())
        await server.start("127.0.0.1", 0)
        port = server.port
        ws = await asyncio.to_thread(WebSocket, f"http://127.0.0.1:{port}/ws")
        assert ws.status == 101
        await asyncio.wait_for(server.stop(), 10)
        b0, b1 = await asyncio.to_thread(ws._exact, 2)
        assert b0 & 0x0F == 0x8 and await asyncio.to_thread(ws._exact, b1) == b"\x03\xe9"  # 1001
        ws.sock.close()

    asyncio.run(main())


def test_connections_past_the_cap_are_closed_and_the_rest_are_served() -> None:
    async def main() -> None:
        server = LoopServer(App(), max_connections=2)
        await server.start("127.0.0.1", 0)
        port = server.port
        try:
            held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            assert await asyncio.wait_for(reader.read(), 3) == b""  # the third: closed
            writer.close()
            held[0][1].close()
            await asyncio.sleep(0.1)
            raw = b"GET /x HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
            assert _responses(await _exchange(port, raw)) == [(200, b"GET /x ? None")]
            for _, w in held[1:]:
                w.close()
        finally:
            await server.stop()

    asyncio.run(main())


def test_a_websocket_client_that_reads_nothing_is_cut_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http1_websocket, "WRITE_WAIT_S", 0.5)
    apps: list[App] = []

    async def check(port: int) -> None:
        ws = await asyncio.to_thread(WebSocket, f"http://127.0.0.1:{port}/ws/flood")
        ws.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        assert ws.status == 101
        for _ in range(100):  # never read: the node's writes fill the buffers, then wait
            if apps[0].flood_ended is not None:
                break
            await asyncio.sleep(0.1)
        assert isinstance(apps[0].flood_ended, ConnectionError), apps[0].flood_ended
        ws.sock.close()

    _run(check, apps)


def test_a_stream_its_client_does_not_read_is_dropped_after_it_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(http1, "WRITE_WAIT_S", 0.5)

    async def check(port: int) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        sock.sendall(b"GET /bigstream HTTP/1.1\r\nhost: x\r\n\r\n")
        await asyncio.sleep(1.5)  # the stream ended long ago; its bytes wait for this reader
        got = 0
        with contextlib.suppress(ConnectionResetError):
            while chunk := await asyncio.to_thread(sock.recv, 1 << 20):
                got += len(chunk)
        sock.close()
        assert got < 8_000_000  # dropped, not flushed: what was buffered was never written

    _run(check)


def _handshakes_while_blocked(port: int, clients: int, wait_s: float = 0.5) -> int:
    """Connections to `port` whose handshake completes within `wait_s` while the calling
    thread (the server's event loop) accepts none: those its listen queues took."""
    socks = [socket.socket() for _ in range(clients)]
    try:
        for s in socks:
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
        done: set[socket.socket] = set()
        deadline = time.monotonic() + wait_s
        while len(done) < clients and (left := deadline - time.monotonic()) > 0:
            _, ready, _ = select.select([], [s for s in socks if s not in done], [], left)
            done.update(s for s in ready if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0)
        return len(done)
    finally:
        for s in socks:
            s.close()


@pytest.mark.parametrize("listeners", [1, 4])
def test_connections_wait_on_every_listener_while_the_loop_is_busy(listeners: int) -> None:
    # a queue drops connections past its backlog (plus one) until the loop accepts: several
    # listeners sharing the port hold that many times more, spread by the kernel
    async def main() -> None:
        server = LoopServer(App())
        await server.start("127.0.0.1", 0, backlog=32, listeners=listeners)
        try:
            # blocks the loop: nothing is accepted while the clients connect
            queued = _handshakes_while_blocked(server.port, 64)
            if listeners == 1:
                assert queued <= 33
            else:
                assert queued == 64
            await asyncio.sleep(0.2)  # the loop accepts them all now
            raw = b"GET /x HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
            assert _responses(await _exchange(server.port, raw)) == [(200, b"GET /x ? None")]
        finally:
            await server.stop()

    asyncio.run(main())


@pytest.mark.parametrize("listeners", [1, 3])
def test_a_port_another_socket_listens_on_is_refused(listeners: int) -> None:
    # the other socket shares ports as ours do: only the check after binding finds it
    other = socket.socket()
    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    other.bind(("127.0.0.1", 0))
    other.listen()

    async def main() -> None:
        server = LoopServer(App())
        with pytest.raises(OSError) as refused:
            await server.start("127.0.0.1", other.getsockname()[1], listeners=listeners)
        assert refused.value.errno == errno.EADDRINUSE
        await server.stop()

    try:
        asyncio.run(main())
    finally:
        other.close()


def test_a_socket_that_goes_away_at_once_does_not_keep_the_port() -> None:
    # a node killed a moment ago: the kernel is still ending its read processes
    other = socket.socket()
    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    other.bind(("127.0.0.1", 0))
    other.listen()

    async def main() -> None:
        asyncio.get_running_loop().call_later(0.3, other.close)
        server = LoopServer(App())
        await server.start("127.0.0.1", other.getsockname()[1], listeners=2)
        try:
            raw = b"GET /x HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
            assert _responses(await _exchange(server.port, raw)) == [(200, b"GET /x ? None")]
        finally:
            await server.stop()

    try:
        asyncio.run(main())
    finally:
        other.close()


def test_listeners_cover_ten_thousand_waiting_connections() -> None:
    assert listen.listeners_wanted(4096) == 4  # Linux's default somaxconn
    assert listen.listeners_wanted(65_535) == 1  # raised: one socket, bound exclusively
    assert listen.listeners_wanted(128) == listen.MOST_CHOSEN
    assert listen.somaxconn() > 0

    async def main() -> None:
        server = LoopServer(App())
        await server.start("127.0.0.1", 0)
        try:
            assert server.listeners == listen.listeners_wanted(listen.somaxconn())
        finally:
            await server.stop()

    asyncio.run(main())
