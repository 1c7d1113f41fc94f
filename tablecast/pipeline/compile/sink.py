"""Where a query's rows go: good rows to the output topic, bad rows to ``<app>.dlq``.

One Kafka sink per query; a per-row ``topic`` column routes each row, so a
query makes one pass over its data. A bad row is written as it was read (raw
key and value) with the reason and its source coordinates in headers, and an
observed metric counts bad rows per micro-batch (see the runner's listener).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from tablecast.pipeline.compile import envelope as env
from tablecast.pipeline.compile.codecs import Codec
from tablecast.pipeline.compile.flow import Flow, ok
from tablecast.pipeline.plan.queries import Query

DEAD_LETTERS = "dead_letters"
# headers of a repartition record: upstream batch id, record id, retracted value, the
# key of the source row the change came from
BATCH_HEADER = "tablecast.batch"
RID_HEADER = "tablecast.rid"
OLD_HEADER = "tablecast.old"
SRC_HEADER = "tablecast.src"
#: every record's timestamp, moved into the record by the sink's producer interceptor
#: (tablecast/_jvm/interceptors): Spark's Kafka sink has no timestamp column
TS_HEADER = "tablecast.ts"


def header(name: str, value: Column) -> Column:
    return F.struct(F.lit(name).alias("key"), value.alias("value"))


def dlq_headers() -> Column:
    def text(name: str, col: str) -> Column:
        return header(name, F.col(col).cast("string").cast("binary"))

    return F.array(
        text("tablecast.error", env.ERR),
        text("tablecast.source.topic", env.TOPIC),
        text("tablecast.source.partition", env.PART),
        text("tablecast.source.offset", env.OFF),
    )


def observe(df: DataFrame, query: str) -> DataFrame:
    return df.observe(f"tablecast:{query}", F.count(F.col(env.ERR)).alias(DEAD_LETTERS))


def route(
    flow: Flow,
    q: Query,
    dlq: str,
    headers: Column | None = None,
    partition: Column | None = None,
) -> DataFrame:
    """The Kafka sink's columns: key, value, topic, headers (and partition)."""
    if q.output.kind == "table" or q.output.role != "sink":
        flow = flow.fail_where(F.col("key").isNull(), "null key")
    df = flow.df
    ts = F.array(header(TS_HEADER, Codec.long_bytes(F.col(env.TS))))
    own = ts if headers is None else F.concat(headers, ts)
    cols = [
        F.when(ok(), F.col("key")).otherwise(F.col(env.RAW_KEY)).alias("key"),
        F.when(ok(), F.col("value")).otherwise(F.col(env.RAW_VALUE)).alias("value"),
        F.when(ok(), F.lit(q.output.topic)).otherwise(F.lit(dlq)).alias("topic"),
        F.when(ok(), own).otherwise(F.concat(dlq_headers(), ts)).alias("headers"),
    ]
    if partition is not None:
        cols.append(F.when(ok(), partition).alias("partition"))
    return df.select(*cols)


#: a repartition write's batch id, as the bytes of its header (a column of the batch written)
BATCH_BYTES = "_tc_batch_bytes"


def present(*headers: tuple[str, Column]) -> Column:
    """Headers without those whose value is null. No Python lambda: Spark reuses generated
    code only for identical source, and PySpark names a lambda's variable anew each time
    (x_1, x_2 ...), which a comment in the code repeats, so every query (every batch,
    where a Column is built per batch) had its code compiled anew, and the JIT after it."""
    return F.array_compact(F.array(*(F.when(v.isNotNull(), header(k, v)) for k, v in headers)))


def repartition_headers() -> Column:
    """Headers a repartition record carries (a null retracted value is left out); the batch
    id comes from column BATCH_BYTES (with_batch_id())."""
    return present(
        (BATCH_HEADER, F.col(BATCH_BYTES)),
        (RID_HEADER, F.col(env.RID)),
        (OLD_HEADER, F.col(env.OLD)),
        (SRC_HEADER, F.col(env.SRC)),
    )


def with_batch_id(batch: DataFrame, batch_id: int) -> DataFrame:
    """The batch id for repartition_headers(): a binary literal, which generated code reads
    from its references (a long literal would be written into the code, new every batch)."""
    return batch.withColumn(BATCH_BYTES, F.lit(batch_id.to_bytes(8, "big", signed=True)))


def with_record_ids(flow: Flow, extra: tuple[str, ...]) -> Flow:
    """Record ids for a stream's repartition topic: the (partition, offset, seq) of the
    record read, or, read from such a topic itself, that record's id and seq. A
    restarted query computes the same ids, so the reader can drop the copies."""
    seq = Codec.long_bytes(F.col(env.SEQ))
    if env.RID in extra:
        rid = F.concat(F.col(env.RID), seq)
    else:
        rid = F.concat(Codec.long_bytes(F.col(env.PART)), Codec.long_bytes(F.col(env.OFF)), seq)
    df = flow.df.withColumn(env.RID, rid)
    for col in (env.OLD, env.SRC):
        if col not in df.columns:
            df = df.withColumn(col, F.lit(None).cast("binary"))
    return flow.with_df(df)


def read_repartition_headers(df: DataFrame) -> DataFrame:
    def get(name: str) -> Column:
        # a lambda written in SQL keeps its variable's name, so the generated code is the
        # same for every query that reads these headers (see present())
        return F.expr(f"try_element_at(filter(headers, h -> h.key = '{name}'), 1).value")

    batch = Codec.long_from_bytes(get(BATCH_HEADER))
    return df.withColumns(
        {
            env.OLD: get(OLD_HEADER),
            env.BATCH: batch,
            env.RID: get(RID_HEADER),
            env.SRC: get(SRC_HEADER),
        }
    )
