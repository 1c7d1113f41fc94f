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

from collections.abc import Callable
from typing import Any

import orjson

#: how the converter's envelope begins, and what follows its schema: the payload comes last
_SCHEMA = b'{"schema":'
_PAYLOAD = b',"payload":'


class BadEvent(ValueError):
    """A record that is not a Debezium change event (or key) this module can read."""


def unwrapped(data: bytes) -> Any:
    """The payload of a JSON converter record, with or without its schema envelope."""
    return _parse(data)[0]


def _parse(data: bytes) -> tuple[Any, bytes | None]:
    """The payload, and the envelope's head as written (None without an envelope)."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise BadEvent(f"not JSON: {e}") from None
    if not (isinstance(obj, dict) and obj.keys() == {"schema", "payload"}):
        return obj, None
    at = data.find(_PAYLOAD)
    while at >= 0:  # the schema's own text may hold the marker: the head ends where it parses
        if data.startswith(_SCHEMA):
            try:
                if orjson.loads(data[len(_SCHEMA) : at]) == obj["schema"]:
                    return obj["payload"], data[: at + len(_PAYLOAD)]
            except orjson.JSONDecodeError:
                pass
        at = data.find(_PAYLOAD, at + 1)
    return obj["payload"], None


class Unwrapper:
    """:func:`unwrapped` for the records of one topic, whose envelopes repeat: once a
    record's head (``{"schema":...,"payload":``) is known, a record that starts with
    those very bytes has only its payload parsed (the schema is most of an event)."""

    def __init__(self) -> None:
        self._head: bytes | None = None

    def __call__(self, data: bytes) -> Any:
        head = self._head
        if head is not None and data.startswith(head) and data.endswith(b"}"):
            try:
                return orjson.loads(memoryview(data)[len(head) : -1])
            except orjson.JSONDecodeError:
                pass  # not an envelope around one payload after all: parsed whole below
        payload, found = _parse(data)
        if found is not None:
            self._head = found
        return payload


def canonical_key(data: bytes, unwrap: Callable[[bytes], Any] = unwrapped) -> bytes:
    """A key record's canonical form: its struct as JSON, fields sorted."""
    payload = unwrap(data)
    if not isinstance(payload, dict) or not payload:
        raise BadEvent("a key is a struct of the row's primary key columns")
    return orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)


def key_layout(data: bytes) -> tuple[str, list[str]]:
    """What rebuilds a table's writer key bytes, read from one of its key records: the
    envelope's head ("" without one) and the struct's fields in the writer's order.
    Refused unless they rebuild this very record's key."""
    payload, head = _parse(data)
    if not isinstance(payload, dict) or not payload:
        raise BadEvent("a key is a struct of the row's primary key columns")
    layout = ("" if head is None else head.decode(), list(payload))
    if writer_key(orjson.dumps(payload, option=orjson.OPT_SORT_KEYS), *layout) != data:
        raise BadEvent(
            "its keys are not written as Kafka Connect's JSON converter writes them (compact "
            f"JSON, the payload last): cannot rebuild {data[:200]!r}"
        )
    return layout


def writer_key(canonical: bytes, head: str, fields: list[str]) -> bytes:
    """The bytes the writer gave the key whose canonical form is `canonical`."""
    struct = orjson.loads(canonical)
    ordered = {f: struct[f] for f in fields if f in struct}
    if len(ordered) != len(struct):  # a field the layout does not know: keep the rest after
        ordered.update((f, v) for f, v in struct.items() if f not in ordered)
    body = orjson.dumps(ordered)
    return head.encode() + body + b"}" if head else body


def text_field(head: str, fields: list[str]) -> bool:
    """Whether a one-field key's field is a string by the envelope's schema: its text is
    then the string itself (``/keys/42`` is "42", not 42)."""
    if len(fields) != 1 or not head.startswith(_SCHEMA.decode()):
        return False
    try:
        schema = orjson.loads(head[len(_SCHEMA) : -len(_PAYLOAD)])
        return bool(schema["fields"][0]["type"] == "string")
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return False


def key_of_text(text: str, fields: list[str], text_field: bool = False) -> bytes:
    """A key's canonical form from its text: the struct's JSON (``{"id":42}``), or the
    value of its only field (``42``, ``abc``; a string field's text is the string, unless
    quoted as JSON)."""
    obj: Any
    if text_field and not text.startswith(("{", '"')):
        obj = text
    else:
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


def _is_time(ts: object) -> bool:
    """Epoch milliseconds a store can keep (a non-negative int64)."""
    return isinstance(ts, int) and not isinstance(ts, bool) and 0 <= ts < 1 << 63


def row(data: bytes, unwrap: Callable[[bytes], Any] = unwrapped) -> tuple[bytes | None, int | None]:
    """A change event's row (None: the row is deleted) and its time: the source's commit
    time, else the event's."""
    event = unwrap(data)
    if not isinstance(event, dict) or "op" not in event:
        raise BadEvent("not a Debezium change event (no op)")
    op = event["op"]
    source = event.get("source")
    ts = source.get("ts_ms") if isinstance(source, dict) else None
    if not _is_time(ts):
        ts = event.get("ts_ms") if _is_time(event.get("ts_ms")) else None
    if op == "d":
        return None, ts
    if op not in ("c", "u", "r"):
        raise BadEvent(f"op {op!r} changes no row")
    after = event.get("after")
    if not isinstance(after, dict):
        raise BadEvent(f"op {op!r} without an after row")
    return orjson.dumps(after), ts
