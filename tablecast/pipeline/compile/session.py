"""Session-windowed aggregation of a grouped stream, or of cogrouped streams sharing one
session store, with Kafka Streams' semantics (SessionWindows.ofInactivityGapAndGrace +
KStreamSessionWindowAggregate, one per cogrouped input).

Per key, a record at ts joins every session [start, end] of its key with
start - gap <= ts <= end + gap; they merge into one session [min start, max end]
whose aggregate is the sessions' aggregates merged (count: summed; reduce: the
reducer; aggregate: the user's merger), then the record added. Stream time is
per task (the key's partition), as in :mod:`.window`. A record is late, and goes
to the dead-letter topic, when the session it would make ends before stream
time - grace; that can only happen when every session it touches has closed.

``emit="changes"`` writes the new session on each change and a tombstone for
every session merged away (their keys differ: a session's key holds its start
and end). ``emit="final"`` writes each session once, when stream time reaches
its end + grace, and no tombstones: Kafka Streams' suppress(untilWindowCloses)
drops them, so a closed session that a later record bridges stays written
beside the merged one. Kafka Streams takes a record into a session while
end + grace >= stream time but lets it through suppress once end + grace <=
stream time: a record at exactly that edge updates a session already written,
and the new result is written too (suppress has nothing left to hold it).

Sessions stay in the state while end + gap + grace > the largest timestamp
of the records taken so far, exactly as long as Kafka Streams' session store
finds them (its retention is gap + grace, measured on the ends of the sessions
put into it: AbstractRocksDBSegmentedBytesStore.getActualFrom). A session it no
longer finds is not merged, even with a record within its gap.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from tablecast.contract.window_keys import session_key
from tablecast.pipeline.compile import envelope as env
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
    ordered_rows,
    records,
    through_id,
)
from tablecast.pipeline.plan import nodes as plan
from tablecast.serde import Serde
from tablecast.windows import SessionWindows

#: a session in the state: (start, end, aggregate bytes, written as final). Its records'
#: largest timestamp is its end: the timestamp its table record gets, as in Kafka Streams
Session = tuple[int, int, bytes, bool]


@dataclass(frozen=True)
class SessionAggregator:
    """Kafka Streams' three session aggregations as initializer, adder and merger."""

    agg: plan.AggKind
    initializer: Callable[[], Any] | None = None
    adder: Callable[..., Any] | None = None
    merger: Callable[..., Any] | None = None
    #: a cogroup's: input i's records go through aggregators[i] (then `adder` is unused)
    aggregators: tuple[Callable[[Any, Any, Any], Any], ...] = ()

    @classmethod
    def of(cls, node: plan.Aggregate) -> SessionAggregator:
        return cls(node.agg, node.initializer, node.adder, node.merger)

    def init(self) -> Any:
        if self.agg == "count":
            return 0
        if self.agg == "reduce":
            return None  # the first value starts a reduce
        assert self.initializer is not None
        return self.initializer()

    def merge(self, key: Any, a: Any, b: Any) -> Any:
        if self.agg == "count":
            return a + b
        if self.agg == "reduce":  # SessionWindowedKStreamImpl's mergerForAggregator
            assert self.adder is not None
            return b if a is None else self.adder(a, b)
        assert self.merger is not None
        return self.merger(key, a, b)

    def add(self, key: Any, value: Any, agg: Any, side: int = 0) -> Any:
        if self.agg == "count":
            return agg + 1
        if self.aggregators:
            return self.aggregators[side](key, value, agg)
        assert self.adder is not None
        if self.agg == "reduce":
            return value if agg is None else self.adder(agg, value)
        return self.adder(key, value, agg)


class Inputs(Protocol):
    """Where a session step's rows come from: one grouped stream (:class:`OneInput`) or a
    cogroup's several (:class:`tablecast.pipeline.compile.cogroup.CogroupInputs`)."""

    def empty(self) -> Any:
        """What was applied of record-id topics before the first batch (kept in the state)."""
        ...

    def fresh(self, rows: list[tuple[Any, ...]], applied: Any) -> tuple[list[tuple[Any, ...]], Any]:
        """A task's rows of one micro-batch without copies already applied, in the order
        they are taken, and what is applied after them."""
        ...

    def decode(self, row: tuple[Any, ...]) -> tuple[int, Any]:
        """The input a row is from and its value."""
        ...


@dataclass(frozen=True)
class OneInput:
    """A grouped stream's rows, each partition's in offset order; `through`: they carry
    record ids (a repartition topic's), whose copies after a restart are dropped."""

    value: Serde
    through: bool = False

    def empty(self) -> tuple[int, set[bytes]]:
        return (-1, set())

    def fresh(
        self, rows: list[tuple[Any, ...]], applied: tuple[int, set[bytes]]
    ) -> tuple[list[tuple[Any, ...]], tuple[int, set[bytes]]]:
        if not self.through:
            return rows, applied
        rows, last_batch, seen = drop_copies(rows, *applied, through_id)
        return rows, (last_batch, seen)

    def decode(self, row: tuple[Any, ...]) -> tuple[int, Any]:
        return 0, self.value.deserialize(row[V])


def session_core(
    windows: SessionWindows,
    grace_ms: int,
    agg: SessionAggregator,
    key: Serde,
    value: Serde | Inputs,
    result: Serde,
    through: bool = False,
    final: bool = False,
) -> StateFn:
    """One task's applyInPandasWithState function; `through` and `final` as in
    :func:`tablecast.pipeline.compile.window.window_core`. `value`: the input's value
    serde, or the :class:`Inputs` of a cogroup (which know their record ids)."""
    inputs = OneInput(value, through) if isinstance(value, Serde) else value
    cols = env.COLUMNS
    width = len(cols)
    gap = windows.gap_ms

    def fn(group: tuple[Any, ...], pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
        task = int(group[0])
        # (stream time, {key bytes: its sessions by start}, what was applied of record-id
        # topics, the largest timestamp taken: the session store's own clock in Kafka
        # Streams, one store for all of a cogroup's inputs)
        empty = (None, {}, inputs.empty(), None)
        stored = pickle.loads(state.get[0]) if state.exists else empty
        stream_time: int | None = stored[0]
        store: dict[bytes, list[Session]] = stored[1]
        applied = stored[2]
        taken: int | None = stored[3]

        def found(s: Session) -> bool:
            return taken is None or s[1] + gap + grace_ms > taken

        written = {(kb, s[0], s[1]) for kb, ss in store.items() for s in ss}
        touched: dict[tuple[bytes, int, int], tuple[Any, ...]] = {}  # session -> last row
        out: list[tuple[Any, ...]] = []
        rows = [row[:-1] for row in ordered_rows(pdfs)]  # without the task column
        rows, applied = inputs.fresh(rows, applied)
        for row in records(rows, out, width):
            kb = bytes(row[K])
            ts = int(row[TS])
            stream_time = ts if stream_time is None else max(stream_time, ts)
            sessions = store.get(kb, [])
            hit = [s for s in sessions if s[0] - gap <= ts <= s[1] + gap and found(s)]
            start = min([ts, *(s[0] for s in hit)])
            end = max([ts, *(s[1] for s in hit)])
            if end + grace_ms < stream_time:
                why = (
                    f"late record: timestamp {ts}, stream time {stream_time}, "
                    f"session gap {gap} ms, grace {grace_ms} ms"
                )
                out.append(bad_row(row, why, width))
                continue
            try:
                k, (side, v) = key.deserialize(kb), inputs.decode(row)
                current = agg.init()
                for s in hit:  # in start order: a reducer need not commute
                    current = agg.merge(k, current, result.deserialize(s[2]))
                current = agg.add(k, v, current, side)
                enc = None if current is None else result.serialize(current)
            except Exception as e:  # the user's function or serde failed: dead-letter it
                out.append(bad_row(row, f"{agg.agg}: {type(e).__name__}: {e}", width))
                continue
            for s in hit:
                touched[(kb, s[0], s[1])] = row
                if final and not s[3] and s[1] + grace_ms <= (taken or 0):
                    # suppress let it through before the record that merges it came
                    out.append(final_row(kb, s, task))
            taken = ts if taken is None else max(taken, ts)
            kept = [s for s in sessions if s not in hit]
            if enc is not None:
                # not yet written as final, also when it closed already (updated at the
                # edge of grace): suppress lets it through again, at the latest below
                kept.append((start, end, enc, False))
                touched[(kb, start, end)] = row
            kept.sort()
            if kept:
                store[kb] = kept
            else:
                store.pop(kb, None)
        live = {(kb, s[0], s[1]): s for kb, ss in store.items() for s in ss}
        if not final:
            for sk, row in touched.items():
                s = live.get(sk)
                enc = None if s is None else s[2]
                if s is not None or sk in written:  # None: merged away, its key leaves
                    wkey = session_key(*sk)
                    out.append((wkey, enc, None, None, None, row[TOPIC], task, row[OFF], 0, sk[2]))
        if stream_time is not None or applied != inputs.empty():
            # suppress's clock: the largest timestamp of the results it was sent
            now = taken if taken is not None else 0
            for kb in list(store):
                kept = []
                for s in store[kb]:
                    if final and not s[3] and s[1] + grace_ms <= now:
                        out.append(final_row(kb, s, task))  # closed: its one final result
                        s = (*s[:3], True)
                    if found(s):  # once not found it never is again: forget it
                        kept.append(s)
                if kept:
                    store[kb] = kept
                else:
                    del store[kb]
            snapshot = (stream_time, store, applied, taken)
            state.update((pickle.dumps(snapshot, protocol=5),))
        if out:
            yield frame(out, cols)

    return fn


def final_row(kb: bytes, s: Session, task: int) -> tuple[Any, ...]:
    """A session's result as emit="final" writes it (its timestamp: the session's end)."""
    return (session_key(kb, s[0], s[1]), s[2], None, None, None, None, task, 0, 0, s[1])
