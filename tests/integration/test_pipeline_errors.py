"""Bad records never stop the pipeline: they land in <app>.dlq while good ones flow."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from pyspark.sql import functions as F

import tablecast as tc
from tablecast.kafka.topics import dlq_topic, ensure_topic
from tests.support.procs import eventually

from .kafka_io import produce
from .test_pipeline_support import TRIGGER, read_table, read_topic

pytestmark = pytest.mark.integration

LONG, STR, JSON = tc.serde.long(), tc.serde.string(), tc.serde.json()


def checked_add(a: int, b: int) -> int:
    if b == 7:
        raise ValueError("seven is not allowed")
    return a + b


def test_poison_records_go_to_the_dlq_and_good_ones_flow(
    bootstrap: str,
    spark,  # type: ignore[no-untyped-def]
    unique: str,
    tmp_path: Path,
) -> None:
    topic = f"{unique}-rows"
    ensure_topic(bootstrap, topic, 3)
    app = tc.App(unique, state_dir=tmp_path / "state", trigger=TRIGGER)
    rows = app.table(topic, key=STR, value=JSON)
    rows.map_values(lambda k, v: 100 // v["x"], LONG).materialize("ratio")
    # a Column whose result does not fit the declared serde: that row is bad, not a delete
    rows.map_values(F.variant_get("value", "$.s", "string"), LONG).materialize("s_long")
    rows.group_by(lambda k, v: ("all", v["x"]), value=LONG).aggregate(
        lambda: 0, lambda k, v, a: checked_add(a, v), lambda k, v, a: a - v, LONG
    ).materialize("total")
    # a selector that raises on r9's record, inside the retraction: dead-lettered as read;
    # zero, word and seven count (bad-json and the null key never reach it)
    rows.group_by(lambda k, v: ("n", 1 // (v["x"] - 9)), value=LONG).count().materialize("n")
    pipeline = app.start(bootstrap_servers=bootstrap, spark=spark)
    try:
        good = [(f"r{i}", {"x": i + 1, "s": str(i)}) for i in range(5)]
        produce(
            bootstrap,
            topic,
            [
                *((k.encode(), orjson.dumps(v)) for k, v in good),
                (b"bad-json", b"{not json"),
                (None, orjson.dumps({"x": 1, "s": "1"})),
                (b"zero", orjson.dumps({"x": 0, "s": "0"})),
                (b"word", orjson.dumps({"x": 2, "s": "two"})),
                (b"seven", orjson.dumps({"x": 7, "s": "7"})),
                (b"r9", orjson.dumps({"x": 9, "s": "9"})),
            ],
        )
        pipeline.process_all_available()

        ratio = read_table(bootstrap, f"{app.id}.table.ratio", STR, LONG)
        assert ratio == {
            k: 100 // v["x"]
            for k, v in [*good, ("word", {"x": 2}), ("seven", {"x": 7}), ("r9", {"x": 9})]
        }
        s_long = read_table(bootstrap, f"{app.id}.table.s_long", STR, LONG)
        assert s_long == {**{k: int(v["s"]) for k, v in good}, "zero": 0, "seven": 7, "r9": 9}
        # the record whose adder raised contributes nothing; every other one does
        total = read_table(bootstrap, f"{app.id}.table.total", STR, LONG)
        assert total == {"all": sum(v["x"] for _, v in good) + 0 + 2 + 9}

        dead = read_topic(bootstrap, dlq_topic(app.id))
        reasons: dict[bytes | None, set[str]] = {}
        for m in dead:
            h = {k: v.decode() for k, v in m.headers()}
            assert h["tablecast.source.partition"].isdigit()
            assert h["tablecast.source.offset"].isdigit()
            reasons.setdefault(m.key(), set()).add(h["tablecast.error"].split(":")[0])
            if m.key() == b"bad-json":
                assert m.value() == b"{not json" and h["tablecast.source.topic"] == topic
            if m.key() == b"r9":  # the source record's own bytes, as for every bad record
                assert m.value() == orjson.dumps({"x": 9, "s": "9"})
                assert h["tablecast.source.topic"] == topic
        assert reasons[b"bad-json"] == {"value is not json"}
        assert reasons[None] == {"null key"}
        assert reasons[b"zero"] == {"map_values"}
        assert reasons[b"word"] == {"value does not fit serde.long()"}
        assert reasons[b"r9"] == {"select_group"}
        # an aggregation's bad change is the repartition record (keyed by group);
        # its reason names the source record's partition and offset
        assert reasons[b"all"] == {"aggregate"}
        seven = next(m for m in dead if m.key() == b"all")
        assert (
            "seven is not allowed (source partition"
            in dict(seven.headers())["tablecast.error"].decode()
        )
        assert read_table(bootstrap, f"{app.id}.table.n", STR, LONG) == {"n": len(good) + 3}
        # counted: bad-json and the null key once per query that reads the source,
        # the four failing records once each. The count comes with Spark's progress
        # events, which reach the listener after the batch (a CI run once read 8 of 9)
        assert len(dead) == 2 * 4 + 4
        eventually(lambda: pipeline.dead_letters.total() == len(dead), 30)

        # the same progress reports make the status points, with the counts in them
        def counted() -> int:
            return sum(p["dead_letters"] for p in dict(pipeline._latest).values())

        eventually(lambda: counted() == len(dead), 30)
        assert set(pipeline._latest) == set(pipeline.queries)
    finally:
        pipeline.stop()
