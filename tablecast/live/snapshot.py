"""A watch's starting point: the selected rows of each partition, exact at a known position.

Each partition is read in one :meth:`Replica.read` (the replica's seqlock: the
rows are exactly the store as of the position it returns, every record below
applied and none above), on this node when it holds a readable replica, else
on a peer through ``/internal/tables/{t}/snapshot`` (signed like the other
internal routes; the peer applies the caller's grants again). The watch then
takes changes from exactly those positions, so nothing is missed or repeated.

A resume that stopped inside a snapshot needs the rest of it no older than
what was already sent: ``at_least`` makes the reading replica wait until it
has got that far. Such a wait holds one of the caller's offset waits
(``--max-waits``) where the watch came in, as an ``after`` read's does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import orjson

from tablecast.cluster.membership import Member
from tablecast.cluster.replica import Replica
from tablecast.contract.table_info import TableInfo
from tablecast.live.events import Change, Renderer
from tablecast.live.selection import Selection
from tablecast.query.consistency import NO_OPTIONS
from tablecast.query.errors import ApiError
from tablecast.query.fanout import own_partitions
from tablecast.query.local import unavailable
from tablecast.query.ownership import ME
from tablecast.query.peer_calls import not_refused, target_of
from tablecast.query.policy import KeyScope, Span
from tablecast.query.queries import SnapshotShare
from tablecast.query.reads import Router
from tablecast.query.request import Request
from tablecast.store import Record, StoreClosed

#: rows one watch's snapshot may hold; a larger one is refused (narrow it, or snapshot=false)
MAX_ROWS = 100_000
#: how long a replica may take to reach a resumed snapshot's position
AT_LEAST_WAIT_S = 5.0
PEER_TIMEOUT_S = 10.0

Positions = dict[int, int]


async def take(
    router: Router,
    info: TableInfo,
    renderer: Renderer,
    selection: Selection,
    req: Request,
    at_least: Positions | None = None,
    waits: bool = False,
) -> tuple[list[Change], Positions]:
    """The selected rows in key order (over all partitions) and each partition's position.
    `waits`: a wait for `at_least` holds one of the caller's wait slots meanwhile."""
    subject = req.subject if waits and at_least else None
    rows: list[Change] = []
    positions: Positions = {}
    pending = {p: router.routing.choices(info, p, req, NO_OPTIONS) for p in selection.partitions}
    while pending:
        groups: dict[str, list[int]] = {}
        peers: dict[str, Member] = {}
        for p, choices in pending.items():
            if not choices:
                raise unavailable(info, p)
            first = choices[0]
            if isinstance(first, Member):
                peers[first.id] = first
                groups.setdefault(first.id, []).append(p)
            else:
                groups.setdefault(ME, []).append(p)
        for p in groups.pop(ME, []):
            got, position = await read_local(router, info, p, selection, at_least, subject)
            rows.extend(Change(renderer, p, k, r.value, r.offset, r.timestamp) for k, r in got)
            positions[p] = position
            del pending[p]
        asked = list(groups.items())
        # a peer asked for rows at least that far may wait for them: one wait of the caller's
        asks_at_least = any(p in (at_least or {}) for _, ps in asked for p in ps)
        held = subject if asks_at_least else None
        if held is not None:
            router.waits.enter(held)
        try:
            answers = await asyncio.gather(
                *(
                    _ask(router, peers[nid], info, renderer, parts, selection, req, at_least)
                    for nid, parts in asked
                )
            )
        finally:
            if held is not None:
                router.waits.leave(held)
        for (_, parts), answer in zip(asked, answers, strict=True):
            if answer is None:
                for p in parts:
                    pending[p] = pending[p][1:]  # that peer could not: the next choice
                continue
            got_rows, got_positions = answer
            rows.extend(got_rows)
            positions.update(got_positions)
            for p in parts:
                del pending[p]
        if len(rows) > MAX_ROWS:
            raise too_many()
    rows.sort(key=lambda c: c.key)
    return rows, positions


async def read_local(
    router: Router,
    info: TableInfo,
    partition: int,
    selection: Selection,
    at_least: Positions | None,
    subject: str | None = None,
) -> tuple[list[tuple[bytes, Record]], int]:
    """This node's rows of one partition and the position they are exact at; `subject`: the
    caller whose wait slot a wait for `at_least` holds."""
    replica = router.local.require(info, partition, NO_OPTIONS)
    want = (at_least or {}).get(partition, 0)
    if replica.position < want:
        if subject is not None:
            router.waits.enter(subject)
        try:
            replica = await _reach(router, info, partition, replica, want)
        finally:
            if subject is not None:
                router.waits.leave(subject)
    keys = [k for k in selection.keys or () if partition in info.partitions_for(k)]
    try:
        if selection.keys is not None:
            records, position = replica.read(lambda: replica.store.multi_get(keys))
            return [(k, r) for k, r in zip(keys, records, strict=True) if r is not None], position
        return replica.read(lambda: _scan(replica, selection.spans or ()))
    except StoreClosed:
        raise unavailable(info, partition) from None


async def _reach(
    router: Router, info: TableInfo, partition: int, replica: Replica, want: int
) -> Replica:
    """Wait until the replica's position reaches `want` (a resumed snapshot must not go back)."""
    deadline = time.monotonic() + AT_LEAST_WAIT_S
    while replica.position < want:
        if replica.closed:
            replica = router.local.require(info, partition, NO_OPTIONS)
        if time.monotonic() > deadline:
            raise ApiError(
                "partition_unavailable",
                f"partition {partition} of {info.name!r} has not reached offset {want} here yet",
                [("retry-after", "1")],
            )
        # a position can move past a compacted gap without an apply to wake on: look again soon
        await asyncio.sleep(0.05)
    return replica


def _scan(replica: Replica, spans: Sequence[Span]) -> list[tuple[bytes, Record]]:
    out: list[tuple[bytes, Record]] = []
    for lo, hi in spans:
        out.extend(replica.store.scan(lo, hi, MAX_ROWS + 1 - len(out)))
        if len(out) > MAX_ROWS:
            raise too_many()
    return out


def too_many() -> ApiError:
    return ApiError(
        "bad_request",
        f"the watch's snapshot holds more than {MAX_ROWS} rows: narrow the watch "
        "(a longer prefix, a smaller range), or watch with snapshot=false and page the "
        "current rows with /range",
    )


async def _ask(
    router: Router,
    member: Member,
    info: TableInfo,
    renderer: Renderer,
    parts: list[int],
    selection: Selection,
    req: Request,
    at_least: Positions | None,
) -> tuple[list[Change], Positions] | None:
    keys = None
    if selection.keys is not None:
        keys = tuple(k for k in selection.keys if any(p in parts for p in info.partitions_for(k)))
    share = SnapshotShare(
        info.name,
        tuple(parts),
        keys,
        tuple(selection.spans or ()) if keys is None else (),
        tuple((p, at_least[p]) for p in parts if p in at_least) if at_least else (),
    )
    target = target_of(share, parts)
    answer = await router.rpc.ask(member, "GET", target, req, timeout=PEER_TIMEOUT_S)
    if answer is None:
        return None
    status, body, _ = not_refused(answer)
    if status != 200:
        return None
    doc = orjson.loads(body)
    rows = [
        Change.rendered(renderer, p, bytes.fromhex(k), v.encode(), offset, ts)
        for p, k, v, offset, ts in doc["rows"]
    ]
    return rows, {int(p): pos for p, pos in doc["positions"].items()}


async def answer_peer(router: Router, q: SnapshotShare, req: Request) -> tuple[int, bytes, list]:  # type: ignore[type-arg]
    """``/internal/tables/{t}/snapshot``: this node's rows and positions for a peer's watch,
    within the caller's grants (the caller's token came along)."""
    info, scope = router.table(q.table, req)
    parts = own_partitions(info, q.partitions)
    if q.keys is not None:
        selection = Selection.of_keys(info, q.keys)
        if scope is not None and not all(scope.allows(k) for k in q.keys):
            raise ApiError(
                "forbidden", f"this token may not read some of these keys of {q.table!r}"
            )
    else:
        selection = Selection(None, tuple(_clip_all(q.spans, scope)), tuple(parts))
    at_least = dict(q.at_least)
    vj = info.value_serde
    raw_json = vj.format == "json"
    rows: list[list[object]] = []
    positions: dict[str, int] = {}
    for p in parts:
        got, position = await read_local(router, info, p, selection, at_least)
        positions[str(p)] = position
        for k, r in got:
            value = r.value if raw_json else orjson.dumps(vj.to_json(r.value))
            # the value as JSON text: the asking node splices it into its events as it is
            rows.append([p, k.hex(), value.decode(), r.offset, r.timestamp])
    return 200, orjson.dumps({"positions": positions, "rows": rows}), []


def _clip_all(spans: Sequence[Span], scope: KeyScope | None) -> list[Span]:
    if scope is None:
        return list(spans)
    return [s for lo, hi in spans for s in scope.clip(lo, hi)]
