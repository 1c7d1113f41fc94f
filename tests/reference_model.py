"""Kafka Streams' answers, computed in plain Python for the tests to compare with.

Written from Kafka Streams' documented semantics (KStream/KTable operators,
KStreamAggregate, KTableRepartitionMap + KTableAggregate/KTableReduce,
KStreamTransformValues with a key-value store, KStream.repartition),
independently of tablecast's planner and compiler. A stream is a list of
(key, value) records in order; a table's changelog is a list of upserts, a
None value deleting; ``latest`` is what a materialized table holds at the end.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import Any

Rec = tuple[Any, Any]


# -- streams -----------------------------------------------------------------
def filter_(records: Iterable[Rec], pred: Callable[[Any, Any], Any]) -> list[Rec]:
    return [(k, v) for k, v in records if pred(k, v)]


def map_values(records: Iterable[Rec], f: Callable[[Any, Any], Any]) -> list[Rec]:
    return [(k, f(k, v)) for k, v in records]


def map_(records: Iterable[Rec], f: Callable[[Any, Any], Rec]) -> list[Rec]:
    return [tuple(f(k, v)) for k, v in records]  # type: ignore[misc]


def flat_map_values(records: Iterable[Rec], f: Callable[[Any, Any], Iterable[Any]]) -> list[Rec]:
    return [(k, x) for k, v in records for x in f(k, v)]


def flat_map(records: Iterable[Rec], f: Callable[[Any, Any], Iterable[Rec]]) -> list[Rec]:
    return [tuple(r) for k, v in records for r in f(k, v)]  # type: ignore[misc]


def select_key(records: Iterable[Rec], f: Callable[[Any, Any], Any]) -> list[Rec]:
    return [(f(k, v), v) for k, v in records]


class KeyStore:
    """One key's entry of a key-value store, as a transformValues function sees it."""

    def __init__(self, stored: Any) -> None:
        self.stored = stored

    def get(self, default: Any = None) -> Any:
        # a store hands out a deserialized copy: mutating it changes nothing stored
        return default if self.stored is None else copy.deepcopy(self.stored)

    def set(self, value: Any) -> None:
        self.stored = copy.deepcopy(value)  # None deletes the entry


def transform_values(
    records: Iterable[Rec], f: Callable[[Any, Any, KeyStore], Any]
) -> tuple[list[Rec], list[Rec]]:
    """KStream.transformValues with a key-value store per key: (records out, records that
    failed). A record's state changes count only if f returns; a None result is a record
    with a None value; records without a key have no store entry and fail."""
    store: dict[Any, Any] = {}
    out: list[Rec] = []
    failed: list[Rec] = []
    for k, v in records:
        if k is None:
            failed.append((k, v))
            continue
        entry = KeyStore(store.get(k))
        try:
            new = f(k, v, entry)
        except Exception:
            failed.append((k, v))
            continue
        _put(store, k, entry.stored)
        out.append((k, new))
    return out, failed


def repartition(
    records: Iterable[Rec], partitions: int, partitioner: Callable[[Any, Any, int], int]
) -> dict[int, list[Rec]]:
    """KStream.repartition: each keyed record appended to the partition the partitioner
    picks (records without a key are dropped); the stream continues from these."""
    out: dict[int, list[Rec]] = {}
    for k, v in records:
        if k is not None:
            out.setdefault(partitioner(k, v, partitions), []).append((k, v))
    return out


def latest(changelog: Iterable[Rec]) -> dict[Any, Any]:
    """A table from its changelog (or a stream's to_table()): null keys are skipped."""
    out: dict[Any, Any] = {}
    for k, v in changelog:
        if k is None:
            continue
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def stream_count(records: Iterable[Rec]) -> dict[Any, int]:
    return stream_aggregate(records, lambda: 0, lambda k, v, a: a + 1)


def stream_reduce(records: Iterable[Rec], f: Callable[[Any, Any], Any]) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for k, v in records:
        if k is None or v is None:
            continue
        new = v if k not in out else f(out[k], v)
        _put(out, k, new)
    return out


def stream_aggregate(
    records: Iterable[Rec], init: Callable[[], Any], f: Callable[[Any, Any, Any], Any]
) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for k, v in records:
        if k is None or v is None:
            continue
        _put(out, k, f(k, v, out[k] if k in out else init()))
    return out


# -- tables ------------------------------------------------------------------
def table_filter(changelog: Iterable[Rec], pred: Callable[[Any, Any], Any]) -> list[Rec]:
    return [(k, v if v is not None and pred(k, v) else None) for k, v in changelog]


def table_map_values(changelog: Iterable[Rec], f: Callable[[Any, Any], Any]) -> list[Rec]:
    return [(k, None if v is None else f(k, v)) for k, v in changelog]


def table_group_aggregate(
    changelog: Iterable[Rec],
    selector: Callable[[Any, Any], Rec | None],
    add: Callable[[Any, Any, Any | None], Any],
    subtract: Callable[[Any, Any, Any], Any],
) -> dict[Any, Any]:
    """KTable.groupBy(selector) then an aggregation: for each source-row change the
    old selection is retracted (subtract, only if the group has an aggregate)
    and the new one added; `add(key, value, agg_or_None)` decides how a group starts."""
    prev: dict[Any, Rec | None] = {}
    out: dict[Any, Any] = {}

    def select(k: Any, v: Any) -> Rec | None:
        if v is None:
            return None
        r = selector(k, v)
        if r is None or r[0] is None or r[1] is None:
            return None
        return r

    for k, v in changelog:
        old, new = prev.get(k), select(k, v)
        prev[k] = new
        if old is not None and old[0] in out:
            _put(out, old[0], subtract(old[0], old[1], out[old[0]]))
        if new is not None:
            _put(out, new[0], add(new[0], new[1], out.get(new[0])))
    return out


def table_group_count(changelog: Iterable[Rec], selector: Callable[[Any, Any], Rec | None]):  # type: ignore[no-untyped-def]
    return table_group_aggregate(
        changelog, selector, lambda k, v, a: (a or 0) + 1, lambda k, v, a: a - 1
    )


def table_group_reduce(
    changelog: Iterable[Rec],
    selector: Callable[[Any, Any], Rec | None],
    adder: Callable[[Any, Any], Any],
    subtractor: Callable[[Any, Any], Any],
) -> dict[Any, Any]:
    return table_group_aggregate(
        changelog,
        selector,
        lambda k, v, a: v if a is None else adder(a, v),
        lambda k, v, a: subtractor(a, v),
    )


def _put(table: dict[Any, Any], key: Any, value: Any) -> None:
    if value is None:
        table.pop(key, None)
    else:
        table[key] = value


# -- windowed streams (TimeWindows + KStreamWindowAggregate) ------------------
TimedRec = tuple[Any, Any, int, int]  # (task, key, value, timestamp ms)


def window_starts(ts: int, size: int, advance: int) -> list[int]:
    """Starts of the windows [s, s + size), s a multiple of `advance`, that contain ts."""
    s = ts - ts % advance
    out = []
    while s >= 0 and s > ts - size:
        out.append(s)
        s -= advance
    return sorted(out)


def window_aggregate(
    records: Iterable[TimedRec],
    size: int,
    advance: int,
    grace: int,
    init: Callable[[], Any],
    f: Callable[[Any, Any, Any], Any],
) -> tuple[dict[tuple[Any, int], Any], list[TimedRec]]:
    """The window table {(key, start): aggregate} and the records dropped as late.

    Records are in each task's processing order; stream time is per task (the
    highest timestamp it has seen), a window takes a record while stream time <
    its end + grace; null keys and values are skipped."""
    table: dict[tuple[Any, int], Any] = {}
    stream_time: dict[Any, int] = {}
    late: list[TimedRec] = []
    for rec in records:
        task, k, v, ts = rec
        if k is None or v is None:
            continue
        now = stream_time[task] = max(stream_time.get(task, ts), ts)
        open_ = [s for s in window_starts(ts, size, advance) if s + size + grace > now]
        if not open_:
            late.append(rec)
        for s in open_:
            _put(table, (k, s), f(k, v, table[(k, s)] if (k, s) in table else init()))
    return table, late


def window_final(
    table: dict[tuple[Any, int], Any],
    records: Iterable[TimedRec],
    size: int,
    grace: int,
    task_of: Callable[[Any], Any],
) -> dict[tuple[Any, int], Any]:
    """What emit="final" (suppress until the window closes) has written: the windows of
    `table` (window_aggregate's) that closed, i.e. whose end + grace their task's stream
    time has reached."""
    stream_time: dict[Any, int] = {}
    for task, _, _, ts in records:
        stream_time[task] = max(stream_time.get(task, ts), ts)
    return {
        (k, s): v
        for (k, s), v in table.items()
        if s + size + grace <= stream_time.get(task_of(k), -1)
    }


def window_count(
    records: Iterable[TimedRec], size: int, advance: int, grace: int
) -> tuple[dict[tuple[Any, int], int], list[TimedRec]]:
    return window_aggregate(records, size, advance, grace, lambda: 0, lambda k, v, a: a + 1)


# -- session windows (SessionWindows + KStreamSessionWindowAggregate + suppress) --
SessionKey = tuple[Any, int, int]  # (key, start, end), end inclusive


def session_changelog(
    records: Iterable[TimedRec],
    gap: int,
    grace: int,
    init: Callable[[], Any],
    add: Callable[[Any, Any, Any], Any],
    merge: Callable[[Any, Any, Any], Any],
) -> tuple[list[tuple[Any, SessionKey, Any, int]], list[TimedRec]]:
    """What KStreamSessionWindowAggregate forwards, as (task, session, aggregate or None,
    record timestamp), and the records it drops as late.

    Per record (null keys and values skipped): stream time = max(stream time, ts); the
    session store's findSessions(key, ts - gap, ts + gap) gives the key's sessions with
    end >= ts - gap and start <= ts + gap that the store still keeps: its retention is
    gap + grace, measured on its own clock, the largest session end put into it (a session
    with end <= that clock - retention is not found). agg = merge(init(), each found
    session's aggregate in order); the merged window spans ts and them. If its end <
    stream time - grace the record is late; otherwise each found session is removed
    (forwarded as a tombstone with its end as timestamp) unless the merged window is just
    [ts, ts], and the merged session with add(k, v, agg) is put (a None aggregate removes
    it, as the session store's put of a null does) and forwarded (timestamp: its end)."""
    sessions: dict[Any, dict[tuple[int, int], Any]] = {}
    observed: dict[Any, int] = {}
    store_clock: dict[Any, int] = {}
    out: list[tuple[Any, SessionKey, Any, int]] = []
    late: list[TimedRec] = []
    for rec in records:
        task, k, v, ts = rec
        if k is None or v is None:
            continue
        now = observed[task] = max(observed.get(task, ts), ts)
        clock = store_clock.get(task)
        mine = sessions.setdefault(k, {})
        found = sorted(
            (s, e)
            for (s, e) in mine
            if e >= ts - gap and s <= ts + gap and (clock is None or e > clock - (gap + grace))
        )
        agg = init()
        lo, hi = ts, ts
        for s, e in found:
            agg = merge(k, agg, mine[(s, e)])
            lo, hi = min(lo, s), max(hi, e)
        if hi < now - grace:
            late.append(rec)
            continue
        if (lo, hi) != (ts, ts):
            for s, e in found:
                del mine[(s, e)]
                out.append((task, (k, s, e), None, e))
        agg = add(k, v, agg)
        if agg is not None:
            mine[(lo, hi)] = agg
        else:
            # the session store's put of a null aggregate removes the session: also the
            # one found as [ts, ts] itself, which the merge above left in place
            mine.pop((lo, hi), None)
        store_clock[task] = hi if clock is None else max(clock, hi)
        out.append((task, (k, lo, hi), agg, hi))
    return out, late


def session_table(changelog: Iterable[tuple[Any, SessionKey, Any, int]]) -> dict[SessionKey, Any]:
    """The session table emit="changes" writes: the latest value per session key."""
    table: dict[SessionKey, Any] = {}
    for _, sk, agg, _ in changelog:
        _put(table, sk, agg)
    return table


def suppress_final(
    changelog: Iterable[tuple[Any, SessionKey, Any, int]], grace: int
) -> list[tuple[SessionKey, Any]]:
    """What suppress(untilWindowCloses(unbounded())) lets through, per task: each record is
    buffered by its window key (replacing what is buffered), its clock is the largest
    record timestamp it has been sent, and after each record it evicts every buffered
    record whose window end <= clock - grace; evicted tombstones are dropped."""
    clock: dict[Any, int] = {}
    buffers: dict[Any, dict[SessionKey, Any]] = {}
    out: list[tuple[SessionKey, Any]] = []
    for task, sk, agg, ts in changelog:
        now = clock[task] = max(clock.get(task, ts), ts)
        buf = buffers.setdefault(task, {})
        buf[sk] = agg
        for key in [key for key in buf if key[2] <= now - grace]:
            value = buf.pop(key)
            if value is not None:
                out.append((key, value))
    return out


def session_count(
    records: Iterable[TimedRec], gap: int, grace: int
) -> tuple[list[tuple[Any, SessionKey, Any, int]], list[TimedRec]]:
    return session_changelog(
        records, gap, grace, lambda: 0, lambda k, v, a: a + 1, lambda k, a, b: a + b
    )


def session_reduce(
    records: Iterable[TimedRec], gap: int, grace: int, reducer: Callable[[Any, Any], Any]
) -> tuple[list[tuple[Any, SessionKey, Any, int]], list[TimedRec]]:
    """SessionWindowedKStreamImpl.reduce: an aggregate from null whose merger is the
    reducer-as-aggregator (a null aggregate takes the other side as is)."""

    def as_agg(k: Any, v: Any, a: Any) -> Any:
        return v if a is None else reducer(a, v)

    return session_changelog(
        records, gap, grace, lambda: None, as_agg, lambda k, a, b: as_agg(k, b, a)
    )


# -- joins (KStreamKTableJoin, KStreamGlobalKTableJoin, KTableKTableInnerJoin, FK) -----
Event = tuple[str, Any, Any]  # (side, key, value) in the order the join task takes them


def stream_table_join(
    events: Iterable[Event],
    joiner: Callable[[Any, Any], Any],
    how: str = "inner",
    key: Callable[[Any, Any], Any] | None = None,
) -> list[Rec]:
    """Events are ("stream" | "table", key, value). A table event upserts (None deletes);
    a stream record meets the table's value for key(k, v) (default k) at that moment.
    Stream records with a None value are ignored; without a match an inner join drops
    the record and a left join calls joiner(value, None), a None join key included."""
    table: dict[Any, Any] = {}
    out: list[Rec] = []
    for side, k, v in events:
        if side == "table":
            if k is not None:
                _put(table, k, v)
            continue
        if v is None:
            continue
        jk = k if key is None else key(k, v)
        tv = None if jk is None else table.get(jk)
        if tv is None and how == "inner":
            continue
        out.append((k, joiner(v, tv)))
    return out


def table_table_join(
    events: Iterable[Event], joiner: Callable[[Any, Any], Any], how: str = "inner"
) -> list[Rec]:
    """Events are ("left" | "right", key, value) upserts; the result's changelog. A key
    has a result while both sides hold it (inner), while the left side does (left), or
    while either does (outer): joiner(left, right) with None for a missing side; every
    change re-emits it, and a key that stops having a result is deleted."""
    sides: dict[str, dict[Any, Any]] = {"left": {}, "right": {}}
    out: list[Rec] = []

    def joined(k: Any) -> bool:
        here = [k in sides["left"], k in sides["right"]]
        return all(here) if how == "inner" else here[0] if how == "left" else any(here)

    for side, k, v in events:
        if k is None:
            continue
        before = joined(k)
        _put(sides[side], k, v)
        if joined(k):
            out.append((k, joiner(sides["left"].get(k), sides["right"].get(k))))
        elif before:
            out.append((k, None))
    return out


def table_table_fk_join(
    events: Iterable[Event],
    joiner: Callable[[Any, Any], Any],
    foreign_key: Callable[[Any, Any], Any],
    how: str = "inner",
) -> list[Rec]:
    """Kafka Streams' KTable-KTable foreign-key join (KIP-213; SubscriptionSendProcessor,
    SubscriptionReceiveProcessor, ForeignTableJoinProcessor, ResponseJoinProcessor), each
    event's subscriptions and responses delivered before the next event: events are
    ("left" | "right", key, value) upserts, the result is the join's changelog, keyed by
    the left key.

    A left change sends a subscription to foreign_key(k, v) (and removes the one of the
    old foreign key when it changed); the right side answers with its row for that key,
    and the answer becomes joiner(left, right) -- or, without a right row (a None
    foreign key included), joiner(left, None) in a left join and a tombstone in an
    inner one. A new left row of an inner join without a right row is not answered
    (PROPAGATE_ONLY_IF_FK_VAL_AVAILABLE); an update is (PROPAGATE_NULL_IF_NO_FK_VAL_
    AVAILABLE), so its old result is deleted. A left delete answers a tombstone. A
    right change answers every left row subscribed to its key. Kafka Streams forwards
    these tombstones whether or not the key had a result."""
    left: dict[Any, Any] = {}
    right: dict[Any, Any] = {}
    out: list[Rec] = []

    def answer(k: Any, lv: Any, rv: Any) -> None:
        if lv is None or (rv is None and how == "inner"):
            out.append((k, None))
        else:
            out.append((k, joiner(lv, rv)))

    for side, k, v in events:
        if k is None:
            continue
        if side == "right":
            if v is None and k not in right:
                continue  # deleting a row that is not there: no change to forward
            _put(right, k, v)
            # the left rows subscribed to k, in the subscription store's order
            for lk, lv in sorted(left.items()):
                if foreign_key(lk, lv) == k:
                    answer(lk, lv, v)
            continue
        old = left.get(k)
        _put(left, k, v)
        if v is None:
            if old is not None:
                answer(k, None, None)  # DELETE_KEY_AND_PROPAGATE
            continue
        fk = foreign_key(k, v)
        rv = None if fk is None else right.get(fk)
        if old is None and how == "inner" and rv is None:
            continue  # PROPAGATE_ONLY_IF_FK_VAL_AVAILABLE
        answer(k, v, rv)
    return out


def changes(changelog: Iterable[Rec]) -> list[Rec]:
    """The records of a changelog that change its table (a tombstone of an absent key,
    or a key's value again, change nothing)."""
    table: dict[Any, Any] = {}
    out: list[Rec] = []
    for k, v in changelog:
        if table.get(k) != v:
            out.append((k, v))
            _put(table, k, v)
    return out


# -- KStream-KStream joins (JoinWindows.ofTimeDifferenceAndGrace, KS >= 3.1) ------
#: (task, "left" | "right", key, value, timestamp ms) in the order the task takes them
StreamEvent = tuple[Any, str, Any, Any, int]
TimedOut = tuple[Any, Any, int]  # (key, joined value, timestamp)


def stream_stream_join(
    events: Iterable[StreamEvent],
    before: int,
    after: int,
    grace: int,
    joiner: Callable[[Any, Any], Any],
    how: str = "inner",
) -> tuple[list[TimedOut], list[StreamEvent]]:
    """The joined stream (in output order) and the records dropped as late.

    A left record at t meets every right record at r of its key with
    t - before <= r <= t + after (JoinWindows' "stream1.ts - before <= stream2.ts <=
    stream1.ts + after"), whichever came first, once per pair: joiner(l, r) at max(t, r).
    Stream time is the task's highest timestamp over both sides; records without key or
    value are skipped and do not move it. A left record is late once
    stream time is past t + after + grace, a right one past t + before + grace (the left
    timestamps it meets are [t - after, t + before]). When stream time passes that
    close time, a left record (left and outer joins) or right record (outer) that met
    nothing is written once as joiner(l, None) / joiner(None, r) with its timestamp,
    before the record that moved stream time is joined; records closing together are
    written oldest first, arrivals breaking ties."""
    seen: dict[Any, list[dict[str, Any]]] = {}  # task -> records taken so far
    now: dict[Any, int] = {}
    out: list[TimedOut] = []
    late: list[StreamEvent] = []
    alone = {"left": how in ("left", "outer"), "right": how == "outer"}
    reach = {"left": after, "right": before}
    for event in events:
        task, side, k, v, ts = event
        if k is None or v is None:
            continue
        now[task] = max(now.get(task, ts), ts)
        if ts + reach[side] + grace < now[task]:
            late.append(event)
            continue
        mine = seen.setdefault(task, [])
        closing = [
            r
            for r in mine
            if alone[r["side"]] and not r["done"] and r["ts"] + reach[r["side"]] + grace < now[task]
        ]
        for r in sorted(closing, key=lambda r: (r["ts"], r["n"])):
            r["done"] = True
            pair = (r["v"], None) if r["side"] == "left" else (None, r["v"])
            out.append((r["k"], joiner(*pair), r["ts"]))
        me = {"side": side, "k": k, "v": v, "ts": ts, "n": len(mine), "done": False}
        for r in sorted(mine, key=lambda r: (r["ts"], r["n"])):
            if r["side"] == side or r["k"] != k:
                continue
            lt, rt = (ts, r["ts"]) if side == "left" else (r["ts"], ts)
            if lt - before <= rt <= lt + after:
                r["done"] = me["done"] = True
                pair = (v, r["v"]) if side == "left" else (r["v"], v)
                out.append((k, joiner(*pair), max(ts, r["ts"])))
        mine.append(me)
    return out, late


# -- cogroup -------------------------------------------------------------------
#: a cogrouped record: (input index, partition, key, value, timestamp)
CogroupEvent = tuple[int, int, Any, Any, int]


def task_order(batch: Iterable[CogroupEvent]) -> list[CogroupEvent]:
    """The order a Kafka Streams task takes the records it has buffered (PartitionGroup):
    each input partition's records in offset order (`batch`'s order), and next always
    the head of the partition whose head has the lowest timestamp. Kafka Streams leaves
    equal timestamps to its priority queue; tablecast promises the earlier input (in
    cogroup()), then the lower partition, and so does this model."""
    queues: dict[tuple[int, int], list[CogroupEvent]] = {}
    for e in batch:
        queues.setdefault((e[0], e[1]), []).append(e)
    out: list[CogroupEvent] = []
    while any(queues.values()):
        pick = min((q[0][4], name) for name, q in queues.items() if q)[1]
        out.append(queues[pick].pop(0))
    return out


def cogroup_aggregate(
    events: Iterable[CogroupEvent],
    init: Callable[[], Any],
    aggregators: list[Callable[[Any, Any, Any], Any]],
) -> dict[Any, tuple[Any, int]]:
    """CogroupedKStream.aggregate: one KStreamAggregate per input over one timestamped
    store, records in processing order. A record without key or value is skipped; else
    the aggregate (init() when the key has none) becomes aggregators[input](key, value,
    aggregate), with timestamp max(the stored one, the record's), the record's own when
    the key had none; a None aggregate deletes the key. The store: {key: (aggregate,
    timestamp)}."""
    store: dict[Any, tuple[Any, int]] = {}
    for i, _, k, v, ts in events:
        if k is None or v is None:
            continue
        old = store.get(k)
        new = aggregators[i](k, v, init() if old is None else old[0])
        if new is None:
            store.pop(k, None)
        else:
            store[k] = (new, ts if old is None else max(ts, old[1]))
    return store


def cogroup_session_changelog(
    events: Iterable[tuple[Any, int, Any, Any, int]],
    gap: int,
    grace: int,
    init: Callable[[], Any],
    aggregators: list[Callable[[Any, Any, Any], Any]],
    merge: Callable[[Any, Any, Any], Any],
) -> tuple[list[tuple[Any, SessionKey, Any, int]], list[tuple[Any, int, Any, Any, int]]]:
    """cogroup(...).windowed_by(SessionWindows).aggregate(init, merger): one
    KStreamSessionWindowAggregate per input over one session store, each with its input's
    aggregator; events are (task, input, key, value, timestamp) in each task's processing
    order, stream time the task's over every input (as tablecast keeps it; see
    cogroup_window_aggregate). Returns session_changelog's changelog and late events."""
    timed = [(t, k, None if v is None else (i, v), ts) for t, i, k, v, ts in events]

    def add(k: Any, iv: tuple[int, Any], agg: Any) -> Any:
        return aggregators[iv[0]](k, iv[1], agg)

    changelog, late = session_changelog(timed, gap, grace, init, add, merge)
    return changelog, [(t, iv[0], k, iv[1], ts) for t, k, iv, ts in late]


def cogroup_window_aggregate(
    events: Iterable[tuple[Any, int, Any, Any, int]],
    size: int,
    advance: int,
    grace: int,
    init: Callable[[], Any],
    aggregators: list[Callable[[Any, Any, Any], Any]],
) -> tuple[dict[tuple[Any, int], tuple[Any, int]], list[tuple[Any, int, Any, Any, int]]]:
    """cogroup(...).windowed_by(TimeWindows).aggregate(init): events are (task, input, key,
    value, timestamp) in each task's processing order. Stream time is the task's highest
    timestamp over every input (records without key or value skipped, not moving it); a
    record goes into each window [s, s + size) holding it with stream time < s + size +
    grace, through its input's aggregator (init() for a window without aggregate; a None
    result deletes the window); with no such window it is late. Returns {(key, start):
    (aggregate, timestamp)} and the late records."""
    table: dict[tuple[Any, int], tuple[Any, int]] = {}
    stream_time: dict[Any, int] = {}
    late = []
    for e in events:
        task, i, k, v, ts = e
        if k is None or v is None:
            continue
        now = stream_time[task] = max(stream_time.get(task, ts), ts)
        open_ = [s for s in window_starts(ts, size, advance) if s + size + grace > now]
        if not open_:
            late.append(e)
        for s in open_:
            old = table.get((k, s))
            new = aggregators[i](k, v, init() if old is None else old[0])
            if new is None:
                table.pop((k, s), None)
            else:
                table[(k, s)] = (new, ts if old is None else max(ts, old[1]))
    return table, late
