"""Store lookup: reads from this node's own stores, each exact at a position it reports.

Every read here goes through :meth:`Replica.read`, so what it returns is exactly
what the table topic holds below the position it comes with; the answers'
headers say that position (``X-Tablecast-Position``), and how far behind the
topic's end it was known to be.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import islice
from typing import Any, TypeVar

import orjson

from tablecast.cluster.node import Node
from tablecast.cluster.replica import Replica
from tablecast.contract import positions
from tablecast.contract.table_info import TableInfo
from tablecast.contract.window_keys import (
    split_session_key,
    split_window_key,
    window_key,
)
from tablecast.query.consistency import ReadOptions, may_answer
from tablecast.query.errors import ApiError
from tablecast.query.policy import KeyScope
from tablecast.query.queries import WINDOW_TIME_MAX
from tablecast.query.scans import Row, Scan, check_floor
from tablecast.serde import SerdeError
from tablecast.store import PartitionStore, Record, StoreClosed, Version

Headers = list[tuple[str, str]]
#: status, HTTP body, headers
Answer = tuple[int, bytes, Headers]
#: what a front end makes of a key's record: (table, key bytes, partition, record) -> its body
EncodeEntry = Callable[[TableInfo, bytes, int, Record], Any]
#: a key read's answer: its body is what the front end's EncodeEntry made of the record when
#: this node read it (the HTTP body by default), the HTTP body when a peer answered
EntryAnswer = tuple[int, Any, Headers]


@dataclass(frozen=True, slots=True)
class Found:
    """A read of many rows answered, as data: each front end encodes `doc` its own way (JSON
    over HTTP, messages over gRPC); `headers` say what it reflects (positions, lag)."""

    doc: dict[str, Any]
    headers: Headers

    def answer(self) -> Answer:
        """As the HTTP API gives it."""
        return 200, orjson.dumps(self.doc), self.headers


RETRY_AFTER = [("retry-after", "1")]
MAX_WINDOWS = 10_000
#: entries a look for any window of a key reads at a time
PROBE_WINDOWS = 16
#: the least a page reads from one partition's store at first
MIN_CHUNK = 16
T = TypeVar("T")
#: a key read's body; the value goes in as JSON text
ENTRY = b'{"key":%b,"value":%b,"partition":%d,"offset":%d,"timestamp":%d}'


def position_header(table: str, partition: int, position: int) -> tuple[str, str]:
    """The header saying where a read of one partition is exact (``X-Tablecast-Position``)."""
    return ("x-tablecast-position", positions.token(table, partition, position))


def entry(info: TableInfo, raw: bytes, partition: int, record: Record) -> bytes:
    """A key read's body; SerdeError if the stored value cannot be read as its format."""
    value = info.value_serde
    # %-formatting bytes beats building a dict for orjson by a third on the hot path
    # (JSON values are checked at ingest, so the stored bytes are valid JSON)
    body = record.value if value.format == "json" else orjson.dumps(value.to_json(record.value))
    key = orjson.dumps(info.key_serde.to_json(raw))
    return ENTRY % (key, body, partition, record.offset, record.timestamp)


def key_bytes(info: TableInfo, text: str, max_key_bytes: int) -> bytes:
    """The serialized key for its text form in a URL (400 for one too long or not of the
    table's key format)."""
    if len(text) > max_key_bytes:
        raise ApiError("bad_request", f"key longer than {max_key_bytes} characters")
    serde = info.key_serde
    try:
        return serde.text_to_bytes(text)
    # a serde's parser may fail in its own way (JSON, Avro, int range): all mean bad input
    except (SerdeError, ValueError, TypeError, OverflowError) as e:
        raise ApiError("bad_request", f"key {text!r} is not a {serde.format} key: {e}") from None


def key_answer(
    info: TableInfo,
    raw: bytes,
    partition: int,
    record: Record | None,
    key_text: str,
    headers: Headers,
    encode: EncodeEntry = entry,
) -> EntryAnswer:
    """A key read's answer from the record a store gave (None: the key is not there), as the
    node and its read processes give it: a record whose value cannot be read as its format
    (stored before values were checked at ingest) is not there either."""
    if record is not None:
        try:
            return 200, encode(info, raw, partition, record), headers
        except SerdeError:
            pass
    raise ApiError("key_not_found", f"key {key_text!r} is not in {info.name!r}", headers)


class Local:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.node_header = ("x-tablecast-node", node.id)
        self._by_lag: dict[int, Headers] = {}

    def table(self, name: str) -> TableInfo:
        info = self.node.tables.get(name)
        if info is None:
            ingestor = self.node.ingestor
            if not ingestor.catalog.loaded:
                # a node still reading the catalog cannot tell: ask again, or another node
                raise ApiError(
                    "partition_unavailable", "this node is still loading the catalog", RETRY_AFTER
                )
            if name in ingestor.catalog.tables:
                # in the catalog, but its topic not checked yet (a node just started, Kafka
                # slow to answer) or left out until fixed: the table exists, it is not servable
                why = ingestor.left_out.get(name, "its topic is being checked")
                raise ApiError(
                    "partition_unavailable", f"table {name!r} is not served yet: {why}", RETRY_AFTER
                )
            raise ApiError("table_not_found", f"no table named {name!r}")
        return info

    def key_bytes(self, info: TableInfo, text: str) -> bytes:
        """The serialized key for its text form in a URL."""
        return key_bytes(info, text, self.node.config.max_key_bytes)

    def readable(self, info: TableInfo, partition: int, opts: ReadOptions) -> Replica | None:
        """This node's replica of `partition` if it may answer under `opts` (see
        :func:`tablecast.query.consistency.may_answer`)."""
        slot = (info.name, partition)
        replica = self.node.ingestor.replicas.get(slot)
        if replica is None:
            return None
        if replica.serving and opts.max_staleness_ms is None:  # nearly always
            return replica
        if replica.closed or replica.reopening:
            return None
        if may_answer(replica, opts, False):
            return replica
        if (
            opts.max_staleness_ms is None
            and replica.restored
            and not self.node.view.candidates(slot)
        ):
            return replica  # no node has it caught up: what it holds, reported stale
        return None

    def require(self, info: TableInfo, partition: int, opts: ReadOptions) -> Replica:
        replica = self.readable(info, partition, opts)
        if replica is None:
            raise unavailable(info, partition)
        return replica

    def headers(self, replica: Replica, position: int) -> Headers:
        """The read headers: who answered, the position the answer is exact at, and how far
        behind the topic's end (records and milliseconds) that position was known to be."""
        lag = max(0, replica.end_offset - position)
        cached = replica.position_header
        if cached is None or cached[0] != position:  # reads between two applies share it
            header = position_header(replica.table.name, replica.partition, position)
            cached = replica.position_header = (position, header)
        token = cached[1]
        if replica.stale_since is not None:  # rare: behind, or cut off from Kafka
            return [
                self.node_header,
                ("x-tablecast-lag", str(lag)),
                ("x-tablecast-staleness-ms", str(replica.staleness_ms())),
                token,
            ]
        fresh = self._by_lag.get(lag)
        if fresh is None:
            if len(self._by_lag) > 1024:  # lags seen while catching up: start over
                self._by_lag.clear()
            fresh = self._by_lag[lag] = (
                self.node_header,
                ("x-tablecast-lag", str(lag)),
                ("x-tablecast-staleness-ms", "0"),
            )
        return [*fresh, token]

    def read_key(
        self,
        info: TableInfo,
        raw: bytes,
        partition: int,
        replica: Replica,
        key_text: str,
        encode: EncodeEntry = entry,
    ) -> EntryAnswer:
        """The key's entry as `encode` makes it (the HTTP body unless told otherwise)."""
        try:
            record, position = replica.read(partial(replica.store.get, raw), raw)
        except StoreClosed:
            raise unavailable(info, partition) from None  # released under this read
        headers = self.headers(replica, position)
        return key_answer(info, raw, partition, record, key_text, headers, encode)

    def windows(
        self,
        info: TableInfo,
        raw: bytes,
        replica: Replica,
        time_from: int,
        time_to: int,
        key_text: str | None = None,
    ) -> Answer:
        """The key's windows whose starts are in [time_from, time_to]. With `key_text`, a key
        this partition holds no window of at all is a 404 (a key looked up, whose partition
        is not computed, may have gone elsewhere), not an empty list."""
        found, position = self._windows_of(info, raw, replica, time_from, time_to)
        if not found and key_text is not None and not self._holds_windows(info, raw, replica):
            raise ApiError(
                "key_not_found",
                f"key {key_text!r} has no windows in partition {replica.partition} of "
                f"{info.name!r}",
                self.headers(replica, position),
            )
        vj = info.value_serde.to_json
        items = [{"start": start, "end": end, "value": vj(rec.value)} for start, end, rec in found]
        return 200, orjson.dumps({"items": items}), self.headers(replica, position)

    def _holds_windows(self, info: TableInfo, raw: bytes, replica: Replica) -> bool:
        """Whether the replica holds any window of the key: a few entries at a time, past
        those of longer keys that begin with the same bytes."""
        suffix = info.window_suffix
        start, end = window_key(raw, 0), window_key(raw, WINDOW_TIME_MAX + 1)
        while True:
            scan = partial(replica.store.scan, start, end, PROBE_WINDOWS)
            entries, _ = exact_read(info, replica, scan)
            if any(len(k) == len(raw) + suffix for k, _ in entries):
                return True
            if len(entries) < PROBE_WINDOWS:
                return False
            start = entries[-1][0] + b"\0"

    def _windows_of(
        self, info: TableInfo, raw: bytes, replica: Replica, time_from: int, time_to: int
    ) -> tuple[list[tuple[int, int, Record]], int]:
        """The key's windows whose starts are in [time_from, time_to], as (start, end,
        record), and the position they were read at."""
        size = int(info.extra.get("size_ms", 0))
        entries, position = exact_read(
            info,
            replica,
            partial(
                replica.store.scan,
                window_key(raw, time_from),
                window_key(raw, time_to + 1),
                MAX_WINDOWS,
            ),
        )
        sessions = "session_gap_ms" in info.extra
        suffix = info.window_suffix
        found = []
        for k, rec in entries:
            if len(k) != len(raw) + suffix:
                continue  # a longer key that shares these bytes, not one of this key's windows
            if sessions:
                # a session's end is inclusive (its last record's time), as in Kafka Streams
                _, start, end = split_session_key(k)
            else:
                _, start = split_window_key(k)
                end = start + size
            found.append((start, end, rec))
        return found, position

    def read_as_of(
        self, info: TableInfo, raw: bytes, replica: Replica, at: int, key_text: str
    ) -> Answer:
        """The key's version valid at time `at` (404 if it had no value then)."""
        store = replica.store

        def read() -> Version | None:
            check_floor(info, store, at)
            return store.as_of(raw, at)

        version, position = exact_read(info, replica, read, raw)
        if version is None or version.value is None:
            raise ApiError(
                "key_not_found",
                f"key {key_text!r} had no value in {info.name!r} at {at}",
                self.headers(replica, position),
            )
        body = ENTRY % (
            orjson.dumps(info.key_serde.to_json(raw)),
            orjson.dumps(info.value_serde.to_json(version.value)),
            replica.partition,
            version.offset,
            version.timestamp,
        )
        return 200, body, self.headers(replica, position)

    def history(
        self,
        info: TableInfo,
        raw: bytes,
        replica: Replica,
        start: int,
        end: int,
        limit: int,
        newest_first: bool = False,
    ) -> tuple[list[Version], Headers]:
        """Up to `limit` versions of the key with start <= timestamp < end, oldest first
        (`newest_first`: the latest `limit` of them, newest first)."""
        store = replica.store
        read = (
            partial(newest_versions, store, raw, start, end, limit)
            if newest_first
            else partial(store.versions, raw, start, end, limit)
        )
        versions, position = exact_read(info, replica, read, raw)
        return versions, self.headers(replica, position)

    def page(
        self,
        info: TableInfo,
        partitions: Sequence[int],
        scan: Scan,
        lo: bytes | None,
        hi: bytes | None,
        n: int,
        opts: ReadOptions,
    ) -> tuple[list[Row], Reflected]:
        """The first `n` rows of these local partitions with lo <= sort key < hi, in order,
        and the positions they are exact at.

        Each partition is read in one call of its replica's exact read, first for
        about its fair share of `n`; while one whose share ran out before the merge
        had `n` rows, the first of them to run out is read again, from `lo`, for
        four times as many. So every
        partition's rows are exact at one position (a later read replaces an
        earlier one whole), and a page reads about what it returns, where
        reading `n` from every partition would read partitions × `n`.
        """
        replicas = [self.require(info, p, opts) for p in partitions]
        rows, at = read_page(info, replicas, scan, lo, hi, n)
        reflected = Reflected(info.name)
        for r, position in zip(replicas, at, strict=True):
            reflected.add(r, position)
        return rows, reflected

    def count(
        self, info: TableInfo, partitions: Iterable[int], opts: ReadOptions, scope: KeyScope | None
    ) -> tuple[int, Reflected]:
        """Keys in these local partitions; with a `scope`, only those the caller may read."""
        total = 0
        reflected = Reflected(info.name)
        for p in partitions:
            replica = self.require(info, p, opts)
            store = replica.store
            read: Callable[[], int] = (
                store.__len__ if scope is None else partial(_count_spans, store, scope)
            )
            n, position = exact_read(info, replica, read)
            total += n
            reflected.add(replica, position)
        return total, reflected

    def multi_get(
        self, info: TableInfo, partition: int, raws: Sequence[bytes], opts: ReadOptions
    ) -> tuple[list[Record | None], Replica, int]:
        replica = self.require(info, partition, opts)
        records, position = exact_read(info, replica, partial(replica.store.multi_get, raws))
        return records, replica, position

    def holding(
        self, info: TableInfo, partition: int, raws: Sequence[bytes], opts: ReadOptions
    ) -> list[bool]:
        """Whether `partition` holds each key of `raws`: its row, or in a window table any
        window of it (where a key of a table whose partitioner is unknown is looked for)."""
        if info.kind != "window":
            records, _, _ = self.multi_get(info, partition, raws, opts)
            return [record is not None for record in records]
        replica = self.require(info, partition, opts)
        return [self._holds_windows(info, raw, replica) for raw in raws]


def exact_read(
    info: TableInfo, replica: Replica, read: Callable[[], T], key: bytes | None = None
) -> tuple[T, int]:
    """`read()` of the replica's store, exact at the position returned with it."""
    try:
        return replica.read(read, key)
    except StoreClosed:
        raise unavailable(info, replica.partition) from None  # released under this read


def newest_versions(
    store: PartitionStore, key: bytes, start: int, end: int, limit: int
) -> list[Version]:
    """Up to `limit` versions of `key` with start <= timestamp < end, newest first.

    Each step is the store's ``as_of`` (one backward seek) just before the last version
    found, so a page costs `limit` seeks however long the history before it is.
    """
    out: list[Version] = []
    at = end - 1
    while len(out) < limit and at >= start:
        version = store.as_of(key, at)
        if version is None or version.timestamp < start:
            break
        out.append(version)
        at = version.timestamp - 1
    return out


def read_page(
    info: TableInfo,
    replicas: Sequence[Replica],
    scan: Scan,
    lo: bytes | None,
    hi: bytes | None,
    n: int,
) -> tuple[list[Row], list[int]]:
    """The first `n` rows of these replicas with lo <= sort key < hi, in order, and the
    position each replica's rows are exact at (see :meth:`Local.page`)."""
    if not replicas:
        return [], []
    first = min(n, max(MIN_CHUNK, -(-n // len(replicas)) + 1))
    wants = [first] * len(replicas)
    pages: list[list[Row]] = [[] for _ in replicas]
    at = [0] * len(replicas)
    todo = list(range(len(replicas)))
    while todo:
        for i in todo:
            r = replicas[i]
            read = partial(scan.read, r.store, r.partition, lo, hi, wants[i])
            pages[i], at[i] = exact_read(info, r, read)
        todo = short_pages(pages, wants, n)
        for i in todo:
            wants[i] = min(n, wants[i] * 4)
    return merged(pages, n), at


class Reflected:
    """What a read of several partitions reflects: each partition's position, and the
    worst lag and staleness among the replicas read (the answer's headers)."""

    __slots__ = ("lag", "offsets", "staleness_ms", "table")

    def __init__(self, table: str) -> None:
        self.table = table
        self.offsets: dict[int, int] = {}
        self.lag = 0
        self.staleness_ms = 0

    def add(self, replica: Replica, position: int) -> None:
        self.offsets[replica.partition] = position
        self.lag = max(self.lag, replica.end_offset - position)
        self.staleness_ms = max(self.staleness_ms, replica.staleness_ms())

    def add_answer(self, headers: Headers) -> None:
        """What a peer said its part of the answer reflects (its answer's headers)."""
        for name, value in headers:
            try:
                if name == "x-tablecast-position":
                    self.offsets.update(positions.parse(value).offsets)
                elif name == "x-tablecast-lag":
                    self.lag = max(self.lag, int(value))
                elif name == "x-tablecast-staleness-ms":
                    self.staleness_ms = max(self.staleness_ms, int(value))
            except ValueError:
                continue  # a peer of another version: its part shows no position

    def merge(self, other: Reflected) -> None:
        self.offsets.update(other.offsets)
        self.lag = max(self.lag, other.lag)
        self.staleness_ms = max(self.staleness_ms, other.staleness_ms)

    def headers(self, node_header: tuple[str, str]) -> Headers:
        out = [
            node_header,
            ("x-tablecast-lag", str(self.lag)),
            ("x-tablecast-staleness-ms", str(self.staleness_ms)),
        ]
        if self.offsets:
            token = positions.Position(self.table, self.offsets).text()
            out.append(("x-tablecast-position", token))
        return out


def _count_spans(store: PartitionStore, scope: KeyScope) -> int:
    return sum(store.count_range(lo, hi) for lo, hi in scope.spans)


def short_pages(pages: Sequence[Sequence[Row]], wants: Sequence[int], n: int) -> list[int]:
    """The source to read again for more, if any: of the sources whose page may hide rows
    among the first `n` of the merge — those that gave all they were asked for, fewer
    than `n`, and end before the `n`-th row — the one that ends first (reading it again
    moves the `n`-th row, which may settle the others)."""
    firsts = heapq.nsmallest(n, (row[0] for page in pages for row in page))
    boundary = firsts[-1] if len(firsts) >= n else None
    short = [
        i
        for i, page in enumerate(pages)
        if len(page) >= wants[i] < n and (boundary is None or page[-1][0] < boundary)
    ]
    return [min(short, key=lambda i: pages[i][-1][0])] if short else []


def merged(pages: Iterable[Iterable[Row]], n: int) -> list[Row]:
    """The first `n` rows of pages each sorted by sort key, in that order."""
    return list(islice(heapq.merge(*pages, key=lambda row: row[0]), n))


def unavailable(info: TableInfo, partition: int) -> ApiError:
    return ApiError(
        "partition_unavailable",
        f"partition {partition} of {info.name!r} has no replica ready yet",
        RETRY_AFTER,
    )
