"""Any node answers any key: read locally, or forward to the node that answers for it.

For each partition the router picks, in order: this node if it may answer
(it is the effective active, the table is global, the request allows a
standby with ``max_lag``, or it was forwarded here already), else the
caught-up holders from the cluster view, the effective active first. A peer
that cannot be reached or answers 503 is skipped for the next one at once, so
a dead node costs a retry, not a failed query. ``x-tablecast-hop`` marks a
forwarded request, which is only ever answered locally: no loops.
Batch gets, range scans and counts fan out per owning node and merge.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

import orjson

from tablecast.cluster.membership import Member
from tablecast.cluster.node import Node
from tablecast.cluster.offsetwait import wake
from tablecast.cluster.replica import Replica
from tablecast.kafka.catalog import TableInfo
from tablecast.serde import SerdeError
from tablecast.server.auth import Caller
from tablecast.server.cursor import Cursors
from tablecast.server.errors import ApiError
from tablecast.server.local import Answer, Headers, Local, merge_sorted, unavailable
from tablecast.server.peers import PeerPool, PeerUnavailable
from tablecast.server.policy import Grants, Scope, prefix_end
from tablecast.server.ratelimit import WaitSlots

HOP = "x-tablecast-hop"
PASS_HEADERS = (
    b"x-tablecast-node",
    b"x-tablecast-lag",
    b"x-tablecast-staleness-ms",
    b"x-tablecast-position",
    b"retry-after",
)
#: reads of one caller that may wait for an offset at once (serve --max-waits)
DEFAULT_WAITS_PER_CALLER = 16
DEFAULT_LIMIT = 100
MAX_LIMIT = 10_000
#: rows a range asks of each group of partitions beyond its fair share, so that a
#: little unevenness in how keys spread costs no second request
FAIR_SHARE_SLACK = 8
MAX_BATCH = 1_000
MAX_WAIT_MS = 30_000
FORWARD_TIMEOUT_S = 2.0
#: the largest integer any parameter takes (Kafka offsets and epoch ms are int64)
MAX_INT = 2**63 - 1

#: window starts are int64 and the scan's bound is the end + 1: later times mean "no bound"
WINDOW_TIME_MAX = 2**62
ME = "me"
Choice = str | Member  # ME, or a peer
T = TypeVar("T")


class Request:
    """What handlers need of an HTTP request."""

    __slots__ = ("authorization", "caller", "headers", "params", "query", "scope")

    def __init__(
        self,
        params: dict[str, str],
        query: str,
        headers: Any,
        caller: Caller | None = None,
        scope: Any = None,
        authorization: str | None = None,
    ) -> None:
        self.params = params
        self.query = query
        self.headers = headers
        #: the verified token (None when auth is off)
        self.caller = caller
        #: the server's scope of the request (its client address)
        self.scope = scope
        #: the bearer token when it came otherwise than as a header (a watch's ?access_token=)
        self.authorization = authorization

    @property
    def forwarded(self) -> bool:
        return HOP in self.headers

    @property
    def grants(self) -> Grants | None:
        """What the caller may read; None when everything (no policy)."""
        caller = self.caller
        return None if caller is None else caller.grants

    @property
    def subject(self) -> str:
        """Who limits count against: the token's subject, else the client's address."""
        return subject_of(self.caller, self.scope)

    def onward_headers(self) -> list[tuple[str, str]]:
        auth = self.headers.get("authorization") or self.authorization
        return [(HOP, "1"), ("authorization", auth)] if auth else [(HOP, "1")]


def subject_of(caller: Caller | None, scope: Any) -> str:
    if caller is not None and caller.subject is not None:
        return "sub:" + caller.subject
    client = getattr(scope, "client", None) or ""
    return "addr:" + client.rsplit(":", 1)[0]  # the address without the port


class Router:
    def __init__(
        self, node: Node, cursors: Cursors, peers: PeerPool, waits: WaitSlots | None = None
    ) -> None:
        self.node = node
        self.me = node.id  # read on every request: a plain attribute, not a property chain
        self.local = Local(node)
        self.cursors = cursors
        self.peers = peers
        self.waits = waits or WaitSlots(DEFAULT_WAITS_PER_CALLER)

    def table(self, name: str, req: Request) -> tuple[TableInfo, Scope | None]:
        """The table and what of it the caller may read (None: all of it); 403 when nothing.

        Every node a request passes applies this, and so does the node that
        reads the store: a forwarding node is never trusted to have filtered.
        """
        grants = req.grants
        if grants is None:
            return self.local.table(name), None
        grants.require_table(name)  # before the lookup: no 404 tells what exists
        info = self.local.table(name)
        return info, grants.scope(info)

    # -- who answers -----------------------------------------------------------
    def choices(
        self, info: TableInfo, partition: int, req: Request, max_lag: int | None
    ) -> list[Choice]:
        here = self.local.readable(info, partition, max_lag) is not None
        if here and self.answers_here(info, partition, req, max_lag):
            return [ME]
        if req.forwarded or info.is_global:
            return []
        out: list[Choice] = []
        for member in self.node.view.candidates((info.name, partition)):
            if member.id == self.node.id:
                if here:
                    out.append(ME)
            else:
                out.append(member)
        return out

    def answers_here(
        self, info: TableInfo, partition: int, req: Request, max_lag: int | None
    ) -> bool:
        """Whether this node, holding a readable replica of `partition`, answers for it itself."""
        slot = (info.name, partition)
        view = self.node.view
        owners = view.target.get(slot)
        if owners and owners[0] == self.me:  # the common case first: it is ours
            return True
        if max_lag is not None or req.forwarded or info.is_global:
            return True
        # the view is up to a tick old: a replica that just caught up may not be in it
        # yet, so when nobody is known to answer, the holder does
        return view.effective_active(slot) in (self.me, None)

    async def ask(
        self,
        member: Member,
        method: str,
        target: str,
        req: Request,
        body: bytes = b"",
        timeout: float = FORWARD_TIMEOUT_S,
    ) -> Answer | None:
        """A peer's answer, or None if it could not give one (unreachable, or 503)."""
        try:
            status, headers, payload = await self.peers.request(
                member.url, method, target, req.onward_headers(), body, timeout
            )
        except PeerUnavailable:
            return None
        if status == 503:
            return None
        passed = [(k.decode(), v.decode()) for k, v in headers if k in PASS_HEADERS]
        return status, payload, passed

    # -- point reads -----------------------------------------------------------
    def get_key(self, table: str, key_text: str, req: Request) -> Answer | Awaitable[Answer]:
        caller = req.caller
        if caller is None or caller.grants is None:  # the hot path without a policy: no call
            info, scope = self.local.table(table), None
        else:
            info, scope = self.table(table, req)
        if info.kind != "kv":
            raise ApiError(
                "bad_request", f"{table!r} is a window table: read /keys/{{key}}/windows"
            )
        raw = self.local.key_bytes(info, key_text)
        if scope is not None and not scope.allows(raw):
            raise forbidden_key(table, key_text)
        partition = info.partition_of(raw)
        params = req.params
        max_lag = int_param(params, "max_lag", None) if params else None
        replica = self.local.readable(info, partition, max_lag)
        if replica is not None and self.answers_here(info, partition, req, max_lag):
            # the hot path: one replica lookup, no choice list
            if params and "min_offset" in params:
                return self._unless_released(
                    replica,
                    self._after_offset(
                        partition,
                        replica,
                        req,
                        lambda: self.local.read_key(info, raw, partition, replica, key_text),
                    ),
                    lambda: self.get_key(table, key_text, req),
                )
            try:
                return self.local.read_key(info, raw, partition, replica, key_text)
            except ApiError:
                if not replica.closed:
                    raise
                # released under this read: route it as if this node had never held it
        choices = self.choices(info, partition, req, max_lag)

        def here() -> Answer | Awaitable[Answer]:
            replica = self.local.require(info, partition, max_lag)
            read = lambda: self.local.read_key(info, raw, partition, replica, key_text)  # noqa: E731
            if "min_offset" in req.params:
                return self._after_offset(partition, replica, req, read)
            return read()

        if choices and choices[0] == ME:
            return here()
        target = key_target(table, key_text, "")
        return self._elsewhere(info, partition, choices, target, req, here)

    def windows(self, table: str, key_text: str, req: Request) -> Answer | Awaitable[Answer]:
        info, scope = self.table(table, req)
        if info.kind != "window":
            raise ApiError("bad_request", f"{table!r} is not a window table")
        raw = self.local.key_bytes(info, key_text)
        if scope is not None and not scope.allows(raw):
            raise forbidden_key(table, key_text)
        time_from = min(int_param(req.params, "from", 0), WINDOW_TIME_MAX)
        time_to = min(int_param(req.params, "to", WINDOW_TIME_MAX), WINDOW_TIME_MAX)
        partition = info.partition_of(raw)
        max_lag = int_param(req.params, "max_lag", None)
        choices = self.choices(info, partition, req, max_lag)

        def here() -> Answer:
            replica = self.local.require(info, partition, max_lag)
            return self.local.windows(info, raw, replica, time_from, time_to)

        if choices and choices[0] == ME:
            return here()
        target = key_target(table, key_text, "windows")
        return self._elsewhere(info, partition, choices, target, req, here)

    async def _elsewhere(
        self,
        info: TableInfo,
        partition: int,
        choices: list[Choice],
        target: str,
        req: Request,
        here: Callable[[], Answer | Awaitable[Answer]],
    ) -> Answer:
        """Redirect to, or forward to, the first choice that answers."""
        if req.query:
            target += "?" + req.query
        if req.params.get("redirect") == "true":
            peers = [c for c in choices if isinstance(c, Member)]
            if not peers:
                raise unavailable(info, partition)
            onward = {k: v for k, v in req.params.items() if k != "redirect"}
            location = (
                peers[0].url + target.split("?", 1)[0] + ("?" + urlencode(onward) if onward else "")
            )
            return 307, b'{"redirect":' + orjson.dumps(location) + b"}", [("location", location)]
        for choice in choices:
            if choice == ME:  # the active is gone and this node holds a standby
                try:
                    return await _maybe(here())
                except ApiError as e:
                    if e.code != "partition_unavailable":
                        raise
                    continue  # released under this read: the next choice
            answer = await self.ask(choice, "GET", target, req)  # type: ignore[arg-type]
            if answer is not None:
                return answer
        raise unavailable(info, partition)

    async def _after_offset(
        self, partition: int, replica: Replica, req: Request, read: Callable[[], Answer]
    ) -> Answer:
        """Monotonic reads: wait until the replica applied the offset `min_offset=P:O` names.

        The wait is a future the ingest thread completes when it applies that
        offset (no polling); a caller may have only so many waiting at once.
        """
        params = req.params
        text = params["min_offset"]
        p_text, _, o_text = text.partition(":")
        try:
            want_partition, want_offset = int(p_text), int(o_text)
        except ValueError:
            raise ApiError(
                "bad_request", f"min_offset must be PARTITION:OFFSET, not {text!r}"
            ) from None
        if want_partition != partition:
            raise ApiError(
                "bad_request",
                f"min_offset names partition {want_partition}; the key is in {partition}",
            )
        timeout_ms = int_param(params, "timeout_ms", 1000)
        if timeout_ms > MAX_WAIT_MS:
            raise ApiError("bad_request", f"timeout_ms is at most {MAX_WAIT_MS}")
        if replica.store.applied_offset >= want_offset:
            return read()
        subject = req.subject
        self.waits.enter(subject)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        try:
            while replica.store.applied_offset < want_offset:
                if replica.closed:  # released while waiting: the caller routes the read again
                    raise ApiError("partition_unavailable", "the replica was released", [])
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise ApiError(
                        "timeout",
                        f"offset {want_offset} of partition {want_partition} "
                        f"not applied within {timeout_ms} ms",
                    )
                future = replica.waiters.wait(want_offset)
                timer = loop.call_later(remaining, wake, future)
                try:
                    # an apply between the check above and wait() woke nobody: look again
                    if replica.store.applied_offset < want_offset and not replica.closed:
                        await future
                finally:
                    timer.cancel()
                    replica.waiters.forget(future)
        finally:
            self.waits.leave(subject)
        return read()

    async def _unless_released(
        self,
        replica: Any,
        answer: Awaitable[Answer],
        again: Callable[[], Answer | Awaitable[Answer]],
    ) -> Answer:
        """`answer`, or, if the replica was released under it, the request routed again."""
        try:
            return await answer
        except ApiError:
            if not replica.closed:
                raise
        return await _maybe(again())

    # -- fan-out ---------------------------------------------------------------
    async def gather(
        self,
        info: TableInfo,
        partitions: Iterable[int],
        req: Request,
        max_lag: int | None,
        here: Callable[[list[int]], T],
        there: Callable[[Member, list[int]], Awaitable[T | None]],
    ) -> list[T]:
        """One result per group of partitions answered together, each by its first able choice."""
        pending = {p: self.choices(info, p, req, max_lag) for p in partitions}
        results: list[T] = []
        while pending:
            groups: dict[Choice, list[int]] = {}
            for p, choices in pending.items():
                if not choices:
                    raise unavailable(info, p)
                groups.setdefault(choices[0] if choices[0] == ME else choices[0].id, []).append(p)  # type: ignore[union-attr]
            local = groups.pop(ME, [])
            if local:
                results.append(here(local))
                for p in local:
                    del pending[p]
            by_id = {c.id: c for cs in pending.values() for c in cs if isinstance(c, Member)}
            remote = list(groups.items())
            answers = await asyncio.gather(*(there(by_id[nid], parts) for nid, parts in remote))  # type: ignore[index]
            for (_, parts), answer in zip(remote, answers, strict=True):
                for p in parts:
                    if answer is None:
                        pending[p] = pending[p][1:]  # that peer failed: the next choice
                    else:
                        del pending[p]
                if answer is not None:
                    results.append(answer)
        return results

    async def batch_get(self, table: str, body: bytes, req: Request) -> Answer:
        info, scope = self.table(table, req)
        try:
            request = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise ApiError("bad_request", 'the body must be JSON: {"keys": [...]}') from None
        keys = request.get("keys") if isinstance(request, dict) else None
        if not isinstance(keys, list):
            raise ApiError("bad_request", 'the body must be {"keys": [...]}')
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
        for i, raw in enumerate(raws):
            if scope is not None and not scope.allows(raw):
                # never read, never forwarded: a key outside the grants has no value to show
                results[i] = {"key": keys[i], "found": False, "forbidden": True}
            else:
                by_partition.setdefault(info.partition_of(raw), []).append(i)
        max_lag = int_param(req.params, "max_lag", None)
        value_json = info.value_serde.to_json

        def here(parts: list[int]) -> None:
            for p in parts:
                idx = by_partition[p]
                for i, rec in zip(
                    idx, self.local.multi_get(info, p, [raws[i] for i in idx], max_lag), strict=True
                ):
                    results[i] = (
                        {"key": keys[i], "found": False}
                        if rec is None
                        else {"key": keys[i], "found": True, "value": value_json(rec.value)}
                    )

        async def there(member: Member, parts: list[int]) -> bool | None:
            idx = [i for p in parts for i in by_partition[p]]
            target = f"/v1/tables/{quote(table, safe='')}/keys:batchGet"
            answer = await self.ask(
                member, "POST", target, req, orjson.dumps({"keys": [keys[i] for i in idx]})
            )
            if answer is None or not_refused(answer)[0] != 200:
                return None
            for i, item in zip(idx, orjson.loads(answer[1])["results"], strict=True):
                results[i] = item
            return True

        await self.gather(info, sorted(by_partition), req, max_lag, here, there)
        return 200, orjson.dumps({"results": results}), [self.local.node_header]

    async def range(self, table: str, req: Request) -> Answer:
        info, scope = self.table(table, req)
        if info.kind != "kv":
            raise ApiError(
                "bad_request", f"{table!r} is a window table: read /keys/{{key}}/windows"
            )
        params = req.params
        limit = int_param(params, "limit", DEFAULT_LIMIT)
        if not 1 <= limit <= MAX_LIMIT:
            raise ApiError("bad_request", f"limit must be between 1 and {MAX_LIMIT}")
        start = self.local.key_bytes(info, params["from"]) if "from" in params else None
        end = self.local.key_bytes(info, params["to"]) if "to" in params else None
        if "prefix" in params:
            prefix = prefix_bytes(info, params["prefix"])
            start = prefix if start is None else max(start, prefix)
            after = prefix_end(prefix)
            end = after if end is None else (end if after is None else min(end, after))
        query = [params.get("from"), params.get("to"), params.get("prefix"), params.get("owned")]
        if params.get("cursor"):
            start = self.cursors.decode(params["cursor"], query) + b"\x00"  # the key after the last
        if start is not None and end is not None and start >= end:
            return 200, b'{"items":[],"next_cursor":null}', []
        if scope is not None and not scope.clip(start, end):  # nothing granted in the range
            return 200, b'{"items":[],"next_cursor":null}', [self.local.node_header]
        max_lag = int_param(params, "max_lag", None)
        if params.get("owned") == "true":
            # only what this node answers for as active: a job run beside every node
            # then sees each key exactly once across the cluster
            view = self.node.view
            mine = [
                p
                for p in range(info.partitions)
                if view.effective_active((info.name, p)) == self.node.id
            ]
            vj = info.value_serde.to_json
            rows = self.local.scan(info, mine, start, end, limit + 1, max_lag, scope)
            merged = [(k, vj(rec.value)) for k, rec in rows]
        else:
            merged = await self._page(info, req, max_lag, start, end, limit + 1, scope)
        more = len(merged) > limit
        merged = merged[:limit]
        kj = info.key_serde.to_json
        body = {
            "items": [{"key": kj(k), "value": v} for k, v in merged],
            "next_cursor": self.cursors.encode(merged[-1][0], query) if more else None,
        }
        return 200, orjson.dumps(body), [self.local.node_header]

    async def _page(
        self,
        info: TableInfo,
        req: Request,
        max_lag: int | None,
        start: bytes | None,
        end: bytes | None,
        n: int,
        scope: Scope | None,
    ) -> list[tuple[bytes, Any]]:
        """The first `n` rows in [start, end) over all partitions, merged lazily.

        The partitions are grouped by the node that answers for them; each
        group is asked first for its fair share of `n` (what it holds when
        keys spread evenly), and again from its last key, for twice as many,
        only when the merge has taken all it gave and still needs rows. So a
        page holds about `n` rows in flight, never partitions × `n`. Each
        reading node applies the caller's grants itself (`scope` is this
        node's own reading of them, for the partitions it reads).
        """
        vj = info.value_serde.to_json
        table = quote(info.name, safe="")

        async def fetch(parts: list[int], lo: bytes | None, want: int) -> list[tuple[bytes, Any]]:
            def here(local: list[int]) -> list[tuple[bytes, Any]]:
                rows = self.local.scan(info, local, lo, end, want, max_lag, scope)
                return [(k, vj(rec.value)) for k, rec in rows]

            async def there(member: Member, remote: list[int]) -> list[tuple[bytes, Any]] | None:
                q = {"partitions": ",".join(map(str, remote)), "limit": str(want)}
                if lo is not None:
                    q["start"] = lo.hex()
                if end is not None:
                    q["end"] = end.hex()
                if max_lag is not None:
                    q["max_lag"] = str(max_lag)
                answer = await self.ask(
                    member, "GET", f"/internal/tables/{table}/scan?{urlencode(q)}", req
                )
                if answer is None or not_refused(answer)[0] != 200:
                    return None
                return [(bytes.fromhex(k), v) for k, v in orjson.loads(answer[1])["items"]]

            pages = await self.gather(info, parts, req, max_lag, here, there)
            return list(merge_sorted(pages, want))

        groups: dict[str, list[int]] = {}
        for p in range(info.partitions):
            choices = self.choices(info, p, req, max_lag)
            if not choices:
                raise unavailable(info, p)
            first = choices[0]
            groups.setdefault(first if isinstance(first, str) else first.id, []).append(p)
        parts_of = list(groups.values())
        wants = [min(n, -(-n * len(ps) // info.partitions) + FAIR_SHARE_SLACK) for ps in parts_of]
        pages = await asyncio.gather(
            *(fetch(ps, start, w) for ps, w in zip(parts_of, wants, strict=True))
        )
        at = [0] * len(pages)
        heap = [(page[0][0], i) for i, page in enumerate(pages) if page]
        heapq.heapify(heap)
        out: list[tuple[bytes, Any]] = []
        while heap and len(out) < n:
            _, i = heapq.heappop(heap)
            page = pages[i]
            out.append(page[at[i]])
            at[i] += 1
            if at[i] == len(page):
                if len(page) < wants[i]:
                    continue  # that group has nothing more in the range
                wants[i] = min(n, wants[i] * 2)
                pages[i] = page = await fetch(parts_of[i], page[-1][0] + b"\x00", wants[i])
                at[i] = 0
                if not page:
                    continue
            heapq.heappush(heap, (page[at[i]][0], i))
        return out

    async def count(self, table: str, req: Request) -> Answer:
        info, scope = self.table(table, req)
        max_lag = int_param(req.params, "max_lag", None)

        async def there(member: Member, parts: list[int]) -> int | None:
            q = urlencode(
                {
                    "partitions": ",".join(map(str, parts)),
                    **({"max_lag": str(max_lag)} if max_lag is not None else {}),
                }
            )
            answer = await self.ask(
                member, "GET", f"/internal/tables/{quote(table, safe='')}/count?{q}", req
            )
            if answer is None or not_refused(answer)[0] != 200:
                return None
            return int(orjson.loads(answer[1])["count"])

        counts = await self.gather(
            info,
            range(info.partitions),
            req,
            max_lag,
            lambda parts: self.local.count(info, parts, max_lag, scope),
            there,
        )
        return 200, orjson.dumps({"count": sum(counts)}), [self.local.node_header]

    # -- internal: what a fan-out asks of a peer, answered from local stores only --
    # The caller's token came along: the caller's grants apply here, where the store is read.
    def internal_scan(self, table: str, req: Request) -> Answer:
        info, scope = self.table(table, req)
        params = req.params
        parts = partitions_param(info, params)
        try:
            start = bytes.fromhex(params["start"]) if "start" in params else None
            end = bytes.fromhex(params["end"]) if "end" in params else None
        except ValueError:
            raise ApiError("bad_request", "start and end are hex") from None
        limit = int_param(params, "limit", DEFAULT_LIMIT)
        max_lag = int_param(params, "max_lag", None)
        vj = info.value_serde.to_json
        rows = self.local.scan(info, parts, start, end, min(limit, MAX_LIMIT + 1), max_lag, scope)
        return 200, orjson.dumps({"items": [(k.hex(), vj(rec.value)) for k, rec in rows]}), []

    def internal_count(self, table: str, req: Request) -> Answer:
        info, scope = self.table(table, req)
        total = self.local.count(
            info, partitions_param(info, req.params), int_param(req.params, "max_lag", None), scope
        )
        return 200, orjson.dumps({"count": total}), []

    # -- where a key lives -----------------------------------------------------
    def metadata(self, table: str, key_text: str, req: Request) -> Answer:
        info, scope = self.table(table, req)
        raw = self.local.key_bytes(info, key_text)
        if scope is not None and not scope.allows(raw):
            raise forbidden_key(table, key_text)
        partition = info.partition_of(raw)
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


async def _maybe(answer: Answer | Awaitable[Answer]) -> Answer:
    return answer if isinstance(answer, tuple) else await answer


def key_target(table: str, key_text: str, sub: str) -> str:
    """The path a key read is forwarded to (the request's query string follows it).

    A key whose text ends like a sub-route reached us as ``?key=``, which the
    query string carries on: forward it in that form too, since the owner sees
    the path decoded.
    """
    t = quote(table, safe="")
    if key_text.endswith(("/windows", "/metadata")):
        return f"/v1/tables/{t}/{sub or 'keys'}"
    return f"/v1/tables/{t}/keys/{quote(key_text, safe='')}" + (f"/{sub}" if sub else "")


def not_refused(answer: Answer) -> Answer:
    """A peer's answer, unless it refused the caller: a 401 or 403 is raised as the peer
    gave it. The reading node judged the caller, and another node would judge alike (the
    nodes share one policy), so a fan-out must not take it for a node to route around."""
    status, body, _ = answer
    if status not in (401, 403):
        return answer
    try:
        error = orjson.loads(body)["error"]
        raise ApiError("unauthorized" if status == 401 else "forbidden", str(error["message"]))
    except (orjson.JSONDecodeError, KeyError, TypeError):
        raise ApiError("forbidden", "a node refused this caller") from None


def forbidden_key(table: str, key_text: str) -> ApiError:
    return ApiError("forbidden", f"this token may not read key {key_text!r} of {table!r}")


def partitions_param(info: TableInfo, params: dict[str, str]) -> list[int]:
    try:
        parts = [int(x) for x in params.get("partitions", "").split(",") if x]
    except ValueError:
        raise ApiError("bad_request", "partitions is a comma-separated list of integers") from None
    if any(not 0 <= p < info.partitions for p in parts):
        raise ApiError("bad_request", f"{info.name!r} has partitions 0..{info.partitions - 1}")
    return parts


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


def int_param(params: dict[str, str], name: str, default: int | None) -> Any:
    text = params.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ApiError("bad_request", f"{name} must be an integer, not {text!r}") from None
    if not 0 <= value <= MAX_INT:
        raise ApiError("bad_request", f"{name} must be between 0 and {MAX_INT}")
    return value


__all__ = ["Headers", "Request", "Router"]
