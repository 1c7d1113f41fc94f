"""Which rows a watch follows: some keys, or key spans (a prefix or a range), within the caller's
grants, and so which partitions it covers.

The caller's policy is applied here, once, when the watch starts: a key
outside the grants is refused (403), and spans are clipped to the granted
ones. Everything the watch later delivers is tested against this selection,
so it can never show a row the grants do not cover.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tablecast.contract.table_info import TableInfo
from tablecast.query.policy import KeyScope, Span

#: keys one watch may name (each is a query parameter)
MAX_KEYS = 1_000


@dataclass(frozen=True)
class Selection:
    #: a key watch: exactly these serialized keys (sorted); None for spans
    keys: tuple[bytes, ...] | None
    #: a span watch: sorted, disjoint [start, end) spans of serialized keys; None for keys
    spans: tuple[Span, ...] | None
    #: the partitions the watch covers, ascending
    partitions: tuple[int, ...]

    @classmethod
    def of_keys(cls, info: TableInfo, raws: Iterable[bytes]) -> Selection:
        keys = tuple(sorted(set(raws)))
        parts = tuple(sorted({p for k in keys for p in info.partitions_for(k)}))
        return cls(keys, None, parts)

    @classmethod
    def of_span(
        cls, info: TableInfo, start: bytes | None, end: bytes | None, scope: KeyScope | None
    ) -> Selection:
        """[start, end) within the caller's grants (every partition: keys spread over all)."""
        spans: Sequence[Span] = [(start, end)] if scope is None else scope.clip(start, end)
        return cls(None, tuple(spans), tuple(range(info.partitions)))

    def matches(self, key: bytes) -> bool:
        if self.keys is not None:
            return key in self.keys
        return _in_spans(self.spans or (), key)

    def above(self, after: bytes) -> Selection:
        """The rows with keys greater than `after` (what a snapshot still has to send)."""
        if self.keys is not None:
            return Selection(tuple(k for k in self.keys if k > after), None, self.partitions)
        lo = after + b"\x00"  # the least key above `after`
        clipped = []
        for start, end in self.spans or ():
            if end is not None and end <= lo:
                continue
            clipped.append((lo if start is None or start < lo else start, end))
        return Selection(None, tuple(clipped), self.partitions)

    @property
    def empty(self) -> bool:
        return not (self.keys if self.keys is not None else self.spans)


def _in_spans(spans: Sequence[Span], key: bytes) -> bool:
    for start, end in spans:
        if start is not None and key < start:
            return False  # sorted and disjoint: no later span holds it
        if end is None or key < end:
            return True
    return False
