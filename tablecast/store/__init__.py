"""Stores: one per (table, partition), holding the latest record per key and the applied offset."""

from __future__ import annotations

from pathlib import Path

from tablecast.store.base import PartitionStore, Record, StoreClosed, Write
from tablecast.store.memory import MemoryStore

__all__ = ["MemoryStore", "PartitionStore", "Record", "StoreClosed", "Write", "open_store"]


def open_store(kind: str, path: Path | None, cache_bytes: int = 0) -> PartitionStore:
    """A store of `kind`; "rocksdb" needs a `path` (without one, memory stands in).

    `cache_bytes` > 0 puts a read cache of that size in front of a RocksDB store.
    """
    if kind == "rocksdb" and path is not None:
        from tablecast.store.cache import CachedStore
        from tablecast.store.rocksdb import RocksDBStore

        store = RocksDBStore(path)
        return CachedStore(store, cache_bytes) if cache_bytes > 0 else store
    if kind in ("memory", "rocksdb"):
        return MemoryStore()
    raise ValueError(f"unknown store kind {kind!r}")
