"""Cogrouped aggregations without Spark: what the DSL refuses, how the planner cuts them,
and the per-key step against the reference model of Kafka Streams' CogroupedKStream."""

from __future__ import annotations

import os
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tablecast as tc
from tablecast.pipeline.compile import envelope as env
from tablecast.pipeline.compile.cogroup import UNION, Cogrouped, CogroupInputs, cogroup_core
from tablecast.pipeline.compile.keyed import bucketed
from tablecast.pipeline.plan import queries as planner
from tests import reference_model as ref
from tests.support.group_state import GroupState, run_group

JSON = tc.serde.json()
EXAMPLES = int(os.environ.get("TABLECAST_EXAMPLES", "100"))


def plan(app: tc.App, name: str) -> list[planner.Query]:
    return planner.plan_output(app.id, app.materialized[name], list(app.materialized.values()))


def _add(k: Any, v: Any, agg: Any) -> Any:
    return [*agg, v]


# -- the DSL -------------------------------------------------------------------
def test_dsl_refuses_cogroups_kafka_streams_refuses() -> None:
    app = tc.App("a")
    a, b = app.stream("a").group_by_key(), app.stream("b").group_by_key()
    with pytest.raises(TypeError, match="at least one"):
        app.cogroup()
    with pytest.raises(TypeError, match="grouped table cannot be cogrouped"):
        app.cogroup((a, _add), (app.table("t").group_by(lambda k, v: (k, v)), _add))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not windowed ones"):
        app.cogroup((a.windowed_by(tc.windows.tumbling("1 minute")), _add))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expected a grouped stream"):
        app.cogroup((app.stream("c"), _add))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="is a pair"):
        app.cogroup(a)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="same key serde"):
        app.cogroup((a, _add), (app.stream("n", key=tc.serde.long()).group_by_key(), _add))
    with pytest.raises(TypeError, match="Python callables"):
        app.cogroup((a, "f"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cogrouped once"):
        app.cogroup((a, _add), (a, _add))
    with pytest.raises(ValueError, match="from this App"):
        app.cogroup((a, _add), (tc.App("other").stream("b").group_by_key(), _add))
    cog = app.cogroup((a, _add)).cogroup(b, _add)
    with pytest.raises(TypeError, match="Python callables"):
        cog.aggregate(None)  # type: ignore[arg-type]
    sessions = cog.windowed_by(tc.windows.session("1 minute"))
    with pytest.raises(TypeError, match="merger"):
        sessions.aggregate(list)
    with pytest.raises(TypeError, match="merger= is for session windows"):
        cog.windowed_by(tc.windows.tumbling("1 minute")).aggregate(list, merger=_merge)
    with pytest.raises(TypeError, match="tumbling"):
        cog.windowed_by("1 minute")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="negative"):
        cog.windowed_by(tc.windows.tumbling("1 minute"), grace=timedelta(seconds=-1))
    with pytest.raises(ValueError, match="emit is"):
        cog.windowed_by(tc.windows.tumbling("1 minute")).aggregate(list, emit="never")  # type: ignore[arg-type]
    table = cog.aggregate(list)
    assert isinstance(table, tc.pipeline.dsl.handles.Table)  # type: ignore[attr-defined]
    assert table.node.value_serde().spec() == JSON.spec()  # JSON unless value=
    # values may differ: each input decodes its own
    longs = app.stream("l", value=tc.serde.long()).group_by_key()
    app.cogroup((a, _add), (longs, _add)).aggregate(list, value=tc.serde.string())


def test_a_cogroup_is_one_query_reading_the_other_inputs_beside() -> None:
    app = tc.App("a")
    a = app.stream("a").group_by_key()
    b = app.stream("b").group_by(lambda k, v: v["user"])  # derived: re-keyed
    c = app.stream("c").group_by_key()
    app.cogroup((a, _add), (b, _add), (c, _add)).aggregate(list).materialize("all")
    side, main = plan(app, "all")
    assert [s.what for s in side.steps] == ["op"] and side.input.topic == "b"
    assert side.output.topic == "a.changelog.all-cogroup0" and side.output.ids
    assert side.writes_batches  # the ids that let the cogroup drop copies of a restart
    (step,) = main.steps
    assert step.what == "cogroup" and step.stateful and not main.per_task
    assert [(r.topic, r.role, r.ids) for r in step.sides] == [
        ("a.changelog.all-cogroup0", "changelog", True),
        ("c", "source", False),
    ]
    assert main.input.topic == "a" and main.output.topic == "a.table.all"
    text = app.explain()
    assert "reads  a.changelog.all-cogroup0 [changelog] beside" in text
    assert "reads  c [source] beside" in text


def test_the_first_input_is_re_keyed_in_the_cogroup_query() -> None:
    app = tc.App("a")
    a = app.stream("a").group_by(lambda k, v: v["g"], key=tc.serde.string())
    b = app.stream("b").group_by_key()
    app.cogroup((a, _add), (b, _add)).aggregate(list).materialize("t")
    (main,) = plan(app, "t")
    assert [s.what for s in main.steps] == ["op", "cogroup"]
    assert main.steps[0].node.describe().startswith("select_key(")


# -- the per-key step ------------------------------------------------------------
def _row(e: ref.CogroupEvent, off: int, rid: bytes | None = None, batch: int | None = None) -> Any:
    side, part, key, value, ts = e
    kb = None if key is None else key.encode()
    vb = None if value is None else JSON.serialize(value)
    return (kb, vb, None, kb, vb, f"t{side}", part, off, 0, ts, None, batch, rid, None, side, 0)


def _a(k: Any, v: Any, agg: Any) -> Any:
    return [*agg, ["a", v]]


def _b(k: Any, v: Any, agg: Any) -> Any:
    return None if v == 0 else [*agg, ["b", v]]  # a None aggregate deletes the key


def _c(k: Any, v: Any, agg: Any) -> Any:
    if v == 7:
        raise ValueError("seven")
    return [*agg[-3:], ["c", v]]


AGGREGATORS = [_a, _b, _c]


def _init() -> list[Any]:
    return []


def _table(out: list[tuple[Any, ...]]) -> dict[str, tuple[Any, int]]:
    table: dict[str, tuple[Any, int]] = {}
    for r in out:
        if r[2] is not None:
            continue
        if r[1] is None:
            table.pop(r[0].decode(), None)
        else:
            table[r[0].decode()] = (JSON.deserialize(r[1]), r[9])
    return table


def _batches(
    draws: list[list[tuple[int, int, str | None, int | None, int]]],
) -> list[list[ref.CogroupEvent]]:
    """Events with each input partition's clock moved by the drawn steps."""
    clocks: dict[tuple[int, int], int] = {}
    out = []
    for batch in draws:
        events = []
        for side, part, k, v, step in batch:
            ts = clocks[(side, part)] = max(0, clocks.get((side, part), 100) + step)
            events.append((side, part, k, v, ts))
        out.append(events)
    return out


def _run_all(batches: list[list[ref.CogroupEvent]]) -> list[tuple[Any, ...]]:
    fn = bucketed(cogroup_core(Cogrouped(tuple(AGGREGATORS), _init), *_serdes()), list(env.COLUMNS))
    state, offsets, out = GroupState(), dict[tuple[int, int], int](), []
    for batch in batches:
        rows = []
        for e in batch:
            off = offsets[(e[0], e[1])] = offsets.get((e[0], e[1]), -1) + 1
            rows.append(_row(e, off))
        out.extend(run_group(fn, rows, state))
    return out


def _serdes() -> tuple[Any, ...]:
    return JSON_KEY, (JSON, JSON, JSON), JSON, (False, False, False)


JSON_KEY = tc.serde.string()


def _bad(e: ref.CogroupEvent) -> bool:
    return e[0] == 2 and e[2] is not None and e[3] == 7


def _expected(batches: list[list[ref.CogroupEvent]], per_key: bool) -> Any:
    taken: list[ref.CogroupEvent] = []
    for batch in batches:
        if per_key:  # tablecast's promise: the task order of each key's own records
            keys = {e[2] for e in batch}
            for k in keys:
                taken.extend(ref.task_order([e for e in batch if e[2] == k]))
        else:
            taken.extend(ref.task_order(batch))
    # a record whose aggregator raised is dead-lettered: as if it had not come
    good = [e for e in taken if not _bad(e)]
    return ref.cogroup_aggregate(good, _init, AGGREGATORS), [e for e in taken if _bad(e)]


def events(steps: st.SearchStrategy[int]) -> st.SearchStrategy[Any]:
    return st.lists(
        st.lists(
            st.tuples(
                st.integers(0, 2),
                st.integers(0, 1),
                st.sampled_from(["a", "b", None]),
                st.one_of(st.none(), st.integers(0, 9)),
                steps,
            ),
            max_size=15,
        ),
        max_size=6,
    )


@settings(deadline=None, max_examples=EXAMPLES)
@given(draws=events(st.integers(0, 6)))
def test_cogroup_is_a_kafka_streams_task_when_partitions_are_in_time_order(
    draws: list[list[tuple[int, int, str | None, int | None, int]]],
) -> None:
    # each input partition's timestamps never go back: a task's order over all its
    # records, restricted to one key, is that key's records in timestamp order
    batches = _batches(draws)
    out = _run_all(batches)
    want, bad = _expected(batches, per_key=False)
    assert _table(out) == want
    dead = [r for r in out if r[2] is not None]
    assert len(dead) == len(bad) and all("cogroup: ValueError: seven" in r[2] for r in dead)


@settings(deadline=None, max_examples=EXAMPLES)
@given(draws=events(st.integers(-5, 6)))
def test_cogroup_takes_each_keys_records_in_task_order_in_any_timestamps(
    draws: list[list[tuple[int, int, str | None, int | None, int]]],
) -> None:
    batches = _batches(draws)
    out = _run_all(batches)
    want, bad = _expected(batches, per_key=True)
    assert _table(out) == want
    assert len([r for r in out if r[2] is not None]) == len(bad)


def test_order_is_per_key_where_a_partition_goes_back_in_time() -> None:
    # input 0 partition 0: x at 30, then k at 5; input 1: k at 10. A Kafka Streams task
    # waits on the head x (30) and takes input 1's k first; tablecast orders each key's
    # own records, and takes k at 5 first (the user guide says so)
    batch = [(0, 0, "x", 1, 30), (0, 0, "k", 2, 5), (1, 0, "k", 3, 10)]
    out = _run_all([batch])
    assert _table(out)["k"] == ([["a", 2], ["b", 3]], 10)
    assert [e[3] for e in ref.task_order(batch)] == [3, 1, 2]  # the whole task's order


def test_ties_go_to_the_input_listed_first_then_the_lower_partition() -> None:
    batch = [(2, 1, "k", 1, 50), (1, 0, "k", 2, 50), (0, 1, "k", 3, 50), (0, 0, "k", 4, 50)]
    (row,) = _run_all([batch])
    assert JSON.deserialize(row[1]) == [["a", 4], ["a", 3], ["b", 2], ["c", 1]]


def test_timestamps_are_kafka_streams_and_a_none_aggregate_starts_over() -> None:
    fn = bucketed(cogroup_core(Cogrouped(tuple(AGGREGATORS), _init), *_serdes()), list(env.COLUMNS))
    state = GroupState()
    (r,) = run_group(fn, [_row((0, 0, "k", 1, 200), 0), _row((1, 0, "k", 2, 100), 0)], state)
    assert JSON.deserialize(r[1]) == [["b", 2], ["a", 1]] and r[9] == 200  # the largest
    (gone,) = run_group(fn, [_row((1, 0, "k", 0, 150), 1)], state)
    assert gone[1] is None and gone[9] == 150  # the tombstone at the deleting record's time
    (again,) = run_group(fn, [_row((0, 0, "k", 5, 120), 1)], state)
    # starts over from initializer(), with the record's own timestamp
    assert JSON.deserialize(again[1]) == [["a", 5]] and again[9] == 120
    assert (
        run_group(fn, [_row((0, 0, None, 5, 120), 2), _row((1, 0, "k", None, 300), 2)], state) == []
    )


def test_copies_a_restarted_writer_wrote_again_are_applied_once_per_input() -> None:
    core = cogroup_core(
        Cogrouped(tuple(AGGREGATORS), _init),
        JSON_KEY,
        (JSON, JSON, JSON),
        JSON,
        (False, True, True),
    )
    fn, state = bucketed(core, list(env.COLUMNS)), GroupState()
    first = [_row((1, 0, "k", 1, 10), 0, b"r1", 3), _row((2, 0, "k", 2, 11), 0, b"r1", 3)]
    run_group(fn, first, state)
    # batch 3 written again (same ids: both inputs' copies dropped), then batch 4
    again = [_row((1, 0, "k", 1, 10), 1, b"r1", 3), _row((2, 0, "k", 2, 11), 1, b"r1", 3)]
    (r,) = run_group(fn, [*again, _row((1, 0, "k", 3, 12), 2, b"r2", 4)], state)
    assert JSON.deserialize(r[1]) == [["b", 1], ["c", 2], ["b", 3]]
    assert UNION[: len(env.COLUMNS)] == env.COLUMNS


# -- windowed ------------------------------------------------------------------
def test_a_windowed_cogroup_is_a_window_table_per_task() -> None:
    app = tc.App("a")
    a = app.stream("a").group_by_key()
    b = app.stream("b").filter(lambda k, v: True).group_by_key()
    w = app.cogroup((a, _add), (b, _add)).windowed_by(tc.windows.hopping("10 s", "5 s"), "1 s")
    w.aggregate(list, emit="final").materialize("win")
    _, main = plan(app, "win")
    (step,) = main.steps
    assert step.what == "cogroup" and step.windowed and main.windowed and main.per_task
    assert "by key's partition" in step.describe() and "emit='final'" in step.describe()
    from tablecast.pipeline.plan import nodes

    window = nodes.window_of(app.materialized["win"])
    assert window is not None and window.windows.size_ms == 10_000


def _c_whole(k: Any, v: Any, agg: Any) -> Any:
    return [*agg[-3:], ["c", v]]


#: the windowed tests' aggregators: none raises (a raising one: its own test below)
WINDOWED = [_a, _b, _c_whole]


def _run_windowed(
    batches: list[list[ref.CogroupEvent]],
    size: int,
    advance: int,
    grace: int,
    final: bool = False,
    aggregators: list[Any] = WINDOWED,
) -> list[tuple[Any, ...]]:
    from tablecast.pipeline.compile.cogroup import window_core
    from tablecast.windows import Windows

    fn = window_core(
        Cogrouped(tuple(aggregators), _init),
        Windows(size, advance),
        grace,
        JSON_KEY,
        CogroupInputs((JSON, JSON, JSON), (False, False, False)),
        JSON,
        final,
    )
    state, offsets, out = GroupState(), dict[tuple[int, int], int](), []
    for batch in batches:
        rows = []
        for e in batch:
            off = offsets[(e[0], e[1])] = offsets.get((e[0], e[1]), -1) + 1
            rows.append(_row(e, off))
        out.extend(run_group(fn, rows, state))
    return out


def _window_table(out: list[tuple[Any, ...]]) -> dict[tuple[str, int], tuple[Any, int]]:
    from tablecast.contract.window_keys import split_window_key

    table: dict[tuple[str, int], tuple[Any, int]] = {}
    for r in out:
        if r[2] is not None:
            continue
        inner, start = split_window_key(r[0])
        if r[1] is None:
            table.pop((inner.decode(), start), None)
        else:
            table[(inner.decode(), start)] = (JSON.deserialize(r[1]), r[9])
    return table


WINDOWS = st.sampled_from([(10, 10), (10, 5), (6, 3), (4, 4)])


@settings(deadline=None, max_examples=EXAMPLES)
@given(draws=events(st.integers(-5, 8)), window=WINDOWS, grace=st.integers(0, 6))
def test_windowed_cogroup_matches_the_reference_in_any_batching(
    draws: list[list[tuple[int, int, str | None, int | None, int]]],
    window: tuple[int, int],
    grace: int,
) -> None:
    # one task: its rows of a batch are taken in the task's order over all its keys
    batches = _batches(draws)
    out = _run_windowed(batches, *window, grace)
    taken = [(0, e[0], e[2], e[3], e[4]) for b in batches for e in ref.task_order(b)]
    want, late = ref.cogroup_window_aggregate(taken, *window, grace, _init, WINDOWED)
    assert _window_table(out) == want
    dead = [r for r in out if r[2] is not None]
    assert all(r[2].startswith("late record") for r in dead) and len(dead) == len(late)


@settings(deadline=None, max_examples=EXAMPLES)
@given(draws=events(st.integers(-5, 8)), window=WINDOWS, grace=st.integers(0, 6))
def test_final_windows_are_the_last_changes_of_closed_windows(
    draws: list[list[tuple[int, int, str | None, int | None, int]]],
    window: tuple[int, int],
    grace: int,
) -> None:
    batches = _batches(draws)
    changes = _run_windowed(batches, *window, grace)
    final = _run_windowed(batches, *window, grace, final=True)
    now = max(
        (e[4] for b in batches for e in b if e[2] is not None and e[3] is not None), default=0
    )
    closed = {wk: v for wk, v in _window_table(changes).items() if wk[1] + window[0] + grace <= now}
    assert _window_table(final) == closed
    written = [r[0] for r in final if r[2] is None]
    assert len(written) == len(set(written))  # once per window


def test_a_raising_aggregator_dead_letters_its_record_and_leaves_the_windows() -> None:
    first = [(0, 0, "k", 1, 10), (2, 0, "k", 7, 30)]
    out = _run_windowed([first, [(0, 0, "k", 2, 12)]], 10, 10, 0, aggregators=AGGREGATORS)
    seven, late = [r for r in out if r[2] is not None]
    assert "cogroup: ValueError: seven" in seven[2]
    # the failed record still moved stream time to 30: 12's window [10, 20) is closed
    assert late[2].startswith("late record: timestamp 12, stream time 30")
    assert _window_table(out) == {("k", 10): ([["a", 1]], 10)}


# -- session windows ---------------------------------------------------------------
def _merge(k: Any, a: Any, b: Any) -> Any:
    return [*a, "|", *b][-6:]  # not commutative: a merge in the wrong order shows


def _run_sessions(
    batches: list[list[ref.CogroupEvent]],
    gap: int,
    grace: int,
    final: bool = False,
    aggregators: list[Any] = WINDOWED,
    through: tuple[bool, ...] = (False, False, False),
    rows_of: Any = None,
) -> list[tuple[Any, ...]]:
    from tablecast.pipeline.compile.session import SessionAggregator, session_core
    from tablecast.windows import SessionWindows

    fn = session_core(
        SessionWindows(gap),
        grace,
        SessionAggregator("aggregate", _init, None, _merge, tuple(aggregators)),
        JSON_KEY,
        CogroupInputs((JSON, JSON, JSON), through),
        JSON,
        final=final,
    )
    state, offsets, out = GroupState(), dict[tuple[int, int], int](), []
    for i, batch in enumerate(batches):
        rows = []
        for e in batch:
            off = offsets[(e[0], e[1])] = offsets.get((e[0], e[1]), -1) + 1
            rows.append(_row(e, off) if rows_of is None else rows_of(e, off, i))
        out.extend(run_group(fn, rows, state))
    return out


def _session_rows(out: list[tuple[Any, ...]]) -> list[tuple[tuple[str, int, int], Any]]:
    from tablecast.contract.window_keys import split_session_key

    written = []
    for r in out:
        if r[2] is None:
            inner, start, end = split_session_key(r[0])
            assert r[9] == end  # a session's record time is its end, as in Kafka Streams
            value = None if r[1] is None else JSON.deserialize(r[1])
            written.append(((inner.decode(), start, end), value))
    return written


def _taken(batches: list[list[ref.CogroupEvent]]) -> list[tuple[Any, int, Any, Any, int]]:
    return [(0, e[0], e[2], e[3], e[4]) for b in batches for e in ref.task_order(b)]


@settings(deadline=None, max_examples=EXAMPLES)
@given(
    draws=events(st.integers(-5, 8)),
    gap=st.integers(1, 6),
    grace=st.integers(0, 6),
    final=st.booleans(),
)
def test_session_cogroup_matches_the_reference_in_any_batching(
    draws: list[list[tuple[int, int, str | None, int | None, int]]],
    gap: int,
    grace: int,
    final: bool,
) -> None:
    # one task, one session store for all inputs: each input's aggregator, one merger
    batches = _batches(draws)
    out = _run_sessions(batches, gap, grace, final)
    changelog, late = ref.cogroup_session_changelog(
        _taken(batches), gap, grace, _init, WINDOWED, _merge
    )
    written = _session_rows(out)
    if final:
        # aggregates are lists: count them by their repr
        want = ref.suppress_final(changelog, grace)
        assert Counter(map(repr, written)) == Counter(map(repr, want))
    else:
        table: dict[Any, Any] = {}
        for sk, value in written:
            ref._put(table, sk, value)
        assert table == ref.session_table(changelog)
    dead = [r for r in out if r[2] is not None]
    assert all(r[2].startswith("late record") for r in dead) and len(dead) == len(late)


def test_a_record_of_another_input_bridges_two_sessions() -> None:
    # grace 20: the session [10, 10] is still in the store at stream time 30
    out = _run_sessions([[(0, 0, "k", 1, 10), (1, 0, "k", 2, 30)], [(2, 0, "k", 3, 20)]], 10, 20)
    assert _session_rows(out) == [
        (("k", 10, 10), [["a", 1]]),
        (("k", 30, 30), [["b", 2]]),
        (("k", 10, 10), None),  # merged away: tombstones
        (("k", 30, 30), None),
        (("k", 10, 30), [["a", 1], "|", ["b", 2], ["c", 3]]),
    ]


def test_a_none_aggregate_at_the_same_instant_removes_the_session() -> None:
    # b's aggregator answers None for 0: a record at 120 that finds the session [120, 120]
    # merges nothing new, and its None removes that session (Kafka Streams' store.put of a
    # null), so 114 finds no session within its gap and is late at stream time 120
    batches = [[(0, 0, "k", 1, 120)], [(1, 1, "k", 0, 120)], [(1, 0, "k", 5, 114)]]
    out = _run_sessions(batches, 6, 0)
    assert _session_rows(out) == [(("k", 120, 120), [["a", 1]]), (("k", 120, 120), None)]
    (dead,) = [r[2] for r in out if r[2] is not None]
    assert dead.startswith("late record: timestamp 114, stream time 120")
    changelog, late = ref.cogroup_session_changelog(_taken(batches), 6, 0, _init, WINDOWED, _merge)
    assert ref.session_table(changelog) == {} and len(late) == 1


def test_session_cogroup_copies_a_restarted_writer_wrote_again_are_applied_once() -> None:
    def rows_of(e: ref.CogroupEvent, off: int, i: int) -> Any:
        # input 1 is derived: its rows carry record ids; batch 1 writes batch 0's again
        return _row(e, off, b"r%d" % e[3], 7 if i < 2 else 8) if e[0] == 1 else _row(e, off)

    batches = [[(1, 0, "k", 1, 10)], [(1, 0, "k", 1, 10), (0, 0, "k", 2, 12)], [(1, 0, "k", 4, 13)]]
    out = _run_sessions(batches, 5, 0, through=(False, True, False), rows_of=rows_of)
    # each "|" is a merge with the session before; the copy would be a second ["b", 1]
    assert dict(_session_rows(out))[("k", 10, 13)] == ["|", "|", ["b", 1], ["a", 2], ["b", 4]]
