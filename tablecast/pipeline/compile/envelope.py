"""The columns every row carries through a query, beside ``key`` and ``value``.

``_tc_err`` is null for a good row and the reason for a bad one; the raw
source bytes and coordinates travel along so a bad row reaches the dead-letter
topic as it was read, and so stateful steps can order a key's rows by
(partition, offset, seq) — seq numbers the records one source record became.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tablecast.pipeline.compile.pyworker import ERR, SEQ

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

RAW_KEY = "_tc_rk"
RAW_VALUE = "_tc_rv"
TOPIC = "_tc_topic"
PART = "_tc_part"
OFF = "_tc_off"
# on a repartition topic: the retracted value, the writing batch, the record id
OLD = "_tc_old"
BATCH = "_tc_batch"
RID = "_tc_rid"
# read by a windowed aggregation: the record's Kafka timestamp in epoch ms
TS = "_tc_ts"

COLUMNS = ["key", "value", ERR, RAW_KEY, RAW_VALUE, TOPIC, PART, OFF, SEQ]
ORDER = [PART, OFF, SEQ]

__all__ = ["BATCH", "COLUMNS", "ERR", "OFF", "OLD", "ORDER", "PART", "RID", "SEQ", "TOPIC", "TS"]


def schema(*extra: str) -> StructType:
    """The envelope with binary key/value (plus `extra` binary/long columns)."""
    from pyspark.sql.types import (
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    types = {
        "key": BinaryType(),
        "value": BinaryType(),
        ERR: StringType(),
        RAW_KEY: BinaryType(),
        RAW_VALUE: BinaryType(),
        TOPIC: StringType(),
        PART: IntegerType(),
        OFF: LongType(),
        SEQ: LongType(),
        OLD: BinaryType(),
        BATCH: LongType(),
        RID: BinaryType(),
        TS: LongType(),
    }
    return StructType([StructField(c, types[c], True) for c in [*COLUMNS, *extra]])
