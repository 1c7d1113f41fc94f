"""Checking table-topic records with their table's serdes before they reach a store.

A table topic is written by the pipeline, but anyone with access can produce
to it. A record whose key does not parse cannot be addressed and would break
every range page over it, so it is skipped; a record whose value does not
decode is kept out as a tombstone (the key's latest record is unreadable, so
the key reads as absent rather than as an older value). JSON values are
spliced into answers as stored, so a JSON table only ever stores valid JSON.
"""

from __future__ import annotations

from collections.abc import Callable

import orjson

from tablecast.kafka.catalog import TableInfo
from tablecast.kafka.windowed import SESSION_SUFFIX
from tablecast.serde import SerdeError

#: (key, value) -> the reason the record is bad, or None
Check = Callable[[bytes, bytes | None], str | None]

WINDOW_SUFFIX = 8  # a window table's key ends with the window start (8 bytes)


def checker(info: TableInfo) -> Check:
    """A check of (key, value) for `info`'s serdes, built once per table."""
    if (
        info.kind == "kv"
        and info.key_serde.format == "string"
        and info.value_serde.format == "json"
    ):
        return _string_json  # the common table, checked in one call per record
    key_ok = _key_check(info)
    value_ok = _value_check(info)

    def check(key: bytes, value: bytes | None) -> str | None:
        reason = key_ok(key)
        if reason is None and value is not None:
            reason = value_ok(value)
        return reason

    return check


def _string_json(key: bytes, value: bytes | None, loads: Callable = orjson.loads) -> str | None:  # type: ignore[type-arg]
    try:
        key.decode()
    except UnicodeDecodeError as e:
        return f"bad key: not UTF-8: {e}"
    if value is not None:
        try:
            loads(value)
        except orjson.JSONDecodeError as e:
            return f"bad value: not JSON: {e}"
    return None


def _key_check(info: TableInfo) -> Callable[[bytes], str | None]:
    serde = info.key_serde
    window = info.kind == "window"
    # a session's key ends with its start and its end
    suffix = SESSION_SUFFIX if "session_gap_ms" in info.extra else WINDOW_SUFFIX
    fmt = serde.format

    def check(key: bytes) -> str | None:
        if window:
            if len(key) < suffix:
                return "bad key: shorter than a window start"
            key = key[:-suffix]
        if fmt == "bytes":
            return None
        try:
            serde.deserialize(key)
        except SerdeError as e:
            return f"bad key: {e}"
        return None

    return check


def _value_check(info: TableInfo) -> Callable[[bytes], str | None]:
    serde = info.value_serde
    fmt = serde.format
    if fmt == "bytes":
        return lambda value: None
    if fmt == "json":
        loads = orjson.loads

        def check_json(value: bytes) -> str | None:
            try:
                loads(value)
            except orjson.JSONDecodeError as e:
                return f"bad value: not JSON: {e}"
            return None

        return check_json

    def check(value: bytes) -> str | None:
        try:
            serde.to_json(value)
        except SerdeError as e:
            return f"bad value: {e}"
        return None

    return check
