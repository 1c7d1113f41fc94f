"""Joins without Spark: how the planner cuts them, what the DSL refuses, and the
per-key join steps against the reference model."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import tablecast as tc
from tablecast.pipeline.compile.join import LEFT, RIGHT, StreamJoin, TableJoin, ordered
from tablecast.pipeline.compile.keyed import KeyState
from tablecast.pipeline.plan import queries as planner
from tests import reference_model as ref

STR, JSON = tc.serde.string(), tc.serde.json()


def plan(app: tc.App, name: str) -> list[planner.Query]:
    return planner.plan_output(app.id, app.materialized[name], list(app.materialized.values()))


def test_stream_table_join_is_one_query_reading_the_table_topic_beside() -> None:
    app = tc.App("shop")
    customers = app.table("customers")
    app.stream("orders").filter(lambda k, v: True).join(
        customers, lambda o, c: o
    ).to_table().materialize("enriched")
    (q,) = plan(app, "enriched")
    assert q.input.topic == "orders" and q.stateful
    assert [s.what for s in q.steps] == ["op", "join", "op"]
    side = q.steps[1].side
    assert side is not None and (side.topic, side.role) == ("customers", "source")
    assert "joins  customers [source]" in app.explain()


def test_a_derived_table_side_is_computed_first_and_a_materialized_one_is_read() -> None:
    app = tc.App("a")
    customers = app.table("customers")
    gold = customers.filter(lambda k, v: v["tier"] == "gold")
    orders = app.stream("orders")
    orders.join(gold, lambda o, c: o).to_table().materialize("gold_orders")
    *side, main = plan(app, "gold_orders")
    assert [q.output.topic for q in side] == ["a.changelog.gold_orders-join0"]
    assert main.steps[0].side == side[-1].output and side[-1].output.kind == "table"
    # once the same handle is materialized, its table topic is read instead
    gold.materialize("gold")
    (only,) = plan(app, "gold_orders")
    assert only.steps[0].side is not None and only.steps[0].side.topic == "a.table.gold"


def test_a_join_after_an_aggregation_cuts_a_changelog() -> None:
    app = tc.App("a")
    limits = app.table("limits")
    counts = app.stream("ev").group_by_key().count()
    counts.join(limits, lambda c, lim: c < lim["n"]).materialize("under")
    first, second = (q for q in plan(app, "under") if not q.dead_letters)
    assert [s.what for s in first.steps] == ["spark_aggregate"]
    assert first.output.role == "changelog" and second.input == first.output
    assert [s.what for s in second.steps] == ["join"]


def test_dsl_rejects_joins_that_cannot_run() -> None:
    app = tc.App("a")
    orders, customers = app.stream("o"), app.table("c")
    products = app.global_table("p")
    with pytest.raises(ValueError, match="how"):
        orders.join(customers, lambda a, b: a, how="outer")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="a Table, a GlobalTable or a Stream"):
        orders.join(lambda a, b: a, lambda a, b: a)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="global table"):
        customers.join(products, lambda a, b: a)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="same key serde"):
        customers.join(app.table("n", key=tc.serde.long()), lambda a, b: a)
    assert not hasattr(products, "filter")  # a global table has no operators, as in Kafka Streams


# -- the per-key steps ---------------------------------------------------------
def _row(side: int, part: int, off: int, ts: int, key: str, value: Any) -> tuple[Any, ...]:
    kb = key.encode()
    vb = None if value is None else JSON.serialize(value)
    return (kb, vb, None, kb, vb, "t", part, off, 0, ts, None, None, None, None, kb, side)


def _run(core: Any, rows: list[tuple[Any, ...]], store: dict[Any, Any]) -> list[Any]:
    rows = sorted(rows, key=lambda r: (r[6], r[7], r[8]))  # as the bucket step hands them over
    return core(b"k", rows, KeyState(store, b"k"))


EVENTS = st.lists(
    st.tuples(st.sampled_from(["stream", "table"]), st.one_of(st.none(), st.integers(0, 5))),
    max_size=30,
)


@given(events=EVENTS, batch=st.integers(1, 30), how=st.sampled_from(["inner", "left"]))
def test_stream_join_matches_the_reference_in_any_batching(
    events: list[tuple[str, int | None]], batch: int, how: str
) -> None:
    # each side spread over two partitions; timestamps increase in processing order
    rows = [
        _row(LEFT if side == "stream" else RIGHT, i % 2, i, i, "k", v)
        for i, (side, v) in enumerate(events)
    ]
    joiner = lambda s, t: [s, t]  # noqa: E731
    core = StreamJoin(joiner, how, False, JSON, JSON, JSON)
    store: dict[Any, Any] = {}
    out = [r for i in range(0, len(rows), batch) for r in _run(core, rows[i : i + batch], store)]
    want = ref.stream_table_join([(s, "k", v) for s, v in events], joiner, how)
    assert [(r[0].decode(), JSON.deserialize(r[1])) for r in out] == want


@given(
    events=st.lists(
        st.tuples(st.sampled_from(["left", "right"]), st.one_of(st.none(), st.integers(0, 5))),
        max_size=30,
    ),
    batch=st.integers(1, 30),
    how=st.sampled_from(["inner", "left", "outer"]),
)
def test_table_join_matches_the_reference_in_any_batching(
    events: list[tuple[str, int | None]], batch: int, how: str
) -> None:
    rows = [
        _row(LEFT if side == "left" else RIGHT, 0, i, i, "k", v)
        for i, (side, v) in enumerate(events)
    ]

    def joiner(a: int | None, b: int | None) -> list[int | None]:
        return [a, b]

    core = TableJoin(joiner, JSON, JSON, JSON, how)
    store: dict[Any, Any] = {}
    out = [r for i in range(0, len(rows), batch) for r in _run(core, rows[i : i + batch], store)]
    want = ref.table_table_join([(s, "k", v) for s, v in events], joiner, how)
    got = [(r[0].decode(), None if r[1] is None else JSON.deserialize(r[1])) for r in out]
    assert got == want


def test_global_table_rows_of_a_batch_come_first_and_ties_go_to_the_table() -> None:
    stream_early = _row(LEFT, 0, 0, 5, "k", 1)
    table_late = _row(RIGHT, 0, 0, 9, "k", 2)
    assert ordered([stream_early, table_late], table_first=False) == [stream_early, table_late]
    assert ordered([stream_early, table_late], table_first=True) == [table_late, stream_early]
    tie = _row(RIGHT, 1, 3, 5, "k", 3)
    assert ordered([stream_early, tie], table_first=False) == [tie, stream_early]


def test_a_failing_joiner_dead_letters_its_record_and_keeps_the_table() -> None:
    core = StreamJoin(lambda s, t: s / t, "inner", False, JSON, JSON, JSON)
    store: dict[Any, Any] = {}
    rows = [_row(RIGHT, 0, 0, 0, "k", 0), _row(LEFT, 0, 0, 1, "k", 4)]
    (bad,) = _run(core, rows, store)
    assert bad[2].startswith("join: ZeroDivisionError")
    (good,) = _run(core, [_row(RIGHT, 0, 1, 2, "k", 2), _row(LEFT, 0, 1, 3, "k", 4)], store)
    assert good[2] is None and JSON.deserialize(good[1]) == 2


def test_a_repartitioned_stream_joins_in_the_query_that_reads_the_topic_back() -> None:
    app = tc.App("a")
    customers = app.table("customers")
    rekeyed = app.stream("orders").select_key(lambda k, v: v["customer"]).repartition()
    rekeyed.join(customers, lambda o, c: o).to_table().materialize("by_customer")
    first, second = plan(app, "by_customer")
    assert first.output.role == "through" and second.input == first.output
    assert [s.what for s in second.steps] == ["join", "op"]
    # the stream's records carry ids: a restarted upstream query's copies are joined once
    assert first.output.ids and second.reads_batches


def test_a_joined_stream_reaches_its_aggregation_with_record_ids() -> None:
    # the changelog between is a stream: a restarted join query writes copies, which
    # the aggregation must drop (a table's changelog is upserts and needs no ids)
    app = tc.App("a")
    customers = app.table("customers")
    joined = app.stream("orders").join(customers, lambda o, c: {"city": c["city"]})
    joined.group_by(lambda k, v: v["city"]).count().materialize("per_city")
    first, second = plan(app, "per_city")
    assert first.output.role == "changelog" and first.output.ids and first.writes_batches
    assert second.reads_batches and [s.what for s in second.steps] == ["stream_aggregate"]
    joined_table = customers.join(app.table("limits"), lambda c, lim: c)
    joined_table.group_by(lambda k, v: (v["city"], 1)).count().materialize("n")
    table_first = plan(app, "n")[0]
    assert table_first.output.kind == "table" and not table_first.output.ids
