"""Tables over the PostgreSQL protocol (``serve --pg-port``), read by clients nobody here
wrote — psycopg 3 (simple, extended and prepared, text and binary) and Debian's psql —
every answer compared with the HTTP API's, on two nodes so that half the keys are
another node's. Then TLS with the node's certificate and a JWT as the password."""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
import subprocess
import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import orjson
import psycopg
import pytest
from confluent_kafka import Producer
from psycopg import errors

from tablecast import serde
from tablecast.contract.partitioner import PRODUCER_CONFIG
from tablecast.kafka.attach import attach
from tablecast.kafka.broker import free_port
from tablecast.kafka.config import client_conf
from tablecast.kafka.topics import ensure_topic

from ..support import node_pg, pg_fuzz, pgjdbc
from ..support.procs import NodeProcess, eventually, start_node, stop_all
from .tables import make_table, write_windows
from .test_auth import SECRET, token
from .test_tls_peers import certificate_files

pytestmark = pytest.mark.integration

KEYS = [f"k{i:03d}" for i in range(120)]
#: the first window start of the window table (epoch ms)
WINDOWS_BASE = 1_700_000_040_000
#: protocol fuzz cases in the suite (python -m bench pg_fuzz runs many more)
FUZZ_CASES = 400


def _http(node: NodeProcess, path: str, **params: Any) -> Any:
    r = httpx.get(node.url + path, params=params, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def _all_http(node: NodeProcess, table: str, **params: Any) -> list[dict[str, Any]]:
    rows, cursor = [], None
    while True:
        page = _http(node, f"/v1/tables/{table}/range", limit=1000, **params,
                     **({"cursor": cursor} if cursor else {}))  # fmt: skip
        rows += page["items"]
        cursor = page["next_cursor"]
        if not cursor:
            return rows


def test_sql_answers_what_http_answers(bootstrap: str, unique: str, logs: Path) -> None:
    kv = make_table(bootstrap, unique, "kv", 6, serde.string(), serde.json())
    kv.write(
        bootstrap, [(k, {"i": i, "name": f"n{i}", "tags": ["a", i]}) for i, k in enumerate(KEYS)]
    )
    nums = make_table(bootstrap, unique, "nums", 3, serde.long(), serde.json())
    nums.write(bootstrap, [(n, {"n": n}) for n in (-5, 0, 7, 42, 1000)])
    people = _people(bootstrap, unique)
    per_minute = make_table(bootstrap, unique, "per_minute", 3, serde.string(), serde.json(),
                            kind="window", extra={"size_ms": 60_000})  # fmt: skip
    minutes = [WINDOWS_BASE + m * 60_000 for m in range(4)]
    write_windows(bootstrap, per_minute, [(k, t, {"n": (t - minutes[0]) // 60_000})
                                          for k in ("u1", "u10") for t in minutes])  # fmt: skip
    pg_ports = [free_port()]
    while len(pg_ports) < 2:
        pg_ports += [p for p in [free_port()] if p not in pg_ports]
    nodes = [start_node(unique, bootstrap, logs, "--pg-port", str(p)) for p in pg_ports]
    try:
        for n in nodes:
            n.wait_ready()
        eventually(lambda: len(_http(nodes[0], "/v1/cluster")["nodes"]) == 2)
        nodes[0].wait_caught_up(bootstrap, "kv", kv.info.topic)
        nodes[1].wait_caught_up(bootstrap, "kv", kv.info.topic)

        def answers_kv(node: NodeProcess) -> bool:
            cluster = _http(node, "/v1/cluster")["nodes"]
            return any(
                r["table"] == "kv" and r["role"] == "active"
                for n in cluster
                if n["url"] == node.url
                for r in n["replicas"]
            )

        # SQL goes to a node that answers some of kv's partitions itself (replies kept for
        # its own keys are read below); the assignment may give the other node all six
        sql = eventually(lambda: next((n for n in nodes if answers_kv(n)), None))
        if sql is nodes[1]:
            nodes.reverse()
            pg_ports.reverse()
        pg_port = pg_ports[0]
        dsn = f"host=127.0.0.1 port={pg_port} dbname=tablecast user=tester sslmode=disable"
        with psycopg.connect(dsn, autocommit=True) as conn:
            _reads_match(conn, nodes[0])
            _errors_leave_the_connection_usable(conn)
            _consistency_settings(conn, nodes[0])
            with conn.cursor() as cur:
                cur.execute("SELECT key, value FROM nums WHERE key = %s", (42,))
                assert cur.fetchall() == [(42, {"n": 42})]
                cur.execute("SELECT key FROM nums ORDER BY key")
                # the HTTP API's order: serialized bytes (big-endian, sign bit first)
                http = [r["key"] for r in _all_http(nodes[0], "nums")]
                assert [r[0] for r in cur.fetchall()] == http
                cur.execute(
                    "SELECT table_name FROM information_schema.tables "
                    "WHERE table_schema = 'public' ORDER BY table_name"
                )
                assert cur.fetchall() == [("kv",), ("nums",), ("people",)]
                cur.execute(
                    "SELECT column_name, data_type FROM information_schema.columns "
                    "WHERE table_name = 'nums' ORDER BY ordinal_position"
                )
                assert cur.fetchall()[:2] == [("key", "bigint"), ("value", "jsonb")]
                cur.execute("SELECT version(), current_schema()")
                version, schema = cur.fetchone()  # type: ignore[misc]
                assert "tablecast" in version and schema == "public"
        nodes[0].wait_caught_up(bootstrap, "people", people)
        nodes[0].wait_caught_up(bootstrap, "per_minute", per_minute.info.topic)
        with psycopg.connect(dsn, autocommit=True) as conn:
            _history_index_as_of(conn, nodes[0])
            _windows(conn, nodes[0])
        _psql(pg_port, nodes[0])
        asyncio.run(_asyncpg(pg_port, nodes[0]))
        _jdbc(pg_port, nodes[0])
        _node_pg(pg_port, nodes[0])
        with psycopg.connect(dsn, autocommit=True) as conn:
            _subscribe(conn, kv, bootstrap)
    finally:
        stop_all(nodes)


def _reads_match(conn: psycopg.Connection, node: NodeProcess) -> None:
    for binary in (False, True):
        with conn.cursor(binary=binary) as cur:
            for key in [*KEYS[::7], "absent"]:
                cur.execute("SELECT key, value, partition FROM kv WHERE key = %s", (key,))
                got = cur.fetchall()
                r = httpx.get(f"{node.url}/v1/tables/kv/keys/{key}", timeout=10)
                if r.status_code == 404:
                    assert got == [], key
                else:
                    doc = r.json()
                    assert got == [(doc["key"], doc["value"], doc["partition"])], key
            # a prepared statement, executed again and again
            for key in KEYS[:20]:
                cur.execute("SELECT value->>'name', (value->>'i')::int FROM kv WHERE key = %s",
                            (key,), prepare=True)  # fmt: skip
                i = KEYS.index(key)
                assert cur.fetchall() == [(f"n{i}", i)]
            cur.execute("SELECT key, value FROM kv WHERE key IN ('k005', 'k001', 'nope', 'k001')")
            assert [r[0] for r in cur.fetchall()] == ["k001", "k005"]
            # each key's record as a read of it alone gives it
            columns = 'key, partition, "offset", timestamp'
            cur.execute(f"SELECT {columns} FROM kv WHERE key IN (%s, %s, 'nope')", ("k007", "k003"))
            got = cur.fetchall()
            want = []
            for key in ("k003", "k007"):
                doc = _http(node, f"/v1/tables/kv/keys/{key}")
                want.append((key, doc["partition"], doc["offset"], doc["timestamp"]))
            assert [(k, p, o, int(t.timestamp() * 1000)) for k, p, o, t in got] == want
            cur.execute("SELECT count(*) FROM kv")
            assert cur.fetchone() == (_http(node, "/v1/tables/kv/count")["count"],)
            cur.execute("SELECT key, value FROM kv LIMIT 7")
            first = _http(node, "/v1/tables/kv/range", limit=7)["items"]
            assert cur.fetchall() == [(r["key"], r["value"]) for r in first]
            cur.execute("SELECT key FROM kv WHERE key LIKE 'k01%' ORDER BY key")
            http = _all_http(node, "kv", prefix="k01")
            assert [r[0] for r in cur.fetchall()] == [r["key"] for r in http]
            # a whole table's records (both nodes' partitions) as HTTP's range gives them,
            # and as each key's read alone
            cur.execute(f"SELECT {columns} FROM kv")
            got = [(k, p, o, int(t.timestamp() * 1000)) for k, p, o, t in cur.fetchall()]
            fields = ("key", "partition", "offset", "timestamp")
            http = _all_http(node, "kv", record_fields="true")
            assert got == [tuple(r[f] for f in fields) for r in http] and len(got) == len(KEYS)
            assert {p for _, p, _, _ in got} == set(range(6))
            for key, *record in got[::17]:
                doc = _http(node, f"/v1/tables/kv/keys/{key}")
                assert record == [doc[f] for f in fields[1:]], key
            cur.execute("SELECT key FROM kv WHERE key >= %s AND key < %s", ("k050", "k060"))
            http = _all_http(node, "kv", **{"from": "k050", "to": "k060"})
            assert [r[0] for r in cur.fetchall()] == [r["key"] for r in http]
            cur.execute("SELECT key FROM kv WHERE key > 'k110' AND key <= 'k115'")
            assert [r[0] for r in cur.fetchall()] == [f"k{i}" for i in range(111, 116)]
            # paging by key, as a client walks a table
            seen, last = [], ""
            while True:
                cur.execute("SELECT key FROM kv WHERE key > %s ORDER BY key LIMIT 50", (last,))
                page = [r[0] for r in cur.fetchall()]
                if not page:
                    break
                seen += page
                last = page[-1]
            assert seen == [r["key"] for r in _all_http(node, "kv")]
            cur.execute("SELECT count(*) FROM kv WHERE key LIKE 'k1%'")
            assert cur.fetchone() == (len(_all_http(node, "kv", prefix="k1")),)
            cur.execute("SELECT value->'tags'->>1, value->'tags' FROM kv WHERE key = 'k003'")
            assert cur.fetchall() == [("3", ["a", 3])]
            cur.execute("SELECT * FROM kv WHERE key = 'k002'")
            assert [d.name for d in cur.description or ()] == [
                "key", "value", "partition", "offset", "timestamp",
            ]  # fmt: skip
            row = cur.fetchone()
            assert row is not None and row[4].year >= 2024


def _people(bootstrap: str, app: str) -> str:
    """An attached table with a history and an index: three versions of p1, tiers."""
    topic = f"{app}.people"
    ensure_topic(bootstrap, topic, 3, {"cleanup.policy": "compact"})
    producer = Producer(client_conf(bootstrap, PRODUCER_CONFIG))
    base = int(time.time() * 1000) - 60_000
    rows = [("p1", {"tier": "gold", "v": 1}), ("p2", {"tier": "gold", "v": 1}),
            ("p3", {"tier": "blue", "v": 1}), ("p1", {"tier": "gold", "v": 2}),
            ("p1", {"tier": "blue", "v": 3})]  # fmt: skip
    for i, (key, value) in enumerate(rows):
        producer.produce(
            topic, key=key.encode(), value=orjson.dumps(value), timestamp=base + i * 1000
        )
    assert producer.flush(30) == 0
    attach("people", app=app, topic=topic, bootstrap_servers=bootstrap, history="1 day",
           indexes={"tier": "$.tier"})  # fmt: skip
    return topic


def _history_index_as_of(conn: psycopg.Connection, node: NodeProcess) -> None:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT key, value, timestamp, \"offset\" FROM tablecast.history('people', %s) "
            "ORDER BY timestamp DESC",
            ("p1",),
        )
        got = cur.fetchall()
        http = _http(node, "/v1/tables/people/keys/p1/history", order="desc")["items"]
        assert [(r[1], int(r[2].timestamp() * 1000), r[3]) for r in got] == [
            (h["value"], h["timestamp"], h["offset"]) for h in http
        ]
        assert len(got) == 3 and all(r[0] == "p1" for r in got)
        cur.execute("SELECT value->>'v' FROM tablecast.history('people', 'p1') LIMIT 2")
        assert cur.fetchall() == [("1",), ("2",)]
        cur.execute("SELECT key, value FROM tablecast.index('people', 'tier', %s)", ("gold",))
        http = _http(node, "/v1/tables/people/index/tier/gold")["items"]
        assert cur.fetchall() == [(h["key"], h["value"]) for h in http]
        assert [h["key"] for h in http] == ["p2"]
        cur.execute(
            "SELECT index_value, key, value FROM tablecast.index_range('people', 'tier', %s, NULL)",
            ("c",),
        )
        http = _http(node, "/v1/tables/people/index/tier", **{"from": "c"})["items"]
        assert cur.fetchall() == [(h["index"], h["key"], h["value"]) for h in http]
        assert [h["key"] for h in http] == ["p2"]
        cur.execute("SELECT key FROM tablecast.index_range('people', 'tier', NULL, NULL)")
        assert [r[0] for r in cur.fetchall()] == ["p1", "p3", "p2"]  # blue, blue, gold
        versions = _http(node, "/v1/tables/people/keys/p1/history")["items"]
        # a key's versions between two times, as ?from=&to= bound them (to: exclusive)
        first, second = versions[0]["timestamp"], versions[1]["timestamp"]
        cur.execute(
            "SELECT value->>'v' FROM tablecast.history('people', 'p1')"
            " WHERE timestamp > %s AND timestamp <= %s",
            (dt.datetime.fromtimestamp(first / 1000, dt.UTC), second),
        )
        bounds = {"from": first + 1, "to": second + 1}
        http = _http(node, "/v1/tables/people/keys/p1/history", **bounds)
        assert cur.fetchall() == [(str(h["value"]["v"]),) for h in http["items"]] == [("2",)]
        cur.execute(
            "SELECT \"offset\" FROM tablecast.history('people', 'p1') WHERE timestamp >= %s",
            (versions[2]["timestamp"],),
        )
        assert cur.fetchall() == [(versions[2]["offset"],)]
        # as of the second version's time: the table as it was then
        at = versions[1]["timestamp"]
        cur.execute(f"SET tablecast.as_of = {at}")
        cur.execute("SELECT key, value->>'v' FROM people WHERE key IN ('p1', 'p3')")
        assert cur.fetchall() == [("p1", "2"), ("p3", "1")]
        cur.execute("SELECT value->>'v' FROM people WHERE key = %s", ("p1",))
        as_of = _http(node, "/v1/tables/people/keys/p1", as_of=at)["value"]
        assert cur.fetchall() == [(str(as_of["v"]),)] == [("2",)]
        cur.execute("SELECT count(*) FROM people")
        assert cur.fetchone() == (3,)
        # a table function takes no as_of (as HTTP's history and index reads take none)
        with pytest.raises(errors.FeatureNotSupported):
            cur.execute("SELECT * FROM tablecast.history('people', 'p1')")
        cur.execute("RESET tablecast.as_of")
        cur.execute("SELECT value->>'v' FROM people WHERE key = 'p1'")
        assert cur.fetchall() == [("3",)]


def _windows(conn: psycopg.Connection, node: NodeProcess) -> None:
    """A window table's windows of a key, bounded by their starts, as HTTP gives them."""
    base = WINDOWS_BASE
    with conn.cursor() as cur:
        cur.execute(
            "SELECT key, window_start, window_end, value FROM tablecast.windows('per_minute', %s)"
            " WHERE window_start BETWEEN %s AND %s",
            ("u1", base + 60_000, base + 120_000),
        )
        got = cur.fetchall()
        http = _http(node, "/v1/tables/per_minute/keys/u1/windows",
                     **{"from": base + 60_000, "to": base + 120_000})["items"]  # fmt: skip
        assert [(k, int(s.timestamp() * 1000), int(e.timestamp() * 1000), v)
                for k, s, e, v in got] == [
            ("u1", w["start"], w["end"], w["value"]) for w in http
        ]  # fmt: skip
        assert [v["n"] for *_, v in got] == [1, 2]
        cur.execute("SELECT value FROM tablecast.windows('per_minute', 'u10')")
        assert [r[0]["n"] for r in cur.fetchall()] == [0, 1, 2, 3]
        with pytest.raises(errors.FeatureNotSupported):
            cur.execute("SELECT * FROM per_minute WHERE key = 'u1'")
    # its rows are a key's windows: HTTP refuses to read it by key, range or batch alike
    for method, path, body in (
        ("GET", "/v1/tables/per_minute/keys/u1", None),
        ("GET", "/v1/tables/per_minute/range", None),
        ("POST", "/v1/tables/per_minute/keys:batchGet", {"keys": ["u1"]}),
    ):
        r = httpx.request(method, node.url + path, json=body, timeout=10)
        assert r.status_code == 400 and "window table" in r.text, (path, r.text)


def _subscribe(conn: psycopg.Connection, kv: Any, bootstrap: str) -> None:
    """The live form: a snapshot, then each change, as COPY rows, until cancelled."""
    rows: list[tuple[Any, ...]] = []

    def change_then_cancel() -> None:
        eventually(lambda: len(rows) >= 2, timeout=20)
        kv.write(bootstrap, [("k119", {"i": 119, "name": "changed"})])
        eventually(lambda: any(r[0] == "change" for r in rows), timeout=20)
        conn.cancel()

    writer = threading.Thread(target=change_then_cancel)
    writer.start()
    with conn.cursor() as cur:
        live = "COPY (SUBSCRIBE TO kv WHERE key = 'k119') TO STDOUT"
        with pytest.raises(errors.QueryCanceled), cur.copy(live) as copy:
            for row in copy.rows():
                rows.append(row)
        writer.join(30)
        assert [r[0] for r in rows[:2]] == ["snapshot", "ready"], rows
        assert orjson.loads(rows[0][2])["value"]["name"] == "n119"
        change = next(r for r in rows if r[0] == "change")
        assert orjson.loads(change[2])["value"] == {"i": 119, "name": "changed"}
        assert change[1].startswith("kv@"), change  # its resume position
        cur.execute("SELECT value->>'name' FROM kv WHERE key = 'k119'")
        assert cur.fetchall() == [("changed",)]
    # resumed from that position: no snapshot, the change made since first
    kv.write(bootstrap, [("k119", {"i": 119, "name": "again"})])
    resumed: list[tuple[Any, ...]] = []

    def cancel_after_a_change() -> None:
        eventually(lambda: any(r[0] == "change" for r in resumed), timeout=20)
        conn.cancel()

    canceller = threading.Thread(target=cancel_after_a_change)
    canceller.start()
    with conn.cursor() as cur:
        live = f"COPY (SUBSCRIBE TO kv WHERE key = 'k119' SINCE '{change[1]}') TO STDOUT"
        with pytest.raises(errors.QueryCanceled), cur.copy(live) as copy:
            for row in copy.rows():
                resumed.append(row)
        canceller.join(30)
    assert not any(r[0] == "snapshot" for r in resumed), resumed
    changes = [orjson.loads(r[2])["value"]["name"] for r in resumed if r[0] == "change"]
    assert changes[0] == "again", resumed


def _errors_leave_the_connection_usable(conn: psycopg.Connection) -> None:
    cases: list[tuple[str, type[Exception]]] = [
        ("SELECT * FROM missing", errors.UndefinedTable),
        ("INSERT INTO kv (key) VALUES ('x')", errors.ReadOnlySqlTransaction),
        ("DELETE FROM kv", errors.ReadOnlySqlTransaction),
        ("SELECT * FROM kv WHERE value->>'i' = '1'", errors.FeatureNotSupported),
        ("SELECT * FROM kv ORDER BY key DESC", errors.FeatureNotSupported),
        ("SELECT key FROM kv WHERE key LIKE '%x'", errors.FeatureNotSupported),
        ("SELEC key FROM kv", errors.SyntaxError),
        ("SELECT nothing FROM kv", errors.UndefinedColumn),
        (
            "SELECT (value->>'name')::int FROM kv WHERE key = 'k001'",
            errors.InvalidTextRepresentation,
        ),
        ("SET tablecast.max_lag = -1", errors.InvalidParameterValue),
        ("SET tablecast.max_staleness_ms = 'soon'", errors.InvalidParameterValue),
        ("SET tablecast.max_stale = 5", errors.UndefinedObject),  # tablecast's are known
        ("SET tablecast.after = 'not a token'", errors.InvalidParameterValue),
    ]
    # more keys than a batch takes, read as one batch or (naming offsets) key by key
    many = ", ".join(f"'m{i}'" for i in range(1001))
    for columns in ("key, value", '"offset"'):
        cases.append(
            (f"SELECT {columns} FROM kv WHERE key IN ({many})", errors.InvalidParameterValue)
        )
    with conn.cursor() as cur:
        for sql, error in cases:
            with pytest.raises(error):
                cur.execute(sql)
            cur.execute("SELECT 1")
            assert cur.fetchone() == (1,), sql


def _consistency_settings(conn: psycopg.Connection, node: NodeProcess) -> None:
    with conn.cursor() as cur:
        cur.execute("SELECT value FROM kv WHERE key = 'k001'")
        cur.execute("SHOW tablecast.position")
        (position,) = cur.fetchone()  # type: ignore[misc]
        assert position.startswith("kv@"), position
        # its lag and staleness, as the same read's answer headers over HTTP give them
        http = node.get("/v1/tables/kv/keys/k001").headers
        for name, header in (
            ("lag", "x-tablecast-lag"),
            ("staleness_ms", "x-tablecast-staleness-ms"),
        ):
            cur.execute(f"SHOW tablecast.{name}")
            assert cur.fetchone() == (http[header],), name
        # a read of an empty span reads no partition: it names no position, not the last one,
        # and no lag or staleness
        empty = "SELECT key FROM kv WHERE key >= 'k9' AND key < 'k1'"
        cur.execute(empty)
        assert _shown(cur) == ("", None, None)

        # a prepared read answered from the reply kept for its packet (of a key this node
        # answers itself) says what it said
        def active(k: str) -> str | None:
            return (_http(node, f"/v1/tables/kv/keys/{k}/metadata").get("active") or {}).get("url")

        # the two nodes may still be moving partitions between them: one comes to this node
        mine = eventually(lambda: next((k for k in KEYS if active(k) == node.url), None))
        for _ in range(2):
            cur.execute("SELECT value FROM kv WHERE key = %s", (mine,), prepare=True)
        said = _shown(cur)
        assert said[0].startswith("kv@") and said[1:] == ("0", "0"), said  # type: ignore[union-attr]
        kept = _kept_replies(node)
        cur.execute(empty)
        cur.execute("SELECT value FROM kv WHERE key = %s", (mine,), prepare=True)
        assert _kept_replies(node) == kept + 1
        assert _shown(cur) == said
        cur.execute(f"SET tablecast.after = '{position}'")  # SET takes no parameters
        cur.execute("SET tablecast.max_lag = 0")
        cur.execute("SELECT value->>'i' FROM kv WHERE key = 'k001'")
        assert cur.fetchall() == [("1",)]
        cur.execute("SHOW tablecast.max_lag")
        assert cur.fetchone() == ("0",)
        cur.execute("SET tablecast.max_staleness_ms = 60000")
        cur.execute("SELECT value->>'i' FROM kv WHERE key = 'k001'")
        assert cur.fetchall() == [("1",)]
        cur.execute("RESET tablecast.max_staleness_ms")
        # a statement under way, cancelled by the client (a CancelRequest on a connection
        # of its own), in the simple and the extended protocol
        for params in (None, (5,)):
            started = time.monotonic()
            threading.Timer(0.5, conn.cancel).start()
            with pytest.raises(errors.QueryCanceled):
                cur.execute(
                    "SELECT pg_sleep(5)" if params is None else "SELECT pg_sleep(%s)", params
                )
            assert time.monotonic() - started < 4
            cur.execute("SELECT 1")
            assert cur.fetchone() == (1,)
        cur.execute("SET tablecast.timeout_ms TO DEFAULT")
        cur.execute("RESET tablecast.after")
        cur.execute("SET tablecast.max_lag TO DEFAULT")
        cur.execute("SHOW tablecast.max_lag")
        assert cur.fetchone() == ("",)


def _shown(cur: psycopg.Cursor[Any]) -> tuple[str | None, ...]:
    """The session's SHOW of the last read's position, lag and staleness."""
    out = []
    for name in ("position", "lag", "staleness_ms"):
        cur.execute(f"SHOW tablecast.{name}")
        out.append(cur.fetchone()[0])  # type: ignore[index]
    return tuple(out)


def _kept_replies(node: NodeProcess) -> float:
    for line in node.get("/metrics").text.splitlines():
        if line.startswith("tablecast_sql_kept_replies_total "):
            return float(line.split()[1])
    return 0.0


def _run_psql(port: int, *args: str) -> subprocess.CompletedProcess[str]:
    """Debian's psql against the node, without a ~/.psqlrc (-X)."""
    conninfo = f"host=127.0.0.1 port={port} dbname=tablecast user=tester sslmode=disable"
    return subprocess.run(
        ["psql", conninfo, "-X", *args], capture_output=True, text=True, timeout=30
    )


def _psql(port: int, node: NodeProcess) -> None:
    """Debian's psql, with its own simple-query protocol and output."""
    done = _run_psql(
        port, "-A", "-t", "-F", "|", "-c",
        "SELECT key, value->>'name' FROM kv WHERE key IN ('k001', 'k002')",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["k001|n1", "k002|n2"]
    bad = _run_psql(port, "-c", "UPDATE kv SET value = '{}'")
    assert bad.returncode != 0 and "read-only" in bad.stderr
    # what psql users type first: the table list, the databases, and a table's columns
    listed = _run_psql(port, "-A", "-t", "-c", "\\dt")
    assert listed.returncode == 0, listed.stderr
    assert "public|kv|table|tablecast" in listed.stdout.splitlines(), listed.stdout
    roles = _run_psql(port, "-A", "-t", "-c", "\\du")
    assert roles.returncode == 0 and roles.stdout.split("|")[0] == "tablecast", roles
    databases = _run_psql(port, "-A", "-t", "-c", "\\l")
    assert databases.returncode == 0, databases.stderr
    assert [ln.split("|")[:3] for ln in databases.stdout.splitlines()] == [
        ["tablecast", "tablecast", "UTF8"]
    ], databases.stdout
    described = _run_psql(port, "-c", "\\d kv")
    assert described.returncode == 0, described.stderr
    assert 'Table "public.kv"' in described.stdout, described.stdout
    for column, kind in (("key", "text"), ("value", "jsonb"), ("timestamp", "timestamp with")):
        assert any(
            line.split("|")[0].strip() == column and kind in line
            for line in described.stdout.splitlines()
        ), described.stdout


async def _asyncpg(port: int, node: NodeProcess) -> None:
    """asyncpg: the extended protocol with binary results for every type it reads."""
    conn = await asyncpg.connect(host="127.0.0.1", port=port, user="tester", database="tablecast",
                                 ssl=False)  # fmt: skip
    try:
        read = await conn.prepare(
            "SELECT key, value, (value->>'i')::numeric, timestamp FROM kv WHERE key = $1"
        )
        for key in KEYS[:10]:
            row = await read.fetchrow(key)
            doc = _http(node, f"/v1/tables/kv/keys/{key}")
            assert row is not None and row[0] == key
            assert orjson.loads(row[1]) == doc["value"] and row[2] == Decimal(doc["value"]["i"])
            assert row[3] == dt.datetime.fromtimestamp(doc["timestamp"] / 1000, dt.UTC)
        assert await read.fetchrow("absent") is None
        count = await conn.fetchval("SELECT count(*) FROM nums")
        assert count == _http(node, "/v1/tables/nums/count")["count"]
        keys = [r["key"] for r in await conn.fetch("SELECT key FROM nums WHERE key > $1", 0)]
        assert keys == [k for k in (r["key"] for r in _all_http(node, "nums")) if k > 0]
        with pytest.raises(asyncpg.exceptions.UndefinedTableError):
            await conn.fetch("SELECT * FROM nothing")
        assert await conn.fetchval("SELECT 1") == 1
    finally:
        await conn.close()


def _jdbc(port: int, node: NodeProcess) -> None:
    """pgJDBC, server-prepared from the first execution (prepareThreshold=1)."""
    url = f"jdbc:postgresql://127.0.0.1:{port}/tablecast?sslmode=disable&prepareThreshold=1"
    point = "SELECT key, value->>'name', value FROM kv WHERE key = ?"
    answers = pgjdbc.run(
        url,
        [
            *((point, k) for k in KEYS[:5]),
            (point, "absent"),
            ("SELECT count(*) FROM kv",),
            ("SELECT key FROM nums WHERE key >= ? ORDER BY key", "long:0"),
            ("SELECT * FROM missing",),
            ("UPDATE kv SET value = '{}'",),
            ("SELECT key FROM kv WHERE key LIKE 'k00%' LIMIT 3",),
        ],
    )
    for key, answer in zip(KEYS[:5], answers, strict=False):
        doc = _http(node, f"/v1/tables/kv/keys/{key}")
        assert answer["rows"] == [[key, doc["value"]["name"], orjson.dumps(doc["value"]).decode()]]
        assert answer["columns"] == ["key", "?column?", "value"]
    assert answers[5]["rows"] == []
    assert answers[6]["rows"] == [[str(_http(node, "/v1/tables/kv/count")["count"])]]
    http = [str(r["key"]) for r in _all_http(node, "nums") if r["key"] >= 0]
    assert [r[0] for r in answers[7]["rows"]] == http
    assert answers[8]["error"] == "42P01" and answers[9]["error"] == "25006"
    assert answers[10]["rows"] == [["k000"], ["k001"], ["k002"]]
    # DatabaseMetaData, as DBeaver, Metabase and the like list tables and columns
    tables, columns, pk = pgjdbc.run(url, [("META tables",), ("META columns kv",), ("META pk kv",)])
    assert tables == {"rows": [["kv"], ["nums"], ["people"]]}, tables
    assert "rows" in columns, columns
    assert columns["rows"] == [
        ["key", "text"], ["value", "jsonb"], ["partition", "int4"], ["offset", "int8"],
        ["timestamp", "timestamptz"],
    ], columns  # fmt: skip
    assert pk == {"rows": [["key"]]}, pk  # the key is each table's primary key


def _node_pg(port: int, node: NodeProcess) -> None:
    """node-postgres: text results parsed by its own type parsers, a named prepared query."""
    dsn = f"postgresql://node@127.0.0.1:{port}/tablecast?sslmode=disable"
    point = "SELECT key, value, (value->>'i')::int AS i FROM kv WHERE key = $1"
    answers = node_pg.run(
        dsn,
        [
            *({"sql": point, "params": [k], "name": "point"} for k in KEYS[:5]),
            {"sql": "SELECT count(*) AS n FROM nums"},
            {"sql": "SELECT key FROM nums WHERE key IN (7, 42)"},
            {"sql": "DELETE FROM kv"},
        ],
    )
    for key, answer in zip(KEYS[:5], answers, strict=False):
        doc = _http(node, f"/v1/tables/kv/keys/{key}")
        assert answer["rows"] == [{"key": key, "value": doc["value"], "i": doc["value"]["i"]}]
    # node-postgres gives a bigint as a string: JavaScript's numbers are doubles
    assert answers[5]["rows"] == [{"n": str(_http(node, "/v1/tables/nums/count")["count"])}]
    assert answers[6]["rows"] == [{"key": "7"}, {"key": "42"}]
    assert answers[7]["error"] == "25006"


def test_sql_over_tls_with_a_jwt(bootstrap: str, unique: str, logs: Path, tmp_path: Path) -> None:
    ca, cert, key = certificate_files(tmp_path, ["127.0.0.1"])
    kv = make_table(bootstrap, unique, "kv", 2, serde.string(), serde.json())
    kv.write(bootstrap, [("a", {"n": 1})])
    pg_port = free_port()
    node = start_node(unique, bootstrap, logs, "--pg-port", str(pg_port), "--tls-cert", cert,
                      "--tls-key", key, "--auth-jwt-secret", SECRET)  # fmt: skip
    node.verify = ssl.create_default_context(cafile=ca)
    try:
        node.wait_ready()
        base = f"host=127.0.0.1 port={pg_port} dbname=tablecast user=tester"
        verified = f"{base} sslmode=verify-full sslrootcert={ca}"
        with psycopg.connect(f"{verified} password={token()}", autocommit=True) as conn:
            assert conn.info.pgconn.ssl_in_use
            rows = conn.execute("SELECT key, value FROM kv WHERE key = 'a'").fetchall()
            assert rows == [("a", {"n": 1})]
        with pytest.raises(psycopg.OperationalError, match="token was refused"):
            psycopg.connect(f"{verified} password=not-a-jwt")
        with pytest.raises(psycopg.OperationalError, match="only over TLS"):
            psycopg.connect(f"{base} sslmode=disable password={token()}")
    finally:
        stop_all([node])


def _kept_replies(node: NodeProcess) -> float:
    for line in node.get("/metrics").text.splitlines():
        if line.startswith("tablecast_sql_kept_replies_total "):
            return float(line.split()[1])
    raise AssertionError("no tablecast_sql_kept_replies_total")


def test_a_prepared_read_sent_again_gets_the_read_path_s_answer(
    bootstrap: str, unique: str, logs: Path
) -> None:
    """A prepared one-key SELECT whose packet comes again byte for byte is answered with the
    reply kept for it, and never with one the read path would not give: after a write or a
    delete of the key, on a connection whose statement of the same name is other SQL, or
    with a read setting (not kept then)."""
    kv = make_table(bootstrap, unique, "kv", 2, serde.string(), serde.json())
    kv.write(bootstrap, [("a", {"v": 0}), ("b", {"v": 0})])
    pg_port = free_port()
    node = start_node(unique, bootstrap, logs, "--pg-port", str(pg_port))
    dsn = f"host=127.0.0.1 port={pg_port} dbname=tablecast user=tester sslmode=disable"
    value = "SELECT value FROM kv WHERE key = %s"

    def read(conn: psycopg.Connection, sql: str, key: str) -> list[Any]:
        return conn.execute(sql, (key,), prepare=True).fetchall()  # type: ignore[arg-type]

    try:
        node.wait_ready()
        node.wait_caught_up(bootstrap, "kv", kv.info.topic)
        with (
            psycopg.connect(dsn, autocommit=True) as one,
            psycopg.connect(dsn, autocommit=True) as two,
        ):
            before = _kept_replies(node)
            for _ in range(4):
                assert read(one, value, "a") == [({"v": 0},)]
            assert _kept_replies(node) >= before + 2  # the first kept it (once prepared)
            # the same statement name on another connection, other SQL: the same packet bytes
            for _ in range(3):
                assert read(two, "SELECT key FROM kv WHERE key = %s", "a") == [("a",)]
            kv.write(bootstrap, [("a", {"v": 1})])
            eventually(lambda: read(one, value, "a") == [({"v": 1},)], 30)
            assert read(one, value, "a") == [({"v": 1},)]
            kv.write(bootstrap, [("a", None)])
            eventually(lambda: read(one, value, "a") == [], 30)
            assert read(one, value, "b") == [({"v": 0},)]
            one.execute("SET tablecast.max_lag = 5")
            hits = _kept_replies(node)
            for _ in range(3):
                assert read(one, value, "b") == [({"v": 0},)]
            assert _kept_replies(node) == hits
            one.execute("RESET tablecast.max_lag")
            assert one.execute("SHOW tablecast.position").fetchone() is not None
    finally:
        stop_all([node])


def test_fuzzed_protocol_traffic_never_breaks_the_node(
    bootstrap: str, unique: str, logs: Path
) -> None:
    kv = make_table(bootstrap, unique, "kv", 2, serde.string(), serde.json())
    kv.write(bootstrap, [("a", {"n": 1})])
    pg_port = free_port()
    node = start_node(unique, bootstrap, logs, "--pg-port", str(pg_port))
    try:
        node.wait_ready()
        report = asyncio.run(pg_fuzz.fuzz("127.0.0.1", pg_port, FUZZ_CASES, seed=53))
        assert report.problems == [], report.problems[:5]
        assert report.cases == FUZZ_CASES and report.answered > FUZZ_CASES / 2
        assert node.proc.poll() is None
        dsn = f"host=127.0.0.1 port={pg_port} dbname=tablecast user=tester sslmode=disable"
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert conn.execute("SELECT value FROM kv WHERE key = 'a'").fetchall() == [({"n": 1},)]
    finally:
        stop_all([node])
