"""A serving node contains what goes wrong under it: bad records and catalog entries produced
straight into its topics, a disk that fills up under its stores, consumers gone deaf (a Kafka
outage is test_outage.py's)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import orjson
import pytest

from tablecast import serde
from tablecast.contract.table_info import TableInfo
from tablecast.kafka.broker import free_port
from tablecast.kafka.topics import TABLE_TOPIC_CONFIG, catalog_topic, ensure_topic, table_topic

from ..support.procs import NodeProcess, eventually, start_node
from .kafka_io import produce
from .tables import TableModel, make_table

pytestmark = pytest.mark.integration

PARTITIONS = 3


def metric(node: NodeProcess, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include `labels`."""
    total = 0.0
    want = [f'{k}="{v}"' for k, v in labels.items()]
    for line in node.get("/metrics").text.splitlines():
        if line.startswith(name) and all(w in line for w in want):
            total += float(line.split()[-1])
    return total


def read_all(node: NodeProcess, table: str) -> list[tuple[str, object]]:
    """Every row through range pages of 7, each page a 200 with valid JSON."""
    items: list[tuple[str, object]] = []
    cursor = None
    for _ in range(1000):
        r = node.get(
            f"/v1/tables/{table}/range",
            params={"limit": "7", **({"cursor": cursor} if cursor else {})},
        )
        assert r.status_code == 200, r.text
        body = orjson.loads(r.content)
        items.extend((i["key"], i["value"]) for i in body["items"])
        cursor = body["next_cursor"]
        if cursor is None:
            return items
    raise AssertionError("range pagination did not end")


def check_exact(node: NodeProcess, model: TableModel) -> None:
    name = model.info.name
    ks = model.info.key_serde
    for raw, value in model.rows.items():
        text = str(ks.deserialize(raw))
        r = node.get(f"/v1/tables/{name}/keys/{quote(text, safe='')}")
        assert r.status_code == 200, (text, r.text)
        assert orjson.loads(r.content)["value"] == value, text
    assert node.get(f"/v1/tables/{name}/count").json() == {"count": len(model.rows)}


def test_bad_records_are_counted_logged_and_kept_out(
    bootstrap: str, unique: str, logs: Path
) -> None:
    kv = make_table(bootstrap, unique, "kv", PARTITIONS, serde.string(), serde.json())
    longs = make_table(bootstrap, unique, "longs", PARTITIONS, serde.string(), serde.long())
    catalog = [kv.info, longs.info]
    produce(bootstrap, catalog_topic(unique), [(i.name.encode(), i.to_json()) for i in catalog])
    kv.write(bootstrap, [(f"key-{i}", {"i": i}) for i in range(60)])
    longs.write(bootstrap, [(f"n{i}", i) for i in range(20)])
    # records no serde of the table can read, written straight into the table topics
    produce(
        bootstrap,
        kv.info.topic,
        [
            (b"\xff\xfe-not-utf8", b'{"x": 1}'),  # a key a string table cannot hold
            (b"key-7", b'{"half": '),  # key-7's latest value is not JSON: it reads as absent
            (b"key-new", b"\xffnot json"),
            (b"key-8", b'{"i": 8, "spliced": "as is"}  '),  # valid JSON with spaces: kept
        ],
    )
    produce(bootstrap, longs.info.topic, [(b"n3", b"12"), (b"n\xff", b"\x00" * 8)])
    kv.rows.pop(b"key-7")
    kv.rows[b"key-8"] = {"i": 8, "spliced": "as is"}
    longs.rows.pop(b"n3")
    kv.write(bootstrap, [(f"key-{i}", {"i": i, "after": True}) for i in range(50, 70)])

    node = start_node(unique, bootstrap, logs)
    try:
        node.wait_ready()
        node.wait_caught_up(bootstrap, "kv", kv.info.topic)
        node.wait_caught_up(bootstrap, "longs", longs.info.topic)
        check_exact(node, kv)
        check_exact(node, longs)
        assert node.get("/v1/tables/kv/keys/key-7").status_code == 404
        assert node.get("/v1/tables/kv/keys/key-new").status_code == 404
        assert node.get("/v1/tables/longs/keys/n3").status_code == 404
        assert read_all(node, "kv") == sorted((k.decode(), v) for k, v in kv.rows.items())
        assert read_all(node, "longs") == sorted((k.decode(), v) for k, v in longs.rows.items())
        r = httpx.post(
            f"{node.url}/v1/tables/kv/keys:batchGet", json={"keys": ["key-7", "key-8", "key-1"]}
        )
        assert [x["found"] for x in r.json()["results"]] == [False, True, True]
        assert metric(node, "tablecast_bad_records_total", table="kv", reason="bad key") == 1
        assert metric(node, "tablecast_bad_records_total", table="kv", reason="bad value") == 2
        assert metric(node, "tablecast_bad_records_total", table="longs") == 2
        # no broker restart here: no consumer was taken for deaf
        text = node.get("/metrics").text
        for consumer in ("table", "catalog"):
            assert f'tablecast_kafka_consumers_renewed_total{{consumer="{consumer}"}} 0.0' in text
        text = node.log_file.read_text()
        assert "table 'kv' partition" in text and "bad value: not JSON" in text
        assert "Traceback" not in text
    finally:
        node.stop()


def test_each_replica_reports_how_old_its_newest_record_is(
    bootstrap: str, unique: str, logs: Path
) -> None:
    """Freshness by the records' timestamps, per partition, in /v1/cluster and /metrics: the
    newest timestamp applied counts, not the last record's."""
    from confluent_kafka import Producer

    from tablecast.contract.partitioner import partition_for

    kv = make_table(bootstrap, unique, "kv", 2, serde.string(), serde.json())
    produce(bootstrap, catalog_topic(unique), [(b"kv", kv.info.to_json())])
    old = next(k for k in ("a", "b", "c", "d", "e") if partition_for(k.encode(), 2) == 0)
    new = next(k for k in ("a", "b", "c", "d", "e") if partition_for(k.encode(), 2) == 1)
    now_ms = int(time.time() * 1000)
    p = Producer({"bootstrap.servers": bootstrap})
    # partition 0: a record a minute old, then one two minutes old written after it
    p.produce(kv.info.topic, b"1", old.encode(), partition=0, timestamp=now_ms - 60_000)
    p.produce(kv.info.topic, b"2", old.encode(), partition=0, timestamp=now_ms - 120_000)
    p.produce(kv.info.topic, b"3", new.encode(), partition=1, timestamp=now_ms)
    assert p.flush(30) == 0
    node = start_node(unique, bootstrap, logs)
    try:
        node.wait_ready()
        node.wait_caught_up(bootstrap, "kv", kv.info.topic)
        replicas = {
            r["partition"]: r
            for n in node.get("/v1/cluster").json()["nodes"]
            for r in n["replicas"]
            if r["table"] == "kv"
        }
        asked_ms = int(time.time() * 1000)
        assert 60_000 <= replicas[0]["freshness_ms"] <= asked_ms - now_ms + 60_000
        assert 0 <= replicas[1]["freshness_ms"] <= asked_ms - now_ms
        age = metric(node, "tablecast_replica_freshness_seconds", table="kv", partition="0")
        assert 60 <= age <= (time.time() * 1000 - now_ms + 60_000) / 1000
    finally:
        node.stop()


def test_bad_catalog_entries_are_left_out_and_the_rest_serves(
    bootstrap: str, unique: str, logs: Path
) -> None:
    good = make_table(bootstrap, unique, "good", PARTITIONS, serde.string(), serde.json())
    good.write(bootstrap, [(f"k{i}", i) for i in range(30)])
    base = orjson.loads(good.info.to_json())
    late_topic = table_topic(unique, "late")
    produce(
        bootstrap,
        catalog_topic(unique),
        [
            (b"nofmt", orjson.dumps({**base, "name": "nofmt", "key": {}})),
            (b"strparts", orjson.dumps({**base, "name": "strparts", "partitions": "3"})),
            (b"garbage", b"{not json"),
            (b"\xff", orjson.dumps(base)),
            (b"late", orjson.dumps({**base, "name": "late", "topic": late_topic})),
            (b"fewer", orjson.dumps({**base, "name": "fewer", "partitions": 5})),
        ],
    )
    node = start_node(unique, bootstrap, logs)
    try:
        node.wait_ready()
        names = [t["name"] for t in node.get("/v1/tables").json()["tables"]]
        assert names == ["good"]
        node.wait_caught_up(bootstrap, "good", good.info.topic)
        check_exact(node, good)
        assert metric(node, "tablecast_catalog_bad_entries_total") == 4
        assert metric(node, "tablecast_tables_left_out") == 6
        # a table in the catalog that cannot be served yet is unavailable, not unknown
        r = node.get("/v1/tables/fewer/keys/k1")
        assert r.status_code == 503 and r.headers["retry-after"], r.text
        assert "5 partitions" in r.json()["error"]["message"]
        assert node.get("/v1/tables/nope/keys/k1").status_code == 404
        assert node.get("/v1/cluster").status_code == 200
        # the missing topic appears: the table is served without a restart
        ensure_topic(bootstrap, late_topic, PARTITIONS, TABLE_TOPIC_CONFIG)
        late = TableModel(TableInfo(**{**base, "name": "late", "topic": late_topic}))
        late.write(bootstrap, [("x", {"late": True})])
        eventually(lambda: node.get("/v1/tables/late/keys/x").status_code == 200, 30)
        names = sorted(t["name"] for t in node.get("/v1/tables").json()["tables"])
        assert names == ["good", "late"]
        text = node.log_file.read_text()
        assert "left out" in text and "Traceback" not in text
    finally:
        node.stop()


@contextlib.contextmanager
def small_disk(size_mb: int):  # type: ignore[no-untyped-def]
    """A tmpfs of `size_mb` MB, unmounted after."""
    where = Path(tempfile.mkdtemp(prefix="tablecast-test-disk-"))
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(where)], check=True
    )
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
        shutil.rmtree(where, ignore_errors=True)


def fill(disk: Path) -> Path:
    """A file that takes every byte left on `disk` (unbuffered: nothing left to flush)."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        for size in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * size)
    return filler


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_full_disk_stops_the_partition_without_a_gap_and_it_resumes(
    bootstrap: str, unique: str, logs: Path
) -> None:
    rng = random.Random(3)
    model = make_table(bootstrap, unique, "kv", PARTITIONS, serde.string(), serde.json())
    model.write(bootstrap, [(f"key-{i}", {"i": i, "v": 0}) for i in range(300)])
    with small_disk(40) as disk:
        node = start_node(unique, bootstrap, logs, "--data-dir", str(disk / "node"))
        try:
            node.wait_ready()
            node.wait_caught_up(bootstrap, "kv", model.info.topic)
            check_exact(node, model)
            before = dict(model.rows)
            filler = fill(disk)
            updates = [
                (f"key-{rng.randrange(400)}", {"v": n, "pad": "x" * 800}) for n in range(600)
            ]
            model.write(bootstrap, updates)

            def failed() -> list:  # type: ignore[type-arg]
                body = node.get("/readyz").json()
                return [d for d in body["degraded"] if d["state"] == "failed"]

            stuck = eventually(failed, 30)
            assert "No space left" in stuck[0]["error"]
            assert metric(node, "tablecast_replica_write_failed") >= 1
            # the state heartbeats carry, as /v1/cluster shows it: the next heartbeat (every
            # 0.5 s) carries it, read back through Kafka, so it shows a moment after /readyz

            def failed_in_view() -> bool:
                nodes = node.get("/v1/cluster").json()["nodes"]
                replicas = [r for n in nodes for r in n["replicas"]]
                return any(r["state"] == "failed" and "No space" in r["error"] for r in replicas)

            eventually(failed_in_view, 15)
            # the failed partitions stay where they were...
            offsets = {
                (d["partition"]): metric(
                    node, "tablecast_replica_applied_offset", partition=str(d["partition"])
                )
                for d in stuck
            }
            time.sleep(6)  # longer than a replica may lag before it stops counting as caught up
            for p, offset in offsets.items():
                assert metric(node, "tablecast_replica_applied_offset", partition=str(p)) == offset
            # ...and keep answering what they hold, reported as stale
            for raw, value in before.items():
                r = node.get(f"/v1/tables/kv/keys/{quote(raw.decode(), safe='')}")
                assert r.status_code == 200, r.text
                body = r.json()
                if body["partition"] in offsets:
                    assert body["value"] == value
                    assert int(r.headers["x-tablecast-staleness-ms"]) > 0
                    assert int(r.headers["x-tablecast-lag"]) > 0
            assert node.get("/readyz").status_code == 503
            filler.unlink()
            node.wait_caught_up(bootstrap, "kv", model.info.topic, timeout=90)
            eventually(lambda: node.get("/readyz").status_code == 200, 60)
            check_exact(node, model)
            assert read_all(node, "kv") == sorted((k.decode(), v) for k, v in model.rows.items())
            assert metric(node, "tablecast_replica_write_failed") == 0
            assert metric(node, "tablecast_store_write_failures_total") >= 1
            r = node.get("/v1/tables/kv/keys/key-1")
            assert r.headers["x-tablecast-staleness-ms"] == "0"
            text = node.log_file.read_text()
            assert "failed: " in text and "store writes work again" in text
        finally:
            node.stop()


def test_unused_stores_are_dropped_and_stores_away_too_long_restore_from_scratch(
    bootstrap: str, unique: str, logs: Path
) -> None:
    # tombstones outlive compaction by 2 s only: a node away longer cannot trust its stores
    topic = table_topic(unique, "kv")
    ensure_topic(
        bootstrap, topic, PARTITIONS, {**TABLE_TOPIC_CONFIG, "delete.retention.ms": "2000"}
    )
    model = make_table(bootstrap, unique, "kv", PARTITIONS, serde.string(), serde.json())
    model.write(bootstrap, [(f"key-{i}", {"i": i}) for i in range(100)])
    data = logs / "data"
    ghost = data / "stores" / "ghost" / "0"  # a store of a partition nobody gives this node
    ghost.mkdir(parents=True)
    (ghost / "CURRENT").write_text("left by an earlier run\n")
    extra = ("--data-dir", str(data), "--drop-released-after", "1")
    node = start_node(unique, bootstrap, logs, *extra)
    try:
        node.wait_ready()
        node.wait_caught_up(bootstrap, "kv", topic)
        eventually(lambda: not ghost.exists(), 30)
        assert metric(node, "tablecast_stores_dropped_total") == 1
        assert (data / "stores" / "kv" / "0").exists()  # what it holds stays
        assert metric(node, "tablecast_stores_restored_from_scratch_total") == 0
        node.stop()
        time.sleep(3)
        model.write(bootstrap, [(f"key-{i}", None) for i in range(0, 100, 3)])
        node = start_node(unique, bootstrap, logs, *extra)
        node.wait_ready()
        node.wait_caught_up(bootstrap, "kv", topic)
        assert metric(node, "tablecast_stores_restored_from_scratch_total") == PARTITIONS
        check_exact(node, model)
        assert "restoring it from scratch" in node.log_file.read_text()
    finally:
        node.stop()


def test_a_store_another_process_holds_is_retried_and_the_rest_serves(
    bootstrap: str, unique: str, logs: Path
) -> None:
    """A partition whose RocksDB store cannot be opened (its lock held by another process,
    as a node's predecessor may still hold it) holds up no other partition, and opens once
    it can."""
    model = make_table(bootstrap, unique, "kv", PARTITIONS, serde.string(), serde.json())
    model.write(bootstrap, [(f"key-{i}", {"i": i}) for i in range(60)])
    data = logs / "data"
    node = start_node(unique, bootstrap, logs, "--data-dir", str(data))
    try:
        node.wait_ready()
        node.wait_caught_up(bootstrap, "kv", model.info.topic)
    finally:
        node.stop()
    # RocksDB locks its LOCK file with fcntl, as lockf does: a second holder is refused
    with open(data / "stores" / "kv" / "1" / "LOCK", "r+b") as lock:
        fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        node = start_node(unique, bootstrap, logs, "--data-dir", str(data))
        try:
            eventually(lambda: "partition 1 cannot be opened yet" in node.log_file.read_text(), 60)
            ks = model.info.key_serde
            elsewhere = next(k for k in model.rows if model.info.partition_of(k) != 1)
            text = str(ks.deserialize(elsewhere))
            eventually(lambda: node.get(f"/v1/tables/kv/keys/{text}").status_code == 200, 30)
            fcntl.lockf(lock, fcntl.LOCK_UN)
            node.wait_ready()
            node.wait_caught_up(bootstrap, "kv", model.info.topic)
            check_exact(node, model)
        finally:
            node.stop()


def test_a_node_killed_while_restoring_resumes_where_it_stopped(
    bootstrap: str, unique: str, logs: Path
) -> None:
    """kill -9 during the first restore: the next start applies only what is left (it used
    to restore every partition from scratch: a store never caught up looked away forever)."""
    rows = 200_000
    model = make_table(bootstrap, unique, "kv", PARTITIONS, serde.string(), serde.json())
    model.write(bootstrap, [(f"key-{i}", {"i": i}) for i in range(rows)])
    model.write(bootstrap, [(f"key-{i}", None) for i in range(0, rows, 7)])
    total = rows + len(range(0, rows, 7))
    data = logs / "data"
    node = start_node(unique, bootstrap, logs, "--data-dir", str(data))
    try:

        def applied() -> float:
            try:
                return metric(node, "tablecast_records_applied_total")
            except httpx.TransportError:  # not listening yet
                return 0.0

        eventually(lambda: applied() >= total // 4, 120, 0.02)
        before_kill = applied()
        node.stop(signal.SIGKILL)
        assert before_kill < total, "restored before the kill: nothing left to resume"
        print(f"killed with {before_kill:.0f} of {total} records applied")
        node = start_node(unique, bootstrap, logs, "--data-dir", str(data))
        node.wait_ready()
        node.wait_caught_up(bootstrap, "kv", model.info.topic)
        assert metric(node, "tablecast_stores_restored_from_scratch_total") == 0
        # what the killed node had applied is kept: only the rest is read again
        assert applied() <= total - before_kill
        assert node.get("/v1/tables/kv/count").json() == {"count": len(model.rows)}
        ks = model.info.key_serde
        for raw in random.Random(1).sample(sorted(model.rows), 300):
            text = str(ks.deserialize(raw))
            assert node.get(f"/v1/tables/kv/keys/{text}").json()["value"] == model.rows[raw]
        for i in range(0, 700, 7):  # deleted
            assert node.get(f"/v1/tables/kv/keys/key-{i}").status_code == 404
    finally:
        node.stop()


def _deaf_consumer(group: str) -> Any:
    """A real consumer that reaches no broker: deaf, as librdkafka's stayed after a broker
    restart in the chaos soak (minutes without a record or a statistic)."""
    from confluent_kafka import Consumer

    from tablecast.kafka.config import client_conf

    return Consumer(client_conf(f"127.0.0.1:{free_port()}", {"group.id": group, "log_level": 0}))


def test_a_deaf_table_consumer_is_replaced_and_nothing_is_lost(bootstrap: str, unique: str) -> None:
    """A table consumer that confirms nothing while the broker answers is replaced, and the
    new one fetches each partition from its replica's position: every record written
    meanwhile arrives, none twice."""
    from tablecast.cluster.ingest import Ingestor
    from tablecast.cluster.replica import Replica
    from tablecast.store.memory import MemoryStore

    model = make_table(bootstrap, unique, "kv", 2, serde.string(), serde.json(), store="memory")
    model.write(bootstrap, [(f"k{i}", {"n": i}) for i in range(50)])
    ingestor = Ingestor(
        bootstrap, unique, "n1", lambda info, p, wipe: Replica(info, p, MemoryStore())
    )
    ingestor.deafness.deaf_s = 3.0
    ingestor.desired = {("kv", 0), ("kv", 1)}
    healthy = None

    def holds_the_model() -> bool:
        replicas = ingestor.replicas.values()
        if len(replicas) != 2 or not all(r.caught_up for r in replicas):
            return False
        held = {}
        for r in replicas:
            for raw, rec in r.store.scan(None, None, 10_000):
                held[raw] = orjson.loads(rec.value)
        return held == model.rows

    ingestor.start()
    try:
        eventually(holds_the_model, timeout=60)
        applied = ingestor.records_applied
        healthy, ingestor._consumer = ingestor._consumer, _deaf_consumer(unique)
        time.sleep(0.5)  # a poll of the healthy consumer under way when it was swapped ends
        model.write(bootstrap, [(f"k{i}", {"n": i * 10}) for i in range(25, 75)])
        eventually(lambda: ingestor.consumers_renewed == 1, timeout=60)
        eventually(holds_the_model, timeout=60)
        assert ingestor.records_applied == applied + 50  # each record once
    finally:
        ingestor.stop()
        if healthy is not None:
            healthy.close()


def test_a_deaf_watch_feed_is_replaced_and_reads_on_from_where_it_was(
    bootstrap: str, unique: str
) -> None:
    """The watch feed's consumer, deaf the same way, is replaced too: the records written
    meanwhile reach the watches, each once and in order."""
    from tablecast.cluster.validate import checker
    from tablecast.live.events import Renderer
    from tablecast.live.topic_feed import Batch, Feed, Source

    model = make_table(bootstrap, unique, "kv", 1, serde.string(), serde.json(), store="memory")
    model.write(bootstrap, [(f"k{i}", {"n": i}) for i in range(20)])
    got: list[int] = []
    feed: Feed

    def deliver(batch: Batch) -> None:
        for _, changes in batch.changes.values():
            got.extend(c.offset for c in changes)
        feed.taken()

    feed = Feed(bootstrap, unique, deliver)
    feed.deafness.deaf_s = 3.0
    source = Source(model.info.topic, Renderer(model.info), checker(model.info))
    feed.assign(source, 0, 0, 1)
    feed.start()
    healthy = None
    try:
        eventually(lambda: got == list(range(20)), timeout=60)
        # quiet but healthy: its statistics count as word of the partition, nothing is asked
        time.sleep(5)
        assert feed.deafness.questions == 0
        healthy, feed._consumer = feed._consumer, _deaf_consumer(unique)
        time.sleep(0.5)  # a poll of the healthy consumer under way when it was swapped ends
        model.write(bootstrap, [(f"k{i}", {"n": -i}) for i in range(20)])
        eventually(lambda: feed.consumers_renewed == 1, timeout=60)
        eventually(lambda: len(got) >= 40, timeout=60)
        time.sleep(1)
        assert got == list(range(40))
    finally:
        feed.stop()
        if healthy is not None:
            healthy.close()


def test_a_deaf_catalog_reader_is_replaced_and_finds_new_tables(
    bootstrap: str, unique: str
) -> None:
    """The catalog reader, deaf the same way, is replaced too: a table created meanwhile
    is found."""
    from tablecast.kafka.catalog import CatalogReader

    make_table(bootstrap, unique, "first", 1, serde.string(), serde.json(), store="memory")
    reader = CatalogReader(bootstrap, unique)
    reader.deafness.deaf_s = 3.0
    healthy = None
    try:
        eventually(lambda: set(reader.poll(0.2)) == {"first"}, timeout=60)
        for _ in range(20):  # quiet but healthy, as the node polls it: nothing is asked
            reader.poll(0.0)
            time.sleep(0.25)
        assert reader.deafness.questions == 0
        healthy, reader._consumer = reader._consumer, _deaf_consumer(unique)
        make_table(bootstrap, unique, "second", 1, serde.string(), serde.json(), store="memory")
        eventually(lambda: set(reader.poll(0.2)) == {"first", "second"}, timeout=60)
        assert reader.consumers_renewed == 1
    finally:
        reader.close()
        if healthy is not None:
            healthy.close()
