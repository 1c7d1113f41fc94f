"""Windowed aggregation of a grouped stream, with Kafka Streams' semantics.

A record belongs to every window [start, start + size) that contains its Kafka
timestamp (one for a tumbling window, size / advance for a hopping one). Each
task — here: the partition of the key, murmur2(key bytes) mod partitions, as
Kafka Streams' repartition topic and the window table have it — keeps its
*stream time*, the highest timestamp it has seen. A window takes records while
stream time < window end + grace; a record whose windows are all closed goes to
the dead-letter topic as a "late record" (Kafka Streams drops it).

One ``applyInPandasWithState`` group per task: its rows are processed in
(partition, offset, seq) order, so stream time advances as Kafka Streams'
would. The state is (stream time, {(key bytes, window start): aggregate
bytes}); windows that closed are forgotten. Each window whose aggregate changed
in a micro-batch is written once, keyed by the key bytes + the start as 8 bytes
big-endian, to the partition of its key (the output row's partition column).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

from tablecast.contract.window_keys import window_key
from tablecast.pipeline.compile import envelope as env
from tablecast.pipeline.compile.aggregate import Aggregator
from tablecast.pipeline.compile.flow import Flow
from tablecast.pipeline.compile.keyed import (
    OFF,
    TOPIC,
    TS,
    K,
    StateFn,
    V,
    bad_row,
    drop_copies,
    frame,
    later,
    ordered_rows,
    records,
    through_id,
)
from tablecast.pipeline.compile.session import SessionAggregator, session_core
from tablecast.pipeline.plan.queries import Step
from tablecast.serde import Serde
from tablecast.windows import SessionWindows, Windows

TASK = "_tc_task"


def window_core(
    windows: Windows,
    grace_ms: int,
    agg: Aggregator,
    key: Serde,
    value: Serde,
    result: Serde,
    through: bool = False,
    final: bool = False,
) -> StateFn:
    """`through`: rows come from a stream's repartition topic with record ids, and the
    copies a restarted upstream query wrote again are dropped (per task). `final`: each
    window is written once, when it closes (stream time reaches its end + grace), not on
    every change (Kafka Streams' suppress(untilWindowCloses))."""
    cols = env.COLUMNS
    width = len(cols)
    size = windows.size_ms

    def fn(group: tuple[Any, ...], pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
        task = int(group[0])
        stream_time: int | None
        # (stream time, {(key, start): (aggregate, its timestamp)}, (upstream batch, ids))
        stored = pickle.loads(state.get[0]) if state.exists else (None, {}, (-1, set()))
        stream_time, store = stored[0], stored[1]
        last_batch, seen = stored[2] if len(stored) > 2 else (-1, set())
        live: dict[tuple[bytes, int], Any] = {}  # decoded aggregates of windows touched
        last: dict[tuple[bytes, int], tuple[Any, ...]] = {}  # the last row that changed each
        times: dict[tuple[bytes, int], int | None] = {}  # each window's largest timestamp
        out: list[tuple[Any, ...]] = []
        rows = [row[:-1] for row in ordered_rows(pdfs)]  # without the task column
        if through:
            rows, last_batch, seen = drop_copies(rows, last_batch, seen, through_id)
        for row in records(rows, out, width):
            kb = row[K]
            ts = int(row[TS])
            stream_time = ts if stream_time is None else max(stream_time, ts)
            starts = open_windows(windows, ts, stream_time, grace_ms)
            if not starts:
                out.append(bad_row(row, late(windows, ts, stream_time, grace_ms), width))
                continue
            try:
                k, v = key.deserialize(kb), value.deserialize(row[V])
                new = {}
                for s in starts:
                    wk = (kb, s)
                    if wk not in live:
                        enc, t = _entry(store.get(wk))
                        live[wk] = None if enc is None else result.deserialize(enc)
                        times[wk] = t
                    new[wk] = agg.stream_add(k, v, live[wk])
            except Exception as e:  # the user's function failed: dead-letter this record
                out.append(bad_row(row, f"{agg.agg}: {type(e).__name__}: {e}", width))
                continue
            live.update(new)
            for wk in new:
                last[wk] = row
                times[wk] = later(times[wk], ts)
        for wk, row in last.items():
            current = live[wk]
            try:
                enc = None if current is None else result.serialize(current)
            except Exception as e:  # an aggregate its serde cannot write: keep the old one
                out.append(bad_row(row, f"encode aggregate: {type(e).__name__}: {e}", width))
                continue
            if enc is None:
                store.pop(wk, None)
            else:
                store[wk] = (enc, times[wk])
            if final:
                continue
            wkey = window_key(wk[0], wk[1])
            out.append((wkey, enc, None, None, None, row[TOPIC], task, row[OFF], 0, times[wk]))
        if stream_time is not None or last_batch >= 0:
            # a window closed for good takes no more records: forget it
            closed = [wk for wk in store if wk[1] + size + grace_ms <= (stream_time or 0)]
            for wk in sorted(closed, key=lambda w: w[1]):
                enc, t = _entry(store.pop(wk))
                if final and enc is not None:
                    out.append((window_key(*wk), enc, None, None, None, None, task, 0, 0, t))
            kept = (stream_time, store, (last_batch, seen))
            state.update((pickle.dumps(kept, protocol=5),))
        if out:
            yield frame(out, cols)

    return fn


def open_windows(windows: Windows, ts: int, stream_time: int, grace_ms: int) -> list[int]:
    """The starts of the windows holding `ts` that stream time has not closed (a window
    closes when stream time reaches its end + grace, as in Kafka Streams)."""
    return [s for s in windows.starts(ts) if s + windows.size_ms + grace_ms > stream_time]


def late(windows: Windows, ts: int, stream_time: int, grace_ms: int) -> str:
    """Why a record whose windows are all closed goes to the dead-letter topic."""
    return (
        f"late record: timestamp {ts}, stream time {stream_time}, "
        f"window size {windows.size_ms} ms, grace {grace_ms} ms"
    )


def _entry(stored: Any) -> tuple[bytes | None, int | None]:
    """A window's (aggregate, timestamp); a state from before timestamps holds bytes only."""
    if stored is None or isinstance(stored, tuple):
        return stored or (None, None)
    return stored, None


def partition_column() -> Any:
    """The Kafka sink's partition of an output row: its key's task (see window_core)."""
    from pyspark.sql import functions as F

    return F.col(env.PART)


def task_udf(partitions: int) -> Any:
    from pyspark.sql.functions import pandas_udf

    from tablecast.contract.partitioner import Partitioner

    @pandas_udf("int")  # type: ignore[call-overload]
    def task(keys):  # type: ignore[no-untyped-def]
        import pandas as pd

        part = Partitioner(partitions)
        return pd.Series([0 if k is None else part(bytes(k)) for k in keys], dtype="int32")

    return task


def apply(flow: Flow, step: Step, partitions: int, extra: tuple[str, ...]) -> Flow:
    """Run the windowed aggregation `step` on `flow` (whose extra columns hold the timestamp)."""
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    from tablecast.pipeline.plan import nodes as plan

    node = step.node
    assert isinstance(node, plan.Aggregate) and node.window is not None
    through = env.BATCH in extra
    flow = flow.envelope(*(extra if through else ()))
    w = node.window
    final = node.emit == "final"
    core: StateFn
    if isinstance(w.windows, SessionWindows):
        # the same tasks, stream time and output partitions; sessions merge instead
        sagg = SessionAggregator.of(node)
        args = (flow.key, flow.value, step.value, through, final)
        core = session_core(w.windows, w.grace_ms, sagg, *args)
    else:
        agg = Aggregator.of(node)
        args = (flow.key, flow.value, step.value, through, final)
        core = window_core(w.windows, w.grace_ms, agg, *args)
    df = flow.df.withColumn(TASK, task_udf(partitions)(F.col("key")))
    schema = env.schema()
    df = df.groupBy(TASK).applyInPandasWithState(
        core, schema, "store binary", "update", GroupStateTimeout.NoTimeout
    )
    return Flow(df, step.key, step.value, step.kind)
