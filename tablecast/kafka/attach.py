"""Attaching a topic that something else writes as a table of an app, and detaching it.

Attaching checks the topic (it exists; its records are kept by key, or the caller
accepts that a deleting topic's table loses what the topic deletes) and writes the
table's catalog entry: every node of the app then serves it as it serves a
pipeline's table. Nothing is copied: the nodes read the topic itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import timedelta

import httpx
import orjson
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import ConfigResource, ResourceType

from tablecast.contract import debezium, index_codec
from tablecast.contract.json_path import BadPath, JsonPath
from tablecast.contract.partitioner import DEFAULT as DEFAULT_PARTITIONER
from tablecast.contract.partitioner import PARTITIONERS, UNKNOWN
from tablecast.contract.table_info import STORES, BadEntry, TableInfo
from tablecast.contract.window_keys import STREAMS_INNER, STREAMS_LAYOUTS, STREAMS_WINDOW
from tablecast.kafka import registry_config
from tablecast.kafka.catalog import CatalogReader
from tablecast.kafka.config import client_conf, producer_conf
from tablecast.kafka.topics import COMPACTED, admin, catalog_topic, ensure_topic
from tablecast.serde import REGISTRY_FORMATS
from tablecast.windows import to_ms

log = logging.getLogger(__name__)

#: the formats a topic written by something else can be read in, for now
FORMATS = ("string", "json", "long", "bytes", "debezium")
#: the formats inside a Kafka Streams window or session store's key
#: (``kafka-streams-window:string``; a registry serde's: ``kafka-streams-window:confluent-avro``)
INNER_FORMATS = STREAMS_INNER + REGISTRY_FORMATS
#: every key format, the Kafka Streams store layouts with each inner format included
KEY_FORMATS = (
    FORMATS + REGISTRY_FORMATS + tuple(f"{s}:{i}" for s in STREAMS_LAYOUTS for i in INNER_FORMATS)
)
#: every value format, those written through a Schema Registry included (``--registry``)
VALUE_FORMATS = FORMATS + REGISTRY_FORMATS
#: how long attach waits for the brokers' answers
TIMEOUT_S = 30.0


class AttachError(ValueError):
    """The topic cannot be attached as asked, or the table cannot be detached; says why."""


def index_option(text: str) -> tuple[str, str]:
    """``NAME=JSONPATH`` (``--index``) as (name, path)."""
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise AttachError(f"--index {text!r}: write it NAME=JSONPATH (points=$.points)")
    return name, path


def duration_ms(duration: timedelta | str | int) -> int:
    """``60s``, ``5m``, ``1 day``, a timedelta, or whole milliseconds, as milliseconds."""
    if isinstance(duration, int) and not isinstance(duration, bool):
        ms = duration
    elif isinstance(duration, str) and duration.strip().isdigit():
        ms = int(duration)
    else:
        try:
            ms = to_ms(duration)  # type: ignore[arg-type]
        except (TypeError, ValueError) as e:
            raise AttachError(f"{duration!r} is not a duration: {e}") from None
    if ms <= 0:
        raise AttachError(f"{duration!r} is not a positive duration")
    return ms


def streams_layout(key: str) -> tuple[str | None, str]:
    """(Kafka Streams store layout or None, the key's own format) of a key format:
    ``kafka-streams-window:string`` -> ("kafka-streams-window", "string")."""
    layout, sep, inner = key.partition(":")
    if not sep:
        return None, key
    if layout not in STREAMS_LAYOUTS or inner not in INNER_FORMATS:
        raise AttachError(
            f"key format {key!r}: a Kafka Streams store key is one of {STREAMS_LAYOUTS} and "
            f"one of {INNER_FORMATS} after a colon (kafka-streams-window:string)"
        )
    return layout, inner


def attach(
    name: str,
    *,
    app: str,
    topic: str,
    bootstrap_servers: str,
    key: str = "string",
    value: str = "json",
    partitioner: str = DEFAULT_PARTITIONER,
    registry: str | None = None,
    window_size: timedelta | str | int | None = None,
    history: timedelta | str | int | None = None,
    indexes: Mapping[str, str] | None = None,
    store: str = "rocksdb",
    retention_ok: bool = False,
) -> TableInfo:
    """Check `topic` and write the catalog entry that makes every node of `app` serve it
    as table `name`; the entry written. Attaching a name again replaces its entry (a
    pipeline's table is never replaced). `indexes`: {NAME: JSONPATH}, secondary indexes
    whose values the nodes take from each row (``$.a.b``, ``$.tags[*]``). A Kafka Streams
    window or session store's changelog (`key` ``kafka-streams-window:INNER`` or
    ``kafka-streams-session:INNER``) is served as a window table; `window_size` gives a
    windowed store's windows their end (a session store's inactivity gap, if given, is
    only recorded). Keys or values written through a Schema Registry (``confluent-avro``,
    ``confluent-json``, ``confluent-protobuf``) need its URL, `registry`: the nodes fetch
    each writer schema from it by id. Such keys, a Kafka Streams store's inner keys too
    (``kafka-streams-window:confluent-avro``), are kept as their JSON and looked up (the
    partitioner is ``unknown``: a key's bytes hold its schema's id, which its text does not
    say)."""
    if not index_codec.NAME.fullmatch(name):
        raise AttachError(f"table name {name!r}: 1-64 of A-Z a-z 0-9 _ . -")
    layout, key = streams_layout(key)
    if layout is None and key not in FORMATS + REGISTRY_FORMATS:
        raise AttachError(f"key format {key!r} is not one of {KEY_FORMATS}")
    if value not in VALUE_FORMATS:
        raise AttachError(f"value format {value!r} is not one of {VALUE_FORMATS}")
    key_spec: dict[str, object] = {"format": key}
    value_spec: dict[str, object] = {"format": value}
    sides = (("key", key_spec), ("value", value_spec))
    through = [(side, spec) for side, spec in sides if spec["format"] in REGISTRY_FORMATS]
    if registry is not None and key == value == "debezium":  # Debezium's Avro converter
        through = list(sides)
    if through:
        if registry is None:
            side, spec = through[0]
            raise AttachError(
                f"a {spec['format']} {side} needs its Schema Registry's URL (--registry)"
            )
        url = _registry_url(registry)
        for _, spec in through:
            spec["registry"] = url
    elif registry is not None:
        raise AttachError(
            "--registry is for keys or values written through a Schema Registry "
            "(Debezium's Avro converter: --key debezium --value debezium)"
        )
    if partitioner not in PARTITIONERS:
        raise AttachError(f"partitioner {partitioner!r} is not one of {PARTITIONERS}")
    if "registry" in key_spec:
        # a key's bytes (so its partition) hold the id of the schema it was written with,
        # which its text does not say: the nodes look such keys up
        if partitioner not in (DEFAULT_PARTITIONER, UNKNOWN):
            raise AttachError(f"{key} keys are looked up: their partitioner is unknown")
        partitioner = UNKNOWN
    if store not in STORES:
        raise AttachError(f"store {store!r} is not one of {STORES}")
    extra: dict[str, object] = {} if history is None else {"history_ms": duration_ms(history)}
    if layout == STREAMS_WINDOW:
        if window_size is None:
            raise AttachError(
                "a Kafka Streams window store's records carry their window's start only: "
                "give its windows' size (--window-size 60s)"
            )
        extra["size_ms"] = duration_ms(window_size)
    elif layout is not None:
        extra["session_gap_ms"] = 0 if window_size is None else duration_ms(window_size)
    elif window_size is not None:
        raise AttachError("--window-size is for Kafka Streams window and session stores' keys")
    if indexes and layout is not None:
        raise AttachError("indexes are for tables of one row per key, not of windows")
    if indexes:
        if value not in ("json", "debezium", *REGISTRY_FORMATS):
            raise AttachError(f"indexes are taken from JSON rows: --value {value} has none")
        for index, path in indexes.items():
            try:
                JsonPath(path)
            except BadPath as e:
                raise AttachError(f"index {index}: {e}") from None
        extra.update(indexes=list(indexes), index_paths=dict(indexes))
    partitions, policy = _topic(bootstrap_servers, topic)
    # a window store's changelog deletes windows past the store's retention, as the store
    # itself forgets them: the table holds what the store holds
    expires = layout is not None and "compact" in policy
    if "delete" in policy and not retention_ok and not expires:
        raise AttachError(
            f"topic {topic} deletes records (cleanup.policy={policy}): a table over it loses "
            "every key whose records the topic deleted; attach it with retention_ok "
            "(--retention-ok) if that is what you want, or make the topic compacted"
        )
    if layout is not None:
        key_spec["changelog"] = layout
    if key == "debezium" and "registry" in key_spec:
        key_spec.update(head="", fields=_registry_key_fields(str(key_spec["registry"]), topic))
    elif key == "debezium":
        head, fields = _debezium_key_layout(bootstrap_servers, topic, partitions)
        key_spec.update(head=head, fields=fields)
    info = TableInfo(
        name=name,
        topic=topic,
        partitions=partitions,
        key=key_spec,
        value=value_spec,
        kind="window" if layout is not None else "kv",
        store=store,  # type: ignore[arg-type]
        extra=extra,
        partitioner=partitioner,
        attached=True,
    )
    try:
        TableInfo.checked(name, info.to_json())  # what a node would refuse, refused here
    except BadEntry as e:
        raise AttachError(str(e)) from None
    tables = _catalog(bootstrap_servers, app)
    existing = tables.get(name)
    if existing is not None and not existing.attached:
        raise AttachError(f"{name} is a table of app {app}'s pipeline, not an attached topic")
    for other in tables.values():
        if other.topic == topic and other.name != name:
            raise AttachError(f"topic {topic} is table {other.name} of app {app} already")
    _write(bootstrap_servers, app, name, info.to_json())
    log.info(
        "attached topic %s (%d partitions, %s) as table %s of app %s",
        topic,
        partitions,
        partitioner,
        name,
        app,
    )
    return info


def _registry_url(url: str) -> str:
    """`url` once a Schema Registry answers there (its subjects list)."""
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise AttachError(f"registry {url!r} is not an http(s) URL")
    if registry_config.has_credentials(url):
        # the catalog holds the URL and every node reads it: no secret goes there
        raise AttachError("--registry: no credentials in the URL (--registry-config holds them)")
    settings = registry_config.current()  # this machine's way to it, as a node has its own
    try:
        with settings.client(TIMEOUT_S) as client:
            r = client.get(settings.address(url) + "/subjects")
    except httpx.HTTPError as e:
        raise AttachError(f"registry {url}: {type(e).__name__}: {e}") from None
    if r.status_code != 200:
        raise AttachError(f"registry {url}/subjects answered {r.status_code}: {r.text[:200]}")
    return url


def detach(name: str, *, app: str, bootstrap_servers: str) -> None:
    """Remove the attached table `name` from `app`'s catalog: the nodes stop serving it
    (the topic is left as it is)."""
    existing = _catalog(bootstrap_servers, app).get(name)
    if existing is None:
        raise AttachError(f"app {app} has no table {name}")
    if not existing.attached:
        raise AttachError(f"{name} is a table of app {app}'s pipeline: remove it from the App")
    _write(bootstrap_servers, app, name, None)
    log.info("detached table %s of app %s (topic %s left as it is)", name, app, existing.topic)


def _topic(bootstrap_servers: str, topic: str) -> tuple[int, str]:
    """`topic`'s partition count and cleanup policy."""
    client = admin(bootstrap_servers)
    metadata = client.list_topics(topic, timeout=TIMEOUT_S).topics.get(topic)
    if metadata is None or metadata.error is not None or not metadata.partitions:
        raise AttachError(f"topic {topic} does not exist")
    resource = ConfigResource(ResourceType.TOPIC, topic)
    configs = client.describe_configs([resource])[resource].result(TIMEOUT_S)
    return len(metadata.partitions), configs["cleanup.policy"].value


def _registry_key_fields(url: str, topic: str) -> list[str]:
    """The primary key's columns of a Debezium topic written through a registry: the
    fields of the newest schema of its keys' subject (``TOPIC-key``, as Debezium's
    converters name it)."""
    settings = registry_config.current()
    subject = f"{topic}-key"
    try:
        with settings.client(TIMEOUT_S) as client:
            r = client.get(f"{settings.address(url)}/subjects/{subject}/versions/latest")
    except httpx.HTTPError as e:
        raise AttachError(f"registry {url}: {type(e).__name__}: {e}") from None
    if r.status_code == 404:
        raise AttachError(
            f"the registry has no subject {subject}: attach the topic once Debezium has "
            "written to it"
        )
    if r.status_code != 200:
        raise AttachError(
            f"registry {url}: subject {subject}: HTTP {r.status_code}: {r.text[:200]}"
        )
    try:
        schema = orjson.loads(r.json()["schema"])
        fields = [f["name"] for f in schema["fields"]]
    except (ValueError, KeyError, TypeError) as e:
        raise AttachError(f"subject {subject}: not an Avro record's schema ({e})") from None
    if not fields or not all(isinstance(f, str) for f in fields):
        raise AttachError(f"subject {subject}: a key schema without fields")
    return fields


def _debezium_key_layout(
    bootstrap_servers: str, topic: str, partitions: int
) -> tuple[str, list[str]]:
    """How the topic's writer lays out its keys now (envelope and field order): from the
    newest keyed record among the last few of each partition (a transaction's markers
    take offsets too). Nodes rebuild a key's bytes with it."""
    conf = {"group.id": "tablecast-attach", "auto.offset.reset": "earliest"}
    consumer = Consumer(client_conf(bootstrap_servers, conf))
    newest: tuple[int, bytes] | None = None
    try:
        for p in range(partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=TIMEOUT_S)
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, p, max(low, high - 10))])
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline:
                m = consumer.poll(0.5)
                if m is None or m.error() is not None:
                    continue
                if m.key() is not None and (newest is None or m.timestamp()[1] >= newest[0]):
                    newest = (m.timestamp()[1], m.key())
                if m.offset() >= high - 1:
                    break
    finally:
        consumer.close()
    if newest is None:
        raise AttachError(
            f"topic {topic} holds no keyed record yet: attach it once Debezium has written to "
            "it (the layout of its keys is read from one)"
        )
    try:
        return debezium.key_layout(newest[1])
    except debezium.BadEvent as e:
        raise AttachError(f"topic {topic}: {e}") from None


def _catalog(bootstrap_servers: str, app: str) -> dict[str, TableInfo]:
    """The app's catalog as it is now (all of it read)."""
    ensure_topic(bootstrap_servers, catalog_topic(app), 1, COMPACTED)
    reader = CatalogReader(bootstrap_servers, app)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        tables = reader.poll(1.0)
        while not reader.loaded:
            if time.monotonic() > deadline:
                raise AttachError(f"could not read {reader.topic} in {TIMEOUT_S:g} s")
            tables = reader.poll(1.0)
        return dict(tables)
    finally:
        reader.close()


def _write(bootstrap_servers: str, app: str, name: str, entry: bytes | None) -> None:
    producer = Producer(producer_conf(bootstrap_servers))
    producer.produce(catalog_topic(app), key=name.encode(), value=entry)
    if producer.flush(TIMEOUT_S) != 0:
        raise AttachError(f"could not write {catalog_topic(app)} in {TIMEOUT_S:g} s")
