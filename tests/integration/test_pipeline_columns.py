"""Column expressions built before Spark runs (defining an App starts no Spark): once Spark
runs, each one computes what the same expression built on a running Spark computes; and
Column joiners, evaluated by Spark after the join steps pair the values."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

BUILD = """
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

def columns():
    return {
        "arith": F.variant_get("value", "$.n", "long") % 2 == 0,
        "logic": (~F.col("value").isNull() & F.col("key").isin("a", "b")) | F.lit(False),
        "when": F.when(F.col("key") > "a", "big").otherwise("small"),
        "struct": F.struct(
            F.upper(F.col("key")).alias("key"),
            (F.variant_get("value", "$.n", "int") * 3).alias("value"),
        ),
        "cast": F.col("key").cast("binary"),
        "try_cast": F.col("key").try_cast("int"),
        "hof": F.transform(F.array(F.lit(1), F.lit(2)), lambda x: x + F.length(F.col("key"))),
        "agg": F.aggregate(F.array(F.lit(1), F.lit(2)), F.lit(0), lambda a, x: a + x),
        "expr": F.expr("length(key) + 1"),
        "field": F.struct(F.col("key").alias("k")).getField("k"),
        "item": F.array(F.col("key"))[0],
        "udf": F.udf(lambda k: None if k is None else k * 2, StringType())(F.col("key")),
        "ne": F.col("key") != "a",
        "neg": -F.length("key"),
        "null": F.lit(None),
        "path": F.expr("value:n::int"),
    }
"""

SCRIPT = (
    BUILD
    + """
import tablecast as tc
from pyspark import SparkContext

app = tc.App("columns")
deferred = columns()
app.stream("in").filter(deferred["arith"]).map_values(deferred["struct"]).to("out")
assert SparkContext._active_spark_context is None, "defining the App started Spark"
assert "variant_get" in app.explain()

from tablecast.pipeline.compile.columns import classic
from tablecast.pipeline.run.spark import session

spark = session("columns", "local[1]")
rows = [("a", '{"n": 1}'), ("bc", '{"n": 4}'), (None, None)]
df = spark.createDataFrame(rows, "key string, v string")
df = df.selectExpr("key", "parse_json(v) as value")
built = columns()  # on a running Spark: classic Columns
assert all(type(c).__module__.startswith("pyspark.sql.classic") for c in built.values())
got = df.select(*[classic(c).alias(n) for n, c in deferred.items()]).collect()
want = df.select(*[c.alias(n) for n, c in built.items()]).collect()
assert got == want, (got, want)
spark.stop()
print("same", len(deferred))
"""
)


def test_columns_built_before_spark_compute_what_classic_ones_do() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip().endswith("same 16"), done.stdout


# -- Column joiners, on the real broker and Spark ----------------------------------
def test_column_joiners_compute_what_kafka_streams_joiners_do(
    bootstrap: str,
    spark,  # type: ignore[no-untyped-def]
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A stream-table (left), a table-table (outer) and a stream-stream join, each with a
    Column joiner over `left` and `right` (JSON values: VARIANTs), against the reference
    model with the Python joiner that computes the same."""
    import orjson
    from pyspark.sql import functions as F

    import tablecast as tc
    from tablecast.kafka.topics import ensure_topic
    from tests import reference_model as ref

    from .kafka_io import produce
    from .test_pipeline_support import read_table, running_app

    str_, json_, long_ = tc.serde.string(), tc.serde.json(), tc.serde.long()
    topics: dict[str, str] = {}

    def build(app: tc.App, topic: str) -> None:
        topics.update(s=topic, **{n: f"{app.id}-{n}" for n in ("t", "u", "o")})
        for n in ("t", "u", "o"):
            ensure_topic(bootstrap, topics[n], 3)
        s = app.stream(topic, key=str_, value=json_)
        t = app.table(topics["t"], key=str_, value=json_)
        u = app.table(topics["u"], key=str_, value=json_)
        o = app.stream(topics["o"], key=str_, value=json_)
        st_col = F.expr("left:n::int * 1000 + coalesce(right:m::int, -1)")
        s.join(t, st_col, how="left", value=long_).to_table().materialize("st")
        tt_col = F.struct(F.expr("left:m::int").alias("l"), F.expr("right:m::int").alias("r"))
        t.join(u, tt_col, how="outer").materialize("tt")
        ss_col = F.concat_ws("+", F.expr("left:n::string"), F.expr("right:n::string"))
        window = tc.windows.join("1 hour")
        s.join(o, ss_col, window=window, value=str_).to_table().materialize("ss")

    def st_py(left: Any, right: Any) -> int:
        return left["n"] * 1000 + (-1 if right is None else right["m"])

    def tt_py(left: Any, right: Any) -> dict[str, int]:
        # to_json leaves a null field out
        pairs = (("l", left and left["m"]), ("r", right and right["m"]))
        return {f: v for f, v in pairs if v is not None}

    def ss_py(left: Any, right: Any) -> str:
        return f"{left['n']}+{right['n']}"

    steps: list[tuple[str, list[tuple[str, Any]]]] = [
        ("t", [("k1", {"m": 5}), ("k2", {"m": 6})]),
        ("u", [("k2", {"m": 60}), ("k3", {"m": 70})]),
        ("s", [("k1", {"n": 1}), ("k3", {"n": 3}), ("k9", None)]),
        ("o", [("k1", {"n": 10})]),
        ("t", [("k1", None)]),
        ("s", [("k1", {"n": 2})]),
    ]
    with running_app(bootstrap, spark, tmp_path_factory, "coljoin", build) as r:
        for name, records in steps:
            wire = [(k.encode(), None if v is None else orjson.dumps(v)) for k, v in records]
            produce(bootstrap, topics[name], wire)
            r.pipeline.process_all_available()
        st_events = [
            ("stream" if n == "s" else "table", k, v)
            for n, records in steps
            if n in ("s", "t")
            for k, v in records
        ]
        tt_events = [
            ("left" if n == "t" else "right", k, v)
            for n, records in steps
            if n in ("t", "u")
            for k, v in records
        ]
        want = {
            "st": (ref.latest(ref.stream_table_join(st_events, st_py, "left")), long_),
            "tt": (ref.latest(ref.table_table_join(tt_events, tt_py, "outer")), json_),
            "ss": ({"k1": ss_py({"n": 2}, {"n": 10})}, str_),
        }
        for name, (table, value) in want.items():
            assert read_table(bootstrap, f"{r.app.id}.table.{name}", str_, value) == table, name
        assert want["st"][0] == {"k1": 1999, "k3": 2999}
        assert want["tt"][0] == {"k2": {"l": 6, "r": 60}, "k3": {"r": 70}}  # k1: deleted
        assert r.pipeline.dead_letters.total() == 0
