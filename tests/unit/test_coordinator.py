"""The coordinator keeps the last assignment while Kafka is unreachable for this node."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tablecast.cluster.coordinator import Coordinator
from tablecast.cluster.membership import Member
from tablecast.contract.table_info import TableInfo


@dataclass
class FakeMembership:
    live: list[str]
    kafka_reachable: bool = True

    def alive(self) -> dict[str, Member]:
        return {n: Member(n, f"http://{n}") for n in self.live}


@dataclass
class FakeIngestor:
    tables: dict[str, TableInfo]
    replicas: dict[Any, Any] = field(default_factory=dict)
    desired: set[Any] | None = None


def table(partitions: int = 6) -> TableInfo:
    return TableInfo(name="kv", topic="app.table.kv", partitions=partitions, key={}, value={})


def test_a_peer_lost_during_an_outage_does_not_move_partitions_until_kafka_returns() -> None:
    membership = FakeMembership(["a", "b", "c"])
    ingestor = FakeIngestor({"kv": table()})
    coord = Coordinator("a", membership, ingestor, standby_replicas=0)  # type: ignore[arg-type]
    before = dict(coord.tick().target)
    mine = {slot for slot, owners in before.items() if owners[0] == "a"}
    assert 0 < len(mine) < 6 and ingestor.desired == mine
    # Kafka is down for this node and c stops answering too: keep what was agreed,
    # take nothing that could not be restored now; the view drops c for routing
    membership.kafka_reachable = False
    membership.live = ["a", "b"]
    view = coord.tick()
    assert view.target == before and set(view.members) == {"a", "b"}
    assert ingestor.desired == mine
    # Kafka is back: now the partitions c held move
    membership.kafka_reachable = True
    view = coord.tick()
    assert {owners[0] for owners in view.target.values()} == {"a", "b"}
    assert ingestor.desired is not None and ingestor.desired > mine


def test_kafka_back_with_the_same_members_moves_nothing() -> None:
    membership = FakeMembership(["a", "b"])
    ingestor = FakeIngestor({"kv": table()})
    coord = Coordinator("a", membership, ingestor, standby_replicas=0)  # type: ignore[arg-type]
    before = dict(coord.tick().target)
    membership.kafka_reachable = False
    coord.tick()
    membership.kafka_reachable = True
    assert coord.tick().target == before
