"""A query's rows between steps: the DataFrame and what its key/value columns hold.

Rows are either *encoded* (key and value are the bytes of their serdes: what
Python workers and stateful steps take) or *decoded* (Spark-typed columns that
users' Column expressions work on). Switching is done in the JVM where the
format allows; a value that does not decode or encode marks its row bad.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from tablecast.pipeline.compile import envelope as env
from tablecast.pipeline.compile.codecs import Codec
from tablecast.pipeline.plan.nodes import Kind
from tablecast.serde import Serde


def ok() -> Column:
    """True for good rows (a function, not a constant: workers import this module without Spark)."""
    return F.col(env.ERR).isNull()


#: where decode() keeps the bytes it decoded
BYTES = {"key": "_tc_bk", "value": "_tc_bv"}


@dataclass(frozen=True)
class Flow:
    df: DataFrame
    key: Serde
    value: Serde
    kind: Kind
    decoded: bool = False
    #: which of key/value a Column operator changed since decode(); the others are
    #: written back as the bytes they were read as (no re-encoding, byte-identical)
    changed: frozenset[str] = frozenset()
    #: set by query.read when good rows cross to the retraction lean: their raw bytes and
    #: topic columns are null, standing for their key and value and this topic
    lean_topic: str | None = None
    #: set by query.read when the values were not checked as JSON in the JVM: the
    #: retraction checks every record's in Python (aggregate.retract)
    json_unchecked: bool = False

    def with_df(self, df: DataFrame, **changes: object) -> Flow:
        return replace(self, df=df, **changes)  # type: ignore[arg-type]

    def fail_where(self, cond: Column, reason: Column | str) -> Flow:
        """Mark good rows where `cond` holds as bad, for `reason`."""
        why = F.lit(reason) if isinstance(reason, str) else reason
        err = F.when(ok() & F.coalesce(cond, F.lit(False)), why).otherwise(F.col(env.ERR))
        return self.with_df(self.df.withColumn(env.ERR, err))

    def decode(self) -> Flow:
        if self.decoded:
            return self
        kc, vc = Codec(self.key), Codec(self.value)
        # keep the bytes aside first: validity is judged on them after decoding
        df = self.df.withColumns({"_tc_bk": F.col("key"), "_tc_bv": F.col("value")})
        raw_k, raw_v = F.col("_tc_bk"), F.col("_tc_bv")
        df = df.withColumns({"key": kc.decode(raw_k), "value": vc.decode(raw_v)})
        flow = self.with_df(df, decoded=True)
        flow = flow.fail_where(~kc.valid(F.col("_tc_bk"), F.col("key")), f"key is not {kc.fmt}")
        flow = flow.fail_where(~vc.valid(F.col("_tc_bv"), F.col("value")), f"value is not {vc.fmt}")
        return flow.with_df(flow.df, changed=frozenset())

    def validate(self, value: bool = True) -> Flow:
        """Mark rows whose bytes do not decode as bad, keeping the bytes (the key's only,
        unless `value`)."""
        flow = self
        for col, sd in (("key", self.key), ("value", self.value))[: 2 if value else 1]:
            codec = Codec(sd)
            raw = F.col(col)
            flow = flow.fail_where(
                ~codec.valid(raw, codec.decode(raw)), f"{col} is not {codec.fmt}"
            )
        return flow

    def bytes_of(self, col: str) -> Column:
        """Decoded `col` ("key" or "value") as its serde's bytes: as read, unless a Column
        operator changed it (then null where it does not fit the serde)."""
        if col not in self.changed:
            return F.col(BYTES[col])
        sd = self.key if col == "key" else self.value
        return Codec(sd).encode(F.col(col), self.df.schema[col].dataType)

    def encode(self) -> Flow:
        if not self.decoded:
            return self
        flow = self
        encoded = {}
        for col, sd in (("key", self.key), ("value", self.value)):
            if col not in self.changed:
                encoded[col] = self.bytes_of(col)
                continue
            tmp = f"_tc_e{col}"
            flow = flow.with_df(flow.df.withColumn(tmp, self.bytes_of(col)))
            # a value that was there but has no bytes in this serde is a bad record, not a delete
            flow = flow.fail_where(
                F.col(col).isNotNull() & F.col(tmp).isNull(), f"{col} does not fit {sd!r}"
            )
            encoded[col] = F.col(tmp)
        df = flow.df.withColumns(encoded).drop("_tc_ekey", "_tc_evalue", *BYTES.values())
        return flow.with_df(df, decoded=False, changed=frozenset())

    def envelope(self, *extra: str) -> Flow:
        """Encoded, with exactly the envelope's columns in order (what Python steps take)."""
        flow = self.encode()
        return flow.with_df(flow.df.select(*env.COLUMNS, *extra))
