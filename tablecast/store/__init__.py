"""Stores: one per (table, partition), holding the latest record per key and the applied offset."""

from tablecast.store.base import PartitionStore, Record, Write
from tablecast.store.memory import MemoryStore

__all__ = ["MemoryStore", "PartitionStore", "Record", "Write", "open_store"]


def open_store(kind: str) -> PartitionStore:
    """A store of `kind` ("memory"; "rocksdb" arrives with durable stores)."""
    if kind in ("memory", "rocksdb"):
        # RocksDB-backed stores are not built yet: every table is held in memory
        # and rebuilt from its topic on restart
        return MemoryStore()
    raise ValueError(f"unknown store kind {kind!r}")
