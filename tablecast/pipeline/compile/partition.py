"""A ``to(topic, partitioner=...)``'s own choice of partition, per record.

By default Spark's Kafka sink partitions by murmur2 of the key bytes, as Kafka's
Java producer does. A partitioner is a Column over key/value or a callable
``f(key, value, partitions)``; a result outside [0, partitions) or an exception
sends the record to the dead-letter topic.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F

from tablecast.pipeline.compile.columns import classic
from tablecast.pipeline.compile.flow import Flow
from tablecast.pipeline.plan import nodes as plan

PARTITION = "_tc_partition"


def assign(flow: Flow, partitioner: plan.Fn, partitions: int) -> tuple[Flow, Column]:
    if isinstance(partitioner, Column):
        decoded = flow.decode()
        flow = decoded.with_df(
            decoded.df.withColumn(PARTITION, classic(partitioner).cast("int"))
        ).encode()
    else:
        flow = flow.encode()
        udf = _python(partitioner, flow, partitions)
        flow = flow.with_df(flow.df.withColumn(PARTITION, udf(F.col("key"), F.col("value"))))
    p = F.col(PARTITION)
    flow = flow.fail_where(p.isNull() | (p < 0) | (p >= partitions), "partitioner failed")
    return flow, p


def _python(fn: Any, flow: Flow, partitions: int) -> Any:
    from pyspark.sql.functions import pandas_udf

    kd, vd = flow.key.deserialize, flow.value.deserialize

    @pandas_udf("int")  # type: ignore[call-overload]
    def partition(keys, values):  # type: ignore[no-untyped-def]
        import pandas as pd

        def one(kb: bytes | None, vb: bytes | None) -> int | None:
            try:
                k = None if kb is None else kd(kb)
                return int(fn(k, None if vb is None else vd(vb), partitions))
            except Exception:  # a failing partitioner dead-letters the record
                return None

        return pd.Series([one(k, v) for k, v in zip(keys, values, strict=True)], dtype="Int32")

    return partition
