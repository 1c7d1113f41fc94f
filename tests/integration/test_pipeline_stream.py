"""Stateless stream operators, Column and Python forms, against the reference model.

One App with several outputs runs for the whole module; each hypothesis example
appends records to the input and compares every table (read back from its
topic) with the reference model's answer for everything produced so far.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import functions as F

import tablecast as tc
from tests import reference_model as ref

from .test_pipeline_support import CUMULATIVE, Running, read_topic, running_app

pytestmark = pytest.mark.integration

PARTITIONS = 3
LONG, STR, JSON = tc.serde.long(), tc.serde.string(), tc.serde.json()


@pytest.fixture(scope="module")
def running(bootstrap: str, spark, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:  # type: ignore[no-untyped-def]
    with running_app(bootstrap, spark, tmp_path_factory, "stream", build) as r:
        yield r


def build(app: tc.App, topic: str) -> None:
    ev = app.stream(topic, key=STR, value=JSON)
    X = F.variant_get("value", "$.x", "int")
    G = F.variant_get("value", "$.g", "int")

    seen: list[Any] = []
    (
        ev.filter(lambda k, v: v["x"] % 2 == 0)
        .map_values(lambda k, v: v["x"] * 10, value=LONG)
        .peek(lambda k, v: seen.append(v))  # runs in a Python worker: only must not break flow
        .to_table()
        .materialize("py1")
    )
    ev.filter(X % 2 == 0).map_values(X * 10, value=LONG).to_table().materialize("col1")
    (
        ev.map(lambda k, v: (k.upper(), v["x"]), value=LONG)
        .flat_map_values(lambda k, v: [v, v + 1])
        .select_key(lambda k, v: k + "!")
        .to_table()
        .materialize("py2")
    )
    (
        ev.map((F.upper("key"), X.cast("long")), value=LONG)
        .flat_map_values(F.array(F.col("value"), F.col("value") + 1))
        .select_key(F.concat("key", F.lit("!")))
        .to_table()
        .materialize("col2")
    )
    ev.flat_map(
        lambda k, v: [(k + "a", v["x"]), (k + "b", v["g"])], value=LONG
    ).to_table().materialize("py3")
    pairs = F.array(
        F.struct(F.concat("key", F.lit("a")).alias("key"), X.cast("long").alias("value")),
        F.struct(F.concat("key", F.lit("b")).alias("key"), G.cast("long").alias("value")),
    )
    ev.flat_map(pairs, value=LONG).to_table().materialize("col3")
    (
        ev.filter(X > 0)
        .map_values(lambda k, v: {"x2": v["x"] * 2, "g": v["g"]})
        .filter(lambda k, v: v["g"] != 1)
        .map_values(F.variant_get("value", "$.x2", "long"), value=LONG)
        .to_table()
        .materialize("mixed")
    )
    # split: by predicates (first match wins, the rest to a default branch) and by name
    by_pred = ev.split(
        {"neg": lambda k, v: v["x"] < 0, "even": lambda k, v: v["x"] % 2 == 0}, default="rest"
    )
    by_col = ev.split({"neg": X < 0, "even": X % 2 == 0}, default="rest")
    for name in ("neg", "even", "rest"):
        by_pred[name].to_table().materialize(f"split_py_{name}")
        by_col[name].to_table().materialize(f"split_col_{name}")
    by_g = ev.split(by=lambda k, v: f"g{v['g']}", names=["g0", "g1"], default="other")
    by_g["g1"].to_table().materialize("split_g1")
    by_g["other"].to_table().materialize("split_other")
    # merge: two re-keyed streams (disjoint keys) and the input itself through one topic
    left = ev.select_key(lambda k, v: "a" + k)
    right = ev.filter(X > 0).select_key(F.concat(F.lit("b"), F.col("key")))
    left.merge(right, ev).map_values(X, value=LONG).to_table().materialize("merged")
    ev.map_values(lambda k, v: v["x"], value=LONG).to(f"{app.id}-out")
    ev.to(f"{app.id}-p0", partitioner=lambda k, v, n: n - 1)


def expected(history: list[tuple[str, dict[str, int]]]) -> dict[str, dict[Any, Any]]:
    py1 = ref.map_values(
        ref.filter_(history, lambda k, v: v["x"] % 2 == 0), lambda k, v: v["x"] * 10
    )
    two = ref.map_(history, lambda k, v: (k.upper(), v["x"]))
    two = ref.select_key(ref.flat_map_values(two, lambda k, v: [v, v + 1]), lambda k, v: k + "!")
    three = ref.flat_map(history, lambda k, v: [(k + "a", v["x"]), (k + "b", v["g"])])
    mixed = ref.map_values(
        ref.filter_(history, lambda k, v: v["x"] > 0), lambda k, v: {"x2": v["x"] * 2, "g": v["g"]}
    )
    mixed = ref.map_values(ref.filter_(mixed, lambda k, v: v["g"] != 1), lambda k, v: v["x2"])
    split = {
        "neg": ref.filter_(history, lambda k, v: v["x"] < 0),
        "even": ref.filter_(history, lambda k, v: v["x"] >= 0 and v["x"] % 2 == 0),
        "rest": ref.filter_(history, lambda k, v: v["x"] >= 0 and v["x"] % 2 != 0),
    }
    merged = [
        *ref.select_key(history, lambda k, v: "a" + k),
        *ref.select_key(ref.filter_(history, lambda k, v: v["x"] > 0), lambda k, v: "b" + k),
        *history,
    ]
    merged_table = ref.latest(ref.map_values(merged, lambda k, v: v["x"]))
    return {
        **{
            f"split_{form}_{n}": ref.latest(rs) for n, rs in split.items() for form in ("py", "col")
        },
        "split_g1": ref.latest(ref.filter_(history, lambda k, v: v["g"] == 1)),
        "split_other": ref.latest(ref.filter_(history, lambda k, v: v["g"] not in (0, 1))),
        "merged": merged_table,
        "py1": ref.latest(py1),
        "col1": ref.latest(py1),
        "py2": ref.latest(two),
        "col2": ref.latest(two),
        "py3": ref.latest(three),
        "col3": ref.latest(three),
        "mixed": ref.latest(mixed),
    }


RECORDS = st.lists(
    st.tuples(
        st.sampled_from([f"k{i}" for i in range(8)]),
        st.fixed_dictionaries({"g": st.integers(0, 3), "x": st.integers(-50, 50)}),
    ),
    min_size=1,
    max_size=40,
)


@CUMULATIVE
@given(records=RECORDS)
def test_stateless_stream_operators_match_kafka_streams(
    running: Running, bootstrap: str, records: list[tuple[str, dict[str, int]]]
) -> None:
    running.feed(bootstrap, records)
    want = expected(running.history)
    running.check(
        bootstrap,
        {name: (t, JSON if name.startswith("split") else LONG) for name, t in want.items()},
    )

    # to(topic): every record, in the source's partitioning (no crash: exactly once here)
    app = running.app.id
    out = read_topic(bootstrap, f"{app}-out")
    got = sorted((m.key().decode(), LONG.deserialize(m.value())) for m in out)
    assert got == sorted((k, v["x"]) for k, v in running.history)
    parts = {m.partition() for m in read_topic(bootstrap, f"{app}-p0")}
    assert parts == {PARTITIONS - 1}
