"""The RPC layer: asking peers, forwarding a read to its owner or redirecting to it, and
fanning a read of many partitions out to the nodes that answer for them.

A peer that cannot be reached or answers 503 is skipped for the next choice
at once, so a dead node costs a retry, not a failed query. When no choice is
left, the read waits up to :data:`NO_REPLICA_GRACE_S` for the cluster view to
name one before it answers 503: a replica that just became ready (a node back
from a restart while another leaves) is only seen after its next heartbeat
and tick, and a rolling restart must not fail reads for that. A peer's judgement of
the read itself (a bad parameter, a refused caller, a limit reached, a wait run out)
is the caller's answer (:func:`not_refused`): the nodes share one policy and one
read core, so another node would answer alike.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from time import monotonic
from typing import TypeVar
from urllib.parse import quote, urlencode

import orjson

from tablecast.cluster.membership import HEARTBEAT_S, Member
from tablecast.cluster.node import TICK_S
from tablecast.contract.table_info import TableInfo
from tablecast.query.coalesce import (
    PASS_HEADERS,
    READ_PREFIX,
    Coalescer,
    RawResponse,
    unwired,
)
from tablecast.query.consistency import NO_OPTIONS, ReadOptions
from tablecast.query.errors import ApiError
from tablecast.query.local import Answer, unavailable
from tablecast.query.ownership import ME, Choice, Routing
from tablecast.query.peer_pool import PeerPool, PeerUnavailable
from tablecast.query.queries import (
    DEFAULT_LIMIT,
    WINDOW_TIME_MAX,
    BatchQuery,
    CountQuery,
    HistoryQuery,
    IndexQuery,
    KeyQuery,
    LocateShare,
    ManyPartitions,
    MetadataQuery,
    PartitionCount,
    PartitionScan,
    Query,
    RangeQuery,
    SnapshotShare,
    WindowsQuery,
)
from tablecast.query.request import Request, path_segment

FORWARD_TIMEOUT_S = 2.0
#: how long an internal call may take beyond the wait for ``after`` it passes on
WAIT_SLACK_S = 1.0
#: two heartbeats and a tick: how stale the view may be about a replica that is ready
NO_REPLICA_GRACE_S = 2 * HEARTBEAT_S + TICK_S
T = TypeVar("T")


class Rpc:
    def __init__(self, peers: PeerPool, routing: Routing, batch: bool = True) -> None:
        self.peers = peers
        #: forwarded reads that leave together go as one call (`batch` False: one by one)
        self.coalescer = Coalescer(peers) if batch else None
        self.routing = routing

    async def ask(
        self,
        member: Member,
        method: str,
        target: str,
        req: Request,
        body: bytes = b"",
        opts: ReadOptions | None = None,
        timeout: float = FORWARD_TIMEOUT_S,
    ) -> Answer | None:
        """A peer's answer, or None if it could not give one (unreachable, or 503)."""
        waits = opts is not None and opts.at_least
        if waits:  # it may wait for `after` that long first
            timeout += opts.timeout_ms / 1000 + WAIT_SLACK_S  # type: ignore[union-attr]
        try:
            coalescer = self.coalescer
            if (
                coalescer is not None
                and method == "GET"
                and not waits
                and target.startswith(READ_PREFIX)
            ):
                # reads that leave together go as one call (a wait for `after` never does)
                status, headers, payload = await coalescer.get(
                    member.url, target, req.onward_headers(), timeout
                )
            else:
                status, headers, payload = await self.peers.request(
                    member.url, method, target, req.onward_headers(), body, timeout
                )
        except PeerUnavailable:
            return None
        if status == 503:
            return None
        passed = [(k, v) for k, v in headers if k in PASS_HEADERS]
        return status, payload, passed

    async def elsewhere(
        self,
        info: TableInfo,
        partition: int,
        choices: list[Choice],
        target: str,
        req: Request,
        opts: ReadOptions,
        here: Callable[[], Answer | Awaitable[Answer]],
    ) -> Answer:
        """Redirect to, or forward to, the first choice that answers `target`, the whole
        read as a peer is asked it (:func:`target_of`)."""
        # monotonic(), not the loop's time: looking the loop up costs a getpid() system call
        deadline = monotonic() + NO_REPLICA_GRACE_S
        while True:
            answer = await self._first_able(choices, target, req, opts, here)
            if answer is not None:
                return answer
            choices = await self.fresh_choices(info, partition, req, opts, deadline)
            if not choices:
                raise unavailable(info, partition)

    def forward(
        self,
        info: TableInfo,
        partition: int,
        choices: list[Choice],
        target: str,
        req: Request,
        here: Callable[[], Answer | Awaitable[Answer]],
    ) -> Answer | Awaitable[Answer]:
        """:meth:`elsewhere` for a plain read (no options, no query string) whose first
        choice is a peer: its answer as a future, without a task, its headers as the lines
        they go on the wire with (a `bytes` third element: see :meth:`HttpApp._respond`).
        Only when that peer gives no answer does :meth:`elsewhere` take the other choices."""
        first = choices[0] if choices else None
        coalescer = self.coalescer
        waiter = None
        if coalescer is not None and isinstance(first, Member):
            waiter = coalescer.submit(first.url, target, req.onward_headers(), FORWARD_TIMEOUT_S)
        if waiter is None:
            return self.elsewhere(info, partition, choices, target, req, NO_OPTIONS, here)
        out: asyncio.Future[Answer] = waiter.get_loop().create_future()

        def answered(w: asyncio.Future[RawResponse]) -> None:
            if not w.cancelled() and w.exception() is None and w.result()[0] != 503:
                try:
                    status, lines, body = unwired(w.result())
                except PeerUnavailable:
                    pass  # garbled: as if that peer had not answered
                else:
                    out.set_result((status, body, lines))
                    return
            # that peer could not answer: the other choices, as elsewhere() takes them
            rest = self.elsewhere(info, partition, choices[1:], target, req, NO_OPTIONS, here)
            task = out.get_loop().create_task(rest)
            task.add_done_callback(lambda t: _settle(out, t))

        waiter.add_done_callback(answered)
        return out

    async def _first_able(
        self,
        choices: list[Choice],
        target: str,
        req: Request,
        opts: ReadOptions,
        here: Callable[[], Answer | Awaitable[Answer]],
    ) -> Answer | None:
        """The first choice's answer (a redirect to the first peer), None if none gave one."""
        if opts.redirect:
            peers = [c for c in choices if isinstance(c, Member)]
            if peers:
                return self.redirect(peers[0], target)
            # only this node can answer: it does (asking no peer; none is left to ask)
        for choice in choices:
            if choice == ME:  # the active is gone and this node holds a standby
                try:
                    return await maybe(here())
                except ApiError as e:
                    if e.code != "partition_unavailable":
                        raise
                    continue  # released under this read: the next choice
            answer = await self.ask(choice, "GET", target, req, opts=opts)  # type: ignore[arg-type]
            if answer is not None:
                return answer
        return None

    async def fresh_choices(
        self, info: TableInfo, partition: int, req: Request, opts: ReadOptions, deadline: float
    ) -> list[Choice]:
        """The choices of the next views until one names any, or [] at `deadline` (and at
        once for a forwarded read: its forwarder moves on to its own next choice)."""
        while not req.forwarded and monotonic() < deadline:
            await asyncio.sleep(TICK_S)
            choices = self.routing.choices(info, partition, req, opts)
            if choices:
                return choices
        return []

    @staticmethod
    def redirect(member: Member, target: str) -> Answer:
        """307 to the read `target` (without ``redirect``, so it answers there) on `member`."""
        location = member.url + target
        return 307, b'{"redirect":' + orjson.dumps(location) + b"}", [("location", location)]

    def redirect_fan_out(
        self, info: TableInfo, partitions: Iterable[int], req: Request, query: ManyPartitions
    ) -> Answer | None:
        """With ``redirect=true``, the 307 for a read of many partitions when one other
        node answers for all of them; None when this node answers (no single owner)."""
        opts = query.bound
        if not opts.redirect:
            return None
        parts = list(partitions)
        groups = self.routing.groups(info, parts, req, opts)
        if len(groups) == 1 and isinstance(groups[0][0], Member):
            return self.redirect(groups[0][0], target_of(query, parts))
        return None

    async def gather(
        self,
        info: TableInfo,
        partitions: Iterable[int],
        req: Request,
        opts: ReadOptions,
        here: Callable[[list[int]], T | Awaitable[T]],
        there: Callable[[Member, list[int]], Awaitable[T | None]],
    ) -> list[T]:
        """One result per group of partitions answered together, each by its first able
        choice: this node (`here`), or a peer (`there`; None moves on to the next choice)."""
        routing = self.routing
        pending = {p: routing.choices(info, p, req, opts) for p in partitions}
        results: list[T] = []
        deadline = monotonic() + NO_REPLICA_GRACE_S
        while pending:
            groups: dict[str, list[int]] = {}
            for p, choices in list(pending.items()):
                if not choices:
                    choices = pending[p] = await self.fresh_choices(info, p, req, opts, deadline)
                if not choices:
                    raise unavailable(info, p)
                first = choices[0]
                groups.setdefault(first if isinstance(first, str) else first.id, []).append(p)
            local = groups.pop(ME, [])
            if local:
                try:
                    results.append(await maybe(here(local)))
                    for p in local:
                        del pending[p]
                except ApiError as e:
                    if e.code != "partition_unavailable":
                        raise
                    for p in local:  # released under this read: the next choice
                        pending[p] = pending[p][1:]
            if not groups:
                continue  # all answered here (or moved on to their next choice)
            by_id = {c.id: c for cs in pending.values() for c in cs if isinstance(c, Member)}
            remote = list(groups.items())
            answers = await asyncio.gather(*(there(by_id[nid], parts) for nid, parts in remote))
            for (_, parts), answer in zip(remote, answers, strict=True):
                for p in parts:
                    if answer is None:
                        pending[p] = pending[p][1:]  # that peer failed: the next choice
                    else:
                        del pending[p]
                if answer is not None:
                    results.append(answer)
        return results


def _settle(out: asyncio.Future[T], done: asyncio.Future[T]) -> None:
    """`out` as `done` came out."""
    if done.cancelled():
        out.cancel()
    elif (e := done.exception()) is not None:
        out.set_exception(e)
    else:
        out.set_result(done.result())


async def maybe(answer: T | Awaitable[T]) -> T:
    return await answer if isinstance(answer, Awaitable) else answer  # type: ignore[return-value]


def target_of(query: Query, partitions: Iterable[int]) -> str:
    """The HTTP read `query` stands for, of `partitions`, as a peer is asked it and as a
    redirect names it: its bound as :meth:`ReadOptions.onward` gives it, never
    ``redirect`` (the node it names answers)."""
    if type(query) is MetadataQuery:
        raise TypeError("where a key lives is answered by any node, never forwarded")
    bound = getattr(query, "bound", NO_OPTIONS)  # a snapshot's share has none
    params = {} if bound is NO_OPTIONS else bound.onward(query.table, partitions)
    t = quote(query.table, safe="")
    if type(query) is KeyQuery:
        target = key_target(query.table, query.key, "")
        _put(params, as_of=query.as_of)
    elif type(query) is WindowsQuery:
        target = key_target(query.table, query.key, "windows")
        _put(
            params,
            **{
                "from": query.time_from or None,
                "to": None if query.time_to == WINDOW_TIME_MAX else query.time_to,
            },
        )
    elif type(query) is HistoryQuery:
        target = key_target(query.table, query.key, "history")
        _put(
            params,
            **{"from": query.time_from, "to": query.time_to},
            limit=query.limit,
            order="desc" if query.newest_first else None,
            cursor=query.cursor,
        )
    elif type(query) is RangeQuery:
        target = f"/v1/tables/{t}/range"
        _put(
            params,
            **{"from": query.start, "to": query.end},
            prefix=query.prefix,
            as_of=query.as_of,
            owned="true" if query.owned else None,
            limit=query.limit,
            cursor=query.cursor,
            record_fields="true" if query.record_fields else None,
        )
    elif type(query) is IndexQuery:
        target = f"/v1/tables/{t}/index/{quote(query.index, safe='')}"
        if query.value is not None:
            target += "/" + quote(query.value, safe="")
        _put(
            params,
            **{"from": query.start, "to": query.end},
            limit=query.limit,
            cursor=query.cursor,
            record_fields="true" if query.record_fields else None,
        )
    elif type(query) is CountQuery:
        target = f"/v1/tables/{t}/count"
    elif type(query) is BatchQuery:
        target = f"/v1/tables/{t}/keys:batchGet"
    elif type(query) is PartitionScan:
        target = f"/internal/tables/{t}/scan"
        _put(
            params,
            partitions=",".join(map(str, query.partitions)),
            view=query.view,
            start=None if query.start is None else query.start.hex(),
            end=None if query.end is None else query.end.hex(),
            limit=query.limit,
            as_of=query.as_of,
            index=query.index,
            value=None if query.index is None else str(query.with_value).lower(),
            record_fields="true" if query.record_fields else None,
        )
    elif type(query) is PartitionCount:
        target = f"/internal/tables/{t}/count"
        _put(params, partitions=",".join(map(str, query.partitions)))
    elif type(query) is LocateShare:
        target = f"/internal/tables/{t}/locate"
        params["partitions"] = ",".join(map(str, query.partitions))
        params["keys"] = ",".join(k.hex() for k in query.keys)
    elif type(query) is SnapshotShare:
        target = f"/internal/tables/{t}/snapshot"
        params["partitions"] = ",".join(map(str, query.partitions))
        if query.keys is not None:
            params["keys"] = ",".join(k.hex() for k in query.keys)
        else:
            params["spans"] = spans_text(query.spans)
        if query.at_least:
            params["at_least"] = ",".join(f"{p}:{o}" for p, o in query.at_least)
    else:
        raise TypeError(f"not a read: {query!r}")
    return with_params(target, params)


def _put(params: dict[str, str], **values: object) -> None:
    """Each value that is not its default (None, or a page's default limit) as a parameter."""
    for name, value in values.items():
        if value is not None and not (name == "limit" and value == DEFAULT_LIMIT):
            params[name] = str(value)


def spans_text(spans: Iterable[tuple[bytes | None, bytes | None]]) -> str:
    """Key spans as ``START-END;...`` in hex (an empty side: unbounded). A span ending at the
    empty key holds nothing and is left out: written, its empty end would read as none."""
    return ";".join(
        f"{(lo or b'').hex()}-{'' if hi is None else hi.hex()}" for lo, hi in spans if hi != b""
    )


def with_params(target: str, params: Mapping[str, str]) -> str:
    """`target` with `params` added to its query string."""
    if not params:
        return target
    return target + ("&" if "?" in target else "?") + urlencode(params)


def key_target(table: str, key_text: str, sub: str) -> str:
    """The path a key read is forwarded to (the request's query string follows it).

    A key whose text ends like a sub-route goes as ``?key=``: an owner on granian
    sees the path decoded, where its ``%2F`` would be a separator.
    """
    t = _quoted(table)
    if key_text.endswith(KEY_SUB_ROUTES):
        return f"/v1/tables/{t}/{sub or 'keys'}?key={quote(key_text, safe='')}"
    return f"/v1/tables/{t}/keys/{_quoted(key_text)}" + (f"/{sub}" if sub else "")


#: text that quote(..., safe="") leaves as it is (RFC 3986's unreserved characters)
_UNRESERVED = re.compile(r"[A-Za-z0-9_.~-]*").fullmatch


def _quoted(text: str) -> str:
    # on every forwarded read: most keys need no quoting, and the check is cheaper
    return text if _UNRESERVED(text) else quote(text, safe="")


#: what a key's path may end with to name a route of that key rather than the key itself
KEY_SUB_ROUTES = ("/windows", "/metadata", "/history")


def plain_key_read(method: str, path: str) -> tuple[str, str] | None:
    """(table, key text) when the request is a GET /v1/tables/{t}/keys/{key}; `path` as
    received (:class:`~tablecast.query.request.Scope`), its parts decoded here."""
    if method != "GET" or not path.startswith("/v1/tables/"):
        return None
    parts = path.split("/", 5)
    if len(parts) != 6 or parts[4] != "keys":
        return None
    rest = parts[5]
    if rest.endswith(KEY_SUB_ROUTES):
        return None
    return path_segment(parts[3]), path_segment(rest)


#: a peer's answers that judge the read itself, by status: what its error says is raised
JUDGED = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    429: "rate_limited",
    504: "timeout",
}


def not_refused(answer: Answer) -> Answer:
    """A peer's answer, unless it judged the read itself (:data:`JUDGED`: a bad parameter,
    a refused caller, a limit reached, a wait for a position run out): that is raised as
    the peer gave it, as it would have been had this node held the partitions. Another
    node would judge alike, so a fan-out must not take it for a node to route around (nor
    answer 503 once it has asked them all)."""
    status, body, headers = answer
    code = JUDGED.get(status)
    if code is None:
        return answer
    retry = [(k, v) for k, v in headers if k == "retry-after"]
    try:
        error = orjson.loads(body)["error"]
        message = str(error["message"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        message = f"a node answered {status}"
    raise ApiError(code, message, retry)
