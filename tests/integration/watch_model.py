"""The model a watch is judged against: the table topic itself, read directly.

A watch that started at positions S (its ``ready`` id) must have sent, as its
snapshot, exactly the latest value per selected key among the records below S,
and then, per partition, exactly the selected records at or above S, in offset
order, each once; every event's id is the position right after it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from confluent_kafka import Consumer, TopicPartition

from tablecast.live.resume_token import Token, parse

Match = Callable[[str], bool]


@dataclass(frozen=True)
class Rec:
    partition: int
    offset: int
    key: str
    value: Any  # None: deleted


def read_topic(bootstrap: str, topic: str, partitions: int) -> dict[int, list[Rec]]:
    """Every record of the topic now, per partition in offset order (up to its end)."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"model-{time.time()}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        ends = {
            p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        }
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out: dict[int, list[Rec]] = {p: [] for p in range(partitions)}
        pending = {p for p, end in ends.items() if end > 0}
        deadline = time.monotonic() + 60
        while pending and time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                p = m.partition()
                if m.error() is not None:
                    if m.offset() >= ends[p]:
                        pending.discard(p)
                    continue
                if m.offset() < ends[p]:
                    value = m.value()
                    out[p].append(
                        Rec(
                            p,
                            m.offset(),
                            m.key().decode(),
                            None if value is None else orjson.loads(value),
                        )
                    )
                if m.offset() + 1 >= ends[p]:
                    pending.discard(p)
        assert not pending, f"could not read partitions {pending} of {topic}"
        return out
    finally:
        c.close()


def state_at(
    records: dict[int, list[Rec]], positions: dict[int, int], match: Match
) -> dict[str, Rec]:
    state: dict[str, Rec] = {}
    for p, position in positions.items():
        for r in records[p]:
            if r.offset >= position or not match(r.key):
                continue
            if r.value is None:
                state.pop(r.key, None)
            else:
                state[r.key] = r
    return state


def changes_from(
    records: dict[int, list[Rec]], positions: dict[int, int], match: Match
) -> dict[int, list[Rec]]:
    return {
        p: [r for r in records[p] if r.offset >= position and match(r.key)]
        for p, position in positions.items()
    }


@dataclass
class Seen:
    """A watch's events as (kind, id, data) triples, whichever client read them."""

    events: list[tuple[str, str | None, dict[str, Any]]]

    @classmethod
    def of(cls, events: Sequence[Any]) -> Seen:
        out = []
        for e in events:
            if hasattr(e, "data"):  # tests.support.sse.Event
                out.append((e.event, e.id, e.data))
            else:  # tablecast.client.WatchEvent
                data = {
                    "key": e.key,
                    "value": e.value,
                    "partition": e.partition,
                    "offset": e.offset,
                }
                out.append((e.event, e.id, data))
        return cls(out)

    def changes(self) -> list[tuple[str, str | None, dict[str, Any]]]:
        return [e for e in self.events if e[0] == "change"]


def judge(
    seen: Seen,
    records: dict[int, list[Rec]],
    match: Match,
    complete: bool = True,
    snapshot: bool = True,
) -> Token:
    """Assert the stream is the topic from its snapshot on; returns the ready position.
    `complete`: every selected record the topic holds must have arrived. `snapshot=False`:
    the watch asked for none, so it must have sent none (its changes are judged the same)."""
    kinds = [k for k, _, _ in seen.events]
    assert "ready" in kinds, kinds[:20]
    ready_at = kinds.index("ready")
    ready = parse(seen.events[ready_at][1] or "")
    assert ready.after is None
    rows = seen.events[:ready_at]
    assert all(k == "snapshot" for k in kinds[:ready_at])
    keys = [d["key"] for _, _, d in rows]
    assert keys == sorted(keys, key=str.encode), "snapshot rows go in key order"
    for _, ident, d in rows:
        token = parse(ident or "")
        assert token.offsets == ready.offsets and token.after == d["key"].encode()
    want = state_at(records, ready.offsets, match) if snapshot else {}
    got = {d["key"]: (d["value"], d["partition"], d["offset"]) for _, _, d in rows}
    expected = {k: (r.value, r.partition, r.offset) for k, r in want.items()}
    wrong = {
        k: (got.get(k), expected.get(k))
        for k in got.keys() | expected.keys()
        if got.get(k) != expected.get(k)
    }
    assert not wrong, f"snapshot at {ready.text()}: (got, want) {dict(list(wrong.items())[:5])}"
    expect = changes_from(records, ready.offsets, match)
    by_partition: dict[int, list[tuple[int, str, Any]]] = {p: [] for p in ready.offsets}
    last = dict(ready.offsets)
    for kind, ident, d in seen.events[ready_at + 1 :]:
        assert kind == "change", kind
        p = d["partition"]
        by_partition[p].append((d["offset"], d["key"], d["value"]))
        token = parse(ident or "")
        assert token.offsets[p] == d["offset"] + 1, (ident, d)
        for q, o in token.offsets.items():
            assert o >= last[q], f"position went back on partition {q}: {ident} after {last}"
        last = dict(token.offsets)
    for p, want_p in expect.items():
        got_p = by_partition[p]
        exact = [(r.offset, r.key, r.value) for r in want_p]
        if complete:
            assert got_p == exact, f"partition {p}: got {got_p[:5]}..., want {exact[:5]}..."
        else:
            assert got_p == exact[: len(got_p)], f"partition {p}: not a prefix of the topic"
    return ready
