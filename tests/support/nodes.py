"""A node of one replica, as the router sees it: enough to drive a Router in unit tests."""

from __future__ import annotations

from types import SimpleNamespace

from tablecast.cluster.replica import Replica
from tablecast.kafka.catalog import TableInfo


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
