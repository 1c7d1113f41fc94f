"""Any node answers any read: :meth:`Router.read` takes a read (:mod:`.queries`) on top of
ownership, store lookup and RPC.

The parts, as Kafka Streams separates them: :mod:`.ownership` says which node
answers for a partition, :mod:`.local` reads this node's stores (exact at a
position), :mod:`.peer_calls` forwards, redirects and fans out to peers, and
:mod:`.consistency` reads every read's bound (``max_lag``,
``max_staleness_ms``, ``after``, ``min_offset``, ``timeout_ms``, ``redirect``)
in one place. This module answers the reads of one partition (a key, its
windows, its history, where it lives); :mod:`.fanout` those of many (batchGet,
range, count, index).
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable
from inspect import isawaitable
from typing import Any, TypeVar

import orjson

from tablecast.cluster.membership import Member
from tablecast.cluster.node import Node
from tablecast.cluster.replica import Replica
from tablecast.contract.partitioner import UNKNOWN
from tablecast.contract.table_info import TableInfo
from tablecast.query.consistency import (
    NO_OPTIONS,
    ReadOptions,
    TopicEnds,
    reach,
)
from tablecast.query.cursor import Cursors
from tablecast.query.errors import ApiError
from tablecast.query.fanout import FanOut
from tablecast.query.forwarding import FORWARDING
from tablecast.query.kept_answers import Answers, mark
from tablecast.query.local import (
    Answer,
    EncodeEntry,
    EntryAnswer,
    Found,
    Headers,
    Local,
    entry,
)
from tablecast.query.locate import Locator
from tablecast.query.ownership import ME, Routing
from tablecast.query.peer_calls import Rpc, key_target, maybe, target_of
from tablecast.query.peer_pool import PeerPool
from tablecast.query.policy import KeyScope
from tablecast.query.queries import (
    BatchQuery,
    CountQuery,
    HistoryQuery,
    IndexQuery,
    KeyQuery,
    LocateShare,
    MetadataQuery,
    PartitionCount,
    PartitionScan,
    Query,
    RangeQuery,
    WindowsQuery,
)
from tablecast.query.ratelimit import WaitSlots
from tablecast.query.request import Request
from tablecast.query.scans import require_history, require_kv
from tablecast.query.short_path import Forwards

#: reads of one caller that may wait for an offset at once (serve --max-waits)
DEFAULT_WAITS_PER_CALLER = 16
#: history bounds: the least and the largest record timestamp
TIME_MIN, TIME_MAX = -(2**63), 2**63 - 1
_TS = struct.Struct(">q")

Read = Callable[[Replica], Answer]
T = TypeVar("T")


class Router:
    def __init__(
        self,
        node: Node,
        cursors: Cursors,
        peers: PeerPool,
        waits: WaitSlots | None = None,
        answers: Answers | None = None,
        forwarding: str = "short",
    ) -> None:
        """`answers`: whole answers of plain key reads, kept (None: not kept). The short
        path of `forwarding` needs them: it is for the same reads."""
        if forwarding not in FORWARDING:
            raise ValueError(f"forwarding {forwarding!r} is not one of {FORWARDING}")
        self.node = node
        self.local = Local(node)
        self.routing = Routing(node, self.local)
        self.rpc = Rpc(peers, self.routing, batch=forwarding != "one-by-one")
        self.cursors = cursors
        self.answers = answers
        coalescer = self.rpc.coalescer
        #: the short path of plain forwarded reads (:mod:`tablecast.query.short_path`)
        self.forwards = (
            Forwards(node.ingestor, self.routing, coalescer)
            if forwarding == "short" and coalescer is not None and answers is not None
            else None
        )
        self.waits = waits or WaitSlots(DEFAULT_WAITS_PER_CALLER)
        #: partition ends as the broker says them, for positions callers name (after, resumes)
        self.ends = TopicEnds(lambda: node.config.bootstrap_servers)
        self.fan = FanOut(self)
        #: where keys are, in tables whose partitioner is unknown
        self.locator = Locator(self)
        self._readers: dict[type, Callable[[Any, Request], Any]] = {
            KeyQuery: self.key,
            WindowsQuery: self.windows,
            HistoryQuery: self.history,
            MetadataQuery: self.metadata,
            RangeQuery: self.fan.range,
            IndexQuery: self.fan.index,
            CountQuery: self.fan.count,
            BatchQuery: self.fan.batch_get,
            PartitionScan: self.fan.partition_scan,
            PartitionCount: self.fan.partition_count,
            LocateShare: self.locate_share,
        }

    def table(self, name: str, req: Request) -> tuple[TableInfo, KeyScope | None]:
        """The table and what of it the caller may read (None: all of it); 403 when nothing.

        Every node a request passes applies this, and so does the node that
        reads the store: a forwarding node is never trusted to have filtered.
        """
        grants = req.grants
        if grants is None:
            return self.local.table(name), None
        return grants.table_scope(name, self.local.table)

    def _key(self, table: str, key_text: str, req: Request) -> tuple[TableInfo, bytes]:
        """The table and the key's bytes, for a key the caller may read."""
        info, scope = self.table(table, req)
        raw = self.local.key_bytes(info, key_text)
        if scope is not None and not scope.allows(raw):
            raise forbidden_key(table, key_text)
        return info, raw

    def read(self, query: Query, req: Request) -> Answer | Awaitable[Answer | Found]:
        """The answer to `query` for the caller `req` names, whichever front end asked: a
        read of many partitions answers with its rows as data (:class:`Found`) or a
        redirect."""
        return self._readers[type(query)](query, req)  # type: ignore[no-any-return]

    # -- reads of one partition ------------------------------------------------
    def key(
        self,
        q: KeyQuery,
        req: Request,
        keep_as: str | None = None,
        encode: EncodeEntry = entry,
    ) -> EntryAnswer | Awaitable[EntryAnswer]:
        """One key's entry. `keep_as`: the name to remember a plain local answer under in
        :attr:`answers` (see :mod:`tablecast.query.kept_answers`): HTTP's is the URL path,
        and its caller also takes a peer's answer with its headers as wire lines
        (:meth:`Rpc.forward`). `encode`: what the body of an answer read here is made of the
        record (the HTTP body unless told otherwise; gRPC makes its message); an answer of
        a peer, or of ``as_of``, is always the HTTP body."""
        table, key_text = q.table, q.key
        caller = req.caller
        if caller is None or caller.grants is None:  # the hot path without a policy: no call
            info, scope = self.local.table(table), None
        else:
            info, scope = caller.grants.table_scope(table, self.local.table)
        require_kv(info)
        raw = self.local.key_bytes(info, key_text)
        if scope is not None and not scope.allows(raw):
            raise forbidden_key(table, key_text)
        if info.partitioner == UNKNOWN:
            at = lambda p: self._key_in(info, raw, p, q, req, keep_as, encode)  # noqa: E731
            learned = self._learned(info, raw, req, q.bound)
            tried = None
            if learned is not None:
                # as fast as a computed partition when it is read here
                try:
                    tried = at(learned)
                except ApiError as e:
                    if e.code != "key_not_found":
                        raise
                    self.locator.forget(info, raw)  # deleted here, or moved: look again
                else:
                    if not isawaitable(tried):
                        return tried
            return self._unplaced(info, raw, key_text, q.bound, req, at, None, tried)
        return self._key_in(info, raw, info.partition_of(raw), q, req, keep_as, encode)

    def _key_in(
        self,
        info: TableInfo,
        raw: bytes,
        partition: int,
        q: KeyQuery,
        req: Request,
        keep_as: str | None,
        encode: EncodeEntry,
    ) -> EntryAnswer | Awaitable[EntryAnswer]:
        """:meth:`key` of the key's partition."""
        table, key_text = q.table, q.key
        opts = q.bound
        local = self.local
        plain = opts is NO_OPTIONS and q.as_of is None
        if plain:
            replica = local.readable(info, partition, opts)
            if replica is not None and self.routing.answers_here(info, partition, req, opts):
                # the hot path: one replica lookup, no choice list, no closure
                try:
                    if keep_as is None or self.answers is None:
                        return local.read_key(info, raw, partition, replica, key_text, encode)
                    before = mark(replica)
                    answer = local.read_key(info, raw, partition, replica, key_text, encode)
                    self.answers.keep(keep_as, info, replica, before, answer[2], answer[1])
                    return answer
                except ApiError as e:
                    if e.code != "partition_unavailable":
                        raise
                    # its store closed under this read (released, or reopened after a
                    # failed write): routed below, peers first
        else:
            opts.check(info)
        as_of = q.as_of
        read: Read
        if as_of is None:
            read = lambda r: local.read_key(info, raw, partition, r, key_text, encode)  # noqa: E731
        else:
            require_history(info)
            read = lambda r: local.read_as_of(info, raw, r, as_of, key_text)  # noqa: E731
        # a peer's answer comes as its wire lines only to HTTP, whose body is the default
        wire = keep_as is not None and plain and encode is entry
        if wire and self.forwards is not None and info.partitioner != UNKNOWN:
            # (not for a key looked up: a peer's 404 sends it to look again, which the
            # short path, passing answers through, could not)
            # the next read of this path skips the router when a peer answers it
            self.forwards.remember(keep_as, info, partition, key_target(table, key_text, ""))  # type: ignore[arg-type]
        target = target_of(q, (partition,))
        return self.one_partition(info, partition, req, opts, target, read, wire)

    def forward_failed(
        self, q: KeyQuery, req: Request, failed: Member
    ) -> Answer | Awaitable[Answer]:
        """A plain read the short path (:mod:`tablecast.query.short_path`) sent to `failed`,
        which gave no answer (unreachable, or 503): the other choices, as
        :meth:`Rpc.forward` takes them when its first choice fails."""
        table, key_text = q.table, q.key
        info = self.local.table(table)
        raw = self.local.key_bytes(info, key_text)
        if info.partitioner == UNKNOWN:
            learned = self.locator.learned(info, raw)
            if learned is None:  # forgotten since the short path took it: look again
                return self.key(q, req)
            partition = learned
        else:
            partition = info.partition_of(raw)
        local = self.local
        choices = [
            c
            for c in self.routing.choices(info, partition, req, NO_OPTIONS)
            if not (isinstance(c, Member) and c.id == failed.id)
        ]

        def here() -> Answer:
            replica = local.require(info, partition, NO_OPTIONS)
            return local.read_key(info, raw, partition, replica, key_text)

        target = key_target(table, key_text, "")
        return self.rpc.elsewhere(info, partition, choices, target, req, NO_OPTIONS, here)

    def windows(self, q: WindowsQuery, req: Request) -> Answer | Awaitable[Answer]:
        info, raw = self._key(q.table, q.key, req)
        if info.kind != "window":
            raise ApiError("bad_request", f"{q.table!r} is not a window table")
        q.bound.check(info)
        local = self.local
        time_from, time_to = q.time_from, q.time_to
        # a key looked up: a partition holding none of its windows says 404, so a node that
        # learned the partition looks again (the key moved, or its windows expired)
        looked_up = q.key if info.partitioner == UNKNOWN else None

        def at(partition: int) -> Answer | Awaitable[Answer]:
            return self.one_partition(
                info,
                partition,
                req,
                q.bound,
                target_of(q, (partition,)),
                lambda r: local.windows(info, raw, r, time_from, time_to, looked_up),
            )

        if looked_up is not None:
            # a key in no partition has no windows; a forwarded read says 404 for its
            # forwarder, which then looks everywhere
            nothing = None if req.forwarded else (200, orjson.dumps({"items": []}), [])
            return self._unplaced(info, raw, q.key, q.bound, req, at, nothing)
        return at(info.partition_of(raw))

    def history(self, q: HistoryQuery, req: Request) -> Answer | Awaitable[Answer]:
        """Versions of one key, oldest first (``newest_first``: newest first): ``{"items":
        [{"value", "timestamp", "offset"}], "next_cursor"}``; a delete is a version with a
        null value."""
        info, raw = self._key(q.table, q.key, req)
        require_history(info)
        q.bound.check(info)
        start = TIME_MIN if q.time_from is None else q.time_from
        end = TIME_MAX if q.time_to is None else q.time_to
        limit, newest_first = q.limit, q.newest_first
        query = history_query(q)
        if q.cursor:
            last = self._history_cursor(q)
            if newest_first:
                # the next page holds the versions before the last one shown
                end = _TS.unpack(last)[0]
            else:
                # a last version at the greatest time leaves nothing after it: an empty
                # page, not a start past what a store can encode
                start = min(_TS.unpack(last)[0] + 1, TIME_MAX)
        vj = info.value_serde.to_json
        cursors = self.cursors

        def read(replica: Replica) -> Answer:
            versions, headers = self.local.history(
                info, raw, replica, start, end, limit + 1, newest_first
            )
            more = len(versions) > limit
            shown = versions[:limit]
            body = {
                "items": [
                    {
                        "value": None if v.value is None else vj(v.value),
                        "timestamp": v.timestamp,
                        "offset": v.offset,
                    }
                    for v in shown
                ],
                "next_cursor": cursors.encode(_TS.pack(shown[-1].timestamp), query)
                if more
                else None,
            }
            return 200, orjson.dumps(body), headers

        def at(partition: int) -> Answer | Awaitable[Answer]:
            return self.one_partition(
                info, partition, req, q.bound, target_of(q, (partition,)), read
            )

        if info.partitioner == UNKNOWN:
            nothing = 200, orjson.dumps({"items": [], "next_cursor": None}), []
            return self._unplaced(info, raw, q.key, q.bound, req, at, nothing)
        return at(info.partition_of(raw))

    def _learned(self, info: TableInfo, raw: bytes, req: Request, opts: ReadOptions) -> int | None:
        """The partition a key of a table whose partitioner is unknown was learned in, if
        this read may go there: a read forwarded here looks only in this node's partitions
        (its forwarder, told 404, looks everywhere), so a partition learned elsewhere is
        no answer for it."""
        learned = self.locator.learned(info, raw)
        if learned is not None and req.forwarded and not self.local.readable(info, learned, opts):
            return None
        return learned

    async def _unplaced(
        self,
        info: TableInfo,
        raw: bytes,
        key_text: str,
        opts: ReadOptions,
        req: Request,
        at: Callable[[int], T | Awaitable[T]],
        nowhere: T | None,
        tried: Awaitable[T] | None = None,
    ) -> T:
        """`at` the partition of a key of a table whose partitioner is unknown: the one it
        was learned in, else the one it is found in (:mod:`tablecast.query.locate`).
        `nowhere`: the answer when no partition holds it (None: 404). `tried`: the read of
        the learned partition, already under way.

        A peer asked for a key looks only in its own partitions, so its 404 says the key
        left the learned partition: this node looks again, everywhere."""
        locator = self.locator
        learned = None if tried is not None else self._learned(info, raw, req, opts)
        if tried is not None or learned is not None:
            try:
                got = await (tried if tried is not None else maybe(at(learned)))  # type: ignore[arg-type]
            except ApiError as e:
                if e.code != "key_not_found":
                    raise
            else:
                if got[0] != 404:  # type: ignore[index]
                    return got
            locator.forget(info, raw)  # deleted there, or moved: look again
        found = await locator.locate(info, [raw], req, opts)
        if found:
            return await maybe(at(found[0]))
        if nowhere is not None:
            return nowhere
        raise ApiError("key_not_found", f"key {key_text!r} is not in {info.name!r}")

    async def locate_share(self, q: LocateShare, req: Request) -> Answer:
        """A peer asks which of this node's partitions hold which keys."""
        info, scope = self.table(q.table, req)
        q.bound.check(info)
        return await self.locator.share(q, info, req, scope)

    def _history_cursor(self, q: HistoryQuery) -> bytes:
        """The last timestamp (8 bytes) a history cursor names; 400 for any other cursor,
        naming the order when it was made for the other one (it pages its own order only)."""
        assert q.cursor is not None
        try:
            last = self.cursors.decode(q.cursor, history_query(q))
        except ApiError:
            other = q._replace(newest_first=not q.newest_first)
            if not self._signed_for(q.cursor, history_query(other)):
                raise
            made = "asc" if q.newest_first else "desc"
            raise ApiError(
                "bad_request", f"the cursor continues order={made}: give order={made} with it"
            ) from None
        if len(last) != _TS.size:
            # an index page's cursor has a query of the same shape and passes the
            # signature check: only a timestamp's 8 bytes continue a history
            raise ApiError("bad_request", "invalid cursor")
        return last

    def _signed_for(self, cursor: str, query: list[str | None]) -> bool:
        try:
            self.cursors.decode(cursor, query)
        except ApiError:
            return False
        return True

    def one_partition(
        self,
        info: TableInfo,
        partition: int,
        req: Request,
        opts: ReadOptions,
        target: str,
        read: Read,
        wire: bool = False,
    ) -> Answer | Awaitable[Answer]:
        """A read of one partition wherever it is answered: here (once the replica is as far
        as ``after``/``min_offset`` ask), forwarded to its owner, or redirected there.
        `wire`: a plain read whose caller takes a forwarded answer as :meth:`Rpc.forward`
        gives it."""
        if opts.min_offset_partition not in (None, partition):
            raise ApiError(
                "bad_request",
                f"min_offset names partition {opts.min_offset_partition}; "
                f"the key is in {partition}",
            )
        want = opts.at_least.get(partition) if opts.at_least else None
        replica = self.local.readable(info, partition, opts)
        tried_here = False
        if replica is not None and self.routing.answers_here(info, partition, req, opts):
            if want is not None and replica.position < want:
                again = lambda: self.one_partition(info, partition, req, opts, target, read)  # noqa: E731
                return self._after(replica, want, req, opts, read, again)
            try:
                return read(replica)
            except ApiError as e:
                if e.code != "partition_unavailable":
                    raise
                # its store closed under this read (released, or reopened after a failed
                # write): a peer holding the partition answers, or this node once it can
                tried_here = True
        choices = self.routing.choices(info, partition, req, opts)

        def here() -> Answer | Awaitable[Answer]:
            replica = self.local.require(info, partition, opts)
            if want is not None and replica.position < want:
                return self._after(replica, want, req, opts, read, None)
            return read(replica)

        if choices and choices[0] == ME and not tried_here:
            return here()
        if wire:
            return self.rpc.forward(info, partition, choices, target, req, here)
        return self.rpc.elsewhere(info, partition, choices, target, req, opts, here)

    async def _after(
        self,
        replica: Replica,
        want: int,
        req: Request,
        opts: ReadOptions,
        read: Read,
        again: Callable[[], Answer | Awaitable[Answer]] | None,
    ) -> Answer:
        """`read` once the replica has reached position `want`; if it is released (or its
        store reopened) meanwhile, the read routed `again` (or partition_unavailable, for
        the caller to move on)."""
        try:
            await reach([(replica, want)], opts, req.subject, self.waits, self.ends)
            return read(replica)
        except ApiError:
            if not (replica.closed or replica.reopening) or again is None:
                raise
        return await maybe(again())

    # -- where a key lives -----------------------------------------------------
    def metadata(self, q: MetadataQuery, req: Request) -> Answer | Awaitable[Answer]:
        info, raw = self._key(q.table, q.key, req)
        if info.partitioner == UNKNOWN:
            nowhere = 200, orjson.dumps({"partition": None, "active": None, "standbys": []}), []
            at = lambda p: self._metadata_of(info, p)  # noqa: E731
            return self._unplaced(info, raw, q.key, NO_OPTIONS, req, at, nowhere)
        return self._metadata_of(info, info.partition_of(raw))

    def _metadata_of(self, info: TableInfo, partition: int) -> Answer:
        slot = (info.name, partition)
        view = self.node.view
        active_id = view.effective_active(slot)
        members = view.members
        active = (
            {"node": active_id, "url": members[active_id].url} if active_id in members else None
        )
        standbys = []
        for m in view.candidates(slot):
            if m.id != active_id:
                state = m.replicas.get(slot, {})
                standbys.append({"node": m.id, "url": m.url, "lag": state.get("lag", 0)})
        body = {"partition": partition, "active": active, "standbys": standbys}
        return 200, orjson.dumps(body), []


def history_query(q: HistoryQuery) -> list[str | None]:
    """What a history cursor is signed for. An ascending one keeps the shape cursors had
    before there was an order; a descending one names its order, so neither continues
    the other."""
    query = [
        q.key,
        None if q.time_from is None else str(q.time_from),
        None if q.time_to is None else str(q.time_to),
    ]
    return [*query, "desc"] if q.newest_first else query


def forbidden_key(table: str, key_text: str) -> ApiError:
    return ApiError("forbidden", f"this token may not read key {key_text!r} of {table!r}")


__all__ = ["Headers", "Request", "Router"]
