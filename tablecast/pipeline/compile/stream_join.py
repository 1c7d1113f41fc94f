"""Stream-stream joins within a time window (Kafka Streams' KStream-KStream join).

Both streams' rows are tagged by side and grouped by task — the partition of
the key, murmur2(key bytes) mod partitions, as for windows
(:mod:`.window`) — with one ``applyInPandasWithState`` group per task, so the
task's *stream time* (the highest timestamp it has seen, of either side) moves
as a Kafka Streams task's would. A task takes its rows the way
:func:`.join.ordered` does: each input partition in offset order, the one whose
next record has the lowest timestamp first.

The state of a task is its join window stores: every key's records of both
sides seen in the last before + after + grace ms (Kafka Streams' window store
retention; an older record cannot meet any record that is not late), whether
each found a match, and the outer-join records still waiting for their window
to close. A record:

- without key or value is ignored (it does not move stream time);
- later than its window's grace (ts + after + grace < stream time for a left
  record, ts + before + grace for a right one) goes to the dead-letter topic;
- otherwise first closes the windows stream time has passed: a left (left and
  outer joins) or right (outer) record that met nothing is written once as
  ``joiner(value, None)`` / ``joiner(None, value)`` with its own timestamp —
  never earlier, so no spurious result is written for a record whose match is
  still to come (Kafka Streams >= 3.1);
- then meets the other side's records of its key within the window
  (``left.ts - before <= right.ts <= left.ts + after``, Kafka Streams'
  JoinWindows), oldest first: ``joiner(left, right)`` each, with the later
  timestamp of the two.

The state lives in the checkpoint with the offsets, so a restarted query
continues exactly; rows read from a topic with record ids (a derived other
stream, or a repartition() before the join) drop the copies a restarted writer
wrote again, per side.
"""

from __future__ import annotations

import heapq
import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F

from tablecast.pipeline.compile import envelope as env
from tablecast.pipeline.compile import joiner
from tablecast.pipeline.compile.flow import Flow
from tablecast.pipeline.compile.join import JK, LEFT, RIGHT, SIDE, SIDE_I, UNION, ordered
from tablecast.pipeline.compile.keyed import (
    ERR,
    OFF,
    PART,
    TOPIC,
    TS,
    K,
    StateFn,
    V,
    bad_row,
    drop_copies,
    frame,
    ordered_rows,
    through_id,
)
from tablecast.pipeline.compile.window import TASK, task_udf
from tablecast.serde import Serde
from tablecast.windows import JoinWindows

if TYPE_CHECKING:
    from tablecast.pipeline.plan.queries import Step

WIDTH = len(env.COLUMNS)


@dataclass
class Entry:
    """A record in its side's window store."""

    side: int
    ts: int
    seq: int  # arrival order in the task: ties of timestamps keep it
    value: bytes
    matched: bool = False


@dataclass
class TaskState:
    stream_time: int | None = None
    #: key bytes -> the key's records of both sides, in arrival order
    stores: dict[bytes, list[Entry]] = field(default_factory=dict)
    #: (window close time, ts, seq, key) of outer-join records not written yet
    waiting: list[tuple[int, int, int, bytes]] = field(default_factory=list)
    next_seq: int = 0
    #: per side: (upstream batch, record ids applied from it), see keyed.drop_copies
    applied: dict[int, tuple[int, set[bytes]]] = field(default_factory=dict)


@dataclass(frozen=True)
class StreamStreamJoin:
    window: JoinWindows
    how: str
    joiner: Callable[[Any, Any], Any]
    left: Serde
    right: Serde
    result: Serde

    def reach(self, side: int) -> int:
        """How far past its timestamp a record's window reaches (its close: + grace)."""
        return self.window.after_ms if side == LEFT else self.window.before_ms

    def outer(self, side: int) -> bool:
        """Whether a record of `side` that meets nothing is written alone."""
        return self.how == "outer" or (self.how == "left" and side == LEFT)

    def meets(self, side: int, ts: int, other_ts: int) -> bool:
        w = self.window
        left_ts, right_ts = (ts, other_ts) if side == LEFT else (other_ts, ts)
        return left_ts - w.before_ms <= right_ts <= left_ts + w.after_ms

    def joined(self, side: int, value: bytes | None, other: bytes | None) -> bytes | None:
        """joiner(left, right) as bytes; either may be missing (None)."""
        lb, rb = (value, other) if side == LEFT else (other, value)
        lv = None if lb is None else self.left.deserialize(lb)
        rv = None if rb is None else self.right.deserialize(rb)
        out = self.joiner(lv, rv)
        return None if out is None else self.result.serialize(out)

    def close(
        self, st: TaskState, row: tuple[Any, ...], out: list[tuple[Any, ...]], first: int
    ) -> None:
        """Write the outer-join records whose window stream time has passed and that met
        nothing, oldest first (a joiner that raises dead-letters the row that closed it)."""
        now = st.stream_time or 0
        due: list[tuple[int, int, bytes]] = []
        while st.waiting and st.waiting[0][0] < now:
            _, ts, seq, kb = heapq.heappop(st.waiting)
            due.append((ts, seq, kb))
        for ts, seq, kb in sorted(due):
            entry = next((e for e in st.stores.get(kb, ()) if e.seq == seq), None)
            if entry is None or entry.matched:
                continue
            entry.matched = True  # written: never alone again
            try:
                enc = self.joined(entry.side, entry.value, None)
            except Exception as e:  # the user's joiner failed: dead-letter the closing row
                out.append(bad_row(row, f"join: {type(e).__name__}: {e}", WIDTH))
                continue
            out.append(_out(row, kb, enc, ts, len(out) - first))

    def one(self, st: TaskState, row: tuple[Any, ...], out: list[tuple[Any, ...]]) -> None:
        kb, vb, side, ts = row[K], row[V], row[SIDE_I], int(row[TS])
        if kb is None or vb is None:
            return  # Kafka Streams skips records without key or value
        now = st.stream_time = ts if st.stream_time is None else max(st.stream_time, ts)
        grace = self.window.grace_ms
        if ts + self.reach(side) + grace < now:
            why = (
                f"late record: timestamp {ts}, stream time {now}, join window "
                f"{self.window.describe()}, {'left' if side == LEFT else 'right'} side"
            )
            out.append(bad_row(row, why, WIDTH))
            return
        first = len(out)
        self.close(st, row, out, first)
        entries = st.stores.setdefault(kb, [])
        matches = sorted(
            (e for e in entries if e.side != side and self.meets(side, ts, e.ts)),
            key=lambda e: (e.ts, e.seq),
        )
        try:
            results = [(self.joined(side, vb, e.value), max(ts, e.ts)) for e in matches]
        except Exception as e:  # the user's joiner failed: dead-letter this record only
            out.append(bad_row(row, f"join: {type(e).__name__}: {e}", WIDTH))
            return
        for e in matches:
            e.matched = True
        for enc, when in results:
            out.append(_out(row, kb, enc, when, len(out) - first))
        entry = Entry(side, ts, st.next_seq, vb, matched=bool(matches))
        st.next_seq += 1
        entries.append(entry)
        if self.outer(side) and not entry.matched:
            close_at = ts + self.reach(side) + grace
            heapq.heappush(st.waiting, (close_at, ts, entry.seq, kb))

    def expire(self, st: TaskState) -> None:
        """Forget records no record that is not late can meet any more."""
        if st.stream_time is None:
            return
        horizon = st.stream_time - self.window.retention_ms
        for kb in list(st.stores):
            kept = [e for e in st.stores[kb] if e.ts >= horizon]
            if kept:
                st.stores[kb] = kept
            else:
                del st.stores[kb]


def _out(row: tuple[Any, ...], kb: bytes, value: bytes | None, ts: int, n: int) -> tuple[Any, ...]:
    """A result, with the coordinates of the row that made it: its seq numbers the results
    of one row, so a record id downstream (partition, offset, seq) is the same when a
    restart computes it again. The two sides' topics share partition and offset numbers:
    the side is in the seq, or a left and a right row's results would have one id."""
    seq = 2 * n + row[SIDE_I]
    return (kb, value, None, None, None, row[TOPIC], row[PART], row[OFF], seq, ts)


def core(join: StreamStreamJoin, through: tuple[bool, bool]) -> StateFn:
    """The applyInPandasWithState function of a task; `through[side]`: that side's rows
    carry record ids, and copies are dropped."""

    def fn(group: tuple[Any, ...], pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
        st: TaskState = pickle.loads(state.get[0]) if state.exists else TaskState()
        rows = [row[:-1] for row in ordered_rows(pdfs)]  # without the task column
        fresh: list[tuple[Any, ...]] = []
        for side in (LEFT, RIGHT):
            mine = [r for r in rows if r[SIDE_I] == side]
            if through[side]:
                last, seen = st.applied.get(side, (-1, set()))
                mine, last, seen = drop_copies(mine, last, seen, through_id)
                if last >= 0:
                    st.applied[side] = (last, seen)
            fresh.extend(mine)
        out: list[tuple[Any, ...]] = []
        for row in ordered(fresh, table_first=False):
            if row[ERR] is not None:
                out.append(row[:WIDTH])
            else:
                join.one(st, row, out)
        join.expire(st)
        state.update((pickle.dumps(st, protocol=5),))
        if out:
            yield frame(out, env.COLUMNS)

    return fn


def apply(
    flow: Flow,
    other: Flow,
    step: Step,
    partitions: int,
    extra: tuple[str, ...],
    other_extra: tuple[str, ...],
) -> Flow:
    """Join `flow` (the left stream) with `other`; either one's `extra` columns are a
    record-id topic's (env.REPARTITION) when it reads one."""
    from pyspark.sql.streaming.state import GroupStateTimeout

    from tablecast.pipeline.plan import nodes as plan

    node = step.node
    assert isinstance(node, plan.Join) and node.window is not None
    through = (env.BATCH in extra, env.BATCH in other_extra)
    nulls = {c: F.lit(None).cast(env.schema(c)[c].dataType) for c in env.REPARTITION}
    sides = []
    for side, f, ids in ((LEFT, flow, through[LEFT]), (RIGHT, other, through[RIGHT])):
        df = f.envelope(*(env.REPARTITION if ids else ())).df
        df = df.withColumns({**({} if ids else nulls), JK: F.col("key"), SIDE: F.lit(side)})
        sides.append(df.select(*UNION))
    union = sides[0].unionByName(sides[1])
    # a Column joiner: the step pairs the values, Spark evaluates the Column after it
    fn, lv, rv, result = joiner.python_form(node.joiner, flow.value, other.value, step.value)
    join = StreamStreamJoin(node.window, node.how, fn, lv, rv, result)
    df = union.withColumn(TASK, task_udf(partitions)(F.col("key")))
    df = df.groupBy(TASK).applyInPandasWithState(
        core(join, through), env.schema(), "store binary", "update", GroupStateTimeout.NoTimeout
    )
    out = Flow(df, step.key, step.value, step.kind)
    return joiner.finish(out, node.joiner, flow.value, other.value)
