"""Column joiners: a joiner given as a Column over ``left`` and ``right``.

The join steps (:class:`.join.StreamJoin`, :class:`.join.TableJoin`,
:class:`.stream_join.StreamStreamJoin`) decide in Python, over their state, *which*
values meet; what a pair becomes depends on the pair alone, so Spark can compute it
after them. For a Column joiner the step is handed :func:`pair` as its joiner and
passes each pair's bytes on as they are (each side in its own serde), packed in one
value (:class:`PairBytes`); :func:`finish` then unpacks it in the JVM, decodes ``left``
and ``right`` as every Column operator sees ``value`` (JSON: a VARIANT, so
``left:price`` or ``variant_get("left", ...)`` work), evaluates the Column and writes
its result in the join's value serde. A missing side (a left or outer join's) is a
null ``left``/``right``; a null result is a null value, as a callable's None is; a
result that does not fit the serde marks its record bad.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

from tablecast import serde as serdes
from tablecast.pipeline.plan import nodes as plan
from tablecast.serde import Serde, SerdeError

if TYPE_CHECKING:
    from tablecast.pipeline.compile.flow import Flow

#: flags byte (1: left present, 2: right present), left's length (4 bytes big-endian),
#: left's bytes, right's bytes
_HEAD = struct.Struct(">BI")
_TMP = "_tc_joined"


def pair(left: bytes | None, right: bytes | None) -> tuple[bytes | None, bytes | None]:
    """The joiner a join step runs for a Column joiner: the pair, as it is."""
    return left, right


class PairBytes(Serde):
    """A joined pair of encoded values as one value (what :func:`finish` unpacks)."""

    format = "joined-pair"

    def serialize(self, obj: Any) -> bytes:
        left, right = obj
        flags = (left is not None) | (right is not None) << 1
        return _HEAD.pack(flags, len(left or b"")) + (left or b"") + (right or b"")

    def deserialize(self, data: bytes) -> Any:
        try:
            flags, n = _HEAD.unpack_from(data)
        except struct.error as e:
            raise SerdeError(str(e)) from None
        left, right = data[5 : 5 + n], data[5 + n :]
        return (left if flags & 1 else None), (right if flags & 2 else None)

    def spec(self) -> dict[str, Any]:
        return {"format": self.format}


def python_form(
    joiner: Any, left: Serde, right: Serde, result: Serde
) -> tuple[Any, Serde, Serde, Serde]:
    """(joiner, left serde, right serde, result serde) for a join step to run: as given for
    a Python joiner; for a Column joiner, the pair passed on as bytes."""
    if not plan.is_column(joiner):
        return joiner, left, right, result
    raw = serdes.bytes_()
    return pair, raw, raw, PairBytes()


def finish(flow: Flow, joiner: Any, left: Serde, right: Serde) -> Flow:
    """A join step's output with a Column joiner evaluated over each pair (`flow` as is
    for a Python joiner). `flow`'s value serde is the join's result serde."""
    if not plan.is_column(joiner):
        return flow
    from pyspark.sql import functions as F

    from tablecast.pipeline.compile.codecs import Codec
    from tablecast.pipeline.compile.columns import classic
    from tablecast.pipeline.compile.flow import ok

    v = F.col("value")
    flags = F.conv(F.hex(F.substring(v, 1, 1)), 16, 10).cast("int")
    n = F.conv(F.hex(F.substring(v, 2, 4)), 16, 10).cast("int")
    left_b = v.substr(F.lit(6), n)
    right_b = v.substr(n + 6, F.length(v) - n - 5)
    paired = ok() & v.isNotNull()  # bad rows keep the bytes they were read with
    df = flow.df.withColumns(
        {
            "left": F.when(paired & (flags.bitwiseAND(1) != 0), Codec(left).decode(left_b)),
            "right": F.when(paired & (flags.bitwiseAND(2) != 0), Codec(right).decode(right_b)),
        }
    )
    df = df.withColumn(_TMP, F.when(paired, classic(joiner)))
    enc = Codec(flow.value).encode(F.col(_TMP), df.schema[_TMP].dataType)
    df = df.withColumn("_tc_enc", enc)
    out = flow.with_df(df).fail_where(
        paired & F.col(_TMP).isNotNull() & F.col("_tc_enc").isNull(),
        f"join: the joiner's value does not fit {flow.value!r}",
    )
    value = F.when(paired & ok(), F.col("_tc_enc")).otherwise(F.col("value"))
    # a row just marked bad keeps its pair bytes: what the dead-letter topic shows is the
    # source record's (the envelope's raw columns), not this value
    df = out.df.withColumn("value", value).drop("left", "right", _TMP, "_tc_enc")
    return out.with_df(df)
