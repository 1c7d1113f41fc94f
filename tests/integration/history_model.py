"""What a table topic implies at given offsets: rows, history and indexes, computed from the
records as written (independently of the node's stores), for answers to be judged exactly at
the positions they report."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from tablecast.contract import index_codec
from tablecast.contract.positions import parse

from .tables import Logged


class TopicModel:
    def __init__(self, history_ms: int, index_names: tuple[str, ...]) -> None:
        self.history_ms = history_ms
        self.index_names = index_names
        self.log: list[Logged] = []

    def add(self, records: list[Logged]) -> None:
        self.log.extend(records)

    def ends(self) -> dict[int, int]:
        """Per partition, the offset after the last record written."""
        out: dict[int, int] = {}
        for r in self.log:
            out[r.partition] = max(out.get(r.partition, 0), r.offset + 1)
        return out

    def upto(self, at: Mapping[int, int]) -> list[Logged]:
        """The records the position `at` reflects, in offset order per partition."""
        return sorted(
            (r for r in self.log if r.offset < at.get(r.partition, 0)),
            key=lambda r: (r.partition, r.offset),
        )

    # -- the table --------------------------------------------------------------------
    def rows(self, at: Mapping[int, int]) -> dict[bytes, Logged]:
        out: dict[bytes, Logged] = {}
        for r in self.upto(at):
            if r.value is None:
                out.pop(r.key, None)
            else:
                out[r.key] = r
        return out

    # -- history ----------------------------------------------------------------------
    def stream_time(self, at: Mapping[int, int], partition: int) -> int | None:
        times = [r.timestamp for r in self.upto(at) if r.partition == partition]
        return max(times) if times else None

    def floor(self, at: Mapping[int, int], partition: int) -> int | None:
        st = self.stream_time(at, partition)
        return None if st is None else st - self.history_ms

    def versions(self, at: Mapping[int, int], key: bytes) -> dict[int, Logged]:
        """The key's versions by timestamp as the history admits them: a record older than
        stream time − retention (of the records before it) is left out; of one timestamp,
        the last record stays."""
        out: dict[int, Logged] = {}
        stream: dict[int, int] = {}
        for r in self.upto(at):
            st = stream.get(r.partition)
            if r.key == key and (st is None or r.timestamp >= st - self.history_ms):
                out[r.timestamp] = r
            stream[r.partition] = r.timestamp if st is None else max(st, r.timestamp)
        return out

    def as_of(self, at: Mapping[int, int], key: bytes, when: int) -> Logged | None:
        versions = self.versions(at, key)
        before = [t for t in versions if t <= when]
        found = versions[max(before)] if before else None
        return found if found is not None and found.value is not None else None

    def kept(self, at: Mapping[int, int], key: bytes, partition: int) -> list[Logged]:
        """Every version after the cutoff, and the one valid at it unless a delete."""
        cutoff = self.floor(at, partition)
        versions = self.versions(at, key)
        if cutoff is None:
            return []
        valid = self.as_of(at, key, cutoff)
        return ([valid] if valid is not None else []) + [
            versions[t] for t in sorted(versions) if t > cutoff
        ]

    # -- indexes ----------------------------------------------------------------------
    def index(self, at: Mapping[int, int], name: str) -> list[tuple[bytes, Any, Logged]]:
        """(encoded value + key, value, row) of every row under index `name`, in order."""
        out = {}
        for key, r in self.rows(at).items():
            got = (r.index or {}).get(name)
            for v in got if isinstance(got, list) else ([] if got is None else [got]):
                enc = index_codec.encode_value(v)
                out[enc + key] = (enc + key, index_codec.decode_value(enc)[0], r)
        return [out[k] for k in sorted(out)]


def position(headers: Mapping[str, str], table: str) -> dict[int, int]:
    """The offsets an answer says it is exact at."""
    token = headers.get("x-tablecast-position")
    assert token, f"no X-Tablecast-Position in {dict(headers)}"
    parsed = parse(token)
    assert parsed.table == table, token
    return dict(parsed.offsets)


def value_of(r: Logged) -> Any:
    assert r.value is not None
    return orjson.loads(r.value)
