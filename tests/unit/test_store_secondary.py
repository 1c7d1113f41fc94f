"""A read process's view of a node's store (RocksDB's secondary instance) against the store
itself, across the memtable flushes RocksDB makes on its own."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tablecast.store.base import Write
from tablecast.store.rocksdb import RocksDBStore
from tablecast.store.rocksdb_secondary import SecondaryStore


def flush(store: RocksDBStore) -> None:
    """What RocksDB does by itself once a memtable is full: write it to a file and start
    the next write-ahead log."""
    store._db.flush()


def test_a_value_written_just_before_a_flush_is_read_after_the_catch_up(tmp_path: Path) -> None:
    primary = RocksDBStore(tmp_path / "db")
    primary.apply([Write(b"k", b"v1", 0, 1)])
    secondary = SecondaryStore(tmp_path / "db", tmp_path / "own")
    try:
        assert secondary.get(b"k").value == b"v1"  # type: ignore[union-attr]
        # the next value reaches the log and then a file before the secondary catches up:
        # RocksDB's secondary stops reading a log once it is flushed, and by itself would
        # answer v1 from its memtable until the next write
        primary.apply([Write(b"k", b"v2", 1, 2)])
        flush(primary)
        assert secondary.catch_up() == 1
        assert secondary.get(b"k").value == b"v2"  # type: ignore[union-attr]
    finally:
        secondary.close()
        primary.close()


@pytest.mark.parametrize("seed", [5, 6, 7])
def test_every_catch_up_reads_what_the_store_holds(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    primary = RocksDBStore(tmp_path / "db")
    primary.apply([Write(b"k0", b"-", 0, 0)])
    secondary = SecondaryStore(tmp_path / "db", tmp_path / "own")
    want: dict[bytes, bytes | None] = {b"k0": b"-"}
    try:
        for offset in range(1, 400):
            key = b"k%d" % rng.randrange(20)
            value = None if rng.random() < 0.2 else b"v%d" % offset
            primary.apply([Write(key, value, offset, offset)])
            want[key] = value
            if rng.random() < 0.1:
                flush(primary)
            if rng.random() < 0.3:
                assert secondary.catch_up() == offset
                got = {k: secondary.get(k) for k in want}
                assert {k: r and r.value for k, r in got.items()} == want, offset
    finally:
        secondary.close()
        primary.close()
