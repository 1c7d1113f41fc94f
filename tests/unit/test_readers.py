"""A read process's answers (http/readers/key_reads.py) against a real RocksDB store written
as a node writes it: which request heads it answers, exact positions as the store moves,
kept answers that end with a move, and the node's feed going quiet."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tablecast import serde
from tablecast.contract.partitioner import partition_for
from tablecast.contract.table_info import TableInfo
from tablecast.http.readers import key_reads as answer_module
from tablecast.http.readers.heads import plain_get, relayed_body_length
from tablecast.http.readers.key_reads import Answerer
from tablecast.query.auth import Auth
from tablecast.query.ratelimit import SharedTokenBuckets
from tablecast.store import Write
from tablecast.store.rocksdb import RocksDBStore

INFO = TableInfo("kv", "app.table.kv", 1, serde.string().spec(), serde.json().spec())


def head(path: str, *headers: str, request: str = "GET {} HTTP/1.1") -> bytes:
    return "\r\n".join([request.format(path), "host: x", *headers]).encode()


@pytest.mark.parametrize(
    ("raw", "ours"),
    [
        (head("/v1/tables/kv/keys/a"), True),
        (head("/v1/tables/kv/keys/a%2Fb"), True),
        (head("/v1/tables/kv/keys/a", "Connection: keep-alive"), True),
        (head("/v1/tables/kv/keys/a", "authorization: Bearer x"), True),
        (head("/v1/tables/kv/keys/a?max_lag=0"), False),
        (head("/v1/tables/kv/keys/a", "connection: close"), False),
        (head("/v1/tables/kv/keys/a", "content-length: 0"), False),
        (head("/v1/tables/kv/keys/a", "transfer-encoding: chunked"), False),
        (head("/v1/tables/kv/keys/a", "x-tablecast-after: kv@0:5"), True),
        (head("/v1/tables/kv/keys/a", "x-tablecast-hop: 1"), False),
        (head("/v1/tables/kv/keys/a", "upgrade: websocket"), False),
        (head("/v1/tables/kv/keys/a", " folded"), False),
        (head("/v1/tables/kv/keys/a", "bad header"), False),
        (head("/v1/tables/kv/keys/a", "x: \x01"), False),
        (head("/v1/tables/kv/keys/a/windows"), False),
        (head("/v1/tables/kv/keys/a/history"), False),
        (head("/v1/tables/kv/range"), False),
        (head("/v1/tables/kv/keys/a", request="HEAD {} HTTP/1.1"), False),
        (head("/v1/tables/kv/keys/a", request="GET {} HTTP/1.0"), False),
        (head("/v1/tables/kv/keys/a", request="GET  {} HTTP/1.1"), False),
        # bytes the node's parser refuses in a target (it answers 400)
        (head("/v1/tables/kv/keys/a\x7fb"), False),
        (head("/v1/tables/kv/keys/a\x01b"), False),
        ("GET /v1/tables/kv/keys/\u00e9 HTTP/1.1\r\nhost: x".encode(), False),
    ],
)
def test_only_plain_key_reads_are_a_read_process_s(raw: bytes, ours: bool) -> None:
    assert (plain_get(raw) is not None) is ours


class Node:
    """A node's store of one partition, and the feed lines it would send about it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.store = RocksDBStore(path)
        self.offset = 0

    def write(self, rows: dict[str, Any]) -> None:
        writes = []
        for key, value in rows.items():
            raw = None if value is None else orjson.dumps(value)
            writes.append(Write(key.encode(), raw, self.offset, 1000 + self.offset))
            self.offset += 1
        self.store.apply(writes)

    def feed(self, end: int | None = None, staleness: int | None = None, **extra: Any) -> Any:
        applied = self.store.applied_offset
        slot = ["kv", 0, str(self.path), "gen-1", applied + 1, applied, end or applied + 1]
        return {"slots": [[*slot, staleness]], **extra}


def answers(answerer: Answerer, key: str) -> tuple[int, dict[str, str], Any]:
    wire = answerer.answer(head(f"/v1/tables/kv/keys/{key}"))
    assert wire is not None
    top, body = wire.split(b"\r\n\r\n", 1)
    lines = top.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, orjson.loads(body)


def test_answers_follow_the_store_exactly(tmp_path: Path) -> None:
    node = Node(tmp_path / "store")
    node.write({"a": {"n": 1}, "b": {"n": 2}})
    answerer = Answerer("node-1", 4096, tmp_path / "own", Auth(), kept_bytes=1 << 20)
    try:
        answerer.update(node.feed(tables=[orjson.loads(INFO.to_json())]))
        status, headers, body = answers(answerer, "a")
        assert status == 200
        assert body == {
            "key": "a",
            "value": {"n": 1},
            "partition": 0,
            "offset": 0,
            "timestamp": 1000,
        }
        assert headers["x-tablecast-position"] == "kv@0:2"
        assert headers["x-tablecast-node"] == "node-1"
        assert partition_for(b"a", 1) == 0

        # the node writes on; until the feed says so, the answers (kept ones too) stay
        # exact at the old position
        node.write({"a": {"n": 10}, "b": None})
        status, headers, body = answers(answerer, "a")
        assert (body["value"], headers["x-tablecast-position"]) == ({"n": 1}, "kv@0:2")
        answerer.update(node.feed(end=9, staleness=250))
        status, headers, body = answers(answerer, "a")
        assert (body["value"], headers["x-tablecast-position"]) == ({"n": 10}, "kv@0:4")
        assert (headers["x-tablecast-lag"], headers["x-tablecast-staleness-ms"]) == ("5", "250")
        status, headers, body = answers(answerer, "b")
        assert status == 404 and body["error"]["code"] == "key_not_found"
        assert headers["x-tablecast-position"] == "kv@0:4"

        # a key it cannot parse, a table it does not know: the node's to answer
        assert answerer.answer(head("/v1/tables/nope/keys/a")) is None

        # the partition leaves the feed: nothing answered from it any more
        answerer.update({"slots": []})
        assert answerer.answer(head("/v1/tables/kv/keys/a")) is None
    finally:
        answerer.close()
        node.store.close()


def test_answers_spend_the_callers_tokens_and_leave_refusals_to_the_node(
    tmp_path: Path,
) -> None:
    """With the node's rate table, each answer (a kept one too) spends a token of the client's
    address; with none left the request is the node's (which refuses it); the node spending
    from the same table leaves the read process fewer."""
    node = Node(tmp_path / "store")
    node.write({"a": {"n": 1}})
    table = SharedTokenBuckets(tmp_path / "rates", rate=0.01, burst=3, create=True)
    rate = SharedTokenBuckets(tmp_path / "rates", rate=0.01, burst=3)
    answerer = Answerer("node-1", 4096, tmp_path / "own", Auth(), kept_bytes=1 << 20, rate=rate)
    try:
        answerer.update(node.feed(tables=[orjson.loads(INFO.to_json())]))
        get = head("/v1/tables/kv/keys/a")
        assert answerer.answer(get, "127.0.0.1:5000") is not None
        assert answerer.answer(get, "127.0.0.1:5001") is not None  # kept, still counted
        assert answerer.answer(head("/v1/tables/kv/keys/b"), "127.0.0.2:80") is not None
        table.take("addr:127.0.0.1")  # the node answered one of this address's requests
        assert answerer.answer(get, "127.0.0.1:5002") is None
        assert answerer.answer(head("/v1/tables/kv/keys/b"), "127.0.0.1:5002") is None
        assert answerer.answer(get, "127.0.0.2:81") is not None  # its own bucket
        assert rate.refused == 2 and table.refused == 0
    finally:
        answerer.close()
        node.store.close()
        rate.close()
        table.close()


@pytest.fixture
def fed(tmp_path: Path) -> Iterator[tuple[Node, Answerer]]:
    """A node's store holding ``a``, and an answerer fed it once (tables too): answering."""
    node = Node(tmp_path / "store")
    node.write({"a": {"n": 1}})
    answerer = Answerer("node-1", 4096, tmp_path / "own", Auth(), kept_bytes=1 << 20)
    try:
        answerer.update(node.feed(tables=[orjson.loads(INFO.to_json())]))
        assert answers(answerer, "a")[0] == 200  # kept from here on
        yield node, answerer
    finally:
        answerer.close()
        node.store.close()


def test_a_quiet_feed_stops_the_answers(
    fed: tuple[Node, Answerer], monkeypatch: pytest.MonkeyPatch
) -> None:
    node, answerer = fed
    monkeypatch.setattr(answer_module, "FEED_TIMEOUT_S", 0.05)
    time.sleep(0.1)
    assert answerer.answer(head("/v1/tables/kv/keys/a")) is None  # kept or not
    answerer.update(node.feed())
    assert answers(answerer, "a")[0] == 200


def test_a_store_short_of_what_the_node_applied_is_the_nodes_then_opened_again(
    fed: tuple[Node, Answerer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A secondary instance that does not see records the node says it applied answers
    nothing (kept answers neither): the node answers from its own replica, which has them.
    Still short after a while, it is opened afresh."""
    node, answerer = fed
    monkeypatch.setattr(answer_module, "REOPEN_BEHIND_S", 0.05)
    first = answerer.slots[("kv", 0)].store

    # the node says it applied two records more than any catch-up shows
    ahead = node.feed()
    ahead["slots"][0][4] += 2
    ahead["slots"][0][5] += 2
    answerer.update(ahead)
    assert answerer.answer(head("/v1/tables/kv/keys/a")) is None
    assert answerer.answer(head("/v1/tables/kv/keys/b")) is None
    assert answerer.slots[("kv", 0)].store is first

    time.sleep(0.1)
    answerer.update(ahead)  # still short: closed, to be opened again from the next line
    assert ("kv", 0) not in answerer.slots
    assert answerer.answer(head("/v1/tables/kv/keys/a")) is None

    # the node's records reach the store: a new instance answers them
    node.write({"a": {"n": 2}, "b": {"n": 3}})
    answerer.update(node.feed())
    assert answerer.slots[("kv", 0)].store is not first
    status, headers, body = answers(answerer, "a")
    assert (status, body["value"], headers["x-tablecast-position"]) == (200, {"n": 2}, "kv@0:3")


def test_a_feed_line_it_cannot_take_stops_the_answers(fed: tuple[Node, Answerer]) -> None:
    """A line that fails part-way leaves the answers as a quiet feed does: the node's."""
    node, answerer = fed
    answerer.fed_at -= answer_module.FEED_TIMEOUT_S  # the last good line, half a second ago
    with pytest.raises(ValueError):
        answerer.update({"slots": [["kv", 0]]})  # cut short: a slot without its fields
    assert answerer.answer(head("/v1/tables/kv/keys/a")) is None
    answerer.update(node.feed())
    assert answers(answerer, "a")[0] == 200


def test_a_request_it_cannot_pipe_to_the_node_gets_503_with_retry_after(tmp_path: Path) -> None:
    from tablecast.http.readers.relay import ClientConnection, Clients

    async def main() -> bytes:
        answerer = Answerer("node-1", 4096, tmp_path / "own", Auth())
        clients = Clients(answerer, str(tmp_path / "no-node.sock"), "http", 100)
        server = await asyncio.get_running_loop().create_server(
            lambda: ClientConnection(clients), "127.0.0.1", 0
        )
        try:
            port = server.sockets[0].getsockname()[1]
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(head("/v1/tables/kv/range") + b"\r\n\r\n")
            answer = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            assert answerer.stats.requests == {("relayed", 503): 1}
            return answer
        finally:
            clients.close()
            server.close()

    answer = asyncio.run(main())
    top, body = answer.split(b"\r\n\r\n", 1)
    assert top.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in top
    assert orjson.loads(body)["error"]["code"] == "partition_unavailable"


def test_relay_directories_of_dead_nodes_are_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import socket

    from tablecast.node import read_processes

    monkeypatch.setattr(read_processes.tempfile, "gettempdir", lambda: str(tmp_path))
    alive, dead, starting, old = (tmp_path / f"{read_processes.RELAY_PREFIX}{n}" for n in "adso")
    for d in (alive, dead, starting, old):
        d.mkdir()
    listening = socket.socket(socket.AF_UNIX)
    listening.bind(str(alive / "node.sock"))
    listening.listen()
    gone = socket.socket(socket.AF_UNIX)
    gone.bind(str(dead / "node.sock"))  # bound, then its node died: nobody listens
    gone.close()
    os.utime(old, (0, 0))  # made long ago, never got its socket
    try:
        read_processes.remove_dead_relays()
        assert sorted(p.name[-1] for p in tmp_path.iterdir()) == ["a", "s"]
    finally:
        listening.close()


@pytest.mark.parametrize(
    ("raw", "length"),
    [
        (head("/v1/tables/kv/range"), 0),
        (head("/v1/tables/kv/keys:batchGet", "content-length: 12", request="POST {} HTTP/1.1"), 12),
        (head("/v1/tables/kv/keys/a", "x-tablecast-hop: 1"), 0),
        (head("/v1/tables/kv/keys/a", "connection: close"), None),
        (head("/v1/tables/kv/keys/a", "Connection: keep-alive, Upgrade"), None),
        (head("/v1/tables/kv/keys/a", "upgrade: websocket"), None),
        (head("/v1/tables/kv/keys:batchGet", "transfer-encoding: chunked"), None),
        (head("/v1/tables/kv/keys:batchGet", "expect: 100-continue", "content-length: 2"), None),
        (head("/v1/tables/kv/keys/a", request="HEAD {} HTTP/1.1"), None),
        (head("/v1/tables/kv/keys/a", request="GET {} HTTP/1.0"), None),
        (head("/v1/tables/kv/keys/a", "content-length: 1", "content-length: 1"), None),
        (head("/v1/tables/kv/keys/a", "content-length: -1"), None),
        (head("/v1/tables/kv/keys/a", "bad header"), None),
    ],
)
def test_which_requests_go_to_the_node_one_at_a_time(raw: bytes, length: int | None) -> None:
    assert relayed_body_length(raw) == length


def test_after_a_position_is_answered_once_the_store_is_there(tmp_path: Path) -> None:
    """``X-Tablecast-After``: answered when the store is as far as the token asks for the
    key's partition; the node's (which waits, or refuses the token) otherwise."""
    node = Node(tmp_path / "store")
    node.write({"a": {"n": 1}, "b": {"n": 2}})  # position 2
    answerer = Answerer("node-1", 4096, tmp_path / "own", Auth(), kept_bytes=1 << 20)
    try:
        answerer.update(node.feed(tables=[orjson.loads(INFO.to_json())]))
        for token, ours in [
            ("kv@0:2", True),
            ("kv@0:0", True),
            ("kv@0:3", False),
            ("other@0:1", False),
            ("kv@1:1", False),  # the table has one partition
            ("not a token", False),
        ]:
            wire = answerer.answer(head("/v1/tables/kv/keys/a", f"x-tablecast-after: {token}"))
            assert (wire is not None) is ours, token
        node.write({"a": {"n": 3}})
        answerer.update(node.feed())
        wire = answerer.answer(head("/v1/tables/kv/keys/a", "x-tablecast-after: kv@0:3"))
        assert wire is not None and b'"n":3' in wire and b"kv@0:3" in wire
    finally:
        answerer.close()
        node.store.close()


class FakeNodeRelay:
    """The node's end of the relay socket, as far as the relay needs one: takes the preamble,
    answers each request with its own line (chunked for paths that end in ``/chunked``)."""

    def __init__(self) -> None:
        self.connections: list[bytes] = []  # each one's preamble
        self.requests: list[tuple[bytes, bytes]] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections.append(await reader.readline())
        try:
            while True:
                top = await reader.readuntil(b"\r\n\r\n")
                lines = top.decode().split("\r\n")
                fields = dict(line.lower().split(": ", 1) for line in lines[1:] if line)
                body = await reader.readexactly(int(fields.get("content-length", 0)))
                target = lines[0].split()[1].encode()
                self.requests.append((target, body))
                answer = b"node:" + target + b":" + body
                if target.endswith(b"/chunked"):
                    writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                    writer.write(b"3\r\nnod\r\n")
                    await writer.drain()
                    writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(answer) - 3, answer[3:]))
                else:
                    closing = fields.get("connection") == "close"
                    end = b"connection: close\r\n" if closing else b""
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s\r\n" % (len(answer), end)
                    )
                    writer.write(answer)
                    if closing:
                        break
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


async def read_answer(reader: asyncio.StreamReader) -> bytes:
    """One answer's body (a length or chunks), and its node header if a read process gave it."""
    top = (await reader.readuntil(b"\r\n\r\n")).decode().lower()
    fields = dict(line.split(": ", 1) for line in top.split("\r\n")[1:] if line)
    if "content-length" in fields:
        body = await reader.readexactly(int(fields["content-length"]))
    else:
        body = b""
        while size := int((await reader.readline()).strip(), 16):
            body += await reader.readexactly(size)
            await reader.readline()
        await reader.readline()
    return b"read-process:" + body if "x-tablecast-node" in fields else body


def test_a_connection_comes_back_after_each_request_the_node_answers(tmp_path: Path) -> None:
    """Pipelined on one connection: plain reads answered by the read process, the others by
    the node through one relay connection, each answer in its request's order; after a
    ``Connection: close`` the node has the connection for good."""
    from tablecast.http.readers.relay import ClientConnection, Clients

    node = Node(tmp_path / "store")
    node.write({"a": {"n": 1}})
    answerer = Answerer("node-1", 4096, tmp_path / "own", Auth())
    answerer.update(node.feed(tables=[orjson.loads(INFO.to_json())]))
    fake = FakeNodeRelay()
    local = head("/v1/tables/kv/keys/a") + b"\r\n\r\n"

    async def main() -> list[bytes]:
        loop = asyncio.get_running_loop()
        relay = await asyncio.start_unix_server(fake.serve, str(tmp_path / "relay.sock"))
        clients = Clients(answerer, str(tmp_path / "relay.sock"), "http", 100)
        server = await loop.create_server(lambda: ClientConnection(clients), "127.0.0.1", 0)
        try:
            port = server.sockets[0].getsockname()[1]
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            post = head(
                "/v1/tables/kv/keys:batchGet", "content-length: 5", request="POST {} HTTP/1.1"
            )
            writer.write(local + head("/v1/tables/kv/range") + b"\r\n\r\n" + local)
            writer.write(post + b"\r\n\r\n" + b"12")  # the body comes in two writes
            await asyncio.sleep(0.05)
            writer.write(b"345" + head("/x/chunked") + b"\r\n\r\n" + local)
            got = [await read_answer(reader) for _ in range(6)]
            writer.write(head("/v1/tables/kv/keys/nope", "connection: close") + b"\r\n\r\n" + local)
            got += [await read_answer(reader), await reader.read()]
            writer.close()
            return got
        finally:
            clients.close()
            server.close()
            relay.close()

    try:
        got = asyncio.run(main())
    finally:
        answerer.close()
        node.store.close()
    a = b'read-process:{"key":"a","value":{"n":1},"partition":0,"offset":0,"timestamp":1000}'
    assert got == [
        a,
        b"node:/v1/tables/kv/range:",
        a,
        b"node:/v1/tables/kv/keys:batchGet:12345",
        b"node:/x/chunked:",
        a,
        b"node:/v1/tables/kv/keys/nope:",
        b"",  # the node closed after its answer: the pipelined read behind it went nowhere
    ]
    assert len(fake.connections) == 1 and fake.connections[0].startswith(b"TABLECAST-RELAY http ")
    assert answerer.stats.requests == {("key", 200): 3}


class _CountingBuffer(bytearray):
    """A client buffer that notes how many bytes each search for a head's end covers."""

    def __init__(self) -> None:
        super().__init__()
        self.searches: list[int] = []

    def find(self, sub: Any, start: Any = 0, *rest: Any) -> int:  # type: ignore[override]
        self.searches.append(len(self) - start)
        return super().find(sub, start, *rest)


def test_a_head_trickled_a_byte_at_a_time_is_searched_once(tmp_path: Path) -> None:
    """Each packet's search for the head's end starts where the last one stopped, so a large
    head sent a byte at a time costs about its length in search, and is still answered."""
    from tablecast.http.readers.relay import ClientConnection, Clients

    node = Node(tmp_path / "store")
    node.write({"a": {"n": 1}})
    answerer = Answerer("node-1", 4096, tmp_path / "own", Auth())
    answerer.update(node.feed(tables=[orjson.loads(INFO.to_json())]))
    pad = [f"x-pad-{i}: {'p' * 20}" for i in range(300)]  # line ends that are no head's end
    raw = head("/v1/tables/kv/keys/a", *pad) + b"\r\n\r\n"

    async def main() -> bytes:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        clients = Clients(answerer, str(tmp_path / "no-node.sock"), "http", 100)
        conn = ClientConnection(clients)
        try:
            await loop.connect_accepted_socket(lambda: conn, ours)
            conn.buffer = buffer = _CountingBuffer()
            for i in range(len(raw) - 1):
                conn.data_received(raw[i : i + 1])
            # the byte just come and the three before it, in case they begin the end
            assert max(buffer.searches) <= 4, max(buffer.searches)
            assert len(buffer.searches) == len(raw) - 1
            assert conn.scanned == len(raw) - 1
            answerer.update(node.feed())  # a feed line as fresh as the node keeps it
            conn.data_received(raw[-1:])
            assert conn.scanned == 0 and not buffer  # found, answered, taken off
            reader, writer = await asyncio.open_connection(sock=theirs)
            answer = await read_answer(reader)
            writer.close()
            return answer
        finally:
            clients.close()
            conn.close()

    try:
        answer = asyncio.run(main())
    finally:
        answerer.close()
        node.store.close()
    assert answer.startswith(b'read-process:{"key":"a","value":{"n":1}')
