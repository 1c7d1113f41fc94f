"""Debezium change events as Kafka Connect's JSON converter writes them, and the rows
they make.

A value is ``{"schema": ..., "payload": EVENT}`` (``schemas.enable=true``, the
default) or EVENT alone; EVENT's ``op`` is ``c`` (create), ``u`` (update), ``r`` (a
snapshot read) or ``d`` (delete), its ``after`` is the row, its ``source.ts_ms`` the
source database's commit time. A key is the row's primary key as a struct, with or
without the same envelope.

A table keeps a row under its key's *canonical* form: the key struct as JSON with its
fields sorted, whatever the writer's bytes were (so a key written anew under another
schema is the same row). The writer's bytes, which decided the record's partition
(Kafka Connect hashes the whole envelope), are rebuilt from the canonical form and
the envelope's head, which every key of a table shares: ``{"schema":SCHEMA,"payload":``
written as the converter wrote it, then the struct's fields in the schema's order.
"""

from __future__ import annotations

from typing import Any

import orjson

#: what follows a key's schema in the converter's envelope: the payload comes last
_PAYLOAD = b',"payload":'


class BadEvent(ValueError):
    """A record that is not a Debezium change event (or key) this module can read."""


def unwrapped(data: bytes) -> Any:
    """The payload of a JSON converter record, with or without its schema envelope."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise BadEvent(f"not JSON: {e}") from None
    if isinstance(obj, dict) and obj.keys() == {"schema", "payload"}:
        return obj["payload"]
    return obj


def canonical_key(data: bytes) -> bytes:
    """A key record's canonical form: its struct as JSON, fields sorted."""
    payload = unwrapped(data)
    if not isinstance(payload, dict) or not payload:
        raise BadEvent("a key is a struct of the row's primary key columns")
    return orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)


def key_layout(data: bytes) -> tuple[str, list[str]]:
    """What rebuilds a table's writer key bytes, read from one of its key records: the
    envelope's head ("" without one) and the struct's fields in the writer's order."""
    payload = unwrapped(data)
    if not isinstance(payload, dict) or not payload:
        raise BadEvent("a key is a struct of the row's primary key columns")
    head = ""
    if data.lstrip().startswith(b'{"schema":'):
        at = data.rfind(_PAYLOAD)
        if at < 0:
            raise BadEvent("a key's envelope is not as Kafka Connect's JSON converter writes it")
        head = data[: at + len(_PAYLOAD)].decode()
    return head, list(payload)


def writer_key(canonical: bytes, head: str, fields: list[str]) -> bytes:
    """The bytes the writer gave the key whose canonical form is `canonical`."""
    struct = orjson.loads(canonical)
    ordered = {f: struct[f] for f in fields if f in struct}
    if len(ordered) != len(struct):  # a field the layout does not know: keep the rest after
        ordered.update((f, v) for f, v in struct.items() if f not in ordered)
    body = orjson.dumps(ordered)
    return head.encode() + body + b"}" if head else body


def key_of_text(text: str, fields: list[str]) -> bytes:
    """A key's canonical form from its text: the struct's JSON (``{"id":42}``), or the
    value of its only field (``42``, ``abc``)."""
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError:
        obj = text  # a string key's value, unquoted
    if not isinstance(obj, dict):
        if len(fields) != 1:
            raise BadEvent(f"a key of the fields {fields} is written as JSON: {{...}}")
        obj = {fields[0]: obj}
    if not obj:
        raise BadEvent("a key is a struct of the row's primary key columns")
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)


def row(data: bytes) -> tuple[bytes | None, int | None]:
    """A change event's row (None: the row is deleted) and its time: the source's commit
    time, else the event's."""
    event = unwrapped(data)
    if not isinstance(event, dict) or "op" not in event:
        raise BadEvent("not a Debezium change event (no op)")
    op = event["op"]
    source = event.get("source")
    ts = source.get("ts_ms") if isinstance(source, dict) else None
    if not isinstance(ts, int):
        ts = event.get("ts_ms") if isinstance(event.get("ts_ms"), int) else None
    if op == "d":
        return None, ts
    if op not in ("c", "u", "r"):
        raise BadEvent(f"op {op!r} changes no row")
    after = event.get("after")
    if not isinstance(after, dict):
        raise BadEvent(f"op {op!r} without an after row")
    return orjson.dumps(after), ts
