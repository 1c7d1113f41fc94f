"""Stream-stream joins without Spark: the window constructor, what the DSL refuses, how
the planner cuts them, and the per-task join step against the reference model."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tablecast as tc
from tablecast.pipeline.compile.join import LEFT, RIGHT
from tablecast.pipeline.compile.stream_join import StreamStreamJoin, core
from tablecast.pipeline.plan import queries as planner
from tablecast.windows import JoinWindows
from tests import reference_model as ref
from tests.support.group_state import GroupState, run_group

JSON = tc.serde.json()


def plan(app: tc.App, name: str) -> list[planner.Query]:
    return planner.plan_output(app.id, app.materialized[name], list(app.materialized.values()))


def test_join_windows_are_symmetric_unless_both_sides_are_given() -> None:
    assert tc.windows.join("5 seconds") == JoinWindows(5000, 5000, 0)
    assert tc.windows.join(after=timedelta(seconds=2)) == JoinWindows(2000, 2000, 0)
    w = tc.windows.join(before="1 minute", after="10 seconds", grace="30 seconds")
    assert (w.before_ms, w.after_ms, w.grace_ms) == (60_000, 10_000, 30_000)
    assert w.retention_ms == 100_000
    with pytest.raises(ValueError, match="before="):
        tc.windows.join()
    with pytest.raises(ValueError, match="negative"):
        tc.windows.join("1 second", grace=timedelta(seconds=-1))
    with pytest.raises(ValueError, match="not an interval"):
        tc.windows.join("soon")


def test_dsl_refuses_stream_joins_that_cannot_run() -> None:
    app = tc.App("a")
    left, right = app.stream("l"), app.stream("r")
    w = tc.windows.join("1 minute")
    with pytest.raises(ValueError, match="needs window="):
        left.join(right, lambda a, b: a)
    with pytest.raises(TypeError, match=r"tc\.windows\.join"):
        left.join(right, lambda a, b: a, window=tc.windows.tumbling("1 minute"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="how must be"):
        left.join(right, lambda a, b: a, how="full", window=w)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="key= is for table joins"):
        left.join(right, lambda a, b: a, key=lambda k, v: k, window=w)
    with pytest.raises(TypeError, match="same key serde"):
        left.join(app.stream("n", key=tc.serde.long()), lambda a, b: a, window=w)
    with pytest.raises(TypeError, match="Python callable joiner"):
        left.join(right, "joiner", window=w)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="window= is for stream-stream joins"):
        left.join(app.table("t"), lambda a, b: a, window=w)
    with pytest.raises(ValueError, match="how must be 'inner' or 'left'"):
        left.join(app.table("t"), lambda a, b: a, how="outer")
    joined = left.join(right, lambda a, b: [a, b], how="outer", window=w)
    assert isinstance(joined, tc.pipeline.dsl.handles.Stream)  # type: ignore[attr-defined]


def test_a_stream_join_is_one_query_reading_a_source_stream_beside() -> None:
    app = tc.App("a")
    w = tc.windows.join("1 minute", grace="10 seconds")
    app.stream("clicks").join(app.stream("views"), lambda c, v: c, window=w).to_table().materialize(
        "seen"
    )
    (q,) = plan(app, "seen")
    assert [s.what for s in q.steps] == ["stream_join", "op"]
    assert q.stateful and q.per_task and not q.windowed  # output placed by key, not by task
    side = q.steps[0].side
    assert side is not None and (side.topic, side.role, side.kind) == ("views", "source", "stream")
    text = app.explain()
    assert "joins  views [source]" in text and "join(stream[" in text


def test_a_derived_other_stream_is_written_with_record_ids_first() -> None:
    app = tc.App("a")
    w = tc.windows.join("1 minute")
    views = app.stream("views").filter(lambda k, v: v["ok"])
    app.stream("clicks").join(views, lambda c, v: c, window=w).group_by_key().count().materialize(
        "n"
    )
    side, main, count = plan(app, "n")
    assert side.output.topic == "a.changelog.n-join0" and side.output.ids and side.writes_batches
    assert main.steps[0].side == side.output
    # the joined stream reaches its aggregation through a changelog with ids too
    assert main.output.ids and count.reads_batches


# -- the per-task step ---------------------------------------------------------
def _row(side: int, part: int, off: int, ts: int, key: str | None, value: Any) -> tuple[Any, ...]:
    kb = None if key is None else key.encode()
    vb = None if value is None else JSON.serialize(value)
    return (kb, vb, None, kb, vb, "t", part, off, 0, ts, None, None, None, None, kb, side, 0)


def _joiner(a: Any, b: Any) -> list[Any]:
    return [a, b]


EVENTS = st.lists(
    st.tuples(
        st.sampled_from(["left", "right"]),
        st.sampled_from(["a", "b", None]),
        st.one_of(st.none(), st.integers(0, 9)),
        st.integers(-5, 10),  # timestamp steps: out of order too
    ),
    max_size=40,
)


@settings(deadline=None)  # the first example pays for importing pandas
@given(
    events=EVENTS,
    batch=st.integers(1, 40),
    how=st.sampled_from(["inner", "left", "outer"]),
    window=st.tuples(st.integers(0, 6), st.integers(0, 6), st.integers(0, 4)),
)
def test_stream_join_matches_the_reference_in_any_batching(
    events: list[tuple[str, str | None, int | None, int]],
    batch: int,
    how: str,
    window: tuple[int, int, int],
) -> None:
    # one partition per side: the step's order is the events' whatever the timestamps
    rows, ts, offsets = [], 100, {LEFT: 0, RIGHT: 0}
    timed = []
    for side, k, v, step in events:
        ts = max(0, ts + step)
        s = LEFT if side == "left" else RIGHT
        rows.append(_row(s, s, offsets[s], ts, k, v))
        offsets[s] += 1
        timed.append((0, side, k, v, ts))
    join = StreamStreamJoin(JoinWindows(*window), how, _joiner, JSON, JSON, JSON)
    fn, state = core(join, (False, False)), GroupState()
    out: list[tuple[Any, ...]] = []
    for i in range(0, len(rows), batch):
        # a batch whose rows the step must take in the events' order: one side at a time
        chunk = rows[i : i + batch]
        runs: list[list[tuple[Any, ...]]] = []
        for r in chunk:
            if runs and runs[-1][-1][15] == r[15]:
                runs[-1].append(r)
            else:
                runs.append([r])
        for run in runs:
            out.extend(run_group(fn, run, state))
    want, late = ref.stream_stream_join(timed, *window, _joiner, how)
    good = [r for r in out if r[2] is None]
    assert [(r[0].decode(), JSON.deserialize(r[1]), r[9]) for r in good] == want
    bad = [r for r in out if r[2] is not None]
    assert all(r[2].startswith("late record") for r in bad) and len(bad) == len(late)


def test_after_is_how_far_a_right_record_may_follow_a_left_one() -> None:
    # JoinWindows: stream1.ts - before <= stream2.ts <= stream1.ts + after
    join = StreamStreamJoin(JoinWindows(0, 10, 100), "inner", _joiner, JSON, JSON, JSON)
    fn, state = core(join, (False, False)), GroupState()
    assert run_group(fn, [_row(LEFT, 0, 0, 100, "k", 1)], state) == []
    assert run_group(fn, [_row(RIGHT, 1, 0, 95, "k", 2)], state) == []
    (joined,) = run_group(fn, [_row(RIGHT, 1, 1, 110, "k", 3)], state)
    assert JSON.deserialize(joined[1]) == [1, 3]


def test_a_left_record_waits_for_its_window_to_close_before_it_is_written_alone() -> None:
    join = StreamStreamJoin(JoinWindows(10, 10, 5), "left", _joiner, JSON, JSON, JSON)
    fn, state = core(join, (False, False)), GroupState()
    assert run_group(fn, [_row(LEFT, 0, 0, 100, "k", 1)], state) == []
    # stream time 115 = 100 + after + grace: still open, a right record at 108 may come
    assert run_group(fn, [_row(RIGHT, 1, 0, 115, "x", 9)], state) == []
    (joined,) = run_group(fn, [_row(RIGHT, 1, 1, 108, "k", 2)], state)
    assert JSON.deserialize(joined[1]) == [1, 2] and joined[9] == 108
    assert run_group(fn, [_row(LEFT, 0, 1, 120, "k", 3)], state) == []  # 1 met 2: never alone
    (alone,) = run_group(fn, [_row(RIGHT, 1, 2, 200, "x", 0)], state)
    assert JSON.deserialize(alone[1]) == [3, None] and alone[9] == 120
    (late,) = run_group(fn, [_row(LEFT, 0, 2, 150, "k", 4)], state)
    assert late[2].startswith("late record: timestamp 150, stream time 200")


def test_results_of_a_left_and_a_right_row_at_the_same_offset_have_different_ids() -> None:
    # record ids downstream are (partition, offset, seq), and both topics have offset 1
    join = StreamStreamJoin(JoinWindows(10, 10, 0), "inner", _joiner, JSON, JSON, JSON)
    fn, state = core(join, (False, False)), GroupState()
    out = run_group(fn, [_row(RIGHT, 0, 0, 100, "k", 1), _row(LEFT, 0, 0, 101, "k", 2)], state)
    out += run_group(fn, [_row(LEFT, 0, 1, 102, "k", 3)], state)
    out += run_group(fn, [_row(RIGHT, 0, 1, 103, "k", 4)], state)
    assert [JSON.deserialize(r[1]) for r in out] == [[2, 1], [3, 1], [2, 4], [3, 4]]
    ids = [(r[6], r[7], r[8]) for r in out]
    assert len(set(ids)) == len(ids), ids
