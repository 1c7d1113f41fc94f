"""A node of one replica, as the router sees it: enough to drive a Router in unit tests."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

from tablecast import serde
from tablecast.cluster.replica import Replica
from tablecast.cluster.replica_lifecycle import Freshness
from tablecast.contract.table_info import TableInfo
from tablecast.query.cursor import Cursors
from tablecast.query.reads import Router
from tablecast.store import Views, Write
from tablecast.store.memory import MemoryStore
from tablecast.store.rocksdb import RocksDBStore


class OneReplicaNode:
    """Node "me" holding `info`'s partition 0 as its one replica, owner of it."""

    id = "me"

    def __init__(self, info: TableInfo, replica: Replica) -> None:
        self.tables = {info.name: info}
        self.ingestor = SimpleNamespace(replicas={(info.name, 0): replica}, tables=self.tables)
        self.config = SimpleNamespace(max_key_bytes=1024)
        self.view = SimpleNamespace(
            target={(info.name, 0): ["me"]},
            effective_active=lambda slot: "me",
            candidates=lambda slot: [],
        )
        self.coordinator = SimpleNamespace(view=self.view)


#: a table "t" of one partition, string keys and JSON values, in memory
PLAIN_INFO = TableInfo(
    name="t",
    topic="app.table.t",
    partitions=1,
    key=serde.string().spec(),
    value=serde.json().spec(),
    store="memory",
)
#: the same keeping every version of a key (history) for longer than any test's times
HISTORY_MS = 10**9
HISTORY_INFO = dataclasses.replace(PLAIN_INFO, extra={"history_ms": HISTORY_MS})


@contextmanager
def history_router(store: str, tmp_path: Path, writes: list[Write]) -> Iterator[Router]:
    """A Router over one replica of :data:`HISTORY_INFO` in a `store` ("memory" or
    "rocksdb") that has applied `writes` and is caught up."""
    views = Views(HISTORY_MS, ())
    kept = MemoryStore(views) if store == "memory" else RocksDBStore(tmp_path, views)
    replica = Replica(HISTORY_INFO, 0, kept, freshness=Freshness.CURRENT)
    replica.apply(writes)
    replica.end_offset = replica.position
    try:
        yield Router(OneReplicaNode(HISTORY_INFO, replica), Cursors(b"s" * 32), None)  # type: ignore[arg-type]
    finally:
        kept.close()
