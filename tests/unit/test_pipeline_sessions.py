"""Session windows: the DSL's checks and the session aggregation's core against the
reference model of Kafka Streams (no Spark)."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import tablecast as tc
from tablecast.contract.window_keys import session_key, split_session_key
from tablecast.pipeline.compile import envelope as env
from tablecast.pipeline.compile.keyed import KeyState
from tablecast.pipeline.compile.session import SessionAggregator, session_core
from tablecast.pipeline.plan import queries as planner
from tablecast.pipeline.run.pipeline import table_info
from tests import reference_model as ref

STR, LONG, JSON = tc.serde.string(), tc.serde.long(), tc.serde.json()


def test_session_gap_and_validation() -> None:
    assert tc.windows.session("5 minutes").gap_ms == 300_000
    assert tc.windows.session(timedelta(seconds=2)).gap_ms == 2_000
    with pytest.raises(ValueError):
        tc.windows.session(timedelta(0))
    app = tc.App("shop")
    grouped = app.stream("events", key=STR, value=JSON).group_by_key()
    sessions = grouped.windowed_by(tc.windows.session("1 minute"), grace="10 seconds")
    with pytest.raises(TypeError, match="merger"):
        sessions.aggregate(lambda: 0, lambda k, v, a: a + 1)
    with pytest.raises(TypeError, match="merger"):
        sessions.aggregate(lambda: 0, lambda k, v, a: a + 1, merger="sum")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="emit"):
        sessions.count(emit="eventually")  # type: ignore[arg-type]
    minute = grouped.windowed_by(tc.windows.tumbling("1 minute"))
    with pytest.raises(TypeError, match="merger"):
        minute.aggregate(lambda: 0, lambda k, v, a: a + 1, merger=lambda k, a, b: a + b)
    sessions.aggregate(
        lambda: 0, lambda k, v, a: a + 1, merger=lambda k, a, b: a + b, emit="final"
    ).materialize("visits")
    (q,) = planner.plan_output(app.id, app.materialized["visits"])
    assert [s.what for s in q.steps] == ["window_aggregate"] and q.windowed
    assert "windowed_by(session(gap 60000 ms), grace 10000 ms)" in app.explain()
    assert "emit='final')" in app.explain()
    info = table_info(app.materialized["visits"], "shop.table.visits", 3)
    assert info.kind == "window" and info.extra == {"session_gap_ms": 60_000}


def test_session_key_carries_start_then_end() -> None:
    k = session_key(b"user", 1_000, 2_500)
    assert k[:4] == b"user" and len(k) == 20
    assert split_session_key(k) == (b"user", 1_000, 2_500)
    # a key's sessions sort by start in a store, as /windows?from=&to= reads them
    assert session_key(b"u", 5, 100) < session_key(b"u", 6, 7)


def run(core: Any, store: dict[Any, Any], rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    import pandas as pd

    cols = [*env.COLUMNS, "_tc_task"]
    out = list(core((0,), iter([pd.DataFrame(rows, columns=cols)]), KeyState(store, 0)))
    return [tuple(r) for df in out for r in df.itertuples(index=False)]


#: timestamps on a 250 ms grid, gaps and graces of a few steps: records often fall at
#: exactly a session's edge, bridge sessions, or near a session the store has dropped
RECS = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c"]),
        st.integers(0, 9),
        st.integers(0, 60).map(lambda t: t * 250),
    ),
    min_size=1,
    max_size=40,
)
STEPS = st.sampled_from([0, 250, 500, 1_000, 2_000, 4_000])


def shift(a: int, b: int) -> int:
    """Not commutative (a merge in the wrong order shows), and bounded (a long)."""
    return (a * 10 + b) % 1_000_003


OPS = {
    # name: (SessionAggregator, reference (init, add, merge)), on long values
    "count": (SessionAggregator("count"), (lambda: 0, lambda k, v, a: a + 1, None)),
    "reduce": (
        # not commutative: merge order matters
        SessionAggregator("reduce", adder=shift),
        (lambda: None, None, None),
    ),
    "aggregate": (
        SessionAggregator(
            "aggregate", lambda: 1, lambda k, v, a: a + v, lambda k, a, b: shift(a, b)
        ),
        (lambda: 1, lambda k, v, a: a + v, lambda k, a, b: shift(a, b)),
    ),
}


def reference(op: str, timed: list[Any], gap: int, grace: int) -> tuple[list[Any], list[Any]]:
    if op == "count":
        return ref.session_count(timed, gap, grace)
    if op == "reduce":
        return ref.session_reduce(timed, gap, grace, shift)
    init, add, merge = OPS[op][1]
    return ref.session_changelog(timed, gap, grace, init, add, merge)  # type: ignore[arg-type]


@settings(max_examples=400, deadline=None)
# a record bridging two sessions, the first of them still in the store only thanks to grace
@example([("a", 1, 0), ("a", 2, 3_000), ("a", 3, 1_500)], [], "reduce", 2_000, 2_000, False)
@example([("a", 1, 0), ("a", 2, 3_000), ("a", 3, 1_500)], [], "aggregate", 2_000, 2_000, True)
@given(
    RECS,
    st.lists(st.integers(0, 40), max_size=3),
    st.sampled_from(sorted(OPS)),
    STEPS.filter(bool),
    STEPS,
    st.booleans(),
)
def test_session_core_matches_the_reference_across_batches(
    recs: list[tuple[str, int, int]],
    cuts: list[int],
    op: str,
    gap: int,
    grace: int,
    final: bool,
) -> None:
    core = session_core(
        tc.windows.session(timedelta(milliseconds=gap)),
        grace,
        OPS[op][0],
        STR,
        LONG,
        LONG,
        final=final,
    )
    store: dict[Any, Any] = {}
    rows = [
        (STR.serialize(k), LONG.serialize(v), None, b"", b"", "t", 0, off, 0, ts, 0)
        for off, (k, v, ts) in enumerate(recs)
    ]
    bounds = [0, *sorted(c for c in cuts if c < len(rows)), len(rows)]
    table: dict[Any, Any] = {}
    written: list[Any] = []
    late = 0
    for lo, hi in pairwise(bounds):  # state carries across micro-batches
        for r in run(core, store, rows[lo:hi]) if hi > lo else []:
            if r[2] is not None:
                assert r[2].startswith("late record")
                late += 1
                continue
            inner, start, end = split_session_key(r[0])
            sk = (STR.deserialize(inner), start, end)
            value = None if r[1] is None else LONG.deserialize(r[1])
            assert r[9] == end  # a session's record time is its end, as in Kafka Streams
            written.append((sk, value))
            ref._put(table, sk, value)
    changelog, want_late = reference(op, [(0, k, v, ts) for k, v, ts in recs], gap, grace)
    assert late == len(want_late)
    if final:
        assert Counter(written) == Counter(ref.suppress_final(changelog, grace))
    else:
        assert table == ref.session_table(changelog)


def test_a_record_between_two_sessions_merges_them() -> None:
    core = session_core(
        tc.windows.session("12 seconds"), 20_000, SessionAggregator("count"), STR, LONG, LONG
    )
    store: dict[Any, Any] = {}

    def feed(stamps: list[int]) -> list[tuple[int, int, int | None]]:
        rows = [
            (b"k", LONG.serialize(1), None, b"", b"", "t", 0, i, 0, t, 0)
            for i, t in enumerate(stamps)
        ]
        got = []
        for r in run(core, store, rows):
            _, s, e = split_session_key(r[0])
            got.append((s, e, None if r[1] is None else LONG.deserialize(r[1])))
        return sorted(got)

    assert feed([1_000, 2_000]) == [(1_000, 2_000, 2)]
    assert feed([25_000]) == [(25_000, 25_000, 1)]
    # 13 s is within 12 s of both: one session, the two old keys deleted
    assert feed([13_000]) == [(1_000, 2_000, None), (1_000, 25_000, 4), (25_000, 25_000, None)]
    # stream time 60 s: [1 s, 25 s] closed at 45 s, so 30 s only falls in a closed session
    assert feed([60_000]) == [(60_000, 60_000, 1)]
    assert run(core, store, [(b"k", LONG.serialize(1), None, b"", b"", "t", 0, 9, 0, 30_000, 0)])[
        0
    ][2].startswith("late record")


def test_emit_final_at_the_edge_of_grace_as_kafka_streams() -> None:
    """Kafka Streams takes a record into a session while end + grace >= stream time, and
    suppress lets a session through once end + grace <= stream time: at equality both."""
    recs = [("k", 0), ("k", 3_000), ("j", 8_000), ("k", 2_000), ("x", 20_000)]
    timed = [(0, k, 1, ts) for k, ts in recs]
    changelog, late = ref.session_count(timed, 10_000, 5_000)
    want = ref.suppress_final(changelog, 5_000)
    assert not late
    # [0, 3 s] written when j's record closed it, and again with k's record at 2 s
    assert want[:2] == [(("k", 0, 3_000), 2), (("k", 0, 3_000), 3)]
    core = session_core(
        tc.windows.session("10 seconds"),
        5_000,
        SessionAggregator("count"),
        STR,
        LONG,
        LONG,
        final=True,
    )
    store: dict[Any, Any] = {}
    got = []
    for i, (k, ts) in enumerate(recs):  # one micro-batch per record, then all in one
        row = (STR.serialize(k), LONG.serialize(1), None, b"", b"", "t", 0, i, 0, ts, 0)
        got += run(core, store, [row])
    store.clear()
    rows = [
        (STR.serialize(k), LONG.serialize(1), None, b"", b"", "t", 0, i, 0, ts, 0)
        for i, (k, ts) in enumerate(recs)
    ]
    for out in (got, run(core, store, rows)):
        decoded = []
        for r in out:
            inner, s, e = split_session_key(r[0])
            decoded.append(((STR.deserialize(inner), s, e), LONG.deserialize(r[1])))
        assert Counter(decoded) == Counter(want)


def test_catalog_and_ingestion_take_session_tables() -> None:
    """A node accepts a session table's entry and checks its keys' 16-byte suffix."""
    from tablecast.cluster.validate import checker
    from tablecast.contract.table_info import BadEntry, TableInfo

    app = tc.App("shop")
    grouped = app.stream("events", key=STR, value=JSON).group_by_key()
    grouped.windowed_by(tc.windows.session("1 minute")).count().materialize("visits")
    info = table_info(app.materialized["visits"], "shop.table.visits", 3)
    parsed = TableInfo.checked("visits", info.to_json())
    assert parsed.extra == {"session_gap_ms": 60_000}
    check = checker(parsed)
    assert check(session_key(b"user", 1, 2), LONG.serialize(3)) is None
    assert check(b"user" + bytes(8), LONG.serialize(3)) is not None  # a start, no end
    broken = info.to_json().replace(b'"session_gap_ms":60000', b'"session_gap_ms":0')
    with pytest.raises(BadEntry, match="session_gap_ms"):
        TableInfo.checked("visits", broken)
