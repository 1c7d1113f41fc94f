"""``stream.transform_values(f)``: f(key, value, state) with per-key persistent state.

Kafka Streams' transformValues over a key-value store, as a per-key step of
:mod:`tablecast.pipeline.stateful` (keys bucketed, state in Spark's state
store, rows of a key in (partition, offset, seq) order). The state of a key is
one JSON document: it is independent of the value serde (a running total is
rarely of the values' type) and any JSON-able default works. Each record sees
the state the records before it left; a record whose f raises (or whose result
or state does not encode) goes to the dead-letter topic and its state changes
are dropped, so the next record sees the state as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from tablecast.pipeline.compile import envelope as env
from tablecast.pipeline.compile.keyed import ERR, RK, TS, Core, KeyState, V, bad_row
from tablecast.serde import Serde


class ValueState:
    """The `state` argument of a transform_values function: one key's value."""

    __slots__ = ("_stored",)

    def __init__(self, stored: bytes | None) -> None:
        self._stored = stored

    def get(self, default: Any = None) -> Any:
        """The key's state (a fresh copy: mutate it, then set() it), or `default`."""
        return default if self._stored is None else orjson.loads(self._stored)

    def set(self, value: Any) -> None:
        """Replace the key's state; None forgets it. Raises TypeError if not JSON-able."""
        try:
            self._stored = None if value is None else orjson.dumps(value)
        except orjson.JSONEncodeError as e:
            raise TypeError(f"state is not JSON-able: {e}") from None

    @property
    def stored(self) -> bytes | None:
        return self._stored


def transform_values(fn: Callable[..., Any], key: Serde, value: Serde, result: Serde) -> Core:
    width = len(env.COLUMNS)

    def core(kb: bytes | None, rows: list[tuple[Any, ...]], state: KeyState) -> list[Any]:
        before = stored = state.get[0] if state.exists else None
        out: list[tuple[Any, ...]] = []
        for row in rows:
            if row[ERR] is not None:
                out.append(row[:width])
                continue
            if kb is None:  # Kafka Streams' stores take no null key
                out.append(bad_row(row, "transform_values: null key", width))
                continue
            st = ValueState(stored)
            try:
                v = None if row[V] is None else value.deserialize(row[V])
                new = fn(key.deserialize(kb), v, st)
                enc = None if new is None else result.serialize(new)
            except Exception as e:  # the user's function failed: dead-letter, state untouched
                out.append(bad_row(row, f"transform_values: {type(e).__name__}: {e}", width))
                continue
            stored = st.stored
            # the source's raw bytes and coordinates stay: later steps may still dead-letter it
            out.append((kb, enc, None, *row[RK : TS + 1]))
        if stored is not before:
            if stored is None:
                state.remove()
            else:
                state.update((stored,))
        return out

    return core
