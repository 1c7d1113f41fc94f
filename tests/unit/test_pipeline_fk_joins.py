"""Foreign-key table joins without Spark: what the DSL refuses, how the planner cuts
them, and the three per-key steps against the reference model -- delivered late, out of
order across keys, and twice, as restarted queries and Kafka deliver them."""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tablecast as tc
from tablecast.pipeline.compile.fk_join import (
    NO_FK,
    PROPAGATE,
    Match,
    Resolve,
    Subscribe,
    pack_response,
    pack_subscription,
    unpack_response,
    unpack_subscription,
)
from tablecast.pipeline.compile.join import LEFT, RIGHT
from tablecast.pipeline.compile.keyed import KeyState, deduplicated
from tablecast.pipeline.plan import queries as planner
from tests import reference_model as ref

JSON, STR = tc.serde.json(), tc.serde.string()


def plan(app: tc.App, name: str) -> list[planner.Query]:
    return planner.plan_output(app.id, app.materialized[name], list(app.materialized.values()))


def _joiner(order: Any, customer: Any) -> list[Any]:
    return [order, customer]


def _fk(k: Any, v: Any) -> Any:
    return v.get("c")


# -- DSL and planner ------------------------------------------------------------------
def test_a_foreign_key_join_is_three_queries_over_two_repartition_topics() -> None:
    app = tc.App("shop")
    customers = app.table("customers", key=tc.serde.long())
    orders = app.table("orders").filter(lambda k, v: v is not None)
    orders.join(customers, _joiner, foreign_key=_fk, how="left").materialize("enriched")
    subscribe, match, resolve = plan(app, "enriched")
    assert [s.what for s in subscribe.steps] == ["op", "fk_subscribe"]
    assert subscribe.output.role == "repartition" and subscribe.writes_batches
    # subscriptions are keyed by foreign key, in the right table's key serde
    assert subscribe.output.key == tc.serde.long()
    assert match.input == subscribe.output and match.reads_batches
    (step,) = match.steps
    assert step.what == "fk_match" and step.side is not None and step.side.topic == "customers"
    assert match.output.key == STR and match.output.role == "repartition"
    assert resolve.input == match.output and [s.what for s in resolve.steps] == ["fk_resolve"]
    assert resolve.output.topic == "shop.table.enriched" and resolve.output.value == JSON
    text = app.explain()
    assert "foreign_key=_fk" in text and "how='left'" in text
    assert "fk_match" in text and "joins  customers [source]" in text


def test_a_derived_right_table_is_computed_first() -> None:
    app = tc.App("a")
    gold = app.table("customers").filter(lambda k, v: v["tier"] == "gold")
    app.table("orders").join(gold, _joiner, foreign_key=_fk).materialize("gold_orders")
    *side, _, match, _ = plan(app, "gold_orders")
    assert [q.output.topic for q in side] == ["a.changelog.gold_orders-join0"]
    assert match.steps[0].side == side[-1].output


def test_dsl_refuses_foreign_key_joins_that_cannot_run() -> None:
    app = tc.App("a")
    orders, customers = app.table("o"), app.table("c", key=tc.serde.long())
    with pytest.raises(ValueError, match=r"'inner' or 'left'.*KIP-213"):
        orders.join(customers, _joiner, how="outer", foreign_key=_fk)
    with pytest.raises(TypeError, match="foreign_key"):
        orders.join(customers, _joiner, foreign_key="c")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="callables"):
        orders.join(customers, "joiner", foreign_key=_fk)  # type: ignore[arg-type]
    # keys of different serdes are the point of a foreign-key join
    orders.join(customers, _joiner, foreign_key=_fk).materialize("ok")


def test_wire_formats_round_trip() -> None:
    assert unpack_subscription(pack_subscription(PROPAGATE | NO_FK, 7, b"")) == (6, 7, b"")
    assert unpack_subscription(pack_subscription(1, 2**40, None)) == (1, 2**40, None)
    assert unpack_response(pack_response(3, 0, None, b"r")) == (3, 0, None, b"r")
    assert unpack_response(pack_response(3, 9, b"l", None)) == (3, 9, b"l", None)


# -- the three steps, with topics between them ---------------------------------------
PARTS = 2
COLUMNS = 10  # the envelope


def _part(kb: bytes) -> int:
    return zlib.crc32(kb) % PARTS


@dataclass
class Topic:
    """A topic's partitions of (row, batch id) and what its reader has consumed."""

    name: str
    parts: list[list[tuple[tuple[Any, ...], int | None]]] = field(
        default_factory=lambda: [[] for _ in range(PARTS)]
    )
    read: list[int] = field(default_factory=lambda: [0] * PARTS)

    def write(self, row: tuple[Any, ...], batch: int | None) -> None:
        self.parts[_part(row[0])].append((row, batch))

    def take(self, rng: random.Random | None) -> list[tuple[Any, ...]]:
        """What a micro-batch reads: a prefix of each partition's unread records (all of
        them without `rng`), as rows with their coordinates in this topic."""
        rows = []
        for p, records in enumerate(self.parts):
            end = len(records) if rng is None else rng.randint(self.read[p], len(records))
            for off in range(self.read[p], end):
                row, batch = records[off]
                # read back: raw bytes are the record's, seq 0, the timestamp kept
                rows.append((*row[:2], None, *row[:2], self.name, p, off, 0, row[9], row, batch))
            self.read[p] = end
        return rows

    @property
    def pending(self) -> bool:
        return any(r < len(p) for r, p in zip(self.read, self.parts, strict=True))


def _by_key(core: Any, rows: list[tuple[Any, ...]], group: int, store: dict[Any, Any]) -> list[Any]:
    """Each key's rows to `core` in (partition, offset, seq) order, as the bucket step does;
    the keys in a random order (their groups' outputs interleave arbitrarily)."""
    by_key: dict[Any, list[tuple[Any, ...]]] = {}
    for row in sorted(rows, key=lambda r: (r[6], r[7], r[8])):
        by_key.setdefault(row[group], []).append(row)
    out = []
    for kb, mine in by_key.items():
        out.extend(core(kb, mine, KeyState(store, kb)))
    return out


class Harness:
    """The three queries, their state stores and the topics between them."""

    def __init__(self, how: str, joiner: Any = _joiner) -> None:
        self.subscribe = Subscribe(how)
        self.match = deduplicated(Match(), keep_width=True)
        self.resolve = Resolve(joiner, how, JSON, JSON, JSON)
        self.stores: list[dict[Any, Any]] = [{}, {}, {}]
        self.left, self.right = Topic("left"), Topic("right")
        self.subs, self.responses = Topic("subs"), Topic("responses")
        self.batches = [0, 0]
        self.results: list[tuple[Any, ...]] = []

    def send(self, side: str, key: str, value: Any, ts: int) -> None:
        kb = key.encode()
        vb = None if value is None else JSON.serialize(value)
        row = (kb, vb, None, kb, vb, side, 0, 0, 0, ts)
        (self.left if side == "left" else self.right).write(row, None)

    def step(self, which: int, rng: random.Random | None, copies: int = 1) -> None:
        """One micro-batch of query `which`; its output written `copies` times (a driver
        killed after writing restarts the batch from the same state and writes it again)."""
        if which == 0:
            rows = []
            for row in self.left.take(rng):
                fk = None if row[1] is None else _fk(None, JSON.deserialize(row[1]))
                fkb = None if fk is None else STR.serialize(fk)  # the right key serde
                rows.append((*row[:COLUMNS], None, None, None, None, fkb))
            out, topic = _by_key(self.subscribe, rows, 0, self.stores[0]), self.subs
        elif which == 1:
            rows = [(*r[:COLUMNS], r[10][10], r[11], r[10][11], r[10][12], r[0], LEFT)
                    for r in self.subs.take(rng)]  # fmt: skip
            rows += [(*r[:COLUMNS], None, None, None, None, r[0], RIGHT)
                     for r in self.right.take(rng)]  # fmt: skip
            out, topic = _by_key(self.match, rows, 14, self.stores[1]), self.responses
        else:
            rows = [r[:COLUMNS] for r in self.responses.take(rng)]
            if rng is not None:
                rng.shuffle(rows)  # written by many groups: no order between them
            self.results.extend(_by_key(self.resolve, rows, 0, self.stores[2]))
            return
        assert all(r[2] is None for r in out)
        self.batches[which] += 1
        for _ in range(copies):
            for row in out:
                topic.write(row, self.batches[which])

    def drain(self) -> None:
        while self.left.pending or self.right.pending or self.subs.pending:
            for which in (0, 1):
                self.step(which, None)
        self.step(2, None)

    def changelog(self) -> list[tuple[str, Any]]:
        """The result records written (not the dead-lettered ones)."""
        return [
            (r[0].decode(), None if r[1] is None else JSON.deserialize(r[1]))
            for r in self.results
            if r[2] is None
        ]

    def table(self) -> dict[str, Any]:
        return ref.latest(self.changelog())


LEFT_VALUES = st.one_of(
    st.none(),
    st.fixed_dictionaries({"c": st.sampled_from(["x", "y", "z", None]), "n": st.integers(0, 3)}),
)
EVENTS = st.lists(
    st.one_of(
        st.tuples(st.just("left"), st.sampled_from(["a", "b", "c"]), LEFT_VALUES),
        st.tuples(
            st.just("right"),
            st.sampled_from(["x", "y", "z"]),
            st.one_of(st.none(), st.integers(0, 3)),
        ),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(events=EVENTS, how=st.sampled_from(["inner", "left"]))
def test_one_event_at_a_time_changes_the_table_as_kafka_streams_does(
    events: list[tuple[str, str, Any]], how: str
) -> None:
    h = Harness(how)
    for i, (side, k, v) in enumerate(events):
        h.send(side, k, v, i)
        h.drain()
    want = ref.table_table_fk_join(events, _joiner, _fk, how)
    # the same changes to the table; Kafka Streams also forwards tombstones of keys
    # without a result, which change nothing
    assert ref.changes(h.changelog()) == ref.changes(want)


@settings(max_examples=500, deadline=None)
@given(
    events=EVENTS,
    how=st.sampled_from(["inner", "left"]),
    seed=st.integers(0, 2**32),
    schedule=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 2)), max_size=60),
)
def test_any_delivery_ends_in_the_table_kafka_streams_ends_in(
    events: list[tuple[str, str, Any]], how: str, seed: int, schedule: list[tuple[int, int]]
) -> None:
    # events arrive over the schedule; each query runs micro-batches of what it finds,
    # any prefix of each partition, sometimes written twice; responses of a batch
    # reach the resolve step in any order
    rng = random.Random(seed)
    h = Harness(how)
    sent = 0
    for which, copies in schedule:
        if sent < len(events):
            n = rng.randint(0, 3)
            for side, k, v in events[sent : sent + n]:
                h.send(side, k, v, sent)
                sent += 1
        h.step(which, rng, copies)
    for i, (side, k, v) in enumerate(events[sent:], sent):
        h.send(side, k, v, i)
    h.drain()
    assert h.table() == ref.latest(ref.table_table_fk_join(events, _joiner, _fk, how))


def test_a_stale_response_never_overwrites_a_newer_one() -> None:
    # a moves from x to y; x's answer for the old value comes last, and is dropped
    h = Harness("inner")
    h.send("right", "x", 1, 0)
    h.send("right", "y", 2, 1)
    h.send("left", "a", {"c": "x", "n": 0}, 2)
    h.drain()
    h.send("left", "a", {"c": "y", "n": 1}, 3)
    h.step(0, None)
    h.send("right", "x", 5, 2)  # earlier: answered to a before x sees the unsubscription
    h.step(1, None)
    rows = [r[:COLUMNS] for r in h.responses.take(None)]
    assert sorted(unpack_response(r[1])[:2] for r in rows) == [(1, 2), (2, 1)]
    rows.sort(key=lambda r: unpack_response(r[1])[0], reverse=True)  # the stale one last
    h.results.extend(_by_key(h.resolve, rows, 0, h.stores[2]))
    assert h.table() == {"a": [{"c": "y", "n": 1}, 2]}


def test_a_failing_joiner_dead_letters_the_left_value_and_keeps_the_result() -> None:
    h = Harness("left", joiner=lambda o, c: o["n"] / c)
    h.send("right", "x", 2, 0)
    h.send("left", "a", {"c": "x", "n": 4}, 1)
    h.drain()
    h.send("right", "x", 0, 2)
    h.drain()
    bad = h.results[-1]
    assert bad[2].startswith("join: ZeroDivisionError") and bad[0] == b"a"
    assert JSON.deserialize(bad[1]) == {"c": "x", "n": 4}
    assert h.table() == {"a": 2.0}


def test_a_group_of_right_rows_only_has_nan_batch_ids() -> None:
    # pandas hands an integer column with nulls over as floats: a null batch id is NaN
    kb, vb = b"x", JSON.serialize(1)
    right = (kb, vb, None, kb, vb, "right", 0, 0, 0, 5, None, float("nan"), None, None, kb, RIGHT)
    store: dict[Any, Any] = {}
    assert deduplicated(Match(), keep_width=True)(kb, [right], KeyState(store, kb)) == []
    assert store[kb][:3] == (vb, 5, 1)
