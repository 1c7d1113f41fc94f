"""A read process's answers (server/readers/answer.py) against a real RocksDB store written
as a node writes it: which request heads it answers, exact positions as the store moves,
kept answers that end with a move, and the node's feed going quiet."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from tablecast import serde
from tablecast.kafka.catalog import TableInfo
from tablecast.kafka.partitioner import partition_for
from tablecast.server.auth import Auth
from tablecast.server.readers import answer as answer_module
from tablecast.server.readers.answer import Answerer, _plain_get
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
        (head("/v1/tables/kv/keys/a", "x-tablecast-after: kv@0:5"), False),
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
    ],
)
def test_only_plain_key_reads_are_a_read_process_s(raw: bytes, ours: bool) -> None:
    assert (_plain_get(raw) is not None) is ours


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


def test_a_quiet_feed_stops_the_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(tmp_path / "store")
    node.write({"a": {"n": 1}})
    answerer = Answerer("node-1", 4096, tmp_path / "own", Auth(), kept_bytes=1 << 20)
    try:
        answerer.update(node.feed(tables=[orjson.loads(INFO.to_json())]))
        assert answers(answerer, "a")[0] == 200
        monkeypatch.setattr(answer_module, "FEED_TIMEOUT_S", 0.05)
        time.sleep(0.1)
        assert answerer.answer(head("/v1/tables/kv/keys/a")) is None  # kept or not
        answerer.update(node.feed())
        assert answers(answerer, "a")[0] == 200
    finally:
        answerer.close()
        node.store.close()


def test_a_request_it_cannot_pipe_to_the_node_gets_503_with_retry_after(tmp_path: Path) -> None:
    from tablecast.server.readers.relay import ClientConnection, Clients

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

    from tablecast.server.readers import supervise

    monkeypatch.setattr(supervise.tempfile, "gettempdir", lambda: str(tmp_path))
    alive, dead, starting, old = (tmp_path / f"{supervise.RELAY_PREFIX}{n}" for n in "adso")
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
        supervise.remove_dead_relays()
        assert sorted(p.name[-1] for p in tmp_path.iterdir()) == ["a", "s"]
    finally:
        listening.close()
