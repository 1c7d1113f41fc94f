"""The short path of plain forwarded reads (query/short_path.py) picks the peer the router
would pick, in every ownership state; keeps what a path names only while the table is the
catalog's; and a read its peer did not answer goes to the router's other choices."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from tablecast import serde
from tablecast.cluster.membership import Member
from tablecast.cluster.node import Node as ClusterNode
from tablecast.cluster.node import NodeConfig
from tablecast.cluster.replica import Replica
from tablecast.cluster.replica_lifecycle import Freshness
from tablecast.contract.table_info import TableInfo
from tablecast.http.app import HttpApp
from tablecast.query.consistency import NO_OPTIONS
from tablecast.query.cursor import Cursors
from tablecast.query.kept_answers import Answers
from tablecast.query.ownership import ME
from tablecast.query.queries import KeyQuery
from tablecast.query.reads import Router
from tablecast.query.request import Request
from tablecast.store import Write
from tablecast.store.memory import MemoryStore

INFO = TableInfo("t", "app.table.t", 1, serde.string().spec(), serde.json().spec(), store="memory")
ME_ID = "me"
PEER1 = Member("peer1", "http://127.0.0.1:2")
PEER2 = Member("peer2", "http://127.0.0.1:3")
MYSELF = Member(ME_ID, "http://127.0.0.1:1")


@dataclass
class View:
    target: dict[tuple[str, int], list[str]]
    held: list[Member]  # caught-up holders, the effective active first

    def candidates(self, slot: tuple[str, int]) -> list[Member]:
        return self.held

    def effective_active(self, slot: tuple[str, int]) -> str | None:
        return self.held[0].id if self.held else None


@dataclass
class Peers:
    asked: list[str] = field(default_factory=list)
    down: set[str] = field(default_factory=set)

    async def request(self, base_url: str, method: str, target: str, *a: Any, **k: Any) -> Any:
        self.asked.append(base_url + target)
        if base_url in self.down:
            return 503, [], b'{"error":{"code":"partition_unavailable","message":"down"}}'
        return 200, [("x-tablecast-node", base_url)], b'{"from":"' + base_url.encode() + b'"}'


class Node:
    id = ME_ID

    def __init__(self, replica: Replica, view: View, info: TableInfo = INFO) -> None:
        self.tables = {"t": info}
        self.ingestor = type("Ingestor", (), {"replicas": {("t", 0): replica}})()
        self.ingestor.tables = self.tables
        self.config = type("Config", (), {"max_key_bytes": 1024})()
        self.view = view
        self.coordinator = type("Coordinator", (), {"view": view})()


class Sink:
    """A forwarded read's answer, as a future."""

    def __init__(self) -> None:
        self.answer: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()

    def answered(self, status: int, wire: bytes) -> None:
        self.answer.set_result((status, wire))

    def unanswered(self, error: Exception) -> None:
        self.answer.set_exception(error)


def _setup(
    view: View, info: TableInfo = INFO, forwarding: str = "short"
) -> tuple[Router, Replica, Peers]:
    replica = Replica(info, 0, MemoryStore(), freshness=Freshness.CURRENT)
    replica.apply([Write(b"k", orjson.dumps("here"), 0, 0)])
    peers = Peers()
    node = Node(replica, view, info)
    answers = Answers(node, 1 << 20)  # type: ignore[arg-type]
    router = Router(node, Cursors(b"s" * 32), peers, None, answers, forwarding)  # type: ignore[arg-type]
    return router, replica, peers


STATES = [
    # (owners in the target assignment, caught-up holders, this node's replica readable)
    ([ME_ID, "peer1"], [MYSELF, PEER1], True),  # ours
    (["peer1", ME_ID], [PEER1, MYSELF], True),  # a standby here: the active answers
    (["peer1", ME_ID], [MYSELF, PEER1], True),  # the view says we took over already
    (["peer1", ME_ID], [], True),  # nobody known caught up: the holder answers
    (["peer1"], [PEER1, PEER2], False),  # not held here
    (["peer1"], [PEER2, PEER1], False),  # the target's active not caught up yet
    (["peer1", ME_ID], [MYSELF, PEER1], False),  # our replica closed, the view behind
    (["peer1"], [], False),  # nobody: the router waits, then 503
]


@pytest.mark.parametrize(("owners", "held", "readable"), STATES)
def test_the_peer_is_the_routers_first_choice(
    owners: list[str], held: list[Member], readable: bool
) -> None:
    router, replica, _ = _setup(View({("t", 0): owners}, held))
    if not readable:
        replica.release()
    choices = router.routing.choices(INFO, 0, Request({}), NO_OPTIONS)
    first = choices[0] if choices else None
    expected = first if isinstance(first, Member) else None
    assert first == ME or first is None or isinstance(first, Member)
    assert router.routing.first_peer(INFO, 0) == expected


@pytest.mark.parametrize(
    ("forwarding", "batched", "short"),
    [("short", True, True), ("batched", True, False), ("one-by-one", False, False)],
)
def test_forwarding_chooses_batches_and_the_short_path(
    forwarding: str, batched: bool, short: bool
) -> None:
    router, _, _ = _setup(View({("t", 0): ["peer1"]}, [PEER1]), forwarding=forwarding)
    assert (router.rpc.coalescer is not None) == batched
    assert (router.forwards is not None) == short


def test_forwarding_is_one_of_three() -> None:
    with pytest.raises(ValueError, match="forwarding 'fast'"):
        _setup(View({("t", 0): ["peer1"]}, [PEER1]), forwarding="fast")


def test_a_global_table_is_never_forwarded_on_the_short_path() -> None:
    info = TableInfo(**{**orjson.loads(INFO.to_json()), "is_global": True})
    router, replica, _ = _setup(View({("t", 0): ["peer1"]}, [PEER1]), info)
    replica.release()
    assert router.routing.first_peer(info, 0) is None


def test_a_path_takes_the_short_path_once_the_router_forwarded_it() -> None:
    """No plan before the router forwarded a read of the path (a read answered here costs
    nothing more); after it, the same peer and target; none once the table changed."""

    async def main() -> None:
        router, replica, peers = _setup(View({("t", 0): ["peer1"]}, [PEER1]))
        replica.release()
        node = router.node
        forwards = router.forwards
        assert forwards is not None
        path = "/v1/tables/t/keys/a%2Fb"
        assert forwards.plan(path) is None
        answer = router.key(KeyQuery.latest("t", "a/b"), Request({}), path)
        assert (await answer)[0] == 200  # type: ignore[misc]
        plan = forwards.plan(path)
        assert plan is not None
        sink = Sink()
        assert forwards.send(plan, sink) == PEER1
        status, wire = await sink.answer
        assert status == 200 and wire == (
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"x-tablecast-node: http://127.0.0.1:2\r\ncontent-length: 29\r\n\r\n"
            b'{"from":"http://127.0.0.1:2"}'
        )
        assert peers.asked == ["http://127.0.0.1:2/v1/tables/t/keys/a%2Fb"] * 2
        # the partition is this node's now: the router's way
        node.view.target = {("t", 0): [ME_ID, "peer1"]}
        replica = Replica(INFO, 0, replica.store, freshness=Freshness.CURRENT)
        node.ingestor.replicas[("t", 0)] = replica
        assert forwards.send(plan, Sink()) is None
        # the table changed in the catalog: the plan is dropped
        replica.release()
        sink = Sink()
        assert forwards.send(plan, sink) is not None
        await sink.answer
        changed = TableInfo(**{**orjson.loads(INFO.to_json()), "kind": "window"})
        node.ingestor.tables = {"t": changed}
        assert forwards.send(plan, Sink()) is None and forwards.plan(path) is None
        # an old plan (a remembered request's) leaves a newer one of the path as it is
        forwards.remember(path, changed, 0, plan.target)
        newer = forwards.plan(path)
        assert forwards.send(plan, Sink()) is None and forwards.plan(path) is newer

    asyncio.run(main())


def test_a_read_its_peer_did_not_answer_goes_to_the_other_choices() -> None:
    router, replica, peers = _setup(View({("t", 0): ["peer1"]}, [PEER1, PEER2]))
    replica.release()
    peers.down.add(PEER1.url)

    async def main() -> Any:
        return await router.forward_failed(KeyQuery.latest("t", "k"), Request({}), PEER1)

    status, body, _ = asyncio.run(main())
    assert (status, body) == (200, b'{"from":"http://127.0.0.1:3"}')
    assert peers.asked == ["http://127.0.0.1:3/v1/tables/t/keys/k"]  # not peer1 again


def test_a_node_takes_its_forwarding_and_port_at_construction(tmp_path: Path) -> None:
    """`serve --forwarding` reaches the router through the app's constructor, and the port
    the watches' slow-client check needs through the watch service's: nothing is set on
    them afterwards."""
    config = NodeConfig("unit", "127.0.0.1:9", "http://127.0.0.1:9", "node-1", tmp_path / "n")
    for forwarding, batched, short in (
        ("short", True, True),
        ("batched", True, False),
        ("one-by-one", False, False),
    ):
        app = HttpApp(ClusterNode(config), forwarding=forwarding, port=8080)
        assert (app.router.rpc.coalescer is not None) == batched
        assert (app.router.forwards is not None) == short
        assert app.live.port == 8080
