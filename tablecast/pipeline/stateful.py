"""Stateful steps: ``applyInPandasWithState`` per key, state in Spark's RocksDB store.

Four steps, each a function of (key, that key's rows in this micro-batch,
its state). Rows are ordered by (partition, offset, seq) first: Spark does not
promise input order within a group, Kafka Streams' answers depend on it.

- ``stream_aggregate``: grouped stream count/reduce/aggregate; state = the aggregate.
- ``retract`` (table group_by, first query): per source key, state = the
  row's last (group key, group value). Each change emits a retraction of the
  old selection and an addition of the new one (one record when the group key
  stays), keyed by group key, with a record id.
- ``table_aggregate`` (second query): per group key, state = the aggregate and
  the ids of changes applied from the latest upstream batch, so the copies a
  restarted upstream query writes again are applied once.
- ``transform_values``: per stream key, state = the user's JSON state (see
  :mod:`tablecast.pipeline.transforming`).

After a stream's ``repartition()`` topic, the per-key steps drop the copies a
restarted upstream query wrote again, as ``table_aggregate`` does (see
:func:`deduplicated`).

Bad rows pass through; a function that raises sends its record to the
dead-letter topic and leaves the state as it was.

applyInPandasWithState costs ~1-3 ms per group and call on this hardware,
whatever the group's size, so one group per key would cap a table with many
keys at a few hundred keys per second. Keys are hashed into a fixed number of
buckets instead (BUCKETS_PER_PARTITION per topic partition); a bucket's state
is the dict of its keys' states, and each key's rows go to the per-key step
with a :class:`KeyState` over that dict.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from tablecast.pipeline import envelope as env
from tablecast.pipeline.aggregation import Aggregator
from tablecast.pipeline.flow import Flow
from tablecast.pipeline.planner import Step
from tablecast.pipeline.wire import (
    RID_SIZE,
    record_id,
    split_ids,
    unpack_pair,
    unpack_record_id,
)
from tablecast.serde import Serde

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

# positions in a row of env.COLUMNS (+ OLD, BATCH, RID where present)
K, V, ERR, RK, RV, TOPIC, PART, OFF, SEQ, X1, X2, X3 = range(12)

StateFn = Callable[[tuple[Any, ...], Iterator[Any], Any], Iterator[Any]]
Core = Callable[[Any, list[tuple[Any, ...]], "KeyState"], list[Any]]
BUCKETS_PER_PARTITION = 16
BUCKET = "_tc_bucket"
#: beside key k in a bucket's dict, (SEEN, k) holds what deduplicated() applied
SEEN = "_tc_seen"


class KeyState:
    """One key's state inside its bucket's dict (the part of GroupState the steps use)."""

    __slots__ = ("key", "store")

    def __init__(self, store: dict[Any, tuple[Any, ...]], key: Any) -> None:
        self.store = store
        self.key = key

    @property
    def exists(self) -> bool:
        return self.key in self.store

    @property
    def get(self) -> tuple[Any, ...]:
        return self.store[self.key]

    def update(self, value: tuple[Any, ...]) -> None:
        self.store[self.key] = tuple(value)

    def remove(self) -> None:
        self.store.pop(self.key, None)


def bucketed(core: Core, columns: list[str], group: int = K) -> StateFn:
    """The applyInPandasWithState function of a bucket: each key's rows, in order, to `core`
    (the key is the row's column `group`: the record key unless a step says otherwise)."""

    def fn(bucket: tuple[Any, ...], pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
        store = pickle.loads(state.get[0]) if state.exists else {}
        by_key: dict[Any, list[tuple[Any, ...]]] = {}
        for row in _rows(pdfs):
            by_key.setdefault(row[group], []).append(row[:-1])  # without the bucket column
        out: list[tuple[Any, ...]] = []
        for kb, rows in by_key.items():
            out.extend(core(kb, rows, KeyState(store, kb)))
        if store:
            state.update((pickle.dumps(store, protocol=5),))
        elif state.exists:
            state.remove()
        if out:
            yield _frame(out, columns)

    return fn


def _rows(pdfs: Iterator[Any]) -> list[tuple[Any, ...]]:
    # per-group cost is what limits these steps: plain tuples and a Python sort
    # are ~50x cheaper than pandas' sort_values/itertuples on the typical tiny group
    rows: list[tuple[Any, ...]] = []
    for pdf in pdfs:
        rows.extend(map(tuple, pdf.to_numpy(dtype=object).tolist()))
    if len(rows) > 1:
        rows.sort(key=lambda r: (r[PART], r[OFF], r[SEQ]))
    return rows


def _frame(rows: list[tuple[Any, ...]], columns: list[str]) -> Any:
    import numpy as np
    import pandas as pd

    # an object array: no per-column type inference (Arrow gets the types from the schema)
    cells = np.empty((len(rows), len(columns)), dtype=object)
    cells[:] = rows
    return pd.DataFrame(cells, columns=columns, copy=False)


def _bad(row: tuple[Any, ...], why: str, width: int) -> tuple[Any, ...]:
    out = (row[K], row[V], why[:1000], *row[RK : SEQ + 1])
    return out + (None,) * (width - len(out))


def _out(row: tuple[Any, ...], key: bytes, value: bytes | None, width: int) -> tuple[Any, ...]:
    out = (key, value, None, None, None, row[TOPIC], row[PART], row[OFF], 0)
    return out + (None,) * (width - len(out))


def stream_aggregate(agg: Aggregator, key: Serde, value: Serde, result: Serde) -> Core:
    cols = env.COLUMNS

    def core(kb: bytes | None, rows: list[tuple[Any, ...]], state: KeyState) -> list[Any]:
        current = result.deserialize(state.get[0]) if state.exists else None
        k = None if kb is None else key.deserialize(kb)
        out: list[tuple[Any, ...]] = []
        last = None
        for row in rows:
            if row[ERR] is not None:
                out.append(row)
                continue
            if kb is None:
                continue  # Kafka Streams skips records without a key
            try:
                v = None if row[V] is None else value.deserialize(row[V])
                current = agg.stream_add(k, v, current)
                last = row
            except Exception as e:  # the user's function failed: dead-letter this record
                out.append(_bad(row, f"{agg.agg}: {type(e).__name__}: {e}", len(cols)))
        if last is not None and kb is not None:
            _store(state, out, last, kb, current, result, len(cols), lambda enc: (enc,))
        return out

    return core


def _store(
    state: Any,
    out: list[tuple[Any, ...]],
    last: tuple[Any, ...],
    kb: bytes,
    current: Any,
    result: Serde,
    width: int,
    pack: Callable[[bytes | None], tuple[Any, ...]],
    keep_empty: bool = False,
) -> None:
    """Store the new aggregate (or forget the key when it is gone, unless `keep_empty`:
    a table aggregation keeps its dedup ids) and emit it as the key's new value."""
    try:
        enc = None if current is None else result.serialize(current)
    except Exception as e:  # an aggregate its serde cannot write: keep the old state
        out.append(_bad(last, f"encode aggregate: {type(e).__name__}: {e}", width))
        return
    if enc is None and not keep_empty:
        state.remove()
    else:
        state.update(pack(enc))
    out.append(_out(last, kb, enc, width))


def retract() -> Core:
    cols = [*env.COLUMNS, env.OLD, env.RID]
    width = len(cols)

    def core(kb: bytes | None, rows: list[tuple[Any, ...]], state: KeyState) -> list[Any]:
        prev = state.get[0] if state.exists else None
        out: list[tuple[Any, ...]] = []
        changed = False
        for row in rows:
            if row[ERR] is not None:
                out.append((*row, None, None))
                continue
            if kb is None:
                out.append(_bad(row, "null key", width))
                continue
            new = row[V]
            og, ov = unpack_pair(prev) if prev is not None else (None, None)
            ng, nv = unpack_pair(new) if new is not None else (None, None)
            coords = (row[PART], row[OFF], row[SEQ])
            base = (row[ERR], row[RK], row[RV], row[TOPIC], *coords)
            if og is not None and og == ng:
                out.append((og, nv, *base, ov, record_id(*coords, 1)))
            else:
                if og is not None:
                    out.append((og, None, *base, ov, record_id(*coords, 0)))
                if ng is not None:
                    out.append((ng, nv, *base, None, record_id(*coords, 1)))
            prev = new
            changed = True
        if changed:
            if prev is None:
                state.remove()
            else:
                state.update((prev,))
        return out

    return core


def table_aggregate(agg: Aggregator, key: Serde, value: Serde, result: Serde) -> Core:
    cols = env.COLUMNS
    width = len(cols)

    def core(kb: bytes | None, rows: list[tuple[Any, ...]], state: KeyState) -> list[Any]:
        if state.exists:
            agg_b, last_batch, ids = state.get
        else:
            agg_b, last_batch, ids = None, -1, b""
        rows, last_batch, seen = drop_copies(rows, last_batch, split_ids(ids or b""), _rid)
        current = None if agg_b is None else result.deserialize(agg_b)
        k = None if kb is None else key.deserialize(kb)
        out: list[tuple[Any, ...]] = []
        last = None
        for row in rows:
            if row[ERR] is not None:
                out.append(row[:width])
                continue
            rid = row[X3]
            try:
                old = None if row[X1] is None else value.deserialize(row[X1])
                new = None if row[V] is None else value.deserialize(row[V])
                current = agg.table_change(k, old, new, current)
                last = row
            except Exception as e:  # the user's function failed: dead-letter this change
                part, off, _, _ = unpack_record_id(rid)
                why = f"{agg.agg}: {type(e).__name__}: {e} (source partition {part} offset {off})"
                out.append(_bad(row, why, width))
        blob = b"".join(sorted(seen))
        assert len(blob) % RID_SIZE == 0
        if last is not None:
            pack = lambda e: (e, last_batch, blob)  # noqa: E731
            _store(state, out, last, kb, current, result, width, pack, keep_empty=True)
        elif state.exists or seen:
            state.update((agg_b, last_batch, blob))
        return out

    return core


def drop_copies(
    rows: list[tuple[Any, ...]],
    last_batch: int,
    seen: set[bytes],
    ident: Callable[[tuple[Any, ...]], bytes],
) -> tuple[list[tuple[Any, ...]], int, set[bytes]]:
    """A key's rows from an internal topic without the copies a restarted upstream query
    wrote again (same upstream batch id, same record id): returns the fresh rows and
    the latest upstream batch with the ids applied from it. Upstream batches are written
    one after the other, so a batch older than the latest one applied is done."""
    fresh = []
    # stable: (partition, offset) order within a batch stays
    for row in sorted(rows, key=lambda r: -1 if r[X2] is None else int(r[X2])):
        if row[X2] is None:  # no batch id: not from a deduplicated topic
            fresh.append(row)
            continue
        batch = int(row[X2])
        if batch < last_batch:
            continue
        if batch > last_batch:
            last_batch, seen = batch, set()
        i = ident(row)
        if i in seen:
            continue
        seen.add(i)
        fresh.append(row)
    return fresh, last_batch, seen


def _rid(row: tuple[Any, ...]) -> bytes:
    return bytes(row[X3])


def _through_id(row: tuple[Any, ...]) -> bytes:
    # a step between the topic and here may have made several rows of one record
    return bytes(row[X3]) + int(row[SEQ]).to_bytes(8, "big", signed=True)


def deduplicated(core: Core) -> Core:
    """`core` on rows read from a stream's repartition topic (envelope + old, batch, rid),
    each record once; what was applied is kept beside the key's state in its bucket."""
    width = len(env.COLUMNS)

    def wrapped(kb: bytes | None, rows: list[tuple[Any, ...]], state: KeyState) -> list[Any]:
        mark = (SEEN, kb)
        last_batch, seen = state.store.get(mark, (-1, set()))
        rows, last_batch, seen = drop_copies(rows, last_batch, seen, _through_id)
        if last_batch >= 0:
            state.store[mark] = (last_batch, seen)
        return core(kb, [r[:width] for r in rows], state)

    return wrapped


def apply(flow: Flow, step: Step, partitions: int, extra: tuple[str, ...] = ()) -> Flow:
    """Run `step` on `flow`, keys hashed into buckets; returns encoded rows."""
    from tablecast.pipeline import plan

    # rows read from a stream's repartition topic carry (old, batch, rid): copies are
    # dropped before a per-key step (a table aggregation drops them itself)
    through = env.BATCH in extra and step.what in ("stream_aggregate", "transform_values")
    if step.what != "table_aggregate" and not through:
        extra = ()
    flow = flow.envelope(*extra)
    out_extra: tuple[str, ...] = ()
    if step.what == "retract":
        core = retract()
        out_extra = (env.OLD, env.RID)
    elif step.what == "transform_values":
        from tablecast.pipeline.transforming import transform_values

        assert isinstance(step.node, plan.TransformValues)
        core = transform_values(step.node.fn, flow.key, flow.value, step.value)
    else:
        node = step.node
        assert isinstance(node, plan.Aggregate)
        agg = Aggregator.of(node)
        make = stream_aggregate if step.what == "stream_aggregate" else table_aggregate
        core = make(agg, flow.key, flow.value, step.value)
    if through:
        core = deduplicated(core)
    df = by_bucket(flow.df, core, partitions, *out_extra)
    return Flow(df, step.key, step.value, step.kind)


def by_bucket(
    df: DataFrame, core: Core, partitions: int, *out_extra: str, key: str = "key"
) -> DataFrame:
    """`core` per value of column `key`, keys hashed into buckets, state in the state store;
    the rows it returns have the envelope's columns plus `out_extra`."""
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    buckets = BUCKETS_PER_PARTITION * partitions
    df = df.withColumn(BUCKET, F.pmod(F.xxhash64(F.col(key)), F.lit(buckets)))
    schema = env.schema(*out_extra)
    return df.groupBy(BUCKET).applyInPandasWithState(
        bucketed(core, schema.fieldNames(), df.columns.index(key)),
        schema,
        "store binary",
        "update",
        GroupStateTimeout.NoTimeout,
    )
