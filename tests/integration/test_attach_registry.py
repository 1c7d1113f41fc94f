"""Topics written through a real Schema Registry (Apicurio Registry's Confluent API) by
confluent-kafka's own serializers, served as tables: Avro values under two versions of
their schema, Avro values whose schema references other subjects' schemas, JSON Schema
values with an index; records not in the wire format, or of a
schema the registry does not have, counted as bad records, and the node serving on."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from tablecast import AttachError, Client, attach
from tablecast.contract import confluent_wire
from tablecast.kafka.catalog import CatalogReader
from tablecast.kafka.config import client_conf
from tablecast.kafka.topics import ensure_topic

from ..support.gateway import PASSWORD as gateway_password
from ..support.gateway import TOKEN as gateway_token
from ..support.gateway import USER as gateway_user
from ..support.gateway import RegistryGateway
from ..support.kafka_streams import StoresApp
from ..support.procs import NodeProcess, eventually, start_node
from ..support.registry import SchemaRegistry

pytestmark = pytest.mark.integration

PARTITIONS = 4
WINDOW_MS = 60_000
GAP_MS = 30_000
CARD_V1 = {
    "type": "record",
    "name": "Card",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "int"},
        {"name": "holder", "type": "string"},
        {"name": "points", "type": "long"},
    ],
}
#: a later version: an optional field more (a compatible change)
CARD_V2 = {
    **CARD_V1,
    "fields": [*CARD_V1["fields"], {"name": "tier", "type": ["null", "string"], "default": None}],
}
#: a schema that references another subject's, which references a third's
COUNTRY = {
    "type": "record",
    "name": "Country",
    "namespace": "geo",
    "fields": [{"name": "code", "type": "string"}],
}
ADDRESS = {
    "type": "record",
    "name": "Address",
    "namespace": "geo",
    "fields": [{"name": "city", "type": "string"}, {"name": "country", "type": "geo.Country"}],
}
CUSTOMER = {
    "type": "record",
    "name": "Customer",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "int"},
        {"name": "home", "type": "geo.Address"},
        {"name": "work", "type": ["null", "geo.Address"], "default": None},
    ],
}
ORDER = {
    "type": "object",
    "properties": {"order": {"type": "integer"}, "item": {"type": "string"}},
    "required": ["order", "item"],
}


@pytest.fixture(scope="module")
def registry() -> Iterator[SchemaRegistry]:
    r = SchemaRegistry().start()
    try:
        yield r
    finally:
        r.stop()


def _write(bootstrap: str, topic: str, records: list[tuple[str, bytes | None]]) -> None:
    """As a Java service writes (murmur2), the serializers' bytes as they made them."""
    producer = Producer(client_conf(bootstrap, {"partitioner": "murmur2_random"}))
    for key, value in records:
        producer.produce(topic, key=key.encode(), value=value)
    assert producer.flush(60) == 0


def _attach(app: str, topic: str, bootstrap: str, url: str, fmt: str = "confluent-avro") -> None:
    attach("cards", app=app, topic=topic, bootstrap_servers=bootstrap, value=fmt, registry=url)


def _bad_records(node: NodeProcess, table: str) -> int:
    total = 0
    for line in node.get("/metrics").text.splitlines():
        if line.startswith("tablecast_bad_records_total{") and f'table="{table}"' in line:
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def test_values_written_through_a_registry(
    bootstrap: str, unique: str, logs: Path, registry: SchemaRegistry
) -> None:
    app, cards, orders = f"{unique}-app", f"{unique}.cards", f"{unique}.orders"
    for topic in (cards, orders):
        ensure_topic(bootstrap, topic, PARTITIONS, {"cleanup.policy": "compact"})
    client = SchemaRegistryClient({"url": registry.url})
    into_cards = SerializationContext(cards, MessageField.VALUE)
    v1 = AvroSerializer(client, orjson.dumps(CARD_V1).decode())
    v2 = AvroSerializer(client, orjson.dumps(CARD_V2).decode())
    model: dict[str, Any] = {}
    records: list[tuple[str, bytes | None]] = []
    for i in range(120):
        row = {"id": i, "holder": f"holder {i} ü", "points": i * 1_000_000_007}
        records.append((f"card-{i}", v1(row, into_cards)))
        model[f"card-{i}"] = row
    for i in range(0, 120, 4):  # written again under the schema's second version
        row = {"id": i, "holder": f"holder {i}", "points": -i, "tier": "gold" if i % 8 else None}
        records.append((f"card-{i}", v2(row, into_cards)))
        model[f"card-{i}"] = row
    # a third version without the optional field again (a removed optional field)
    v3 = AvroSerializer(client, orjson.dumps({**CARD_V1, "doc": "tier removed"}).decode())
    for i in range(1, 120, 10):
        row = {"id": i, "holder": "again", "points": 3}
        records.append((f"card-{i}", v3(row, into_cards)))
        model[f"card-{i}"] = row
    records.append(("card-7", None))  # a delete
    model.pop("card-7")
    # not the wire format; a schema id the registry never gave; a payload its schema
    # does not read: each counted, its key absent
    records += [
        ("bad-magic", b"plain text"),
        ("bad-id", confluent_wire.join(987_654, b"\x02")),
        ("bad-payload", confluent_wire.join(confluent_wire.split(records[0][1])[0], b"\x02")),
    ]
    _write(bootstrap, cards, records)
    customers = f"{unique}.customers"
    ensure_topic(bootstrap, customers, PARTITIONS, {"cleanup.policy": "compact"})
    customer, people = _referencing_serializer(client, unique)
    into_customers = SerializationContext(customers, MessageField.VALUE)
    _write(bootstrap, customers, [(k, customer(v, into_customers)) for k, v in people.items()])
    into_orders = SerializationContext(orders, MessageField.VALUE)
    order = JSONSerializer(orjson.dumps(ORDER).decode(), client)
    items = ["tea", "cake", "cup"]
    ordered = {f"o-{i}": {"order": i, "item": items[i % 3]} for i in range(60)}
    _write(bootstrap, orders, [(k, order(v, into_orders)) for k, v in ordered.items()])

    with pytest.raises(AttachError, match="--registry"):
        attach("cards", app=app, topic=cards, bootstrap_servers=bootstrap, value="confluent-avro")
    _attach(app, cards, bootstrap, registry.url)
    attach(
        "orders",
        app=app,
        topic=orders,
        bootstrap_servers=bootstrap,
        value="confluent-json",
        registry=registry.url,
        indexes={"item": "$.item"},
    )
    attach(
        "customers",
        app=app,
        topic=customers,
        bootstrap_servers=bootstrap,
        value="confluent-avro",
        registry=registry.url,
    )
    data = logs / "node-data"
    node = start_node(app, bootstrap, logs, "--data-dir", str(data))
    try:
        node.wait_ready()
        _answers(node, bootstrap, (cards, orders), model, ordered)
        node.wait_caught_up(bootstrap, "customers", customers)
        for k, v in people.items():
            r = node.get(f"/v1/tables/customers/keys/{k}")
            assert (r.status_code, r.json().get("value")) == (200, v), (k, r.text)
        eventually(lambda: _bad_records(node, "cards") == 3, 10)
        # a watch gets a new version's row decoded, as reads do
        with Client([node.url]) as tc_client:
            events = tc_client.watch("cards", key=["card-9"])
            assert next(events).event == "snapshot" and next(events).event == "ready"
            row = {"id": 9, "holder": "live", "points": 9, "tier": "new"}
            _write(bootstrap, cards, [("card-9", v2(row, into_cards))])
            change = next(events)
            assert change.event == "change" and change.value == row, change
            events.close()  # type: ignore[attr-defined]
        model["card-9"] = row
        node.stop(signal.SIGKILL)  # and again on the same data
        node = start_node(app, bootstrap, logs, "--data-dir", str(data))
        node.wait_ready()
        _answers(node, bootstrap, (cards, orders), model, ordered)
    finally:
        node.stop()


def _referencing_serializer(
    client: SchemaRegistryClient, unique: str
) -> tuple[AvroSerializer, dict[str, Any]]:
    """An Avro serializer of CUSTOMER, registered with references to ADDRESS's subject, which
    references COUNTRY's (as Java's serializer registers such a schema), and rows for it."""
    version = None
    refs: list[SchemaReference] = []
    for schema in (COUNTRY, ADDRESS):
        subject = f"{unique}.{schema['namespace']}.{schema['name']}"
        client.register_schema(subject, Schema(orjson.dumps(schema).decode(), "AVRO", refs))
        version = client.get_latest_version(subject).version
        refs = [SchemaReference(f"{schema['namespace']}.{schema['name']}", subject, version)]
    main = Schema(orjson.dumps(CUSTOMER).decode(), "AVRO", refs)
    serializer = AvroSerializer(client, main, conf={"auto.register.schemas": True})
    people = {
        f"c{i}": {
            "id": i,
            "home": {"city": f"city {i}", "country": {"code": "NO" if i % 2 else "SE"}},
            "work": None if i % 3 else {"city": "Oslo", "country": {"code": "NO"}},
        }
        for i in range(30)
    }
    return serializer, people


def _answers(
    node: NodeProcess,
    bootstrap: str,
    topics: tuple[str, str],
    model: dict[str, Any],
    ordered: dict[str, Any],
) -> None:
    node.wait_caught_up(bootstrap, "cards", topics[0])
    node.wait_caught_up(bootstrap, "orders", topics[1])
    with httpx.Client(base_url=node.url, timeout=10) as http:
        for i in range(120):
            r = http.get(f"/v1/tables/cards/keys/card-{i}")
            want = model.get(f"card-{i}")
            got = r.json()["value"] if r.status_code == 200 else None
            assert (r.status_code, got) == (200 if want else 404, want), i
        for bad in ("bad-magic", "bad-id", "bad-payload"):
            assert http.get(f"/v1/tables/cards/keys/{bad}").status_code == 404
        assert http.get("/v1/tables/cards/count").json()["count"] == len(model)
        for item in {v["item"] for v in ordered.values()}:
            r = http.get(f"/v1/tables/orders/index/item/{item}", params={"limit": 100})
            want = sorted(k for k, v in ordered.items() if v["item"] == item)
            assert sorted(it["key"] for it in r.json()["items"]) == want


def test_a_record_waits_for_its_schema_while_the_registry_is_down(
    bootstrap: str, unique: str, logs: Path, registry: SchemaRegistry
) -> None:
    """A record whose schema the node has not fetched yet, with the registry not answering
    (its process stopped): the partition stops there and answers what it holds, other
    tables ingest on, and once the registry answers the record is applied, not skipped."""
    app, cards, plain = f"{unique}-app", f"{unique}.cards", f"{unique}.plain"
    ensure_topic(bootstrap, cards, 1, {"cleanup.policy": "compact"})
    ensure_topic(bootstrap, plain, 1, {"cleanup.policy": "compact"})
    client = SchemaRegistryClient({"url": registry.url})
    into = SerializationContext(cards, MessageField.VALUE)
    v1 = AvroSerializer(client, orjson.dumps(CARD_V1).decode())
    _write(bootstrap, cards, [("card-1", v1({"id": 1, "holder": "a", "points": 1}, into))])
    _attach(app, cards, bootstrap, registry.url)
    attach("plain", app=app, topic=plain, bootstrap_servers=bootstrap)
    node = start_node(app, bootstrap, logs)
    try:
        node.wait_ready()
        node.wait_caught_up(bootstrap, "cards", cards)
        # a third version, registered now (the serializer does), first read by the node later
        third = {
            **CARD_V2,
            "fields": [*CARD_V2["fields"], {"name": "x", "type": "int", "default": 0}],
        }
        v3 = AvroSerializer(client, orjson.dumps(third).decode())
        newer = v3({"id": 1, "holder": "b", "points": 2, "tier": None, "x": 5}, into)
        assert registry.proc is not None
        registry.proc.send_signal(signal.SIGSTOP)
        try:
            _write(
                bootstrap,
                cards,
                [("card-1", newer), ("card-2", v1({"id": 2, "holder": "c", "points": 3}, into))],
            )
            _write(bootstrap, plain, [("p", b'{"n":1}')])
            node.wait_caught_up(bootstrap, "plain", plain)  # the other table goes on
            eventually(
                lambda: any(
                    r["table"] == "cards" and "RegistryUnavailable" in (r.get("error") or "")
                    for n in node.get("/v1/cluster").json()["nodes"]
                    for r in n["replicas"]
                ),
                30,
            )
            # stopped at the waiting record: the row as before it, the next not yet
            assert node.get("/v1/tables/cards/keys/card-1").json()["value"]["holder"] == "a"
            assert node.get("/v1/tables/cards/keys/card-2").status_code == 404
        finally:
            registry.proc.send_signal(signal.SIGCONT)
        node.wait_caught_up(bootstrap, "cards", cards, timeout=60)
        assert node.get("/v1/tables/cards/keys/card-1").json()["value"]["x"] == 5
        assert node.get("/v1/tables/cards/keys/card-2").json()["value"]["holder"] == "c"
        assert _bad_records(node, "cards") == 0
    finally:
        node.stop()


#: a file the card's schema imports: another subject's schema, named by a reference
PLACE_PROTO = """syntax = "proto3";
package places;
message Place { string city = 1; }
"""
CARD_PROTO = """syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
import "places/place.proto";
message Card {
  enum Tier { NONE = 0; GOLD = 1; }
  int32 id = 1;
  string holder_name = 2;
  int64 points = 3;
  google.protobuf.Timestamp since = 4;
  Tier tier = 5;
  message Note { string text = 1; }
  repeated Note notes = 6;
  places.Place home = 7;
}
"""


def test_protobuf_values_answer_in_the_proto3_json_mapping(
    bootstrap: str, unique: str, logs: Path, registry: SchemaRegistry, tmp_path: Path
) -> None:
    """Written by confluent-kafka's ProtobufSerializer (which registers the schema as a
    serialized descriptor) and, as Java's serializer does, under the schema registered as
    .proto text: both answer the proto3 JSON mapping (camelCase names, 64-bit integers as
    strings, enum names, RFC 3339 times); a nested message type by its message indexes; a
    type imported from another subject's file (the schema's references name it)."""
    import importlib
    import sys

    import grpc_tools
    import httpx
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from grpc_tools import protoc

    (tmp_path / "card.proto").write_text(CARD_PROTO)
    (tmp_path / "places").mkdir()
    (tmp_path / "places" / "place.proto").write_text(PLACE_PROTO)
    includes = str(Path(grpc_tools.__file__).parent / "_proto")
    for name in ("places/place.proto", "card.proto"):
        argv = ["protoc", f"-I{tmp_path}", f"-I{includes}", f"--python_out={tmp_path}", name]
        assert protoc.main(argv) == 0
    sys.path.insert(0, str(tmp_path))
    try:
        card_pb2 = importlib.import_module("card_pb2")
    finally:
        sys.path.remove(str(tmp_path))
    app, topic = f"{unique}-app", f"{unique}.cards"
    ensure_topic(bootstrap, topic, PARTITIONS, {"cleanup.policy": "compact"})
    client = SchemaRegistryClient({"url": registry.url})
    into = SerializationContext(topic, MessageField.VALUE)
    serialize = ProtobufSerializer(card_pb2.Card, client, {"use.deprecated.format": False})
    card = card_pb2.Card(id=1, holder_name="Ada", points=2**40, tier=card_pb2.Card.GOLD)
    card.since.FromSeconds(1_790_000_000)
    card.notes.add(text="vip")
    card.home.city = "Oslo"
    # the schemas as Java's serializer registers them: .proto text, the import a reference
    r = httpx.post(
        f"{registry.url}/subjects/{unique}-place/versions",
        json={"schema": PLACE_PROTO, "schemaType": "PROTOBUF"},
    )
    assert r.status_code == 200, r.text
    ref = {"name": "places/place.proto", "subject": f"{unique}-place", "version": 1}
    r = httpx.post(
        f"{registry.url}/subjects/{unique}-text/versions",
        json={"schema": CARD_PROTO, "schemaType": "PROTOBUF", "references": [ref]},
    )
    assert r.status_code == 200, r.text
    text_id = r.json()["id"]
    plain = card_pb2.Card(id=2, holder_name="Bo")
    plain.home.city = "Bergen"
    note = card_pb2.Card.Note(text="nested")
    _write(
        bootstrap,
        topic,
        [
            ("card-1", serialize(card, into)),
            ("card-2", confluent_wire.join(text_id, b"\x00" + plain.SerializeToString())),
            # message indexes [0, 0]: the first type nested in the first message
            ("note", confluent_wire.join(text_id, b"\x04\x00\x00" + note.SerializeToString())),
            ("bad-path", confluent_wire.join(text_id, b"\x02\x0e" + note.SerializeToString())),
        ],
    )
    _attach(app, topic, bootstrap, registry.url, "confluent-protobuf")
    node = start_node(app, bootstrap, logs)
    try:
        node.wait_ready()
        node.wait_caught_up(bootstrap, "cards", topic)
        assert node.get("/v1/tables/cards/keys/card-1").json()["value"] == {
            "id": 1,
            "holderName": "Ada",
            "points": str(2**40),
            "since": "2026-09-21T14:13:20Z",
            "tier": "GOLD",
            "notes": [{"text": "vip"}],
            "home": {"city": "Oslo"},
        }
        assert node.get("/v1/tables/cards/keys/card-2").json()["value"] == {
            "id": 2,
            "holderName": "Bo",
            "home": {"city": "Bergen"},
        }
        assert node.get("/v1/tables/cards/keys/note").json()["value"] == {"text": "nested"}
        assert node.get("/v1/tables/cards/keys/bad-path").status_code == 404
        eventually(lambda: _bad_records(node, "cards") == 1, 10)
    finally:
        node.stop()


def test_a_registry_over_https_reached_with_each_process_s_settings(
    bootstrap: str, unique: str, logs: Path, tmp_path: Path
) -> None:
    """A registry that answers HTTPS only, with a certificate of a private CA. The catalog
    names it by an address neither the attaching tool nor the node use: each reaches it
    with settings of its own (--registry-config: its address and the CA), and no setting
    of theirs reaches the catalog."""
    registry = SchemaRegistry(tls=True).start()
    try:
        assert registry.ca is not None
        app, cards = f"{unique}-app", f"{unique}.cards"
        ensure_topic(bootstrap, cards, PARTITIONS, {"cleanup.policy": "compact"})
        client = SchemaRegistryClient({"url": registry.url, "ssl.ca.location": str(registry.ca)})
        into = SerializationContext(cards, MessageField.VALUE)
        v1 = AvroSerializer(client, orjson.dumps(CARD_V1).decode())
        model = {f"card-{i}": {"id": i, "holder": f"h{i}", "points": i} for i in range(40)}
        _write(bootstrap, cards, [(k, v1(v, into)) for k, v in model.items()])

        settings = tmp_path / "registry.properties"
        settings.write_text(f"schema.registry.url={registry.url}\nssl.ca.location={registry.ca}\n")
        elsewhere = "https://registry.internal.example:8081/apis/ccompat/v7"
        cli = [sys.executable, "-m", "tablecast.cli.main", "attach", "cards", "--app", app]
        cli += ["--topic", cards, "--bootstrap-servers", bootstrap, "--value", "confluent-avro"]
        cli += ["--registry", elsewhere]
        # without its settings the attaching tool cannot reach the registry it names
        refused = subprocess.run(cli, capture_output=True, text=True, timeout=120)
        assert refused.returncode != 0 and "registry" in refused.stderr, refused.stderr
        done = subprocess.run(
            [*cli, "--registry-config", str(settings)], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        reader = CatalogReader(bootstrap, app)
        try:
            entry = reader.poll(10.0)["cards"]
        finally:
            reader.close()
        assert entry.value["registry"] == elsewhere
        assert str(registry.ca) not in orjson.dumps(entry.value).decode()

        node = start_node(app, bootstrap, logs, "--registry-config", str(settings))
        try:
            node.wait_ready()
            node.wait_caught_up(bootstrap, "cards", cards)
            with httpx.Client(base_url=node.url, timeout=10) as http:
                for key, row in model.items():
                    assert http.get(f"/v1/tables/cards/keys/{key}").json()["value"] == row
            assert _bad_records(node, "cards") == 0
        finally:
            node.stop()
    finally:
        registry.stop()


CARD_KEY = {
    "type": "record",
    "name": "CardKey",
    "namespace": "shop",
    "fields": [{"name": "id", "type": "int"}, {"name": "region", "type": "string"}],
}


def test_keys_written_through_a_registry_are_looked_up(
    bootstrap: str, unique: str, logs: Path, registry: SchemaRegistry
) -> None:
    """Avro record keys and Avro string keys, as Java's serializers write them (murmur2 of
    the whole wire bytes picks the partition). A key's bytes hold its schema's id, which
    its text does not say, so the nodes look keys up: every key answers on either of two
    nodes, a record key in any field order, a string key as its text."""
    app, cards, orders = f"{unique}-app", f"{unique}.cards", f"{unique}.orders"
    for topic in (cards, orders):
        ensure_topic(bootstrap, topic, PARTITIONS, {"cleanup.policy": "compact"})
    client = SchemaRegistryClient({"url": registry.url})
    card_keys = AvroSerializer(client, orjson.dumps(CARD_KEY).decode())
    card_values = AvroSerializer(client, orjson.dumps(CARD_V1).decode())
    string_keys = AvroSerializer(client, '"string"')
    order_values = JSONSerializer(orjson.dumps(ORDER).decode(), client)
    cards_key = SerializationContext(cards, MessageField.KEY)
    cards_value = SerializationContext(cards, MessageField.VALUE)
    orders_key = SerializationContext(orders, MessageField.KEY)
    orders_value = SerializationContext(orders, MessageField.VALUE)

    model = {
        (i, region): {"id": i, "holder": f"h{i}{region}", "points": i}
        for i in range(30)
        for region in ("eu", "us")
    }
    producer = Producer(client_conf(bootstrap, {"partitioner": "murmur2_random"}))
    for (i, region), row in model.items():
        key = card_keys({"id": i, "region": region}, cards_key)
        producer.produce(cards, key=key, value=card_values(row, cards_value))
    gone = card_keys({"id": 0, "region": "us"}, cards_key)
    producer.produce(cards, key=gone, value=None)  # a delete, by its Avro key
    model.pop((0, "us"))
    # last of its partition: left out, and its offset counted as applied (the wait below)
    bad = card_values(model[(1, "eu")], cards_value)
    producer.produce(cards, key=b"not the wire format", value=bad)
    ordered = {f"o-{i}": {"order": i, "item": "tea"} for i in range(40)}
    for k, v in ordered.items():
        producer.produce(
            orders, key=string_keys(k, orders_key), value=order_values(v, orders_value)
        )
    assert producer.flush(60) == 0

    for name, topic, value in (
        ("cards", cards, "confluent-avro"),
        ("orders", orders, "confluent-json"),
    ):
        info = attach(
            name,
            app=app,
            topic=topic,
            bootstrap_servers=bootstrap,
            key="confluent-avro",
            value=value,
            registry=registry.url,
        )
        assert info.partitioner == "unknown" and info.key["registry"] == registry.url
    with pytest.raises(AttachError, match="looked up"):
        attach(
            "again",
            app=app,
            topic=cards,
            bootstrap_servers=bootstrap,
            key="confluent-avro",
            value="confluent-avro",
            registry=registry.url,
            partitioner="consistent_random",
        )
    nodes = [start_node(app, bootstrap, logs) for _ in range(2)]
    try:
        for node in nodes:
            node.wait_ready()
            node.wait_caught_up(bootstrap, "cards", cards)
            node.wait_caught_up(bootstrap, "orders", orders)
        for node in nodes:
            with httpx.Client(base_url=node.url, timeout=10) as http:
                for (i, region), row in model.items():
                    r = http.get(
                        "/v1/tables/cards/keys",
                        params={"key": orjson.dumps({"region": region, "id": i}).decode()},
                    )
                    assert r.status_code == 200, (i, region, r.text)
                    assert r.json()["key"] == {"id": i, "region": region}
                    assert r.json()["value"] == row
                r = http.get("/v1/tables/cards/keys", params={"key": '{"id":0,"region":"us"}'})
                assert r.status_code == 404
                assert http.get("/v1/tables/cards/count").json()["count"] == len(model)
                for k, v in ordered.items():
                    r = http.get(f"/v1/tables/orders/keys/{k}")
                    assert (r.status_code, r.json()["key"], r.json()["value"]) == (200, k, v)
        # the record with a bad key: counted by whichever node read it (both, before the
        # second joined and took half the partitions)
        assert sum(_bad_records(node, "cards") for node in nodes) >= 1
    finally:
        for node in nodes:
            node.stop()


def test_a_registry_that_demands_a_client_certificate_and_auth(
    bootstrap: str, unique: str, logs: Path, tmp_path: Path, registry: SchemaRegistry
) -> None:
    """The registry behind nginx, as production registries are reached: HTTPS, a client
    certificate demanded of every caller, then basic auth on one port and a bearer token on
    the other. confluent-kafka's own client writes through it; the attaching tool and a
    node reach it with basic auth, another node with the token (its settings' url), and a
    node without a client certificate is refused: its records wait, saying why."""
    gateway = RegistryGateway(registry.root).start()
    try:
        app, cards = f"{unique}-app", f"{unique}.cards"
        ensure_topic(bootstrap, cards, PARTITIONS, {"cleanup.policy": "compact"})
        tls = {
            "ssl.ca.location": str(gateway.ca),
            "ssl.certificate.location": str(gateway.client_cert),
            "ssl.key.location": str(gateway.client_key),
        }
        basic = {**tls, "basic.auth.user.info": f"{gateway_user}:{gateway_password}"}
        client = SchemaRegistryClient({"url": gateway.url("basic"), **basic})
        into = SerializationContext(cards, MessageField.VALUE)
        v1 = AvroSerializer(client, orjson.dumps(CARD_V1).decode())
        model = {f"card-{i}": {"id": i, "holder": f"h{i}", "points": i} for i in range(30)}
        _write(bootstrap, cards, [(k, v1(v, into)) for k, v in model.items()])

        def settings(name: str, props: dict[str, str]) -> str:
            path = tmp_path / f"{name}.properties"
            path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
            return str(path)

        with_basic = settings("basic", basic)
        with_token = settings(
            "bearer", {"url": gateway.url("bearer"), **tls, "bearer.auth.token": gateway_token}
        )
        without_cert = settings("nocert", {"ssl.ca.location": str(gateway.ca), **_only_auth(basic)})
        cli = [sys.executable, "-m", "tablecast.cli.main", "attach", "cards", "--app", app]
        cli += ["--topic", cards, "--bootstrap-servers", bootstrap, "--value", "confluent-avro"]
        cli += ["--registry", gateway.url("basic")]
        refused = subprocess.run(
            [*cli, "--registry-config", without_cert], capture_output=True, text=True, timeout=120
        )
        assert refused.returncode != 0 and "registry" in refused.stderr, refused.stderr
        done = subprocess.run(
            [*cli, "--registry-config", with_basic], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr

        for props in (with_basic, with_token):
            node = start_node(app, bootstrap, logs, "--registry-config", props)
            try:
                node.wait_ready()
                node.wait_caught_up(bootstrap, "cards", cards)
                with httpx.Client(base_url=node.url, timeout=10) as http:
                    for key, row in model.items():
                        assert http.get(f"/v1/tables/cards/keys/{key}").json()["value"] == row
                assert _bad_records(node, "cards") == 0
            finally:
                node.stop()

        node = start_node(app, bootstrap, logs, "--registry-config", without_cert)
        try:

            def why() -> str:
                try:
                    nodes = node.get("/v1/cluster").json()["nodes"]
                except httpx.HTTPError:
                    return ""  # not listening yet
                replicas = [r for n in nodes for r in n["replicas"] if r["table"] == "cards"]
                return " ".join(r.get("error") or "" for r in replicas)

            # never ready: every partition waits at its first record, for its schema
            assert "certificate" in eventually(lambda: "RegistryUnavailable" in why() and why())
            assert node.get("/readyz").status_code == 503
            assert _bad_records(node, "cards") == 0
        finally:
            node.stop()
    finally:
        gateway.stop()


def _only_auth(props: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in props.items() if k.startswith(("basic.", "bearer."))}


def test_kafka_streams_stores_over_keys_a_registry_serializer_wrote(
    bootstrap: str, unique: str, logs: Path, registry: SchemaRegistry
) -> None:
    """A real Kafka Streams app's key-value, windowed and session stores over input whose
    Avro record keys confluent-kafka's serializer wrote, kept by the app as the bytes they
    are (as a registry serde writes them back): its changelogs served on two nodes, each key
    looked up (its bytes hold its schema's id), and every key's row, windows and sessions
    as the app's own interactive queries give them."""
    topic, app = f"{unique}.visits", f"{unique}-tc"
    ensure_topic(bootstrap, topic, PARTITIONS)
    client = SchemaRegistryClient({"url": registry.url})
    serialize = AvroSerializer(client, orjson.dumps(CARD_KEY).decode())
    context = SerializationContext(topic, MessageField.KEY)
    users = [{"id": i, "region": region} for i in range(8) for region in ("eu", "us")]
    wire = [serialize(user, context) for user in users]
    streams = StoresApp(
        bootstrap, f"{unique}-streams", topic, WINDOW_MS, GAP_MS, byte_keys=True
    ).start()
    nodes: list[NodeProcess] = []
    try:
        # a visit every 700 ms of event time, an hour ago: windows of a minute, sessions
        # (30 s gap) that grow and merge, on every partition
        base = int(time.time() * 1000) - 3_600_000
        base -= base % WINDOW_MS
        rng = random.Random(7)
        producer = Producer(client_conf(bootstrap, {"partitioner": "murmur2_random"}))
        visits = 400
        for i in range(visits):
            producer.produce(
                topic, key=rng.choice(wire), value=f"visit-{i}".encode(), timestamp=base + i * 700
            )
        assert producer.flush(60) == 0
        eventually(lambda: sum(n for *_, n in streams.stores()["windows"]) == visits, 60)

        tables = {
            "latest": ("confluent-avro", "string", None),
            "per-window": ("kafka-streams-window:confluent-avro", "long", "60s"),
            "sessions": ("kafka-streams-session:confluent-avro", "long", None),
        }
        for name, (key, value, size) in tables.items():
            info = attach(
                name,
                app=app,
                topic=streams.changelog(name),
                bootstrap_servers=bootstrap,
                key=key,
                value=value,
                registry=registry.url,
                window_size=size,
            )
            assert info.partitioner == "unknown"
        nodes = [start_node(app, bootstrap, logs) for _ in range(2)]
        for node in nodes:
            node.wait_ready()
            for name in tables:
                node.wait_caught_up(bootstrap, name, streams.changelog(name), timeout=120)

        theirs = streams.stores()
        by_hex = {w.hex(): user for w, user in zip(wire, users, strict=True)}
        expected = {
            "latest": {orjson.dumps(by_hex[k]): v for k, v in theirs["latest"].items()},
            "windows": sorted(
                [orjson.dumps(by_hex[k]), s, e, n] for k, s, e, n in theirs["windows"]
            ),
            "sessions": sorted(
                [orjson.dumps(by_hex[k]), s, e, n] for k, s, e, n in theirs["sessions"]
            ),
        }
        assert len(expected["latest"]) == len(users)
        assert max(n for *_, n in expected["sessions"]) > 1  # sessions the app merged
        # twice on each node: first each key is looked up, then read where it was found
        for node in [*nodes, *nodes]:
            served: dict[str, Any] = {"latest": {}, "windows": [], "sessions": []}
            with httpx.Client(base_url=node.url, timeout=10) as http:
                for user in users:
                    # fields in another order than the writer's: a key is its JSON
                    text = orjson.dumps(dict(reversed(list(user.items())))).decode()
                    r = http.get("/v1/tables/latest/keys", params={"key": text})
                    assert r.status_code == 200, (user, r.text)
                    assert r.json()["key"] == user
                    served["latest"][orjson.dumps(user)] = r.json()["value"]
                    for table, into in (("per-window", "windows"), ("sessions", "sessions")):
                        r = http.get(f"/v1/tables/{table}/windows", params={"key": text})
                        assert r.status_code == 200, (table, user, r.text)
                        served[into] += [
                            [orjson.dumps(user), w["start"], w["end"], w["value"]]
                            for w in r.json()["items"]
                        ]
                absent = orjson.dumps({"id": 99, "region": "eu"}).decode()
                r = http.get("/v1/tables/per-window/windows", params={"key": absent})
                assert (r.status_code, r.json()["items"]) == (200, [])
            served["windows"].sort()
            served["sessions"].sort()
            assert served == expected, node.url
    finally:
        for node in nodes:
            node.stop()
        streams.stop()
