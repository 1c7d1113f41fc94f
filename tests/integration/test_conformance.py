"""One table of cases, run against every front end a node has.

A node's rules (who may read what, what a caller may cost it, what input it refuses) are
applied by each front end in turn: HTTP/1.1 on the loop engine and on granian, HTTP/2
(granian), gRPC, SQL over the PostgreSQL protocol, the watch over SSE and WebSocket, the
console's API and the read processes of ``serve --processes``. Each case below states one
rule once and names the front ends it is run on; a front end added later joins
:data:`FRONT_ENDS` and every case that applies to it. The nodes are shared: one secured
cluster (tokens, a policy, the cluster secret, a rate limit, a cap on each caller's open
watches) of two nodes, one node of each engine, so that every front end also answers keys
it does not own (forwarded reads); a table of its own takes the cases that change its
catalog entry or flood one of its keys with changes. Cases that need other settings (no
auth, an identity provider that never answers) share two more clusters.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote, urlencode

import asyncpg
import grpc
import h2.config
import h2.connection
import h2.events
import httpx
import jwt
import orjson
import pytest
from confluent_kafka import Producer

from tablecast import serde
from tablecast.cluster.assignment import assign
from tablecast.contract import positions
from tablecast.grpc.service import TablesStub
from tablecast.kafka import catalog
from tablecast.kafka.broker import free_port
from tablecast.kafka.topics import STATUS_CONFIG, dlq_topic, ensure_topic, status_topic
from tablecast.proto import tables_pb2 as pb
from tablecast.query.auth import JWKS_TIMEOUT_S

from ..support.procs import NodeProcess, eventually, start_node, stop_all, tls
from ..support.sse import Stream, read_to_end
from ..support.ws import WebSocket
from .tables import TableModel, make_table

pytestmark = pytest.mark.integration

JWT_SECRET = "conformance-tests-jwt-secret-0123456789abcdef"
CLUSTER_SECRET = "conformance-tests-cluster-secret-0123456789"
POLICY = """
rules:
  - tables: {kv: {key_prefix: "{user}/"}}
  - match: {role: admin}
    tables: {"*": "*"}
  - match: {role: auditor}
    tables: {"*": {key_prefix: "{user}/"}}
"""
#: requests per second per caller: high enough for the cases, low enough to reach
RATE = 200
#: watches one caller may hold open on a node (``serve --max-watches``): the other cases hold
#: at most two per caller
MAX_WATCHES = 4
PARTITIONS = 4
#: what a node may grow by while one client pipelines 10 MB of GETs and reads nothing
MAX_GROWTH_BYTES = 64 << 20
#: requests a flooding client keeps in flight, and how many of them HTTP/1.1 sends at once
#: on one connection
FLOOD_AT_ONCE = 64
PIPELINED = 8


def bearer(sub: str, ttl: float = 86_400, secret: str = JWT_SECRET, **claims: Any) -> str:
    return jwt.encode(
        {"exp": int(time.time() + ttl), "sub": sub, **claims}, secret, algorithm="HS256"
    )


def alice(case: str) -> str:
    """A token that reads alice's rows, its subject of its own: one case's spending of the
    rate limit (per subject) never answers another's."""
    return bearer(f"alice-{case}", user="alice")


ADMIN = bearer("root", role="admin")


@dataclass(frozen=True)
class Outcome:
    """What a front end made of a request: "ok" and the value, or the error's code."""

    code: str
    value: Any = None


@dataclass
class Cluster:
    nodes: dict[str, NodeProcess]
    grpc: dict[str, str]
    #: node -> its PostgreSQL port
    pg: dict[str, int]
    kv: TableModel
    big: TableModel
    #: the cases' own table: its catalog entry is changed, and one key of it floods
    live: TableModel
    app: str


# -- the front ends ---------------------------------------------------------------------


class Http:
    """A point read over HTTP; `http2` for granian's HTTP/2 (prior knowledge, no TLS)."""

    def __init__(self, name: str, node: str, http2: bool = False) -> None:
        self.name, self.node, self.http2 = name, node, http2

    def url(self, cluster: Cluster) -> str:
        return cluster.nodes[self.node].url

    def request(
        self,
        cluster: Cluster,
        method: str,
        path: str,
        token: str | None = None,
        headers: dict[str, str] | None = None,
        **kw: Any,
    ) -> httpx.Response:
        sent = dict(headers or {})
        if token is not None:
            sent["authorization"] = f"Bearer {token}"
        # a new connection each time: with read processes, the kernel spreads them
        with httpx.Client(http1=not self.http2, http2=self.http2, timeout=15, verify=tls()) as http:
            return http.request(method, self.url(cluster) + path, headers=sent, **kw)

    def get(
        self,
        cluster: Cluster,
        table: str,
        key: str,
        token: str | None,
        headers: dict[str, str] | None = None,
    ) -> Outcome:
        r = self.request(
            cluster, "GET", f"/v1/tables/{quote(table, safe='')}/keys/{quote(key, safe='')}",
            token, headers,
        )  # fmt: skip
        if self.http2:
            assert r.http_version == "HTTP/2", r.http_version
        return _outcome(r)

    async def flood(
        self, cluster: Cluster, keys: list[str], token: str, stop: threading.Event, codes: list[str]
    ) -> None:
        """GETs of kv's `keys` in turn as fast as the node answers, until `stop`: each
        outcome's code to `codes`. HTTP/1.1: PIPELINED at a time on each of as many
        connections as make FLOOD_AT_ONCE (pipelined heads cost the client next to nothing);
        HTTP/2: FLOOD_AT_ONCE streams of one connection."""
        paths = [f"/v1/tables/kv/keys/{quote(k, safe='')}" for k in keys]
        if not self.http2:
            heads = [
                f"GET {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\n\r\n".encode()
                for path in paths
            ]
            host, port = self.url(cluster).split("://")[1].split(":")
            await asyncio.gather(
                *(
                    _pipelined(host, int(port), heads, stop, codes)
                    for _ in range(FLOOD_AT_ONCE // PIPELINED)
                )
            )
            return
        host, port = self.url(cluster).split("://")[1].split(":")
        await _h2_streams(host, int(port), paths, token, stop, codes)


async def _h2_streams(
    host: str, port: int, paths: list[str], token: str, stop: threading.Event, codes: list[str]
) -> None:
    """GETs of `paths` in turn as FLOOD_AT_ONCE streams of one HTTP/2 connection (prior
    knowledge), sent together and then awaited, until `stop`: each answer's code to `codes`.
    The h2 state machine costs the client far less than a full HTTP client, so the flood
    outpaces the limit even on a busy machine."""
    reader, writer = await asyncio.open_connection(host, port)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    writer.write(conn.data_to_send())
    answers: dict[int, tuple[int, bytearray]] = {}
    i = 0
    try:
        while not stop.is_set():
            at_once = min(FLOOD_AT_ONCE, conn.remote_settings.max_concurrent_streams)
            for _ in range(at_once):
                stream = conn.get_next_available_stream_id()
                answers[stream] = (0, bytearray())
                path = paths[i % len(paths)]
                i += 1
                conn.send_headers(
                    stream,
                    [(":method", "GET"), (":scheme", "http"), (":authority", host),
                     (":path", path), ("authorization", f"Bearer {token}")],
                    end_stream=True,
                )  # fmt: skip
            writer.write(conn.data_to_send())
            while answers:
                data = await reader.read(65536)
                assert data, "the server closed the connection"
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.ResponseReceived):
                        status = int(dict(event.headers)[b":status"])
                        answers[event.stream_id] = (status, answers[event.stream_id][1])
                    elif isinstance(event, h2.events.DataReceived):
                        answers[event.stream_id][1].extend(event.data)
                        conn.acknowledge_received_data(
                            event.flow_controlled_length, event.stream_id
                        )
                    elif isinstance(event, h2.events.StreamEnded):
                        status, body = answers.pop(event.stream_id)
                        codes.append("ok" if status == 200 else orjson.loads(body)["error"]["code"])
                    elif isinstance(event, h2.events.StreamReset):
                        raise AssertionError(f"stream {event.stream_id} reset: {event}")
                writer.write(conn.data_to_send())
    finally:
        writer.close()


async def _pipelined(
    host: str, port: int, heads: list[bytes], stop: threading.Event, codes: list[str]
) -> None:
    """`heads` in turn on one connection, PIPELINED sent before their answers are read, until
    `stop`: each answer's code ("ok" or its error's) to `codes`."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        i = 0
        while not stop.is_set():
            writer.write(b"".join(heads[(i + j) % len(heads)] for j in range(PIPELINED)))
            i += PIPELINED
            for _ in range(PIPELINED):
                status = int((await reader.readline()).split()[1])
                length = None
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                assert length is not None, "an answer without a content-length"
                body = await reader.readexactly(length)
                codes.append("ok" if status == 200 else orjson.loads(body)["error"]["code"])
    finally:
        writer.close()


class Grpc:
    def __init__(self, name: str, node: str) -> None:
        self.name, self.node = name, node

    def get(
        self,
        cluster: Cluster,
        table: str,
        key: str,
        token: str | None,
        headers: dict[str, str] | None = None,
    ) -> Outcome:
        metadata = [(k, v) for k, v in (headers or {}).items()]
        if token is not None:
            metadata.append(("authorization", f"Bearer {token}"))

        async def call() -> Outcome:
            async with grpc.aio.insecure_channel(cluster.grpc[self.node]) as channel:
                try:
                    got = await TablesStub(channel).Get(
                        pb.GetRequest(table=table, key=key), metadata=tuple(metadata), timeout=15
                    )
                except grpc.aio.AioRpcError as e:
                    return Outcome(_grpc_code(e))
            if not got.found:
                return Outcome("key_not_found")
            return Outcome("ok", orjson.loads(got.row.value))

        return asyncio.run(call())

    async def flood(
        self, cluster: Cluster, keys: list[str], token: str, stop: threading.Event, codes: list[str]
    ) -> None:
        """Gets of kv's `keys` in turn, FLOOD_AT_ONCE at a time on one channel, until `stop`:
        each outcome's code to `codes`."""
        metadata = (("authorization", f"Bearer {token}"),)
        async with grpc.aio.insecure_channel(cluster.grpc[self.node]) as channel:
            stub = TablesStub(channel)

            async def reader(i: int) -> None:
                while not stop.is_set():
                    request = pb.GetRequest(table="kv", key=keys[i % len(keys)])
                    try:
                        await stub.Get(request, metadata=metadata, timeout=15)
                        codes.append("ok")
                    except grpc.aio.AioRpcError as e:
                        codes.append(_grpc_code(e))
                    i += FLOOD_AT_ONCE

            await asyncio.gather(*(reader(i) for i in range(FLOOD_AT_ONCE)))


#: the read core's error codes by the SQLSTATEs the PostgreSQL front end answers them with
SQL_CODES = {
    "28000": "unauthorized",
    "28P01": "unauthorized",
    "42501": "forbidden",
    "42P01": "table_not_found",
    "53400": "rate_limited",
    "22023": "bad_request",
    "54000": "bad_request",
}


class Sql:
    """Reads as SELECTs over the PostgreSQL protocol (asyncpg, which says each error's
    SQLSTATE, a refused startup's too), the token as the password; a connection per read,
    as the token is checked at startup (and again by each statement)."""

    def __init__(self, name: str, node: str) -> None:
        self.name, self.node = name, node

    async def _connect(self, cluster: Cluster, token: str | None) -> asyncpg.Connection:
        return await asyncpg.connect(
            host="127.0.0.1", port=cluster.pg[self.node], database="tablecast",
            user="conformance", password=token, ssl=False, timeout=15,
        )  # fmt: skip

    def get(
        self,
        cluster: Cluster,
        table: str,
        key: str,
        token: str | None,
        headers: dict[str, str] | None = None,
    ) -> Outcome:
        # a read's bound is a session setting in SQL
        settings = {"x-tablecast-after": "tablecast.after"}
        assert set(headers or ()) <= set(settings), "a SQL read has no other headers"

        async def call() -> Outcome:
            try:
                conn = await self._connect(cluster, token)
                try:
                    for name, value in (headers or {}).items():
                        await conn.execute(f"SET {settings[name]} = '{value}'")
                    quoted = '"' + table.replace('"', '""') + '"'
                    rows = await conn.fetch(f"SELECT value FROM {quoted} WHERE key = $1", key)
                finally:
                    await conn.close()
            except asyncpg.PostgresError as e:
                return Outcome(SQL_CODES.get(e.sqlstate, f"sql:{e.sqlstate}:{str(e)[:200]}"))
            except asyncpg.InterfaceError as e:  # the node asked for a password; none given
                assert token is None and "password" in str(e), e
                return Outcome("unauthorized")
            return Outcome("ok", orjson.loads(rows[0][0])) if rows else Outcome("key_not_found")

        return asyncio.run(call())

    async def flood(
        self, cluster: Cluster, keys: list[str], token: str, stop: threading.Event, codes: list[str]
    ) -> None:
        """SELECTs of kv's `keys` in turn on FLOOD_AT_ONCE connections, until `stop`."""

        async def reader(i: int) -> None:
            conn = await self._connect(cluster, token)
            try:
                while not stop.is_set():
                    try:
                        await conn.fetch("SELECT value FROM kv WHERE key = $1", keys[i % len(keys)])
                        codes.append("ok")
                    except asyncpg.PostgresError as e:
                        codes.append(SQL_CODES.get(e.sqlstate, f"sql:{e.sqlstate}"))
                    i += FLOOD_AT_ONCE
            finally:
                await conn.close()

        await asyncio.gather(*(reader(i) for i in range(FLOOD_AT_ONCE)))


def _grpc_code(e: grpc.aio.AioRpcError) -> str:
    code = dict(e.trailing_metadata() or ()).get("tablecast-error")
    return str(code) if code else f"grpc:{e.code().name}"


def _outcome(r: httpx.Response) -> Outcome:
    if r.status_code == 200:
        return Outcome("ok", r.json().get("value"))
    try:
        return Outcome(r.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return Outcome(f"http:{r.status_code}:no error JSON")


#: point reads: every front end that answers GET of a key
READS = {
    "http1-loop": Http("http1-loop", "loop"),
    "read-processes": Http("read-processes", "loop"),
    "http1-granian": Http("http1-granian", "granian"),
    "http2-granian": Http("http2-granian", "granian", http2=True),
    "grpc": Grpc("grpc", "loop"),
    "sql": Sql("sql", "loop"),
}
#: the engines of HTTP requests of any route (the console's API among them)
HTTP = {name: f for name, f in READS.items() if isinstance(f, Http)}
#: every front end, for the record of what each case covers
FRONT_ENDS = [*READS, "sse-loop", "sse-granian", "websocket", "grpc-watch", "console"]


# -- the cluster -------------------------------------------------------------------------


#: the secured cluster's tables
TABLES = ("kv", "big", "live")


def _sharing_ports() -> tuple[int, int]:
    """Ports for the two nodes such that each holds the active replicas of part of every
    table: a node is named by its address, and the names rank the nodes per partition
    (rendezvous hashing), so some pairs of names give one node the whole of a table. The
    cases need both kinds of key on each node: read where it lands, and forwarded."""
    slots = [(t, p) for t in TABLES for p in range(PARTITIONS)]
    while True:
        ports = free_port(), free_port()
        names = [f"127.0.0.1:{p}" for p in ports]
        actives = {slot: held[0] for slot, held in assign(names, slots, 0).items()}
        if ports[0] != ports[1] and all(
            0 < sum(actives[(t, p)] == names[0] for p in range(PARTITIONS)) < PARTITIONS
            for t in TABLES
        ):
            return ports


@pytest.fixture(scope="module")
def cluster(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    app = f"conf{time.monotonic_ns() % 10**8}"
    tmp = tmp_path_factory.mktemp("conformance")
    policy = tmp / "policy.yaml"
    policy.write_text(POLICY)
    kv = make_table(bootstrap, app, "kv", PARTITIONS, serde.string(), serde.json())
    rows: list[tuple[str, Any]] = [
        (f"{u}/{i:02d}", {"u": u, "i": i}) for u in ("alice", "bob") for i in range(16)
    ]
    rows += [("alice/odd", {"plain": True}), ("alice/odd/metadata", {"slash": True})]
    kv.write(bootstrap, rows)
    big = make_table(bootstrap, app, "big", PARTITIONS, serde.string(), serde.json())
    big.write(bootstrap, [(f"b{i:03d}", "v" * 1000) for i in range(64)])
    live = make_table(bootstrap, app, "live", PARTITIONS, serde.string(), serde.json())
    live.write(bootstrap, [(f"k{i:02d}", {"n": i}) for i in range(24)])
    common = (
        "--auth-jwt-secret", JWT_SECRET, "--auth-policy", str(policy),
        "--cluster-secret", CLUSTER_SECRET, "--rate-limit", str(RATE),
        "--max-watches", str(MAX_WATCHES),
    )  # fmt: skip
    grpc_port, pg_port = free_port(), free_port()
    loop_port, granian_port = _sharing_ports()
    nodes = {
        "loop": start_node(
            app, bootstrap, tmp, *common, "--grpc-port", str(grpc_port), "--processes", "2",
            "--pg-port", str(pg_port), "--pg-allow-cleartext", port=loop_port,
        ),
        "granian": start_node(
            app, bootstrap, tmp, *common, "--http-engine", "granian", port=granian_port
        ),
    }  # fmt: skip
    try:
        for node in nodes.values():
            node.headers = {"authorization": f"Bearer {ADMIN}"}
            node.wait_ready()

        def settled() -> bool:  # each node holds part of every table, and both answer for all
            views = [n.get("/v1/cluster").json()["nodes"] for n in nodes.values()]
            holders = {
                (r["table"], n["id"])
                for n in views[0]
                for r in n["replicas"]
                if r["role"] == "active"
            }
            return (
                all(len(v) == 2 for v in views)
                and all((t, n["id"]) in holders for t in TABLES for n in views[0])
                and all(
                    n.get(f"/v1/tables/{t}/count").status_code == 200
                    for n in nodes.values()
                    for t in TABLES
                )
            )

        eventually(settled, timeout=90)
        for node in nodes.values():
            node.wait_caught_up(bootstrap, "kv", kv.info.topic)
            node.wait_caught_up(bootstrap, "big", big.info.topic)
            node.wait_caught_up(bootstrap, "live", live.info.topic)
        yield Cluster(
            nodes, {"loop": f"127.0.0.1:{grpc_port}"}, {"loop": pg_port}, kv, big, live, app
        )
    finally:
        stop_all(nodes.values())


# -- the cases ---------------------------------------------------------------------------


@pytest.mark.parametrize("front", READS)
def test_grants_hold_on_every_front_end(cluster: Cluster, front: str) -> None:
    f = READS[front]
    token = alice(f"grants-{front}")
    for i in range(16):  # keys of every partition: some read here, some forwarded
        assert f.get(cluster, "kv", f"alice/{i:02d}", token) == Outcome(
            "ok", {"u": "alice", "i": i}
        ), i
        assert f.get(cluster, "kv", f"bob/{i:02d}", token) == Outcome("forbidden"), i
    assert f.get(cluster, "big", "b001", token) == Outcome("forbidden")
    assert f.get(cluster, "missing", "x", token) == Outcome("forbidden")  # nothing tells it
    assert f.get(cluster, "kv", "alice/nope", token) == Outcome("key_not_found")


def test_sql_catalogs_list_only_the_tables_a_token_may_read(cluster: Cluster) -> None:
    """What HTTP's 403-before-lookup keeps, the catalogs keep too: psql's \\dt, JDBC's
    getTables and information_schema show a token the tables it may read some of."""

    async def names(token: str) -> list[str]:
        conn = await Sql("sql", "loop")._connect(cluster, token)
        try:
            rows = await conn.fetch(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = 'public' ORDER BY table_name"
            )
            listed = await conn.fetch(
                "SELECT c.relname FROM pg_catalog.pg_class c "
                "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = 'public' AND c.relkind = 'r' ORDER BY 1"
            )
            assert [r[0] for r in listed] == [r[0] for r in rows]
            return [r[0] for r in rows]
        finally:
            await conn.close()

    assert asyncio.run(names(alice("sql-catalogs"))) == ["kv"]
    assert asyncio.run(names(ADMIN)) == sorted(TABLES)


def test_sql_reads_of_keys_refuse_a_key_outside_the_grants(cluster: Cluster) -> None:
    """A key outside the grants named among others is refused as a read of it alone is
    (42501, HTTP's 403), whether the keys are read as one batch or one by one: never a
    row quietly left out."""

    async def codes(token: str) -> list[str | None]:
        conn = await Sql("sql", "loop")._connect(cluster, token)
        out: list[str | None] = []
        try:
            for columns in ("key, value", "*"):
                for keys in ("'alice/01', 'bob/01'", "'alice/01', 'alice/02'", "'bob/01'"):
                    try:
                        await conn.fetch(f"SELECT {columns} FROM kv WHERE key IN ({keys})")
                        out.append(None)
                    except asyncpg.PostgresError as e:
                        out.append(e.sqlstate)
        finally:
            await conn.close()
        return out

    assert asyncio.run(codes(alice("sql-in"))) == ["42501", None, "42501"] * 2
    assert asyncio.run(codes(ADMIN)) == [None] * 6


BAD_TOKENS = {
    "none": None,
    "another issuer's signature": bearer("alice", secret="not-the-nodes-secret-0123456789abcdef"),
    "expired": bearer("alice", ttl=-60),
    "garbage": "not-a-jwt",
}


@pytest.mark.parametrize("front", READS)
def test_bad_and_made_up_tokens_are_refused(cluster: Cluster, front: str) -> None:
    f = READS[front]
    for what, token in BAD_TOKENS.items():
        assert f.get(cluster, "kv", "alice/01", token) == Outcome("unauthorized"), what


@pytest.mark.parametrize("front", HTTP)
def test_the_console_api_refuses_bad_tokens(cluster: Cluster, front: str) -> None:
    f = HTTP[front]
    for what, token in BAD_TOKENS.items():
        r = f.request(cluster, "GET", "/ui/api/nodes", token)
        assert _outcome(r) == Outcome("unauthorized"), what
    assert f.request(cluster, "GET", "/ui/api/nodes", ADMIN).status_code == 200


def _pipeline_wrote(bootstrap: str, app: str, letter_key: str, query: str) -> None:
    """A dead letter (a record of `letter_key` the pipeline could not take) and a progress
    point of `query`, as the pipeline writes them."""
    ensure_topic(bootstrap, dlq_topic(app), 1)
    ensure_topic(bootstrap, status_topic(app), 1, STATUS_CONFIG)
    p = Producer({"bootstrap.servers": bootstrap})
    p.produce(
        dlq_topic(app), key=letter_key.encode(), value=b"{not json",
        headers=[("tablecast.error", b"bad value: not JSON"), ("tablecast.source.topic", b"in")],
    )  # fmt: skip
    point = {"query": query, "batch": 1, "timestamp": int(time.time() * 1000), "input_rows": 1}
    p.produce(status_topic(app), key=query.encode(), value=orjson.dumps(point))
    assert p.flush(30) == 0


@pytest.mark.parametrize("front", HTTP)
def test_the_console_api_shows_input_records_only_to_a_grant_of_everything(
    cluster: Cluster, bootstrap: str, front: str
) -> None:
    """The pipeline's progress and dead letters show input records, of any table and key: a
    token granted every row of every table reads them; one granted some rows (alice's of one
    table, or of every table) is refused, as /v1 refuses what it may not read, and nothing
    of them is in the refusal. The nodes' details hold no table data: any token reads them."""
    f = HTTP[front]
    letter_key, query = f"bob/letter-{front}", f"query-{front}"
    _pipeline_wrote(bootstrap, cluster.app, letter_key, query)

    def everything_shown() -> bool:
        letters = f.request(cluster, "GET", "/ui/api/deadletters", ADMIN)
        progress = f.request(cluster, "GET", "/ui/api/pipeline", ADMIN)
        assert letters.status_code == progress.status_code == 200, (letters.text, progress.text)
        keys = [item["key"] for item in letters.json()["items"]]
        return letter_key in keys and query in progress.json()["queries"]

    eventually(everything_shown, timeout=30)
    for who, token in [
        ("alice", alice(f"console-{front}")),
        ("every table, alice's rows", bearer(f"auditor-{front}", role="auditor", user="alice")),
    ]:
        for route in ("/ui/api/deadletters", "/ui/api/pipeline"):
            r = f.request(cluster, "GET", route, token)
            assert _outcome(r) == Outcome("forbidden"), (who, route, r.text)
            assert letter_key not in r.text and query not in r.text, (who, route)
        for route in ("/ui/api/node", "/ui/api/nodes"):
            r = f.request(cluster, "GET", route, token)
            assert r.status_code == 200, (who, route, r.text)


@pytest.mark.parametrize("front", [name for name in READS if name != "sql"])
def test_a_client_set_hop_header_is_never_taken_for_a_peer(cluster: Cluster, front: str) -> None:
    """A hop is answered where it lands, from whatever replica is there: a client that could
    mark its reads as hops would pick stale standbys or make a node refuse them. An unsigned
    hop is refused (gRPC has no hops at all: its metadata never carries one; SQL has no
    headers to carry one)."""
    f = READS[front]
    token = alice(f"hop-{front}")
    for i in range(8):
        got = f.get(cluster, "kv", f"alice/{i:02d}", token, {"x-tablecast-hop": "1"})
        assert got == Outcome("forbidden"), i


@pytest.mark.parametrize("front", READS)
def test_malformed_reads_are_4xx_with_the_error_json(cluster: Cluster, front: str) -> None:
    f = READS[front]
    token = alice(f"malformed-{front}")
    long_key = "alice/" + "x" * 20_000
    assert f.get(cluster, "kv", long_key, token).code in ("bad_request", "key_not_found")
    # PostgreSQL's text holds no NUL: a SQL client refuses to send one
    odd = "alice/\x7f\u2028" if isinstance(f, Sql) else "alice/\x00\x7f\u2028"
    assert f.get(cluster, "kv", odd, token).code in ("bad_request", "key_not_found")
    if isinstance(f, Http):
        r = f.request(cluster, "GET", "/v1/tables/kv/keys/alice%2F%FF%FE", token)
        assert _outcome(r).code in ("bad_request", "key_not_found"), r.text
        for path in (
            "/v1/tables/kv/range?limit=0",
            "/v1/tables/kv/range?cursor=forged.sig",
            "/v1/tables/kv/keys/alice%2F01?max_lag=x",
            "/v1/tables/kv/keys/alice%2F01?unknown=1",
            "/v1/tables/kv/keys/alice%2F01/history?cursor=AAAA",
        ):
            r = f.request(cluster, "GET", path, token)
            assert 400 <= r.status_code < 500 and _outcome(r).code == "bad_request", (path, r.text)
        r = f.request(cluster, "POST", "/v1/tables/kv/keys:batchGet", token, content=b"{")
        assert _outcome(r) == Outcome("bad_request")


@pytest.mark.parametrize("front", ["http1-loop", "read-processes", "grpc"])
def test_a_percent_encoded_slash_is_part_of_the_key(cluster: Cluster, front: str) -> None:
    """``alice%2Fodd%2Fmetadata`` is the key ``alice/odd/metadata``, not the metadata of
    ``alice/odd``. (granian hands the node a decoded path, in which the two cannot be told
    apart: on it, such keys are read with ``?key=``, which every engine takes.)"""
    f = READS[front]
    token = alice(f"slash-{front}")
    assert f.get(cluster, "kv", "alice/odd/metadata", token) == Outcome("ok", {"slash": True})
    assert f.get(cluster, "kv", "alice/odd", token) == Outcome("ok", {"plain": True})


@pytest.mark.parametrize("front", ["http1-granian", "http2-granian"])
def test_any_key_is_read_by_query_on_granian(cluster: Cluster, front: str) -> None:
    f = HTTP[front]
    r = f.request(
        cluster, "GET", "/v1/tables/kv/keys", alice(f"slash-{front}"),
        params={"key": "alice/odd/metadata"},
    )  # fmt: skip
    assert _outcome(r) == Outcome("ok", {"slash": True})


def _rss(pid: int) -> int:
    """The resident memory of a process and its children (a node's read processes), bytes."""
    total = 0
    pids = [pid]
    with contextlib.suppress(OSError):
        pids += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    for p in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total


def _local_key(cluster: Cluster, node: str) -> str:
    """A key of the big table the node owns (read there, not forwarded)."""
    n = cluster.nodes[node]
    for i in range(64):
        key = f"b{i:03d}"
        if n.get(f"/v1/tables/big/keys/{key}/metadata").json()["active"]["url"] == n.url:
            return key
    raise AssertionError("the node owns no key of the big table")


@pytest.mark.parametrize("front", ["http1-loop", "read-processes", "http1-granian"])
def test_a_client_that_never_reads_holds_the_node_to_a_bound(cluster: Cluster, front: str) -> None:
    """10 MB of pipelined GETs of 1 KB values, none of the answers read: the node (with its
    read processes) grows by less than MAX_GROWTH_BYTES and keeps answering others."""
    f = HTTP[front]
    node = cluster.nodes[f.node]
    request = (
        f"GET /v1/tables/big/keys/{_local_key(cluster, f.node)} HTTP/1.1\r\n"
        f"host: x\r\nauthorization: Bearer {bearer(f'flooder-{front}', role='admin')}\r\n\r\n"
    ).encode()
    flood = request * (10_000_000 // len(request))
    before = _rss(node.proc.pid)
    port = int(node.url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(5)
    sent = [0]

    def send() -> None:
        with contextlib.suppress(OSError):
            while sent[0] < len(flood):
                sent[0] += sock.send(flood[sent[0] : sent[0] + 65536])

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        most = before
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and sender.is_alive():
            most = max(most, _rss(node.proc.pid))
            time.sleep(0.2)
        most = max(most, _rss(node.proc.pid))
        started = time.monotonic()
        assert f.get(cluster, "big", "b000", ADMIN) == Outcome("ok", "v" * 1000)
        assert time.monotonic() - started < 5
        assert most - before < MAX_GROWTH_BYTES, (most - before, sent[0])
    finally:
        sock.close()
        sender.join(10)


def _sse(url: str, token: str | None, **params: Any) -> Stream:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return Stream(f"{url}/v1/tables/kv/watch", params=params, headers=headers).start()


def _watch_refused(cluster: Cluster, front: str, token: str | None, **params: Any) -> str:
    """The error code a watch is refused with on `front` ("ok" if it is not refused)."""
    if front.startswith("sse"):
        node = cluster.nodes["loop" if front == "sse-loop" else "granian"]
        stream = _sse(node.url, token, **params)
        eventually(lambda: stream.status is not None and (stream.status != 200 or stream.events))
        stream.stop()
        return "ok" if stream.status == 200 else orjson.loads(stream.body)["error"]["code"]
    if front == "websocket":
        headers = {"authorization": f"Bearer {token}"} if token else {}
        ws = WebSocket(f"{cluster.nodes['loop'].url}/v1/tables/kv/watch", params, headers)
        try:
            if ws.status != 101:
                return {401: "unauthorized", 403: "forbidden", 429: "rate_limited"}.get(
                    ws.status, f"http:{ws.status}"
                )
            message = ws.receive()
            if message is None:
                return "closed"
            if message["event"] == "error":
                return str(message["data"]["error"]["code"])
            return "ok"
        finally:
            ws.close()
    assert front == "grpc-watch"

    async def call() -> str:
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        request = pb.WatchRequest(table="kv", prefix=params.get("prefix", ""))
        if "since" in params:
            request.since = params["since"]
        async with grpc.aio.insecure_channel(cluster.grpc["loop"]) as channel:
            stream = TablesStub(channel).Watch(request, metadata=metadata, timeout=15)
            try:
                async for _ in stream:
                    stream.cancel()
                    return "ok"
            except grpc.aio.AioRpcError as e:
                return _grpc_code(e)
        return "ended"

    return asyncio.run(call())


WATCHES = ["sse-loop", "sse-granian", "websocket", "grpc-watch"]


@pytest.mark.parametrize("front", WATCHES)
def test_watches_refuse_bad_tokens_and_ungranted_rows(cluster: Cluster, front: str) -> None:
    for what, token in BAD_TOKENS.items():
        assert _watch_refused(cluster, front, token, prefix="alice/") == "unauthorized", what
    token = alice(f"watch-{front}")
    assert _watch_refused(cluster, front, token, prefix="alice/") == "ok"
    if front != "grpc-watch":  # key watches are HTTP's
        assert _watch_refused(cluster, front, token, key="bob/01") == "forbidden"


def _shut(sock: socket.socket) -> None:
    """End a connection now, waking a thread blocked reading it."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def _response_head(stream: BinaryIO) -> tuple[int, dict[str, str]]:
    """An HTTP/1.1 response's status and headers (names in lower case)."""
    status = int(stream.readline().split()[1])
    headers = {}
    while (line := stream.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


def _body(stream: BinaryIO, headers: dict[str, str]) -> Iterator[bytes]:
    """An HTTP/1.1 response's body as it comes: chunked, or of its content-length."""
    if headers.get("transfer-encoding") != "chunked":
        yield stream.read(int(headers.get("content-length", "0")))
        return
    while (line := stream.readline()) and (size := int(line.split(b";")[0], 16)):
        yield stream.read(size)
        stream.readline()


class Watcher:
    """One watch on one watch front end, read on a thread of its own: its events as (kind,
    data) in order (keep-alives left out), or how it was refused or ended."""

    def __init__(self, cluster: Cluster, front: str, token: str, table: str, **params: Any) -> None:
        self.front = front
        self.events: list[tuple[str, Any]] = []
        #: how the transport refused or ended it (an HTTP status, a WebSocket close code, a
        #: gRPC status's name), and the error's code
        self.status: int | str | None = None
        self.code: str | None = None
        self.failure: BaseException | None = None
        self.ended = threading.Event()
        self._stopped = False
        self._close: Callable[[], Any] | None = None
        run = {"websocket": self._websocket, "grpc-watch": self._grpc}.get(front, self._sse)
        self._thread = threading.Thread(
            target=self._run, args=(run, cluster, token, table, params), daemon=True
        )
        self._thread.start()

    def _run(self, run: Callable[..., None], *args: Any) -> None:
        try:
            run(*args)
        except Exception as e:  # a connection ended by stop() among them
            if not self._stopped:
                self.failure = e
        finally:
            self.ended.set()

    def _closing(self, close: Callable[[], Any]) -> None:
        self._close = close
        if self._stopped:
            close()

    def _take(self, kind: str, data: Any) -> None:
        if kind == "error":
            self.code = data["error"]["code"]
        elif kind != "keep-alive":
            self.events.append((kind, data))

    def _sse(self, cluster: Cluster, token: str, table: str, params: dict[str, Any]) -> None:
        url = cluster.nodes["granian" if self.front == "sse-granian" else "loop"].url
        host, port = url.split("://")[1].split(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            self._closing(lambda: _shut(sock))
            sock.settimeout(None)
            sock.sendall(
                f"GET /v1/tables/{table}/watch?{urlencode(params, doseq=True)} HTTP/1.1\r\n"
                f"host: x\r\nauthorization: Bearer {token}\r\n\r\n".encode()
            )
            with sock.makefile("rb") as stream:
                self.status, headers = _response_head(stream)
                if self.status != 200:
                    self.code = orjson.loads(b"".join(_body(stream, headers)))["error"]["code"]
                    return
                pending = b""
                for chunk in _body(stream, headers):
                    *blocks, pending = (pending + chunk).split(b"\n\n")
                    for block in blocks:
                        fields = dict(line.partition(b": ")[::2] for line in block.split(b"\n"))
                        if b"data" in fields:
                            kind = fields.get(b"event", b"message").decode()
                            self._take(kind, orjson.loads(fields[b"data"]))

    def _websocket(self, cluster: Cluster, token: str, table: str, params: dict[str, Any]) -> None:
        url = f"{cluster.nodes['loop'].url}/v1/tables/{table}/watch"
        ws = WebSocket(url, params, {"authorization": f"Bearer {token}"})
        try:
            self._closing(lambda: _shut(ws.sock))
            self.status = ws.status
            if ws.status != 101:
                return
            ws.sock.settimeout(None)
            while (message := ws.receive()) is not None:
                self._take(message["event"], message["data"])
                if message["event"] == "error":
                    self.status = ws.close_code()
                    return
        finally:
            ws.sock.close()

    def _grpc(self, cluster: Cluster, token: str, table: str, params: dict[str, Any]) -> None:
        keys = params.get("key", [])
        request = pb.WatchRequest(
            table=table,
            keys=[keys] if isinstance(keys, str) else keys,
            no_snapshot=params.get("snapshot") == "false",
        )
        if "prefix" in params:
            request.prefix = params["prefix"]

        async def run() -> None:
            loop = asyncio.get_running_loop()
            async with grpc.aio.insecure_channel(cluster.grpc["loop"]) as channel:
                call = TablesStub(channel).Watch(
                    request, metadata=(("authorization", f"Bearer {token}"),)
                )
                self._closing(lambda: loop.call_soon_threadsafe(call.cancel))
                try:
                    async for event in call:
                        row = event.row
                        self._take(
                            event.event,
                            {"rows": event.rows}
                            if event.event == "ready"
                            else {"key": row.key, "value": orjson.loads(row.value or "null"),
                                  "partition": row.partition, "offset": row.offset},
                        )  # fmt: skip
                except asyncio.CancelledError:
                    pass  # stop()
                except grpc.aio.AioRpcError as e:
                    if e.code() != grpc.StatusCode.CANCELLED:
                        self.status, self.code = e.code().name, _grpc_code(e)

        asyncio.run(run())

    def of(self, kind: str) -> list[Any]:
        return [data for k, data in self.events if k == kind]

    def wait_for(self, predicate: Callable[[Watcher], Any], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate(self):
            if self.ended.is_set() and not predicate(self):
                raise AssertionError(
                    f"{self.front}: the watch ended ({self.status}, {self.code}, "
                    f"{self.failure!r}) after {self.events[-3:]}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.front}: not true within {timeout}s; {len(self.events)} events, "
                    f"last {self.events[-3:]}"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        self._stopped = True
        if self._close is not None:
            with contextlib.suppress(Exception):
                self._close()
        self._thread.join(10)


def _ready(w: Watcher) -> bool:
    return bool(w.of("ready"))


def test_open_watches_keep_their_changes_through_a_catalog_change(
    cluster: Cluster, bootstrap: str
) -> None:
    """An index added to a table while watches follow it on every watch front end: the
    watches opened before go on getting its changes, and so do those begun after, which take
    the new catalog entry (and the feed the others share with it), each change once."""
    tokens = {front: bearer(f"catalog-{front}", role="admin") for front in WATCHES}
    opened: list[Watcher] = []
    try:
        before = [Watcher(cluster, front, tokens[front], "live", prefix="") for front in WATCHES]
        opened += before
        for w in before:
            w.wait_for(_ready)
        indexed = replace(cluster.live.info, extra={"indexes": ["color"]})
        catalog.publish(bootstrap, cluster.app, [indexed])

        def every_node_has_it() -> bool:
            return all(
                any(
                    t["name"] == "live" and t.get("indexes") == ["color"]
                    for t in node.get("/v1/tables").json()["tables"]
                )
                for node in cluster.nodes.values()
            )

        eventually(every_node_has_it, timeout=60)
        after = [
            Watcher(cluster, front, tokens[front], "live", prefix="", snapshot="false")
            for front in WATCHES
        ]
        opened += after
        for w in after:
            w.wait_for(_ready)
        cluster.live.write(bootstrap, [(f"new{i}", {"n": 100 + i}) for i in range(5)])
        for w in opened:
            w.wait_for(lambda w: len(w.of("change")) >= 5)
        for w in opened:
            got = sorted(c["value"]["n"] for c in w.of("change"))
            assert got == [100, 101, 102, 103, 104], (w.front, got)
    finally:
        for w in opened:
            w.stop()


#: how each watch front end refuses a watch over the caller's cap: its status, its code
OVER_THE_CAP = {
    "sse-loop": (429, "rate_limited"),
    "sse-granian": (429, "rate_limited"),
    "websocket": (1008, "rate_limited"),
    "grpc-watch": ("RESOURCE_EXHAUSTED", "rate_limited"),
}


@pytest.mark.parametrize("front", WATCHES)
def test_a_caller_has_at_most_so_many_watches_open(cluster: Cluster, front: str) -> None:
    """``--max-watches`` per caller (its token's subject) on a node, whichever transport holds
    them: the one over is refused before its stream starts, as the transport refuses; another
    caller is not counted against it; a watch that ends gives its place back (once the node
    sees it end)."""
    token = alice(f"cap-{front}")
    held = [Watcher(cluster, front, token, "kv", prefix="alice/") for _ in range(MAX_WATCHES)]
    try:
        for w in held:
            w.wait_for(_ready)
        over = Watcher(cluster, front, token, "kv", prefix="alice/")
        assert over.ended.wait(15), over.events[:3]
        assert (over.status, over.code) == OVER_THE_CAP[front], (over.failure, over.events[:3])
        other = Watcher(cluster, front, alice(f"cap-other-{front}"), "kv", prefix="alice/")
        other.wait_for(_ready)
        other.stop()
        held.pop().stop()

        def opens() -> bool:
            again = Watcher(cluster, front, token, "kv", prefix="alice/")
            try:
                again.wait_for(lambda w: _ready(w) or w.ended.is_set())
                return _ready(again)
            finally:
                again.stop()

        eventually(opens, timeout=30, interval=0.5)
    finally:
        for w in held:
            w.stop()


def _watches_cut_slow(node: NodeProcess) -> float:
    """Watches the node has ended as slow consumers, from its /metrics."""
    text = node.get("/metrics").text
    found = re.search(r'^tablecast_watch_closed_total\{reason="slow_consumer"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


#: the value of a flooding key: the watch of a client that stops reading falls behind fast
SLOW_PAD = "x" * 100_000


@pytest.mark.parametrize("front", ["sse-loop", "sse-granian"])
def test_an_sse_reader_that_stops_reading_is_cut_off(
    cluster: Cluster, bootstrap: str, front: str
) -> None:
    """A watcher whose client stops reading while its key changes fast: the node holds so
    much for it and no more (the loop engine: what its connection holds; granian, which takes
    every write: what the client's TCP has not acknowledged), then ends the stream as a slow
    consumer, its last id given; a watcher beside it on the node gets every change meanwhile."""
    node = cluster.nodes["loop" if front == "sse-loop" else "granian"]
    live = cluster.live
    node.wait_caught_up(bootstrap, "live", live.info.topic)
    slow_key, beside_key = f"slow/{front}", f"beside/{front}"
    cut_before = _watches_cut_slow(node)
    host, port = node.url.split("://")[1].split(":")
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.settimeout(15)
    slow.connect((host, int(port)))
    beside = Watcher(
        cluster, front, bearer(f"beside-{front}", role="admin"), "live", key=beside_key
    )
    stop = threading.Event()
    written = [0]

    def write() -> None:
        while not stop.is_set():
            i = written[0]
            live.write(
                bootstrap, [(slow_key, {"i": i, "pad": SLOW_PAD})] * 2 + [(beside_key, {"i": i})]
            )
            written[0] = i + 1
            time.sleep(0.05)

    writer = threading.Thread(target=write, daemon=True)
    try:
        slow.sendall(
            f"GET /v1/tables/live/watch?{urlencode({'key': slow_key})} HTTP/1.1\r\nhost: x\r\n"
            f"authorization: Bearer {bearer(f'slow-{front}', role='admin')}\r\n\r\n".encode()
        )
        assert slow.recv(12) == b"HTTP/1.1 200"  # and then nothing more is read
        beside.wait_for(_ready)
        started = time.monotonic()
        writer.start()
        try:
            eventually(lambda: _watches_cut_slow(node) > cut_before, timeout=60, interval=0.5)
            took = time.monotonic() - started
        finally:
            stop.set()
            writer.join(30)
        live.write(bootstrap, [(beside_key, {"i": written[0]})])
        beside.wait_for(lambda w: any(c["value"]["i"] == written[0] for c in w.of("change")))
        assert [c["value"]["i"] for c in beside.of("change")] == list(range(written[0] + 1))
        # what the node had sent before the cut reaches the client, then the end of the stream
        got = read_to_end(slow)
        assert got.endswith(b"0\r\n\r\n") and b"\nid: " in got, got[-200:]
        assert took < 40, took
    finally:
        stop.set()
        beside.stop()
        slow.close()


# -- rate limits and waits across forwarding ---------------------------------------------


def _rate_refusals(node: NodeProcess) -> float:
    """Requests the node has refused as over the rate limit, from its /metrics."""
    text = node.get("/metrics").text
    found = re.search(r'^tablecast_rate_limited_total\{limit="rate"\} (\S+)$', text, re.M)
    assert found, text[-500:]
    return float(found.group(1))


def _owned_elsewhere(cluster: Cluster, node: str) -> list[str]:
    """alice's keys of the kv table that `node` does not own: read there, they are forwarded.
    (Asked of the loop node: granian hands the node a decoded path, ``%2F`` a slash.)"""
    url = cluster.nodes[node].url
    keys = []
    for i in range(16):
        key = f"alice/{i:02d}"
        meta = cluster.nodes["loop"].get(f"/v1/tables/kv/keys/{quote(key, safe='')}/metadata")
        if meta.json()["active"]["url"] != url:
            keys.append(key)
    assert keys, f"{node} owns every partition"
    return keys


@pytest.mark.parametrize("front", READS)
def test_rate_limits_count_the_subject_not_the_forwarding_node(
    cluster: Cluster, front: str
) -> None:
    """With auth on, a caller is its token's subject: one flooding node a with keys b owns is
    refused by a, while another subject reads the same keys through a meanwhile; b refuses
    none of a's hops (signed: they were counted where they came in), so the flood is charged
    neither to a's address nor to a's other callers."""
    f = READS[front]
    a = cluster.nodes[f.node]
    b = cluster.nodes["granian" if f.node == "loop" else "loop"]
    keys = _owned_elsewhere(cluster, f.node)
    other = alice(f"beside-flood-{front}")
    assert f.get(cluster, "kv", keys[0], other) == Outcome(
        "ok", {"u": "alice", "i": int(keys[0][-2:])}
    )
    refused_a, refused_b = _rate_refusals(a), _rate_refusals(b)
    codes: list[str] = []
    failed: list[BaseException] = []
    stop = threading.Event()

    def flood() -> None:
        try:
            asyncio.run(f.flood(cluster, keys, alice(f"flood-{front}"), stop, codes))
        except BaseException as e:
            failed.append(e)

    flooder = threading.Thread(target=flood, daemon=True)
    flooder.start()
    try:
        eventually(lambda: failed or "rate_limited" in codes, timeout=30, interval=0.05)
        assert not failed, failed
        # while the flood goes on, and a refuses most of it
        beside = [f.get(cluster, "kv", keys[i % len(keys)], other).code for i in range(12)]
    finally:
        stop.set()
        flooder.join(30)
    assert not failed, failed
    counted = Counter(codes)
    assert beside == ["ok"] * 12, (beside, counted)
    assert set(counted) == {"ok", "rate_limited"} and counted["ok"] >= RATE // 2, counted
    assert _rate_refusals(b) == refused_b
    assert _rate_refusals(a) - refused_a >= counted["rate_limited"]


#: the open cluster's limit per caller: a flood passes it within a second
OPEN_RATE = 20


@dataclass
class Open:
    """Two nodes without auth or cluster secret: callers are counted by address."""

    a: NodeProcess
    b: NodeProcess
    #: keys of the kv table owned by b (read through a: forwarded)
    b_keys: list[str]
    kv: TableModel


@pytest.fixture(scope="module")
def open_cluster(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Open]:
    app = f"confo{time.monotonic_ns() % 10**8}"
    tmp = tmp_path_factory.mktemp("conformance-open")
    kv = make_table(bootstrap, app, "kv", PARTITIONS, serde.string(), serde.json())
    kv.write(bootstrap, [(f"k{i:02d}", i) for i in range(32)])
    limits = ("--rate-limit", str(OPEN_RATE), "--max-waits", "1")
    a = start_node(app, bootstrap, tmp, *limits)
    b = start_node(app, bootstrap, tmp, *limits, "--http-engine", "granian")
    try:
        for node in (a, b):
            node.wait_ready()

        def b_keys() -> list[str]:
            # one request a poll: the fixture's own reads must stay under the rate limit
            r = a.get("/v1/cluster")
            if r.status_code != 200:
                return []
            active = {
                replica["partition"]: n["url"]
                for n in r.json()["nodes"]
                for replica in n["replicas"]
                if replica["table"] == "kv" and replica["role"] == "active"
            }
            if len(active) < PARTITIONS:  # still assigning: not settled
                return []
            owned = [
                key.decode()
                for key in sorted(kv.rows)
                if active[kv.info.partition_of(key)] == b.url
            ]
            return owned if 0 < len(owned) < len(kv.rows) else []

        keys = eventually(b_keys, timeout=90)
        time.sleep(1.5)  # the buckets the settling spent refill
        yield Open(a, b, keys, kv)
    finally:
        stop_all((a, b))


def _from(host: str) -> httpx.Client:
    """A client whose requests come from `host` (any 127.0.0.0/8 address is this machine)."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=host), timeout=15)


def test_rate_limits_count_the_caller_not_the_forwarding_node(open_cluster: Open) -> None:
    """Without auth, a caller is its address: one client flooding node a with reads b owns
    is refused by a, and b does not count the flood against a's address, so another client
    of a is answered."""
    o = open_cluster
    with _from("127.0.0.2") as flooder, _from("127.0.0.3") as other:
        codes = [
            flooder.get(f"{o.a.url}/v1/tables/kv/keys/{o.b_keys[i % len(o.b_keys)]}").status_code
            for i in range(3 * OPEN_RATE)
        ]
        assert 429 in codes and codes.count(200) >= OPEN_RATE // 2, codes
        for key in o.b_keys[:5]:
            r = other.get(f"{o.a.url}/v1/tables/kv/keys/{key}")
            assert r.status_code == 200, r.text


def test_a_forged_hop_is_counted_by_its_own_address(open_cluster: Open) -> None:
    """A request that calls itself forwarded, from an address no node has, is counted by
    that address whatever caller it names."""
    o = open_cluster
    with _from("127.0.0.4") as forger:
        codes = [
            forger.get(
                f"{o.b.url}/v1/tables/kv/keys/{o.b_keys[0]}",
                headers={"x-tablecast-hop": "1", "x-tablecast-client": f"198.18.0.{i}"},
            ).status_code
            for i in range(3 * OPEN_RATE)
        ]
    assert 429 in codes, codes


def test_waits_count_the_caller_not_the_forwarding_node(open_cluster: Open) -> None:
    """--max-waits 1: a caller waiting on b (through a) for an offset not written yet does
    not use up the wait of another caller of a."""
    o = open_cluster
    key = o.b_keys[0]
    meta = o.a.get(f"/v1/tables/kv/keys/{key}/metadata").json()
    answer = o.a.get(f"/v1/tables/kv/keys/{key}")
    end = positions.parse(answer.headers["x-tablecast-position"]).offsets[meta["partition"]]
    # the next record of the partition, not written: the wait runs its whole time
    ahead = f"{meta['partition']}:{end}"
    ahead_params = {"min_offset": ahead, "timeout_ms": "3000"}
    with _from("127.0.0.5") as waiter, _from("127.0.0.6") as other:
        parked = threading.Thread(
            target=lambda: waiter.get(f"{o.a.url}/v1/tables/kv/keys/{key}", params=ahead_params)
        )
        parked.start()
        time.sleep(0.5)  # parked at b
        # its own wait: it runs out (504), it is not refused as the other's second (429)
        r = other.get(
            f"{o.a.url}/v1/tables/kv/keys/{key}", params={"min_offset": ahead, "timeout_ms": "500"}
        )
        parked.join(10)
    assert r.status_code == 504, r.text


# -- a slow identity provider ------------------------------------------------------------


@dataclass
class SlowIdp:
    """Nodes whose JWKS URL points at a server that takes connections and never answers."""

    nodes: dict[str, NodeProcess]
    grpc: str


@pytest.fixture(scope="module")
def slow_idp(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlowIdp]:
    app = f"confj{time.monotonic_ns() % 10**8}"
    tmp = tmp_path_factory.mktemp("conformance-idp")
    make_table(bootstrap, app, "kv", 2, serde.string(), serde.json()).write(bootstrap, [("k", 1)])
    idp = socket.create_server(("127.0.0.1", 0), backlog=128)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:  # takes every connection, answers none
        idp.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError, OSError):
                held.append(idp.accept()[0])

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    jwks = ("--auth-jwks", f"http://127.0.0.1:{idp.getsockname()[1]}/jwks")
    grpc_port = free_port()
    nodes = {
        "loop": start_node(app, bootstrap, tmp, *jwks, "--grpc-port", str(grpc_port)),
        "granian": start_node(app, bootstrap, tmp, *jwks, "--http-engine", "granian"),
    }
    try:
        for node in nodes.values():
            node.wait_ready()
        yield SlowIdp(nodes, f"127.0.0.1:{grpc_port}")
    finally:
        stop_all(nodes.values())
        stop.set()
        acceptor.join(5)
        for s in [*held, idp]:
            s.close()


def _made_up(kid: str) -> str:
    return jwt.encode(
        {"exp": int(time.time() + 600), "sub": "x"}, "k" * 32, algorithm="HS256",
        headers={"kid": kid},
    )  # fmt: skip


@pytest.mark.parametrize(
    "front", ["http1-loop", "http1-granian", "http2-granian", "grpc", "websocket"]
)
def test_a_silent_identity_provider_holds_up_nobody(slow_idp: SlowIdp, front: str) -> None:
    """Tokens naming key ids the node has never seen, sent without pause: the node fetches
    its JWKS off the event loop, so requests that need no fetch are answered at once, and
    the made-up tokens are refused (401) within the fetch's timeout."""
    node = slow_idp.nodes["granian" if "granian" in front else "loop"]
    stop = threading.Event()
    refused: list[float] = []

    def flood() -> None:
        n = 0
        with httpx.Client(timeout=30) as http:
            while not stop.is_set():
                n += 1
                started = time.monotonic()
                r = http.get(
                    f"{node.url}/v1/tables/kv/keys/k",
                    headers={"authorization": f"Bearer {_made_up(f'{front}-{n}')}"},
                )
                assert r.status_code == 401, r.text
                refused.append(time.monotonic() - started)

    flooders = [threading.Thread(target=flood, daemon=True) for _ in range(3)]
    for t in flooders:
        t.start()
    time.sleep(0.5)  # the first fetch hangs by now
    took = []
    try:
        for _ in range(10):
            started = time.monotonic()
            if front == "grpc":

                async def call() -> str:
                    async with grpc.aio.insecure_channel(slow_idp.grpc) as channel:
                        try:
                            await TablesStub(channel).Get(pb.GetRequest(table="kv", key="k"))
                        except grpc.aio.AioRpcError as e:
                            return _grpc_code(e)
                    return "ok"

                assert asyncio.run(call()) == "unauthorized"
            elif front == "websocket":
                ws = WebSocket(f"{node.url}/v1/tables/kv/watch", {"key": "k"})
                assert ws.status == 401
                ws.close()
            else:
                with httpx.Client(http1="http2" not in front, http2="http2" in front) as http:
                    assert http.get(f"{node.url}/healthz", timeout=10).status_code == 200
                    assert http.get(f"{node.url}/v1/tables/kv/keys/k").status_code == 401
            took.append(time.monotonic() - started)
            time.sleep(0.3)
    finally:
        stop.set()
        for t in flooders:
            t.join(15)
    # a front end that waited on the fetch would take its whole timeout: typical requests
    # take a small part of it, and none half of it, even on a machine the whole suite loads
    assert statistics.median(took) < JWKS_TIMEOUT_S / 5, took
    assert max(took) < JWKS_TIMEOUT_S / 2, took
    assert refused and max(refused) < JWKS_TIMEOUT_S + 2, max(refused)


@pytest.mark.parametrize("front", ["http1-loop", "http1-granian"])
def test_a_read_of_many_partitions_is_judged_alike_wherever_they_are(
    cluster: Cluster, front: str
) -> None:
    """A range, count or batch held to a position its partition has not reached runs out
    of time (504) whichever node holds that partition: the peer's judgement is the read's
    answer, not a node to route around (and then a 503)."""
    f = HTTP[front]
    r = f.request(cluster, "GET", "/v1/tables/kv/range?limit=1", ADMIN)
    ends = positions.parse(r.headers["x-tablecast-position"]).offsets
    assert sorted(ends) == list(range(PARTITIONS)), ends
    keys = {"keys": [f"alice/{i:02d}" for i in range(16)]}
    for p in range(PARTITIONS):
        # the next record of the partition, never written
        wait = f"min_offset={p}:{ends[p]}&timeout_ms=300"
        for method, path, body in (
            ("GET", f"/v1/tables/kv/range?prefix=alice/&{wait}", None),
            ("GET", f"/v1/tables/kv/count?{wait}", None),
            ("POST", f"/v1/tables/kv/keys:batchGet?{wait}", keys),
        ):
            r = f.request(cluster, method, path, ADMIN, json=body)
            assert r.status_code == 504, (p, path, r.status_code, r.text)
            assert r.json()["error"]["code"] == "timeout", r.text


@pytest.mark.parametrize("front", READS)
def test_a_read_after_a_position_beyond_the_end_is_refused(cluster: Cluster, front: str) -> None:
    """A read held to an after position beyond its partition's end (X-Tablecast-After, gRPC
    metadata of that name, SQL's tablecast.after) is refused, whether the node answers the
    key itself or forwards it: no node handed that position out."""
    f = READS[front]
    token = alice(f"after-{front}")
    future = "kv@" + ",".join(f"{p}:1000000000000" for p in range(PARTITIONS))
    elsewhere = _owned_elsewhere(cluster, f.node)
    here = [k for k in (f"alice/{i:02d}" for i in range(16)) if k not in elsewhere]
    for key in [elsewhere[0], *here[:1]]:
        assert f.get(cluster, "kv", key, token).code == "ok", key
        got = f.get(cluster, "kv", key, token, {"x-tablecast-after": future})
        assert got.code == "bad_request", (key, got)


@pytest.mark.parametrize("front", WATCHES)
def test_a_resume_token_from_the_future_is_refused(cluster: Cluster, front: str) -> None:
    """Offsets beyond the end of their partitions are no position any node handed out:
    refused before a feed the node's watches share could start there."""
    token = alice(f"future-{front}")
    future = "kv@" + ",".join(f"{p}:1000000000000" for p in range(PARTITIONS))
    assert _watch_refused(cluster, front, token, prefix="alice/", since=future) == "bad_request"
    assert _watch_refused(cluster, front, token, prefix="alice/") == "ok"
