"""Grouped stream aggregations (count, reduce, aggregate) against the reference model."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import functions as F

import tablecast as tc
from tests import reference_model as ref

from .test_pipeline_support import CUMULATIVE, Running, running_app

pytestmark = pytest.mark.integration

PARTITIONS = 3
LONG, STR, JSON = tc.serde.long(), tc.serde.string(), tc.serde.json()
Rec = tuple[str, dict[str, int] | None]


def group_of(k: str, v: dict[str, int] | None) -> str | None:
    return None if v is None else str(v["g"])


def higher(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return b if b["x"] >= a["x"] else a


def count_until_zero(k: str, v: dict[str, int], agg: int) -> int | None:
    return None if v["x"] == 0 else agg + 1  # None deletes the key; the next record restarts


def bigger_x(k: str, v: dict[str, int], agg: int | None) -> int:
    return v["x"] if agg is None else max(agg, v["x"])


@pytest.fixture(scope="module")
def running(bootstrap: str, spark, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:  # type: ignore[no-untyped-def]
    def build(app: tc.App, topic: str) -> None:
        ev = app.stream(topic, key=STR, value=JSON)
        ev.group_by_key().count().materialize("key_count")
        ev.group_by(F.variant_get("value", "$.g", "string")).count().materialize("g_count_col")
        ev.group_by(group_of).aggregate(lambda: 0, lambda k, v, a: a + v["x"], LONG).materialize(
            "g_sum_py"
        )
        ev.group_by_key().reduce(higher).materialize("key_max")
        ev.group_by_key().aggregate(lambda: 0, count_until_zero, LONG).materialize("key_until_zero")
        # Spark aggregate functions: one as a long, one as JSON (the default)
        x = F.variant_get("value", "$.x", "long")
        g = F.variant_get("value", "$.g", "string")
        ev.group_by(g).aggregate(F.max(x), value=LONG).materialize("g_max_col")
        ev.group_by_key().aggregate(F.sum(x)).materialize("key_sum_col")

    with running_app(bootstrap, spark, tmp_path_factory, "grouped", build) as r:
        yield r


def expected(h: list[Rec]) -> dict[str, tuple[dict[Any, Any], tc.serde.Serde]]:
    by_group = ref.select_key(h, group_of)
    return {
        "key_count": (ref.stream_count(h), LONG),
        "g_count_col": (ref.stream_count(by_group), LONG),
        "g_sum_py": (ref.stream_aggregate(by_group, lambda: 0, lambda k, v, a: a + v["x"]), LONG),
        "key_max": (ref.stream_reduce(h, higher), JSON),
        "key_until_zero": (ref.stream_aggregate(h, lambda: 0, count_until_zero), LONG),
        "g_max_col": (ref.stream_aggregate(by_group, lambda: None, bigger_x), LONG),
        "key_sum_col": (ref.stream_aggregate(h, lambda: 0, lambda k, v, a: a + v["x"]), JSON),
    }


RECORDS = st.lists(
    st.tuples(
        st.sampled_from([f"k{i}" for i in range(6)]),
        st.one_of(
            st.none(),
            st.fixed_dictionaries({"g": st.integers(0, 2), "x": st.integers(-3, 9)}),
        ),
    ),
    min_size=1,
    max_size=40,
)


@CUMULATIVE
@given(records=RECORDS)
def test_grouped_stream_aggregations_match_kafka_streams(
    running: Running, bootstrap: str, records: list[Rec]
) -> None:
    running.feed(bootstrap, records)
    running.check(bootstrap, expected(running.history))


def test_a_spark_aggregate_function_is_sparks_own_and_needs_column_steps_before_it(
    spark,  # type: ignore[no-untyped-def]
) -> None:
    from tablecast.pipeline.plan import queries as planner

    app = tc.App("a")
    ev = app.stream("ev", key=STR, value=JSON)
    x = F.variant_get("value", "$.x", "long")
    ev.filter(x > 0).group_by_key().aggregate(F.sum(x)).materialize("ok")
    (dlq, q) = planner.plan_output(app.id, app.materialized["ok"])
    assert [s.what for s in q.steps] == ["op", "spark_aggregate"] and dlq.dead_letters
    assert "aggregate(Column<'sum(" in q.steps[-1].describe()
    with pytest.raises(TypeError, match="no aggregator"):
        ev.group_by_key().aggregate(F.sum(x), lambda k, v, a: a)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Spark aggregate function"):
        ev.group_by_key().aggregate(lambda: 0)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="fold over Python state"):
        ev.group_by_key().reduce(F.sum(x))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="fold over Python state"):
        minute = ev.group_by_key().windowed_by(tc.windows.tumbling("1 minute"))
        minute.aggregate(F.sum(x), lambda k, v, a: a)  # type: ignore[arg-type]
    # a Python step before it, or a repartition topic's copies: Spark cannot run it exactly
    ev.filter(lambda k, v: True).group_by_key().aggregate(F.sum(x)).materialize("py")
    with pytest.raises(ValueError, match="a Python step comes before it"):
        planner.plan_output(app.id, app.materialized["py"])
    ev.repartition(2).group_by_key().aggregate(F.max(x)).materialize("moved")
    with pytest.raises(ValueError, match="repartition or changelog topic"):
        planner.plan_output(app.id, app.materialized["moved"])
