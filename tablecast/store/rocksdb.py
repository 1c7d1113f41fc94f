"""The RocksDB store (rocksdict): durable, resumes from its applied offset after a restart.

One RocksDB instance per (table, partition). Data keys carry a one-byte prefix
so that the store's own bookkeeping (applied offset, key count) lives in the
same keyspace and is written in the same WriteBatch as the data: one column
family, one atomic write, no state where data and offset disagree. A value is
stored as offset (8 bytes) + timestamp (8 bytes) + the record's value. The
bookkeeping also holds when the store was last known in sync with its topic
(wall-clock ms), which decides whether a store reopened after an absence may
resume or must restore from scratch (compaction may have dropped tombstones).
A table's history (:mod:`tablecast.store.versions`) and indexes
(:mod:`tablecast.store.indexes`) live under prefixes of their own in the same
database and are written in the same WriteBatch as the rows they derive from.

A failed write (disk full, an I/O error) raises and leaves the store as it was
before the batch; RocksDB then refuses further writes until it is reopened.
"""

from __future__ import annotations

import logging
import shutil
import struct
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

from rocksdict import (
    BlockBasedIndexType,
    BlockBasedOptions,
    Cache,
    DataBlockIndexType,
    DbClosedError,
    DBCompressionType,
    Options,
    Rdict,
    RdictIter,
    WriteBatch,
)

from tablecast.store.base import (
    NO_VIEWS,
    Record,
    StoreClosed,
    Version,
    Views,
    Write,
    last_per_key,
)
from tablecast.store.indexes import RocksIndexes, rows_of
from tablecast.store.versions import RocksVersions

log = logging.getLogger(__name__)
T = TypeVar("T")

DATA = b"\x01"
META = b"\x00meta"
#: which views (history, indexes) the store holds: a store opened for others starts over
VIEWS = b"\x00views"
_HEADER = struct.Struct(">qq")
_META = struct.Struct(">qqq")  # applied offset, key count, in sync with the topic at (epoch ms)
_META_V1 = struct.Struct(">qq")  # written before the sync time was kept


BLOCK_CACHE_BYTES = 256 * 1024 * 1024
_cache: Cache | None = None
_cache_bytes = BLOCK_CACHE_BYTES


def set_block_cache_bytes(size: int) -> None:
    """The size of the node's one block cache (``serve --block-cache-mb``), before the first
    store opens: the stores share the cache they were opened with."""
    global _cache_bytes
    if _cache is not None and size != _cache_bytes:
        raise RuntimeError("the block cache is already in use: size it before opening stores")
    _cache_bytes = size


def block_cache_bytes() -> int:
    return _cache_bytes


def _options() -> Options:
    global _cache
    if _cache is None:
        # one LRU block cache for every store of the node: hot keys of any
        # partition stay in memory however many partitions the node holds
        _cache = Cache(_cache_bytes)  # an LRU cache
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    # a node holds many partitions: keep each instance's memtables modest
    opts.set_write_buffer_size(16 * 1024 * 1024)
    opts.set_max_write_buffer_number(3)
    # a bloom filter over each memtable's keys: every apply looks its batch's keys up first
    # (the key count), and during a restore nearly all miss; without it each miss is a
    # skiplist search (apply alone 1.11x faster, median of 7 rounds). 1 % of the memtable,
    # about 10 bits a key for rows of ~130 bytes: 160 KiB per store, with each memtable
    opts.set_memtable_prefix_bloom_ratio(0.01)
    opts.set_memtable_whole_key_filtering(True)
    table = BlockBasedOptions()
    table.set_block_cache(_cache)
    # point reads dominate: a bloom filter skips files without the key, and
    # the data-block hash index finds a key inside a block without a search
    table.set_bloom_filter(10, False)
    table.set_data_block_index_type(DataBlockIndexType.binary_and_hash())
    table.set_data_block_hash_ratio(0.75)
    table.set_cache_index_and_filter_blocks(True)
    table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    # index and filter in 4 KiB partitions under a pinned top level: a read whose filter
    # or index is not cached loads one small partition, not the whole file's (about 1 MB
    # for a store of 800k keys); with a block cache smaller than every store's filters
    # together that whole-filter load was most of a read (10M keys, 8 MiB cache: 2.5x
    # the req/s, bench cold)
    table.set_index_type(BlockBasedIndexType.two_level_index_search())
    table.set_partition_filters(True)
    table.set_metadata_block_size(4096)
    table.set_pin_top_level_index_and_filter(True)
    # LZ4 decompresses faster than the default Snappy; files written before stay readable
    opts.set_compression_type(DBCompressionType.lz4())
    opts.set_block_based_table_factory(table)
    return opts


class RocksDBStore:
    def __init__(self, path: str | Path, views: Views = NO_VIEWS) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        self.path = Path(path)
        self.views = views
        self._db = Rdict(str(path), _options())
        self._closed = False
        held = self._db.get(VIEWS) or NO_VIEWS.fingerprint()  # older stores held none
        if held != views.fingerprint():
            # the catalog changed what the table keeps: rebuild it all from the topic
            log.info("the store at %s held other views; starting it over", path)
            self._db.close()
            shutil.rmtree(path, ignore_errors=True)
            Path(path).mkdir(parents=True, exist_ok=True)
            self._db = Rdict(str(path), _options())
            self._db.put(VIEWS, views.fingerprint())
        meta = self._db.get(META)
        if meta is None:
            self._applied, self._count, self._synced = -1, 0, 0
            self._db.put(VIEWS, views.fingerprint())
        else:
            self._applied, self._count, self._synced = unpack_meta(meta)
        self._history = (
            RocksVersions(self._db, views.history_ms, self._iterator) if views.history_ms else None
        )
        self._indexes = RocksIndexes(self._db, self._iterator) if views.indexes else None

    @property
    def applied_offset(self) -> int:
        return self._applied

    @property
    def synced_ms(self) -> int:
        return self._synced

    def mark_synced(self, wall_ms: int) -> None:
        self._db.put(META, _META.pack(self._applied, self._count, wall_ms))
        self._synced = wall_ms

    def get(self, key: bytes) -> Record | None:
        if self._closed:
            raise StoreClosed("the store was closed")
        try:
            raw = self._db.get(DATA + key)
        except (DbClosedError, RuntimeError) as e:
            raise _closed_or(e, self._closed) from None
        return None if raw is None else _decode(raw)

    def multi_get(self, keys: Sequence[bytes]) -> list[Record | None]:
        if not keys:
            return []
        if self._closed:
            raise StoreClosed("the store was closed")
        try:
            raws = self._db[[DATA + k for k in keys]]
        except (DbClosedError, RuntimeError) as e:
            raise _closed_or(e, self._closed) from None
        return [None if raw is None else _decode(raw) for raw in raws]

    def scan(
        self, start: bytes | None, end: bytes | None, limit: int
    ) -> list[tuple[bytes, Record]]:
        it, stop = self._seek(start, end)
        out: list[tuple[bytes, Record]] = []
        while it.valid() and len(out) < limit:
            k = it.key()
            if not k.startswith(DATA) or (stop is not None and k >= stop):
                break
            out.append((k[1:], _decode(it.value())))
            it.next()
        return out

    def count_range(self, start: bytes | None, end: bytes | None) -> int:
        it, stop = self._seek(start, end)
        n = 0
        while it.valid():  # keys only: values are never decoded
            k = it.key()
            if not k.startswith(DATA) or (stop is not None and k >= stop):
                break
            n += 1
            it.next()
        return n

    def _seek(self, start: bytes | None, end: bytes | None) -> tuple[RdictIter, bytes | None]:
        """An iterator at the first data key >= start, and the raw key it must stay below."""
        it = self._iterator()
        it.seek(DATA + (start or b""))
        return it, (DATA + end if end is not None else None)

    def _iterator(self) -> RdictIter:
        # an iterator keeps the database alive, so only its creation can meet a close
        if self._closed:
            raise StoreClosed("the store was closed")
        try:
            return self._db.iter()
        except (DbClosedError, RuntimeError) as e:
            raise _closed_or(e, self._closed) from None

    # -- history and indexes ----------------------------------------------------
    @property
    def history_floor(self) -> int | None:
        return None if self._history is None else self._history.floor

    def as_of(self, key: bytes, at: int) -> Version | None:
        return _need(self._history, "history").as_of(key, at)

    def versions(self, key: bytes, start: int, end: int, limit: int) -> list[Version]:
        return _need(self._history, "history").versions(key, start, end, limit)

    def scan_as_of(
        self, start: bytes | None, end: bytes | None, at: int, limit: int
    ) -> list[tuple[bytes, Version]]:
        return _need(self._history, "history").scan_as_of(start, end, at, limit)

    def index_scan(
        self, name: str, start: bytes | None, end: bytes | None, limit: int
    ) -> list[tuple[bytes, Record]]:
        if name not in self.views.indexes:
            raise ValueError(f"this store keeps no index {name!r}")
        found = _need(self._indexes, "index").scan(name, start, end, limit)
        return rows_of(found, self.multi_get)

    def skip_past(self, offset: int) -> None:
        if offset > self._applied:
            self._db.put(META, _META.pack(offset, self._count, self._synced))
            self._applied = offset

    def apply(self, writes: Sequence[Write]) -> None:
        if not writes:
            return
        last = last_per_key(writes)
        rows = list(last.values())
        stored = [DATA + key for key in last]
        existed = self._db[stored]
        batch = WriteBatch(raw_mode=True)
        put, pack = batch.put, _HEADER.pack
        # each key absent before counts one more, unless it is deleted (counted below)
        count = self._count + existed.count(None)
        for (_, value, offset, timestamp, _), raw_key, before in zip(
            rows, stored, existed, strict=True
        ):
            if value is not None:
                put(raw_key, pack(offset, timestamp) + value)
            else:  # one row less, or (absent before) none more after all
                count -= 1
                if before is not None:
                    batch.delete(raw_key)
        if self._indexes is not None:
            self._indexes.stage(last, batch)
        stream_time = self._history.stage(writes, batch) if self._history is not None else None
        applied = max(self._applied, writes[-1].offset)
        batch.put(META, _META.pack(applied, count, self._synced))
        self._db.write(batch)
        self._applied, self._count = applied, count
        if stream_time is not None:
            self._history.stream_time = stream_time  # type: ignore[union-attr]

    def __len__(self) -> int:
        if self._closed:
            raise StoreClosed("the store was closed")
        return self._count

    def close(self) -> None:
        # readers check the flag first, so the reads still in RocksDB are the last ones;
        # rocksdict refuses to close while one is (it releases the GIL inside a read)
        self._closed = True
        for _ in range(5000):
            try:
                self._db.close()
                return
            except Exception as e:
                if "borrowed" in str(e):
                    time.sleep(0.001)
                    continue
                # a database in an error state (disk full) still lets go of its files
                log.warning("closing the store at %s: %s", self.path, e)
                return
        log.error("the store at %s stayed in use; not closed", self.path)


def unpack_meta(meta: bytes) -> tuple[int, int, int]:
    """The bookkeeping record: applied offset, key count, in sync with the topic at."""
    if len(meta) == _META_V1.size:
        applied, count = _META_V1.unpack(meta)
        return applied, count, 0
    applied, count, synced = _META.unpack(meta)
    return applied, count, synced


def _need(view: T | None, what: str) -> T:
    if view is None:
        raise ValueError(f"this store keeps no {what}")
    return view


def _closed_or(error: Exception, closed: bool) -> Exception:
    """What a failed read raises: StoreClosed if the store was closed under it (rocksdict says
    DbClosedError, or 'Already mutably borrowed' while its close runs), else the error."""
    return (
        StoreClosed("the store was closed") if closed or isinstance(error, DbClosedError) else error
    )


def _decode(raw: bytes) -> Record:
    offset, timestamp = _HEADER.unpack_from(raw)
    return Record(raw[16:], offset, timestamp)
