"""The plan: what the DSL builds and the compiler reads.

A plan is a tree of immutable nodes, each pointing at its parent. The DSL
classes in :mod:`tablecast.pipeline.dsl` are thin handles on these nodes; the
compiler in :mod:`tablecast.pipeline.compiler` walks them from a sink back to
its source.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pyspark.sql import Column

from tablecast.serde import Serde

#: what operators accept: a Column over `key`/`value`, or a Python callable f(key, value)
Fn = Column | Callable[..., Any]
Kind = Literal["stream", "table"]


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

    def describe(self) -> str:
        what = "global_table" if self.is_global else self.source_kind
        return f"{what}({self.topic!r}, key={self.key!r}, value={self.value!r})"


@dataclass(frozen=True, eq=False)
class Filter(Node):
    predicate: Fn

    def describe(self) -> str:
        return f"filter({_fn_name(self.predicate)})"


@dataclass(frozen=True, eq=False)
class MapValues(Node):
    fn: Fn
    value: Serde | None = None

    def describe(self) -> str:
        return f"map_values({_fn_name(self.fn)})"


@dataclass(frozen=True, eq=False)
class ToTable(Node):
    @property
    def kind(self) -> Kind:
        return "table"

    def describe(self) -> str:
        return "to_table()"


@dataclass(frozen=True, eq=False)
class Materialize(Node):
    name: str
    store: Literal["rocksdb", "memory"] = "rocksdb"
    extra: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        return f"materialize({self.name!r}, store={self.store!r})"


def _fn_name(fn: Fn) -> str:
    if isinstance(fn, Column):
        return f"Column<{fn}>"
    return getattr(fn, "__qualname__", repr(fn))


def source_of(node: Node) -> Source:
    first = node.lineage()[0]
    if not isinstance(first, Source):
        raise TypeError(f"plan does not start at a source: {first!r}")
    return first


def value_serde(node: Node) -> Serde:
    """The serde of the values `node` produces: the source's unless a step changed it."""
    value = source_of(node).value
    for step in node.lineage():
        if isinstance(step, MapValues) and step.value is not None:
            value = step.value
    return value
