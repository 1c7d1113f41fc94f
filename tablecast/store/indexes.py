"""Secondary indexes of a partition store, kept in the same step as the row they index.

An index entry is ``index name + encoded value + row key`` (the encoding of
:mod:`tablecast.contract.index_codec`, whose byte order is the values' order), so one
ordered scan answers a lookup (every entry under one value, by key) and a
range of values. Each row also records its own entries, so an update removes
the entries of the row's previous values and a delete removes them all:
the index holds exactly the current rows' values, at every applied offset.
Only the last record of a key in a batch matters, as for the row itself.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from sortedcontainers import SortedDict

from tablecast.contract.index_codec import name_prefix
from tablecast.store.base import Record, Write

if TYPE_CHECKING:  # the pipeline imports the catalog, which needs no RocksDB
    from rocksdict import Rdict, RdictIter, WriteBatch

#: RocksDB key prefixes: entries, and each row's own entries
ENTRY = b"\x04"
ROW = b"\x05"
_LEN = struct.Struct(">H")  # an entry's length, in a row's list of its entries
_KEY_LEN = struct.Struct(">I")  # an entry's row key length, its value in the database


def _bounds(name: str, start: bytes | None, end: bytes | None) -> tuple[bytes, bytes]:
    """The keyspace bounds of [start, end) within index `name` (end None: the index's end)."""
    prefix = name_prefix(name)
    # a name prefix ends with the escape's end, 0x00 0x00: 0x00 0x01 is past all of it
    return prefix + (start or b""), prefix + end if end is not None else prefix[:-1] + b"\x01"


class MemoryIndexes:
    """Indexes of a memory store, mutated under the store's lock."""

    def __init__(self) -> None:
        #: name prefix + encoded value + key -> the length of the key
        self._entries: SortedDict = SortedDict()
        self._rows: dict[bytes, tuple[bytes, ...]] = {}

    def apply(self, last: dict[bytes, Write]) -> None:
        entries, rows = self._entries, self._rows
        for key, w in last.items():
            new = w.index if w.value is not None else ()
            old = rows.get(key, ())
            if old == new:
                continue
            for e in set(old) - set(new):
                del entries[e + key]
            for e in set(new) - set(old):
                entries[e + key] = len(key)
            if new:
                rows[key] = new
            else:
                rows.pop(key, None)

    def scan(
        self, name: str, start: bytes | None, end: bytes | None, limit: int
    ) -> list[tuple[bytes, bytes]]:
        """Up to `limit` (encoded value + key, key) of index `name` in [start, end)."""
        lo, hi = _bounds(name, start, end)
        skip = len(name_prefix(name))
        out = []
        entries = self._entries
        for k in entries.irange(lo, hi, inclusive=(True, False)):
            out.append((k[skip:], k[len(k) - entries[k] :]))
            if len(out) >= limit:
                break
        return out

    def __len__(self) -> int:
        return len(self._entries)


class RocksIndexes:
    """Indexes of a RocksDB store in the store's own database: ``ENTRY + name + value + key``
    -> nothing, ``ROW + key`` -> the row's entries; staged into the store's WriteBatch."""

    def __init__(self, db: Rdict, iterator: Callable[[], RdictIter]) -> None:
        self._db = db
        self._iter = iterator

    def stage(self, last: dict[bytes, Write], batch: WriteBatch) -> None:
        keys = list(last)
        olds = self._db[[ROW + k for k in keys]]
        for key, raw in zip(keys, olds, strict=True):
            w = last[key]
            new = w.index if w.value is not None else ()
            old = _decode(raw) if raw is not None else ()
            if old == new:
                continue
            for e in set(old) - set(new):
                batch.delete(ENTRY + e + key)
            for e in set(new) - set(old):
                batch.put(ENTRY + e + key, _KEY_LEN.pack(len(key)))
            if new:
                batch.put(ROW + key, _encode(new))
            else:
                batch.delete(ROW + key)

    def scan(
        self, name: str, start: bytes | None, end: bytes | None, limit: int
    ) -> list[tuple[bytes, bytes]]:
        lo, hi = _bounds(name, start, end)
        skip = 1 + len(name_prefix(name))
        it = self._iter()
        it.seek(ENTRY + lo)
        stop = ENTRY + hi
        out = []
        while it.valid() and len(out) < limit:
            k = it.key()
            if k >= stop:
                break
            (n,) = _KEY_LEN.unpack(it.value())
            out.append((k[skip:], k[len(k) - n :]))
            it.next()
        return out


def rows_of(
    found: list[tuple[bytes, bytes]], multi_get: Callable[[Sequence[bytes]], list[Record | None]]
) -> list[tuple[bytes, Record]]:
    """Index entries with the rows they point at (read in the same step as the entries)."""
    records = multi_get([key for _, key in found])
    return [(c, r) for (c, _), r in zip(found, records, strict=True) if r is not None]


def _encode(entries: tuple[bytes, ...]) -> bytes:
    return b"".join(_LEN.pack(len(e)) + e for e in entries)


def _decode(raw: bytes) -> tuple[bytes, ...]:
    out, at = [], 0
    while at < len(raw):
        (n,) = _LEN.unpack_from(raw, at)
        out.append(raw[at + 2 : at + 2 + n])
        at += 2 + n
    return tuple(out)
