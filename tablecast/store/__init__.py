"""Stores: one per (table, partition), holding the latest record per key and the applied offset
(and, as the catalog asks, the table's history and indexes)."""

from __future__ import annotations

from pathlib import Path

from tablecast.store.base import (
    NO_VIEWS,
    PartitionStore,
    Record,
    StoreClosed,
    Version,
    Views,
    Write,
)
from tablecast.store.memory import MemoryStore

__all__ = [
    "NO_VIEWS",
    "MemoryStore",
    "PartitionStore",
    "Record",
    "StoreClosed",
    "Version",
    "Views",
    "Write",
    "open_store",
]


def open_store(
    kind: str, path: Path | None, cache_bytes: int = 0, views: Views = NO_VIEWS
) -> PartitionStore:
    """A store of `kind`; "rocksdb" needs a `path` (without one, memory stands in).

    `cache_bytes` > 0 puts a read cache of that size in front of a RocksDB store;
    `views` are what it keeps besides the rows (history, indexes).
    """
    if kind == "rocksdb" and path is not None:
        from tablecast.store.cache import CachedStore
        from tablecast.store.rocksdb import RocksDBStore

        store = RocksDBStore(path, views)
        return CachedStore(store, cache_bytes) if cache_bytes > 0 else store
    if kind in ("memory", "rocksdb"):
        return MemoryStore(views)
    raise ValueError(f"unknown store kind {kind!r}")
