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

from tablecast.contract.table_info import TableInfo
from tablecast.serde import SerdeError, json_check

#: how a value that is not JSON is refused (orjson's reason follows)
NOT_JSON = "bad value: not JSON: "

#: (key, value) -> the reason the record is bad, or None
Check = Callable[[bytes, bytes | None], str | None]


def checker(info: TableInfo) -> Check:
    """A check of (key, value) for `info`'s serdes, built once per table."""
    if (
        info.kind == "kv"
        and info.key_serde.format == "string"
        and info.value_serde.format == "json"
    ):
        return _string_json(json_check(NOT_JSON))  # the common table
    key_ok = _key_check(info)
    value_ok = _value_check(info)

    def check(key: bytes, value: bytes | None) -> str | None:
        reason = key_ok(key)
        if reason is None and value is not None:
            reason = value_ok(value)
        return reason

    return check


def _string_json(value_check: Callable[[bytes], str | None]) -> Check:
    """A UTF-8 check of the key and `value_check` of the value: the common table."""

    def check(key: bytes, value: bytes | None) -> str | None:
        if not key.isascii():
            try:
                key.decode()
            except UnicodeDecodeError as e:
                return f"bad key: not UTF-8: {e}"
        return None if value is None else value_check(value)

    return check


def _key_check(info: TableInfo) -> Callable[[bytes], str | None]:
    serde = info.key_serde
    window = info.kind == "window"
    suffix = info.window_suffix
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
        return json_check(NOT_JSON)

    def check(value: bytes) -> str | None:
        try:
            serde.to_json(value)
        except SerdeError as e:
            return f"bad value: {e}"
        return None

    return check
