"""The plan: what the DSL builds and the planner reads.

A plan is a tree of immutable nodes, each pointing at its parent. The DSL
classes in :mod:`tablecast.pipeline.dsl` are thin handles on these nodes; the
planner in :mod:`tablecast.pipeline.planner` walks them from a sink back to
its source and cuts them into Spark queries.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pyspark.sql import Column

from tablecast import serde as serdes
from tablecast.serde import Serde
from tablecast.windows import JoinWindows, SessionWindows, Windows

#: what operators accept: a Column over `key`/`value` (a pair of Columns, or a
#: struct with fields key/value, where an operator returns a record), or a
#: Python callable f(key, value)
Fn = Column | tuple[Column, Column] | Callable[..., Any]
Kind = Literal["stream", "table"]
#: "column": a Spark aggregate function (F.sum(...), F.max(...)), computed by Spark
AggKind = Literal["count", "reduce", "aggregate", "column"]


@dataclass(frozen=True, eq=False)
class Node:
    parent: Node | None

    @property
    def kind(self) -> Kind:
        assert self.parent is not None
        return self.parent.kind

    def lineage(self) -> list[Node]:
        """This node and its ancestors, source first."""
        chain: list[Node] = []
        node: Node | None = self
        while node is not None:
            chain.append(node)
            node = node.parent
        return chain[::-1]

    def describe(self) -> str:
        return type(self).__name__.lower()

    # serdes of what this node emits: its parent's unless the node says otherwise
    def key_serde(self) -> Serde:
        assert self.parent is not None
        return self.parent.key_serde()

    def value_serde(self) -> Serde:
        assert self.parent is not None
        return self.parent.value_serde()


@dataclass(frozen=True, eq=False)
class Source(Node):
    topic: str
    key: Serde
    value: Serde
    source_kind: Kind
    is_global: bool = False

    @property
    def kind(self) -> Kind:
        return self.source_kind

    def key_serde(self) -> Serde:
        return self.key

    def value_serde(self) -> Serde:
        return self.value

    def describe(self) -> str:
        what = "global_table" if self.is_global else self.source_kind
        return f"{what}({self.topic!r}, key={self.key!r}, value={self.value!r})"


@dataclass(frozen=True, eq=False)
class Op(Node):
    """A stateless, record-at-a-time operator (its meaning depends on the kind)."""

    fn: Fn = None  # type: ignore[assignment]
    key: Serde | None = None
    value: Serde | None = None

    #: which operator: filter, map_values, map, flat_map_values, flat_map, select_key, peek
    name: str = "op"

    def key_serde(self) -> Serde:
        return self.key or super().key_serde()

    def value_serde(self) -> Serde:
        return self.value or super().value_serde()

    @property
    def rekeys(self) -> bool:
        return self.name in ("map", "flat_map", "select_key")

    def describe(self) -> str:
        return f"{self.name}({fn_name(self.fn)})"


@dataclass(frozen=True, eq=False)
class TransformValues(Node):
    """stream.transform_values(f): f(key, value, state) with the key's own persistent state."""

    fn: Callable[..., Any] = None  # type: ignore[assignment]
    value: Serde | None = None

    @property
    def kind(self) -> Kind:
        return "stream"

    def value_serde(self) -> Serde:
        return self.value or super().value_serde()

    def describe(self) -> str:
        return f"transform_values({fn_name(self.fn)})"


@dataclass(frozen=True, eq=False)
class Repartition(Node):
    """stream.repartition(partitions, partitioner): the stream crosses an internal topic."""

    partitions: int | None = None
    partitioner: Fn | None = None

    @property
    def kind(self) -> Kind:
        return "stream"

    def describe(self) -> str:
        args = [f"partitions={self.partitions}"] if self.partitions else []
        if self.partitioner is not None:
            args.append(f"partitioner={fn_name(self.partitioner)}")
        return f"repartition({', '.join(args)})"


@dataclass(frozen=True, eq=False)
class Merge(Node):
    """stream.merge(*others): the parent's records and the other streams' in one stream."""

    others: tuple[Node, ...] = ()

    @property
    def kind(self) -> Kind:
        return "stream"

    def describe(self) -> str:
        inputs = "; ".join(" -> ".join(n.describe() for n in o.lineage()) for o in self.others)
        return f"merge([{inputs}])"


@dataclass(frozen=True, eq=False)
class ToTable(Node):
    @property
    def kind(self) -> Kind:
        return "table"

    def describe(self) -> str:
        return "to_table()"


@dataclass(frozen=True, eq=False)
class ToStream(Node):
    @property
    def kind(self) -> Kind:
        return "stream"

    def describe(self) -> str:
        return "to_stream()"


@dataclass(frozen=True, eq=False)
class GroupBy(Node):
    """Stream: group_by_key() (fn None) or group_by(f -> new key).
    Table: group_by(f -> (new key, new value))."""

    fn: Fn | None = None
    key: Serde | None = None
    value: Serde | None = None

    def key_serde(self) -> Serde:
        return self.key or super().key_serde()

    def value_serde(self) -> Serde:
        return self.value or super().value_serde()

    def describe(self) -> str:
        return "group_by_key()" if self.fn is None else f"group_by({fn_name(self.fn)})"


@dataclass(frozen=True, eq=False)
class WindowedBy(Node):
    """grouped_stream.windowed_by(windows, grace): the aggregate is kept per (key, window)."""

    windows: Windows | SessionWindows = None  # type: ignore[assignment]
    grace_ms: int = 0

    def describe(self) -> str:
        return f"windowed_by({self.windows.describe()}, grace {self.grace_ms} ms)"


@dataclass(frozen=True, eq=False)
class Aggregate(Node):
    """count / reduce / aggregate of a grouped stream or grouped table: a table."""

    agg: AggKind = "count"
    initializer: Callable[[], Any] | None = None
    adder: Callable[..., Any] | None = None
    subtractor: Callable[..., Any] | None = None
    value: Serde | None = None
    #: a windowed aggregation's results: on every change, or once per window when it closes
    emit: Literal["changes", "final"] = "changes"
    #: a session-windowed aggregate's merger(key, agg1, agg2): two sessions a record bridges
    merger: Callable[[Any, Any, Any], Any] | None = None
    #: agg "column": the Spark aggregate function over the decoded `key` and `value`
    column: Column | None = None

    @property
    def kind(self) -> Kind:
        return "table"

    @property
    def grouped(self) -> GroupBy:
        parent = self.parent.parent if isinstance(self.parent, WindowedBy) else self.parent
        assert isinstance(parent, GroupBy)
        return parent

    @property
    def window(self) -> WindowedBy | None:
        return self.parent if isinstance(self.parent, WindowedBy) else None

    @property
    def of_table(self) -> bool:
        return self.grouped.kind == "table"

    @property
    def folds_columns(self) -> bool:
        """A grouped table's reduce or aggregate whose functions are Columns (Spark folds them)."""
        return self.of_table and self.adder is not None and is_column(self.adder)

    def value_serde(self) -> Serde:
        if self.agg == "count":
            return serdes.long()
        if self.agg in ("aggregate", "column"):
            # an aggregate is rarely of the values' type: JSON unless told otherwise
            return self.value or serdes.json()
        return self.value or super().value_serde()

    def describe(self) -> str:
        if self.column is not None:
            return f"aggregate({fn_name(self.column)})"
        fns = (self.initializer, self.adder, self.subtractor, self.merger)
        parts = [fn_name(f) for f in fns if f is not None]
        if self.emit == "final":
            parts.append("emit='final'")  # alone it read "count(, emit='final')"
        return f"{self.agg}({', '.join(parts)})"


@dataclass(frozen=True, eq=False)
class Cogroup(Node):
    """app.cogroup((grouped, aggregator), ...).aggregate(initializer): one aggregate per
    key, fed by every input's records, each through its own aggregator(key, value,
    aggregate) (Kafka Streams' CogroupedKStream). The parent is the first input's
    GroupBy, `others` the other inputs' (all grouped streams with one key serde);
    `aggregators[i]` is input i's (0: the parent's)."""

    others: tuple[GroupBy, ...] = ()
    aggregators: tuple[Callable[[Any, Any, Any], Any], ...] = ()
    initializer: Callable[[], Any] = None  # type: ignore[assignment]
    value: Serde | None = None
    #: cogroup(...).windowed_by(...): the aggregate is kept per (key, window)
    window: WindowedBy | None = None
    emit: Literal["changes", "final"] = "changes"
    #: windowed by sessions: merger(key, agg1, agg2), two sessions a record bridges
    merger: Callable[[Any, Any, Any], Any] | None = None

    @property
    def kind(self) -> Kind:
        return "table"

    @property
    def inputs(self) -> tuple[GroupBy, ...]:
        assert isinstance(self.parent, GroupBy)
        return (self.parent, *self.others)

    def value_serde(self) -> Serde:
        # as aggregate(): an aggregate is rarely of the values' type, JSON unless told
        return self.value or serdes.json()

    def describe(self) -> str:
        inputs = "; ".join(
            " -> ".join(n.describe() for n in g.lineage()) + f", {fn_name(f)}"
            for g, f in zip(self.others, self.aggregators[1:], strict=True)
        )
        first = fn_name(self.aggregators[0])
        window = "" if self.window is None else f".{self.window.describe()}"
        emit = ", emit='final'" if self.emit == "final" else ""
        init = fn_name(self.initializer)
        merger = "" if self.merger is None else f", merger={fn_name(self.merger)}"
        return f"cogroup({first}, [{inputs}]){window}.aggregate({init}{merger}{emit})"


@dataclass(frozen=True, eq=False)
class Materialize(Node):
    name: str = ""
    store: Literal["rocksdb", "memory"] = "rocksdb"
    extra: dict[str, Any] = field(default_factory=dict)
    #: keep every version of a key this long by record time; None: the latest only
    history_ms: int | None = None
    #: secondary indexes: (name, f(key, value) -> value | list | None), Column or callable
    indexes: tuple[tuple[str, Fn], ...] = ()

    def describe(self) -> str:
        views = ""
        if self.history_ms is not None:
            views += f", history_ms={self.history_ms}"
        if self.indexes:
            named = ", ".join(f"{n!r}: {fn_name(f)}" for n, f in self.indexes)
            views += f", indexes={{{named}}}"
        return f"materialize({self.name!r}, store={self.store!r}{views})"

    def catalog_extra(self) -> dict[str, Any]:
        """What the catalog entry's ``extra`` says of this table's history and indexes
        (the form tablecast.kafka.catalog checks and the nodes read)."""
        out: dict[str, Any] = dict(self.extra)
        if self.history_ms is not None:
            out["history_ms"] = self.history_ms
        if self.indexes:
            out["indexes"] = [n for n, _ in self.indexes]
        return out


@dataclass(frozen=True, eq=False)
class To(Node):
    """A stream written to a topic of the user's (at-least-once)."""

    topic: str = ""
    key: Serde | None = None
    value: Serde | None = None
    partitioner: Fn | None = None

    def key_serde(self) -> Serde:
        return self.key or super().key_serde()

    def value_serde(self) -> Serde:
        return self.value or super().value_serde()

    def describe(self) -> str:
        part = f", partitioner={fn_name(self.partitioner)}" if self.partitioner else ""
        return f"to({self.topic!r}{part})"


@dataclass(frozen=True, eq=False)
class Join(Node):
    """stream.join(table | global table), table.join(table) or stream.join(stream,
    window=...): the parent is the left input, `other` the table whose latest value per
    key each left record meets, or the stream whose records within `window` it meets."""

    other: Node = None  # type: ignore[assignment]
    joiner: Callable[[Any, Any], Any] = None  # type: ignore[assignment]
    #: stream joins: f(key, value) -> the table key (None: the stream's key)
    key_fn: Fn | None = None
    how: Literal["inner", "left", "outer"] = "inner"
    value: Serde | None = None
    #: a stream-stream join's window (None: the other side is a table)
    window: JoinWindows | None = None
    #: a table-table foreign-key join's f(key, value) -> the other table's key (KIP-213)
    foreign_key: Fn | None = None

    @property
    def is_global(self) -> bool:
        return source_of(self.other).is_global

    def value_serde(self) -> Serde:
        # a joined value is rarely of either input's type: JSON unless told otherwise
        return self.value or serdes.json()

    def describe(self) -> str:
        side = "global_table" if self.is_global else "table"
        if self.window is not None:
            side = "stream"
        other = " -> ".join(n.describe() for n in self.other.lineage())
        key = f", key={fn_name(self.key_fn)}" if self.key_fn is not None else ""
        if self.foreign_key is not None:
            key = f", foreign_key={fn_name(self.foreign_key)}"
        how = f", how={self.how!r}" if self.how != "inner" else ""
        window = f", window={self.window.describe()}" if self.window is not None else ""
        return f"join({side}[{other}], {fn_name(self.joiner)}{key}{how}{window})"


def fn_name(fn: Any) -> str:
    if isinstance(fn, Column):
        return str(fn)
    if isinstance(fn, tuple):
        return "(" + ", ".join(fn_name(f) for f in fn) + ")"
    return getattr(fn, "__qualname__", repr(fn))


def is_column(fn: Any) -> bool:
    return isinstance(fn, Column) or (
        isinstance(fn, tuple) and all(isinstance(f, Column) for f in fn)
    )


def window_of(node: Node) -> WindowedBy | None:
    """The windowing of the aggregation whose table `node` is (None: not a window table)."""
    for n in reversed(node.lineage()):
        if isinstance(n, Aggregate | Cogroup):
            return n.window
    return None


def source_of(node: Node) -> Source:
    first = node.lineage()[0]
    if not isinstance(first, Source):
        raise TypeError(f"plan does not start at a source: {first!r}")
    return first


def sources(node: Node) -> list[Source]:
    """Every source `node` reads, through joins' other inputs too."""
    out: list[Source] = []
    for n in node.lineage():
        if isinstance(n, Source):
            out.append(n)
        elif isinstance(n, Join):
            out.extend(sources(n.other))
        elif isinstance(n, Merge | Cogroup):
            out.extend(s for o in n.others for s in sources(o))
    return out


def value_serde(node: Node) -> Serde:
    """The serde of the values `node` produces."""
    return node.value_serde()


def key_serde(node: Node) -> Serde:
    return node.key_serde()
