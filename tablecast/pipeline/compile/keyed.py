"""Per-key state for the stateful steps: keys hashed into buckets, one
``applyInPandasWithState`` group per bucket, state in Spark's RocksDB store.

A stateful step is a *core*: a function of (key, that key's rows in this
micro-batch, its :class:`KeyState`) returning output rows. Rows are ordered by
(partition, offset, seq) first: Spark does not promise input order within a
group, and Kafka Streams' answers depend on it. The cores live beside what they
compute (:mod:`.aggregate`, :mod:`.transform`, :mod:`.join`, :mod:`.fk_join`); this
module runs them.

applyInPandasWithState costs ~1-3 ms per group and call on this hardware,
whatever the group's size, so one group per key would cap a table with many
keys at a few hundred keys per second. Keys are hashed into a fixed number of
buckets instead (BUCKETS_PER_PARTITION per topic partition); a bucket's state
is the dict of its keys' states, and each key's rows go to the core with a
:class:`KeyState` over that dict.

After a stream's ``repartition()`` topic, the per-key steps drop the copies a
restarted upstream query wrote again (see :func:`deduplicated`). Bad rows pass
through; a function that raises sends its record to the dead-letter topic and
leaves the state as it was.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from tablecast.pipeline.compile import envelope as env

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

# positions in a row of env.COLUMNS (+ env.REPARTITION where read from such a topic)
K, V, ERR, RK, RV, TOPIC, PART, OFF, SEQ, TS, OLD, BATCH, RID, SRC = range(14)

StateFn = Callable[[tuple[Any, ...], Iterator[Any], Any], Iterator[Any]]
Core = Callable[[Any, list[tuple[Any, ...]], "KeyState"], list[Any]]
#: buckets per input partition of a new stateful query (a query's checkpoint records the
#: count it started with, and that is what it keeps: tablecast.pipeline.run.layout)
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


@runtime_checkable
class LatestFirst(Protocol):
    """A core that, for a key whose rows are all good, needs only its latest ones:
    :meth:`change` takes them latest first and stops asking once it has what it needs."""

    def __call__(self, kb: Any, rows: list[tuple[Any, ...]], state: KeyState) -> list[Any]: ...

    def mark(self, cols: list[list[Any]]) -> list[int]:
        """Marks bad, in a batch's columns, the rows it refuses whatever their key's state
        (every record is checked, not just the latest); returns their positions."""
        ...

    def change(
        self, kb: Any, latest_first: Iterator[tuple[Any, ...]], out: list[Any], state: KeyState
    ) -> None: ...


def bucketed(core: Core, columns: list[str], group: int = K) -> StateFn:
    """The applyInPandasWithState function of a bucket: each key's rows, in order, to `core`
    (the key is the row's column `group`: the record key unless a step says otherwise)."""

    def fn(bucket: tuple[Any, ...], pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
        store = pickle.loads(state.get[0]) if state.exists else {}
        by_key: dict[Any, list[tuple[Any, ...]]] = {}
        for row in ordered_rows(pdfs):
            by_key.setdefault(row[group], []).append(row[:-1])  # without the bucket column
        out: list[tuple[Any, ...]] = []
        for kb, rows in by_key.items():
            out.extend(core(kb, rows, KeyState(store, kb)))
        yield from _finish(store, state, out, columns)

    return fn


def latest_bucketed(core: LatestFirst, columns: list[str]) -> StateFn:
    """:func:`bucketed` for a :class:`LatestFirst` core keyed by the record key: the same
    keys in the same order get the same calls, except that a key whose rows are all good
    goes to ``core.change`` with its rows latest first, each built as it is asked for.
    A table's retraction needs one row per key and batch however many records the key
    had: ordering and grouping by column (numpy) instead of by row tuple took its
    Python time per record from 3.3 to 1.0 us (one bucket of 15,625 records, 10 per
    key, in one process, medians of 7)."""

    def fn(bucket: tuple[Any, ...], pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
        import numpy as np
        import pandas as pd

        store = pickle.loads(state.get[0]) if state.exists else {}
        parts = list(pdfs)
        pdf = parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)
        if not len(pdf):
            return
        cols = [col.tolist() for _, col in pdf.iloc[:, :-1].items()]  # without the bucket
        at = np.lexsort((pdf.iloc[:, SEQ], pdf.iloc[:, OFF], pdf.iloc[:, PART]))
        codes = pd.factorize(pdf.iloc[:, K].to_numpy(), use_na_sentinel=True)[0][at]
        bad = pdf.iloc[:, ERR].notna().to_numpy() | pdf.iloc[:, K].isna().to_numpy()
        bad[core.mark(cols)] = True
        bad = bad[at]
        # stable: within a key, rows stay in (partition, offset, seq) order
        by_key = np.argsort(codes, kind="stable")
        keyed_codes = codes[by_key]
        starts = np.flatnonzero(np.r_[True, keyed_codes[1:] != keyed_codes[:-1]])
        ends = np.r_[starts[1:], len(codes)]
        any_bad = np.logical_or.reduceat(bad[by_key], starts)
        rows_at = at[by_key].tolist()
        out: list[tuple[Any, ...]] = []
        # keys in the order of their first row, as bucketed() meets them
        for g in np.argsort(by_key[starts], kind="stable").tolist():
            idx = rows_at[starts[g] : ends[g]]
            kb = cols[K][idx[0]]
            if any_bad[g]:
                out.extend(core(kb, [tuple(c[i] for c in cols) for i in idx], KeyState(store, kb)))
            else:
                latest = (tuple(c[i] for c in cols) for i in reversed(idx))
                core.change(kb, latest, out, KeyState(store, kb))
        yield from _finish(store, state, out, columns)

    return fn


def _finish(
    store: dict[Any, Any], state: Any, out: list[tuple[Any, ...]], columns: list[str]
) -> Iterator[Any]:
    """Keeps a bucket's dict in its state (none once empty) and yields its output rows."""
    if store:
        state.update((pickle.dumps(store, protocol=5),))
    elif state.exists:
        state.remove()
    if out:
        yield frame(out, columns)


def ordered_rows(pdfs: Iterator[Any]) -> list[tuple[Any, ...]]:
    # per-group cost is what limits these steps: plain tuples and a Python sort are ~50x
    # cheaper than pandas' sort_values/itertuples on the typical tiny group, and zipping
    # column lists 2.2x less CPU than DataFrame.to_numpy(object) on a large one (measured)
    rows: list[tuple[Any, ...]] = []
    for pdf in pdfs:
        rows.extend(zip(*[col.tolist() for _, col in pdf.items()], strict=True))
    if len(rows) > 1:
        rows.sort(key=lambda r: (r[PART], r[OFF], r[SEQ]))
    return rows


def frame(rows: list[tuple[Any, ...]], columns: list[str]) -> Any:
    import numpy as np
    import pandas as pd

    # one 2-D object array: no per-column type inference (Arrow gets the types from the
    # schema); measured cheaper than a typed array per column, conversion included
    cells = np.empty((len(rows), len(columns)), dtype=object)
    cells[:] = rows
    return pd.DataFrame(cells, columns=columns, copy=False)


def records(
    rows: list[tuple[Any, ...]], out: list[tuple[Any, ...]], width: int
) -> Iterator[tuple[Any, ...]]:
    """The rows a keyed step works on: an upstream error row goes straight to `out` (the
    dead-letter path), a row without key or value is skipped, as Kafka Streams does."""
    for row in rows:
        if row[ERR] is not None:
            out.append(row[:width])
        elif row[K] is not None and row[V] is not None:
            yield row


def bad_row(row: tuple[Any, ...], why: str, width: int) -> tuple[Any, ...]:
    out = (row[K], row[V], why[:1000], *row[RK : TS + 1])
    return out + (None,) * (width - len(out))


def out_row(
    row: tuple[Any, ...], key: bytes, value: bytes | None, width: int, ts: int | None = None
) -> tuple[Any, ...]:
    """A new record from the last row that changed it (`ts`: its timestamp, else the row's)."""
    out = (key, value, None, None, None, row[TOPIC], row[PART], row[OFF], 0, ts or row[TS])
    return out + (None,) * (width - len(out))


def later(a: int | None, b: int | None) -> int | None:
    """The larger of two timestamps, either possibly unknown (an aggregate's is its
    inputs' largest, as in Kafka Streams)."""
    if a is None:
        return b
    return a if b is None or a >= b else b


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
    for row in sorted(rows, key=lambda r: _batch(r[BATCH])):
        batch = _batch(row[BATCH])
        if batch < 0:  # no batch id: not from a deduplicated topic
            fresh.append(row)
            continue
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


def _batch(cell: Any) -> int:
    """A batch id cell, -1 for none. Pandas hands an integer column holding nulls over as
    floats, a null as NaN (a join's group of only the other side's rows, whose batch is
    null), so NaN is none too."""
    return -1 if cell is None or cell != cell else int(cell)


def through_id(row: tuple[Any, ...]) -> bytes:
    # a step between the topic and here may have made several rows of one record
    return bytes(row[RID]) + int(row[SEQ]).to_bytes(8, "big", signed=True)


def deduplicated(core: Core, keep_width: bool = False) -> Core:
    """`core` on rows read from a stream's repartition topic (envelope + its columns),
    each record once; what was applied is kept beside the key's state in its bucket.
    The rows reach `core` as bare envelopes unless `keep_width` (a join's have more)."""
    width = len(env.COLUMNS)

    def wrapped(kb: bytes | None, rows: list[tuple[Any, ...]], state: KeyState) -> list[Any]:
        mark = (SEEN, kb)
        last_batch, seen = state.store.get(mark, (-1, set()))
        rows, last_batch, seen = drop_copies(rows, last_batch, seen, through_id)
        if last_batch >= 0:
            state.store[mark] = (last_batch, seen)
        return core(kb, rows if keep_width else [r[:width] for r in rows], state)

    return wrapped


def by_bucket(
    df: DataFrame, core: Core, buckets: int, *out_extra: str, key: str = "key"
) -> DataFrame:
    """`core` per value of column `key`, keys hashed into buckets, state in the state store;
    the rows it returns have the envelope's columns plus `out_extra`."""
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    df = df.withColumn(BUCKET, F.pmod(F.xxhash64(F.col(key)), F.lit(buckets)))
    schema = env.schema(*out_extra)
    names = schema.fieldNames()
    if isinstance(core, LatestFirst) and key == "key":
        fn = latest_bucketed(core, names)
    else:
        fn = bucketed(core, names, df.columns.index(key))
    return df.groupBy(BUCKET).applyInPandasWithState(
        fn,
        schema,
        "store binary",
        "update",
        GroupStateTimeout.NoTimeout,
    )
