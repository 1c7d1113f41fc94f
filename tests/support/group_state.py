"""A stateful step's applyInPandasWithState function run by hand, without Spark: the
GroupState it is given and the frames it reads, as Spark hands them over."""

from __future__ import annotations

import pickle
from typing import Any

from tablecast.pipeline.compile.keyed import frame


class GroupState:
    """GroupState as applyInPandasWithState hands it over: bytes in, bytes out (each
    update goes through pickle, as the state store's serialization would)."""

    def __init__(self) -> None:
        self.stored: tuple[bytes, ...] | None = None

    @property
    def exists(self) -> bool:
        return self.stored is not None

    @property
    def get(self) -> tuple[bytes, ...]:
        assert self.stored is not None
        return self.stored

    def update(self, value: tuple[bytes, ...]) -> None:
        self.stored = tuple(pickle.loads(pickle.dumps(value)))

    def remove(self) -> None:
        self.stored = None


def run_group(fn: Any, rows: list[tuple[Any, ...]], state: GroupState) -> list[tuple[Any, ...]]:
    """The rows `fn` returns for one group whose input is `rows` (one frame)."""
    if not rows:
        return []
    out: list[tuple[Any, ...]] = []
    for pdf in fn((0,), iter([frame(rows, [str(i) for i in range(len(rows[0]))])]), state):
        out.extend(pdf.itertuples(index=False, name=None))
    return out
