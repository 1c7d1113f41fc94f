"""A table ``group_by`` whose selection and fold are Columns, run by Spark in the JVM.

The two steps of the Python form (:func:`.aggregate.retract` and
:func:`.aggregate.table_aggregate`) as tablecast's transformWithState
processors (``tablecast/_jvm/grouped-tables``) in one query: the first keeps
each source row's last selection and turns each record into changes keyed by
group key, which Spark's shuffle takes to the second; that one applies them per
group key with the user's subtractor and adder evaluated as Catalyst
expressions. No Python worker runs and no topic lies between them, so Real-time
Mode can run the query, and a micro-batch carries a record the whole way. Both
operators' state is committed with the batch, so a replay after a crash
neither loses a change nor applies one twice.

The Kafka Streams semantics are the Python form's: a change subtracts the row's
old contribution when there is an aggregate and adds the new one (a reduce's
first value starts it, an aggregate starts from its initializer); a null result
deletes the key.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
)

from tablecast.pipeline.compile import envelope as env
from tablecast.pipeline.compile.codecs import Codec
from tablecast.pipeline.compile.columns import classic
from tablecast.pipeline.compile.flow import Flow, ok
from tablecast.pipeline.plan import nodes as plan
from tablecast.pipeline.plan.queries import Step
from tablecast.serde import Serde

#: the decoded group key, new and old group value beside the envelope (the fold's input)
GROUP_KEY, NEW, OLD = "_tc_gk", "_tc_gv", "_tc_gold"


def retract(flow: Flow, step: Step) -> Flow:
    """Per source key, its changes keyed by group key, with (old, src) columns."""
    flow = flow.envelope()
    df = flow.df
    jdf = _processors(df).retract(df._jdf, env.OLD, env.SRC)
    return Flow(DataFrame(jdf, df.sparkSession), step.key, step.value, step.kind)


def aggregate(flow: Flow, step: Step, extra: tuple[str, ...]) -> Flow:
    """Per group key, the changes retract() made folded into the aggregate, written with the
    table's value serde (a result the serde cannot write: a bad row)."""
    node = step.node
    assert isinstance(node, plan.Aggregate) and env.SRC in extra
    flow = flow.envelope(*extra)
    kc, vc = Codec(flow.key), Codec(flow.value)
    df = flow.df.withColumns(
        {
            GROUP_KEY: kc.decode(F.col("key")),
            NEW: vc.decode(F.col("value")),
            OLD: vc.decode(F.col(env.OLD)),
        }
    )
    flow = flow.with_df(df)
    flow = flow.fail_where(~kc.valid(F.col("key"), F.col(GROUP_KEY)), f"key is not {kc.fmt}")
    flow = flow.fail_where(~vc.valid(F.col("value"), F.col(NEW)), f"value is not {vc.fmt}")
    flow = flow.fail_where(~vc.valid(F.col(env.OLD), F.col(OLD)), f"old value is not {vc.fmt}")
    df = flow.df.select(*env.COLUMNS, GROUP_KEY, NEW, OLD, env.SRC)
    types = df.schema
    adder, subtractor, initializer, fits = _selections(
        df, node, types[GROUP_KEY], types[NEW], step.value
    )
    jdf = _processors(df).aggregate(
        df._jdf,
        adder._jdf,
        subtractor._jdf,
        None if initializer is None else initializer._jdf,
        None if fits is None else fits._jdf,
        GROUP_KEY,
        NEW,
        OLD,
        env.SRC,
    )
    out = DataFrame(jdf, df.sparkSession)
    result = out.schema["value"].dataType
    value = Codec(step.value).encode(F.col("value"), result)
    # only an Avro serde's result can be unfit here: the fold refuses a change that would
    # make any other serde's (see _selections)
    unfit = ok() & F.col("value").isNotNull() & value.isNull()
    why = F.lit(f"{node.describe()}: the result does not fit {step.value!r}")
    out = out.withColumns({env.ERR: F.when(unfit, why).otherwise(F.col(env.ERR)), "value": value})
    return Flow(out, step.key, step.value, step.kind)


def _selections(
    df: DataFrame, node: plan.Aggregate, key: StructField, value: StructField, result: Serde
) -> tuple[DataFrame, DataFrame, DataFrame | None, DataFrame | None]:
    """The adder, subtractor and initializer as one-column selections over an empty frame of
    columns key, value and aggregate, cast to the aggregate's type (the processors bind
    them there), and whether the table's value serde can write an aggregate (None: an Avro
    serde, written in Python; checked after the fold). The aggregate's type is the
    initializer's, or a reduce's value type.

    They are analysed with ANSI mode on, in a session of their own (the pipeline's keeps
    the lenient mode): a Column that fails on a change (an overflow, a cast that does not
    hold) raises, and the change is dead-lettered, as a callable's is, where the lenient
    mode would make it null, which deletes the group."""
    spark = df.sparkSession.newSession()
    spark.conf.set("spark.sql.ansi.enabled", "true")
    fields = [StructField("key", key.dataType), StructField("value", value.dataType)]
    agg_type: DataType = value.dataType
    init = None if node.initializer is None else classic(node.initializer)  # type: ignore[arg-type]
    if init is not None:
        empty = spark.createDataFrame([], StructType(fields))
        agg_type = empty.select(init).schema[0].dataType
    agg = StructField("aggregate", agg_type)
    probe = spark.createDataFrame([], StructType([*fields, agg]))

    def selection(col: object) -> DataFrame:
        return probe.select(classic(col).cast(agg_type).alias("aggregate"))  # type: ignore[arg-type]

    start = None if node.initializer is None else selection(node.initializer)
    fits = None
    codec = Codec(result)
    if codec.fmt != "avro" and not _always_fits(codec.fmt, agg_type):
        written = codec.encode(F.col("aggregate"), agg_type)
        fits = probe.select((F.col("aggregate").isNull() | written.isNotNull()).alias("fits"))
    return selection(node.adder), selection(node.subtractor), start, fits


def _always_fits(fmt: str, agg_type: DataType) -> bool:
    """Whether the `fmt` serde writes every aggregate of `agg_type`: then no change needs the
    check (a check per change cost more than the fold itself)."""
    if fmt == "long":
        return isinstance(agg_type, LongType | IntegerType | ShortType | ByteType)
    if fmt == "string":
        return isinstance(agg_type, StringType)
    return fmt == "bytes" and isinstance(agg_type, BinaryType | StringType)


def _processors(df: DataFrame):  # type: ignore[no-untyped-def]
    """The JVM class that builds both steps (tablecast/_jvm/grouped-tables, on spark.jars)."""
    return df.sparkSession._jvm.tablecast.spark.GroupedTables  # type: ignore[attr-defined]
