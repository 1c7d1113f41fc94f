"""Watches as the transports open them (SSE, WebSocket, gRPC): what is asked, and where it starts.

``GET /v1/tables/{t}/watch?key=K[&key=K2…] | ?prefix=P | ?from=A&to=B [&snapshot=false]``
with ``Last-Event-ID: TOKEN`` or ``?since=TOKEN`` to resume. Everything that can
be refused (a bad parameter, a token of another watch, a key outside the
caller's grants, no replica for the snapshot) is refused here, before the
first byte of the stream, so it is an ordinary HTTP error.

A resume token's offsets are judged against the end of each partition (its
high watermark) before anything is shared with other watches: one beyond it
is no position a node ever handed out (400), and the feed every watch of the
node shares must not start there. A caller has at most so many watches open
at once (``--max-watches``, 429), and a start that waits (a resumed snapshot
waiting for a replica, a token the broker is asked about) holds one of the
caller's offset waits (``--max-waits``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import parse_qsl

from tablecast.cluster.node import Node
from tablecast.contract.table_info import TableInfo
from tablecast.live import snapshot
from tablecast.live.events import Encoder, Renderer
from tablecast.live.hub import Hub, Start, Watch
from tablecast.live.resume_token import Token, parse
from tablecast.live.selection import MAX_KEYS, Selection
from tablecast.live.sinks import Sink
from tablecast.query.consistency import NO_OPTIONS
from tablecast.query.errors import ApiError
from tablecast.query.fanout import key_span
from tablecast.query.queries import WatchQuery
from tablecast.query.ratelimit import CallerSlots
from tablecast.query.reads import Router, forbidden_key
from tablecast.query.request import Request

#: the query parameters of a watch (``access_token`` is taken by auth before this)
PARAMS = frozenset({"key", "prefix", "from", "to", "snapshot", "since", "access_token"})


class WatchSlots(CallerSlots):
    """At most `per_caller` watches of one caller open at once."""

    def refusal(self, n: int) -> str:
        return f"this caller has {n} watches open here (at most {self.per_caller}); end one first"


@dataclass
class Plan:
    """A watch ready to begin: what it selects and where it starts. It holds one of the
    caller's watch slots until :meth:`release` (the transport's, when its stream ends)."""

    info: TableInfo
    renderer: Renderer
    selection: Selection
    start: Start
    #: the caller's token expires then (epoch seconds; None: never, or auth off)
    expires: float | None
    slots: WatchSlots | None = None
    subject: str = ""

    def release(self) -> None:
        """Give the caller's watch slot back (once; again is nothing)."""
        slots, self.slots = self.slots, None
        if slots is not None:
            slots.leave(self.subject)


class Live:
    def __init__(self, node: Node, router: Router, port: int | None = None) -> None:
        """`port`: the node's HTTP port, for the check of slow SSE clients (None: off)."""
        self.node = node
        self.router = router
        c = node.config
        self.hub = Hub(
            c.bootstrap_servers, f"tablecast-watch-{c.app_id}-{c.node_id}", lambda: node.tables
        )
        node.ingest_metrics.renewals["watch_feed"] = lambda: self.hub.feed.consumers_renewed
        self.port = port
        self.slots = WatchSlots(c.watches_per_caller)

    async def prepare(self, query: WatchQuery, req: Request) -> Plan:
        """Check the watch `query` for the caller `req` names and take its starting point
        (its snapshot, or a resume). The plan holds one of the caller's watch slots: release
        it when the stream ends."""
        self.hub.start(self.port)
        subject = req.subject
        self.slots.enter(subject)
        try:
            return await self._prepare(query, req, subject)
        except BaseException:
            self.slots.leave(subject)
            raise

    async def prepare_request(self, table: str, query: str, req: Request) -> Plan:
        """:meth:`prepare` for the watch an HTTP request (SSE, WebSocket) spells in its query
        string and Last-Event-ID header."""
        pairs = query_pairs(query)
        return await self.prepare(watch_query(table, pairs, req.headers.get("last-event-id")), req)

    async def _prepare(self, q: WatchQuery, req: Request, subject: str) -> Plan:
        table = q.table
        info, scope = self.router.table(table, req)
        if info.kind != "kv":
            raise ApiError("bad_request", f"{table!r} is a window table: watches follow kv tables")
        local = self.router.local
        if q.keys and (q.prefix is not None or q.start is not None or q.end is not None):
            raise ApiError("bad_request", "a watch takes keys or a prefix/range, not both")
        if q.keys:
            if len(q.keys) > MAX_KEYS:
                raise ApiError("bad_request", f"at most {MAX_KEYS} keys per watch")
            raws = [local.key_bytes(info, k) for k in q.keys]
            if scope is not None:
                for raw, text in zip(raws, q.keys, strict=True):
                    if not scope.allows(raw):
                        raise forbidden_key(table, text)
            selection = Selection.of_keys(info, raws)
        else:
            start, end = key_span(local, info, q.start, q.end, q.prefix)
            if start is not None and end is not None and start > end:
                end = start  # an empty range: a watch that never sees a row
            selection = Selection.of_span(info, start, end, scope)
        token = None if not q.since else self._token(info, selection, q.since)
        renderer, _ = self.hub.source(info)
        start_at = await self._start(info, renderer, selection, req, token, q.snapshot)
        caller = req.caller
        expires = None if caller is None else caller.expires
        return Plan(info, renderer, selection, start_at, expires, self.slots, subject)

    def _token(self, info: TableInfo, selection: Selection, text: str) -> Token:
        token = parse(text)
        if token.table != info.name:
            raise ApiError(
                "bad_request", f"the token is of table {token.table!r}, not {info.name!r}"
            )
        missing = set(selection.partitions) - token.offsets.keys()
        if missing:
            raise ApiError(
                "bad_request",
                f"the token does not cover partition(s) {sorted(missing)[:8]} of this watch: "
                "it belongs to another watch",
            )
        return token

    async def _start(
        self,
        info: TableInfo,
        renderer: Renderer,
        selection: Selection,
        req: Request,
        token: Token | None,
        with_snapshot: bool,
    ) -> Start:
        parts = selection.partitions
        if token is not None:
            offsets = {p: token.offsets[p] for p in parts}
            await self._within_topic(info, offsets, req)
            if token.after is None:
                return Start([], offsets, snapshot=False)
            rest = selection.above(token.after)
            rows, positions = await snapshot.take(
                self.router, info, renderer, rest, req, at_least=offsets, waits=True
            )
            return Start(rows, positions, resumed_at=offsets, after=token.after)
        if with_snapshot:
            rows, positions = await snapshot.take(self.router, info, renderer, selection, req)
            return Start(rows, positions)
        return Start([], {p: await self._now(info, p) for p in parts})

    async def _within_topic(self, info: TableInfo, offsets: dict[int, int], req: Request) -> None:
        """400 when an offset of a resume token lies beyond its partition's end: the shared
        feed would start there. Ends this node can vouch for (its replicas', the feed's)
        answer most; the broker is asked about the rest."""
        replicas = self.node.ingestor.replicas
        known: dict[int, int] = {}
        for p in offsets:
            replica = replicas.get((info.name, p))
            held = 0 if replica is None else max(replica.end_offset, replica.position)
            known[p] = max(held, self.hub.known_end(info, p))
        await self.router.ends.refuse_beyond(
            info, offsets, known, "the resume token", (self.router.waits, req.subject)
        )

    async def _now(self, info: TableInfo, partition: int) -> int:
        """Where "from now on" starts in a partition: this node's replica's position, else the
        topic's end; the feed's position when it is further on.

        Not the feed's position alone: a feed joined a moment ago for another watch starts a
        little before that watch's snapshot and is still reading up to it, and a watch
        started there would get records older than itself as changes."""
        fed = self.hub.now(info, partition) or 0
        replica = self.router.local.readable(info, partition, NO_OPTIONS)
        if replica is not None:
            return max(fed, replica.position)
        return max(fed, await self.hub.end_offset(info, partition))

    def begin(self, plan: Plan, encoder: Encoder, sink: Sink) -> Watch:
        """The watch of `plan`, begun (its slot stays the plan's: release it at the end)."""
        watch = Watch(self.hub, plan.info, plan.renderer, plan.selection, encoder, plan.expires)
        self.hub.begin(watch, sink, plan.start)
        return watch

    def end(self, watch: Watch) -> None:
        self.hub.end(watch)


def watch_query(
    table: str, pairs: Sequence[tuple[str, str]], last_event_id: str | None
) -> WatchQuery:
    """The watch an HTTP request spells: ``?key=`` (repeated) or ``?prefix=``/``?from=``/
    ``?to=``, ``?snapshot=false``, and ``?since=`` or ``Last-Event-ID`` to resume."""
    unknown = {k for k, _ in pairs} - PARAMS
    if unknown:
        raise ApiError(
            "bad_request",
            f"unknown query parameter(s): {', '.join(sorted(unknown))} "
            f"(a watch takes: {', '.join(sorted(PARAMS - {'access_token'}))})",
        )
    params: dict[str, str] = {}
    keys: list[str] = []
    for name, value in pairs:
        if name == "key":
            keys.append(value)
        elif name in params:
            raise ApiError("bad_request", f"{name} is given more than once")
        else:
            params[name] = value
    snap = params.get("snapshot", "true")
    if snap not in ("true", "false"):
        raise ApiError("bad_request", "snapshot is true or false")
    since = params.get("since") or last_event_id or None
    spans = (params.get("prefix"), params.get("from"), params.get("to"))
    return WatchQuery(table, tuple(keys), *spans, snapshot=snap == "true", since=since)


def query_pairs(query: str) -> list[tuple[str, str]]:
    try:
        return parse_qsl(query, keep_blank_values=True, max_num_fields=MAX_KEYS + 16)
    except ValueError as e:
        raise ApiError("bad_request", f"bad query string: {e}") from None
