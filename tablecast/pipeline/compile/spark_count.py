"""A grouped stream's ``count()`` as Spark's own streaming aggregation.

Kafka Streams' KStreamAggregate for a count: a record without key or value is
skipped, every other one adds one to its key's count; the result's timestamp is
the largest of the records counted. Spark computes exactly that with
``groupBy(key).agg(count, max(timestamp))`` in update mode: its state store and
checkpointed source offsets count each input record once across restarts, and a
batch written again after a crash writes the same counts (upserts). Unlike the
per-key Python steps (:mod:`.keyed`) this runs in the JVM, with no Arrow round
trip, and Real-time Mode (Spark 4.3) runs it.

Rows marked bad before the count are dropped here; the planner's companion query
(``Query.dead_letters``) writes them to the dead-letter topic.
"""

from __future__ import annotations

from pyspark.sql import functions as F

from tablecast.pipeline.compile import envelope as env
from tablecast.pipeline.compile.codecs import Codec
from tablecast.pipeline.compile.flow import Flow, ok
from tablecast.pipeline.plan.queries import Step

COUNT = "_tc_count"


def apply(flow: Flow, step: Step) -> Flow:
    """The counts of `flow`'s good rows per encoded key, as envelope rows."""
    df = flow.envelope().df
    counted = df.where(ok() & F.col("key").isNotNull() & F.col("value").isNotNull())
    counts = counted.groupBy("key").agg(F.count(F.lit(1)).alias(COUNT), F.max(env.TS).alias(env.TS))
    # a count comes from many records: no source bytes or coordinates of its own
    types = env.schema()
    none = (env.ERR, env.RAW_KEY, env.RAW_VALUE, env.TOPIC, env.PART, env.OFF)
    out = counts.select(
        "key",
        Codec.long_bytes(F.col(COUNT)).alias("value"),
        *(F.lit(None).cast(types[c].dataType).alias(c) for c in none),
        F.lit(0).cast("bigint").alias(env.SEQ),
        env.TS,
    )
    return Flow(out, step.key, step.value, step.kind)
