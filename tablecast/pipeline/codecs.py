"""Serde formats as Spark column expressions, so decoding stays in the JVM.

For each format: ``decode`` turns the raw Kafka ``binary`` column into the
column users' expressions see, ``valid`` says which raw values decode at all
(the others go to the dead-letter topic), and ``encode`` turns a column back
into bytes. Schema-less JSON is a VARIANT, so ``value:price`` style access and
``variant_get`` work on it and it round-trips to JSON text.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column
from pyspark.sql import functions as F

from tablecast.serde import Serde


@dataclass(frozen=True)
class Codec:
    serde: Serde

    def decode(self, raw: Column) -> Column:
        fmt = self.serde.format
        if fmt == "string":
            return raw.cast("string")
        if fmt == "json":
            text = raw.cast("string")
            schema = getattr(self.serde, "schema", None)
            return F.from_json(text, schema) if schema else F.try_parse_json(text)
        if fmt == "long":
            unsigned = F.conv(F.hex(raw), 16, 10).cast("decimal(20,0)")
            signed = F.when(unsigned >= F.lit(2**63), unsigned - F.lit(2**64)).otherwise(unsigned)
            return signed.cast("bigint")
        if fmt == "bytes":
            return raw
        raise NotImplementedError(f"the {fmt} serde is not decoded in the JVM yet")

    def valid(self, raw: Column, decoded: Column) -> Column:
        """True where a non-null raw value decodes; null raw values are always valid."""
        fmt = self.serde.format
        if fmt == "string":
            ok = F.is_valid_utf8(raw)
        elif fmt == "json":
            ok = decoded.isNotNull()
        elif fmt == "long":
            ok = F.length(raw) == 8
        else:
            ok = F.lit(True)
        return raw.isNull() | ok

    def encode(self, col: Column) -> Column:
        fmt = self.serde.format
        if fmt == "string":
            return col.cast("string").cast("binary")
        if fmt == "json":
            return F.to_json(col).cast("binary")
        if fmt == "long":
            return F.unhex(F.lpad(F.hex(col.cast("bigint")), 16, "0"))
        if fmt == "bytes":
            return col.cast("binary")
        raise NotImplementedError(f"the {fmt} serde is not encoded in the JVM yet")
