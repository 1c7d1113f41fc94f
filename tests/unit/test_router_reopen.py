"""A read whose local store is closed under it goes to a peer, not to the caller as 503.

The ingest thread closes a replica's store and opens it again after a failed write
(disk full): the replica is not released, so the node still holds the partition,
but for a moment its store refuses reads. The chaos soak saw such reads answered
503 while a peer held the same partition caught up (router.py, local.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import orjson

from tablecast.cluster.membership import Member
from tablecast.cluster.replica import Replica
from tablecast.cluster.replica_lifecycle import Freshness, Writes
from tablecast.query.cursor import Cursors
from tablecast.query.errors import ApiError
from tablecast.query.queries import KeyQuery
from tablecast.query.reads import Router
from tablecast.query.request import Request
from tablecast.store import Write
from tablecast.store.memory import MemoryStore

from ..support.nodes import PLAIN_INFO

INFO = PLAIN_INFO
PEER_BODY = b'{"key":"k","value":"from the peer","partition":0,"offset":0,"timestamp":0}'


@dataclass
class View:
    peer: Member
    me: str

    @property
    def target(self) -> dict[tuple[str, int], list[str]]:
        return {("t", 0): [self.me, self.peer.id]}

    def effective_active(self, slot: tuple[str, int]) -> str:
        return self.me

    def candidates(self, slot: tuple[str, int]) -> list[Any]:
        return [Member(self.me, "http://127.0.0.1:1"), self.peer]


@dataclass
class Peers:
    asked: list[str] = field(default_factory=list)

    async def request(self, base_url: str, method: str, target: str, *a: Any, **k: Any) -> Any:
        self.asked.append(base_url + target)
        return 200, [(b"x-tablecast-node", b"peer")], PEER_BODY


class Node:
    id = "me"

    def __init__(self, replica: Replica) -> None:
        self.tables = {"t": INFO}
        self.ingestor = type("Ingestor", (), {"replicas": {("t", 0): replica}})()
        self.config = type("Config", (), {"max_key_bytes": 1024})()
        self.view = View(Member("peer", "http://127.0.0.1:2"), self.id)


def _setup() -> tuple[Router, Replica, Peers]:
    store = MemoryStore()
    replica = Replica(INFO, 0, store, freshness=Freshness.CURRENT)
    replica.apply([Write(b"k", orjson.dumps("here"), 0, 0)])
    peers = Peers()
    router = Router(Node(replica), Cursors(b"s" * 32), peers)  # type: ignore[arg-type]
    return router, replica, peers


def _get(router: Router) -> Any:
    answer = router.key(KeyQuery.latest("t", "k"), Request({}))
    if asyncio.iscoroutine(answer):
        answer = asyncio.run(answer)
    return answer


def reopen(replica: Replica) -> None:
    """What the ingest thread does after a failed write: its store is closed and opened
    again."""
    replica.move(Writes.FAILED)
    replica.move(Writes.REOPENING)


def test_a_store_closed_under_a_read_sends_it_to_the_peer() -> None:
    router, replica, peers = _setup()
    assert orjson.loads(_get(router)[1])["value"] == "here"
    store = replica.store
    get = store.get

    def reopened_meanwhile(key: bytes) -> Any:
        # the ingest thread's reopen, between the read's replica lookup and its store read
        reopen(replica)
        store.close()
        return get(key)

    store.get = reopened_meanwhile  # type: ignore[method-assign]
    status, body, _ = _get(router)
    assert status == 200 and body == PEER_BODY
    assert peers.asked == ["http://127.0.0.1:2/v1/tables/t/keys/k"]


def test_a_replica_being_reopened_is_not_read_at_all() -> None:
    router, replica, peers = _setup()
    reopen(replica)
    status, body, _ = _get(router)
    assert status == 200 and body == PEER_BODY
    replica.move(Writes.RETRYING)  # its store is open again
    assert orjson.loads(_get(router)[1])["value"] == "here"
    assert len(peers.asked) == 1


def test_a_closed_store_and_no_peer_is_still_503_after_the_grace() -> None:
    router, replica, peers = _setup()
    router.node.view.candidates = lambda slot: []  # type: ignore[method-assign]
    reopen(replica)  # and it stays so: opening the store again failed
    replica.store.close()
    try:
        _get(router)
    except ApiError as e:
        assert e.code == "partition_unavailable"
    else:
        raise AssertionError("answered from a closed store")
    assert peers.asked == []
