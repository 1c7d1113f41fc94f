"""Reads of many partitions: batchGet, count, and paged reads — range, range as of a time,
and index lookups and ranges — answered by the nodes that hold the partitions and merged.

A paged read groups the partitions by the node that answers for them and asks
each group first for its fair share of the page; while a group gave all it
was asked and still ends before the page's last row, the first such group to
end is asked again, from the page's start, for four times as many. Each
group's rows so come from one read per partition, each exact at a position,
and the answer's ``X-Tablecast-Position`` lists them all: the page is exactly what the table
(or its history, or its index) held at those offsets, over the key range the
page covers. The next page, from its cursor, may be at later offsets.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, Protocol

import orjson

from tablecast.cluster.membership import Member
from tablecast.cluster.node import Node
from tablecast.contract import index_codec
from tablecast.contract.table_info import TableInfo
from tablecast.query.consistency import ReadOptions, TopicEnds, reach
from tablecast.query.cursor import Cursors
from tablecast.query.errors import ApiError
from tablecast.query.local import Answer, Found, Local, Reflected, merged, short_pages
from tablecast.query.locate import Locator
from tablecast.query.ownership import Routing
from tablecast.query.params import int_param
from tablecast.query.peer_calls import Rpc, not_refused, target_of
from tablecast.query.policy import KeyScope, prefix_end
from tablecast.query.queries import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    BatchQuery,
    CountQuery,
    IndexQuery,
    PartitionCount,
    PartitionScan,
    RangeQuery,
)
from tablecast.query.ratelimit import WaitSlots
from tablecast.query.request import Request
from tablecast.query.scans import (
    AsOfScan,
    IndexScan,
    Row,
    Scan,
    require_history,
    require_index,
    require_kv,
    scan_for,
)
from tablecast.serde import SerdeError


class Tables(Protocol):
    """What fan-out reads need of the router (which hands itself over)."""

    node: Node
    local: Local
    routing: Routing
    rpc: Rpc
    cursors: Cursors
    waits: WaitSlots
    ends: TopicEnds
    locator: Locator

    def table(self, name: str, req: Request) -> tuple[TableInfo, KeyScope | None]: ...


MAX_BATCH = 1_000
#: rows a page asks of each group of partitions beyond its fair share, so that a
#: little unevenness in how keys spread costs no second request
FAIR_SHARE_SLACK = 8
#: rows of a page, and what they reflect
Paged = tuple[list[Row], Reflected]


class FanOut:
    def __init__(self, router: Tables) -> None:
        self.router = router
        self.local = router.local
        self.routing = router.routing
        self.rpc = router.rpc
        self.cursors = router.cursors

    async def reach_partitions(
        self, info: TableInfo, partitions: Iterable[int], opts: ReadOptions, req: Request
    ) -> None:
        """Wait until this node's replicas of `partitions` are as far as the caller asked."""
        if opts.at_least:
            wanted = opts.at_least
            replicas = [
                (self.local.require(info, p, opts), wanted[p]) for p in partitions if p in wanted
            ]
            await reach(replicas, opts, req.subject, self.router.waits, self.router.ends)

    # -- batchGet and count ----------------------------------------------------------
    async def batch_get(self, q: BatchQuery, req: Request) -> Found | Answer:
        """The keys' rows, in their order (each key as JSON: a string, a number ...); a
        redirect when the caller asked for one (``redirect=true``)."""
        table, keys, opts = q.table, q.keys, q.bound
        info, scope = self.router.table(table, req)
        require_kv(info)
        opts.check(info)
        if len(keys) > MAX_BATCH:
            raise ApiError("bad_request", f"at most {MAX_BATCH} keys per batch")
        serde = info.key_serde
        raws: list[bytes] = []
        for key in keys:
            try:
                raws.append(serde.serialize(serde.from_json(key)))
            except SerdeError as e:
                raise ApiError(
                    "bad_request", f"key {key!r} is not a {serde.format} key: {e}"
                ) from None
        results: list[Any] = [None] * len(keys)
        by_partition: dict[int, list[int]] = {}
        wanted = []
        for i, raw in enumerate(raws):
            if scope is not None and not scope.allows(raw):
                # never read, never forwarded: a key outside the grants has no value to show
                results[i] = {"key": keys[i], "found": False, "forbidden": True}
            else:
                wanted.append(i)
        if info.placed:
            for i in wanted:
                by_partition.setdefault(info.partition_of(raws[i]), []).append(i)
        else:  # the keys' partitions are looked for first
            found = await self.router.locator.locate(info, [raws[i] for i in wanted], req, opts)
            for j, i in enumerate(wanted):
                if j in found:
                    by_partition.setdefault(found[j], []).append(i)
                else:
                    results[i] = {"key": keys[i], "found": False}
        redirect = self.rpc.redirect_fan_out(info, sorted(by_partition), req, q)
        if redirect is not None:
            return redirect
        value_json = info.value_serde.to_json
        reflected = Reflected(info.name)

        async def here(parts: list[int]) -> bool:
            await self.reach_partitions(info, parts, opts, req)
            for p in parts:
                idx = by_partition[p]
                records, replica, position = self.local.multi_get(
                    info, p, [raws[i] for i in idx], opts
                )
                reflected.add(replica, position)
                for i, rec in zip(idx, records, strict=True):
                    results[i] = (
                        {"key": keys[i], "found": False}
                        if rec is None
                        else {"key": keys[i], "found": True, "value": value_json(rec.value)}
                    )
            return True

        async def there(member: Member, parts: list[int]) -> bool | None:
            idx = [i for p in parts for i in by_partition[p]]
            share = BatchQuery(table, tuple(keys[i] for i in idx), opts)
            body = orjson.dumps({"keys": share.keys})
            answer = await self.rpc.ask(member, "POST", target_of(share, parts), req, body, opts)
            if answer is None or not_refused(answer)[0] != 200:
                return None
            for i, item in zip(idx, orjson.loads(answer[1])["results"], strict=True):
                results[i] = item
            reflected.add_answer(answer[2])
            return True

        await self.rpc.gather(info, sorted(by_partition), req, opts, here, there)
        return Found({"results": results}, reflected.headers(self.local.node_header))

    async def count(self, q: CountQuery, req: Request) -> Found | Answer:
        table, opts = q.table, q.bound
        info, scope = self.router.table(table, req)
        opts.check(info)
        redirect = self.rpc.redirect_fan_out(info, range(info.partitions), req, q)
        if redirect is not None:
            return redirect

        async def here(parts: list[int]) -> tuple[int, Reflected]:
            await self.reach_partitions(info, parts, opts, req)
            return self.local.count(info, parts, opts, scope)

        async def there(member: Member, parts: list[int]) -> tuple[int, Reflected] | None:
            share = PartitionCount(table, tuple(parts), opts)
            answer = await self.rpc.ask(member, "GET", target_of(share, parts), req, opts=opts)
            if answer is None or not_refused(answer)[0] != 200:
                return None
            reflected = Reflected(info.name)
            reflected.add_answer(answer[2])
            return int(orjson.loads(answer[1])["count"]), reflected

        counts = await self.rpc.gather(info, range(info.partitions), req, opts, here, there)
        reflected = Reflected(info.name)
        for _, r in counts:
            reflected.merge(r)
        total = sum(n for n, _ in counts)
        return Found({"count": total}, reflected.headers(self.local.node_header))

    # -- paged reads -------------------------------------------------------------------
    async def range(self, q: RangeQuery, req: Request) -> Found | Answer:
        info, scope = self.router.table(q.table, req)
        require_kv(info)
        q.bound.check(info)
        start, end = key_span(self.local, info, q.start, q.end, q.prefix)
        query = [q.start, q.end, q.prefix, "true" if q.owned else None]
        scan: Scan
        if q.as_of is None:
            scan = Scan(info, scope, q.record_fields)
        else:
            require_history(info)
            scan = AsOfScan(info, scope, q.as_of, q.record_fields)
            query.append(str(q.as_of))  # a plain range's cursor stays as it always was
        if scope is not None and not scope.clip(start, end):  # nothing granted in the range
            return self._empty_page()
        partitions = None
        if q.owned:
            # only what this node answers for as active: a job run beside every node
            # then sees each key exactly once across the cluster
            view = self.router.node.view
            me = self.router.node.id
            partitions = [
                p for p in range(info.partitions) if view.effective_active((info.name, p)) == me
            ]
        return await self._paged(info, req, q, scan, start, end, query, partitions)

    async def index(self, q: IndexQuery, req: Request) -> Found | Answer:
        """``/index/NAME/VALUE``: the rows with that value, by key (items {key, value});
        ``/index/NAME?from=&to=``: the rows with values in [from, to), by value then key
        (items {index, key, value})."""
        info, scope = self.router.table(q.table, req)
        require_index(info, q.index)
        q.bound.check(info)
        if q.value is not None:
            lo = _index_value(q.value, "the value")
            hi = prefix_end(lo)
            scan = IndexScan(info, scope, q.index, False, q.record_fields)
            query = [q.index, q.value]
        else:
            lo = None if q.start is None else _index_value(q.start, "from")
            hi = None if q.end is None else _index_value(q.end, "to")
            scan = IndexScan(info, scope, q.index, True, q.record_fields)
            query = [q.index, q.start, q.end]
        return await self._paged(info, req, q, scan, lo, hi, query)

    async def _paged(
        self,
        info: TableInfo,
        req: Request,
        q: RangeQuery | IndexQuery,
        scan: Scan,
        lo: bytes | None,
        hi: bytes | None,
        query: list[str | None],
        partitions: list[int] | None = None,
    ) -> Found | Answer:
        """One page of `scan` over [lo, hi) from the query's cursor, of its ``limit``."""
        limit, opts = q.limit, q.bound
        if q.cursor:
            lo = self.cursors.decode(q.cursor, query) + b"\x00"  # after the last row
        if lo is not None and hi is not None and lo >= hi:
            return self._empty_page()
        if partitions is not None:  # only this node's own (range?owned=true)
            await self.reach_partitions(info, partitions, opts, req)
            rows, reflected = self.local.page(info, partitions, scan, lo, hi, limit + 1, opts)
        else:
            redirect = self.rpc.redirect_fan_out(info, range(info.partitions), req, q)
            if redirect is not None:
                return redirect
            rows, reflected = await self._page(info, req, opts, scan, lo, hi, limit + 1)
        more = len(rows) > limit
        rows = rows[:limit]
        body = {
            "items": [item for _, item in rows],
            "next_cursor": self.cursors.encode(rows[-1][0], query) if more else None,
        }
        return Found(body, reflected.headers(self.local.node_header))

    def _empty_page(self) -> Found:
        return Found({"items": [], "next_cursor": None}, [self.local.node_header])

    async def _page(
        self,
        info: TableInfo,
        req: Request,
        opts: ReadOptions,
        scan: Scan,
        lo: bytes | None,
        hi: bytes | None,
        n: int,
    ) -> Paged:
        """The first `n` rows in [lo, hi) over all partitions, and what they reflect."""

        async def fetch(parts: list[int], want: int) -> Paged:
            async def here(local: list[int]) -> Paged:
                await self.reach_partitions(info, local, opts, req)
                return self.local.page(info, local, scan, lo, hi, want, opts)

            async def there(member: Member, remote: list[int]) -> Paged | None:
                share = PartitionScan(
                    info.name, tuple(remote), opts, scan.view, lo, hi, want, **scan.share()
                )
                answer = await self.rpc.ask(member, "GET", target_of(share, remote), req, opts=opts)
                if answer is None or not_refused(answer)[0] != 200:
                    return None
                reflected = Reflected(info.name)
                reflected.add_answer(answer[2])
                items = orjson.loads(answer[1])["items"]
                return [(bytes.fromhex(k), item) for k, item in items], reflected

            parts_read = await self.rpc.gather(info, parts, req, opts, here, there)
            reflected = Reflected(info.name)
            for _, r in parts_read:
                reflected.merge(r)
            return merged([rows for rows, _ in parts_read], want), reflected

        owners = self.routing.groups(info, range(info.partitions), req, opts)
        groups = [parts for _, parts in owners]
        share = [-(-n * len(ps) // info.partitions) + FAIR_SHARE_SLACK for ps in groups]
        wants = [min(n, w) for w in share]
        if len(groups) == 1:  # one node answers for all: no task per group
            got = [await fetch(groups[0], wants[0])]
        else:
            got = await asyncio.gather(*(fetch(ps, w) for ps, w in zip(groups, wants, strict=True)))
        pages = [rows for rows, _ in got]
        reflects = [r for _, r in got]
        todo = short_pages(pages, wants, n)
        while todo:
            i = todo[0]
            wants[i] = min(n, wants[i] * 4)
            pages[i], reflects[i] = await fetch(groups[i], wants[i])
            todo = short_pages(pages, wants, n)
        reflected = Reflected(info.name)
        for r in reflects:
            reflected.merge(r)
        return merged(pages, n), reflected

    # -- a peer's share: what a fan-out asks of a peer, answered from local stores only --
    # The caller's token came along: the caller's grants apply here, where the store is read.
    async def partition_scan(self, q: PartitionScan, req: Request) -> Answer:
        info, scope = self.router.table(q.table, req)
        q.bound.check(info)
        parts = own_partitions(info, q.partitions)
        scan = scan_for(info, scope, q)
        await self.reach_partitions(info, parts, q.bound, req)
        limit = min(q.limit, MAX_LIMIT + 1)
        rows, reflected = self.local.page(info, parts, scan, q.start, q.end, limit, q.bound)
        if q.view is not None:
            items = [(k.hex(), item) for k, item in rows]
        else:  # what nodes that name no view (older ones) read: rows as [key hex, value]
            items = [(k.hex(), item["value"]) for k, item in rows]
        return 200, orjson.dumps({"items": items}), reflected.headers(self.local.node_header)

    async def partition_count(self, q: PartitionCount, req: Request) -> Answer:
        info, scope = self.router.table(q.table, req)
        q.bound.check(info)
        parts = own_partitions(info, q.partitions)
        await self.reach_partitions(info, parts, q.bound, req)
        total, reflected = self.local.count(info, parts, q.bound, scope)
        return 200, orjson.dumps({"count": total}), reflected.headers(self.local.node_header)


def _index_value(text: str, what: str) -> bytes:
    try:
        return index_codec.encode_value(index_codec.parse_text(text))
    except index_codec.BadIndex as e:
        raise ApiError("bad_request", f"{what} is not an index value: {e}") from None


def limit_param(params: dict[str, str]) -> int:
    limit: int = int_param(params, "limit", DEFAULT_LIMIT)
    if not 1 <= limit <= MAX_LIMIT:
        raise ApiError("bad_request", f"limit must be between 1 and {MAX_LIMIT}")
    return limit


def partitions_of(text: str) -> tuple[int, ...]:
    """A comma-separated list of partitions; 400 for one that is no integer."""
    try:
        return tuple(int(x) for x in text.split(",") if x)
    except ValueError:
        raise ApiError("bad_request", "partitions is a comma-separated list of integers") from None


def own_partitions(info: TableInfo, parts: tuple[int, ...]) -> list[int]:
    """`parts`, each a partition of `info`'s table and none twice; 400 otherwise."""
    if any(not 0 <= p < info.partitions for p in parts):
        raise ApiError("bad_request", f"{info.name!r} has partitions 0..{info.partitions - 1}")
    if len(set(parts)) != len(parts):
        raise ApiError("bad_request", "partitions names a partition twice")
    return list(parts)


def key_span(
    local: Local, info: TableInfo, start: str | None, end: str | None, prefix: str | None
) -> tuple[bytes | None, bytes | None]:
    """The serialized keys [start, end) of keys in their text form, within `prefix` (each
    optional: None is unbounded), for a range read or a watch."""
    lo = None if start is None else local.key_bytes(info, start)
    hi = None if end is None else local.key_bytes(info, end)
    if prefix is not None:
        first = prefix_bytes(info, prefix)
        lo = first if lo is None else max(lo, first)
        after = prefix_end(first)
        hi = after if hi is None else (hi if after is None else min(hi, after))
    return lo, hi


def prefix_bytes(info: TableInfo, text: str) -> bytes:
    """A prefix of serialized keys: the text's UTF-8 bytes (string and compact-JSON keys)."""
    fmt = info.key_serde.format
    if fmt in ("string", "json"):
        return text.encode()
    if fmt == "bytes":
        try:
            return text.encode("latin-1")
        except UnicodeEncodeError:
            raise ApiError("bad_request", "a bytes prefix is latin-1 text") from None
    raise ApiError("bad_request", f"prefix scans need string, json or bytes keys, not {fmt}")


__all__ = ["FanOut", "KeyScope", "limit_param"]
