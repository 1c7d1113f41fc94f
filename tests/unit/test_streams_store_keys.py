"""Kafka Streams window and session store changelog keys, as the window tables of
attached changelogs keep them, and the catalog entries of such tables."""

from __future__ import annotations

import struct

import pytest

from tablecast.cluster.attached_records import BadRecord, translation
from tablecast.contract.table_info import BadEntry, TableInfo
from tablecast.contract.window_keys import split_session_key, split_window_key
from tablecast.kafka.attach import AttachError, streams_layout

_Q = struct.Struct(">q")


def _info(layout: str, extra: dict[str, object]) -> TableInfo:
    return TableInfo(
        "t",
        "t",
        4,
        {"format": "string", "changelog": layout},
        {"format": "long"},
        kind="window",
        extra=extra,
        attached=True,
    )


def test_a_window_key_loses_its_sequence_number() -> None:
    # WindowKeySchema.toStoreKeyBinary: key, window start, sequence number
    written = b"user-1" + _Q.pack(1_790_000_040_000) + struct.pack(">i", 3)
    translate = translation(_info("kafka-streams-window", {"size_ms": 60_000}))
    assert translate is not None
    key, value, ts = translate(written, b"\0" * 8, 5)
    assert split_window_key(key) == (b"user-1", 1_790_000_040_000)
    assert (value, ts) == (b"\0" * 8, 5)
    with pytest.raises(BadRecord, match="at least 12 bytes"):
        translate(b"short", None, 5)


def test_a_session_key_puts_its_start_first() -> None:
    # SessionKeySchema.toBinary: key, end, start
    written = b"user-1" + _Q.pack(2_000) + _Q.pack(1_000)
    translate = translation(_info("kafka-streams-session", {"session_gap_ms": 0}))
    assert translate is not None
    key, value, _ = translate(written, None, 5)
    assert split_session_key(key) == (b"user-1", 1_000, 2_000) and value is None
    with pytest.raises(BadRecord):
        translate(b"x" * 15, None, 5)


def test_store_layouts_in_key_formats() -> None:
    assert streams_layout("kafka-streams-window:json") == ("kafka-streams-window", "json")
    # an inner key a registry serializer wrote (looked up: its bytes hold a schema id)
    registry_inner = ("kafka-streams-session", "confluent-avro")
    assert streams_layout("kafka-streams-session:confluent-avro") == registry_inner
    assert streams_layout("string") == (None, "string")
    for bad in ("kafka-streams-window:debezium", "kafka-streams-windows:string", "x:string"):
        with pytest.raises(AttachError):
            streams_layout(bad)


def test_catalog_entries_of_store_changelogs_are_checked() -> None:
    def checked(info: TableInfo) -> TableInfo:
        return TableInfo.checked(info.name, info.to_json())

    checked(_info("kafka-streams-window", {"size_ms": 60_000}))
    checked(_info("kafka-streams-session", {"session_gap_ms": 0}))  # a gap not known
    with pytest.raises(BadEntry, match="needs a session table"):
        checked(_info("kafka-streams-session", {"size_ms": 60_000}))
    with pytest.raises(BadEntry, match="size_ms or session_gap_ms > 0"):
        checked(_info("kafka-streams-window", {"size_ms": 0}))
    with pytest.raises(BadEntry, match="not one of"):
        checked(_info("kafka-streams-hop", {"size_ms": 60_000}))


def test_a_store_key_and_a_registry_value_are_both_translated() -> None:
    from tablecast.cluster import schema_registry
    from tablecast.contract import confluent_wire

    url = "http://127.0.0.1:9/never-asked"
    info = TableInfo(
        "t",
        "t",
        4,
        {"format": "string", "changelog": "kafka-streams-window"},
        {"format": "confluent-json", "registry": url},
        kind="window",
        extra={"size_ms": 60_000},
        attached=True,
    )
    checked = TableInfo.checked(info.name, info.to_json())
    # schema 7 known already (a JSON Schema's values are their JSON): no request made
    schema_registry.registry(url)._decoders[7] = schema_registry._json
    translate = translation(checked)
    assert translate is not None
    written = b"user-1" + _Q.pack(60_000) + struct.pack(">i", 0)
    key, value, _ = translate(written, confluent_wire.join(7, b'{"n":1}'), 5)
    assert (split_window_key(key), value) == ((b"user-1", 60_000), b'{"n":1}')
    with pytest.raises(BadRecord, match="bad value"):
        translate(written, b"not the wire format", 5)


@pytest.mark.parametrize(
    ("key", "value", "extra", "why"),
    [
        # a registry key's partition follows from no text of it: it is looked up
        ({"format": "confluent-avro", "registry": "http://r"}, {"format": "json"}, {}, "looked up"),
        (
            {"format": "debezium", "head": "", "fields": ["id"]},
            {"format": "confluent-avro", "registry": "http://r"},
            {},
            "not debezium",
        ),
        ({"format": "json"}, {"format": "confluent-json", "registry": "ftp://r"}, {}, "http"),
    ],
)
def test_registry_formats_where_they_are_not_read_are_refused(
    key: dict[str, object], value: dict[str, object], extra: dict[str, object], why: str
) -> None:
    info = TableInfo("t", "t", 1, key, value, extra=extra, attached=True)
    with pytest.raises(BadEntry, match=why):
        TableInfo.checked("t", info.to_json())


def test_registry_keys_of_a_table_whose_keys_are_looked_up_are_read() -> None:
    key = {"format": "confluent-protobuf", "registry": "https://r/apis/ccompat/v7"}
    info = TableInfo("t", "t", 2, key, {"format": "json"}, attached=True, partitioner="unknown")
    checked = TableInfo.checked("t", info.to_json())
    keys = checked.key_serde
    # a key's text is its JSON, text that is not JSON a string; kept with sorted fields
    assert keys.text_to_bytes('{"b":1,"a":"x"}') == b'{"a":"x","b":1}'
    assert keys.text_to_bytes("card-1") == b'"card-1"'
    assert keys.text_to_bytes("12") == b"12"


def test_a_store_key_of_another_inner_format_or_indexed_windows_are_refused() -> None:
    bad_inner = TableInfo(
        "t",
        "t",
        1,
        {"format": "debezium", "head": "", "fields": ["id"], "changelog": "kafka-streams-window"},
        {"format": "long"},
        kind="window",
        extra={"size_ms": 1},
        attached=True,
    )
    with pytest.raises(BadEntry, match="own format"):
        TableInfo.checked("t", bad_inner.to_json())
    indexed = _info(
        "kafka-streams-window", {"size_ms": 1, "indexes": ["a"], "index_paths": {"a": "$.a"}}
    )
    with pytest.raises(BadEntry, match="not of windows"):
        TableInfo.checked("t", indexed.to_json())
