"""Debezium change events and keys as the JSON converter writes them, and the rows and
keys a table keeps of them."""

from __future__ import annotations

import orjson
import pytest

from tablecast import serde
from tablecast.contract import debezium
from tablecast.contract.partitioner import partition_for
from tablecast.contract.table_info import TableInfo

# as Kafka Connect 4.2's JsonConverter wrote them for Debezium 3.6's PostgreSQL connector
KEY = (
    b'{"schema":{"type":"struct","fields":[{"type":"int32","optional":false,"field":"id"}],'
    b'"optional":false,"name":"try1.public.customers.Key"},"payload":{"id":1}}'
)
COMPOSITE = (
    b'{"schema":{"type":"struct","fields":[{"type":"int32","optional":false,"field":"customer"},'
    b'{"type":"string","optional":false,"field":"code"}],"optional":false,'
    b'"name":"p.public.bookings.Key"},"payload":{"customer":3,"code":"\xc3\xbc/2"}}'
)


def _event(op: str, after: object, ts: int | None = 1700, schema: bool = True) -> bytes:
    payload = {"before": None, "after": after, "op": op, "ts_ms": 1800}
    if ts is not None:
        payload["source"] = {"ts_ms": ts, "table": "customers"}
    return orjson.dumps({"schema": {"type": "struct"}, "payload": payload} if schema else payload)


def test_a_key_is_kept_canonical_and_its_writer_bytes_rebuilt() -> None:
    head, fields = debezium.key_layout(KEY)
    assert fields == ["id"] and head.endswith(',"payload":')
    canonical = debezium.canonical_key(KEY)
    assert canonical == b'{"id":1}'
    assert debezium.writer_key(canonical, head, fields) == KEY
    head, fields = debezium.key_layout(COMPOSITE)
    assert fields == ["customer", "code"]
    canonical = debezium.canonical_key(COMPOSITE)
    assert canonical == '{"code":"ü/2","customer":3}'.encode()
    assert debezium.writer_key(canonical, head, fields) == COMPOSITE


def test_a_key_without_an_envelope() -> None:
    bare = b'{"id":7}'
    head, fields = debezium.key_layout(bare)
    assert (head, fields) == ("", ["id"])
    assert debezium.writer_key(debezium.canonical_key(bare), head, fields) == bare


def test_a_key_from_its_text() -> None:
    assert debezium.key_of_text("42", ["id"]) == b'{"id":42}'
    assert debezium.key_of_text('{"id": 42}', ["id"]) == b'{"id":42}'
    assert debezium.key_of_text("abc", ["code"]) == b'{"code":"abc"}'
    assert debezium.key_of_text('"42"', ["code"]) == b'{"code":"42"}'
    both = '{"customer": 3, "code": "x"}'
    assert debezium.key_of_text(both, ["customer", "code"]) == b'{"code":"x","customer":3}'
    with pytest.raises(debezium.BadEvent):
        debezium.key_of_text("3", ["customer", "code"])


def test_events_make_rows_at_the_source_time() -> None:
    row = {"id": 1, "name": "ann"}
    for op in ("c", "u", "r"):
        assert debezium.row(_event(op, row)) == (orjson.dumps(row), 1700)
        assert debezium.row(_event(op, row, schema=False)) == (orjson.dumps(row), 1700)
    assert debezium.row(_event("d", None)) == (None, 1700)
    assert debezium.row(_event("u", row, ts=None)) == (orjson.dumps(row), 1800)
    for bad in (b"not json", b"[1]", _event("t", None), _event("u", None), b'{"op": "c"}'):
        with pytest.raises(debezium.BadEvent):
            debezium.row(bad)


def test_a_debezium_table_finds_a_key_where_kafka_connect_put_it() -> None:
    head, fields = debezium.key_layout(KEY)
    info = TableInfo(
        "t", "t", 12, {"format": "debezium", "head": head, "fields": fields}, {"format": "debezium"}
    )
    assert serde.from_spec(info.key) == info.key_serde
    stored = info.key_serde.text_to_bytes("1")
    assert stored == b'{"id":1}'
    assert info.partition_of(stored) == partition_for(KEY, 12)
    assert info.key_serde.to_json(stored) == {"id": 1}


def test_an_unwrapper_parses_only_the_payload_of_a_known_envelope() -> None:
    unwrap = debezium.Unwrapper()
    tricky = {"id": 1, "note": ',"payload":{"id":2}}'}
    events = [
        _event("c", {"id": 1}),
        _event("u", tricky),  # the marker inside the row
        _event("u", {"id": 1}, schema=False),
        orjson.dumps({"schema": {"type": "other"}, "payload": {"op": "d"}}),  # a new schema
        _event("c", {"id": 3}),
    ]
    for data in events:
        assert (
            unwrap(data)
            == debezium.unwrapped(data)
            == orjson.loads(data).get("payload", orjson.loads(data))
        )
    # the envelope's bytes with something after the payload: not the fast path's to read
    odd = _event("c", {"id": 4})[:-1] + b',"extra":1}'
    assert unwrap(odd) == {"schema": {"type": "struct"}, "payload": orjson.loads(odd)["payload"],
                           "extra": 1}  # fmt: skip


def test_keys_not_written_as_the_converter_writes_them_are_refused() -> None:
    with pytest.raises(debezium.BadEvent, match="cannot rebuild"):
        debezium.key_layout(b'{"schema": {"type": "struct"}, "payload": {"id": 1}}')


def test_a_text_key_is_the_text_and_times_are_int64() -> None:
    head, fields = debezium.key_layout(
        b'{"schema":{"type":"struct","fields":[{"type":"string","optional":false,'
        b'"field":"code"}],"optional":false,"name":"k"},"payload":{"code":"42"}}'
    )
    assert debezium.text_field(head, fields)
    assert debezium.key_of_text("42", fields, True) == b'{"code":"42"}'
    assert debezium.key_of_text('"{x"', fields, True) == b'{"code":"{x"}'
    assert not debezium.text_field(*debezium.key_layout(KEY))
    huge = orjson.dumps({"op": "c", "after": {}, "source": {"ts_ms": 1 << 63}, "ts_ms": 5})
    assert debezium.row(huge) == (b"{}", 5)
    assert debezium.row(orjson.dumps({"op": "c", "after": {}, "ts_ms": True})) == (b"{}", None)


def test_a_tombstone_stands_at_its_delete_time() -> None:
    from tablecast.cluster.attached_records import translation

    head, fields = debezium.key_layout(KEY)
    info = TableInfo(
        "t", "t", 4, {"format": "debezium", "head": head, "fields": fields}, {"format": "debezium"}
    )
    translate = translation(info)
    assert translate is not None
    assert translate(KEY, _event("d", None, ts=1700), 9000) == (b'{"id":1}', None, 1700)
    assert translate(KEY, None, 9001) == (b'{"id":1}', None, 1700)
    assert translate(KEY, None, 9002) == (b'{"id":1}', None, 9002)  # no delete before it


@pytest.mark.parametrize(
    "spec",
    [
        {"format": "debezium"},
        {"format": "debezium", "fields": []},
        {"format": "debezium", "fields": [1]},
        {"format": "debezium", "fields": ["id"], "head": None},
    ],
)
def test_a_debezium_key_spec_names_its_fields(spec: dict[str, object]) -> None:
    from tablecast.contract.table_info import BadEntry

    info = TableInfo("t", "t", 4, spec, {"format": "debezium"})
    with pytest.raises(BadEntry, match="debezium key"):
        TableInfo.checked("t", info.to_json())


@pytest.mark.parametrize(
    "extra",
    [
        {"indexes": 5, "index_paths": {}},
        {"indexes": [[1]], "index_paths": {}},
        {"indexes": ["a"], "index_paths": {"a": '$["\\q"]'}},
        {"indexes": ["a"], "index_paths": {"a": "$[" + "9" * 5000 + "]"}},
    ],
)
def test_bad_index_paths_are_a_bad_entry(extra: dict[str, object]) -> None:
    from tablecast.contract.table_info import BadEntry

    info = TableInfo("t", "t", 4, {"format": "string"}, {"format": "json"}, extra=extra)
    with pytest.raises(BadEntry):
        TableInfo.checked("t", info.to_json())
