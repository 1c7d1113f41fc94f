"""Cogrouped aggregation (Kafka Streams' CogroupedKStream): several grouped streams, one
aggregate per key, each input applied through its own aggregator.

As a stream-stream join (:mod:`.stream_join`) does with its two sides, the query reads
its own input (the first cogrouped stream) and, beside it, every other input's topic —
its source topic, or ``<app>.changelog.<name>-cogroup<i>`` with record ids when the
input is derived (filtered, re-keyed by group_by(f), ...) and computed by queries of
its own. The rows of all inputs, tagged by input (the side column), are grouped by key
(keys hashed into buckets, :mod:`.keyed`) and go through one core, whose state per key
is the aggregate and its timestamp, as Kafka Streams' shared store holds.

The core follows KStreamAggregate, which Kafka Streams runs once per input, all over
one store: a record without key or value is skipped; otherwise the key's aggregate, or
``initializer()`` when it has none, becomes ``aggregator_i(key, value, aggregate)``
with timestamp max(the aggregate's, the record's) — the record's own when the
aggregate started over. A None result deletes the key, and its next record starts
over from ``initializer()``. A key whose aggregate changed in a micro-batch is written
once, with its latest aggregate (Kafka Streams' record cache does the same between
commits).

Order: within a micro-batch a key's records are taken as a Kafka Streams task picks
them from its input partitions: each input partition in offset order, the one whose
next record has the lowest timestamp first; on equal timestamps, the input listed
first in cogroup(), then the lower partition. A record read in a later micro-batch is
applied later. A function that raises, or an aggregate its serde cannot write, sends
its record to the dead-letter topic and leaves the aggregate as it was. Rows read from
a topic with record ids drop the copies a restarted writer wrote again, per input.

Windowed, the step runs per task (the key's partition) over all inputs: time windows by
:func:`window_core` here, sessions by :func:`tablecast.pipeline.compile.session.session_core`
fed through :class:`CogroupInputs` (one session store for every input, as Kafka Streams'
cogroup shares one).
"""

from __future__ import annotations

import heapq
import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import reduce
from typing import TYPE_CHECKING, Any

from tablecast.contract.window_keys import window_key
from tablecast.pipeline.compile import envelope as env
from tablecast.pipeline.compile.keyed import (
    ERR,
    OFF,
    PART,
    SEEN,
    TOPIC,
    TS,
    K,
    KeyState,
    StateFn,
    V,
    bad_row,
    by_bucket,
    drop_copies,
    frame,
    later,
    ordered_rows,
    out_row,
    through_id,
)
from tablecast.pipeline.compile.session import SessionAggregator, session_core
from tablecast.pipeline.compile.window import late, open_windows
from tablecast.serde import Serde
from tablecast.windows import SessionWindows, Windows

if TYPE_CHECKING:
    from tablecast.pipeline.compile.flow import Flow
    from tablecast.pipeline.plan.queries import Step

#: which input a row is from (its index in cogroup())
SIDE = "_tc_side"
#: every input's rows: the envelope, a record-id topic's columns (null where the input
#: has none), the side
UNION = [*env.COLUMNS, *env.REPARTITION, SIDE]
SIDE_I = UNION.index(SIDE)
WIDTH = len(env.COLUMNS)


def ordered(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """One key's rows (each input partition's in offset order) in the order a Kafka
    Streams task takes them: the partition whose next record has the lowest timestamp
    first; ties to the earlier input, then the lower partition (heapq.merge is stable)."""
    queues: dict[tuple[int, int], list[tuple[Any, ...]]] = {}
    for row in rows:
        queues.setdefault((int(row[SIDE_I]), int(row[PART])), []).append(row)

    def ts(row: tuple[Any, ...]) -> int:
        return row[TS] or 0

    return list(heapq.merge(*(q for _, q in sorted(queues.items())), key=ts))


@dataclass(frozen=True)
class Cogrouped:
    """The cogrouped aggregation as plain Python over decoded values."""

    aggregators: tuple[Callable[[Any, Any, Any], Any], ...]
    initializer: Callable[[], Any]

    def add(self, side: int, key: Any, value: Any, agg: Any) -> Any:
        """KStreamAggregate of input `side`: the aggregate after one record."""
        return self.aggregators[side](key, value, self.initializer() if agg is None else agg)


@dataclass(frozen=True)
class CogroupInputs:
    """A windowed cogroup task's rows of every input: `values[i]` is input i's value serde,
    `through[i]` whether its rows carry record ids. What was applied of those is kept per
    input: {input: (upstream batch, ids applied)}."""

    values: tuple[Serde, ...]
    through: tuple[bool, ...]

    def empty(self) -> dict[int, tuple[int, set[bytes]]]:
        return {}

    def fresh(
        self, rows: list[tuple[Any, ...]], applied: dict[int, tuple[int, set[bytes]]]
    ) -> tuple[list[tuple[Any, ...]], dict[int, tuple[int, set[bytes]]]]:
        """The rows without copies already applied, in the task's order (:func:`ordered`)."""
        applied = dict(applied)
        fresh: list[tuple[Any, ...]] = []
        for side, ids in enumerate(self.through):
            mine = [r for r in rows if r[SIDE_I] == side]
            if ids:
                last_batch, seen = applied.get(side, (-1, set()))
                mine, last_batch, seen = drop_copies(mine, last_batch, seen, through_id)
                if last_batch >= 0:
                    applied[side] = (last_batch, seen)
            fresh.extend(mine)
        return ordered(fresh), applied

    def decode(self, row: tuple[Any, ...]) -> tuple[int, Any]:
        side = int(row[SIDE_I])
        return side, self.values[side].deserialize(row[V])


def cogroup_core(
    cog: Cogrouped,
    key: Serde,
    values: tuple[Serde, ...],
    result: Serde,
    through: tuple[bool, ...],
) -> Callable[[Any, list[tuple[Any, ...]], KeyState], list[Any]]:
    """The per-key core; `values[i]`: input i's value serde; `through[i]`: its rows carry
    record ids. State: (aggregate bytes, its timestamp); beside it in the bucket, per
    input with ids, what drop_copies applied."""

    def core(kb: bytes | None, rows: list[tuple[Any, ...]], state: KeyState) -> list[Any]:
        fresh: list[tuple[Any, ...]] = []
        for side, ids in enumerate(through):
            mine = [r for r in rows if r[SIDE_I] == side]
            if ids:
                mark = (SEEN, side, kb)
                last_batch, seen = state.store.get(mark, (-1, set()))
                mine, last_batch, seen = drop_copies(mine, last_batch, seen, through_id)
                if last_batch >= 0:
                    state.store[mark] = (last_batch, seen)
            fresh.extend(mine)
        stored = state.get if state.exists else (None, None)
        current = None if stored[0] is None else result.deserialize(stored[0])
        ts: int | None = stored[1]
        k = None if kb is None else key.deserialize(kb)
        out: list[tuple[Any, ...]] = []
        last = None
        for row in ordered(fresh):
            if row[ERR] is not None:
                out.append(row[:WIDTH])
                continue
            if kb is None or row[V] is None:
                continue  # Kafka Streams skips records without key or value
            side = int(row[SIDE_I])
            try:
                v = values[side].deserialize(row[V])
                new = cog.add(side, k, v, current)
                enc = None if new is None else result.serialize(new)
            except Exception as e:  # the user's function failed: dead-letter this record
                out.append(bad_row(row, f"cogroup: {type(e).__name__}: {e}", WIDTH))
                continue
            # an aggregate that starts over takes the record's time (KStreamAggregate)
            ts = row[TS] if current is None else later(ts, row[TS])
            current, last = new, (row, enc)
            if new is None:
                ts = None
        if last is not None and kb is not None:
            row, enc = last
            if enc is None:
                state.remove()
            else:
                state.update((enc, ts))
            out.append(out_row(row, kb, enc, WIDTH, ts if enc is not None else row[TS]))
        return out

    return core


def apply(
    flows: list[tuple[Flow, tuple[str, ...]]], step: Step, buckets: int, partitions: int
) -> Flow:
    """Cogroup `flows` (each input's rows and the record-id columns it carries, the query's
    own input first) into the aggregation `step`: per key (keys in `buckets`), or per task
    (`partitions` of them) when windowed."""
    from pyspark.sql import functions as F

    from tablecast.pipeline.compile.flow import Flow
    from tablecast.pipeline.plan import nodes as plan

    node = step.node
    assert isinstance(node, plan.Cogroup)
    through = tuple(env.BATCH in extra for _, extra in flows)
    nulls = {c: F.lit(None).cast(env.schema(c)[c].dataType) for c in env.REPARTITION}
    frames = []
    for side, ((flow, _), ids) in enumerate(zip(flows, through, strict=True)):
        df = flow.envelope(*(env.REPARTITION if ids else ())).df
        df = df.withColumns({**({} if ids else nulls), SIDE: F.lit(side)})
        frames.append(df.select(*UNION))
    union = reduce(lambda a, b: a.unionByName(b), frames)
    first = flows[0][0]
    values = tuple(f.value for f, _ in flows)
    cog = Cogrouped(node.aggregators, node.initializer)
    if node.window is None:
        core = cogroup_core(cog, first.key, values, step.value, through)
        df = by_bucket(union, core, buckets)
        return Flow(df, step.key, step.value, step.kind)
    from pyspark.sql.streaming.state import GroupStateTimeout

    from tablecast.pipeline.compile.window import TASK, task_udf

    w = node.window
    final = node.emit == "final"
    inputs = CogroupInputs(values, through)
    fn: StateFn
    if isinstance(w.windows, SessionWindows):
        # one session store for all inputs, as Kafka Streams' cogroup keeps
        sagg = SessionAggregator("aggregate", node.initializer, None, node.merger, cog.aggregators)
        fn = session_core(w.windows, w.grace_ms, sagg, first.key, inputs, step.value, final=final)
    else:
        fn = window_core(cog, w.windows, w.grace_ms, first.key, inputs, step.value, final)
    df = union.withColumn(TASK, task_udf(partitions)(F.col("key")))
    df = df.groupBy(TASK).applyInPandasWithState(
        fn, env.schema(), "store binary", "update", GroupStateTimeout.NoTimeout
    )
    return Flow(df, step.key, step.value, step.kind)


# -- windowed: cogroup(...).windowed_by(tc.windows.tumbling/hopping(...)) ---------------
def window_core(
    cog: Cogrouped,
    windows: Windows,
    grace_ms: int,
    key: Serde,
    inputs: CogroupInputs,
    result: Serde,
    final: bool = False,
) -> StateFn:
    """The applyInPandasWithState function of a task (the key's partition, as for a
    grouped stream's windows, :mod:`.window`): the task's rows of every input, in the
    task's order (:func:`ordered`, over all its keys, as a Kafka Streams task takes
    them), one stream time over all inputs. A record belongs to every window
    [start, start + size) holding its timestamp that is still open (stream time < end +
    grace); one with none open is late (dead-lettered). Each window is KStreamAggregate's
    aggregate (:func:`cogroup_core`'s rules); `final`: written once, when it closes.
    State: (stream time, {(key, start): (aggregate, timestamp)}, {input: (upstream
    batch, ids applied)})."""
    size = windows.size_ms

    def fn(group: tuple[Any, ...], pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
        task = int(group[0])
        stored = pickle.loads(state.get[0]) if state.exists else (None, {}, inputs.empty())
        stream_time: int | None = stored[0]
        store: dict[tuple[bytes, int], tuple[bytes, int]] = stored[1]
        rows = [row[:-1] for row in ordered_rows(pdfs)]  # without the task column
        fresh, applied = inputs.fresh(rows, stored[2])
        out: list[tuple[Any, ...]] = []
        changed: dict[tuple[bytes, int], tuple[Any, ...]] = {}  # the last row changing each
        for row in fresh:
            if row[ERR] is not None:
                out.append(row[:WIDTH])
                continue
            kb = row[K]
            if kb is None or row[V] is None:
                continue  # skipped, and stream time does not move (as for windows)
            ts = int(row[TS])
            stream_time = ts if stream_time is None else max(stream_time, ts)
            starts = open_windows(windows, ts, stream_time, grace_ms)
            if not starts:
                out.append(bad_row(row, late(windows, ts, stream_time, grace_ms), WIDTH))
                continue
            try:
                k, (side, v) = key.deserialize(kb), inputs.decode(row)
                new: dict[tuple[bytes, int], tuple[bytes | None, int]] = {}
                for s in starts:
                    old = store.get((kb, s))
                    agg = cog.add(side, k, v, None if old is None else result.deserialize(old[0]))
                    enc = None if agg is None else result.serialize(agg)
                    new[(kb, s)] = (enc, ts if old is None else max(ts, old[1]))
            except Exception as e:  # the user's function failed: dead-letter this record
                out.append(bad_row(row, f"cogroup: {type(e).__name__}: {e}", WIDTH))
                continue
            for wk, (enc, t) in new.items():
                if enc is None:
                    store.pop(wk, None)
                else:
                    store[wk] = (enc, t)
                changed[wk] = (row, enc, t)
        if not final:
            for wk, (row, enc, t) in changed.items():
                at = t if enc is not None else row[TS]
                out.append(
                    (window_key(*wk), enc, None, None, None, row[TOPIC], task, row[OFF], 0, at)
                )
        # a window closed for good takes no more records: forget it (written now if final)
        closed = sorted(
            (wk for wk in store if wk[1] + size + grace_ms <= (stream_time or 0)),
            key=lambda w: w[1],
        )
        for wk in closed:
            enc, t = store.pop(wk)
            if final:
                out.append((window_key(*wk), enc, None, None, None, None, task, 0, 0, t))
        state.update((pickle.dumps((stream_time, store, applied), protocol=5),))
        if out:
            yield frame(out, env.COLUMNS)

    return fn
