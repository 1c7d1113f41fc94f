"""Joins and global tables against the reference model, on the real broker and Spark.

Orders (a stream keyed by customer) join customers (a table), a filtered
customers table (derived, not materialized: computed into a topic of its own),
and products (a global table with fewer partitions, joined by a key extractor,
Python and Column); customers join limits (table-table). Each step writes to
one topic and waits for the pipeline, so which side came first is the step
order; one case writes a table row and a stream record in the same micro-batch.
Output streams are compared per key, in order; then two serving nodes each
answer every key of the global table from their own store.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import functions as F

import tablecast as tc
from tablecast.kafka.topics import ensure_topic
from tablecast.pipeline.run.pipeline import Pipeline
from tests import reference_model as ref

from ..support.procs import eventually, start_node, stop_all
from .kafka_io import produce
from .test_pipeline_support import CUMULATIVE, TRIGGER, read_table, read_topic

pytestmark = pytest.mark.integration

STR, JSON, LONG = tc.serde.string(), tc.serde.json(), tc.serde.long()
TOPICS = {"orders": 3, "customers": 3, "limits": 3, "products": 2}
CUSTOMERS = [f"c{i}" for i in range(5)]
PRODUCTS = [f"p{i}" for i in range(4)]


def enrich(order: dict[str, Any], customer: dict[str, Any] | None) -> dict[str, Any]:
    if order["n"] == 13:
        raise ValueError("unlucky order")  # a failing joiner dead-letters its record
    return {"n": order["n"], "tier": None if customer is None else customer["tier"]}


def tier_of(order: dict[str, Any], customer: dict[str, Any] | None) -> str:
    return "none" if customer is None else customer["tier"]


def price(order: dict[str, Any], product: dict[str, Any] | None) -> dict[str, Any]:
    return {"n": order["n"], "total": None if product is None else order["n"] * product["price"]}


def product_of(k: str | None, order: dict[str, Any]) -> str | None:
    return order.get("product")


def with_limit(customer: dict[str, Any], limit: dict[str, Any]) -> dict[str, Any]:
    return {"tier": customer["tier"], "limit": limit["limit"]}


def with_any_limit(customer: dict[str, Any] | None, limit: dict[str, Any] | None) -> Any:
    """A left or outer join's joiner: either side may be missing."""
    return [
        None if customer is None else customer["tier"],
        None if limit is None else limit["limit"],
    ]


def not_banned(k: str, c: dict[str, Any]) -> bool:
    return c["tier"] != "banned"


@dataclass
class Joins:
    app: tc.App
    topic: dict[str, str]
    pipeline: Pipeline
    state_dir: Path
    #: dead letters counted by pipelines run before this one
    dead_before: int = 0
    #: (input, key, value) in the order the pipeline took them
    history: list[tuple[str, str | None, Any]] = field(default_factory=list)

    def feed(self, bootstrap: str, name: str, records: list[tuple[str | None, Any]]) -> None:
        produce(bootstrap, self.topic[name], [_encode(k, v) for k, v in records])
        self.history.extend((name, k, v) for k, v in records)

    def events(self, stream: str, table: str) -> list[ref.Event]:
        sides = {stream: "stream", table: "table"}
        return [(sides[n], k, v) for n, k, v in self.history if n in sides]

    def expected_outputs(self) -> dict[str, list[ref.Rec]]:
        orders_customers = self.events("orders", "customers")
        # the filtered table's changelog: a row that stops matching is deleted
        filtered = [
            (side, k, None if side == "table" and v is not None and not not_banned(k, v) else v)
            for side, k, v in orders_customers
        ]
        orders_products = self.events("orders", "products")
        return {
            "inner": ref.stream_table_join(orders_customers, _lucky(enrich)),
            "left": ref.stream_table_join(filtered, tier_of, how="left"),
            "global": ref.stream_table_join(orders_products, price, key=product_of),
            "global_left": ref.stream_table_join(
                orders_products, price, how="left", key=product_of
            ),
        }

    def unlucky(self) -> int:
        """Records the inner join's joiner fails on (they go to the dead-letter topic)."""
        matched = ref.stream_table_join(self.events("orders", "customers"), lambda o, c: o)
        return sum(1 for _, o in matched if o["n"] == 13)


def _lucky(joiner: Any) -> Any:
    def skip(o: dict[str, Any], c: Any) -> Any:
        return None if o["n"] == 13 else joiner(o, c)

    return skip


def _encode(k: str | None, v: Any) -> tuple[bytes | None, bytes | None]:
    return (None if k is None else k.encode(), None if v is None else orjson.dumps(v))


def build(app: tc.App, topic: dict[str, str], out: dict[str, str]) -> None:
    orders = app.stream(topic["orders"], key=STR, value=JSON)
    customers = app.table(topic["customers"], key=STR, value=JSON)
    limits = app.table(topic["limits"], key=STR, value=JSON)
    products = app.global_table(topic["products"], key=STR, value=JSON).materialize("products")
    orders.join(customers, enrich).to(out["inner"])
    orders.join(customers.filter(not_banned), tier_of, how="left", value=STR).to(out["left"])
    orders.join(products, price, key=product_of).to(out["global"])
    product = F.variant_get(F.col("value"), "$.product", "string")
    orders.join(products, price, key=product, how="left").to(out["global_left"])
    customers.join(limits, with_limit).materialize("customer_limits")
    customers.join(limits, with_any_limit, how="left").materialize("customer_limits_left")
    customers.join(limits, with_any_limit, how="outer").materialize("customer_limits_outer")
    # a joined stream aggregated: through a changelog topic whose copies the sum drops
    (
        orders.join(customers, tier_of, value=STR)
        .group_by(lambda k, tier: tier)
        .count()
        .materialize("orders_per_tier")
    )


@pytest.fixture(scope="module")
def joins(bootstrap: str, spark, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Joins]:  # type: ignore[no-untyped-def]
    app_id = f"joins{uuid.uuid4().hex[:8]}"
    topic = {name: f"{app_id}-{name}" for name in TOPICS}
    for name, partitions in TOPICS.items():
        ensure_topic(bootstrap, topic[name], partitions)
    state = tmp_path_factory.mktemp("state")
    app = start_app(app_id, topic, state)
    pipeline = app.start(bootstrap_servers=bootstrap, spark=spark)
    joins = Joins(app, topic, pipeline, state)
    try:
        yield joins
    finally:
        joins.pipeline.stop()


def start_app(app_id: str, topic: dict[str, str], state: Path) -> tc.App:
    out = {name: f"{app_id}-out-{name}" for name in ("inner", "left", "global", "global_left")}
    app = tc.App(app_id, state_dir=state, trigger=TRIGGER)
    build(app, {k: v for k, v in topic.items() if k in TOPICS}, out)
    topic.update({f"out-{k}": v for k, v in out.items()})
    return app


def per_key(records: list[ref.Rec]) -> dict[Any, list[Any]]:
    out: dict[Any, list[Any]] = {}
    for k, v in records:
        out.setdefault(k, []).append(v)
    return out


def check(joins: Joins, bootstrap: str) -> None:
    for name, want in joins.expected_outputs().items():
        serde = STR if name == "left" else JSON
        got = [
            (None if m.key() is None else m.key().decode(), serde.deserialize(m.value()))
            for m in sorted(read_topic(bootstrap, joins.topic[f"out-{name}"]), key=_coords)
        ]
        want = [(k, v) for k, v in want if v is not None]  # a None value is not written
        # per key, in order: a key's records share a partition; keyless ones do not
        got_keys, want_keys = per_key(got), per_key(want)
        for keyed in (got_keys, want_keys):
            keyed[None] = sorted(keyed.get(None, []), key=orjson.dumps)
        assert got_keys == want_keys, name
    joined = ref.stream_table_join(joins.events("orders", "customers"), tier_of)
    per_tier = ref.stream_count((tier, tier) for _, tier in joined)
    assert read_table(bootstrap, f"{joins.app.id}.table.orders_per_tier", STR, LONG) == per_tier
    tt = ref.latest(ref.table_table_join(_table_events(joins), with_limit))
    got_tt = read_table(bootstrap, f"{joins.app.id}.table.customer_limits", STR, JSON)
    assert got_tt == tt
    for how in ("left", "outer"):
        want_tt = ref.latest(ref.table_table_join(_table_events(joins), with_any_limit, how))
        got = read_table(bootstrap, f"{joins.app.id}.table.customer_limits_{how}", STR, JSON)
        assert got == want_tt, how
    products = ref.latest((k, v) for n, k, v in joins.history if n == "products")
    assert read_table(bootstrap, f"{joins.app.id}.table.products", STR, JSON) == products
    dead_letters = joins.dead_before + joins.pipeline.dead_letters.total()
    assert dead_letters == joins.unlucky()


def _coords(m: Any) -> tuple[int, int]:
    return m.partition(), m.offset()


def _table_events(joins: Joins) -> list[ref.Event]:
    sides = {"customers": "left", "limits": "right"}
    return [(sides[n], k, v) for n, k, v in joins.history if n in sides]


def test_a_table_row_just_before_a_stream_record_is_joined(joins: Joins, bootstrap: str) -> None:
    joins.feed(bootstrap, "products", [("p0", {"price": 3}), ("p1", {"price": 5})])
    joins.feed(bootstrap, "customers", [("c0", {"tier": "gold"}), ("c1", {"tier": "silver"})])
    joins.feed(bootstrap, "limits", [("c0", {"limit": 100})])
    joins.pipeline.process_all_available()
    # one micro-batch (or the table's first) each: the earlier timestamp is taken first.
    # c2 is banned and c3 is not in the filtered table the left join reads either way,
    # so its answer does not depend on when that table's own query runs
    joins.feed(bootstrap, "customers", [("c2", {"tier": "banned"})])
    time.sleep(0.05)
    joins.feed(bootstrap, "orders", [("c2", {"n": 1, "product": "p0"}), ("c3", {"n": 2})])
    time.sleep(0.05)
    joins.feed(bootstrap, "customers", [("c3", {"tier": "banned"})])
    joins.pipeline.process_all_available()
    check(joins, bootstrap)
    assert joins.expected_outputs()["inner"] == [("c2", {"n": 1, "tier": "banned"})]


def test_table_table_join_follows_updates_and_deletes_on_both_sides(
    joins: Joins, bootstrap: str
) -> None:
    steps: list[tuple[str, list[tuple[str | None, Any]]]] = [
        ("limits", [("c1", {"limit": 5})]),  # c1 in both: joined
        ("customers", [("c1", {"tier": "gold"})]),  # left update re-emits
        ("limits", [("c1", {"limit": 7}), ("c4", {"limit": 1})]),  # right update re-emits
        ("customers", [("c1", None)]),  # left delete deletes the result
        ("customers", [("c1", {"tier": "silver"})]),  # back in both
        ("limits", [("c1", None), ("c0", None)]),  # right deletes delete the results
    ]
    for name, records in steps:
        joins.feed(bootstrap, name, records)
        joins.pipeline.process_all_available()
        got = read_table(bootstrap, f"{joins.app.id}.table.customer_limits", STR, JSON)
        assert got == ref.latest(ref.table_table_join(_table_events(joins), with_limit))
    assert "c1" not in got and "c0" not in got
    check(joins, bootstrap)


def _writes(topic: str, keys: Any, value: Any, max_size: int) -> Any:
    """A step: one to `max_size` records (key, value or None) written to `topic`."""
    return st.tuples(
        st.just(topic),
        st.lists(st.tuples(keys, st.one_of(st.none(), value)), min_size=1, max_size=max_size),
    )


ORDER = st.fixed_dictionaries(
    {"n": st.integers(0, 20)}, optional={"product": st.sampled_from([*PRODUCTS, "p9"])}
)
ORDERS = _writes("orders", st.sampled_from([*CUSTOMERS, None]), ORDER, 12)
STEP = st.one_of(
    ORDERS,
    _writes(
        "customers",
        st.sampled_from(CUSTOMERS),
        st.fixed_dictionaries({"tier": st.sampled_from(["gold", "silver", "banned"])}),
        6,
    ),
    _writes(
        "limits",
        st.sampled_from(CUSTOMERS),
        st.fixed_dictionaries({"limit": st.integers(0, 9)}),
        6,
    ),
    _writes(
        "products",
        st.sampled_from(PRODUCTS),
        st.fixed_dictionaries({"price": st.integers(1, 9)}),
        4,
    ),
)


@pytest.mark.long
@CUMULATIVE
@given(steps=st.lists(STEP, min_size=1, max_size=3), orders=ORDERS)
def test_joins_match_kafka_streams(
    joins: Joins,
    bootstrap: str,
    steps: list[tuple[str, list[tuple[str | None, Any]]]],
    orders: tuple[str, list[tuple[str | None, Any]]],
) -> None:
    # every example ends with orders, so each one joins against what it changed
    for name, records in [*steps, orders]:
        joins.feed(bootstrap, name, records)
        joins.pipeline.process_all_available()
    check(joins, bootstrap)


def test_every_node_answers_every_key_of_a_global_table_itself(
    joins: Joins, bootstrap: str, tmp_path: Path
) -> None:
    products = ref.latest((k, v) for n, k, v in joins.history if n == "products")
    assert products, "the earlier tests wrote products"
    nodes = [start_node(joins.app.id, bootstrap, tmp_path) for _ in range(2)]
    try:
        for node in nodes:
            node.wait_ready()
        listed = {t["name"]: t for t in nodes[0].get("/v1/tables").json()["tables"]}
        assert listed["products"]["global"] is True
        assert listed["customer_limits"]["global"] is False
        ids = {}
        for node in nodes:
            me = [n for n in node.get("/v1/cluster").json()["nodes"] if n["url"] == node.url]
            ids[node.url] = me[0]["id"]
        topic = f"{joins.app.id}.table.products"
        for node in nodes:
            node.wait_caught_up(bootstrap, "products", topic)

        def every_node_holds_every_partition() -> bool:
            for n in nodes[0].get("/v1/cluster").json()["nodes"]:
                held = {r["partition"] for r in n["replicas"] if r["table"] == "products"}
                assert held == set(range(TOPICS["products"])), n
            return True

        eventually(every_node_holds_every_partition, 60)
        for node in nodes:
            for key, value in products.items():
                r = node.get(f"/v1/tables/products/keys/{quote(key, safe='')}")
                assert r.status_code == 200, r.text
                assert r.json()["value"] == value
                assert r.headers["X-Tablecast-Node"] == ids[node.url]
            absent = node.get("/v1/tables/products/keys/nope")
            assert absent.status_code == 404
    finally:
        stop_all(nodes)


def test_joined_records_written_twice_are_counted_once(joins: Joins, bootstrap: str) -> None:
    """What a restarted join query does after a kill, done on purpose: every record of the
    joined stream's changelog (same batch and record ids) written into it again."""
    from confluent_kafka import Producer

    changelog = f"{joins.app.id}.changelog.orders_per_tier-0"
    copies = read_topic(bootstrap, changelog)
    assert copies and all("tablecast.rid" in dict(m.headers()) for m in copies)
    p = Producer({"bootstrap.servers": bootstrap})
    for m in copies:
        p.produce(changelog, m.value(), m.key(), partition=m.partition(), headers=m.headers())
    assert p.flush(30) == 0
    joins.pipeline.process_all_available()
    check(joins, bootstrap)


def test_a_restarted_pipeline_joins_with_the_tables_in_its_checkpoint(
    joins: Joins, bootstrap: str, spark: Any
) -> None:
    # the restarted queries resume after the table records they read: only their
    # state remembers the tables, so the orders below can only join through it
    joins.feed(bootstrap, "customers", [("c0", {"tier": "platinum"})])
    joins.pipeline.process_all_available()
    joins.pipeline.stop()
    joins.dead_before += joins.pipeline.dead_letters.total()
    app = start_app(joins.app.id, joins.topic, joins.state_dir)
    joins.app, joins.pipeline = app, app.start(bootstrap_servers=bootstrap, spark=spark)
    joins.feed(
        bootstrap, "orders", [(c, {"n": i, "product": "p0"}) for i, c in enumerate(CUSTOMERS)]
    )
    joins.pipeline.process_all_available()
    check(joins, bootstrap)
    assert ("c0", {"n": 0, "tier": "platinum"}) in joins.expected_outputs()["inner"]
