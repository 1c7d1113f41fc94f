"""What one watcher may cost a node, without a broker: watches open per caller, a start that
waits counted among the caller's offset waits, what a WebSocket client may send, and an SSE
reader that stops reading cut off by its connection's buffer (no sock_diag needed)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import orjson
import pytest

from tablecast import serde
from tablecast.cluster.membership import Member
from tablecast.cluster.node import NodeConfig
from tablecast.cluster.replica import Replica
from tablecast.cluster.replica_lifecycle import Freshness
from tablecast.contract.table_info import TableInfo
from tablecast.http.http1 import LoopServer
from tablecast.live import sinks, tcpdiag
from tablecast.live.events import SSE
from tablecast.live.hub import Hub, Start, Watch
from tablecast.live.selection import Selection
from tablecast.live.service import Live, watch_query
from tablecast.live.sinks import StreamSink
from tablecast.query.cursor import Cursors
from tablecast.query.errors import ApiError
from tablecast.query.ratelimit import WaitSlots
from tablecast.query.reads import Router
from tablecast.query.request import Request
from tablecast.store import Write
from tablecast.store.memory import MemoryStore
from tests.support.ws import WebSocket

INFO = TableInfo("t", "app.table.t", 1, serde.string().spec(), serde.json().spec(), store="memory")


class View:
    def __init__(self) -> None:
        self.target = {("t", 0): ["me"]}

    def effective_active(self, slot: tuple[str, int]) -> str:
        return "me"

    def candidates(self, slot: tuple[str, int]) -> list[Member]:
        return [Member("me", "http://127.0.0.1:1")]


class Node:
    """What the watch service and the router read of a node: one table, one replica here."""

    id = "me"

    def __init__(self, replica: Replica, tmp: Path, watches: int) -> None:
        self.tables = {"t": INFO}
        self.ingestor = type("Ingestor", (), {"replicas": {("t", 0): replica}})()
        self.ingest_metrics = type("IngestMetrics", (), {"renewals": {}})()
        self.config = NodeConfig(
            "unit", "127.0.0.1:1", "http://127.0.0.1:1", "me", tmp, watches_per_caller=watches
        )
        self.view = View()


class Client:
    """A request's scope: the client's address (whom limits count against, auth off)."""

    def __init__(self, address: str) -> None:
        self.client = f"{address}:5000"


def _live(tmp: Path, watches: int = 64, waits: int = 16) -> tuple[Live, Replica]:
    replica = Replica(INFO, 0, MemoryStore(), freshness=Freshness.CURRENT)
    replica.apply([Write(b"k%d" % i, orjson.dumps(i), i, i) for i in range(3)])
    node = Node(replica, tmp, watches)
    router = Router(node, Cursors(b"s" * 32), None, WaitSlots(waits))  # type: ignore[arg-type]
    return Live(node, router), replica  # type: ignore[arg-type]


def _req(address: str = "10.0.0.1") -> Request:
    return Request({}, None, Client(address))


def test_a_caller_has_at_most_so_many_watches_open(tmp_path: Path) -> None:
    async def run() -> None:
        live, _ = _live(tmp_path, watches=2)
        try:
            pairs = [("key", "k1")]
            k1 = watch_query("t", pairs, None)
            both = watch_query("t", [("key", "k1"), ("prefix", "k")], None)
            plans = [await live.prepare(k1, _req()) for _ in range(2)]
            with pytest.raises(ApiError) as refused:
                await live.prepare(k1, _req())
            assert refused.value.status == 429 and refused.value.code == "rate_limited"
            other = await live.prepare(k1, _req("10.0.0.2"))  # another caller
            # a refused watch holds no slot: a bad one, many times over
            for _ in range(5):
                with pytest.raises(ApiError):
                    await live.prepare(both, _req())
            plans[0].release()
            plans[0].release()  # once is all it gives back
            again = await live.prepare(k1, _req())
            with pytest.raises(ApiError):
                await live.prepare(k1, _req())
            for plan in (plans[1], other, again):
                plan.release()
            assert [await live.prepare(k1, _req()) for _ in range(2)]
        finally:
            live.hub.stop()

    asyncio.run(run())


def test_a_resume_waiting_for_its_replica_holds_one_of_the_callers_waits(tmp_path: Path) -> None:
    """A token inside a snapshot, ahead of the replica but within the topic, makes the start
    wait for the replica: one of the caller's offset waits (--max-waits), so such watches
    cannot park more than that many of the caller's starts."""

    async def run() -> None:
        live, replica = _live(tmp_path, waits=1)
        replica.end_offset = 8  # the topic holds offsets up to 7; the replica applied 0..2
        token = "t@0:8;after=" + b"k0".hex()
        resume = watch_query("t", [("prefix", "k")], token)
        try:
            first = asyncio.ensure_future(live.prepare(resume, _req()))
            await asyncio.sleep(0.2)
            assert not first.done()  # waiting for the replica
            with pytest.raises(ApiError) as refused:
                await asyncio.wait_for(live.prepare(resume, _req()), 2)
            assert refused.value.code == "rate_limited"
            replica.apply([Write(b"k%d" % i, orjson.dumps(i), i, i) for i in range(3, 8)])
            plan = await asyncio.wait_for(first, 5)
            assert plan.start.positions == {0: 8}
            assert [r.key for r in plan.start.rows] == [b"k%d" % i for i in range(1, 8)]
            # the wait is over: its slot is the caller's again
            again = await asyncio.wait_for(live.prepare(resume, _req()), 2)
            plan.release()
            again.release()
        finally:
            live.hub.stop()

    asyncio.run(run())


# -- the loop engine: an SSE reader that stops reading, and what a WebSocket client may send --


class App:
    """/sse: a watch's stream on a hub (the test writes to its sink); a WebSocket: accepted,
    then nothing read for a while (a watch being prepared), then read until closed."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.sinks: list[StreamSink] = []
        self.closed_seen = asyncio.Event()

    def kept(self, path: str, headers: Any) -> None:
        return None

    def kept_request(self, request: bytes) -> None:
        return None

    def keep_request(self, request: bytes, entry: Any) -> None:
        pass

    def forward_plan(self, path: str, headers: Any) -> None:
        return None

    def begin(self, scope: Any, proto: Any) -> Awaitable[None] | None:
        transport = proto.response_stream(200, [("content-type", "text/event-stream")])
        sink = StreamSink(transport, self.hub.touched, tcpdiag.peer_of(scope.client))
        renderer, _ = self.hub.source(INFO)
        watch = Watch(self.hub, INFO, renderer, Selection.of_keys(INFO, [b"k"]), SSE)
        self.hub.begin(watch, sink, Start([], {0: 0}, snapshot=False))
        self.sinks.append(sink)
        return sink.done

    async def __call__(self, scope: Any, proto: Any) -> None:
        transport = await proto.accept()
        await asyncio.sleep(1.0)  # preparing: the client's messages are not read meanwhile
        while (await transport.receive()).kind != 0:
            pass
        self.closed_seen.set()


def _serve(check: Any) -> None:
    async def main() -> None:
        hub = Hub("127.0.0.1:1", "unit", lambda: {})
        hub.loop = asyncio.get_running_loop()  # no feed thread: the test writes to the sinks
        app = App(hub)
        server = LoopServer(app)
        await server.start("127.0.0.1", 0)
        hub._port = server.port
        try:
            await asyncio.wait_for(check(server.port, hub, app), 20)
        finally:
            await server.stop()
            hub.stop()

    asyncio.run(main())


def test_an_sse_reader_that_stops_reading_is_cut_off_without_sock_diag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_sock_diag(port: int) -> dict[tuple[str, int], int]:
        raise OSError("sock_diag is not available here")

    monkeypatch.setattr(tcpdiag, "acked", no_sock_diag)

    async def check(port: int, hub: Hub, app: App) -> None:
        # one that stops reading: more than the bound waits in the node for it
        stalled = socket.socket()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(("127.0.0.1", port))
        stalled.sendall(b"GET /sse HTTP/1.1\r\nhost: x\r\n\r\n")
        # one that has read nothing for long enough while some data waits for it
        quiet = socket.socket()
        quiet.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        quiet.connect(("127.0.0.1", port))
        quiet.sendall(b"GET /sse HTTP/1.1\r\nhost: x\r\n\r\n")
        while len(app.sinks) < 2:
            await asyncio.sleep(0.01)
        big, small = app.sinks
        for _ in range(160):  # 16 MiB, past what the kernel's buffers take
            big.add(b"x" * 100_000)
            hub.flush()
            await asyncio.sleep(0)
            if big.closed:
                break
        for _ in range(60):  # 6 MB for the quiet one: under the bound, never read
            small.add(b"y" * 100_000)
            hub.flush()
        # the watchdog's looks, as it takes them (sock_diag failing)
        for _ in range(2):
            streamed = await hub._cut_slow_queues()
            await hub._check_streams(streamed, 0.0)
        assert big.closed and big.reason == sinks.SLOW
        assert not small.closed
        monkeypatch.setattr(sinks, "MAX_STALLED_S", 0.2)
        await asyncio.sleep(0.3)
        streamed = await hub._cut_slow_queues()
        await hub._check_streams(streamed, 0.0)
        assert small.closed and small.reason == sinks.SLOW
        for s in (stalled, quiet):
            s.close()

    _serve(check)


def _frame(opcode: int, payload: bytes) -> bytes:
    """A client's final, masked frame (a mask of zeros leaves the payload as it is)."""
    n = len(payload)
    size = bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack(">H", n)
    return bytes([0x80 | opcode]) + size + b"\0" * 4 + payload


@pytest.mark.parametrize(
    ("frames", "code"),
    [
        ([_frame(0x1, b"caf\xc3")], 1007),  # text that is not UTF-8
        ([_frame(0x2, b"x" * 20_000)], 1009),  # a message larger than a watch's client sends
        ([_frame(0x1, b"x" * 1000)] * 100, 1008),  # 100 kB the app has not read yet
    ],
)
def test_what_a_websocket_client_may_send_is_bounded(frames: list[bytes], code: int) -> None:
    async def check(port: int, hub: Hub, app: App) -> None:
        def client() -> int | None:
            ws = WebSocket(f"http://127.0.0.1:{port}/ws", timeout=10)
            assert ws.status == 101
            with contextlib.suppress(OSError):
                ws.sock.sendall(b"".join(frames))
            got = ws.close_code()
            ws.sock.close()
            return got

        assert await asyncio.to_thread(client) == code
        await asyncio.wait_for(app.closed_seen.wait(), 5)  # the app read a close, no failure

    _serve(check)
