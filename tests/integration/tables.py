"""Table topics written directly (as the pipeline would), with a model of what they hold.

Serving tests do not need Spark: a serving node only reads table topics and
the catalog, so these helpers write both, exactly in the pipeline's format.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from tablecast import serde
from tablecast.contract.table_info import TableInfo
from tablecast.contract.window_keys import window_key
from tablecast.kafka import catalog
from tablecast.kafka.topics import TABLE_TOPIC_CONFIG, ensure_topic, table_topic

from .kafka_io import produce


@dataclass
class TableModel:
    info: TableInfo
    #: serialized key -> the value object (the latest per key)
    rows: dict[bytes, Any] = field(default_factory=dict)

    def write(self, bootstrap: str, records: list[tuple[Any, Any]]) -> None:
        """Upsert (key, value) pairs; a None value deletes the key."""
        ks, vs = self.info.key_serde, self.info.value_serde
        encoded = []
        for key, value in records:
            raw = ks.serialize(key)
            encoded.append((raw, None if value is None else vs.serialize(value)))
            if value is None:
                self.rows.pop(raw, None)
            else:
                self.rows[raw] = value
        produce(bootstrap, self.info.topic, encoded)


def make_table(
    bootstrap: str,
    app_id: str,
    name: str,
    partitions: int,
    key: serde.Serde,
    value: serde.Serde,
    store: str = "rocksdb",
    kind: str = "kv",
    extra: dict | None = None,
) -> TableModel:
    info = TableInfo(
        name=name,
        topic=table_topic(app_id, name),
        partitions=partitions,
        key=key.spec(),
        value=value.spec(),
        kind=kind,
        store=store,
        extra=extra or {},  # type: ignore[arg-type]
    )
    ensure_topic(bootstrap, info.topic, partitions, TABLE_TOPIC_CONFIG)
    catalog.publish(bootstrap, app_id, [info])
    return TableModel(info)


def write_windows(bootstrap: str, model: TableModel, records: list[tuple[str, int, Any]]) -> None:
    """Window-table records (key, window start ms, value), partitioned by the inner key."""
    from confluent_kafka import Producer

    from tablecast.contract.partitioner import partition_for

    p = Producer({"bootstrap.servers": bootstrap})
    for key, start, value in records:
        inner = model.info.key_serde.serialize(key)
        raw = window_key(inner, start)
        p.produce(
            model.info.topic,
            key=raw,
            value=orjson.dumps(value),
            partition=partition_for(inner, model.info.partitions),
        )
        model.rows[raw] = value
    assert p.flush(30) == 0


@dataclass
class Logged:
    """One table-topic record as written, with where it landed."""

    key: bytes
    value: bytes | None
    timestamp: int
    #: the index header's values ({name: value | [values] | None}); None: no header
    index: dict[str, Any] | None
    partition: int = -1
    offset: int = -1


def write_logged(bootstrap: str, topic: str, records: list[Logged]) -> list[Logged]:
    """Produce `records` with their timestamps and index headers, as the pipeline would, and
    fill in the partition and offset each was acknowledged at."""
    from confluent_kafka import Producer

    from tablecast.contract import index_codec
    from tablecast.contract.partitioner import PRODUCER_CONFIG

    p = Producer({"bootstrap.servers": bootstrap, **PRODUCER_CONFIG})

    def acked(record: Logged) -> Any:
        def done(err: Any, msg: Any) -> None:
            assert err is None, err
            record.partition, record.offset = msg.partition(), msg.offset()

        return done

    for r in records:
        headers = (
            None if r.index is None else [(index_codec.HEADER, index_codec.encode_header(r.index))]
        )
        p.produce(
            topic,
            key=r.key,
            value=r.value,
            timestamp=r.timestamp,
            headers=headers,
            on_delivery=acked(r),
        )
        p.poll(0)
    assert p.flush(30) == 0
    assert all(r.offset >= 0 for r in records)
    return records
