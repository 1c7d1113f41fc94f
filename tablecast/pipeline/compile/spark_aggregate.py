"""A grouped stream's ``count()``, or ``aggregate(<Spark aggregate function>)``, as Spark's
own streaming aggregation.

Kafka Streams' KStreamAggregate for a count: a record without key or value is
skipped, every other one adds one to its key's count; the result's timestamp is
the largest of the records counted. Spark computes exactly that with
``groupBy(key).agg(count, max(timestamp))`` in update mode: its state store and
checkpointed source offsets count each input record once across restarts, and a
batch written again after a crash writes the same counts (upserts). Unlike the
per-key Python steps (:mod:`.keyed`) this runs in the JVM, with no Arrow round
trip, and Real-time Mode (Spark 4.3) runs it.

``aggregate(F.sum(...))`` is the same with the user's aggregate function over the
decoded ``key`` and ``value`` columns in place of the count; its result is written
with the table's value serde, a null result as a tombstone (Kafka Streams deletes a
key whose aggregate is null), a result the serde cannot write as a bad row.

Rows marked bad before the aggregation are dropped here; the planner's companion
query (``Query.dead_letters``) writes them to the dead-letter topic.
"""

from __future__ import annotations

from pyspark.sql import functions as F
from pyspark.sql.types import VariantType

from tablecast.pipeline.compile import envelope as env
from tablecast.pipeline.compile.codecs import Codec
from tablecast.pipeline.compile.columns import classic
from tablecast.pipeline.compile.flow import Flow, ok
from tablecast.pipeline.plan import nodes as plan
from tablecast.pipeline.plan.queries import Step

RESULT = "_tc_result"


def apply(flow: Flow, step: Step) -> Flow:
    """The aggregates of `flow`'s good rows per encoded key, as envelope rows."""
    node = step.node
    assert isinstance(node, plan.Aggregate)
    if node.column is None:
        df = flow.envelope().df
        key, skip = F.col("key"), F.col("value").isNull()
        result = F.count(F.lit(1))
    else:
        flow = flow.decode()
        df = flow.df
        # grouped by the key's bytes: a decoded key may not be groupable (a JSON variant)
        key = flow.bytes_of("key")
        skip = F.col("value").isNull()
        if isinstance(df.schema["value"].dataType, VariantType):
            skip = skip | F.is_variant_null(F.col("value"))  # JSON null: no value either
        result = classic(node.column)  # built before Spark ran: a Spark Connect Column
    good = df.where(ok() & key.isNotNull() & ~skip)
    agg = good.groupBy(key.alias("key")).agg(result.alias(RESULT), F.max(env.TS).alias(env.TS))
    if node.column is None:
        value, err = Codec.long_bytes(F.col(RESULT)), F.lit(None).cast("string")
    else:
        value = Codec(step.value).encode(F.col(RESULT), agg.schema[RESULT].dataType)
        unfit = F.col(RESULT).isNotNull() & value.isNull()
        err = F.when(unfit, F.lit(f"{node.describe()}: the result does not fit {step.value!r}"))
    # an aggregate comes from many records: no source bytes or coordinates of its own
    types = env.schema()
    none = (env.RAW_KEY, env.RAW_VALUE, env.TOPIC, env.PART, env.OFF)
    out = agg.select(
        "key",
        value.alias("value"),
        err.alias(env.ERR),
        *(F.lit(None).cast(types[c].dataType).alias(c) for c in none),
        F.lit(0).cast("bigint").alias(env.SEQ),
        env.TS,
    )
    return Flow(out, step.key, step.value, step.kind)
