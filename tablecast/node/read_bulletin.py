"""What a node tells its read processes, several times a second: the tables, and which of
its partitions they may answer plain key reads for.

A partition is in the feed when the node itself would answer a plain key GET
for it from its own store without asking anyone (the hot path of
:meth:`tablecast.query.reads.Router.key`): a RocksDB key-value table
whose replica here is readable and which this node answers for. Anything else,
the read processes hand to the node.

Each partition comes with where its store is, which opening of it this is
(a store reopened or restored from scratch is a new one), the position and
applied offset the node had reached together, the topic's end as last seen and
the replica's staleness, so a read process's answer carries the same headers
as the node's.
"""

from __future__ import annotations

from typing import Any

import orjson

from tablecast.cluster.node import Node
from tablecast.cluster.write_recovery import durable_path
from tablecast.query.consistency import NO_OPTIONS
from tablecast.query.local import Local
from tablecast.query.ownership import PLAIN, Routing

#: how often the node sends it; a read process answers from a store at most about this
#: much behind the node's (its answers say the position they are exact at)
TICK_S = 0.02


class Feed:
    def __init__(self, node: Node, local: Local, routing: Routing) -> None:
        self.node = node
        self.local = local
        self.routing = routing
        self._tables: tuple[int, ...] = ()

    def tables_changed(self) -> bool:
        """Whether the node's tables changed since this was last asked."""
        seen = tuple(map(id, self.node.tables.values()))
        if seen == self._tables:
            return False
        self._tables = seen
        return True

    def line(self, slots: bytes, tables: bool) -> bytes:
        """A feed line of these `slots` (:meth:`slots`, as JSON), with the tables when asked
        (for a process that has not had them since they last changed)."""
        if not tables:
            return b'{"slots":%s}\n' % slots
        infos = orjson.dumps([orjson.loads(t.to_json()) for t in self.node.tables.values()])
        return b'{"slots":%s,"tables":%s}\n' % (slots, infos)

    def slots(self) -> list[list[Any]]:
        out: list[list[Any]] = []
        for (table, partition), replica in list(self.node.ingestor.replicas.items()):
            info = replica.table
            if info.kind != "kv" or info.store != "rocksdb":
                continue
            if self.local.readable(info, partition, NO_OPTIONS) is not replica:
                continue
            if not self.routing.answers_here(info, partition, PLAIN, NO_OPTIONS):
                continue
            store = replica.store
            path = durable_path(store)
            if path is None:
                continue
            # position and applied offset as one pair: the seqlock's even phase around both
            version = replica.version
            position, applied = replica.position, store.applied_offset
            if version & 1 or version != replica.version:
                position = applied + 1  # an apply under way: what the store says is exact
            staleness = None if replica.stale_since is None else replica.staleness_ms()
            out.append(
                [
                    table,
                    partition,
                    str(path),
                    f"{id(store)}:{replica.opened_at}",
                    position,
                    applied,
                    replica.end_offset,
                    staleness,
                ]
            )
        return out
