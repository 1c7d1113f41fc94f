"""Reads as values: what a caller asks of a table, whichever front end it asked through.

Each read is a small immutable value made by a named constructor, as Kafka
Streams' interactive queries are (``KeyQuery.withKey``, ``RangeQuery.withRange``):
the table, what of it, and the bound (:class:`~tablecast.query.consistency.ReadOptions`:
``max_lag``, ``max_staleness_ms``, ``after``, ``min_offset``, ``timeout_ms``,
``redirect``) saying which replica may answer. Nothing in them knows HTTP or
gRPC. A front end decodes its request into one (:mod:`tablecast.http.decode`,
:mod:`tablecast.grpc.service`), and :meth:`tablecast.query.reads.Router.read`
answers it: the caller's grants, the route to the partition's owner, a local
read or a forward. A read that goes on to a peer travels as the HTTP read it
stands for (:func:`tablecast.query.peer_calls.target_of`).

They are named tuples, not frozen dataclasses, because a key read makes one per
request and a tuple is built in a fraction of the time.

Keys and index values are in their text form (a URL path's: a string key as
it is, any other as JSON); times are epoch milliseconds.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from tablecast.query.consistency import NO_OPTIONS, ReadOptions

#: window starts are int64 and a scan's bound is the end + 1: later times mean "no bound"
WINDOW_TIME_MAX = 2**62
#: rows a page holds unless the caller says otherwise, and at most
DEFAULT_LIMIT = 100
MAX_LIMIT = 10_000


class KeyQuery(NamedTuple):
    """One key's row: the latest, or (a table with history) the one current at `as_of`."""

    table: str
    key: str
    bound: ReadOptions = NO_OPTIONS
    as_of: int | None = None

    @classmethod
    def latest(cls, table: str, key: str, bound: ReadOptions = NO_OPTIONS) -> KeyQuery:
        return cls(table, key, bound)

    @classmethod
    def at(cls, table: str, key: str, as_of: int, bound: ReadOptions = NO_OPTIONS) -> KeyQuery:
        return cls(table, key, bound, as_of)


class WindowsQuery(NamedTuple):
    """A key's windows of a window table whose starts are in [time_from, time_to]."""

    table: str
    key: str
    bound: ReadOptions = NO_OPTIONS
    time_from: int = 0
    time_to: int = WINDOW_TIME_MAX

    @classmethod
    def between(
        cls,
        table: str,
        key: str,
        time_from: int | None = None,
        time_to: int | None = None,
        bound: ReadOptions = NO_OPTIONS,
    ) -> WindowsQuery:
        start = 0 if time_from is None else min(time_from, WINDOW_TIME_MAX)
        end = WINDOW_TIME_MAX if time_to is None else min(time_to, WINDOW_TIME_MAX)
        return cls(table, key, bound, start, end)


class HistoryQuery(NamedTuple):
    """A page of one key's versions with timestamps in [time_from, time_to), oldest first
    unless `newest_first`; `cursor` continues the page before."""

    table: str
    key: str
    bound: ReadOptions = NO_OPTIONS
    time_from: int | None = None
    time_to: int | None = None
    limit: int = DEFAULT_LIMIT
    newest_first: bool = False
    cursor: str | None = None

    @classmethod
    def versions(
        cls,
        table: str,
        key: str,
        time_from: int | None = None,
        time_to: int | None = None,
        *,
        limit: int = DEFAULT_LIMIT,
        newest_first: bool = False,
        cursor: str | None = None,
        bound: ReadOptions = NO_OPTIONS,
    ) -> HistoryQuery:
        return cls(table, key, bound, time_from, time_to, limit, newest_first, cursor)


class MetadataQuery(NamedTuple):
    """Where a key lives: its partition, the node active for it and the standbys."""

    table: str
    key: str

    @classmethod
    def of_key(cls, table: str, key: str) -> MetadataQuery:
        return cls(table, key)


#: a read of one partition, whatever it asks of it
OnePartition = KeyQuery | WindowsQuery | HistoryQuery | MetadataQuery


class RangeQuery(NamedTuple):
    """A page of rows by key: keys in [start, end) and with `prefix` (each optional), the
    latest or (a table with history) as of a time; `owned`: only the partitions the node
    asked is active for (a job beside every node sees each key once); `cursor` continues
    the page before; `record_fields`: each row also says its record's partition, offset
    and timestamp, as a key read does."""

    table: str
    bound: ReadOptions = NO_OPTIONS
    start: str | None = None
    end: str | None = None
    prefix: str | None = None
    as_of: int | None = None
    owned: bool = False
    limit: int = DEFAULT_LIMIT
    cursor: str | None = None
    record_fields: bool = False

    @classmethod
    def between(
        cls,
        table: str,
        start: str | None = None,
        end: str | None = None,
        *,
        prefix: str | None = None,
        as_of: int | None = None,
        owned: bool = False,
        limit: int = DEFAULT_LIMIT,
        cursor: str | None = None,
        bound: ReadOptions = NO_OPTIONS,
        record_fields: bool = False,
    ) -> RangeQuery:
        return cls(table, bound, start, end, prefix, as_of, owned, limit, cursor, record_fields)


class IndexQuery(NamedTuple):
    """A page of the rows of a secondary index: those whose `index` value is `value`, by key,
    or (`value` None) those with values in [start, end), by value then key;
    `record_fields` as a :class:`RangeQuery`'s."""

    table: str
    index: str
    bound: ReadOptions = NO_OPTIONS
    value: str | None = None
    start: str | None = None
    end: str | None = None
    limit: int = DEFAULT_LIMIT
    cursor: str | None = None
    record_fields: bool = False

    @classmethod
    def equal(
        cls,
        table: str,
        index: str,
        value: str,
        *,
        limit: int = DEFAULT_LIMIT,
        cursor: str | None = None,
        bound: ReadOptions = NO_OPTIONS,
        record_fields: bool = False,
    ) -> IndexQuery:
        return cls(table, index, bound, value, None, None, limit, cursor, record_fields)

    @classmethod
    def between(
        cls,
        table: str,
        index: str,
        start: str | None = None,
        end: str | None = None,
        *,
        limit: int = DEFAULT_LIMIT,
        cursor: str | None = None,
        bound: ReadOptions = NO_OPTIONS,
        record_fields: bool = False,
    ) -> IndexQuery:
        return cls(table, index, bound, None, start, end, limit, cursor, record_fields)


class CountQuery(NamedTuple):
    """How many rows the table holds (those the caller may read)."""

    table: str
    bound: ReadOptions = NO_OPTIONS

    @classmethod
    def rows(cls, table: str, bound: ReadOptions = NO_OPTIONS) -> CountQuery:
        return cls(table, bound)


class BatchQuery(NamedTuple):
    """Several keys' rows at once, in their order; keys as JSON values (a string, a number)."""

    table: str
    keys: tuple[Any, ...]
    bound: ReadOptions = NO_OPTIONS

    @classmethod
    def of_keys(
        cls, table: str, keys: Iterable[Any], bound: ReadOptions = NO_OPTIONS
    ) -> BatchQuery:
        return cls(table, tuple(keys), bound)


class PartitionScan(NamedTuple):
    """Rows of some of the asked node's own partitions, by serialized key (or index entry)
    in [start, end): what a node fanning a paged read out asks a peer. `view` says which
    rows: ``rows``, ``as_of`` (each key's version then) or ``index`` (one index's
    entries); None asks as nodes before views did, rows answered as [key, value].
    `record_fields`: each row also says its record's partition, offset and timestamp."""

    table: str
    partitions: tuple[int, ...]
    bound: ReadOptions = NO_OPTIONS
    view: str | None = "rows"
    start: bytes | None = None
    end: bytes | None = None
    limit: int = DEFAULT_LIMIT
    as_of: int | None = None
    index: str | None = None
    with_value: bool = True
    record_fields: bool = False


class PartitionCount(NamedTuple):
    """How many rows some of the asked node's own partitions hold (a fan-out's count)."""

    table: str
    partitions: tuple[int, ...]
    bound: ReadOptions = NO_OPTIONS


class LocateShare(NamedTuple):
    """Which of some of the asked node's own partitions hold which of `keys` (serialized):
    what a node asks a peer to find the keys of a table whose partitioner is unknown."""

    table: str
    partitions: tuple[int, ...]
    keys: tuple[bytes, ...]
    bound: ReadOptions = NO_OPTIONS


class SnapshotShare(NamedTuple):
    """The rows of a watch's snapshot that some of the asked node's partitions hold, with
    the positions they are exact at: what a node opening a watch asks a peer. `keys`
    (serialized), or else the key `spans`; `at_least`: (partition, position) pairs the
    peer's replicas must have reached first (a resumed watch)."""

    table: str
    partitions: tuple[int, ...]
    keys: tuple[bytes, ...] | None = None
    spans: tuple[tuple[bytes | None, bytes | None], ...] = ()
    at_least: tuple[tuple[int, int], ...] = ()


#: a read of many partitions, answered by the nodes holding them and merged
ManyPartitions = RangeQuery | IndexQuery | CountQuery | BatchQuery
#: what a node asks a peer for its share of a read of many partitions
PeerShare = PartitionScan | PartitionCount | SnapshotShare | LocateShare


class WatchQuery(NamedTuple):
    """A table's rows followed live: `keys`, or the span of `prefix` and/or [start, end)
    (the whole table when none is given); first a snapshot unless `snapshot` is False or the
    watch resumes after the event a token (`since`) names."""

    table: str
    keys: tuple[str, ...] = ()
    prefix: str | None = None
    start: str | None = None
    end: str | None = None
    snapshot: bool = True
    since: str | None = None

    @classmethod
    def of_keys(
        cls, table: str, keys: Iterable[str], *, snapshot: bool = True, since: str | None = None
    ) -> WatchQuery:
        return cls(table, tuple(keys), None, None, None, snapshot, since)

    @classmethod
    def span(
        cls,
        table: str,
        start: str | None = None,
        end: str | None = None,
        *,
        prefix: str | None = None,
        snapshot: bool = True,
        since: str | None = None,
    ) -> WatchQuery:
        return cls(table, (), prefix, start, end, snapshot, since)


#: any read
Query = OnePartition | ManyPartitions | PeerShare
