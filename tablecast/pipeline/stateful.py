"""Stateful steps: ``applyInPandasWithState`` per key, state in Spark's RocksDB store.

Three steps, each a function of (key, that key's rows in this micro-batch,
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

Bad rows pass through; a function that raises sends its record to the
dead-letter topic and leaves the state as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

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

# positions in a row of env.COLUMNS (+ OLD, BATCH, RID where present)
K, V, ERR, RK, RV, TOPIC, PART, OFF, SEQ, X1, X2, X3 = range(12)

StateFn = Callable[[tuple[Any, ...], Iterator[Any], Any], Iterator[Any]]


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


def stream_aggregate(agg: Aggregator, key: Serde, value: Serde, result: Serde) -> StateFn:
    cols = env.COLUMNS

    def fn(group: tuple[Any, ...], pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
        kb = group[0]
        current = result.deserialize(state.get[0]) if state.exists else None
        k = None if kb is None else key.deserialize(kb)
        out: list[tuple[Any, ...]] = []
        last = None
        for row in _rows(pdfs):
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
        if last is not None:
            _store(state, out, last, kb, current, result, len(cols), lambda enc: (enc,))
        if out:
            yield _frame(out, cols)

    return fn


def _store(
    state: Any,
    out: list[tuple[Any, ...]],
    last: tuple[Any, ...],
    kb: bytes,
    current: Any,
    result: Serde,
    width: int,
    pack: Callable[[bytes | None], tuple[Any, ...]],
) -> None:
    try:
        enc = None if current is None else result.serialize(current)
    except Exception as e:  # an aggregate its serde cannot write: keep the old state
        out.append(_bad(last, f"encode aggregate: {type(e).__name__}: {e}", width))
        return
    if enc is None and pack(None) == (None,):
        state.remove()
    else:
        state.update(pack(enc))
    out.append(_out(last, kb, enc, width))


def retract() -> StateFn:
    cols = [*env.COLUMNS, env.OLD, env.RID]
    width = len(cols)

    def fn(group: tuple[Any, ...], pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
        kb = group[0]
        prev = state.get[0] if state.exists else None
        out: list[tuple[Any, ...]] = []
        changed = False
        for row in _rows(pdfs):
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
        if out:
            yield _frame(out, cols)

    return fn


def table_aggregate(agg: Aggregator, key: Serde, value: Serde, result: Serde) -> StateFn:
    cols = env.COLUMNS
    width = len(cols)

    def fn(group: tuple[Any, ...], pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
        kb = group[0]
        if state.exists:
            agg_b, last_batch, ids = state.get
        else:
            agg_b, last_batch, ids = None, -1, b""
        seen = split_ids(ids or b"")
        current = None if agg_b is None else result.deserialize(agg_b)
        k = key.deserialize(kb)
        out: list[tuple[Any, ...]] = []
        last = None
        for row in _rows(pdfs):
            if row[ERR] is not None:
                out.append(row[:width])
                continue
            batch, rid = int(row[X2]), row[X3]
            if batch < last_batch:
                continue  # a copy from an upstream batch that was fully applied
            if batch > last_batch:
                last_batch, seen = batch, set()
            if rid in seen:
                continue
            seen.add(rid)
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
            _store(state, out, last, kb, current, result, width, lambda e: (e, last_batch, blob))
        elif state.exists or seen:
            state.update((agg_b, last_batch, blob))
        if out:
            yield _frame(out, cols)

    return fn


def apply(flow: Flow, step: Step, extra: tuple[str, ...] = ()) -> Flow:
    """Run `step` on `flow` grouped by key bytes; returns encoded rows."""
    from pyspark.sql.streaming.state import GroupStateTimeout

    from tablecast.pipeline import plan

    flow = flow.envelope(*extra)
    out_extra: tuple[str, ...] = ()
    if step.what == "retract":
        fn = retract()
        state = "prev binary"
        out_extra = (env.OLD, env.RID)
    else:
        node = step.node
        assert isinstance(node, plan.Aggregate)
        agg = Aggregator.of(node)
        if step.what == "stream_aggregate":
            fn = stream_aggregate(agg, flow.key, flow.value, step.value)
            state = "agg binary"
        else:
            fn = table_aggregate(agg, flow.key, flow.value, step.value)
            state = "agg binary, batch bigint, ids binary"
    df = flow.df.groupBy("key").applyInPandasWithState(
        fn, env.schema(*out_extra), state, "update", GroupStateTimeout.NoTimeout
    )
    return Flow(df, step.key, step.value, step.kind)
