"""Stateless operators on a query's rows: Column forms in the JVM, callables in Python.

A Column operator is a DataFrame transformation on decoded rows. Consecutive
Python callables are fused into one ``mapInArrow`` over encoded rows (see
:mod:`tablecast.pipeline.pyworker`). Bad rows pass every operator untouched.
"""

from __future__ import annotations

from dataclasses import replace

from pyspark.sql import Column
from pyspark.sql import functions as F

from tablecast.pipeline.compile import envelope as env
from tablecast.pipeline.compile.codecs import Codec
from tablecast.pipeline.compile.columns import classic
from tablecast.pipeline.compile.flow import BYTES, Flow, ok
from tablecast.pipeline.compile.pyworker import FANOUT, Run, record_fn
from tablecast.pipeline.compile.pyworker import Step as PyStep
from tablecast.pipeline.plan import nodes as plan
from tablecast.pipeline.plan.queries import Step
from tablecast.pipeline.plan.wire import PairSerde


def op_name(step: Step) -> str:
    if step.what == "select_group":
        return "select_group"
    node = step.node
    return node.name if isinstance(node, plan.Op) else "identity"


def apply_python(flow: Flow, steps: list[Step], extra: tuple[str, ...] = ()) -> Flow:
    """Fused callables over Arrow batches: one decode and one encode per record
    (`extra` columns are carried along, each output row with its input row's)."""
    flow = flow.envelope(*extra)
    run = python_run(flow, steps)
    df = flow.df.mapInArrow(run.map_batches, flow.df.schema)
    last = steps[-1]
    return Flow(df, last.key, last.value, last.kind)


def python_run(flow: Flow, steps: list[Step]) -> Run:
    """The callables of `steps`, fused, from `flow`'s serdes to the last step's."""
    fns = []
    for s in steps:
        fn = getattr(s.node, "fn", None)
        fns.append(PyStep(op_name(s), record_fn(op_name(s), fn, _kind(s)) if fn else _identity))
    last = steps[-1]
    return Run(tuple(fns), flow.key, flow.value, last.key, last.value)


def _kind(step: Step) -> str:
    return step.node.parent.kind if step.what == "op" and step.node.parent else "table"


def selects_per_row(steps: list[Step]) -> bool:
    """Whether `steps` are a table's per-row callables ending in its group_by selection:
    each maps one row to exactly one row (filter and map_values of a table, the
    selection), so only a row's latest value in a micro-batch needs them (see
    :func:`tablecast.pipeline.compile.aggregate.retract`)."""
    if not steps or steps[-1].what != "select_group":
        return False
    return all(
        s.what == "select_group" or (op_name(s) in ("filter", "map_values") and _kind(s) == "table")
        for s in steps
    )


def _identity(k: object, v: object) -> list[tuple[object, object]]:
    return [(k, v)]


def apply_column(flow: Flow, step: Step) -> Flow:
    node = step.node
    if step.what == "select_group":
        return _select_group(flow.decode(), step)
    if not isinstance(node, plan.Op):  # to_table / to_stream: only the meaning changes
        return replace(flow, kind=step.kind)
    flow = flow.decode()
    fn = node.fn
    df = flow.df
    on_table = node.parent is not None and node.parent.kind == "table"
    if on_table and node.name == "filter":
        drop = ok() & F.col("value").isNotNull() & ~F.coalesce(_col(fn), F.lit(False))
        # the bytes kept by decode() are deleted too, so an unchanged value stays unchanged
        deleted = {
            c: F.when(drop, F.lit(None)).otherwise(F.col(c)) for c in ("value", BYTES["value"])
        }
        df = df.withColumns(deleted)
    elif on_table and node.name == "map_values":
        df = df.withColumn("value", F.when(ok() & F.col("value").isNotNull(), _col(fn)))
    elif node.name == "filter":
        df = df.filter(~ok() | F.coalesce(_col(fn), F.lit(False)))
    elif node.name == "map_values":
        df = df.withColumn("value", F.when(ok(), _col(fn)))
    elif node.name == "select_key":
        df = df.withColumn("key", F.when(ok(), _col(fn)))
    elif node.name == "map":
        k, v = _pair(fn)
        df = df.withColumns({"key": F.when(ok(), k), "value": F.when(ok(), v)})
    elif node.name in ("flat_map_values", "flat_map"):
        arr = _col(fn)
        elem = df.select(arr.alias("a")).schema["a"].dataType.elementType  # type: ignore[attr-defined]
        # a bad row must survive the explode as exactly one row
        keep_bad = F.array(F.lit(None).cast(elem))
        df = df.withColumn("_tc_arr", F.when(ok(), arr).otherwise(keep_bad))
        df = df.select("*", F.posexplode("_tc_arr").alias("_tc_pos", "_tc_x"))
        if node.name == "flat_map":
            x = F.col("_tc_x")
            df = df.withColumns({"key": x.getField("key"), "value": x.getField("value")})
        else:
            df = df.withColumn("value", F.col("_tc_x"))
        seq = F.col(env.SEQ) * F.lit(FANOUT) + F.col("_tc_pos")
        df = df.withColumn(env.SEQ, seq).drop("_tc_arr", "_tc_pos", "_tc_x")
    else:
        raise TypeError(f"{node.name}: a Column cannot be used here; pass a Python callable")
    changed = flow.changed | CHANGES.get(node.name, frozenset())
    return Flow(df, step.key, step.value, step.kind, decoded=True, changed=changed)


#: what each Column operator changes (a filter changes nothing it keeps)
CHANGES = {
    "map_values": frozenset({"value"}),
    "flat_map_values": frozenset({"value"}),
    "select_key": frozenset({"key"}),
    "map": frozenset({"key", "value"}),
    "flat_map": frozenset({"key", "value"}),
}


def _select_group(flow: Flow, step: Step) -> Flow:
    """(group key, group value) per row, packed like wire.pack_pair, in the JVM."""
    assert isinstance(step.value, PairSerde)
    gk, gv = _pair(getattr(step.node, "fn", None))
    df = flow.df.withColumns({"_tc_gk": gk, "_tc_gv": gv})
    types = df.schema
    gkb = Codec(step.value.key).encode(F.col("_tc_gk"), types["_tc_gk"].dataType)
    gvb = Codec(step.value.value).encode(F.col("_tc_gv"), types["_tc_gv"].dataType)
    length = F.unhex(F.lpad(F.hex(F.length(gkb)), 8, "0"))
    packed = F.when(ok() & F.col("value").isNotNull(), F.concat(length, gkb, gvb))
    if "key" in flow.changed:
        kb = Codec(flow.key).encode(F.col("key"), types["key"].dataType)
    else:
        kb = F.col(BYTES["key"])
    df = df.withColumns({"key": kb, "value": packed}).drop("_tc_gk", "_tc_gv", *BYTES.values())
    return Flow(df, flow.key, step.value, "table", decoded=False)


def _col(fn: plan.Fn) -> Column:
    if isinstance(fn, Column):
        return classic(fn)
    raise TypeError(f"expected a Column, not {type(fn).__name__}")


def _pair(fn: plan.Fn | None) -> tuple[Column, Column]:
    if isinstance(fn, tuple) and len(fn) == 2:
        return classic(fn[0]), classic(fn[1])
    if isinstance(fn, Column):
        col = classic(fn)
        return col.getField("key"), col.getField("value")
    raise TypeError("expected a pair of Columns or a struct Column with fields key and value")
