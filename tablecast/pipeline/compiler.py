"""From plan to Spark: each materialized table becomes one streaming query.

The query reads the table's source topic, decodes key and value in the JVM,
applies the operators, and writes one Kafka sink whose per-row ``topic``
column sends good records to the table topic and bad ones, raw and with the
reason in headers, to the dead-letter topic. A single sink keeps one pass over
the data and no Python on the hot path.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from tablecast.kafka.topics import dlq_topic, table_topic
from tablecast.pipeline import plan
from tablecast.pipeline.codecs import Codec

ERROR = "_tc_error"
RAW_KEY = "_tc_raw_key"
RAW_VALUE = "_tc_raw_value"


@dataclass(frozen=True)
class CompiledTable:
    """One materialized table's query, before it is started."""

    name: str
    source_topic: str
    topic: str
    frame: DataFrame  # key, value, headers, topic: ready for the Kafka sink
    steps: list[str]


def compile_table(
    spark: SparkSession, app_id: str, bootstrap_servers: str, mat: plan.Materialize
) -> CompiledTable:
    chain = mat.lineage()
    src = plan.source_of(mat)
    raw = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap_servers)
        .option("subscribe", src.topic)
        .option("startingOffsets", "earliest")
        # compaction removes records a restarted query may still point at
        .option("failOnDataLoss", "false")
        .load()
    )
    kc, vc = Codec(src.key), Codec(src.value)
    df = raw.select(
        F.col("key").alias(RAW_KEY),
        F.col("value").alias(RAW_VALUE),
        "topic",
        "partition",
        "offset",
        kc.decode(F.col("key")).alias("key"),
        vc.decode(F.col("value")).alias("value"),
    )
    df = df.withColumn(
        ERROR,
        F.when(F.col(RAW_KEY).isNull(), F.lit("null key"))
        .when(~kc.valid(F.col(RAW_KEY), F.col("key")), F.lit(f"key is not {src.key.format}"))
        .when(
            ~vc.valid(F.col(RAW_VALUE), F.col("value")), F.lit(f"value is not {src.value.format}")
        ),
    )
    kind = src.kind
    for node in chain[1:]:
        if isinstance(node, plan.Filter):
            df = _filter(df, node, kind)
        elif isinstance(node, plan.MapValues):
            df = _map_values(df, node)
        elif isinstance(node, plan.ToTable):
            kind = "table"
        elif isinstance(node, plan.Materialize):
            pass
        else:
            raise NotImplementedError(f"{node.describe()} is not supported by the compiler yet")
    topic = table_topic(app_id, mat.name)
    ok = F.col(ERROR).isNull()
    sink = df.select(
        F.when(ok, kc.encode(F.col("key"))).otherwise(F.col(RAW_KEY)).alias("key"),
        F.when(ok, Codec(plan.value_serde(mat)).encode(F.col("value")))
        .otherwise(F.col(RAW_VALUE))
        .alias("value"),
        F.when(ok, F.lit(topic)).otherwise(F.lit(dlq_topic(app_id))).alias("topic"),
        F.when(ok, F.lit(None)).otherwise(_dlq_headers()).alias("headers"),
    )
    return CompiledTable(
        name=mat.name,
        source_topic=src.topic,
        topic=topic,
        frame=sink,
        steps=[n.describe() for n in chain],
    )


def _dlq_headers() -> Column:
    def header(name: str, col: Column) -> Column:
        return F.struct(F.lit(name).alias("key"), col.cast("string").cast("binary").alias("value"))

    return F.array(
        header("tablecast.error", F.col(ERROR)),
        header("tablecast.source.topic", F.col("topic")),
        header("tablecast.source.partition", F.col("partition")),
        header("tablecast.source.offset", F.col("offset")),
    )


def _filter(df: DataFrame, node: plan.Filter, kind: str) -> DataFrame:
    pred = _column(node.predicate, "filter")
    keep = F.col(ERROR).isNotNull() | F.col("value").isNull() | F.coalesce(pred, F.lit(False))
    if kind == "table":
        # a table row that does not match is deleted downstream, so a row that
        # stops matching retracts what an earlier version of it published
        return df.withColumn("value", F.when(keep, F.col("value")))
    return df.filter(keep)


def _map_values(df: DataFrame, node: plan.MapValues) -> DataFrame:
    fn = _column(node.fn, "map_values")
    passthrough = F.col(ERROR).isNotNull() | F.col("value").isNull()
    return df.withColumn("value", F.when(passthrough, F.col("value")).otherwise(fn))


def _column(fn: plan.Fn, op: str) -> Column:
    if isinstance(fn, Column):
        return fn
    raise NotImplementedError(
        f"{op}: Python callables are not compiled yet; pass a pyspark Column over key/value"
    )
