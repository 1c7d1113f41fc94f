"""``materialize(name, history=..., indexes=...)``: checked when the App is defined.

What the nodes keep besides the latest row per key (docs/user-guide.md) is announced in
the table's catalog entry and is refused there if it breaks the contract of
:mod:`tablecast.kafka.catalog`; checking the same rules here turns a typo into
an error at the line that made it rather than a table the nodes leave out.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from pyspark.sql import Column

from tablecast.contract.index_codec import NAME
from tablecast.pipeline.plan import nodes as plan
from tablecast.windows import to_ms

Indexes = Mapping[str, Any]


def checked(
    history: timedelta | str | None, indexes: Indexes | None
) -> tuple[int | None, tuple[tuple[str, plan.Fn], ...]]:
    """(history in ms or None, ((index name, f), ...)); ValueError/TypeError if refused."""
    history_ms = None
    if history is not None:
        history_ms = to_ms(history)
        if history_ms <= 0:
            raise ValueError(f"materialize: history must be positive, not {history!r}")
    if indexes is None:
        return history_ms, ()
    if not isinstance(indexes, Mapping):
        raise TypeError("materialize: indexes is a dict {name: f(key, value) or Column}")
    out = []
    for name, fn in indexes.items():
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ValueError(f"materialize: index name {name!r} is not 1-64 of A-Z a-z 0-9 _ . -")
        # one value (or list) per row: a pair of Columns is the record form, not an index's
        if not (isinstance(fn, Column) or (callable(fn) and not plan.is_column(fn))):
            raise TypeError(
                f"materialize: index {name!r} needs a Column or a callable f(key, value), "
                f"not {type(fn).__name__}"
            )
        out.append((name, fn))
    return history_ms, tuple(out)


def refuse_on_windows(history: object, indexes: object) -> None:
    if history is not None or indexes:
        raise ValueError(
            "materialize: history and indexes are kept for key-value tables only, "
            "not window tables (their keys are already versions by window start)"
        )
