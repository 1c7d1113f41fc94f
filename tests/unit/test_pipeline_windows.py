"""Windows and the windowed aggregation's core against the reference model (no Spark)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tablecast as tc
from tablecast.contract.window_keys import split_window_key
from tablecast.pipeline.compile import envelope as env
from tablecast.pipeline.compile.aggregate import Aggregator
from tablecast.pipeline.compile.keyed import KeyState
from tablecast.pipeline.compile.window import window_core
from tablecast.pipeline.plan import queries as planner
from tests import reference_model as ref

STR, LONG, JSON = tc.serde.string(), tc.serde.long(), tc.serde.json()


def test_sizes_are_timedeltas_or_interval_strings() -> None:
    assert tc.windows.tumbling("1 minute").size_ms == 60_000
    assert tc.windows.tumbling(timedelta(seconds=90)).size_ms == 90_000
    w = tc.windows.hopping("1 hour 30 minutes", "interval 10 seconds")
    assert (w.size_ms, w.advance_ms) == (5_400_000, 10_000)
    assert tc.windows.tumbling("500 milliseconds").size_ms == 500
    with pytest.raises(ValueError):
        tc.windows.tumbling("a fortnight")
    with pytest.raises(ValueError):
        tc.windows.hopping("1 minute", "2 minutes")
    with pytest.raises(ValueError):
        tc.windows.tumbling(timedelta(0))


@given(st.integers(0, 10**13), st.integers(1, 10_000), st.integers(1, 10_000))
def test_window_starts_match_the_reference(ts: int, a: int, b: int) -> None:
    size, advance = max(a, b), min(a, b)
    got = tc.windows.hopping(timedelta(milliseconds=size), timedelta(milliseconds=advance))
    assert got.starts(ts) == ref.window_starts(ts, size, advance)


def test_windowed_aggregation_is_one_query_writing_a_window_table() -> None:
    app = tc.App("shop")
    ev = app.stream("events", key=STR, value=JSON)
    ev.group_by(lambda k, v: v["g"]).windowed_by(
        tc.windows.tumbling("1 minute"), grace="10 seconds"
    ).count().materialize("per_minute")
    (q,) = planner.plan_output(app.id, app.materialized["per_minute"])
    assert [s.what for s in q.steps] == ["op", "window_aggregate"]
    assert q.windowed and q.stateful and q.output.topic == "shop.table.per_minute"
    text = app.explain()
    assert "windowed_by(tumbling(60000 ms), grace 10000 ms) count()" in text
    with pytest.raises(TypeError):
        ev.group_by_key().windowed_by("1 minute")  # type: ignore[arg-type]
    assert not hasattr(
        ev.group_by_key().windowed_by(tc.windows.tumbling("1 minute")).count(), "filter"
    )


def run_core(
    core: Any, store: dict[Any, Any], rows: list[tuple[Any, ...]]
) -> list[tuple[Any, ...]]:
    import pandas as pd

    cols = [*env.COLUMNS, "_tc_task"]
    out = list(core((0,), iter([pd.DataFrame(rows, columns=cols)]), KeyState(store, 0)))
    return [tuple(r) for df in out for r in df.itertuples(index=False)]


RECS = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(-2, 5), st.integers(0, 20_000)),
    min_size=1,
    max_size=30,
)


@settings(max_examples=50, deadline=None)
@given(RECS, st.integers(1, 4))
def test_window_core_matches_the_reference_across_batches(
    recs: list[tuple[str, int, int]], cut: int
) -> None:
    size, advance, grace = 3_000, 1_000, 2_000
    plus = lambda k, v, a: a + v  # noqa: E731
    agg = Aggregator("aggregate", lambda: 0, plus)
    w = tc.windows.hopping(timedelta(milliseconds=size), timedelta(milliseconds=advance))
    core = window_core(w, grace, agg, STR, LONG, LONG)
    store: dict[Any, Any] = {}
    table: dict[tuple[str, int], int] = {}
    late = 0
    rows = [
        (STR.serialize(k), LONG.serialize(v), None, b"", b"", "t", 0, off, 0, ts, 0)
        for off, (k, v, ts) in enumerate(recs)
    ]
    for batch in (rows[:cut], rows[cut:]):  # state carries over between micro-batches
        for r in run_core(core, store, batch) if batch else []:
            if r[2] is not None:
                assert r[2].startswith("late record")
                late += 1
                continue
            inner, start = split_window_key(r[0])
            assert r[6] == 0  # written to its key's task partition
            if r[1] is None:
                table.pop((STR.deserialize(inner), start), None)
            else:
                table[(STR.deserialize(inner), start)] = LONG.deserialize(r[1])
    want, want_late = ref.window_aggregate(
        [(0, k, v, ts) for k, v, ts in recs], size, advance, grace, lambda: 0, plus
    )
    assert late == len(want_late)
    # windows that closed may have been forgotten by the state, never by the table
    assert table == want


def test_copies_from_a_repartition_topic_are_counted_once() -> None:
    """After repartition(), a restarted upstream query writes some records again (same
    batch and record ids): the windowed aggregation drops them."""
    import pandas as pd

    from tablecast.pipeline.compile.keyed import KeyState

    w = tc.windows.tumbling(timedelta(minutes=1))
    core = window_core(w, 0, Aggregator("count"), STR, LONG, LONG, through=True)
    store: dict[Any, Any] = {}

    def rows(batch: int, offsets: range) -> list[tuple[Any, ...]]:
        one = LONG.serialize(1)
        # envelope, then (old, batch, rid, src) and the task
        return [
            (b"k", one, None, b"", b"", "t", 0, o, 0, 1000 + o, None, batch, b"%d" % o, None, 0)
            for o in offsets
        ]

    def counts(batch_rows: list[tuple[Any, ...]]) -> list[int]:
        cols = [*env.COLUMNS, *env.REPARTITION, "_tc_task"]
        frames = core((0,), iter([pd.DataFrame(batch_rows, columns=cols)]), KeyState(store, 0))
        return [LONG.deserialize(r[1]) for df in frames for r in df.itertuples(index=False)]

    assert counts(rows(1, range(3))) == [3]
    assert counts(rows(1, range(3)) + rows(2, range(3, 5))) == [5]  # batch 1 again: dropped
    assert counts(rows(1, range(2))) == []


def test_emit_final_writes_each_window_once_when_it_closes() -> None:
    import pandas as pd

    from tablecast.pipeline.compile.keyed import KeyState

    w = tc.windows.tumbling(timedelta(seconds=10))
    core = window_core(w, 5_000, Aggregator("count"), STR, LONG, LONG, final=True)
    store: dict[Any, Any] = {}

    def run(stamps: list[int]) -> list[tuple[int, int]]:
        rows = [
            (b"k", LONG.serialize(1), None, b"", b"", "t", 0, i, 0, ts, 0)
            for i, ts in enumerate(stamps)
        ]
        cols = [*env.COLUMNS, "_tc_task"]
        frames = core((0,), iter([pd.DataFrame(rows, columns=cols)]), KeyState(store, 0))
        out = [r for df in frames for r in df.itertuples(index=False)]
        return [(split_window_key(r[0])[1], LONG.deserialize(r[1])) for r in out]

    assert run([1_000, 2_000, 12_000]) == []  # [0, 10 s) closes at 15 s of stream time
    assert run([14_000, 15_000]) == [(0, 2)]
    assert run([29_000, 31_000]) == [(10_000, 3)]  # [20 s, 30 s) is still open
