"""Joins as one stateful step: stream-table, stream-global-table, table-table.

Spark's own stream-stream joins keep both sides' rows until a watermark drops
them; Kafka Streams' joins instead meet each record with the *latest* value of
the other side at processing time. So a join query reads the other table's
topic beside its own input, the union of both (tagged by side) is grouped by
join key with applyInPandasWithState (keys bucketed, as in
:mod:`tablecast.pipeline.stateful`), and each join key's state is what a
Kafka Streams task would hold in its store:

- stream-table (global or not): the table's latest value. A table record
  updates it (None deletes); a stream record is joined with it. Inner drops
  records without a match, left calls ``joiner(value, None)`` for them;
  records with a None value are ignored, and a None join key matches nothing
  (as Kafka Streams since KIP-962).
- table-table (inner): both tables' latest values. A change on either side
  emits ``joiner(left, right)`` while both exist, and a delete of the result
  when one side goes away.

Both sides are shuffled to the join key by Spark, so neither a re-keyed stream
nor a key extractor needs a repartition topic (Kafka Streams needs one because
its tasks are per partition). Within a micro-batch a join key's records are
taken the way a Kafka Streams task picks them: each input partition in offset
order, the one whose next record has the lowest timestamp first, a table
record first on ties. A global table's records of a batch all come first, as
Kafka Streams brings a global store up to date before it processes records.
The state lives in the checkpoint, so a restarted query joins as before.

A join by a key extractor groups records by join key, not by their own key, so
one key's records of a micro-batch leave from several groups: the query writes
through foreachBatch and puts each key's records back in source (partition,
offset) order first, as a Kafka Streams task would have emitted them.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, StructField, StructType

from tablecast.pipeline.compile import envelope as env
from tablecast.pipeline.compile import joiner
from tablecast.pipeline.compile.codecs import Codec
from tablecast.pipeline.compile.columns import classic
from tablecast.pipeline.compile.flow import Flow, ok
from tablecast.pipeline.compile.keyed import (
    ERR,
    PART,
    RK,
    K,
    KeyState,
    V,
    by_bucket,
    deduplicated,
    later,
)
from tablecast.pipeline.plan import nodes as plan
from tablecast.serde import Serde

if TYPE_CHECKING:
    import pyarrow as pa

    from tablecast.pipeline.plan.queries import Step

#: the join key's bytes (in the table's key serde) and which side a row is from
JK = "_tc_jk"
SIDE = "_tc_side"
LEFT, RIGHT = 0, 1
#: both sides' rows: the envelope, a repartition topic's columns (the left side's, when
#: it reads one), the join key and the side
UNION = [*env.COLUMNS, *env.REPARTITION, JK, SIDE]
TS_I, SIDE_I = UNION.index(env.TS), UNION.index(SIDE)
WIDTH = len(env.COLUMNS)


def apply(flow: Flow, table: Flow, step: Step, buckets: int, extra: tuple[str, ...]) -> Flow:
    """Join `flow` (the left side) with `table`. Left rows read from a stream's repartition
    topic carry record ids (`extra`): the copies a restarted upstream query wrote are
    dropped per join key, so each record is joined once."""
    node = step.node
    assert isinstance(node, plan.Join) and node.parent is not None
    through = env.BATCH in extra
    left = with_join_key(flow, node.key_fn, table.key, extra if through else ()).df
    right = table.envelope().df.withColumns({JK: F.col("key")})
    nulls = {c: F.lit(None).cast(env.schema(c)[c].dataType) for c in env.REPARTITION}
    left = left.withColumns({**({} if through else nulls), SIDE: F.lit(LEFT)})
    right = right.withColumns({**nulls, SIDE: F.lit(RIGHT)})
    union = left.select(*UNION).unionByName(right.select(*UNION))
    # a Column joiner: the step pairs the values, Spark evaluates the Column after it
    fn, lv, rv, result = joiner.python_form(node.joiner, flow.value, table.value, step.value)
    core: Callable[..., list[Any]]
    if node.parent.kind == "stream":
        core = StreamJoin(fn, node.how, node.is_global, lv, rv, result)
    else:
        core = TableJoin(fn, lv, rv, result, node.how)
    if through:
        core = deduplicated(core, keep_width=True)
    df = by_bucket(union, core, buckets, key=JK)
    out = Flow(df, step.key, step.value, step.kind)
    return joiner.finish(out, node.joiner, flow.value, table.value)


def in_source_order(batch: DataFrame) -> DataFrame:
    """A micro-batch's output (a static DataFrame) with each key's records in one task, in
    source order: a join by a key extractor emits one key's records from several join keys'
    groups, and the Kafka sink would write them in whatever order the tasks run."""
    return batch.repartition(F.col("key")).sortWithinPartitions(env.PART, env.OFF, env.SEQ)


def with_join_key(flow: Flow, fn: plan.Fn | None, table_key: Serde, extra: tuple[str, ...]) -> Flow:
    """The left rows, enveloped (with `extra` columns) and with the bytes of their join key
    `fn(key, value)` (None: the row's key) in the other table's key serde."""
    if fn is None and flow.key.spec() == table_key.spec():
        flow = flow.envelope(*extra)
        return flow.with_df(flow.df.withColumn(JK, F.col("key")))
    if isinstance(fn, Column):
        decoded = flow.decode()
        df = decoded.df.withColumn(JK, classic(fn))
        jk = Codec(table_key).encode(F.col(JK), df.schema[JK].dataType)
        return decoded.with_df(df.withColumn(JK, F.when(ok(), jk))).envelope(*extra, JK)
    if fn is None:  # the stream's key, in the table's key serde
        fn = _own_key
    flow = flow.envelope(*extra)
    keyer = JoinKey(fn, flow.key, flow.value, table_key)
    schema = StructType([*flow.df.schema.fields, StructField(JK, BinaryType(), True)])
    return flow.with_df(flow.df.mapInArrow(keyer.map_batches, schema))


def _own_key(k: Any, v: Any) -> Any:
    return k


@dataclass(frozen=True)
class JoinKey:
    """A Python key extractor over Arrow batches: the join key's bytes per row, or the
    row marked bad when the extractor raises or its key does not fit the table's serde."""

    fn: Callable[[Any, Any], Any]
    key: Serde
    value: Serde
    table_key: Serde

    def one(self, kb: bytes | None, vb: bytes | None) -> bytes | None:
        if vb is None:
            return None  # ignored by the join anyway
        k = None if kb is None else self.key.deserialize(kb)
        jk = self.fn(k, self.value.deserialize(vb))
        return None if jk is None else self.table_key.serialize(jk)

    def map_batches(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        for batch in batches:
            keys = batch.column("key").to_pylist()
            values = batch.column("value").to_pylist()
            errors = batch.column(env.ERR).to_pylist()
            jks: list[bytes | None] = []
            for i, (kb, vb) in enumerate(zip(keys, values, strict=True)):
                jk = None
                if errors[i] is None:
                    try:
                        jk = self.one(kb, vb)
                    except Exception as e:  # the user's extractor failed: dead-letter the record
                        errors[i] = f"join key: {type(e).__name__}: {e}"[:1000]
                jks.append(jk)
            cols = {n: batch.column(n) for n in batch.schema.names}
            cols[env.ERR] = pa.array(errors, pa.string())
            cols[JK] = pa.array(jks, pa.binary())
            yield pa.RecordBatch.from_arrays(list(cols.values()), names=list(cols))


def ordered(rows: list[tuple[Any, ...]], table_first: bool) -> list[tuple[Any, ...]]:
    """One join key's rows (each partition's in offset order) in the order a Kafka Streams
    task takes them: the partition whose next record has the lowest timestamp first, the
    table's on ties; with `table_first` (a global table) all of the table's first."""
    queues: dict[tuple[int, int], list[tuple[Any, ...]]] = {}
    for row in rows:
        queues.setdefault((-row[SIDE_I], row[PART]), []).append(row)
    by_side = sorted(queues.items())  # the table's partitions first
    tables = [q for (side, _), q in by_side if side == -RIGHT]
    lefts = [q for (side, _), q in by_side if side == -LEFT]

    def ts(row: tuple[Any, ...]) -> int:
        return row[TS_I] or 0

    if table_first:
        return [r for q in tables for r in q] + list(heapq.merge(*lefts, key=ts))
    return list(heapq.merge(*tables, *lefts, key=ts))


def _emit(
    row: tuple[Any, ...], key: bytes, value: bytes | None, ts: int | None = None
) -> tuple[Any, ...]:
    """An output row: the input row's raw bytes and coordinates, a new key and value, and
    the row's timestamp unless `ts` says otherwise."""
    return (key, value, None, *row[RK:TS_I], row[TS_I] if ts is None else ts)


def _bad(row: tuple[Any, ...], why: str) -> tuple[Any, ...]:
    return (row[K], row[V], why[:1000], *row[RK : TS_I + 1])


@dataclass(frozen=True)
class StreamJoin:
    """The per-join-key step of a stream-table join; state: the table's latest value."""

    joiner: Callable[[Any, Any], Any]
    how: str
    is_global: bool
    value: Serde
    table_value: Serde
    result: Serde

    def __call__(self, jk: bytes | None, rows: list[Any], state: KeyState) -> list[Any]:
        current = state.get[0] if state.exists else None
        out: list[tuple[Any, ...]] = []
        for row in ordered(rows, self.is_global):
            if row[ERR] is not None:
                out.append(row[:WIDTH])
            elif row[SIDE_I] == RIGHT:
                current = row[V]
            elif row[V] is None or (current is None and self.how == "inner"):
                continue
            else:
                try:
                    tv = None if current is None else self.table_value.deserialize(current)
                    joined = self.joiner(self.value.deserialize(row[V]), tv)
                    enc = None if joined is None else self.result.serialize(joined)
                except Exception as e:  # the user's joiner failed: dead-letter the record
                    out.append(_bad(row, f"join: {type(e).__name__}: {e}"))
                    continue
                out.append(_emit(row, row[K], enc))
        if jk is not None:
            if current is None:
                state.remove()
            else:
                state.update((current,))
        return out


@dataclass(frozen=True)
class TableJoin:
    """The per-key step of a table-table join; state: both sides' latest values.

    A key has a result while both sides hold it (inner), while the left one does
    (left: ``joiner(left, right or None)``), or while either does (outer:
    ``joiner(left or None, right or None)``); a change re-emits it, and the key is
    deleted when it stops having one (KTableKTableInner/Left/OuterJoin)."""

    joiner: Callable[[Any, Any], Any]
    left_value: Serde
    right_value: Serde
    result: Serde
    how: str = "inner"

    def joined(self, left: bytes | None, right: bytes | None) -> bool:
        if self.how == "inner":
            return left is not None and right is not None
        if self.how == "left":
            return left is not None
        return left is not None or right is not None

    def __call__(self, kb: bytes | None, rows: list[Any], state: KeyState) -> list[Any]:
        stored = state.get if state.exists else (None, None)
        left, right = stored[:2]
        # each side's timestamp: a result carries the larger (a state from before them: none)
        times = list(stored[2:4]) if len(stored) > 2 else [None, None]
        out: list[tuple[Any, ...]] = []
        for row in ordered(rows, table_first=False):
            if row[ERR] is not None:
                out.append(row[:WIDTH])
                continue
            joined_before = self.joined(left, right)
            if row[SIDE_I] == LEFT:
                left = row[V]
            else:
                right = row[V]
            times[row[SIDE_I]] = row[TS_I]
            ts = later(*times)
            if self.joined(left, right):
                try:
                    lv = None if left is None else self.left_value.deserialize(left)
                    rv = None if right is None else self.right_value.deserialize(right)
                    joined = self.joiner(lv, rv)
                    enc = None if joined is None else self.result.serialize(joined)
                except Exception as e:  # dead-lettered; the result keeps its last value
                    out.append(_bad(row, f"join: {type(e).__name__}: {e}"))
                    continue
                out.append(_emit(row, kb, enc, ts))
            elif joined_before:
                out.append(_emit(row, kb, None, ts))
        if kb is not None:
            if left is None and right is None:
                state.remove()
            else:
                state.update((left, right, *times))
        return out
