"""The columns every row carries through a query, beside ``key`` and ``value``.

``_tc_err`` is null for a good row and the reason for a bad one; the raw
source bytes and coordinates travel along so a bad row reaches the dead-letter
topic as it was read, and so stateful steps can order a key's rows by
(partition, offset, seq) — seq numbers the records one source record became —
and each output record carries the timestamp of the input that produced it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

ERR = "_tc_err"
SEQ = "_tc_seq"
RAW_KEY = "_tc_rk"
RAW_VALUE = "_tc_rv"
TOPIC = "_tc_topic"
PART = "_tc_part"
OFF = "_tc_off"
# the timestamp (epoch ms) of the input record a row came from: windows read it, and
# every record written carries it (aggregates: the largest of their inputs')
TS = "_tc_ts"
# on a repartition topic: the retracted value, the writing batch, the record id, and
# the key of the source row the change came from
OLD = "_tc_old"
BATCH = "_tc_batch"
RID = "_tc_rid"
SRC = "_tc_src"
#: the columns a repartition topic's reader adds to the envelope
REPARTITION = (OLD, BATCH, RID, SRC)

COLUMNS = ["key", "value", ERR, RAW_KEY, RAW_VALUE, TOPIC, PART, OFF, SEQ, TS]
#: what only a bad row's record needs (the dead-letter topic takes its source bytes and
#: topic): a good row may cross to Python without them (query.read, Flow.lean_topic)
LEAN = (RAW_KEY, RAW_VALUE, TOPIC)
ORDER = [PART, OFF, SEQ]

__all__ = [
    "BATCH",
    "COLUMNS",
    "ERR",
    "LEAN",
    "OFF",
    "OLD",
    "ORDER",
    "PART",
    "REPARTITION",
    "RID",
    "SEQ",
    "SRC",
    "TOPIC",
    "TS",
]


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
        SRC: BinaryType(),
        TS: LongType(),
    }
    return StructType([StructField(c, types[c], True) for c in [*COLUMNS, *extra]])
