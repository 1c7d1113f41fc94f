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


def repartition_headers(batch_id: int) -> Column:
    """Headers a repartition record carries (a null retracted value is left out)."""
    batch = Codec.long_bytes(F.lit(batch_id))
    all_ = F.array(
        header(BATCH_HEADER, batch),
        header(RID_HEADER, F.col(env.RID)),
        header(OLD_HEADER, F.col(env.OLD)),
        header(SRC_HEADER, F.col(env.SRC)),
    )
    return F.filter(all_, lambda h: h.getField("value").isNotNull())


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
        found = F.filter("headers", lambda h: h.getField("key") == F.lit(name))
        return F.try_element_at(found, F.lit(1)).getField("value")

    batch = Codec.long_from_bytes(get(BATCH_HEADER))
    return df.withColumns(
        {
            env.OLD: get(OLD_HEADER),
            env.BATCH: batch,
            env.RID: get(RID_HEADER),
            env.SRC: get(SRC_HEADER),
        }
    )
