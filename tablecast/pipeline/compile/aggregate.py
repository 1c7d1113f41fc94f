"""Aggregations: Kafka Streams' semantics as plain Python, and the per-key steps that run them.

:class:`Aggregator` takes and returns decoded Python values, with ``None``
meaning "no aggregate" (absent or deleted). The steps (cores run by
:mod:`.keyed`, one key's rows of a micro-batch at a time):

- ``stream_aggregate``: grouped stream count/reduce/aggregate; state = the aggregate.
- ``retract`` (table group_by, first query): per source key, state = the
  row's last (group key, group value). Each change emits a retraction of the
  old selection and an addition of the new one (one record when the group key
  stays), keyed by group key, with a record id.
- ``table_aggregate`` (second query): per group key, state = the aggregate and
  the ids of changes applied from the latest upstream batch, so the copies a
  restarted upstream query writes again are applied once.

- Grouped streams (KStreamAggregate / KStreamReduce): records with a None
  value are skipped; the first value starts a reduce, ``initializer()`` starts
  an aggregate; a None result deletes the key, and the next record starts over.
- Grouped tables (KTableAggregate / KTableReduce): a change carries the row's
  old and new contribution. The old one is subtracted only if there is an
  aggregate; the new one is added to the aggregate, or to ``initializer()``
  (a reduce: becomes the aggregate) when there is none. The result is stored
  as is, so a None from adder or subtractor deletes the key. A count is the
  aggregate 0 / +1 / -1 and stays at 0 when its group empties, as in Kafka Streams.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tablecast.pipeline.compile import envelope as env
from tablecast.pipeline.compile.keyed import (
    ERR,
    OFF,
    PART,
    RK,
    RV,
    SEQ,
    TOPIC,
    X1,
    X3,
    Core,
    KeyState,
    V,
    bad_row,
    drop_copies,
    out_row,
)
from tablecast.pipeline.plan import nodes as plan
from tablecast.pipeline.plan.wire import (
    RID_SIZE,
    record_id,
    split_ids,
    unpack_pair,
    unpack_record_id,
)
from tablecast.serde import Serde


@dataclass(frozen=True)
class Aggregator:
    agg: plan.AggKind
    initializer: Callable[[], Any] | None = None
    adder: Callable[..., Any] | None = None
    subtractor: Callable[..., Any] | None = None

    @classmethod
    def of(cls, node: plan.Aggregate) -> Aggregator:
        return cls(node.agg, node.initializer, node.adder, node.subtractor)

    # -- grouped streams ---------------------------------------------------
    def stream_add(self, key: Any, value: Any, agg: Any) -> Any:
        if value is None:
            return agg
        if self.agg == "count":
            return (agg or 0) + 1
        assert self.adder is not None
        if self.agg == "reduce":
            return value if agg is None else self.adder(agg, value)
        assert self.initializer is not None
        return self.adder(key, value, self.initializer() if agg is None else agg)

    # -- grouped tables ----------------------------------------------------
    def table_change(self, key: Any, old: Any, new: Any, agg: Any) -> Any:
        if old is not None and agg is not None:
            agg = self._subtract(key, old, agg)
        if new is not None:
            agg = self._add(key, new, agg)
        return agg

    def _subtract(self, key: Any, old: Any, agg: Any) -> Any:
        if self.agg == "count":
            return agg - 1
        assert self.subtractor is not None
        if self.agg == "reduce":
            return self.subtractor(agg, old)
        return self.subtractor(key, old, agg)

    def _add(self, key: Any, new: Any, agg: Any) -> Any:
        if self.agg == "count":
            return (0 if agg is None else agg) + 1
        assert self.adder is not None
        if self.agg == "reduce":
            return new if agg is None else self.adder(agg, new)
        assert self.initializer is not None
        return self.adder(key, new, self.initializer() if agg is None else agg)


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
                out.append(bad_row(row, f"{agg.agg}: {type(e).__name__}: {e}", len(cols)))
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
        out.append(bad_row(last, f"encode aggregate: {type(e).__name__}: {e}", width))
        return
    if enc is None and not keep_empty:
        state.remove()
    else:
        state.update(pack(enc))
    out.append(out_row(last, kb, enc, width))


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
                out.append(bad_row(row, "null key", width))
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
                out.append(bad_row(row, why, width))
        blob = b"".join(sorted(seen))
        assert len(blob) % RID_SIZE == 0
        if last is not None:
            pack = lambda e: (e, last_batch, blob)  # noqa: E731
            _store(state, out, last, kb, current, result, width, pack, keep_empty=True)
        elif state.exists or seen:
            state.update((agg_b, last_batch, blob))
        return out

    return core


def _rid(row: tuple[Any, ...]) -> bytes:
    return bytes(row[X3])
