"""Column forms of the operators that take functions, without Spark: where a Column is
taken (joiners: evaluated after the join step), where it is refused and why."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import tablecast as tc
from tablecast.pipeline.compile.joiner import PairBytes, pair, python_form
from tablecast.pipeline.plan import nodes as plan

JSON = tc.serde.json()


def _app() -> tc.App:
    return tc.App("a")  # defining an App defers Columns: F.* builds them without Spark


def test_joiners_take_one_column_over_left_and_right() -> None:
    from pyspark.sql import functions as F

    app = _app()
    s, t, other = app.stream("s"), app.table("t"), app.stream("o")
    col = F.expr("left:n::int + right:m::int")
    joins = [
        s.join(t, col),
        s.join(t, col, how="left", key=F.col("key")),
        t.join(app.table("u"), col, how="outer"),
        s.join(other, col, how="outer", window=tc.windows.join("1 minute")),
    ]
    for j in joins:
        node = j.node
        assert isinstance(node, plan.Join) and plan.is_column(node.joiner)
        assert "left" in node.describe()
    with pytest.raises(TypeError, match="one Column over `left` and `right`"):
        s.join(t, (F.col("left"), F.col("right")))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="or a Column over"):
        t.join(app.table("u"), 3)  # type: ignore[arg-type]


def test_folds_and_transform_values_refuse_columns_and_say_why() -> None:
    from pyspark.sql import functions as F

    app = _app()
    grouped = app.stream("s").group_by_key()
    col = F.col("value")
    with pytest.raises(TypeError, match="inside the fold over Python state"):
        grouped.reduce(col)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="inside the fold over Python state"):
        grouped.aggregate(list, col)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="only Python callables, or only Columns"):
        app.table("t").group_by(lambda k, v: (k, v)).reduce(col, max)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="inside the fold"):
        app.cogroup((grouped, col))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="use map_values"):
        app.stream("s").transform_values(col)  # type: ignore[arg-type]


def test_a_column_joiner_makes_the_join_step_pass_the_pair_on() -> None:
    from pyspark.sql import functions as F

    long_ = tc.serde.long()
    assert python_form(max, JSON, long_, JSON) == (max, JSON, long_, JSON)
    fn, left, right, result = python_form(F.col("left"), JSON, long_, JSON)
    assert fn is pair and isinstance(result, PairBytes)
    # the step decodes each side with `left`/`right` (raw bytes) and encodes the pair
    lb, rb = JSON.serialize({"n": 1}), long_.serialize(7)
    joined = result.serialize(fn(left.deserialize(lb), right.deserialize(rb)))
    assert result.deserialize(joined) == (lb, rb)


@given(
    left=st.one_of(st.none(), st.binary(max_size=20)),
    right=st.one_of(st.none(), st.binary(max_size=20)),
)
def test_pairs_keep_a_missing_side_apart_from_an_empty_one(
    left: bytes | None, right: bytes | None
) -> None:
    p = PairBytes()
    assert p.deserialize(p.serialize((left, right))) == (left, right)


def test_a_table_fold_in_columns_runs_in_spark_and_in_real_time() -> None:
    from pyspark.sql import functions as F

    from tablecast.pipeline.plan import queries as planner
    from tablecast.pipeline.run.trigger import (
        TABLE_FOLD_FORM,
        blockers,
        column_forms,
        decide,
        slots_needed,
    )

    app = tc.App("a", trigger="realtime")
    g, n = F.variant_get("value", "$.g", "string"), F.variant_get("value", "$.n", "long")
    total, x = F.col("aggregate"), F.col("value")
    rows = app.table("t", value=tc.serde.json())
    rows.group_by((g, n), value=tc.serde.long()).reduce(total + x, total - x).materialize("sums")
    out = app.materialized["sums"]
    # one query, no repartition topic: Spark shuffles the changes to their group key
    (q,) = planner.plan_output(app.id, out, [out])
    assert [s.what for s in q.steps] == ["select_group", "spark_retract", "spark_table_aggregate"]
    assert q.input.topic == "t" and q.output.role == "table"
    # a plain Kafka sink, which Real-time Mode runs
    assert not q.writes_batches and not q.reads_batches and q.stateful_in_spark
    assert blockers(q) == []
    assert decide("realtime", q).realtime
    # the source tasks and the two operators' shuffle partitions, all held at once
    assert slots_needed(q, 3) == 9 and slots_needed(q, 3, shuffle=2) == 7
    assert "given a free task slot per input partition and two per shuffle" in app.explain()
    # with a Python selection the fold is Spark's still, but the selection needs a worker
    app = tc.App("b", trigger="realtime")
    by = app.table("t").group_by(lambda k, v: (v["g"], v["n"]), value=tc.serde.long())
    by.reduce(total + x, total - x).materialize("sums")
    out = app.materialized["sums"]
    (q,) = planner.plan_output(app.id, out, [out])
    assert [s.what for s in q.steps] == ["select_group", "spark_retract", "spark_table_aggregate"]
    assert blockers(q) and not decide("realtime", q).realtime
    # explain shows the callable form's Columns
    app = tc.App("c", trigger="realtime")
    by = app.table("t").group_by(lambda k, v: (v["g"], v["n"]), value=tc.serde.long())
    by.reduce(lambda a, b: a + b, lambda a, b: a - b).materialize("sums")
    out = app.materialized["sums"]
    first, second = planner.plan_output(app.id, out, [out])
    assert "as a pair of Columns" in column_forms(first)[0]
    assert column_forms(second)[0].endswith(TABLE_FOLD_FORM)
