"""Where a key lives in a table whose writer's partitioner is unknown.

A table attached with ``partitioner: unknown`` has no function from a key to
its partition, so a node looks. First in what it learned: the partition each
key was last found in. Then in the stores of the partitions it answers for
itself, and last by asking the node that answers for each remaining
partition, one ask per node (``/internal/tables/{t}/locate``), which looks in
its own stores. A key found is learned; a key not found anywhere costs the
asks again on every read, as there is nothing to learn from an absence.

A window table's key is found where a partition holds any window of it.

What a node learns never outgrows the table: a key is learned only when found,
and forgotten when a read of its partition no longer finds it (deleted, its
windows expired, or moved by its writer: the next read looks again). Learned
keys are kept in memory, at most :data:`MAX_LEARNED` per node (then it starts
over); the keys of a node's own partitions are in its stores already, so a
restart costs a look for the others only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

import orjson

from tablecast.cluster.membership import Member
from tablecast.cluster.node import Node
from tablecast.contract.table_info import TableInfo
from tablecast.query.consistency import ReadOptions, TopicEnds
from tablecast.query.errors import ApiError
from tablecast.query.local import Answer, Local
from tablecast.query.ownership import ME, Routing
from tablecast.query.peer_calls import Rpc, not_refused, target_of
from tablecast.query.policy import KeyScope
from tablecast.query.queries import LocateShare
from tablecast.query.ratelimit import WaitSlots
from tablecast.query.request import Request

#: keys a node remembers the partition of, over all unknown-partitioner tables
MAX_LEARNED = 1 << 20
#: hex characters of keys per ask, so that an ask's URL stays a few kilobytes
ASK_KEY_CHARS = 6_000


class Reaching(Protocol):
    async def reach_partitions(
        self, info: TableInfo, partitions: Iterable[int], opts: ReadOptions, req: Request
    ) -> None: ...


class Tables(Protocol):
    """What locating needs of the router (which hands itself over)."""

    #: waits until this node's replicas are as far as a read's bound asks
    fan: Reaching
    node: Node
    local: Local
    routing: Routing
    rpc: Rpc
    waits: WaitSlots
    ends: TopicEnds


class Locator:
    def __init__(self, router: Tables) -> None:
        self.router = router
        self.local = router.local
        self.routing = router.routing
        self.rpc = router.rpc
        #: table name -> (the table as it was described, serialized key -> partition)
        self._learned: dict[str, tuple[TableInfo, dict[bytes, int]]] = {}
        self._count = 0

    # -- what this node learned ----------------------------------------------------------
    def learned(self, info: TableInfo, raw: bytes) -> int | None:
        """The partition `raw` was last found in (None: not found yet)."""
        known = self._learned.get(info.name)
        if known is None or known[0] is not info:
            return None  # a table described anew (re-attached) learns anew
        return known[1].get(raw)

    def learn(self, info: TableInfo, raw: bytes, partition: int) -> None:
        known = self._learned.get(info.name)
        if known is None or known[0] is not info:
            if known is not None:
                self._count -= len(known[1])
            known = self._learned[info.name] = (info, {})
        if raw not in known[1]:
            if self._count >= MAX_LEARNED:  # full: start over rather than track recency
                known = (info, {})
                self._learned = {info.name: known}
                self._count = 0
            self._count += 1
        known[1][raw] = partition

    def forget(self, info: TableInfo, raw: bytes) -> None:
        """A read of the learned partition found no `raw`: look again next time."""
        known = self._learned.get(info.name)
        if known is not None and known[1].pop(raw, None) is not None:
            self._count -= 1

    # -- looking -------------------------------------------------------------------------
    async def locate(
        self, info: TableInfo, raws: Sequence[bytes], req: Request, opts: ReadOptions
    ) -> dict[int, int]:
        """index in `raws` -> the partition holding that key, for the keys found (each one
        learned). A key in two partitions (its writer moved it without deleting it) is
        taken from the lower one."""
        found: dict[int, int] = {}
        every = range(info.partitions)
        # this node's own partitions first: a read forwarded to the owner finds its key here
        mine = [p for p in every if (c := self.routing.choices(info, p, req, opts)) and c[0] == ME]
        if mine:
            try:
                await self.router.fan.reach_partitions(info, mine, opts, req)
                self._here(info, raws, mine, opts, found)
            except ApiError as e:
                if e.code != "partition_unavailable":
                    raise
                mine = []  # released under this look: asked as the others are
        # a forwarded look stays here: its forwarder, told 404, looks everywhere itself
        rest = [] if req.forwarded else [p for p in every if p not in mine]
        if rest and len(found) < len(raws):
            missing = [i for i in range(len(raws)) if i not in found]

            async def here(parts: list[int]) -> bool:
                await self.router.fan.reach_partitions(info, parts, opts, req)
                self._here(info, raws, parts, opts, found, missing)
                return True

            async def there(member: Member, parts: list[int]) -> bool | None:
                for chunk in _chunks(missing, raws):
                    share = LocateShare(
                        info.name, tuple(parts), tuple(raws[i] for i in chunk), opts
                    )
                    answer = await self.rpc.ask(
                        member, "GET", target_of(share, parts), req, opts=opts
                    )
                    if answer is None or not_refused(answer)[0] != 200:
                        return None
                    for i, p in orjson.loads(answer[1])["found"]:
                        _take(found, chunk[i], p)
                return True

            await self.rpc.gather(info, rest, req, opts, here, there)
        for i, p in found.items():
            self.learn(info, raws[i], p)
        return found

    def _here(
        self,
        info: TableInfo,
        raws: Sequence[bytes],
        parts: list[int],
        opts: ReadOptions,
        found: dict[int, int],
        which: list[int] | None = None,
    ) -> None:
        idx = [i for i in (range(len(raws)) if which is None else which) if i not in found]
        for p in parts:
            if not idx:
                return
            held = self.local.holding(info, p, [raws[i] for i in idx], opts)
            for i, here in zip(idx, held, strict=True):
                if here:
                    _take(found, i, p)
            idx = [i for i in idx if i not in found]

    # -- a peer's ask --------------------------------------------------------------------
    async def share(
        self, q: LocateShare, info: TableInfo, req: Request, scope: KeyScope | None
    ) -> Answer:
        """Which of this node's partitions `q` names hold which of its keys the caller may
        read (a key outside its grants is nowhere, as its reads are):
        ``{"found": [[key index, partition], ...]}``."""
        if any(not 0 <= p < info.partitions for p in q.partitions):
            raise ApiError("bad_request", f"{info.name!r} has partitions 0..{info.partitions - 1}")
        await self.router.fan.reach_partitions(info, list(q.partitions), q.bound, req)
        found: dict[int, int] = {}
        which = [i for i, k in enumerate(q.keys) if scope is None or scope.allows(k)]
        self._here(info, q.keys, sorted(set(q.partitions)), q.bound, found, which)
        body = orjson.dumps({"found": sorted(found.items())})
        return 200, body, [self.local.node_header]


def _take(found: dict[int, int], i: int, partition: int) -> None:
    if i not in found or partition < found[i]:
        found[i] = partition


def _chunks(idx: list[int], raws: Sequence[bytes]) -> list[list[int]]:
    """`idx` in runs whose keys' hex fits one ask."""
    out: list[list[int]] = [[]]
    size = 0
    for i in idx:
        n = 2 * len(raws[i]) + 1
        if out[-1] and size + n > ASK_KEY_CHARS:
            out.append([])
            size = 0
        out[-1].append(i)
        size += n
    return out
