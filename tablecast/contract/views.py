"""What a table's stores keep besides the latest row per key, as a table's description
states it and a store records it."""

from __future__ import annotations

from dataclasses import dataclass

import orjson


@dataclass(frozen=True)
class Views:
    """What a store keeps besides the latest row per key: every version
    for `history_ms` by record timestamp, and the index entries of the named indexes."""

    history_ms: int | None = None
    indexes: tuple[str, ...] = ()
    #: what the rows are made from, where a table can change it (an attached topic, its
    #: formats and index paths); "" where it cannot
    source: str = ""

    def fingerprint(self) -> bytes:
        """How a store records which views it holds: one built for others starts over."""
        held: list[object] = [self.history_ms, sorted(self.indexes)]
        return orjson.dumps([*held, self.source] if self.source else held)


NO_VIEWS = Views()
