"""The PostgreSQL front end's SQL and types without a node: what a statement reads, what it
refuses (with which SQLSTATE), and values encoded as PostgreSQL's own clients decode them."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from psycopg.types.numeric import DecimalBinaryDumper

from tablecast.contract.table_info import TableInfo
from tablecast.pg import types, wire
from tablecast.pg.relations import Rows, SqlError, Tables
from tablecast.pg.statements import (
    FunctionRead,
    Nothing,
    Param,
    Read,
    Setting,
    Show,
    key_raw,
    key_text,
    parse,
    row_passes,
    time_ms,
)

KV = TableInfo("kv", "t", 4, {"format": "string"}, {"format": "json"})
NUMS = TableInfo("nums", "n", 4, {"format": "long"}, {"format": "json"})
PER_MINUTE = TableInfo(
    "per_minute", "w", 4, {"format": "string"}, {"format": "json"}, kind="window",
    extra={"size_ms": 60_000},
)  # fmt: skip


def _lookup(name: str) -> TableInfo:
    found = {"kv": KV, "nums": NUMS, "per_minute": PER_MINUTE}.get(name)
    if found is None:
        raise SqlError("42P01", f'relation "{name}" does not exist')
    return found


TABLES = Tables(_lookup, lambda: [KV, NUMS])


def one(sql: str) -> object:
    (statement,) = parse(sql, TABLES)
    return statement


def test_the_where_picks_how_a_table_is_read() -> None:
    key = one("SELECT key, value FROM kv WHERE key = $1")
    assert isinstance(key, Read) and key.filter.path == "key" and key.filter.keys == (Param(1),)
    assert key.params == 1 and key.param_types[1] is types.TEXT
    keys = one("SELECT * FROM public.kv WHERE key IN ('a', 'b')")
    assert isinstance(keys, Read) and keys.filter.path == "keys" and len(keys.outputs) == 5
    assert keys.metadata  # all columns: each key's record is read with its offset and time
    assert one("SELECT timestamp FROM kv WHERE key IN ('a')").metadata  # type: ignore[union-attr]
    assert not one("SELECT key, value->>'f' FROM kv WHERE key IN ('a', 'b')").metadata  # type: ignore[union-attr]
    prefix = one("SELECT key FROM kv WHERE key LIKE 'ab%' ORDER BY key LIMIT $1")
    assert isinstance(prefix, Read) and prefix.filter.path == "prefix"
    assert prefix.limit == Param(1) and prefix.param_types[1] is types.INT8
    span = one("SELECT key FROM kv WHERE 'a' <= key AND key < 'b'")
    assert isinstance(span, Read) and span.filter.low == ("a", True)
    assert span.filter.high == ("b", False)
    count = one("SELECT count(*) FROM kv")
    assert isinstance(count, Read) and count.count and count.filter.path == "all"
    long_key = one("SELECT key FROM nums WHERE key > $1")
    assert isinstance(long_key, Read) and long_key.param_types[1] is types.INT8


def test_every_row_read_is_checked_against_the_whole_where() -> None:
    span = one("SELECT key FROM kv WHERE key > 'a' AND key <= 'c' AND key LIKE 'b%'")
    assert isinstance(span, Read)
    where = span.filter.where
    assert [k for k in ("a", "b", "bz", "c", "ca") if row_passes(where, k.encode(), KV, [])] == [
        "b",
        "bz",
    ]
    positive = one("SELECT key FROM nums WHERE key > 0 AND key <= 1000")
    assert isinstance(positive, Read)
    raw = NUMS.key_serde.serialize
    # bigint keys compare as numbers, though their bytes put negatives last
    assert [
        n for n in (-5, 0, 7, 1000, 1001) if row_passes(positive.filter.where, raw(n), NUMS, [])
    ] == [7, 1000]
    nums = one("SELECT key FROM nums WHERE key IN ($1, 7)")
    assert isinstance(nums, Read)
    raw = NUMS.key_serde.serialize
    assert row_passes(nums.filter.where, raw(5), NUMS, [5])
    assert not row_passes(nums.filter.where, raw(6), NUMS, [5])


def test_keys_of_every_text_format_compare_as_http_reads_them() -> None:
    """A key in a statement is the key's text form, as HTTP's URL takes it, and a LIKE
    prefix is the range read's: bytes keys are their latin-1 text (digits too), a JSON
    key's prefix is its compact JSON text's."""
    blobs = TableInfo("blobs", "b", 4, {"format": "bytes"}, {"format": "json"})
    docs = TableInfo("docs", "d", 4, {"format": "json"}, {"format": "json"})
    tables = Tables({"blobs": blobs, "docs": docs}.__getitem__, lambda: [blobs, docs])

    def where(sql: str) -> Any:
        (statement,) = parse(sql, tables)
        assert isinstance(statement, Read)
        return statement.filter.where

    span = where("SELECT key FROM blobs WHERE key >= '100' AND key < '200'")
    assert [k for k in (b"099", b"100", b"150x", b"200") if row_passes(span, k, blobs, [])] == [
        b"100",
        b"150x",
    ]
    assert row_passes(where("SELECT key FROM blobs WHERE key IN ('123', 'x')"), b"x", blobs, [])
    assert key_raw(blobs, "123") == b"123" and key_text(blobs, "123") == "123"
    assert row_passes(where("SELECT key FROM blobs WHERE key LIKE '12%'"), b"123", blobs, [])
    like = where("""SELECT key FROM docs WHERE key LIKE '"ab%'""")
    assert [k for k in (b'"abc"', b'"b"', b"12") if row_passes(like, k, docs, [])] == [b'"abc"']
    assert key_raw(docs, '{"a": 1}') == b'{"a":1}'


def test_select_list_expressions_and_their_types() -> None:
    read = one("SELECT value->>'a', (value->>'n')::numeric, value->'t'->>0 AS first FROM kv")
    assert isinstance(read, Read)
    row = {"key": "k", "value": {"a": "x", "n": 1.5, "t": ["y"]}}
    assert [o.of(row) for o in read.outputs] == ["x", Decimal("1.5"), "y"]
    assert [o.name for o in read.outputs] == ["?column?", "numeric", "first"]
    assert [o.type for o in read.outputs] == [types.TEXT, types.NUMERIC, types.TEXT]


@pytest.mark.parametrize(
    ("sql", "code"),
    [
        ("SELECT * FROM missing", "42P01"),
        ("SELECT * FROM other_schema.kv", "42P01"),
        ("INSERT INTO kv VALUES (1)", "25006"),
        ("UPDATE kv SET value = '{}'", "25006"),
        ("DROP TABLE kv", "25006"),
        ("SELECT * FROM kv WHERE value->>'a' = 'x'", "0A000"),
        ("SELECT * FROM kv WHERE key LIKE 'a%b%'", "0A000"),
        ("SELECT * FROM kv WHERE key = 'a' OR key = 'b'", "0A000"),
        ("SELECT * FROM kv ORDER BY value", "0A000"),
        ("SELECT * FROM kv JOIN nums ON kv.key = nums.key", "0A000"),
        ("SELECT key, count(*) FROM kv GROUP BY key", "0A000"),
        ("SELECT nope FROM kv", "42703"),
        ("SELECT * FROM kv LIMIT -1", "22023"),
        ("SELECT FROM WHERE", "42601"),
        ("SELECT (value->>'a')::point FROM kv", "0A000"),
        ("VACUUM", "0A000"),
        ("SELECT * FROM per_minute WHERE key = 'a'", "0A000"),
        ("SELECT * FROM tablecast.windows('kv', 'a')", "42809"),
        ("SELECT * FROM tablecast.history('per_minute', 'a')", "42809"),
        ("SELECT * FROM tablecast.history('kv')", "42883"),
        ("SELECT * FROM tablecast.nope('kv')", "42883"),
        ("SELECT * FROM tablecast.history('kv', 'a') WHERE key = 'a'", "0A000"),
        (
            "SELECT * FROM tablecast.history('kv', 'a') WHERE timestamp > 1 OR timestamp < 0",
            "0A000",
        ),
        ("SELECT * FROM tablecast.index('kv', 'i', 'v') WHERE key > 'a'", "0A000"),
        ("SELECT * FROM tablecast.windows('per_minute', 'a') ORDER BY window_start DESC", "0A000"),
        ("SELECT * FROM tablecast.index_range('kv', 'i', 'a', 'b') ORDER BY key", "0A000"),
    ],
)
def test_what_is_refused_names_its_sqlstate(sql: str, code: str) -> None:
    with pytest.raises(SqlError) as refused:
        parse(sql, TABLES)
    assert refused.value.code == code, refused.value.message


def test_table_functions_and_their_time_bounds() -> None:
    history = one(
        "SELECT * FROM tablecast.history('kv', $1) WHERE timestamp >= '2026-12-01 10:00:00+00'"
        " AND timestamp < $2 ORDER BY timestamp DESC"
    )
    assert isinstance(history, FunctionRead) and history.newest_first
    assert [o.name for o in history.outputs] == ["key", "value", "timestamp", "offset"]
    assert history.params == 2 and history.param_types[2] is types.TIMESTAMPTZ
    at = 1_796_119_200_000  # 2026-12-01 10:00:00 UTC
    assert history.times.resolve(["k", at + 5]) == (at, at + 4)
    assert history.times.resolve(["k", "2026-12-01T10:00:00.010Z"]) == (at, at + 9)
    windows = one(
        "SELECT window_start, value FROM tablecast.windows('per_minute', 'u1')"
        " WHERE window_start BETWEEN 60000 AND 120000 AND 90000 < window_start"
    )
    assert isinstance(windows, FunctionRead) and windows.kind == "windows"
    assert windows.times.resolve([]) == (90_001, 120_000)
    assert [o.type for o in windows.outputs] == [types.TIMESTAMPTZ, types.JSONB]
    span = one("SELECT * FROM tablecast.index_range('kv', 'tier', 'a', NULL) ORDER BY index_value")
    assert isinstance(span, FunctionRead) and span.args == ("tier", "a", None)
    assert [o.name for o in span.outputs] == ["index_value", "key", "value"]
    with pytest.raises(SqlError) as bad:
        history.times.resolve(["k", "not a time"])
    assert bad.value.code == "22007"
    assert time_ms(dt.datetime(2026, 12, 1, 10, tzinfo=dt.UTC)) == at
    assert (
        types.decode_parameter(((at - 946_684_800_000) * 1000).to_bytes(8, "big"), 1184, True) == at
    )


def test_the_live_form_is_found_before_the_parser() -> None:
    from tablecast.pg.statements import Subscribe

    assert one("COPY (SUBSCRIBE TO kv) TO STDOUT") == Subscribe("kv")
    assert one("copy (subscribe kv where key like 'ab%') to stdout;") == Subscribe(
        "kv", prefix="ab"
    )
    assert one("COPY (SUBSCRIBE TO kv WHERE key IN ('a', $1)) TO STDOUT") == Subscribe(
        "kv", keys=("a", Param(1)), params=1
    )
    # resumed after a position, and without a snapshot
    assert one("COPY (SUBSCRIBE TO kv WHERE key = 'a' SINCE 'kv@0:5') TO STDOUT") == Subscribe(
        "kv", keys=("a",), since="kv@0:5"
    )
    assert one("COPY (SUBSCRIBE kv SINCE $2 WITH (SNAPSHOT = false)) TO STDOUT") == Subscribe(
        "kv", since=Param(2), snapshot=False, params=2
    )
    assert one("COPY (SUBSCRIBE kv WHERE key LIKE 'it''s%' SINCE 'x''y') TO STDOUT") == Subscribe(
        "kv", prefix="it's", since="x'y"
    )
    assert one("COPY (SUBSCRIBE TO kv WHERE key >= 'a' AND key < 'b') TO STDOUT") == Subscribe(
        "kv", start="a", end="b"
    )
    for refused in (
        "COPY (SUBSCRIBE TO kv WHERE key > 'a') TO STDOUT",
        "COPY (SUBSCRIBE TO nope) TO STDOUT",
    ):
        with pytest.raises(SqlError):
            parse(refused, TABLES)


def test_settings_constants_and_the_catalog() -> None:
    assert one("SET tablecast.max_lag = 5") == Setting("tablecast.max_lag", 5)
    assert one("SET tablecast.after TO DEFAULT") == Setting("tablecast.after", None)
    assert one("RESET tablecast.after") == Setting("tablecast.after", None)
    assert one("SHOW tablecast.position") == Show("tablecast.position")
    assert one("BEGIN") == Nothing("BEGIN") and one("COMMIT") == Nothing("COMMIT")
    assert parse("  ;  ", TABLES) == []
    constants = one("SELECT 1, version(), current_setting('server_version')")
    assert isinstance(constants, Rows) and constants.rows[0][0] == 1
    assert "tablecast" in constants.rows[0][1] and constants.rows[0][2] == "15.0"
    listed = one(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' "
        "AND table_name LIKE 'n%'"
    )
    assert isinstance(listed, Rows) and listed.rows == (("nums",),)
    columns = one(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_name = 'nums' ORDER BY ordinal_position LIMIT 2"
    )
    assert isinstance(columns, Rows) and columns.rows == (("key", "bigint"), ("value", "jsonb"))


#: psql 15's \\du
PSQL_DU = """SELECT r.rolname, r.rolsuper, r.rolinherit,
  r.rolcreaterole, r.rolcreatedb, r.rolcanlogin,
  r.rolconnlimit, r.rolvaliduntil,
  ARRAY(SELECT b.rolname
        FROM pg_catalog.pg_auth_members m
        JOIN pg_catalog.pg_roles b ON (m.roleid = b.oid)
        WHERE m.member = r.oid) as memberof
, r.rolreplication
, r.rolbypassrls
FROM pg_catalog.pg_roles r
WHERE r.rolname !~ '^pg_'
ORDER BY 1;"""


def test_the_role_and_the_settings_are_listed() -> None:
    roles = one(PSQL_DU)
    assert isinstance(roles, Rows)
    assert [(r[0], r[8]) for r in roles.rows] == [("tablecast", "{}")]
    settings = one(
        "SELECT name, setting, context FROM pg_catalog.pg_settings "
        "WHERE name IN ('server_version', 'TimeZone', 'max_index_keys') ORDER BY name"
    )
    assert isinstance(settings, Rows)
    assert settings.rows == (
        ("TimeZone", "UTC", "user"),
        ("max_index_keys", "32", "internal"),
        ("server_version", "15.0", "internal"),
    )
    assert one("SELECT count(*) FROM pg_auth_members").rows == ((0,),)  # type: ignore[union-attr]


@given(
    st.decimals(
        allow_nan=False, allow_infinity=False, places=6, max_value=10**12, min_value=-(10**12)
    )
)
def test_numeric_binary_is_what_psycopg_writes(value: Decimal) -> None:
    assert types.NUMERIC.binary(value) == bytes(DecimalBinaryDumper(Decimal).dump(value))


def test_timestamps_and_casts() -> None:
    ms = 1_700_000_000_123
    assert types.TIMESTAMPTZ.text(ms) == b"2023-11-14 22:13:20.123+00"
    micros = int.from_bytes(types.TIMESTAMPTZ.binary(ms), "big", signed=True)
    epoch = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
    assert epoch + dt.timedelta(microseconds=micros) == dt.datetime.fromtimestamp(ms / 1000, dt.UTC)
    assert types.cast("42", types.INT4) == 42 and types.cast(True, types.TEXT) == "true"
    assert types.cast('{"a": 1}', types.JSONB) == {"a": 1}
    with pytest.raises(types.CastFailed):
        types.cast("x", types.INT8)
    with pytest.raises(types.CastFailed):
        types.cast(2**40, types.INT4)


def test_messages_are_framed_and_bounded() -> None:
    row = wire.data_row([b"a", None])
    assert row[:1] == b"D" and int.from_bytes(row[1:5], "big") == len(row) - 1
    payload = wire.Payload(b"user\0me\0database\0tablecast\0\0")
    assert wire.startup_parameters(payload) == {"user": "me", "database": "tablecast"}
    with pytest.raises(wire.ProtocolViolation):
        wire.Payload(b"no terminator").cstring()
    with pytest.raises(wire.ProtocolViolation):
        wire.Payload(b"\0\0").int32()
    error = wire.error_response("42P01", "no such table")
    assert b"C42P01\0" in error and error.endswith(b"\0")


PSQL_DT = """SELECT n.nspname as "Schema", c.relname as "Name",
  CASE c.relkind WHEN 'r' THEN 'table' WHEN 'v' THEN 'view' END as "Type",
  pg_catalog.pg_get_userbyid(c.relowner) as "Owner"
FROM pg_catalog.pg_class c
     LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     LEFT JOIN pg_catalog.pg_am am ON am.oid = c.relam
WHERE c.relkind IN ('r','p','')
      AND n.nspname <> 'pg_catalog'
      AND n.nspname !~ '^pg_toast'
      AND n.nspname <> 'information_schema'
  AND pg_catalog.pg_table_is_visible(c.oid)
ORDER BY 1,2;"""

PSQL_FIND = """SELECT c.oid, n.nspname, c.relname
FROM pg_catalog.pg_class c
     LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relname OPERATOR(pg_catalog.~) '^(nums)$' COLLATE pg_catalog.default
  AND pg_catalog.pg_table_is_visible(c.oid)
ORDER BY 2, 3;"""


#: what pgJDBC 42.7's DatabaseMetaData.getPrimaryKeys sends
PRIMARY_KEYS = (
    'SELECT        result.TABLE_CAT AS "TABLE_CAT",        result.TABLE_SCHEM AS "TABLE_SCHEM",'
    '        result.TABLE_NAME AS "TABLE_NAME",        result.COLUMN_NAME AS "COLUMN_NAME",'
    '        result.KEY_SEQ AS "KEY_SEQ",        result.PK_NAME AS "PK_NAME"FROM      ('
    "SELECT current_database() AS TABLE_CAT, n.nspname AS TABLE_SCHEM,   ct.relname AS "
    "TABLE_NAME, a.attname AS COLUMN_NAME,   (information_schema._pg_expandarray(con.conkey)).n"
    " AS KEY_SEQ, con.conname AS PK_NAME,   information_schema._pg_expandarray(con.conkey) AS "
    "KEYS, a.attnum AS A_ATTNUM FROM pg_catalog.pg_constraint con   JOIN pg_catalog.pg_class ct"
    " ON (con.conrelid = ct.oid)   JOIN pg_catalog.pg_namespace n ON (ct.relnamespace = n.oid)"
    "   JOIN pg_catalog.pg_attribute a ON (a.attrelid = ct.oid) WHERE con.contype = 'p' "
    " AND n.nspname = E'public' AND ct.relname = E'{table}' ) result where  result.A_ATTNUM = "
    "(result.KEYS).x  ORDER BY result.table_name, result.pk_name, result.key_seq"
)
#: the form before it, on pg_index (tools that copied it add KEY_COUNT)
PRIMARY_KEYS_BY_INDEX = (
    "SELECT result.TABLE_CAT, result.TABLE_SCHEM, result.TABLE_NAME, result.COLUMN_NAME, "
    "result.KEY_SEQ, result.PK_NAME FROM (SELECT current_database() AS TABLE_CAT, "
    "n.nspname AS TABLE_SCHEM, ct.relname AS TABLE_NAME, a.attname AS COLUMN_NAME, "
    "(information_schema._pg_expandarray(i.indkey)).n AS KEY_SEQ, ci.relname AS PK_NAME, "
    "information_schema._pg_expandarray(i.indkey) AS KEYS, a.attnum AS A_ATTNUM, "
    "i.indnkeyatts AS KEY_COUNT FROM pg_catalog.pg_class ct "
    "JOIN pg_catalog.pg_attribute a ON (ct.oid = a.attrelid) "
    "JOIN pg_catalog.pg_namespace n ON (ct.relnamespace = n.oid) "
    "JOIN pg_catalog.pg_index i ON ( a.attrelid = i.indrelid) "
    "JOIN pg_catalog.pg_class ci ON (ci.oid = i.indexrelid) WHERE true  "
    "AND n.nspname = E'public' AND ct.relname = E'{table}' AND i.indisprimary ) result "
    "where result.A_ATTNUM = (result.KEYS).x AND result.KEY_SEQ <= KEY_COUNT "
    "ORDER BY result.table_name, result.pk_name, result.key_seq"
)


@pytest.mark.parametrize("query", [PRIMARY_KEYS, PRIMARY_KEYS_BY_INDEX])
def test_jdbcs_primary_keys_are_each_tables_key(query: str) -> None:
    for table in ("kv", "nums"):
        rows = one(query.format(table=table))
        assert isinstance(rows, Rows)
        assert rows.rows == (("tablecast", "public", table, "key", 1, f"{table}_pkey"),)
    rows = one(query.format(table="nope"))
    assert isinstance(rows, Rows) and rows.rows == ()


def test_psqls_catalog_queries_answer_from_the_tables() -> None:
    listed = one(PSQL_DT)
    assert isinstance(listed, Rows)
    assert listed.rows == (
        ("public", "kv", "table", "tablecast"),
        ("public", "nums", "table", "tablecast"),
    )
    found = one(PSQL_FIND)
    assert isinstance(found, Rows) and [r[1:] for r in found.rows] == [("public", "nums")]
    oid = found.rows[0][0]
    columns = one(
        "SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod), a.attnotnull "
        f"FROM pg_catalog.pg_attribute a WHERE a.attrelid = '{oid}' AND a.attnum > 0 "
        "AND NOT a.attisdropped ORDER BY a.attnum"
    )
    assert isinstance(columns, Rows)
    assert columns.rows[:2] == (("key", "bigint", True), ("value", "jsonb", False))
    # a system table not kept here: no rows, its columns named
    policies = one("SELECT pol.polname, pol.polcmd FROM pg_catalog.pg_policy pol")
    assert isinstance(policies, Rows) and policies.rows == ()
    assert [n for n, _ in policies.outputs] == ["polname", "polcmd"]


#: what psql 15's \l sends
PSQL_LIST_DATABASES = """SELECT
  d.datname as "Name",
  pg_catalog.pg_get_userbyid(d.datdba) as "Owner",
  pg_catalog.pg_encoding_to_char(d.encoding) as "Encoding",
  d.datcollate as "Collate",
  d.datctype as "Ctype",
  d.daticulocale as "ICU Locale",
  CASE d.datlocprovider WHEN 'c' THEN 'libc' WHEN 'i' THEN 'icu' END AS "Locale Provider",
  pg_catalog.array_to_string(d.datacl, E'\\n') AS "Access privileges"
FROM pg_catalog.pg_database d
ORDER BY 1;"""


def test_the_node_is_one_database_of_one_role_with_its_tables() -> None:
    databases = one(PSQL_LIST_DATABASES)
    assert isinstance(databases, Rows)
    assert databases.rows == (("tablecast", "tablecast", "UTF8", "C", "C", None, "libc", None),)
    assert one("SELECT current_database()").rows == (("tablecast",),)  # type: ignore[union-attr]
    tables = one(
        "SELECT schemaname, tablename, tableowner FROM pg_catalog.pg_tables "
        "WHERE schemaname NOT IN ('pg_catalog', 'information_schema') ORDER BY tablename"
    )
    assert isinstance(tables, Rows)
    assert tables.rows == (("public", "kv", "tablecast"), ("public", "nums", "tablecast"))
    roles = one("SELECT rolname, rolcanlogin FROM pg_roles WHERE rolname !~ '^pg_'")
    assert isinstance(roles, Rows) and roles.rows == (("tablecast", True),)
    views = one("SELECT viewname FROM pg_catalog.pg_views WHERE schemaname = 'public'")
    assert (
        isinstance(views, Rows)
        and views.rows == ()
        and [c[0] for c in views.outputs] == ["viewname"]
    )
