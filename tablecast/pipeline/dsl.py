"""The user-facing stream and table handles (SPEC §1).

Each method returns a new handle on a new plan node; nothing runs until
``App.run()``. Operators take a PySpark ``Column`` over ``key``/``value`` or a
Python callable ``f(key, value)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from tablecast.pipeline import plan
from tablecast.serde import Serde

if TYPE_CHECKING:
    from tablecast.pipeline.app import App


class _Handle:
    def __init__(self, app: App, node: plan.Node) -> None:
        self._app = app
        self._node = node

    @property
    def node(self) -> plan.Node:
        return self._node

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {' -> '.join(n.describe() for n in self._node.lineage())}>"


class Stream(_Handle):
    """A record stream: each record is an event."""

    def filter(self, predicate: plan.Fn) -> Stream:
        return Stream(self._app, plan.Filter(self._node, predicate))

    def map_values(self, fn: plan.Fn, value: Serde | None = None) -> Stream:
        return Stream(self._app, plan.MapValues(self._node, fn, value))

    def to_table(self) -> Table:
        """The latest value per key; a None value deletes the key."""
        return Table(self._app, plan.ToTable(self._node))


class Table(_Handle):
    """A changelog: each record is an upsert of its key; a None value deletes it."""

    def filter(self, predicate: plan.Fn) -> Table:
        """Rows that do not match (or stop matching) are deleted downstream."""
        return Table(self._app, plan.Filter(self._node, predicate))

    def map_values(self, fn: plan.Fn, value: Serde | None = None) -> Table:
        return Table(self._app, plan.MapValues(self._node, fn, value))

    def materialize(self, name: str, store: Literal["rocksdb", "memory"] = "rocksdb") -> Table:
        """Make this table queryable under `name` and return it."""
        if store not in ("rocksdb", "memory"):
            raise ValueError(f"store must be 'rocksdb' or 'memory', not {store!r}")
        node = plan.Materialize(self._node, name, store)
        self._app._register(node)
        return Table(self._app, node)
