"""Kafka Streams' aggregation semantics as plain Python, one group at a time.

These functions are what the stateful Spark steps run per key and per
micro-batch (see :mod:`tablecast.pipeline.stateful`); they take and return
decoded Python values, with ``None`` meaning "no aggregate" (absent or deleted).

- Grouped streams (KStreamAggregate / KStreamReduce): records with a None
  value are skipped; the first value starts a reduce, ``initializer()`` starts
  an aggregate; a None result deletes the key, and the next record starts over.
- Grouped tables (KTableAggregate / KTableReduce): a change carries the row's
  old and new contribution. The old one is subtracted only if there is an
  aggregate; the new one is added to the aggregate, or to ``initializer()``
  (a reduce: becomes the aggregate) when there is none. The result is stored
  as is, so a None from adder or subtractor deletes the key. A count is the
  aggregate 0 / +1 / -1 and stays at 0 when its group empties, as in Kafka Streams.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tablecast.pipeline import plan


@dataclass(frozen=True)
class Aggregator:
    agg: plan.AggKind
    initializer: Callable[[], Any] | None = None
    adder: Callable[..., Any] | None = None
    subtractor: Callable[..., Any] | None = None

    @classmethod
    def of(cls, node: plan.Aggregate) -> Aggregator:
        return cls(node.agg, node.initializer, node.adder, node.subtractor)

    # -- grouped streams ---------------------------------------------------
    def stream_add(self, key: Any, value: Any, agg: Any) -> Any:
        if value is None:
            return agg
        if self.agg == "count":
            return (agg or 0) + 1
        assert self.adder is not None
        if self.agg == "reduce":
            return value if agg is None else self.adder(agg, value)
        assert self.initializer is not None
        return self.adder(key, value, self.initializer() if agg is None else agg)

    # -- grouped tables ----------------------------------------------------
    def table_change(self, key: Any, old: Any, new: Any, agg: Any) -> Any:
        if old is not None and agg is not None:
            agg = self._subtract(key, old, agg)
        if new is not None:
            agg = self._add(key, new, agg)
        return agg

    def _subtract(self, key: Any, old: Any, agg: Any) -> Any:
        if self.agg == "count":
            return agg - 1
        assert self.subtractor is not None
        if self.agg == "reduce":
            return self.subtractor(agg, old)
        return self.subtractor(key, old, agg)

    def _add(self, key: Any, new: Any, agg: Any) -> Any:
        if self.agg == "count":
            return (0 if agg is None else agg) + 1
        assert self.adder is not None
        if self.agg == "reduce":
            return new if agg is None else self.adder(agg, new)
        assert self.initializer is not None
        return self.adder(key, new, self.initializer() if agg is None else agg)
