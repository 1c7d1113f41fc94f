"""Serde formats as Spark column expressions, so decoding stays in the JVM.

For each format: ``decode`` turns the raw Kafka ``binary`` column into the
column users' expressions see, ``valid`` says which raw values decode at all
(the others go to the dead-letter topic), and ``encode`` turns a column back
into bytes. Schema-less JSON is a VARIANT, so ``value:price`` style access and
``variant_get`` work on it and it round-trips to JSON text; JSON with a schema
is the struct the schema's DDL says. Avro has no JVM reader here (spark-avro is
not among the jars), so its bytes are translated to and from JSON text in
Python workers with fastavro, and the column is the struct its schema maps to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, MapType, StructType, VariantType

from tablecast.serde import Serde


@dataclass(frozen=True)
class Codec:
    serde: Serde

    @property
    def fmt(self) -> str:
        return self.serde.format

    def decode(self, raw: Column) -> Column:
        fmt = self.fmt
        if fmt == "string":
            return raw.cast("string")
        if fmt == "json":
            text = raw.cast("string")
            schema = getattr(self.serde, "schema", None)
            return F.from_json(text, schema) if schema else F.try_parse_json(text)
        if fmt == "long":
            return self.long_from_bytes(raw)
        if fmt == "bytes":
            return raw
        if fmt == "avro":
            return F.from_json(_avro_to_json(self.serde)(raw), avro_ddl(self.serde.raw_schema))  # type: ignore[attr-defined]
        raise NotImplementedError(f"the {fmt} serde has no column form")

    def valid(self, raw: Column, decoded: Column) -> Column:
        """True where a non-null raw value decodes; null raw values are always valid."""
        fmt = self.fmt
        if fmt == "string":
            ok = F.is_valid_utf8(raw)
        elif fmt == "json" and getattr(self.serde, "schema", None):
            ok = F.try_parse_json(raw.cast("string")).isNotNull()
        elif fmt in ("json", "avro"):
            ok = decoded.isNotNull()
        elif fmt == "long":
            ok = F.length(raw) == 8
        else:
            ok = F.lit(True)
        return raw.isNull() | ok

    def encode(self, col: Column, dtype: DataType) -> Column:
        """`col` (of Spark type `dtype`) as bytes; null where it does not fit the serde."""
        fmt = self.fmt
        if fmt == "string":
            return col.cast("string").cast("binary")
        if fmt == "json":
            return json_text(col, dtype).cast("binary")
        if fmt == "long":
            return self.long_bytes(col)
        if fmt == "bytes":
            return col.cast("binary")
        if fmt == "avro":
            return _json_to_avro(self.serde)(json_text(col, dtype))
        raise NotImplementedError(f"the {fmt} serde has no column form")

    @staticmethod
    def long_bytes(col: Column) -> Column:
        """8 bytes big-endian, as Kafka's LongSerializer writes."""
        return F.unhex(F.lpad(F.hex(col.cast("bigint")), 16, "0"))

    @staticmethod
    def long_from_bytes(raw: Column) -> Column:
        # a negative target base makes conv read the 64 bits as a signed number
        return F.when(F.length(raw) == 8, F.conv(F.hex(raw), 16, -10).cast("bigint"))


def json_text(col: Column, dtype: DataType) -> Column:
    if isinstance(dtype, StructType | ArrayType | MapType | VariantType):
        return F.to_json(col)
    # to_json takes only containers and variants: a number or string goes through a variant
    return F.to_json(col.cast("variant"))


def _per_value(return_type: str, fn: Any) -> Any:
    """A pandas UDF applying `fn` to each non-null value; a value it fails on becomes
    null, which the caller turns into a bad row."""
    from pyspark.sql.functions import pandas_udf

    def one(x: Any) -> Any:
        if x is None:
            return None
        try:
            return fn(x)
        except Exception:  # undecodable / does not fit the schema: null marks the row bad
            return None

    @pandas_udf(return_type)  # type: ignore[call-overload]
    def per_value(col):  # type: ignore[no-untyped-def]
        return col.map(one)

    return per_value


def _avro_to_json(sd: Serde) -> Any:
    return _per_value("string", lambda b: orjson.dumps(sd.deserialize(b)).decode())


def _json_to_avro(sd: Serde) -> Any:
    return _per_value("binary", lambda t: sd.serialize(orjson.loads(t)))


_AVRO_PRIMITIVES = {
    "null": "string",
    "boolean": "boolean",
    "int": "int",
    "long": "bigint",
    "float": "float",
    "double": "double",
    "bytes": "binary",
    "string": "string",
}


def avro_ddl(schema: Any) -> str:
    """The Spark type (DDL) an Avro schema's JSON form decodes to."""
    if isinstance(schema, str):
        return _AVRO_PRIMITIVES.get(schema, "string")
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        return avro_ddl(branches[0]) if len(branches) == 1 else "string"
    t = schema.get("type")
    if t == "record":
        fields = ", ".join(f"`{f['name']}`: {avro_ddl(f['type'])}" for f in schema["fields"])
        return f"struct<{fields}>"
    if t == "array":
        return f"array<{avro_ddl(schema['items'])}>"
    if t == "map":
        return f"map<string, {avro_ddl(schema['values'])}>"
    if t == "enum":
        return "string"
    return avro_ddl(t)
