"""The pipeline's pure-Python parts: planner cuts, explain, fused Python operators,
private wire formats and aggregation semantics (no Spark needed)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tablecast as tc
from tablecast.pipeline.compile.aggregate import Aggregator
from tablecast.pipeline.compile.pyworker import FANOUT, Run, Step, record_fn
from tablecast.pipeline.plan import queries as planner
from tablecast.pipeline.plan.wire import PairSerde, pack_pair, record_id, split_ids, unpack_pair
from tests import reference_model as ref

STR, LONG, JSON = tc.serde.string(), tc.serde.long(), tc.serde.json()


def plan(app: tc.App, name: str) -> list[planner.Query]:
    return planner.plan_output(app.id, app.materialized[name], list(app.materialized.values()))


def test_table_group_by_is_two_queries_through_a_repartition_topic() -> None:
    app = tc.App("shop")
    rows = app.table("rows")
    rows.filter(lambda k, v: True).group_by(lambda k, v: (v["g"], 1), value=LONG).count().filter(
        lambda k, c: c > 1
    ).materialize("counts")
    first, second = plan(app, "counts")
    assert first.input.topic == "rows" and first.input.external
    assert [s.what for s in first.steps] == ["op", "select_group", "retract"]
    assert first.output.topic == "shop.repartition.counts-0" and first.writes_batches
    assert second.input == first.output
    assert [s.what for s in second.steps] == ["table_aggregate", "op"]
    assert second.output.topic == "shop.table.counts" and second.output.value == LONG
    assert (first.name, second.name) == ("shop.counts.0", "shop.counts")


def test_stream_aggregation_is_one_query_and_a_second_aggregation_cuts() -> None:
    app = tc.App("a")
    counts = app.stream("ev").group_by(lambda k, v: v["g"]).count()
    counts.materialize("per_group")
    counts.group_by(lambda g, c: (str(c), g), value=STR).count().materialize("histogram")
    (only,) = plan(app, "per_group")
    assert [s.what for s in only.steps] == ["op", "stream_aggregate"] and only.stateful
    # the histogram starts from the materialized per_group table: nothing is computed twice
    queries = plan(app, "histogram")
    assert queries[0].input.topic == "a.table.per_group" and queries[0].input.role == "table"
    assert [q.output.role for q in queries] == ["repartition", "table"]


def test_second_stateful_step_goes_through_a_changelog_topic() -> None:
    app = tc.App("a")
    counts = app.stream("ev").group_by_key().count()
    counts.group_by(lambda k, c: (str(c), k), value=STR).count().materialize("h")
    queries = plan(app, "h")
    assert [q.output.role for q in queries] == ["changelog", "repartition", "table"]
    # the group_by's Python selector runs after the count in its query: Python keeps it
    assert [s.what for s in queries[0].steps] == ["stream_aggregate", "select_group"]


def test_explain_names_operators_queries_topics_and_trigger() -> None:
    app = tc.App("shop", trigger="1 second")
    app.table("rows").group_by(lambda k, v: (k, v)).count().materialize("c")
    app.stream("ev").map_values(lambda k, v: v).to("out")
    text = app.explain()
    for part in (
        "trigger '1 second'",
        "trigger: micro-batch 1 s",
        "query 'shop.c.0'",
        "reads  rows [source]",
        "writes shop.repartition.c-0 [repartition]",
        "applyInPandasWithState",
        "writes shop.table.c [table]",
        "to 'out'",
        "bad records -> shop.dlq",
    ):
        assert part in text, part


def test_dsl_rejects_what_cannot_run() -> None:
    app = tc.App("a")
    s = app.stream("ev")
    with pytest.raises(TypeError):
        s.filter(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        s.group_by_key().reduce("sum")  # type: ignore[arg-type]
    s.to_table().materialize("t")
    with pytest.raises(ValueError):
        s.to_table().materialize("t")


def run_of(ops: list[tuple[str, Any, str]], key_out: Any = STR, value_out: Any = JSON) -> Run:
    steps = tuple(Step(op, record_fn(op, fn, kind)) for op, fn, kind in ops)
    return Run(steps, STR, JSON, key_out, value_out)


def test_fused_python_operators_number_sub_records_and_keep_bad_rows() -> None:
    run = run_of(
        [
            ("filter", lambda k, v: v["x"] > 0, "stream"),
            ("flat_map", lambda k, v: [(k + "a", v["x"]), (k + "b", 1 // (v["x"] - 2))], "stream"),
        ],
        value_out=LONG,
    )
    keys = [b"k1", b"k2", b"k3", b"k4", b"k5"]
    values = [b'{"x": 1}', b'{"x": -1}', b'{"x": 2}', b"{bad", b'{"x": 3}']
    idx, seq, k, v, err = run.apply(keys, values, [None, None, None, None, "earlier"], [0] * 5)
    assert idx == [0, 0, 2, 3, 4]  # k2 filtered out; k3, k4 and k5 each one bad row
    assert seq == [0, FANOUT * 0 + 1, 0, 0, 0]
    assert k[:2] == [b"k1a", b"k1b"] and v[0] == LONG.serialize(1)
    assert err[2] is not None and err[2].startswith("flat_map: ZeroDivisionError")
    assert err[3] is not None and err[3].startswith("decode: ") and v[3] == b"{bad"
    assert err[4] == "earlier" and k[4] == b"k5" and v[4] == b'{"x": 3}'


def test_table_operators_pass_deletes_and_turn_non_matches_into_deletes() -> None:
    run = run_of(
        [
            ("filter", lambda k, v: v["x"] % 2 == 0, "table"),
            ("map_values", lambda k, v: {"y": v["x"] * 10}, "table"),
        ]
    )
    _, _, k, v, err = run.apply(
        [b"a", b"b", b"c"], [b'{"x": 2}', b'{"x": 3}', None], [None] * 3, [0] * 3
    )
    assert k == [b"a", b"b", b"c"] and err == [None] * 3
    assert v == [b'{"y":20}', None, None]


def test_group_selection_packs_key_and_value() -> None:
    pair = PairSerde(STR, LONG)
    run = Run(
        (Step("select_group", record_fn("select_group", lambda k, v: (v["g"], v["n"]), "table")),),
        STR,
        JSON,
        STR,
        pair,
    )
    _, _, _, v, _ = run.apply([b"r", b"s"], [b'{"g": "a", "n": 5}', None], [None, None], [0, 0])
    assert v[1] is None and pair.deserialize(v[0]) == ("a", 5)
    assert unpack_pair(v[0]) == (b"a", LONG.serialize(5))


@given(st.binary(), st.binary())
def test_pairs_round_trip(k: bytes, v: bytes) -> None:
    assert unpack_pair(pack_pair(k, v)) == (k, v)


def test_record_ids_are_fixed_size_and_split_back() -> None:
    ids = {
        record_id(p, o, s, slot)
        for p in (0, 2)
        for o in (0, 2**40)
        for s in (0, 5)
        for slot in (0, 1)
    }
    assert split_ids(b"".join(sorted(ids))) == ids


CHANGES = st.lists(
    st.tuples(
        st.sampled_from(["r1", "r2", "r3"]),
        st.one_of(st.none(), st.tuples(st.sampled_from("ab"), st.integers(0, 5))),
    ),
    max_size=30,
)


@settings(max_examples=200)
@given(CHANGES)
def test_table_aggregation_semantics_match_the_reference(changes: list[tuple[str, Any]]) -> None:
    """Retract/add per change, as the two stateful steps do, against the reference model."""

    def add(k: str, v: int, a: int | None) -> int | None:
        return None if v == 4 else (a or 0) + v  # None from the adder deletes the group

    def sub(k: str, v: int, a: int) -> int | None:
        return None if a - v == 0 else a - v

    agg = Aggregator("aggregate", lambda: 0, lambda k, v, a: add(k, v, a), sub)
    prev: dict[str, Any] = {}
    got: dict[str, int] = {}

    def apply(group: str, old: int | None, new: int | None) -> None:
        result = agg.table_change(group, old, new, got.get(group))
        if result is None:
            got.pop(group, None)
        else:
            got[group] = result

    for key, sel in changes:
        old, prev[key] = prev.get(key), sel
        if old is not None and sel is not None and old[0] == sel[0]:
            apply(old[0], old[1], sel[1])
            continue
        if old is not None:
            apply(old[0], old[1], None)
        if sel is not None:
            apply(sel[0], None, sel[1])
    want = ref.table_group_aggregate(changes, lambda k, v: v, add, sub)
    assert got == want


def change_row(
    group: bytes,
    old: int | None,
    new: int | None,
    batch: int,
    offset: int,
    src: bytes | None = None,
    ts: int | None = None,
) -> tuple[Any, ...]:
    """A repartition record as the aggregating step reads it (envelope + old, batch, rid,
    src)."""
    enc = LONG.serialize
    rid = record_id(0, offset, 0, 1)
    old_b = None if old is None else enc(old)
    new_b = None if new is None else enc(new)
    at = offset if ts is None else ts
    return (group, new_b, None, group, new_b, "t", 0, offset, 0, at, old_b, batch, rid, src)


def test_table_aggregate_applies_a_replayed_change_once() -> None:
    from tablecast.pipeline.compile.aggregate import table_aggregate
    from tablecast.pipeline.compile.keyed import KeyState

    core = table_aggregate(
        Aggregator("reduce", None, lambda a, b: a + b, lambda a, b: a - b), STR, LONG, LONG
    )
    store: dict[Any, Any] = {}
    state = KeyState(store, b"g")
    first = [change_row(b"g", None, 5, batch=1, offset=0), change_row(b"g", None, 7, 1, 1)]
    out = core(b"g", first, state)
    assert [LONG.deserialize(r[1]) for r in out] == [12]
    # the upstream batch 1 written again (a restart), then batch 2: only batch 2 counts
    again = [*first, change_row(b"g", 5, 6, batch=2, offset=0)]
    out = core(b"g", again, state)
    assert [LONG.deserialize(r[1]) for r in out] == [13]
    # a copy of batch 1 arriving after batch 2 is dropped too
    assert core(b"g", first, state) == [] and store[b"g"][1] == 2


def test_retract_emits_one_change_per_group_touched() -> None:
    from tablecast.pipeline.compile.aggregate import retract
    from tablecast.pipeline.compile.keyed import KeyState

    core = retract()
    state = KeyState({}, b"r1")

    def row(gk: bytes | None, gv: int, offset: int) -> tuple[Any, ...]:
        v = None if gk is None else pack_pair(gk, LONG.serialize(gv))
        return (b"r1", v, None, b"r1", b"raw", "t", 0, offset, 0, 100 + offset)

    def changes(*rows: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        out = core(b"r1", list(rows), state)
        # each change names the source row and keeps the timestamp of its last record
        assert {r[12] for r in out} <= {b"r1"} and {r[9] for r in out} <= {100 + rows[-1][7]}
        return [(r[0], r[10], r[1]) for r in out]  # (group, retracted, added)

    enc = LONG.serialize
    # several records of the row in one batch: one change, from before to after the batch
    assert changes(row(b"a", 1, 0), row(b"a", 2, 1), row(b"b", 3, 2)) == [(b"b", None, enc(3))]
    assert changes(row(b"b", 4, 3)) == [(b"b", enc(3), enc(4))]  # same group: one record
    assert changes(row(b"c", 9, 4), row(b"a", 5, 5)) == [
        (b"b", enc(4), None),  # moved: retracted from b ...
        (b"a", None, enc(5)),  # ... added to a (c, passed through, never saw it)
    ]
    assert changes(row(None, 0, 6)) == [(b"a", enc(5), None)]  # deleted
    assert not state.exists
    # added and deleted within one batch: nothing happened
    assert changes(row(b"a", 1, 7), row(None, 0, 8)) == []


def test_retract_selects_only_each_rows_latest_record_and_falls_back_past_failures() -> None:
    """With the table's Python steps fused in, the selector runs on a row's latest record
    of the batch; a latest record whose selector raises is dead-lettered and the one
    before it is selected, as if the failed one had been dead-lettered upstream."""
    from tablecast.pipeline.compile.aggregate import retract
    from tablecast.pipeline.compile.keyed import KeyState

    calls: list[int] = []

    def selector(k: str, v: dict[str, Any]) -> tuple[str, int]:
        calls.append(v["n"])
        return v["g"], 10 // v["n"]  # n == 0 raises

    run = run_of(
        [
            ("filter", lambda k, v: v["n"] >= 0, "table"),
            ("select_group", selector, "table"),
        ],
        value_out=PairSerde(STR, LONG),
    )
    core = retract(run.one_row)
    state = KeyState({}, b"r1")

    def row(n: int, offset: int, err: str | None = None) -> tuple[Any, ...]:
        v = b'{"g": "a", "n": %d}' % n
        return (b"r1", v, err, b"r1", v, "t", 0, offset, 0, 100 + offset)

    out = core(b"r1", [row(1, 0), row(2, 1), row(5, 2)], state)
    assert calls == [5]  # superseded records are never selected
    assert [(r[0], r[1], r[2]) for r in out] == [(b"a", LONG.serialize(2), None)]
    calls.clear()
    # the latest raises: dead-lettered, and the one before it is the row's new selection
    out = core(b"r1", [row(10, 3), row(0, 4), row(7, 5, err="value is not json")], state)
    assert calls == [0, 10]
    bad = sorted(r[2] for r in out if r[2] is not None)
    assert bad[0].startswith("select_group: ZeroDivisionError") and bad[1] == "value is not json"
    good = [(r[0], r[10], r[1]) for r in out if r[2] is None]
    assert good == [(b"a", LONG.serialize(2), LONG.serialize(1))] and good[0][0] == b"a"
    # a filter that stops matching retracts the row's contribution
    out = core(b"r1", [row(-1, 6)], state)
    assert [(r[0], r[10], r[1]) for r in out] == [(b"a", LONG.serialize(1), None)]
    assert not state.exists


def test_a_dead_lettered_change_leaves_no_drift_when_its_row_changes_again() -> None:
    """An adder that raises leaves its row contributing nothing, a subtractor that raises
    leaves the old contribution in: the retraction that comes when the row changes next
    takes back what is really there, not what the upstream step believes."""
    from tablecast.pipeline.compile.aggregate import table_aggregate
    from tablecast.pipeline.compile.keyed import KeyState

    def add(a: int, b: int) -> int:
        if b == 13:
            raise ValueError("unlucky")
        return a + b

    failures = iter([True])  # the subtractor fails once (say, a timeout it calls out to)

    def sub(a: int, b: int) -> int:
        if b == 7 and next(failures, False):
            raise ValueError("sticky")
        return a - b

    core = table_aggregate(Aggregator("reduce", None, add, sub), STR, LONG, LONG)
    store: dict[Any, Any] = {}
    state = KeyState(store, b"g")
    offsets = iter(range(100))

    def change(old: int | None, new: int | None, src: bytes, batch: int) -> list[Any]:
        row = change_row(b"g", old, new, batch, next(offsets), src)
        return core(b"g", [row], state)

    def total(out: list[Any]) -> int | None:
        good = [r for r in out if r[2] is None]
        return LONG.deserialize(good[-1][1]) if good and good[-1][1] is not None else None

    assert total(change(None, 4, b"r0", 1)) == 4
    out = change(None, 13, b"r1", 1)  # the adder raises: r1 contributes nothing
    assert out[0][2].startswith("reduce: ValueError: unlucky") and total(out) == 4
    assert total(change(13, 5, b"r1", 2)) == 9  # 13 was never added: not subtracted
    assert total(change(5, None, b"r1", 3)) == 4
    assert total(change(None, 7, b"r2", 3)) == 11
    out = change(7, 2, b"r2", 4)  # the subtractor raises: 7 stays in
    assert out[0][2].startswith("reduce: ValueError: sticky") and total(out) is None
    assert total(change(2, 3, b"r2", 5)) == 7  # takes back the 7 that is there, adds 3
    assert total(change(3, None, b"r2", 6)) == 4
    assert store[b"g"][4] is None  # nothing held any more


def test_aggregates_carry_the_largest_timestamp_of_their_inputs() -> None:
    from tablecast.pipeline.compile.aggregate import stream_aggregate, table_aggregate
    from tablecast.pipeline.compile.keyed import KeyState

    reduce = Aggregator("reduce", None, lambda a, b: a + b, lambda a, b: a - b)
    core = table_aggregate(reduce, STR, LONG, LONG)
    store: dict[Any, Any] = {}
    rows = [
        change_row(b"g", None, 1, 1, 0, b"r0", ts=50),
        change_row(b"g", None, 2, 1, 1, b"r1", ts=30),
    ]
    (out,) = core(b"g", rows, KeyState(store, b"g"))
    assert out[9] == 50
    (out,) = core(b"g", [change_row(b"g", 2, None, 2, 2, b"r1", ts=40)], KeyState(store, b"g"))
    assert out[9] == 50 and LONG.deserialize(out[1]) == 1
    stream = stream_aggregate(Aggregator("count"), STR, LONG, LONG)
    rows = [change_row(b"k", None, 1, 0, i, ts=ts)[:10] for i, ts in enumerate([7, 9, 8])]
    (out,) = stream(b"k", rows, KeyState(store, b"k"))
    assert out[9] == 9 and LONG.deserialize(out[1]) == 3


def test_split_branches_are_filters_and_merge_writes_every_input_to_one_topic() -> None:
    app = tc.App("a")
    ev = app.stream("ev")
    branches = ev.split({"big": lambda k, v: v > 5, "odd": lambda k, v: v % 2}, default="rest")
    assert list(branches) == ["big", "odd", "rest"]
    other = app.stream("ev2").map_values(lambda k, v: v)
    branches["odd"].merge(other).to_table().materialize("m")
    *sides, main, last = plan(app, "m")
    assert [q.output.topic for q in sides] == ["a.merge.m-0"] and sides[0].input.topic == "ev2"
    assert main.output.topic == "a.merge.m-0" and main.output.role == "merge"
    assert last.input.topic == "a.merge.m-0" and last.output.topic == "a.table.m"
    assert "merge(" in app.explain()
    with pytest.raises(ValueError):
        ev.split(by=lambda k, v: "x")  # the branch names are needed up front
    with pytest.raises(TypeError):
        ev.merge(app.stream("ev3", value=LONG))
