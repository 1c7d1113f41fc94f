"""Serdes in the pipeline: Avro (plain and Confluent wire format), JSON with a schema, longs."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from pyspark.sql import functions as F

import tablecast as tc
from tablecast.kafka.topics import dlq_topic, ensure_topic

from .kafka_io import produce
from .test_pipeline_support import TRIGGER, read_table, read_topic

pytestmark = pytest.mark.integration

SCHEMA = {
    "type": "record",
    "name": "Invoice",
    "fields": [
        {"name": "store", "type": "string"},
        {"name": "total", "type": "double"},
        {"name": "items", "type": {"type": "array", "items": "string"}},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}
STR, LONG, JSON = tc.serde.string(), tc.serde.long(), tc.serde.json()


def test_avro_json_schema_and_long_serdes(
    bootstrap: str,
    spark,  # type: ignore[no-untyped-def]
    unique: str,
    tmp_path: Path,
) -> None:
    plain = tc.serde.avro(SCHEMA)
    wire = tc.serde.avro(SCHEMA, confluent=True, schema_id=7)
    topics = {n: f"{unique}-{n}" for n in ("avro", "wire", "typed", "longs")}
    for t in topics.values():
        ensure_topic(bootstrap, t, 2)
    app = tc.App(unique, state_dir=tmp_path / "state", trigger=TRIGGER)
    # Column over an Avro struct field; the table stays Avro
    app.stream(topics["avro"], STR, plain).filter(F.col("value.total") > 5).to_table().materialize(
        "big"
    )
    # Python callable on Confluent-framed Avro, written as JSON
    app.stream(topics["wire"], STR, wire).map_values(
        lambda k, v: {"store": v["store"], "cents": round(v["total"] * 100), "n": len(v["items"])},
        JSON,
    ).to_table().materialize("cents")
    # JSON with a schema is a struct: value.a is a typed column
    app.table(topics["typed"], STR, tc.serde.json("a INT, b STRING")).map_values(
        F.col("value.a") + 1, LONG
    ).materialize("a_plus_one")
    app.stream(topics["longs"], LONG, LONG).group_by_key().reduce(lambda a, b: a + b).materialize(
        "sums"
    )
    pipeline = app.start(bootstrap_servers=bootstrap, spark=spark)
    try:
        invoices = {
            "i1": {"store": "s1", "total": 9.5, "items": ["a", "b"], "note": None},
            "i2": {"store": "s2", "total": 2.0, "items": [], "note": "cheap"},
            "i3": {"store": "s3", "total": 12.25, "items": ["c"], "note": "x"},
        }
        produce(
            bootstrap,
            topics["avro"],
            [(k.encode(), plain.serialize(v)) for k, v in invoices.items()],
        )
        produce(bootstrap, topics["avro"], [(b"bad", b"\xff\xff\xff")])
        produce(
            bootstrap,
            topics["wire"],
            [(k.encode(), wire.serialize(v)) for k, v in invoices.items()],
        )
        produce(bootstrap, topics["wire"], [(b"unframed", plain.serialize(invoices["i1"]))])
        produce(
            bootstrap,
            topics["typed"],
            [(b"t1", orjson.dumps({"a": 41, "b": "x"})), (b"t2", orjson.dumps({"a": -1}))],
        )
        produce(
            bootstrap,
            topics["longs"],
            [(LONG.serialize(k), LONG.serialize(v)) for k, v in [(-5, 1), (2**40, 2), (-5, 3)]],
        )
        pipeline.process_all_available()

        assert read_table(bootstrap, f"{app.id}.table.big", STR, plain) == {
            k: v for k, v in invoices.items() if v["total"] > 5
        }
        assert read_table(bootstrap, f"{app.id}.table.cents", STR, JSON) == {
            k: {"store": v["store"], "cents": round(v["total"] * 100), "n": len(v["items"])}
            for k, v in invoices.items()
        }
        assert read_table(bootstrap, f"{app.id}.table.a_plus_one", STR, LONG) == {"t1": 42, "t2": 0}
        assert read_table(bootstrap, f"{app.id}.table.sums", LONG, LONG) == {-5: 4, 2**40: 2}
        reasons = {
            m.key(): dict(m.headers())["tablecast.error"].decode()
            for m in read_topic(bootstrap, dlq_topic(app.id))
        }
        assert reasons[b"bad"] == "value is not avro"
        assert reasons[b"unframed"] == "value is not avro"
    finally:
        pipeline.stop()
