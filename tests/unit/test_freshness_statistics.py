"""What librdkafka's statistics may confirm of a partition's end (tablecast/cluster/freshness.py).

A report's high watermark is the one of the partition's last fetch response. Right after
its leader's connection comes back, a report still carries the end from before the outage;
taken as confirmed, a replica at that end claimed lag 0 and staleness 0 while the broker
held more records (seen in a chaos soak, just after its broker came back).
"""

from __future__ import annotations

from typing import Any

import orjson

from tablecast.cluster.fetchwatch import FetchWatch
from tablecast.cluster.freshness import SETTLED_US, EndWitness, note_statistics
from tablecast.cluster.replica import Replica
from tablecast.cluster.replica_lifecycle import Freshness
from tablecast.contract.table_info import TableInfo
from tablecast.store.memory import MemoryStore

INFO = TableInfo(name="t", topic="app.table.t", partitions=1, key={}, value={})


def report(hi: int, state: str = "UP", stateage_us: int = 10 * SETTLED_US) -> str:
    """A statistics report of one broker (node 1), leader of the table topic's partition."""
    doc: dict[str, Any] = {
        "brokers": {"b1": {"nodeid": 1, "state": state, "stateage": stateage_us}},
        "topics": {
            INFO.topic: {
                "partitions": {
                    "0": {"partition": 0, "leader": 1, "fetch_state": "active", "hi_offset": hi},
                    "-1": {"partition": -1, "leader": -1, "fetch_state": "none", "hi_offset": -1},
                }
            }
        },
    }
    return orjson.dumps(doc).decode()


class Node:
    def __init__(self) -> None:
        self.replica = Replica(INFO, 0, MemoryStore(), freshness=Freshness.CURRENT)
        self.replica.position = 7
        self.witness = EndWitness()
        self.fetches = FetchWatch()

    def stats(self, text: str, now: float) -> None:
        replicas = {("t", 0): self.replica}
        note_statistics(text, {INFO.topic: INFO}, replicas, self.fetches, self.witness, now)


def test_a_fetching_partition_has_its_end_confirmed_from_its_second_report() -> None:
    node = Node()
    node.stats(report(7), now=100.0)
    assert node.replica.end_seen_at < 100.0  # its first report may predate the fetch
    node.stats(report(9), now=101.0)
    assert (node.replica.end_offset, node.replica.end_seen_at) == (9, 101.0)
    node.stats(report(9), now=102.0)
    assert node.replica.end_seen_at == 102.0  # an idle partition stays confirmed


def test_a_leader_just_connected_again_confirms_nothing_until_a_report_later() -> None:
    node = Node()
    node.stats(report(7), now=100.0)
    node.stats(report(7), now=101.0)
    assert node.replica.end_seen_at == 101.0
    # the broker was away: back up 0.2 s ago, its report holds the end from before
    node.stats(report(7, stateage_us=200_000), now=110.0)
    assert node.replica.end_seen_at == 101.0
    # up long enough now, but this fetch's first report since: still not confirmed
    node.stats(report(12), now=111.0)
    assert node.replica.end_seen_at == 101.0
    node.stats(report(12), now=112.0)
    assert (node.replica.end_offset, node.replica.end_seen_at) == (12, 112.0)


def test_a_leader_down_confirms_nothing() -> None:
    node = Node()
    node.stats(report(7), now=100.0)
    node.stats(report(7, state="DOWN"), now=101.0)
    node.stats(report(7), now=102.0)  # up again, for long, but its fetch starts over
    assert node.replica.end_seen_at < 100.0


def test_a_released_partition_starts_over() -> None:
    node = Node()
    node.stats(report(7), now=100.0)
    node.witness.forget(("t", 0))
    node.stats(report(7), now=101.0)
    assert node.replica.end_seen_at < 100.0
