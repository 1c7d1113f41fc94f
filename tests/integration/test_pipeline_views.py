"""materialize(history=, indexes=) end to end: the pipeline writes the catalog's
extra and each record's tc-index header, a serving node answers index, as-of and history
reads from them — after updates that move a row between index values, a delete, and a record
whose index value the contract refuses (it goes to the dead-letter topic)."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson
import pytest
from confluent_kafka import Producer
from pyspark.sql import functions as F

import tablecast as tc
from tablecast.contract.index_codec import HEADER
from tablecast.contract.partitioner import PRODUCER_CONFIG
from tablecast.kafka.topics import dlq_topic

from ..support.procs import NodeProcess, start_node
from .test_pipeline_support import read_topic, running_app

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

STR, JSON = tc.serde.string(), tc.serde.json()
TABLE = "bookings"


def build(app: tc.App, topic: str) -> None:
    app.table(topic, key=STR, value=JSON).materialize(
        TABLE,
        history=timedelta(hours=1),
        indexes={
            "train": lambda k, v: v["train"],  # a callable, one value
            "stops": lambda k, v: v["stops"],  # a callable, a list
            "coach": F.variant_get(F.col("value"), "$.coach", "string"),  # a Column
        },
    )


def booking(train: Any, stops: list[str], coach: str) -> dict[str, Any]:
    return {"train": train, "stops": stops, "coach": coach}


def test_a_pipeline_table_serves_index_as_of_and_history_reads(
    bootstrap: str, spark: Any, tmp_path_factory: pytest.TempPathFactory, logs: Path
) -> None:
    # recent: the broker's retention deletes records stamped older than 7 days
    base = int(time.time() * 1000) - 30 * 60_000
    b1 = booking("IC 1", ["Bern", "Biel"], "A")
    b1_moved = booking("IC 2", ["Zürich"], "B")
    b2 = booking("IC 1", ["Bern"], "B")
    b3 = booking("IC 2", [], "A")
    b5 = booking("IC 1", ["Biel"], "C")
    batches: list[list[tuple[str, Any, int]]] = [
        [("B1", b1, 1000), ("B2", b2, 2000), ("B3", b3, 3000)],
        [
            ("B1", b1_moved, 5000),  # moves B1 to other values under every index
            ("B5", b5, 4000),
            ("B2", None, 6000),  # a delete: gone from every index, a version in history
            ("B4", booking(True, [], "A"), 7000),  # a bool: refused, dead-lettered
        ],
    ]
    with running_app(bootstrap, spark, tmp_path_factory, "views", build, partitions=2) as r:
        p = Producer({"bootstrap.servers": bootstrap, **PRODUCER_CONFIG})
        for batch in batches:
            for k, v, ts in batch:
                value = None if v is None else orjson.dumps(v)
                p.produce(r.topic, key=k.encode(), value=value, timestamp=base + ts)
            assert p.flush(30) == 0
            r.pipeline.process_all_available()
        (dead,) = read_topic(bootstrap, dlq_topic(r.app.id))
        reason = dict(dead.headers())["tablecast.error"].decode()
        assert dead.key() == b"B4" and reason.startswith("index: BadIndex: train: True"), reason
        topic = f"{r.app.id}.table.{TABLE}"
        for m in read_topic(bootstrap, topic):
            # a tombstone carries no index values; every other row does
            assert any(h == HEADER for h, _ in m.headers() or []) == (m.value() is not None)
        node = start_node(r.app.id, bootstrap, logs)
        try:
            node.wait_ready()
            node.wait_caught_up(bootstrap, TABLE, topic)
            check_indexes(node)
            check_versions(node, base, b1, b1_moved, b2)
        finally:
            node.stop()


def keys_under(node: NodeProcess, name: str, value: str) -> list[str]:
    res = node.get(f"/v1/tables/{TABLE}/index/{name}/{quote(value, safe='')}")
    assert res.status_code == 200, res.text
    return [item["key"] for item in res.json()["items"]]


def check_indexes(node: NodeProcess) -> None:
    want = {
        ("train", "IC 1"): ["B5"],
        ("train", "IC 2"): ["B1", "B3"],
        ("stops", "Bern"): [],
        ("stops", "Biel"): ["B5"],
        ("stops", "Zürich"): ["B1"],
        ("coach", "A"): ["B3"],
        ("coach", "B"): ["B1"],
        ("coach", "C"): ["B5"],
    }
    got = {(name, value): keys_under(node, name, value) for name, value in want}
    assert got == want
    assert node.get(f"/v1/tables/{TABLE}/keys/B4").status_code == 404


def check_versions(node: NodeProcess, base: int, b1: Any, b1_moved: Any, b2: Any) -> None:
    def as_of(key: str, t: int) -> tuple[int, Any]:
        res = node.get(f"/v1/tables/{TABLE}/keys/{key}", params={"as_of": base + t})
        return res.status_code, res.json().get("value") if res.status_code == 200 else None

    assert as_of("B1", 1500) == (200, b1)
    assert as_of("B1", 5000) == (200, b1_moved)
    assert as_of("B1", 500)[0] == 404  # before its first version
    assert as_of("B2", 5999) == (200, b2)
    assert as_of("B2", 6000)[0] == 404  # deleted then
    res = node.get(f"/v1/tables/{TABLE}/keys/B2/history")
    assert res.status_code == 200, res.text
    versions = [(v["timestamp"] - base, v["value"]) for v in res.json()["items"]]
    assert versions == [(2000, b2), (6000, None)]
    res = node.get(f"/v1/tables/{TABLE}/keys/B1/history")
    versions = [(v["timestamp"] - base, v["value"]) for v in res.json()["items"]]
    assert versions == [(1000, b1), (5000, b1_moved)]


def test_index_headers_and_refusals_of_both_forms(spark: Any) -> None:
    """Column and callable indexes on one flow (no Kafka): the headers a node reads, and the
    rows whose values the contract refuses marked for the dead-letter topic with the reason."""
    from tablecast.pipeline.compile import envelope as env
    from tablecast.pipeline.compile import index
    from tablecast.pipeline.compile.flow import Flow

    value = tc.serde.json("x double, s string, tags array<string>, p long")
    rows = {
        "k1": {"x": 4.0, "s": "a", "tags": ["p", None, "q"], "p": 7},
        "k2": {"x": -1.0, "s": "b", "tags": [], "p": 1},  # sqrt(-1): NaN
        "k3": {"x": 1.0, "s": "y" * 1100, "tags": [], "p": 1},  # over 1024 bytes
        "k4": {"x": 1.0, "s": "c", "tags": ["t"] * 1001, "p": 1},  # over 1000 values
        "k5": None,  # a tombstone: no header
        "k6": {"x": 1.0, "s": "d", "tags": []},  # the callable raises KeyError
        "k7": {"x": None, "s": None, "tags": [None], "p": None},  # no value anywhere
    }
    data = [
        (k.encode(), None if v is None else orjson.dumps(v), None, None, None, "t", 0, i, 0, 0)
        for i, (k, v) in enumerate(rows.items())
    ]
    df = spark.createDataFrame(data, env.schema())
    indexes = (
        ("x", F.col("value.x")),
        ("root", F.sqrt(F.col("value.x"))),
        ("s", F.col("value.s")),
        ("tags", F.col("value.tags")),
        ("py", lambda k, v: v["p"]),
    )
    flow, headers = index.apply(Flow(df, STR, value, "table"), indexes)
    got = {
        r["key"].decode(): (r[env.ERR], r[index.INDEX], len(r["h"]))
        for r in flow.df.select("key", env.ERR, index.INDEX, headers.alias("h")).collect()
    }
    k1_err, k1_header, k1_headers = got.pop("k1")
    assert k1_err is None and k1_headers == 1
    assert orjson.loads(k1_header) == {"x": 4.0, "root": 2.0, "s": "a", "tags": ["p", "q"], "py": 7}
    assert got["k5"] == got["k7"] == (None, None, 0)
    reasons = {k: (err or "").split(":")[0] for k, (err, _, _) in got.items()}
    assert reasons == {
        "k2": "index root",
        "k3": "index s",
        "k4": "index tags",
        "k5": "",
        "k6": "index",
        "k7": "",
    }
    assert "KeyError" in got["k6"][0]
