"""A replica: one node's copy of one table partition, and how far behind the topic it is."""

from __future__ import annotations

from dataclasses import dataclass

from tablecast.kafka.catalog import TableInfo
from tablecast.store import PartitionStore


@dataclass(eq=False)
class Replica:
    table: TableInfo
    partition: int
    store: PartitionStore
    #: next offset to read from the topic (an EOF moves it past compacted gaps)
    position: int = 0
    #: the topic's high watermark as last seen
    end_offset: int = 0
    #: the high watermark when restoring began, and whether it has been reached
    restore_target: int = 0
    caught_up: bool = False

    @property
    def lag(self) -> int:
        return max(0, self.end_offset - self.position)

    def state(self) -> dict[str, object]:
        """What heartbeats carry about this replica."""
        return {"caught_up": self.caught_up, "offset": self.store.applied_offset, "lag": self.lag}
