"""A serving node's view of the cluster: its identity, its tables and its replicas."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from tablecast.cluster.ingest import Ingestor
from tablecast.cluster.replica import Replica
from tablecast.kafka.catalog import TableInfo
from tablecast.store import open_store


@dataclass
class NodeConfig:
    app_id: str
    bootstrap_servers: str
    url: str
    node_id: str
    data_dir: Path
    max_key_bytes: int = 4096


@dataclass
class Node:
    config: NodeConfig
    ingestor: Ingestor = field(init=False)

    def __post_init__(self) -> None:
        self.ingestor = Ingestor(
            self.config.bootstrap_servers, self.config.app_id, self.config.node_id, self._replica
        )

    def _replica(self, info: TableInfo, partition: int, wipe: bool) -> Replica:
        path = self.config.data_dir / "stores" / info.name / str(partition)
        if wipe:
            shutil.rmtree(path, ignore_errors=True)
        return Replica(info, partition, open_store(info.store, path))

    @property
    def id(self) -> str:
        return self.config.node_id

    @property
    def tables(self) -> dict[str, TableInfo]:
        return self.ingestor.tables

    def replica(self, table: str, partition: int) -> Replica | None:
        return self.ingestor.replicas.get((table, partition))

    @property
    def ready(self) -> bool:
        return self.ingestor.ready

    def start(self) -> None:
        self.ingestor.start()

    def stop(self) -> None:
        self.ingestor.stop()
