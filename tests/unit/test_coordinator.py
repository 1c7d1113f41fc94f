"""The coordinator keeps the last assignment while Kafka is unreachable for this node, and a
leaving node's partitions go to the others while it serves them until they are ready."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from tablecast.cluster import coordinator
from tablecast.cluster.coordinator import Coordinator
from tablecast.cluster.membership import Member
from tablecast.contract.table_info import TableInfo


@dataclass
class FakeMembership:
    live: list[str]
    kafka_reachable: bool = True
    leaving: set[str] = field(default_factory=set)
    #: node -> the slots it reports caught up in its heartbeats
    caught_up: dict[str, set[Any]] = field(default_factory=dict)

    def alive(self) -> dict[str, Member]:
        return {
            n: Member(
                n,
                f"http://{n}",
                {slot: {"caught_up": True} for slot in self.caught_up.get(n, ())},
                leaving=n in self.leaving,
            )
            for n in self.live
        }


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


def test_a_leaving_node_gets_nothing_and_serves_what_it_held_until_the_others_are_ready(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(coordinator, "LEAVING_GRACE_S", 0.0)
    membership = FakeMembership(["a", "b", "c"])
    ingestor = FakeIngestor({"kv": table()})
    coord = Coordinator("a", membership, ingestor, standby_replicas=1)  # type: ignore[arg-type]
    held = {slot for slot, owners in coord.tick().target.items() if "a" in owners}
    ingestor.replicas = dict.fromkeys(held)
    membership.leaving = {"a"}
    view = coord.tick()
    assert not any("a" in owners for owners in view.target.values())
    assert "a" in view.members  # still answering: a candidate for what it holds
    assert ingestor.desired == held  # nobody has caught up with them yet
    # the new actives catch up: a lets go of each at once (its grace, patched to 0)
    first = next(iter(held))
    membership.caught_up = {view.target[first][0]: {first}}
    coord.tick()
    assert ingestor.desired == held - {first}
    membership.caught_up = {view.target[s][0]: set() for s in held}
    for slot in held:
        membership.caught_up[view.target[slot][0]].add(slot)
    coord.tick()
    assert ingestor.desired == set()


def test_a_node_that_stays_keeps_a_moved_partition_for_the_release_grace() -> None:
    membership = FakeMembership(["a", "b"])
    ingestor = FakeIngestor({"kv": table()})
    coord = Coordinator("a", membership, ingestor, standby_replicas=0)  # type: ignore[arg-type]
    mine = {slot for slot, owners in coord.tick().target.items() if owners[0] == "a"}
    ingestor.replicas = dict.fromkeys(mine)
    membership.live = ["a", "b", "c"]  # c joins and takes some of a's partitions
    view = coord.tick()
    moved = {slot for slot in mine if view.target[slot][0] != "a"}
    assert moved
    membership.caught_up = {"c": moved}
    coord.tick()
    assert ingestor.desired is not None and moved <= ingestor.desired  # 3 s, not yet
