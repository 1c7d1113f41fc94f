"""Live tables without a broker: resume tokens, selections, the SSE parser of the client, the
hub's dispatch and ring (batches handed in as the feed would), and the slow-consumer rules."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from tablecast import serde
from tablecast.client.watch import Parser
from tablecast.contract.table_info import TableInfo
from tablecast.live import hub as hub_module
from tablecast.live import sinks, tcpdiag
from tablecast.live.events import SSE, Change
from tablecast.live.hub import Hub, Start, Watch
from tablecast.live.resume_token import Token, parse
from tablecast.live.selection import Selection
from tablecast.live.sinks import Progress, QueueSink, Sink
from tablecast.live.topic_feed import Batch
from tablecast.query.errors import ApiError
from tablecast.query.policy import KeyScope

INFO = TableInfo("kv", "app.table.kv", 4, serde.string().spec(), serde.json().spec())


def test_tokens_round_trip_and_bad_ones_are_400() -> None:
    for token in (
        Token("kv", {0: 5, 3: 0}),
        Token("a table/with@odd chars", {1: 2**62}),
        Token("kv", {0: 1}, after=b"k\x00\xff"),
        Token("kv", {2: 7}, after=b""),
    ):
        assert parse(token.text()) == token
    assert parse("kv@1:9").offsets == {1: 9}  # what a key read's X-Tablecast-Position says
    for bad in (
        "",
        "kv",
        "kv@",
        "@0:1",
        "kv@0",
        "kv@0:x",
        "kv@-1:3",
        "kv@0:1,0:2",
        "kv@0:1;x=1",
        "kv@0:1;after=zz",
    ):
        with pytest.raises(ApiError) as e:
            parse(bad)
        assert e.value.status == 400


def test_selections_of_keys_and_spans() -> None:
    keys = Selection.of_keys(INFO, [b"b", b"a", b"b"])
    assert keys.keys == (b"a", b"b") and keys.partitions == tuple(
        sorted({INFO.partition_of(b"a"), INFO.partition_of(b"b")})
    )
    assert keys.matches(b"a") and not keys.matches(b"c")
    assert keys.above(b"a").keys == (b"b",)
    spans = Selection.of_span(INFO, b"b", b"d", None)
    assert spans.partitions == (0, 1, 2, 3)
    assert [spans.matches(k) for k in (b"a", b"b", b"c\xff", b"d")] == [False, True, True, False]
    assert spans.above(b"c").spans == ((b"c\x00", b"d"),)
    assert not spans.above(b"d").spans
    granted = Selection.of_span(INFO, None, None, KeyScope([b"alice/", b"carol/"]))
    assert (
        granted.matches(b"alice/1") and not granted.matches(b"bob/1") and granted.matches(b"carol/")
    )
    assert Selection.of_span(INFO, b"x", b"y", KeyScope([b"alice/"])).empty


def test_the_client_parser_follows_eventsource() -> None:
    parser = Parser()
    lines = [
        ": keep-alive",
        "id: kv@0:1",
        "",  # an id-only block: the position moves, no event
        "id: kv@0:2",
        "event: change",
        'data: {"a":',
        "data: 1}",
        "",
        "event: ready",
        "data: {}",
        "",
    ]
    out = [e for e in (parser.line(x) for x in lines) if e is not None]
    assert out == [("change", "kv@0:2", '{"a":\n1}'), ("ready", "kv@0:2", "{}")]
    assert parser.last_id == "kv@0:2"


class Recorder(Sink):
    """A sink that keeps what it was flushed."""

    def __init__(self, touched: Any) -> None:
        super().__init__(touched)
        self.got: list[bytes] = []

    def flush(self) -> None:
        self.got.extend(self.pending)
        self.pending.clear()

    def seen(self) -> list[tuple[str, str, Any]]:
        out = []
        for block in b"".join(self.got).split(b"\n\n"):
            fields = dict(line.split(b": ", 1) for line in block.split(b"\n") if b": " in line)
            if b"event" in fields:
                out.append(
                    (
                        fields[b"event"].decode(),
                        fields[b"id"].decode(),
                        orjson.loads(fields[b"data"]),
                    )
                )
        return out


def _change(hub: Hub, partition: int, key: bytes, value: Any, offset: int) -> Change:
    renderer, _ = hub.source(INFO)
    raw = None if value is None else orjson.dumps(value)
    return Change(renderer, partition, key, raw, offset, 1000 + offset)


def _batch(hub: Hub, partition: int, changes: list[Change], end: int | None = None) -> Batch:
    pf = hub.parts[(INFO.topic, partition)]
    ends = {} if end is None else {(INFO.topic, partition): (pf.generation, end)}
    return Batch({(INFO.topic, partition): (pf.generation, changes)}, ends)


def _open(hub: Hub, selection: Selection, start: Start) -> tuple[Watch, Recorder]:
    renderer, _ = hub.source(INFO)
    watch = Watch(hub, INFO, renderer, selection, SSE)
    sink = Recorder(hub.touched)
    hub.begin(watch, sink, start)
    return watch, sink


def test_dispatch_joins_replays_and_tokens() -> None:
    async def run() -> None:
        hub = Hub("127.0.0.1:1", "unit", lambda: {})
        hub.loop = asyncio.get_running_loop()  # not started: no feed thread, batches by hand
        k = b"k1"
        p = INFO.partition_of(k)
        one, first = _open(hub, Selection.of_keys(INFO, [k]), Start([], {p: 10}))
        assert first.seen() == [("ready", f"kv@{p}:10", {"rows": 0})]
        pf = hub.parts[(INFO.topic, p)]
        assert pf.low == 0 and pf.dispatched == 0  # fed from LOOKBACK records before 10
        hub._dispatch(
            _batch(
                hub,
                p,
                [
                    _change(hub, p, k, {"v": 1}, 4),  # below the watch's start: not its
                    _change(hub, p, b"other", {"v": 2}, 10),
                    _change(hub, p, k, {"v": 3}, 11),
                    _change(hub, p, k, None, 12),
                ],
                end=20,
            )
        )
        assert first.seen()[1:] == [
            (
                "change",
                f"kv@{p}:12",
                {"key": "k1", "value": {"v": 3}, "partition": p, "offset": 11, "timestamp": 1011},
            ),
            (
                "change",
                f"kv@{p}:13",
                {"key": "k1", "value": None, "partition": p, "offset": 12, "timestamp": 1012},
            ),
        ]
        assert one.token() == f"kv@{p}:20"  # the end read moves a following watch on
        # a later watch starting inside the ring replays it from its own position
        two, second = _open(hub, Selection.of_keys(INFO, [k]), Start([], {p: 12}, snapshot=False))
        assert [e[1] for e in second.seen()] == [f"kv@{p}:13"]
        # a span watch over every partition: the position of the others goes in each id
        spans, third = _open(
            hub, Selection.of_span(INFO, b"k", b"l", None), Start([], {q: 0 for q in range(4)})
        )
        ids = [parse(e[1]) for e in third.seen() if e[0] == "change"]
        assert [t.offsets[p] for t in ids] == [5, 12, 13]  # from 0: the one at 4 too
        assert all(t.offsets[q] == 0 for t in ids for q in range(4) if q != p)
        hub.end(one)
        hub.end(two)
        hub.end(spans)
        assert pf.users == 0 and not pf.by_key and not pf.spanning and pf.idle_since is not None

    asyncio.run(run())


def test_a_watch_older_than_the_ring_catches_up(monkeypatch: pytest.MonkeyPatch) -> None:
    async def run() -> None:
        monkeypatch.setattr(hub_module, "RING_RECORDS", 5)
        hub = Hub("127.0.0.1:1", "unit", lambda: {})
        hub.loop = asyncio.get_running_loop()
        p = 0
        watch, _ = _open(
            hub, Selection.of_span(INFO, None, None, None), Start([], {q: 0 for q in range(4)})
        )
        pf = hub.parts[(INFO.topic, p)]
        hub._dispatch(_batch(hub, p, [_change(hub, p, b"k%d" % i, {"i": i}, i) for i in range(20)]))
        assert pf.low == 15 and len(pf.since(0)) == 5  # the ring kept the last five
        caught: list[dict[int, int]] = []

        async def fake_catch_up(w: Watch, behind: dict[int, int]) -> None:
            caught.append(behind)

        monkeypatch.setattr(hub, "_catch_up", fake_catch_up)
        late, _ = _open(
            hub,
            Selection.of_span(INFO, None, None, None),
            Start([], {0: 3, 1: 0, 2: 0, 3: 0}, snapshot=False),
        )
        await asyncio.sleep(0)
        assert caught == [{0: 3}] and 0 not in late.live and 1 in late.live
        hub.end(watch)
        hub.end(late)

    asyncio.run(run())


def _open_as(hub: Hub, info: TableInfo, keys: list[bytes], start: Start) -> tuple[Watch, Recorder]:
    """A key watch opened with catalog entry `info` (the node's at the time it was prepared)."""
    renderer, _ = hub.source(info)
    watch = Watch(hub, info, renderer, Selection.of_keys(info, keys), SSE)
    sink = Recorder(hub.touched)
    hub.begin(watch, sink, start)
    return watch, sink


def _values(sink: Recorder) -> list[Any]:
    return [e[2]["value"] for e in sink.seen() if e[0] == "change"]


def test_a_feed_begun_beyond_the_end_keeps_what_its_consumer_finds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A feed assigned beyond a partition's end is sent back to the partition's start by its
    consumer: it starts its ring over there instead of dropping every record, so the watches
    that come after it join the feed at once and get the records."""

    async def run() -> None:
        hub = Hub("127.0.0.1:1", "unit", lambda: {})
        hub.loop = asyncio.get_running_loop()
        caught: list[dict[int, int]] = []

        async def no_catch_up(w: Watch, behind: dict[int, int]) -> None:
            caught.append(behind)

        monkeypatch.setattr(hub, "_catch_up", no_catch_up)
        k = b"k1"
        p = INFO.partition_of(k)
        far = 10**12
        _, beyond = _open_as(hub, INFO, [k], Start([], {p: far}, snapshot=False))
        pf = hub.parts[(INFO.topic, p)]
        assert pf.low == far - hub_module.LOOKBACK
        # the consumer's reset: the partition from its start
        hub._dispatch(_batch(hub, p, [_change(hub, p, k, {"v": i}, i) for i in range(3)], end=3))
        assert (pf.low, pf.dispatched) == (0, 3)
        late, got = _open_as(hub, INFO, [k], Start([], {p: 0}, snapshot=False))
        assert p in late.live and caught == []  # joined at once: no private reader
        hub._dispatch(_batch(hub, p, [_change(hub, p, k, {"v": 3}, 3)]))
        assert _values(got) == [{"v": 0}, {"v": 1}, {"v": 2}, {"v": 3}]
        assert _values(beyond) == []  # its own position is beyond all of them
        # an empty partition: its end, below where the feed began, is where it starts over
        q = next(q for q in range(INFO.partitions) if q != p)
        other = next(bytes([c]) for c in range(97, 123) if INFO.partition_of(bytes([c])) == q)
        _open_as(hub, INFO, [other], Start([], {q: far}, snapshot=False))
        qf = hub.parts[(INFO.topic, q)]
        hub._dispatch(Batch({}, {(INFO.topic, q): (qf.generation, 0)}))
        assert (qf.low, qf.dispatched) == (0, 0)
        joined, _ = _open_as(hub, INFO, [other], Start([], {q: 0}, snapshot=False))
        assert q in joined.live and caught == []

    asyncio.run(run())


def test_watches_keep_their_changes_when_the_catalog_entry_changes() -> None:
    """An index or history added to the table (or other serdes) while watches follow it: the
    next watch's entry is taken by the feed, and the watches before it go on getting
    changes (they were left on a feed nobody fed)."""

    async def run() -> None:
        indexed = dataclasses.replace(INFO, extra={"indexes": ["color"]})
        tables = {"kv": INFO}
        hub = Hub("127.0.0.1:1", "unit", lambda: tables)
        hub.loop = asyncio.get_running_loop()
        k = b"k1"
        p = INFO.partition_of(k)
        first, got1 = _open_as(hub, INFO, [k], Start([], {p: 0}, snapshot=False))
        pf = hub.parts[(INFO.topic, p)]
        tables["kv"] = indexed
        second, got2 = _open_as(hub, indexed, [k], Start([], {p: 0}, snapshot=False))
        hub._dispatch(_batch(hub, p, [_change(hub, p, k, {"v": 1}, 0)], end=1))
        assert _values(got1) == [{"v": 1}] and _values(got2) == [{"v": 1}]
        assert hub.parts[(INFO.topic, p)] is pf and pf.info is indexed
        # a watch prepared with the entry before does not take the feed back
        _open_as(hub, INFO, [k], Start([], {p: 1}, snapshot=False))
        assert pf.info is indexed
        # other serdes on the same topic: read on from the feed's position with them
        plain = dataclasses.replace(indexed, value=serde.string().spec())
        tables["kv"] = plain
        generation = pf.generation
        third, got3 = _open_as(hub, plain, [k], Start([], {p: 1}, snapshot=False))
        assert pf.info is plain and pf.generation != generation
        assert (pf.low, pf.dispatched) == (1, 1)
        renderer, _ = hub.source(plain)
        hub._dispatch(_batch(hub, p, [Change(renderer, p, k, b"two", 1, 1001)]))
        assert _values(got1)[-1] == _values(got2)[-1] == _values(got3)[-1] == "two"
        for w in (first, second, third):
            hub.end(w)

    asyncio.run(run())


def test_slow_consumer_rules() -> None:
    async def run() -> None:
        queue = QueueSink(lambda s: None)
        queue.add("x" * 100)
        queue.flush()
        assert not queue.behind(time.monotonic())
        assert queue.behind(time.monotonic() + sinks.MAX_BEHIND_S + 1)
        big = QueueSink(lambda s: None)
        big.add("x" * (sinks.MAX_QUEUED_BYTES + 1))
        big.flush()
        assert big.closed and big.reason == sinks.SLOW

    asyncio.run(run())
    conn = Progress(handed=1000, acked=1000)
    assert not conn.judge(2000, 2000, 0.0)  # it read everything
    assert not conn.judge(3000, 2500, 1.0)  # behind, but reading
    assert not conn.judge(4000, 2500, 2.0)  # stalled since 2.0
    assert conn.judge(4000, 2500, 2.0 + sinks.MAX_STALLED_S + 0.1)
    far = Progress(handed=0, acked=0)
    assert far.judge(sinks.MAX_UNACKED_BYTES + 10, 5, 0.0)


def test_tcp_progress_of_a_port_from_the_kernel() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = server.accept()
    try:
        conn.sendall(b"x" * 5000)
        client.recv(5000)
        time.sleep(0.05)
        try:
            acked = tcpdiag.acked(port)
        except OSError as e:
            pytest.skip(f"no sock_diag here: {e}")
        peer = client.getsockname()
        assert acked[(peer[0], peer[1])] >= 5000
        assert tcpdiag.peer_of(f"127.0.0.1:{peer[1]}") == (peer[0], peer[1])
        assert tcpdiag.peer_of("[::1]:80") == ("::1", 80) and tcpdiag.peer_of("nonsense") is None
    finally:
        for s in (client, conn, server):
            s.close()


def test_the_generated_protobuf_code_matches_tables_proto(tmp_path: Path) -> None:
    grpc_tools = pytest.importorskip("grpc_tools.protoc")
    root = Path(__file__).resolve().parents[2]
    args = ["protoc", f"-I{root}", f"--python_out={tmp_path}", "tablecast/proto/tables.proto"]
    assert grpc_tools.main(args) == 0
    fresh = (tmp_path / "tablecast" / "proto" / "tables_pb2.py").read_text()
    assert fresh == (root / "tablecast" / "proto" / "tables_pb2.py").read_text(), (
        "tables_pb2.py is stale: run tools/gen_proto.sh"
    )
