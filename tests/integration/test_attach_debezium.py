"""A real PostgreSQL database's change stream, from Debezium's connector in Kafka Connect,
attached as tables: after random inserts, updates and deletes every key answers what
SELECT says, also after kill -9 of a node (its standby takes over). One database and
one Connect worker for the module."""

from __future__ import annotations

import asyncio
import random
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import grpc
import httpx
import orjson
import pytest

import tablecast
from tablecast.grpc.service import TablesStub
from tablecast.kafka.broker import free_port
from tablecast.proto import tables_pb2 as pb

from ..support.debezium import DebeziumConnect
from ..support.postgres import Postgres
from ..support.procs import NodeProcess, eventually, start_node, stop_all
from ..support.registry import SchemaRegistry
from .kafka_io import read_all

pytestmark = pytest.mark.integration

IDS = range(1, 301)
SEED = 51


@pytest.fixture(scope="module")
def pg() -> Iterator[Postgres]:
    server = Postgres().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def connect(bootstrap: str, pg: Postgres) -> Iterator[DebeziumConnect]:
    with pg.connect(autocommit=True) as conn:
        conn.execute("CREATE TABLE customers (id int PRIMARY KEY, name text, points int)")
        conn.execute(
            "CREATE TABLE bookings (customer int, code text, seats int, "
            "PRIMARY KEY (customer, code))"
        )
        # rows before the connector starts: they come as its snapshot (op r)
        for i in IDS[:100]:
            conn.execute("INSERT INTO customers VALUES (%s, %s, %s)", (i, f"c{i}", i))
        for c in range(1, 11):
            conn.execute("INSERT INTO bookings VALUES (%s, 'AB 1', %s)", (c, c))
    worker = DebeziumConnect(
        bootstrap, pg, f"pg{random.randrange(1 << 30)}", ["customers", "bookings"]
    ).start()
    try:
        for table, count in (("customers", 100), ("bookings", 10)):
            eventually(
                lambda t=table, n=count: (
                    _written(bootstrap, worker.topic(t)) >= n or not worker.alive()
                ),
                timeout=180,
            )
            assert worker.alive(), worker.log_tail()
        yield worker
    finally:
        worker.stop()


def _written(bootstrap: str, topic: str) -> int:
    from tablecast.kafka.topics import end_offsets

    return sum(end_offsets(bootstrap, topic).values())


def _change(pg: Postgres, rng: random.Random, operations: int) -> None:
    """Random inserts, updates and deletes, a few to a transaction."""
    with pg.connect() as conn:
        for n in range(operations):
            i = rng.choice(IDS)
            what = rng.random()
            if what < 0.45:
                conn.execute(
                    "INSERT INTO customers VALUES (%s, %s, %s) ON CONFLICT (id) DO UPDATE "
                    "SET name = excluded.name, points = excluded.points",
                    (i, f"c{i}-{n}", rng.randrange(10_000)),
                )
            elif what < 0.8:
                conn.execute("UPDATE customers SET points = points + 1 WHERE id = %s", (i,))
            else:
                conn.execute("DELETE FROM customers WHERE id = %s", (i,))
            if rng.random() < 0.1:
                c, code = rng.randrange(1, 15), rng.choice(["AB 1", "ü/2", "x"])
                if rng.random() < 0.7:
                    conn.execute(
                        "INSERT INTO bookings VALUES (%s, %s, %s) ON CONFLICT (customer, code) "
                        "DO UPDATE SET seats = excluded.seats",
                        (c, code, n),
                    )
                else:
                    conn.execute(
                        "DELETE FROM bookings WHERE customer = %s AND code = %s", (c, code)
                    )
            if n % 8 == 7:
                conn.commit()
        conn.commit()


def _selected(pg: Postgres) -> tuple[dict[int, dict[str, Any]], dict[tuple[int, str], int]]:
    with pg.connect() as conn:
        customers = {
            i: {"id": i, "name": name, "points": points}
            for i, name, points in conn.execute("SELECT id, name, points FROM customers")
        }
        bookings = {
            (c, code): seats
            for c, code, seats in conn.execute("SELECT customer, code, seats FROM bookings")
        }
    return customers, bookings


def _answers_match(node: NodeProcess, pg: Postgres) -> bool:
    """Every key of both tables answers what SELECT says (a missing row: 404)."""
    customers, bookings = _selected(pg)
    with httpx.Client(base_url=node.url, timeout=10) as http:
        # the node's own indexes of the rows: by points, and by name
        for points in sorted({c["points"] for c in customers.values()})[::17]:
            r = http.get(f"/v1/tables/customers/index/points/{points}", params={"limit": 1000})
            want = sorted(i for i, c in customers.items() if c["points"] == points)
            if r.status_code != 200 or sorted(it["key"]["id"] for it in r.json()["items"]) != want:
                return False
        some = next(iter(customers.values()), None)
        if some is not None:
            r = http.get(f"/v1/tables/customers/index/name/{quote(some['name'], safe='')}")
            if r.status_code != 200 or [item["value"] for item in r.json()["items"]] != [some]:
                return False
        for i in IDS:
            r = http.get(f"/v1/tables/customers/keys/{i}")
            expected = customers.get(i)
            if (r.status_code, r.json().get("value")) != (
                (200, expected) if expected else (404, None)
            ):
                return False
        for c in range(1, 15):
            for code in ("AB 1", "ü/2", "x"):
                key = quote(orjson.dumps({"customer": c, "code": code}).decode(), safe="")
                r = http.get(f"/v1/tables/bookings/keys/{key}")
                seats = bookings.get((c, code))
                got = r.json()["value"]["seats"] if r.status_code == 200 else None
                if got != seats:
                    return False
    return True


def test_debezium_tables_answer_what_select_says(
    bootstrap: str, pg: Postgres, connect: DebeziumConnect, logs: Path, unique: str
) -> None:
    app = f"{unique}-app"
    for table in ("customers", "bookings"):
        info = tablecast.attach(
            table,
            app=app,
            topic=connect.topic(table),
            bootstrap_servers=bootstrap,
            key="debezium",
            value="debezium",
            history="1 day",
            indexes={"points": "$.points", "name": '$["name"]'} if table == "customers" else None,
        )
        assert info.key["fields"] == (["id"] if table == "customers" else ["customer", "code"])
    rng = random.Random(SEED)
    grpc_port = free_port()
    nodes = [
        start_node(app, bootstrap, logs, "--standby-replicas", "1", *grpc)
        for grpc in (("--grpc-port", str(grpc_port)), ())
    ]
    try:
        for node in nodes:
            node.wait_ready()
        _change(pg, rng, 1500)
        eventually(lambda: _answers_match(nodes[0], pg), timeout=120, interval=1.0)
        assert _answers_match(nodes[1], pg)

        # a key by its only field's value or by its struct's JSON; the row's time is the
        # source database's commit time (source.ts_ms), not the record's
        customers, _ = _selected(pg)
        some = min(customers)
        by_value = nodes[0].get(f"/v1/tables/customers/keys/{some}").json()
        as_json = quote(orjson.dumps({"id": some}).decode(), safe="")
        by_json = nodes[1].get(f"/v1/tables/customers/keys/{as_json}").json()
        assert by_value["value"] == by_json["value"] == customers[some]
        assert by_value["key"] == {"id": some}
        events = [
            orjson.loads(m.value())["payload"]
            for m in read_all(bootstrap, connect.topic("customers"), 1, to_the_end=True)
            if m.value() is not None and orjson.loads(m.key())["payload"] == {"id": some}
        ]
        assert by_value["timestamp"] == events[-1]["source"]["ts_ms"]
        history = nodes[0].get(f"/v1/tables/customers/keys/{some}/history").json()["items"]
        assert len(history) >= 1 and history[-1]["value"] == customers[some]

        listed = {t["name"]: t for t in nodes[0].get("/v1/tables").json()["tables"]}
        assert listed["customers"]["key_format"] == "debezium"
        assert listed["customers"]["partitioner"] == "murmur2"
        # the Client rebuilds a key's bytes as the nodes do, and asks its owner first
        with tablecast.Client([n.url for n in nodes]) as client:
            for i in list(customers)[:20]:
                meta = nodes[0].get(f"/v1/tables/customers/keys/{i}/metadata").json()
                assert client._candidates("customers", i)[0] == meta["active"]["url"], i
                assert client.get("customers", i)["value"] == customers[i]
            booking = {"customer": 1, "code": "AB 1"}
            meta_key = quote(orjson.dumps(booking).decode(), safe="")
            meta = nodes[0].get(f"/v1/tables/bookings/keys/{meta_key}/metadata").json()
            assert client._candidates("bookings", booking)[0] == meta["active"]["url"]

        # gRPC reads the same rows; a watch sees the database's next change live
        async def grpc_get(key: str) -> pb.GetResponse:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                return await TablesStub(channel).Get(pb.GetRequest(table="customers", key=key))

        for key in (str(some), orjson.dumps({"id": some}).decode()):
            got = asyncio.run(grpc_get(key))
            assert got.found and orjson.loads(got.row.value) == customers[some], key
        with tablecast.Client([nodes[0].url]) as client:
            events = client.watch("customers", key=[some])
            assert next(events).event == "snapshot" and next(events).event == "ready"
            with pg.connect(autocommit=True) as conn:
                conn.execute("UPDATE customers SET points = -7 WHERE id = %s", (some,))
            change = next(events)
            assert change.event == "change" and change.value["points"] == -7, change
            events.close()  # type: ignore[attr-defined]

        # kill -9 of a node: its standbys answer, and the changes after it too
        nodes[1].stop(signal.SIGKILL)
        _change(pg, rng, 500)
        eventually(lambda: _answers_match(nodes[0], pg), timeout=120, interval=1.0)
    finally:
        stop_all(nodes)


@pytest.mark.long  # a registry and a second Connect worker; the registry formats are in
# test_attach_registry, Debezium's events in the test above
def test_debezium_through_its_avro_converter_and_a_registry(
    bootstrap: str, pg: Postgres, logs: Path, unique: str
) -> None:
    """Debezium's events in Avro through a real registry (Apicurio's converter, writing
    Confluent's wire format): keys and rows decoded with their writer schemas, the key's
    columns taken from its subject's schema, keys looked up (their bytes hold a schema id);
    after inserts, updates and deletes every key answers what SELECT says, on two nodes."""
    registry = SchemaRegistry().start()
    worker = None
    try:
        with pg.connect(autocommit=True) as conn:
            conn.execute("CREATE TABLE cards (id int PRIMARY KEY, name text, points bigint)")
            for i in range(1, 41):  # the snapshot's rows
                conn.execute("INSERT INTO cards VALUES (%s, %s, %s)", (i, f"c{i}", i * 10))
        worker = DebeziumConnect(
            bootstrap, pg, f"av{random.randrange(1 << 30)}", ["cards"], registry=registry.root
        ).start()
        topic = worker.topic("cards")
        eventually(lambda: _written(bootstrap, topic) >= 40 or not worker.alive(), timeout=180)
        assert worker.alive(), worker.log_tail()
        app = f"{unique}-app"
        with pytest.raises(tablecast.AttachError, match="--registry"):
            tablecast.attach(
                "cards", app=app, topic=topic, bootstrap_servers=bootstrap,
                key="debezium", value="json", registry=registry.url,
            )  # fmt: skip
        info = tablecast.attach(
            "cards", app=app, topic=topic, bootstrap_servers=bootstrap,
            key="debezium", value="debezium", registry=registry.url,
        )  # fmt: skip
        assert (info.key["fields"], info.partitioner) == (["id"], "unknown")
        with pg.connect() as conn:
            for i in range(1, 61, 3):
                conn.execute(
                    "INSERT INTO cards VALUES (%s, %s, %s) ON CONFLICT (id) DO UPDATE "
                    "SET points = cards.points + 1",
                    (i, f"new{i}", i),
                )
            conn.execute("DELETE FROM cards WHERE id IN (2, 5, 44)")
            conn.commit()
        nodes = [start_node(app, bootstrap, logs) for _ in range(2)]
        try:
            for node in nodes:
                node.wait_ready()

            def matches(node: NodeProcess) -> bool:
                with pg.connect() as conn:
                    rows = {
                        i: {"id": i, "name": name, "points": points}
                        for i, name, points in conn.execute("SELECT id, name, points FROM cards")
                    }
                with httpx.Client(base_url=node.url, timeout=10) as http:
                    for i in range(1, 61):
                        r = http.get(f"/v1/tables/cards/keys/{i}")
                        want = rows.get(i)
                        if (r.status_code, r.json().get("value")) != (
                            (200, want) if want else (404, None)
                        ):
                            return False
                return True

            eventually(lambda: matches(nodes[0]), timeout=120, interval=1.0)
            assert matches(nodes[1])
            as_json = quote(orjson.dumps({"id": 7}).decode(), safe="")
            assert nodes[1].get(f"/v1/tables/cards/keys/{as_json}").json()["key"] == {"id": 7}
        finally:
            stop_all(nodes)
    finally:
        if worker is not None:
            worker.stop()
        registry.stop()
