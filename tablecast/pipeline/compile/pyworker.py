"""Python callables of stateless operators, run over Arrow batches in Python workers.

Consecutive Python operators are fused into one :class:`Run`: a batch's keys
and values are decoded once with the plain-Python serdes, passed through every
operator as Python objects, and encoded once. A record whose function raises
(or whose bytes do not decode, or whose result does not encode) becomes an
error row; the compiler routes error rows to the dead-letter topic.

Kafka Streams' meaning of each operator depends on whether it applies to a
stream (records are events; a None value is just a value) or to a table
(records are upserts; a None value is a delete that passes through).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tablecast.pipeline.compile.envelope import ERR, SEQ
from tablecast.serde import Serde

if TYPE_CHECKING:
    import pyarrow as pa

Record = tuple[Any, Any]
RecordFn = Callable[[Any, Any], list[Record]]

#: sub-records of one record (flat_map) are numbered seq * FANOUT + i
FANOUT = 1 << 16


def _pair(result: Any, op: str) -> Record:
    if not isinstance(result, tuple | list) or len(result) != 2:
        raise TypeError(f"{op} must return a (key, value) pair, not {result!r}")
    return result[0], result[1]


def record_fn(op: str, fn: Callable[..., Any], kind: str) -> RecordFn:
    """One operator as f(key, value) -> records it emits."""
    if kind == "table":
        if op == "filter":
            return lambda k, v: [(k, v if v is None or fn(k, v) else None)]
        if op == "map_values":
            return lambda k, v: [(k, None if v is None else fn(k, v))]
        if op == "select_group":
            # a deleted row, or a selection without key or value, contributes to no group
            def select(k: Any, v: Any) -> list[Record]:
                if v is None:
                    return [(k, None)]
                r = fn(k, v)
                if r is None:
                    return [(k, None)]
                gk, gv = _pair(r, "group_by")
                return [(k, None if gk is None or gv is None else (gk, gv))]

            return select
    if op == "filter":
        return lambda k, v: [(k, v)] if fn(k, v) else []
    if op == "map_values":
        return lambda k, v: [(k, fn(k, v))]
    if op == "map":
        return lambda k, v: [_pair(fn(k, v), "map")]
    if op == "flat_map_values":
        return lambda k, v: [(k, x) for x in (fn(k, v) or ())]
    if op == "flat_map":
        return lambda k, v: [_pair(r, "flat_map") for r in (fn(k, v) or ())]
    if op == "select_key":
        return lambda k, v: [(fn(k, v), v)]
    if op == "peek":

        def peek(k: Any, v: Any) -> list[Record]:
            fn(k, v)
            return [(k, v)]

        return peek
    if op == "identity":
        return lambda k, v: [(k, v)]
    raise ValueError(f"no {kind} operator {op!r}")


@dataclass(frozen=True)
class Step:
    op: str
    fn: RecordFn


@dataclass(frozen=True)
class Run:
    """Fused Python operators between two serde boundaries."""

    steps: tuple[Step, ...]
    key_in: Serde
    value_in: Serde
    key_out: Serde
    value_out: Serde

    def apply(
        self,
        keys: list[bytes | None],
        values: list[bytes | None],
        errors: list[str | None],
        seqs: list[int],
    ) -> tuple[list[int], list[int], list[bytes | None], list[bytes | None], list[str | None]]:
        """Per output row: (input row index, seq, key bytes, value bytes, error)."""
        idx: list[int] = []
        out_seq: list[int] = []
        out_k: list[bytes | None] = []
        out_v: list[bytes | None] = []
        out_err: list[str | None] = []
        kd, vd = self.key_in.deserialize, self.value_in.deserialize
        ke, ve = self.key_out.serialize, self.value_out.serialize
        for i, (kb, vb, err) in enumerate(zip(keys, values, errors, strict=True)):
            if err is not None:
                idx.append(i)
                out_seq.append(seqs[i])
                out_k.append(kb)
                out_v.append(vb)
                out_err.append(err)
                continue
            stage = "decode"
            try:
                records: list[Record] = [
                    (None if kb is None else kd(kb), None if vb is None else vd(vb))
                ]
                for step in self.steps:
                    stage = step.op
                    nxt: list[Record] = []
                    for k, v in records:
                        nxt.extend(step.fn(k, v))
                    records = nxt
                stage = "encode"
                encoded = [
                    (None if k is None else ke(k), None if v is None else ve(v)) for k, v in records
                ]
            except Exception as e:  # any user error: this record goes to the dead-letter topic
                idx.append(i)
                out_seq.append(seqs[i])
                out_k.append(kb)
                out_v.append(vb)
                out_err.append(f"{stage}: {type(e).__name__}: {e}"[:1000])
                continue
            many = len(encoded) > 1
            for j, (k, v) in enumerate(encoded):
                idx.append(i)
                out_seq.append(seqs[i] * FANOUT + j if many else seqs[i])
                out_k.append(k)
                out_v.append(v)
                out_err.append(None)
        return idx, out_seq, out_k, out_v, out_err

    def one_row(self, key: bytes | None, value: bytes | None) -> tuple[bytes | None, str | None]:
        """The value bytes of a one-to-one run's record (None: it drops or deletes the
        row), or the error that sends the record to the dead-letter topic."""
        _, _, _, values, errors = self.apply([key], [value], [None], [0])
        return (values[0], errors[0]) if values else (None, None)

    def map_batches(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The mapInArrow function: other columns are carried along with Arrow's take()."""
        import pyarrow as pa

        for batch in batches:
            idx, seq, k, v, err = self.apply(
                batch.column("key").to_pylist(),
                batch.column("value").to_pylist(),
                batch.column(ERR).to_pylist(),
                batch.column(SEQ).to_pylist(),
            )
            take = pa.array(idx, pa.int64())
            new = {
                "key": pa.array(k, pa.binary()),
                "value": pa.array(v, pa.binary()),
                ERR: pa.array(err, pa.string()),
                SEQ: pa.array(seq, pa.int64()),
            }
            cols = [
                new[name] if name in new else batch.column(name).take(take)
                for name in batch.schema.names
            ]
            schema = pa.schema(
                [pa.field(f.name, new[f.name].type) if f.name in new else f for f in batch.schema]
            )
            yield pa.RecordBatch.from_arrays(cols, schema=schema)
