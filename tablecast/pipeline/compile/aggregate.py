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

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

from tablecast.pipeline.compile import envelope as env
from tablecast.pipeline.compile.keyed import (
    ERR,
    OFF,
    OLD,
    PART,
    RID,
    RK,
    RV,
    SEQ,
    SRC,
    TOPIC,
    TS,
    Core,
    K,
    KeyState,
    V,
    bad_row,
    drop_copies,
    later,
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
from tablecast.serde import Serde, json_check

#: a selection's packed bytes (None: no group), or why the record failed
Selected = tuple[bytes | None, str | None]


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
        return self.table_add(key, new, self.table_subtract(key, old, agg))

    def table_subtract(self, key: Any, old: Any, agg: Any) -> Any:
        """The aggregate without `old` (subtracted only from an aggregate that exists)."""
        return self._subtract(key, old, agg) if old is not None and agg is not None else agg

    def table_add(self, key: Any, new: Any, agg: Any) -> Any:
        return self._add(key, new, agg) if new is not None else agg

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
    """State: (aggregate bytes, its timestamp: the largest of the records applied)."""
    width = len(env.COLUMNS)

    def core(kb: bytes | None, rows: list[tuple[Any, ...]], state: KeyState) -> list[Any]:
        stored = state.get if state.exists else (None, None)
        current = None if stored[0] is None else result.deserialize(stored[0])
        ts = stored[1] if len(stored) > 1 else None  # a state from before timestamps: none
        k = None if kb is None else key.deserialize(kb)
        out: list[tuple[Any, ...]] = []
        last = None
        for row in rows:
            if row[ERR] is not None:
                out.append(row[:width])
                continue
            if kb is None:
                continue  # Kafka Streams skips records without a key
            try:
                v = None if row[V] is None else value.deserialize(row[V])
                current = agg.stream_add(k, v, current)
            except Exception as e:  # the user's function failed: dead-letter this record
                out.append(bad_row(row, f"{agg.agg}: {type(e).__name__}: {e}", width))
                continue
            if v is not None:
                last, ts = row, later(ts, row[TS])
        if last is not None and kb is not None:
            enc = _encoded(current, result, last, out, width)
            if enc is not _FAILED:
                if enc is None:
                    state.remove()
                else:
                    state.update((enc, ts))
                out.append(out_row(last, kb, enc, width, ts))
        return out

    return core


#: an aggregate its serde could not write (the record that made it is dead-lettered)
_FAILED = object()


def _encoded(current: Any, result: Serde, last: tuple[Any, ...], out: list[Any], width: int) -> Any:
    try:
        return None if current is None else result.serialize(current)
    except Exception as e:  # an aggregate its serde cannot write: keep the old state
        out.append(bad_row(last, f"encode aggregate: {type(e).__name__}: {e}", width))
        return _FAILED


def retract(
    select: Callable[[bytes | None, bytes | None], Selected] | None = None,
    lean_topic: str | None = None,
    check_json: bool = False,
) -> Retraction:
    """State: the source row's last selection, packed (group key, group value).

    A source row changed several times in one micro-batch makes one change: from its
    selection before the batch to its selection after it, stamped with its last record
    (as Kafka Streams' record cache forwards a KTable's latest value per key at each
    commit, not every update). The aggregates come out the same for an adder and a
    subtractor that undo each other, which a table aggregation relies on anyway; the
    repartition topic and the aggregation downstream see one change per source row and
    batch instead of one per record.

    With `select` (the row's Python callables up to the selection, (key bytes, value
    bytes) -> (packed selection, error)), rows arrive as the table's own records and
    only the latest one is selected, as in Kafka Streams, where the selector sees
    what the table's cache forwards: one Python crossing instead of two, and one
    selector call per row and batch instead of one per record. A record whose
    callable fails goes to the dead-letter topic and the one before it is selected,
    as if the failed one had been dead-lettered upstream; the failures of records an
    unchanged later one supersedes go unseen (as behind Kafka Streams' cache).

    `lean_topic`: good rows come without raw bytes and topic (query.read), which are
    their key, value and this topic. `check_json`: their values were not checked as JSON
    in the JVM (query.read), so every record's is checked here, as the node checks a
    table's records (orjson's verdict, at simdjson's cost)."""
    return Retraction(select, lean_topic, check_json)


@dataclass(frozen=True)
class Retraction:
    """The retraction's core (see :func:`retract`). Only a row's latest good record
    matters, so it also offers :meth:`change`, which takes a key's good rows latest
    first: :func:`tablecast.pipeline.compile.keyed.latest_bucketed` builds just the
    rows it asks for."""

    select: Callable[[bytes | None, bytes | None], Selected] | None
    lean_topic: str | None
    check_json: bool = False

    def mark(self, cols: list[list[Any]]) -> list[int]:
        """Marks bad, in a batch's columns, the good rows whose value is not JSON (when
        this retraction checks them); returns their positions."""
        if not self.check_json:
            return []
        check = _json_check()
        err, values = cols[ERR], cols[V]
        failed = [i for i, v in enumerate(values) if v is not None and check(v) is not None]
        marked = [i for i in failed if err[i] is None]
        for i in marked:
            err[i] = NOT_JSON
            if self.lean_topic is not None and cols[TOPIC][i] is None:  # as _with_raw()
                cols[RK][i], cols[RV][i], cols[TOPIC][i] = cols[K][i], values[i], self.lean_topic
        return marked

    def __call__(self, kb: bytes | None, rows: list[tuple[Any, ...]], state: KeyState) -> list[Any]:
        out: list[tuple[Any, ...]] = []
        good = []
        check = _json_check() if self.check_json else None
        for row in rows:
            if check and row[ERR] is None and row[V] is not None and check(row[V]) is not None:
                row = _with_raw(row, self.lean_topic)
                row = (*row[:ERR], NOT_JSON, *row[ERR + 1 :])
            if row[ERR] is not None:
                out.append((*row[: len(env.COLUMNS)], None, None, None))
            elif kb is None:
                out.append(bad_row(_with_raw(row, self.lean_topic), "null key", _WIDTH))
            else:
                good.append(row)
        self.change(kb, reversed(good), out, state)
        return out

    def change(
        self,
        kb: bytes | None,
        latest_first: Iterator[tuple[Any, ...]],
        out: list[tuple[Any, ...]],
        state: KeyState,
    ) -> None:
        """Appends to `out` the change the key's good rows (latest first) make."""
        select, lean_topic = self.select, self.lean_topic
        before = state.get[0] if state.exists else None
        last, new = None, None
        for row in latest_first:
            if select is None:
                last, new = row, row[V]
                break
            selected, why = select(kb, row[V])
            if why is None:
                last, new = row, selected
                break
            out.append(bad_row(_with_raw(row, lean_topic), why, _WIDTH))
        if last is None:
            return
        og, ov = unpack_pair(before) if before is not None else (None, None)
        ng, nv = unpack_pair(new) if new is not None else (None, None)
        coords = (last[PART], last[OFF], last[SEQ])
        # the change keeps the source row's timestamp; the source key travels along, so
        # the aggregation knows whose contribution a later retraction takes back (a good
        # row's raw bytes are never written: not carried back to the JVM)
        base = (None, None, None, last[TOPIC] or lean_topic, *coords, last[TS])
        if og is not None and og == ng:
            out.append((og, nv, *base, ov, record_id(*coords, 1), kb))
        else:
            if og is not None:
                out.append((og, None, *base, ov, record_id(*coords, 0), kb))
            if ng is not None:
                out.append((ng, nv, *base, None, record_id(*coords, 1), kb))
        if new is None:
            state.remove()
        else:
            state.update((new,))


#: a retraction's output row: the envelope, then (old, rid, src)
_WIDTH = len(env.COLUMNS) + 3
#: why a value is refused: the JVM's words for it (Flow.validate)
NOT_JSON = "value is not json"


@cache
def _json_check() -> Callable[[bytes], str | None]:
    # one per worker process (a check holds a parser, which does not pickle)
    return json_check()


def _with_raw(row: tuple[Any, ...], lean_topic: str | None) -> tuple[Any, ...]:
    """`row` with its raw bytes and topic: a good row read lean (query.read) has them as
    its key and value and the input topic."""
    if lean_topic is not None and row[TOPIC] is None:
        return (*row[:RK], row[K], row[V], lean_topic, *row[TOPIC + 1 :])
    return row


def table_aggregate(agg: Aggregator, key: Serde, value: Serde, result: Serde) -> Core:
    """State: (aggregate bytes, latest upstream batch applied, ids applied from it, the
    aggregate's timestamp, held). `held` maps a source row's key to what it really
    contributes here when that differs from what the upstream step believes: a change
    whose adder raised was dead-lettered, so its row contributes nothing (None) and the
    retraction that comes when the row changes again must not be subtracted; a change
    whose subtractor raised left the old contribution in (its bytes), which is what a
    later retraction must take back. Without it such an aggregate would drift for good."""
    width = len(env.COLUMNS)

    def core(kb: bytes | None, rows: list[tuple[Any, ...]], state: KeyState) -> list[Any]:
        stored = state.get if state.exists else (None, -1, b"")
        agg_b, last_batch, ids = stored[:3]
        ts, held = (stored[3], dict(stored[4] or {})) if len(stored) > 3 else (None, {})
        rows, last_batch, seen = drop_copies(rows, last_batch, split_ids(ids or b""), _rid)
        current = None if agg_b is None else result.deserialize(agg_b)
        k = None if kb is None else key.deserialize(kb)
        out: list[tuple[Any, ...]] = []
        last = None
        for row in rows:
            if row[ERR] is not None:
                out.append(row[:width])
                continue
            src = row[SRC]
            src = None if src is None else bytes(src)
            old_b = held.get(src, row[OLD]) if src is not None else row[OLD]
            stage = "subtract"
            try:
                old = None if old_b is None else value.deserialize(old_b)
                new = None if row[V] is None else value.deserialize(row[V])
                after = agg.table_subtract(k, old, current)
                stage = "add"
                current = agg.table_add(k, new, after)
            except Exception as e:  # the user's function failed: dead-letter this change
                part, off, _, _ = unpack_record_id(row[RID])
                why = f"{agg.agg}: {type(e).__name__}: {e} (source partition {part} offset {off})"
                out.append(bad_row(row, why, width))
                if src is not None:
                    # what the row contributes now: still its old value, or (subtracted,
                    # the addition failed) nothing
                    held[src] = old_b if stage == "subtract" else None
                if stage == "add":
                    current, last, ts = after, row, later(ts, row[TS])
                continue
            held.pop(src, None)
            last, ts = row, later(ts, row[TS])
        blob = b"".join(sorted(seen))
        assert len(blob) % RID_SIZE == 0
        enc = agg_b
        if last is not None:
            enc = _encoded(current, result, last, out, width)
            if enc is _FAILED:
                enc = agg_b
            else:
                out.append(out_row(last, kb, enc, width, ts))
        if enc is not None or seen or held:
            # kept when the aggregate is gone too: the dedup ids and held contributions
            state.update((enc, last_batch, blob, ts, held or None))
        elif state.exists:
            state.remove()
        return out

    return core


def _rid(row: tuple[Any, ...]) -> bytes:
    return bytes(row[RID])
