"""A topic something else writes, served as a table with no pipeline: ``tablecast attach``
checks it and writes its catalog entry, the nodes serve it beside a pipeline's table,
``tablecast detach`` takes it away. The writer here is confluent-kafka with librdkafka's
default partitioner, whose partitions are not Java's."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import httpx
import orjson
import pytest
from confluent_kafka import Producer

from tablecast import Client, serde
from tablecast.cluster.catalog_follow import RECHECK_S
from tablecast.contract.partitioner import partition_for
from tablecast.kafka import config
from tablecast.kafka.broker import Broker
from tablecast.kafka.config import client_conf
from tablecast.kafka.topics import ensure_topic

from ..support.procs import NodeProcess, eventually, start_node, stop_all
from .kafka_io import read_all
from .tables import make_table

pytestmark = pytest.mark.integration

PARTITIONS = 6
KEYS = [f"card-{i}" for i in range(240)] + ["ключ-é", "a/b", "with space"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tablecast.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _librdkafka_default(bootstrap: str, topic: str, records: list[tuple[str, object]]) -> None:
    """Write as a service on confluent-kafka does: its default partitioner, JSON values."""
    producer = Producer(client_conf(bootstrap))
    for key, value in records:
        body = None if value is None else orjson.dumps(value)
        producer.produce(topic, key=key.encode(), value=body)
        producer.poll(0)
    assert producer.flush(60) == 0


def test_librdkafka_default_partitioner_is_consistent_random(bootstrap: str, unique: str) -> None:
    topic = f"{unique}-crc"
    ensure_topic(bootstrap, topic, 7)
    _librdkafka_default(bootstrap, topic, [(k, 1) for k in KEYS])
    written = read_all(bootstrap, topic, len(KEYS))
    for m in written:
        assert m.partition() == partition_for(m.key(), 7, "consistent_random"), m.key()
    # not Java's: a node hashing these keys with murmur2 would look in the wrong partition
    murmur = sum(m.partition() == partition_for(m.key(), 7, "murmur2") for m in written)
    assert murmur < len(written) / 3


def test_attach_serve_detach(bootstrap: str, unique: str, logs: Path) -> None:
    app, topic = f"{unique}-app", f"{unique}.cards"
    ensure_topic(bootstrap, topic, PARTITIONS, {"cleanup.policy": "compact"})
    model: dict[str, object] = {}
    records: list[tuple[str, object]] = []
    for i, key in enumerate(KEYS):
        records.append((key, {"points": i}))
        model[key] = {"points": i}
    for i, key in enumerate(KEYS[::3]):  # updated
        records.append((key, {"points": 1000 + i}))
        model[key] = {"points": 1000 + i}
    for key in KEYS[1::7]:  # deleted
        records.append((key, None))
        model.pop(key)
    _librdkafka_default(bootstrap, topic, records)
    # a pipeline's table in the same app
    piped = make_table(bootstrap, app, "piped", 3, serde.string(), serde.json())
    piped.write(bootstrap, [("x", {"n": 1})])

    done = _cli(
        "attach", "cards", "--app", app, "--topic", topic, "--partitioner", "consistent_random",
        "--bootstrap-servers", bootstrap,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"attached {topic} as cards ({PARTITIONS} partitions)" in done.stdout

    nodes = [start_node(app, bootstrap, logs) for _ in range(2)]
    try:
        for node in nodes:
            node.wait_ready()
        listed = {t["name"]: t for t in nodes[0].get("/v1/tables").json()["tables"]}
        assert listed["cards"]["partitioner"] == "consistent_random"
        assert listed["cards"]["attached"] is True
        assert listed["piped"]["partitioner"] == "murmur2"
        assert "attached" not in listed["piped"]
        # both nodes own some partitions: half of these reads are forwarded
        eventually(lambda: all(len(_actives(n)) > 0 for n in nodes))
        nodes[0].wait_caught_up(bootstrap, "cards", topic)
        for key in KEYS:
            got = nodes[0].get(f"/v1/tables/cards/keys/{quote(key, safe='')}")
            if key in model:
                assert got.status_code == 200, (key, got.text)
                assert got.json()["value"] == model[key], key
            else:
                assert got.status_code == 404, (key, got.text)
        assert nodes[1].get("/v1/tables/piped/keys/x").json()["value"] == {"n": 1}

        # the nodes and the Client place each key where the writer put it
        where = {m.key().decode(): m.partition() for m in read_all(bootstrap, topic, len(records))}
        with Client([n.url for n in nodes]) as client:
            for key in KEYS[:60]:
                meta = nodes[1].get(f"/v1/tables/cards/keys/{quote(key, safe='')}/metadata")
                assert meta.json()["partition"] == where[key], key
                assert client._candidates("cards", key)[0] == meta.json()["active"]["url"], key
                read = client.read("cards", key)
                assert (read.record or {}).get("value") == model.get(key), key

        # the topic gains partitions: its keys' places change, so the table is left out
        from confluent_kafka.admin import NewPartitions

        from tablecast.kafka.topics import admin

        client = admin(bootstrap)  # outlives its future
        client.create_partitions([NewPartitions(topic, PARTITIONS + 2)])[topic].result(30)

        def left_out() -> bool:
            r = nodes[0].get("/v1/tables/cards/keys/card-0")
            return r.status_code == 503 and "topic " + topic + " has 8" in r.text

        eventually(left_out, timeout=RECHECK_S + 30)
        assert nodes[1].get("/v1/tables/piped/keys/x").status_code == 200

        # a pipeline's table is not detached; the attached one is, and no node serves it
        refused = _cli("detach", "piped", "--app", app, "--bootstrap-servers", bootstrap)
        assert refused.returncode == 1
        assert "pipeline" in refused.stderr
        done = _cli("detach", "cards", "--app", app, "--bootstrap-servers", bootstrap)
        assert done.returncode == 0, done.stderr
        for node in nodes:
            eventually(lambda n=node: n.get("/v1/tables/cards/keys/card-0").status_code == 404)
            assert "cards" not in {t["name"] for t in node.get("/v1/tables").json()["tables"]}
        assert nodes[0].get("/v1/tables/piped/keys/x").status_code == 200
    finally:
        stop_all(nodes)


def _actives(node, table: str = "cards") -> list[int]:  # type: ignore[no-untyped-def]
    return [
        r["partition"]
        for n in node.get("/v1/cluster").json()["nodes"]
        if n["url"] == node.url
        for r in n["replicas"]
        if r["table"] == table and r["role"] == "active"
    ]


def _placed_by_hand(bootstrap: str, topic: str, records: list[tuple[str, int, object]]) -> None:
    """Write each record to the partition named beside it: a writer whose partitioner no
    node can compute."""
    producer = Producer(client_conf(bootstrap))
    for key, partition, value in records:
        body = None if value is None else orjson.dumps(value)
        producer.produce(topic, key=key.encode(), value=body, partition=partition)
        producer.poll(0)
    assert producer.flush(60) == 0


def test_an_unknown_partitioner_has_its_keys_looked_up(
    bootstrap: str, unique: str, logs: Path
) -> None:
    app, topic = f"{unique}-app", f"{unique}.placed"
    ensure_topic(bootstrap, topic, PARTITIONS, {"cleanup.policy": "compact"})
    keys = KEYS[:90]
    # neither murmur2 nor CRC-32: the key's length and last character
    where = {k: (len(k) * 7 + ord(k[-1])) % PARTITIONS for k in keys}
    model: dict[str, object] = {k: {"n": i} for i, k in enumerate(keys)}
    records: list[tuple[str, int, object]] = [(k, where[k], model[k]) for k in keys]
    for k in keys[1::9]:
        records.append((k, where[k], None))
        model.pop(k)
    moved = keys[4]  # its writer deletes it in one partition and writes it to another
    records.append((moved, where[moved], None))
    where[moved] = (where[moved] + 1) % PARTITIONS
    records.append((moved, where[moved], {"n": "moved"}))
    model[moved] = {"n": "moved"}
    _placed_by_hand(bootstrap, topic, records)
    done = _cli("attach", "placed", "--app", app, "--topic", topic, "--partitioner", "unknown",
                "--bootstrap-servers", bootstrap)  # fmt: skip
    assert done.returncode == 0, done.stderr

    nodes = [start_node(app, bootstrap, logs) for _ in range(2)]
    try:
        for node in nodes:
            node.wait_ready()
        assert {t["name"]: t for t in nodes[1].get("/v1/tables").json()["tables"]}["placed"][
            "partitioner"
        ] == "unknown"
        eventually(lambda: all(len(_actives(n, "placed")) > 0 for n in nodes))
        nodes[0].wait_caught_up(bootstrap, "placed", topic)
        nodes[1].wait_caught_up(bootstrap, "placed", topic)
        for _ in range(2):  # looked for, then learned
            for node in nodes:
                for key in [*keys, "never-written"]:
                    got = node.get(f"/v1/tables/placed/keys/{quote(key, safe='')}")
                    if key in model:
                        assert got.status_code == 200, (key, got.text)
                        assert got.json()["value"] == model[key], key
                    else:
                        assert got.status_code == 404, (key, got.text)
                        assert got.json()["error"]["code"] == "key_not_found"
        batch = httpx.post(
            nodes[1].url + "/v1/tables/placed/keys:batchGet", json={"keys": keys}, timeout=10
        ).json()
        for key, item in zip(keys, batch["results"], strict=True):
            assert item.get("value") == model.get(key) and item["found"] == (key in model), key
        for key in keys[:30]:
            meta = nodes[0].get(f"/v1/tables/placed/keys/{quote(key, safe='')}/metadata").json()
            assert meta["partition"] == (where[key] if key in model else None), key

        # learned keys that move or go are looked for again; a watch sees every partition.
        # The key moves from a partition of the first node to one of the second, which has
        # learned the old one: read first on the first node, which forwards it the read
        mine = _actives(nodes[0], "placed")
        again = next(k for k in keys if k in model and k != moved and where[k] in mine)
        there = next(p for p in range(PARTITIONS) if p not in mine)
        with Client([n.url for n in nodes]) as client:
            events = client.watch("placed", key=[again])
            assert next(events).event == "snapshot" and next(events).event == "ready"
            _placed_by_hand(
                bootstrap,
                topic,
                [(again, where[again], None), (again, there, {"n": 2})],
            )
            # two partitions: their events come in either order
            seen = [next(events), next(events)]
            assert all(e.event == "change" for e in seen), seen
            assert sorted(orjson.dumps(e.value) for e in seen) == [b"null", b'{"n":2}'], seen
            events.close()  # type: ignore[attr-defined]
            path = f"/v1/tables/placed/keys/{again}"

            def moved_there(n: NodeProcess) -> bool:
                got = n.get(path)
                assert got.json().get("value") == {"n": 2}, (n.url, got.status_code, got.text)
                return True

            for node in nodes:
                eventually(lambda n=node: moved_there(n))
            assert (client.read("placed", again).record or {}).get("value") == {"n": 2}
            _placed_by_hand(bootstrap, topic, [(again, there, None)])
            for node in nodes:
                eventually(
                    lambda n=node: n.get(f"/v1/tables/placed/keys/{again}").status_code == 404
                )

        # a key learned in a partition another node answers for, moved into one this node
        # answers for: that node's 404 sends this one to look again
        theirs, mine = _actives(nodes[1], "placed"), _actives(nodes[0], "placed")
        far = next(k for k in keys if k in model and k not in (moved, again) and where[k] in theirs)
        path = f"/v1/tables/placed/keys/{far}"
        for _ in range(2):
            assert nodes[0].get(path).json()["value"] == model[far]
        _placed_by_hand(bootstrap, topic, [(far, where[far], None), (far, mine[0], {"n": "far"})])
        for node in nodes:
            eventually(lambda n=node: n.get(path).json().get("value") == {"n": "far"})
    finally:
        stop_all(nodes)


def _windows_by_hand(
    bootstrap: str, topic: str, records: list[tuple[str, int, int, int | None]]
) -> None:
    """(key, window start, partition, count or None) as a Kafka Streams windowed count's
    changelog holds them (key, start, sequence number 0; an 8-byte count), each written to
    the partition named beside it."""
    producer = Producer(client_conf(bootstrap))
    for key, start, partition, count in records:
        changelog_key = key.encode() + struct.pack(">qi", start, 0)
        value = None if count is None else struct.pack(">q", count)
        producer.produce(topic, key=changelog_key, value=value, partition=partition)
    assert producer.flush(60) == 0


def test_a_window_key_whose_partition_is_unknown_is_found_by_its_windows(
    bootstrap: str, unique: str, logs: Path
) -> None:
    """A Kafka Streams window store whose input a writer placed by hand: each key is looked
    for by its windows, on either of two nodes; a key that moves is looked for again."""
    app, topic = f"{unique}-app", f"{unique}.per-minute"
    ensure_topic(bootstrap, topic, 4, {"cleanup.policy": "compact"})
    base = 1_790_000_040_000
    users = {f"user-{i}": (i * 3) % 4 for i in range(12)}  # key -> partition
    model = {u: [[base, base + 60_000, i + 1], [base + 60_000, base + 120_000, 2]]
             for i, u in enumerate(users)}  # fmt: skip
    _windows_by_hand(
        bootstrap,
        topic,
        [(u, s, users[u], n) for u, ws in model.items() for s, _, n in ws],
    )
    done = _cli("attach", "per-minute", "--app", app, "--topic", topic,
                "--key", "kafka-streams-window:string", "--value", "long", "--window-size",
                "60s", "--partitioner", "unknown", "--bootstrap-servers", bootstrap)  # fmt: skip
    assert done.returncode == 0, done.stderr

    def windows(node: NodeProcess, user: str) -> list[list[int]]:
        got = node.get(f"/v1/tables/per-minute/keys/{user}/windows", params={"from": 0})
        assert got.status_code == 200, (user, got.text)
        return [[w["start"], w["end"], w["value"]] for w in got.json()["items"]]

    nodes = [start_node(app, bootstrap, logs) for _ in range(2)]
    try:
        for node in nodes:
            node.wait_ready()
        eventually(lambda: all(len(_actives(n, "per-minute")) > 0 for n in nodes))
        for node in nodes:
            node.wait_caught_up(bootstrap, "per-minute", topic)
        for node in [*nodes, *nodes]:  # looked for, then read where it was found
            for user, expected in model.items():
                assert windows(node, user) == expected, (node.url, user)
            assert windows(node, "nobody") == []

        # a key the second node answers for, learned by the first, moves to a partition the
        # first answers for: the second's 404 sends the first to look again
        theirs, mine = _actives(nodes[1], "per-minute"), _actives(nodes[0], "per-minute")
        far = next(u for u, p in users.items() if p in theirs)
        moved = [[base + 120_000, base + 180_000, 7]]
        _windows_by_hand(
            bootstrap,
            topic,
            [(far, s, users[far], None) for s, _, _ in model[far]]
            + [(far, base + 120_000, mine[0], 7)],
        )
        for node in nodes:
            eventually(lambda n=node: windows(n, far) == moved)
    finally:
        stop_all(nodes)


def test_attach_refuses_what_it_cannot_serve(bootstrap: str, unique: str) -> None:
    app = f"{unique}-app"
    missing = _cli("attach", "t", "--app", app, "--topic", f"{unique}.none",
                   "--bootstrap-servers", bootstrap)  # fmt: skip
    assert missing.returncode == 1 and "does not exist" in missing.stderr

    deleting = f"{unique}.events"
    ensure_topic(bootstrap, deleting, 2, {"cleanup.policy": "delete"})
    refused = _cli("attach", "events", "--app", app, "--topic", deleting,
                   "--bootstrap-servers", bootstrap)  # fmt: skip
    assert refused.returncode == 1
    assert "cleanup.policy=delete" in refused.stderr and "--retention-ok" in refused.stderr
    accepted = _cli("attach", "events", "--app", app, "--topic", deleting, "--retention-ok",
                    "--history", "5m", "--bootstrap-servers", bootstrap)  # fmt: skip
    assert accepted.returncode == 0, accepted.stderr
    twice = _cli("attach", "events2", "--app", app, "--topic", deleting, "--retention-ok",
                 "--bootstrap-servers", bootstrap)  # fmt: skip
    assert twice.returncode == 1 and "is table events" in twice.stderr

    bad = _cli("attach", "t", "--app", app, "--topic", deleting, "--key", "xml",
               "--bootstrap-servers", bootstrap)  # fmt: skip
    assert bad.returncode == 2 and "xml" in bad.stderr
    gone = _cli("detach", "nothing", "--app", app, "--bootstrap-servers", bootstrap)
    assert gone.returncode == 1 and "no table nothing" in gone.stderr


def test_attach_through_sasl_ssl(secure_broker: Broker, unique: str, logs: Path) -> None:
    """attach, the nodes and detach reach a SASL_SSL-only broker through one --kafka-config."""
    settings = str(secure_broker.client_properties)
    bootstrap = secure_broker.bootstrap_servers
    app, topic = f"{unique}-app", f"{unique}.secure"
    config.use(settings)  # this process's own clients: the topic and its writer
    try:
        ensure_topic(bootstrap, topic, 3, {"cleanup.policy": "compact"})
        _librdkafka_default(bootstrap, topic, [(k, {"n": i}) for i, k in enumerate(KEYS[:50])])
    finally:
        config.use(None)
    common = ("--app", app, "--bootstrap-servers", bootstrap, "--kafka-config", settings)
    done = _cli("attach", "secure", "--topic", topic, "--partitioner", "consistent_random", *common)
    assert done.returncode == 0, done.stderr
    node = start_node(app, bootstrap, logs, "--kafka-config", settings)
    try:
        node.wait_ready()
        for i, key in enumerate(KEYS[:50]):
            got = node.get(f"/v1/tables/secure/keys/{quote(key, safe='')}")
            assert got.status_code == 200 and got.json()["value"] == {"n": i}, (key, got.text)
        done = _cli("detach", "secure", *common)
        assert done.returncode == 0, done.stderr
        eventually(lambda: node.get("/v1/tables/secure/keys/card-0").status_code == 404)
    finally:
        stop_all([node])
