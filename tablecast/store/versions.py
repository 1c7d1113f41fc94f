"""A table's history: every version of every key for a retention, by record timestamp.

Versions are ordered by the record's timestamp, not its offset, so a record
that arrives late (out of order) takes its place among the others; a delete
is a version too (the key had no value from then on); two records of a key
with one timestamp leave the later one (by offset), as Kafka Streams'
versioned stores do. Plain reads still answer the latest record by offset.

*Stream time* is the largest timestamp applied to the partition. A version is
kept while an answer at or after the *cutoff* (stream time − retention) may
need it: all versions after the cutoff, and the one valid at the cutoff — the
latest at or before it, unless that is a delete. So the size stays bounded by
the versions of one retention plus one per live key, and ``as_of(T)`` is
exact for every T at or after the cutoff (the *floor*).

A record that arrives older than the cutoff (its timestamp before stream
time − retention, stream time as of the records before it) is not added to
the history, as Kafka Streams' versioned stores drop it: what it might have
changed was purged already. The table itself still takes it.

Purging is driven by a queue of (timestamp, key): each version put at time t
queues its key for t, and once the cutoff passes t the key's versions at or
before the cutoff are compacted to that one valid version. Every version
queues once, so purging costs about one seek per version ever written.

Both backends write the versions in the same step as the row and the applied
offset (RocksDB: the same WriteBatch, under their own key prefixes; memory:
under the store's lock), so history and table are exact at every offset.
"""

from __future__ import annotations

import bisect
import heapq
import struct
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from sortedcontainers import SortedDict

from tablecast.contract.index_codec import escape, unescape
from tablecast.store.base import Version, Write

if TYPE_CHECKING:  # the pipeline imports the catalog, which needs no RocksDB
    from rocksdict import Rdict, RdictIter, WriteBatch

#: RocksDB key prefixes: versions by (key, time), and keys due for compaction by (time, key)
HISTORY = b"\x02"
DUE = b"\x03"
STREAM_TIME = b"\x00stream-time"
_TS = struct.Struct(">Q")
_VERSION = struct.Struct(">qB")  # offset, 1 = a value follows / 0 = deleted
NO_TIME = -(2**63)


def time_bytes(ts: int) -> bytes:
    """A signed timestamp as 8 bytes that sort as the timestamps do."""
    return _TS.pack(ts + 2**63)


def time_of(data: bytes, at: int) -> int:
    return _TS.unpack_from(data, at)[0] - 2**63


def keep_valid(versions: Sequence[Version]) -> int:
    """Of a key's versions at or before the cutoff (oldest first), how many at the front no
    answer at or after the cutoff needs: all but the last, and the last too if a delete."""
    if not versions:
        return 0
    return len(versions) - (versions[-1].value is not None)


def admitted(stream_time: int, history_ms: int, writes: Sequence[Write]) -> tuple[list[Write], int]:
    """The writes that enter the history — each not older than the cutoff when it arrives —
    and the stream time after all of them."""
    out = []
    for w in writes:
        if w.timestamp >= stream_time - history_ms:
            out.append(w)
        if w.timestamp > stream_time:
            stream_time = w.timestamp
    return out, stream_time


class MemoryVersions:
    """History of a memory store: per key a list of versions by time; mutated under the
    store's lock, read by the store's readers."""

    def __init__(self, history_ms: int) -> None:
        self.history_ms = history_ms
        self.stream_time = NO_TIME
        #: key -> (timestamps, versions), both sorted by timestamp
        self._keys: SortedDict = SortedDict()
        self._due: list[tuple[int, bytes]] = []

    @property
    def floor(self) -> int | None:
        return None if self.stream_time == NO_TIME else self.stream_time - self.history_ms

    def apply(self, writes: Sequence[Write]) -> None:
        writes, self.stream_time = admitted(self.stream_time, self.history_ms, writes)
        cutoff = self.stream_time - self.history_ms
        keys = self._keys
        for w in writes:
            entry = keys.get(w.key)
            if entry is None:
                entry = keys[w.key] = ([], [])
            times, versions = entry
            version = Version(w.value, w.offset, w.timestamp)
            i = bisect.bisect_left(times, w.timestamp)
            if i < len(times) and times[i] == w.timestamp:
                versions[i] = version  # one timestamp, two records: the later one stays
            else:
                times.insert(i, w.timestamp)
                versions.insert(i, version)
            heapq.heappush(self._due, (w.timestamp, w.key))
        due = self._due
        while due and due[0][0] <= cutoff:
            _, key = heapq.heappop(due)
            entry = keys.get(key)
            if entry is None:
                continue
            times, versions = entry
            n = bisect.bisect_right(times, cutoff)
            drop = keep_valid(versions[:n])
            if drop:
                del times[:drop], versions[:drop]
            if not times:
                del keys[key]

    def as_of(self, key: bytes, at: int) -> Version | None:
        entry = self._keys.get(key)
        if entry is None:
            return None
        i = bisect.bisect_right(entry[0], at)
        return entry[1][i - 1] if i else None

    def versions(self, key: bytes, start: int, end: int, limit: int) -> list[Version]:
        entry = self._keys.get(key)
        if entry is None:
            return []
        times, versions = entry
        lo, hi = bisect.bisect_left(times, start), bisect.bisect_left(times, end)
        return versions[lo : min(hi, lo + limit)]

    def scan_as_of(
        self, start: bytes | None, end: bytes | None, at: int, limit: int
    ) -> list[tuple[bytes, Version]]:
        out = []
        for key in self._keys.irange(start, end, inclusive=(True, False)):
            version = self.as_of(key, at)
            if version is not None and version.value is not None:
                out.append((key, version))
                if len(out) >= limit:
                    break
        return out

    def __len__(self) -> int:
        return sum(len(t) for t, _ in self._keys.values())


class RocksVersions:
    """History of a RocksDB store, in the store's own database: ``HISTORY + escaped key +
    time`` -> offset, deleted?, value; ``DUE + time + key`` -> nothing; stream time in the
    bookkeeping. :meth:`stage` adds a batch's versions and purges to the store's WriteBatch;
    the store commits :attr:`stream_time` once that batch is written."""

    def __init__(self, db: Rdict, history_ms: int, iterator: Callable[[], RdictIter]) -> None:
        self.history_ms = history_ms
        self._db = db
        self._iter = iterator
        raw = db.get(STREAM_TIME)
        self.stream_time = NO_TIME if raw is None else time_of(raw, 0)

    @property
    def floor(self) -> int | None:
        return None if self.stream_time == NO_TIME else self.stream_time - self.history_ms

    def stage(self, writes: Sequence[Write], batch: WriteBatch) -> int:
        """Put the versions of `writes` and the purges now due into `batch`; the stream time
        after it (kept by the caller once the batch is written)."""
        writes, stream_time = admitted(self.stream_time, self.history_ms, writes)
        cutoff = max(stream_time - self.history_ms, NO_TIME)
        # versions of this batch at or before the cutoff: not in the database yet, but
        # part of what their key's compaction must see
        pending: dict[bytes, dict[int, Version]] = {}
        for w in writes:
            version = Version(w.value, w.offset, w.timestamp)
            batch.put(_history_key(w.key, w.timestamp), _encode(version))
            if w.timestamp <= cutoff:
                pending.setdefault(w.key, {})[w.timestamp] = version
            else:
                batch.put(DUE + time_bytes(w.timestamp) + w.key, b"")
        due = set(pending)
        it = self._iter()
        it.seek(DUE)
        end = DUE + time_bytes(cutoff + 1)
        while it.valid():
            k = it.key()
            if not k.startswith(DUE) or k >= end:
                break
            due.add(k[9:])
            batch.delete(k)
            it.next()
        for key in due:
            self._compact(key, cutoff, pending.get(key, {}), batch)
        batch.put(STREAM_TIME, time_bytes(stream_time))
        return stream_time

    def _compact(
        self, key: bytes, cutoff: int, pending: dict[int, Version], batch: WriteBatch
    ) -> None:
        prefix = HISTORY + escape(key)
        found = dict(pending)
        it = self._iter()
        it.seek(prefix)
        while it.valid():
            k = it.key()
            if not k.startswith(prefix):
                break
            ts = time_of(k, len(prefix))
            if ts > cutoff:
                break
            found.setdefault(ts, _decode(it.value(), ts))  # this batch's version wins
            it.next()
        ordered = sorted(found)
        for ts in ordered[: keep_valid([found[t] for t in ordered])]:
            batch.delete(prefix + time_bytes(ts))

    def as_of(self, key: bytes, at: int) -> Version | None:
        prefix = HISTORY + escape(key)
        it = self._iter()
        it.seek_for_prev(prefix + time_bytes(at))
        if not it.valid():
            return None
        k = it.key()
        if not k.startswith(prefix) or len(k) != len(prefix) + 8:
            return None
        return _decode(it.value(), time_of(k, len(prefix)))

    def versions(self, key: bytes, start: int, end: int, limit: int) -> list[Version]:
        prefix = HISTORY + escape(key)
        it = self._iter()
        it.seek(prefix + time_bytes(start))
        out: list[Version] = []
        while it.valid() and len(out) < limit:
            k = it.key()
            if not k.startswith(prefix):
                break
            ts = time_of(k, len(prefix))
            if ts >= end:
                break
            out.append(_decode(it.value(), ts))
            it.next()
        return out

    def scan_as_of(
        self, start: bytes | None, end: bytes | None, at: int, limit: int
    ) -> list[tuple[bytes, Version]]:
        it = self._iter()
        it.seek(HISTORY + (escape(start) if start is not None else b""))
        stop = HISTORY + escape(end) if end is not None else None
        out: list[tuple[bytes, Version]] = []
        while it.valid() and len(out) < limit:
            k = it.key()
            if not k.startswith(HISTORY) or (stop is not None and k >= stop):
                break
            key, after = unescape(k, 1)
            prefix = k[:after]
            # the version valid at `at`, then on to the next key: one seek each, however
            # many versions a key has
            version = self.as_of(key, at)
            if version is not None and version.value is not None:
                out.append((key, version))
            it.seek(prefix + b"\xff" * 8 + b"\x00")  # past every timestamp of this key
        return out

    def __len__(self) -> int:
        n = 0
        it = self._iter()
        it.seek(HISTORY)
        while it.valid() and it.key().startswith(HISTORY):
            n += 1
            it.next()
        return n


def _history_key(key: bytes, ts: int) -> bytes:
    return HISTORY + escape(key) + time_bytes(ts)


def _encode(v: Version) -> bytes:
    if v.value is None:
        return _VERSION.pack(v.offset, 0)
    return _VERSION.pack(v.offset, 1) + v.value


def _decode(raw: bytes, ts: int) -> Version:
    offset, live = _VERSION.unpack_from(raw)
    return Version(raw[_VERSION.size :] if live else None, offset, ts)
