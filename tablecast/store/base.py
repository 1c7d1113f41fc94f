"""The store interface every backend implements."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol


class Record(NamedTuple):
    """What a store keeps per key: the value and where in the topic it came from."""

    value: bytes
    offset: int
    timestamp: int


class Write(NamedTuple):
    """One table-topic record to apply: a None value deletes the key."""

    key: bytes
    value: bytes | None
    offset: int
    timestamp: int


class PartitionStore(Protocol):
    """The latest record per key of one table partition.

    ``applied_offset`` is the offset of the last record applied (-1 for none);
    :meth:`apply` moves data and offset together, so a reader or a restart
    never sees one without the other.
    """

    @property
    def applied_offset(self) -> int: ...

    def get(self, key: bytes) -> Record | None: ...

    def apply(self, writes: Sequence[Write]) -> None: ...

    def __len__(self) -> int: ...

    def close(self) -> None: ...
