"""The walking skeleton end to end: input topic -> Spark -> table topic -> node -> HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

import tablecast as tc
from tablecast.contract.partitioner import partition_for
from tablecast.kafka.topics import dlq_topic, ensure_topic
from tablecast.pipeline.run.pipeline import Pipeline

from ..support.procs import NodeProcess, eventually, start_node
from .kafka_io import produce, read_all
from .test_pipeline_support import TRIGGER

pytestmark = pytest.mark.integration

PARTITIONS = 5


@dataclass
class Running:
    app: tc.App
    topic: str
    pipeline: Pipeline
    node: NodeProcess


@pytest.fixture
def running(bootstrap: str, spark, unique: str, tmp_path: Path, logs: Path) -> Iterator[Running]:  # type: ignore[no-untyped-def]
    topic = f"{unique}-prices"
    ensure_topic(bootstrap, topic, PARTITIONS)
    app = tc.App(unique, state_dir=tmp_path / "state", trigger=TRIGGER)
    app.table(topic, key=tc.serde.string(), value=tc.serde.json()).materialize("prices")
    pipeline = app.start(bootstrap_servers=bootstrap, spark=spark)
    node = start_node(unique, bootstrap, logs)
    try:
        yield Running(app, topic, pipeline, node)
    finally:
        node.stop()
        pipeline.stop()


def value_of(node: NodeProcess, key: str) -> object:
    r = node.get(f"/v1/tables/prices/keys/{key}")
    return r.json()["value"] if r.status_code == 200 else r.status_code


def test_latest_value_partition_tombstone_and_dlq(running: Running, bootstrap: str) -> None:
    app, topic, pipeline, node = running.app, running.topic, running.pipeline, running.node
    produce(bootstrap, topic, [(f"S{i}".encode(), orjson.dumps({"p": i})) for i in range(50)])
    produce(
        bootstrap, topic, [(b"S7", orjson.dumps({"p": 700})), (b"S8", orjson.dumps({"p": 800}))]
    )
    pipeline.process_all_available()
    node.wait_ready()
    node.wait_caught_up(bootstrap, "prices", f"{app.id}.table.prices")

    r = node.get("/v1/tables/prices/keys/S7")
    assert r.status_code == 200
    body = r.json()
    assert body["key"] == "S7" and body["value"] == {"p": 700}
    assert body["partition"] == partition_for(b"S7", PARTITIONS)
    assert isinstance(body["offset"], int) and body["timestamp"] > 0
    assert r.headers["x-tablecast-lag"] == "0"
    assert r.headers["x-tablecast-node"]
    for i in range(50):
        if i not in (7, 8):
            assert value_of(node, f"S{i}") == {"p": i}

    # a tombstone deletes the key
    produce(bootstrap, topic, [(b"S3", None)])
    eventually(lambda: value_of(node, "S3") == 404)
    r = node.get("/v1/tables/prices/keys/S3")
    assert r.json()["error"]["code"] == "key_not_found"

    # bad JSON and a null key go to the dead-letter topic; good records keep flowing
    produce(bootstrap, topic, [(b"S9", b"{oops"), (None, b"{}"), (b"S10", orjson.dumps({"p": -1}))])
    eventually(lambda: value_of(node, "S10") == {"p": -1})
    assert value_of(node, "S9") == {"p": 9}
    dead = read_all(bootstrap, dlq_topic(app.id), 2)
    reasons = sorted(dict(m.headers())["tablecast.error"].decode() for m in dead)
    assert reasons == ["null key", "value is not json"]
    bad = next(m for m in dead if m.key() == b"S9")
    assert bad.value() == b"{oops"
    assert dict(bad.headers())["tablecast.source.topic"].decode() == topic


def test_tables_listing_and_bad_requests(running: Running) -> None:
    app, node = running.app, running.node
    node.wait_ready()
    tables = node.get("/v1/tables").json()["tables"]
    assert tables == [
        {
            "name": "prices",
            "topic": f"{app.id}.table.prices",
            "partitions": PARTITIONS,
            "kind": "kv",
            "global": False,
            "key_format": "string",
            "value_format": "json",
            "partitioner": "murmur2",
        }
    ]
    assert node.get("/healthz").status_code == 200

    def error(path: str, status: int, code: str) -> None:
        r = node.get(path)
        assert r.status_code == status, (path, r.text)
        assert r.headers["content-type"] == "application/json"
        assert r.json()["error"]["code"] == code

    error("/v1/tables/nope/keys/x", 404, "table_not_found")
    error("/v1/tables/prices/keys/absent", 404, "key_not_found")
    error("/v1/tables/prices/keys/x?max_lag=abc", 400, "bad_request")
    error("/v1/tables/prices/keys/x?max_lag=-1", 400, "bad_request")
    error("/v1/tables/prices/keys/" + "k" * 5000, 400, "bad_request")
    error("/v1/nothing-here", 404, "not_found")
    r = node.get("/v1/tables/prices/keys/%00%FF%2F")
    assert r.status_code in (400, 404) and "error" in r.json()
