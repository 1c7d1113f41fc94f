"""Records of an attached topic as its table keeps them, where the writer's form is not
the table's: a Debezium change event becomes its row (or the row's delete) under its
key's canonical form, at the source database's commit time; a Kafka Streams window or
session store changelog key becomes the window table's key."""

from __future__ import annotations

from collections.abc import Callable

import orjson

from tablecast import serde
from tablecast.cluster import schema_registry
from tablecast.contract import debezium
from tablecast.contract.table_info import TableInfo
from tablecast.contract.window_keys import (
    STREAMS_SESSION,
    STREAMS_WINDOW,
    from_streams_session_key,
    from_streams_window_key,
)

#: (key, value, timestamp) as written -> as the table keeps them; raises BadRecord
Translate = Callable[[bytes, bytes | None, int], tuple[bytes, bytes | None, int]]


#: deleted keys whose tombstone is awaited, at most
MAX_DELETES_KEPT = 10_000


class BadRecord(ValueError):
    """A record its table cannot keep; says why (counted and logged as a bad record).
    With `key`, only its value was bad: the key reads as absent, not as an older row."""

    def __init__(self, why: str, key: bytes | None = None) -> None:
        super().__init__(why)
        self.key = key


def translation(info: TableInfo) -> Translate | None:
    """How `info`'s records become its rows; None where they are its rows already. Each
    step the table's formats ask for, in turn: a Kafka Streams store key rewritten, a
    registry key and value decoded, a Debezium event unwrapped (from the JSON a registry
    step made of it, for Debezium's Avro converter)."""
    changelog = info.key.get("changelog")
    steps = [
        _streams_store(changelog) if changelog in (STREAMS_WINDOW, STREAMS_SESSION) else None,
        _registry_keys(schema_registry.registry(info.key["registry"]), info.window_suffix)
        if serde.through_registry(info.key)
        else None,
        _registry_values(schema_registry.registry(info.value["registry"]))
        if serde.through_registry(info.value)
        else None,
        _debezium(info),
    ]
    chosen = [step for step in steps if step is not None]
    if len(chosen) <= 1:
        return chosen[0] if chosen else None

    def translate(key: bytes, value: bytes | None, ts: int) -> tuple[bytes, bytes | None, int]:
        for step in chosen:
            key, value, ts = step(key, value, ts)
        return key, value, ts

    return translate


def _debezium(info: TableInfo) -> Translate | None:
    """Debezium change events as rows, under their keys' canonical form."""
    key_debezium = info.key.get("format") == "debezium"
    value_debezium = info.value.get("format") == "debezium"
    if not (key_debezium or value_debezium):
        return None

    keys, events = debezium.Unwrapper(), debezium.Unwrapper()
    #: a deleted key's commit time, for the tombstone Debezium writes after its delete: the
    #: tombstone then stands at that time too (one delete version, stream time unmoved)
    deleted_at: dict[bytes, int] = {}

    def translate(key: bytes, value: bytes | None, ts: int) -> tuple[bytes, bytes | None, int]:
        if key_debezium:
            try:
                key = debezium.canonical_key(key, keys)
            except debezium.BadEvent as e:
                raise BadRecord(f"bad key: {e}") from None
        if not value_debezium:
            return key, value, ts
        if value is None:
            return key, None, deleted_at.pop(key, ts)
        try:
            value, at = debezium.row(value, events)
        except debezium.BadEvent as e:
            raise BadRecord(f"bad value: {e}", key) from None
        if at is not None:
            ts = at
        if value is None:
            if len(deleted_at) >= MAX_DELETES_KEPT:  # tombstones that never came
                deleted_at.clear()
            deleted_at[key] = ts
        return key, value, ts

    return translate


def _streams_store(layout: str) -> Translate:
    rewrite = from_streams_window_key if layout == STREAMS_WINDOW else from_streams_session_key

    def translate(key: bytes, value: bytes | None, ts: int) -> tuple[bytes, bytes | None, int]:
        try:
            return rewrite(key), value, ts
        except ValueError as e:
            raise BadRecord(f"bad key: {e}") from None

    return translate


def _decoded(
    registry: schema_registry.Registry, data: bytes, bad: Callable[[str], BadRecord]
) -> bytes:
    """`data` decoded with its writer schema; `bad(why)` for bytes that are not one (a bad
    record); RegistryUnavailable when the schema cannot be had now (the record waits)."""
    try:
        return registry.decode(data)
    except schema_registry.RegistryUnavailable:
        raise
    except ValueError as e:
        raise bad(str(e)) from None
    except Exception as e:  # never a record skipped for a fault of our own
        raise schema_registry.RegistryUnavailable(f"{type(e).__name__}: {e}") from None


def _registry_keys(registry: schema_registry.Registry, suffix: int = 0) -> Translate:
    """Keys decoded with their writer schemas, kept as canonical JSON (sorted fields: one
    key, one byte string, whichever schema version wrote it); a key that is not one makes
    the record a bad one; one whose schema cannot be had now makes it wait. A window
    table's key is decoded up to its window's `suffix` bytes, which stay as they are."""

    def bad(why: str) -> BadRecord:
        return BadRecord(f"bad key: {why}")

    def translate(key: bytes, value: bytes | None, ts: int) -> tuple[bytes, bytes | None, int]:
        inner, window = (key[:-suffix], key[-suffix:]) if suffix else (key, b"")
        row = orjson.loads(_decoded(registry, inner, bad))
        return orjson.dumps(row, option=orjson.OPT_SORT_KEYS) + window, value, ts

    return translate


def _registry_values(registry: schema_registry.Registry) -> Translate:
    """Values decoded with their writer schemas: a value that is not one is a bad record
    (its key reads as absent); one whose schema cannot be had now makes it wait."""

    def translate(key: bytes, value: bytes | None, ts: int) -> tuple[bytes, bytes | None, int]:
        if value is None:
            return key, None, ts
        return key, _decoded(registry, value, lambda why: BadRecord(f"bad value: {why}", key)), ts

    return translate
