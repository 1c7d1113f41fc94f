"""A table's secondary index values, computed per row into the ``tc-index`` record header.

The header is the contract of :mod:`tablecast.contract.index_codec` (docs/table-topics.md):
a JSON object from index name to a value, a list of values, or null. An index
is a Column over key/value, evaluated in the JVM and serialized with
``to_json``, or a Python callable ``f(key, value)``, run in a pandas UDF and
serialized with :func:`tablecast.contract.index_codec.encode_header` — the node's own
check, so a header the pipeline writes is one the node accepts. With both
kinds, the two JSON objects are joined into one.

A tombstone gets no header. A callable that raises, or a value the contract
refuses (a bool, NaN, a dict, a nested list, a string over 1024 bytes, more
than 1000 values), sends the record to the dead-letter topic — what a failing
operator does — so a table never holds a row whose index values were lost
silently. ``None`` inside a list is skipped and an empty list is no value
(what the node makes of them anyway), so a list of optional fields is not a
bad record. A Column of a type the contract
has no values for (boolean, struct, map, decimal, ...) is refused when the
query is built.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    ByteType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
)

from tablecast.contract import index_codec as contract
from tablecast.pipeline.compile.columns import classic
from tablecast.pipeline.compile.flow import Flow
from tablecast.pipeline.compile.sink import present
from tablecast.pipeline.plan import nodes as plan

#: the row's header value (binary JSON, null: no header)
INDEX = "_tc_index"
_COLS_JSON = "_tc_index_cols"
_PY = "_tc_index_py"
_ATOMS = (StringType, ByteType, ShortType, IntegerType, LongType, FloatType, DoubleType)


def apply(flow: Flow, indexes: tuple[tuple[str, plan.Fn], ...]) -> tuple[Flow, Column]:
    """`flow` (encoded) with each good row's header value, and the headers column to send."""
    columns = [(n, f) for n, f in indexes if isinstance(f, Column)]
    callables = [(n, f) for n, f in indexes if not isinstance(f, Column)]
    parts = []
    if columns:
        flow = _columns(flow, columns)
        parts.append(F.col(_COLS_JSON))
    flow = flow.encode()
    if callables:
        flow = _callables(flow, callables)
        parts.append(F.col(_PY).getField("h").cast("string"))
    joined = parts[0] if len(parts) == 1 else _join(*parts)
    live = F.col("value").isNotNull()  # a tombstone carries no index values
    df = flow.df.withColumn(INDEX, F.when(live, joined.cast("binary")))
    df = df.drop(_COLS_JSON, _PY)
    headers = present((contract.HEADER, F.col(INDEX)))
    return flow.with_df(df), headers


def _columns(flow: Flow, columns: list[tuple[str, plan.Fn]]) -> Flow:
    """The Column indexes' JSON object, on decoded rows; refused values fail the row."""
    flow = flow.decode()
    df = flow.df
    fields = []
    for name, fn in columns:
        col = classic(fn)
        dtype = df.select(col.alias("x")).schema["x"].dataType
        _check_type(name, dtype)
        if isinstance(dtype, ArrayType):
            col = F.filter(col, lambda x: x.isNotNull())  # None in a list adds no value
            col = F.when(F.size(col) > 0, col)  # nor does an empty list: no name at all
        tmp = f"_tc_ix_{len(fields)}"
        df = df.withColumn(tmp, col)
        flow = flow.with_df(df)
        for cond, why in _refused(F.col(tmp), dtype):
            flow = flow.fail_where(F.col("value").isNotNull() & cond, f"index {name}: {why}")
        df = flow.df
        fields.append((tmp, name))
    # to_json leaves null fields out: an absent name is no value, as null is
    obj = F.to_json(F.struct(*[F.col(tmp).alias(name) for tmp, name in fields]))
    df = df.withColumn(_COLS_JSON, F.when(obj != F.lit("{}"), obj))
    return flow.with_df(df.drop(*(tmp for tmp, _ in fields)))


def _check_type(name: str, dtype: DataType) -> None:
    inner = dtype.elementType if isinstance(dtype, ArrayType) else dtype
    if not isinstance(inner, _ATOMS):
        raise TypeError(
            f"index {name!r}: a Column of {dtype.simpleString()} has no index values; "
            "return a string, an integer, a float or an array of them (cast it; of a JSON "
            "value take a field with F.variant_get(F.col('value'), '$.field', 'string'))"
        )


def _refused(col: Column, dtype: DataType) -> list[tuple[Column, str]]:
    """(condition, reason) pairs for values of `col` that the contract refuses."""
    inner = dtype.elementType if isinstance(dtype, ArrayType) else dtype

    def bad(x: Column) -> Column:
        if isinstance(inner, FloatType | DoubleType):
            return F.isnan(x) | (F.abs(x) == F.lit(float("inf")))
        if isinstance(inner, StringType):
            return F.octet_length(x) > contract.MAX_STRING_BYTES
        return F.lit(False)

    if not isinstance(dtype, ArrayType):
        return [(bad(col), "a value the index contract refuses (NaN, infinity, long string)")]
    return [
        (F.size(col) > contract.MAX_VALUES, f"more than {contract.MAX_VALUES} values"),
        (F.exists(col, bad), "a value the index contract refuses (NaN, infinity, long string)"),
    ]


def _callables(flow: Flow, callables: list[tuple[str, plan.Fn]]) -> Flow:
    """The callable indexes' JSON object, from a pandas UDF on encoded rows."""
    udf = _python(callables, flow)
    flow = flow.with_df(flow.df.withColumn(_PY, udf(F.col("key"), F.col("value"))))
    err = F.col(_PY).getField("e")
    return flow.fail_where(err.isNotNull(), F.concat(F.lit("index: "), err))


def _python(callables: list[tuple[str, Any]], flow: Flow) -> Any:
    from pyspark.sql.functions import pandas_udf

    kd, vd = flow.key.deserialize, flow.value.deserialize

    @pandas_udf("h binary, e string")  # type: ignore[call-overload]
    def index(keys, values):  # type: ignore[no-untyped-def]
        import pandas as pd

        heads, errors = [], []
        for kb, vb in zip(keys, values, strict=True):
            h, e = None, None
            if vb is not None:  # a tombstone: no values, nothing to call
                try:
                    h = header_of(callables, None if kb is None else kd(kb), vd(vb))
                except Exception as ex:  # a failing index dead-letters the record
                    e = f"{type(ex).__name__}: {ex}"
            heads.append(h)
            errors.append(e)
        return pd.DataFrame({"h": heads, "e": errors})

    return index


def header_of(callables: list[tuple[str, Any]], key: Any, value: Any) -> bytes | None:
    """The header for one row's callable index values (None: no value under any index)."""
    values = {}
    for name, fn in callables:
        v = fn(key, value)
        if isinstance(v, list | tuple):
            v = [x for x in v if x is not None]  # None in a list adds no value
        if v is not None and v != []:
            values[name] = v
    return contract.encode_header(values) if values else None


def _join(a: Column, b: Column) -> Column:
    """Two JSON objects' text as one object (either may be null: no values)."""
    both = F.concat(
        a.substr(F.lit(1), F.length(a) - 1), F.lit(","), b.substr(F.lit(2), F.length(b))
    )
    return F.when(a.isNull(), b).when(b.isNull(), a).otherwise(both)
