"""Foreign-key table joins (KIP-213) against the reference model, on the real broker and
Spark.

Orders (a table keyed by order id, 3 partitions) join customers (a table keyed by a
long customer id, 2 partitions: a foreign-key join needs no co-partitioning) by the
order's ``c``: left by a Python extractor and inner by a Column (the extractor and the
join's kind are independent of each other, so the two cover both of each). After each
step every result table equals Kafka Streams' final table: a left row moving to another
customer, a right delete and re-insert, a left delete, a None foreign key (and back).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import functions as F

import tablecast as tc
from tablecast.kafka.topics import ensure_topic
from tablecast.pipeline.run.pipeline import Pipeline
from tests import reference_model as ref

from .kafka_io import produce
from .test_pipeline_support import CUMULATIVE, TRIGGER, read_table

pytestmark = pytest.mark.integration

STR, JSON, LONG = tc.serde.string(), tc.serde.json(), tc.serde.long()
TOPICS = {"orders": 3, "customers": 2}


def customer_of(k: str, order: dict[str, Any]) -> int | None:
    return order.get("c")


def enrich(order: dict[str, Any], customer: dict[str, Any] | None) -> dict[str, Any]:
    return {"n": order.get("n"), "name": None if customer is None else customer["name"]}


@dataclass
class FkJoins:
    app: tc.App
    topic: dict[str, str]
    pipeline: Pipeline
    #: ("left" | "right", key, value) in the order written and processed
    events: list[ref.Event] = field(default_factory=list)

    def feed(self, bootstrap: str, name: str, records: list[tuple[Any, Any]]) -> None:
        key = LONG if name == "customers" else STR
        wire = [(key.serialize(k), None if v is None else orjson.dumps(v)) for k, v in records]
        produce(bootstrap, self.topic[name], wire)
        side = "right" if name == "customers" else "left"
        self.events.extend((side, k, v) for k, v in records)

    def check(self, bootstrap: str) -> None:
        for name, how in (("fk_left", "left"), ("fk_column", "inner")):
            want = ref.latest(ref.table_table_fk_join(self.events, enrich, customer_of, how))
            got = read_table(bootstrap, f"{self.app.id}.table.{name}", STR, JSON)
            assert got == want, name
        assert self.pipeline.dead_letters.total() == 0


@pytest.fixture(scope="module")
def fk(bootstrap: str, spark, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FkJoins]:  # type: ignore[no-untyped-def]
    app_id = f"fkjoins{uuid.uuid4().hex[:8]}"
    topic = {name: f"{app_id}-{name}" for name in TOPICS}
    for name, partitions in TOPICS.items():
        ensure_topic(bootstrap, topic[name], partitions)
    app = tc.App(app_id, state_dir=tmp_path_factory.mktemp("state"), trigger=TRIGGER)
    orders = app.table(topic["orders"], key=STR, value=JSON)
    customers = app.table(topic["customers"], key=LONG, value=JSON)
    orders.join(customers, enrich, foreign_key=customer_of, how="left").materialize("fk_left")
    column = F.variant_get(F.col("value"), "$.c", "bigint")
    orders.join(customers, enrich, foreign_key=column).materialize("fk_column")
    pipeline = app.start(bootstrap_servers=bootstrap, spark=spark)
    try:
        yield FkJoins(app, topic, pipeline)
    finally:
        pipeline.stop()


def test_the_join_follows_foreign_key_changes_and_deletes_on_both_sides(
    fk: FkJoins, bootstrap: str
) -> None:
    steps: list[tuple[str, list[tuple[Any, Any]]]] = [
        ("customers", [(1, {"name": "ann"}), (2, {"name": "bob"})]),
        # o3's customer is missing (left: joined with None), o4 has no foreign key
        ("orders", [("o1", {"c": 1, "n": 1}), ("o2", {"c": 2}), ("o3", {"c": 3}), ("o4", {})]),
        ("orders", [("o1", {"c": 2, "n": 2})]),  # o1 moves from ann to bob
        ("customers", [(2, None)]),  # right delete: o1 and o2 lose their match
        ("customers", [(3, {"name": "cy"})]),  # a new right row: o3 matches
        ("orders", [("o3", None), ("o4", {"c": 1})]),  # left delete; None -> a key
        ("orders", [("o1", {"c": None, "n": 3})]),  # a key -> None
        ("customers", [(2, {"name": "bo"}), (1, {"name": "al"})]),  # right updates
    ]
    for name, records in steps:
        fk.feed(bootstrap, name, records)
        fk.pipeline.process_all_available()
        fk.check(bootstrap)
    got = read_table(bootstrap, f"{fk.app.id}.table.fk_left", STR, JSON)
    assert got == {
        "o1": {"n": 3, "name": None},
        "o2": {"n": None, "name": "bo"},
        "o4": {"n": None, "name": "al"},
    }


def test_both_sides_changed_in_one_micro_batch(fk: FkJoins, bootstrap: str) -> None:
    # the subscription and the right change meet in either order: the same final table
    fk.feed(bootstrap, "orders", [("o5", {"c": 5}), ("o6", {"c": 6}), ("o2", {"c": 5})])
    fk.feed(bootstrap, "customers", [(5, {"name": "eve"}), (6, {"name": "fay"}), (6, None)])
    fk.feed(bootstrap, "orders", [("o6", {"c": 5}), ("o5", None)])
    fk.pipeline.process_all_available()
    fk.check(bootstrap)


ORDERS = st.lists(
    st.tuples(
        st.sampled_from([f"o{i}" for i in range(8)]),
        st.one_of(
            st.none(),
            st.fixed_dictionaries(
                {"n": st.integers(0, 9)}, optional={"c": st.one_of(st.none(), st.integers(0, 5))}
            ),
        ),
    ),
    min_size=1,
    max_size=8,
)
CUSTOMERS = st.lists(
    st.tuples(
        st.integers(0, 5),
        st.one_of(st.none(), st.fixed_dictionaries({"name": st.sampled_from(["x", "y", "z"])})),
    ),
    min_size=1,
    max_size=4,
)


@pytest.mark.long
@CUMULATIVE
@given(steps=st.lists(st.one_of(ORDERS.map(lambda r: ("orders", r)),
                                CUSTOMERS.map(lambda r: ("customers", r))),
                      min_size=1, max_size=4),
       together=st.booleans())  # fmt: skip
def test_foreign_key_joins_match_kafka_streams(
    fk: FkJoins, bootstrap: str, steps: list[tuple[str, list[tuple[Any, Any]]]], together: bool
) -> None:
    for name, records in steps:
        fk.feed(bootstrap, name, records)
        if not together:  # else every step in one go: micro-batches cut anywhere
            fk.pipeline.process_all_available()
    fk.pipeline.process_all_available()
    fk.check(bootstrap)
