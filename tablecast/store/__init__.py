"""Stores: one per (table, partition), holding the latest record per key and the applied offset."""

from __future__ import annotations

from pathlib import Path

from tablecast.store.base import PartitionStore, Record, Write
from tablecast.store.memory import MemoryStore

__all__ = ["MemoryStore", "PartitionStore", "Record", "Write", "open_store"]


def open_store(kind: str, path: Path | None) -> PartitionStore:
    """A store of `kind`; "rocksdb" needs a `path` (without one, memory stands in)."""
    if kind == "rocksdb" and path is not None:
        from tablecast.store.rocksdb import RocksDBStore

        return RocksDBStore(path)
    if kind in ("memory", "rocksdb"):
        return MemoryStore()
    raise ValueError(f"unknown store kind {kind!r}")
