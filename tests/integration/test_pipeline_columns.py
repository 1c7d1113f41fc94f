"""Column expressions built before Spark runs (defining an App starts no Spark): once Spark
runs, each one computes what the same expression built on a running Spark computes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
