"""From planned queries to Spark: DataFrames, and the writers that start them.

A query reads its input topic into the envelope (see
:mod:`tablecast.pipeline.envelope`), checks records written by others (a key
or value that does not decode marks its row bad), applies its steps — Column
operators in the JVM, runs of Python callables fused into one mapInArrow,
stateful steps with applyInPandasWithState — and routes good rows to its output
topic and bad ones to the dead-letter topic through one Kafka sink.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter

from tablecast.kafka.topics import dlq_topic
from tablecast.pipeline import envelope as env
from tablecast.pipeline import partitioning, sinks, stateful, stateless, windowing
from tablecast.pipeline.flow import Flow
from tablecast.pipeline.planner import Query, Step
from tablecast.pipeline.trigger import Trigger


@dataclass(frozen=True)
class Target:
    app_id: str
    bootstrap_servers: str
    checkpoints: Path
    trigger: Trigger
    partitions: int  # of the App's topics (state buckets scale with it)
    sink_partitions: int  # of the topic this query writes (a to() topic may differ)


def read(spark: SparkSession, q: Query, t: Target) -> tuple[Flow, tuple[str, ...]]:
    """The input topic as an envelope flow (plus the columns a repartition topic adds)."""
    raw = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", t.bootstrap_servers)
        .option("subscribe", q.input.topic)
        .option("startingOffsets", "earliest")
        # compaction removes records a restarted query may still point at
        .option("failOnDataLoss", "false")
        .option("includeHeaders", str(q.reads_batches).lower())
        .load()
    )
    df: DataFrame = raw.select(
        "key",
        "value",
        F.lit(None).cast("string").alias(env.ERR),
        F.col("key").alias(env.RAW_KEY),
        F.col("value").alias(env.RAW_VALUE),
        F.col("topic").alias(env.TOPIC),
        F.col("partition").alias(env.PART),
        F.col("offset").alias(env.OFF),
        F.lit(0).cast("bigint").alias(env.SEQ),
        *(["headers"] if q.reads_batches else []),
        *([F.unix_millis(F.col("timestamp")).alias(env.TS)] if q.windowed else []),
    )
    ref = q.input
    flow = Flow(df, ref.key, ref.value, ref.kind)
    if q.reads_batches:
        flow = flow.with_df(sinks.read_repartition_headers(df).drop("headers"))
        return flow, (env.OLD, env.BATCH, env.RID)
    if ref.external:
        if ref.kind == "table":
            flow = flow.fail_where(F.col("key").isNull(), "null key")
        first = q.steps[0] if q.steps else None
        column_first = first is not None and not stateless.is_python(first)
        flow = flow.decode() if column_first else flow.validate()
    return flow, (env.TS,) if q.windowed else ()


def transform(
    flow: Flow, steps: list[Step], extra: tuple[str, ...], partitions: int
) -> tuple[Flow, tuple[str, ...]]:
    i = 0
    while i < len(steps):
        step = steps[i]
        if step.what == "window_aggregate":
            flow = windowing.apply(flow, step, partitions, extra)
            extra = ()
            i += 1
        elif step.stateful:
            flow = stateful.apply(flow, step, partitions, extra)
            extra = (env.OLD, env.RID) if step.what == "retract" else ()
            i += 1
        elif stateless.is_python(step):
            run = [step]
            while i + len(run) < len(steps) and stateless.is_python(steps[i + len(run)]):
                run.append(steps[i + len(run)])
            flow = stateless.apply_python(flow, run, extra)
            i += len(run)
        else:
            flow = stateless.apply_column(flow, step)
            i += 1
    return flow, extra


def writer(spark: SparkSession, q: Query, t: Target) -> DataStreamWriter:
    """The query's DataStreamWriter, ready to start()."""
    flow, extra = read(spark, q, t)
    flow, extra = transform(flow, q.steps, extra, t.partitions)
    flow = flow.envelope(*extra)
    dlq = dlq_topic(t.app_id)
    common: dict[str, Any] = {"kafka.bootstrap.servers": t.bootstrap_servers}
    partition = None
    if q.partitioner is not None:
        flow, partition = partitioning.assign(flow, q.partitioner, t.sink_partitions)
    elif q.windowed:
        partition = windowing.partition_column()
    if q.output.ids:
        flow = sinks.with_record_ids(flow, extra)
    if q.writes_batches:
        df = sinks.observe(flow.df, q.name)

        def write_batch(batch: DataFrame, batch_id: int) -> None:
            # the batch id lets the reading query drop what a replay writes again
            headers = sinks.repartition_headers(batch_id)
            out = sinks.route(flow.with_df(batch), q, dlq, headers, partition)
            out.write.format("kafka").options(**common).save()

        w = df.writeStream.foreachBatch(write_batch)
    else:
        flow = flow.with_df(sinks.observe(flow.df, q.name))
        out = sinks.route(flow, q, dlq, partition=partition)
        w = out.writeStream.format("kafka").options(**common)
    w = (
        w.queryName(q.name)
        .option("checkpointLocation", str(t.checkpoints / q.name))
        .outputMode("update")
    )
    return t.trigger.apply(w)
