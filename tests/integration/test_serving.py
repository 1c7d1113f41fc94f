"""Every query kind of the HTTP API against a model of the table topics, on a real node process,
including after kill -9 and restart of a node with RocksDB stores."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import orjson
import pytest

from tablecast import serde
from tablecast.contract import positions
from tablecast.contract.partitioner import partition_for
from tablecast.node import huge_pages

from ..support.procs import NodeProcess, eventually, start_node
from .tables import TableModel, make_table, write_windows

pytestmark = pytest.mark.integration

PARTITIONS = 6


@pytest.fixture(params=["granian", "loop"])
def engine(request: pytest.FixtureRequest) -> tuple[str, str]:
    """Every test here runs on both HTTP servers a node can use (serve --http-engine)."""
    return ("--http-engine", request.param)


def random_rows(rng: random.Random, n: int, keys: int) -> list[tuple[str, object]]:
    rows: list[tuple[str, object]] = []
    for _ in range(n):
        key = f"{rng.choice(['a', 'b', 'ab', 'b/c', 'zé', 'k'])}{rng.randrange(keys):03d}"
        value = (
            None if rng.random() < 0.15 else {"n": rng.randrange(1000), "s": "x" * rng.randrange(5)}
        )
        rows.append((key, value))
    return rows


def scan_all(node: NodeProcess, table: str, limit: int, **params: str) -> list[tuple[str, object]]:
    items: list[tuple[str, object]] = []
    cursor = None
    for _ in range(1000):
        q = {**params, "limit": str(limit), **({"cursor": cursor} if cursor else {})}
        r = node.get(f"/v1/tables/{table}/range", params=q)
        assert r.status_code == 200, r.text
        body = r.json()
        assert len(body["items"]) <= limit
        items.extend((i["key"], i["value"]) for i in body["items"])
        cursor = body["next_cursor"]
        if cursor is None:
            return items
    raise AssertionError("range pagination did not end")


def expected(
    model: TableModel, lo: bytes | None = None, hi: bytes | None = None, prefix: bytes = b""
) -> list[tuple[str, object]]:
    return [
        (k.decode(), v)
        for k, v in sorted(model.rows.items())
        if (lo is None or k >= lo) and (hi is None or k < hi) and k.startswith(prefix)
    ]


def check_everything(node: NodeProcess, model: TableModel, rng: random.Random) -> None:
    name = model.info.name
    for raw, value in model.rows.items():
        r = node.get(f"/v1/tables/{name}/keys/{quote(raw.decode(), safe='')}")
        assert r.status_code == 200, (raw, r.text)
        body = r.json()
        assert body["value"] == value and body["key"] == raw.decode()
        assert body["partition"] == partition_for(raw, PARTITIONS)
    assert node.get(f"/v1/tables/{name}/count").json() == {"count": len(model.rows)}
    assert scan_all(node, name, 7) == expected(model)
    assert scan_all(node, name, 10000) == expected(model)
    assert scan_all(node, name, 5, prefix="ab") == expected(model, prefix=b"ab")
    assert scan_all(node, name, 4, **{"from": "ab005", "to": "b/c010"}) == expected(
        model, b"ab005", b"b/c010"
    )
    assert scan_all(node, name, 3, prefix="b", **{"from": "b/c"}) == expected(
        model, b"b/c", prefix=b"b"
    )
    probe = [k.decode() for k in rng.sample(sorted(model.rows), min(20, len(model.rows)))] + [
        "nope",
        "a999",
    ]
    rng.shuffle(probe)
    r = httpx.post(
        f"{node.url}/v1/tables/{name}/keys:batchGet", content=orjson.dumps({"keys": probe})
    )
    assert r.status_code == 200
    want = [
        {"key": k, "found": True, "value": model.rows[k.encode()]}
        if k.encode() in model.rows
        else {"key": k, "found": False}
        for k in probe
    ]
    assert r.json() == {"results": want}


def test_queries_match_the_model_and_survive_kill_9(
    bootstrap: str, unique: str, logs: Path, engine: tuple[str, str]
) -> None:
    rng = random.Random(11)
    model = make_table(bootstrap, unique, "kv", PARTITIONS, serde.string(), serde.json())
    model.write(bootstrap, random_rows(rng, 600, 120))
    data = logs / "node-data"
    node = start_node(unique, bootstrap, logs, *engine, "--data-dir", str(data))
    try:
        node.wait_ready()
        node.wait_caught_up(bootstrap, "kv", model.info.topic)
        check_everything(node, model, rng)

        # a deleted key answers 404 key_not_found; metadata says where a key lives
        gone = next(iter(model.rows)).decode()
        model.write(bootstrap, [(gone, None)])
        eventually(
            lambda: node.get(f"/v1/tables/kv/keys/{quote(gone, safe='')}").status_code == 404
        )
        meta = node.get(f"/v1/tables/kv/keys/{quote(gone, safe='')}/metadata").json()
        assert meta["partition"] == partition_for(gone.encode(), PARTITIONS)
        assert meta["active"]["url"] == node.url

        node.stop(signal.SIGKILL)
        model.write(bootstrap, random_rows(rng, 200, 150))
        node = start_node(unique, bootstrap, logs, *engine, "--data-dir", str(data))
        node.wait_ready()
        node.wait_caught_up(bootstrap, "kv", model.info.topic)
        check_everything(node, model, rng)
        # resumed from the stored offsets: only the tail was replayed
        metrics = node.get("/metrics").text
        applied = next(
            float(line.split()[-1])
            for line in metrics.splitlines()
            if line.startswith("tablecast_records_applied_total")
        )
        assert 0 < applied <= 201
    finally:
        node.stop()


def test_kept_answers_follow_every_write(
    bootstrap: str, unique: str, logs: Path, engine: tuple[str, str]
) -> None:
    """Plain key reads are answered from whole kept answers (query/kept_answers.py): every
    answer must still be what the store holds at the position its header names, so a
    write to the key, or to another key of its partition, is seen by the next reads."""
    model = make_table(bootstrap, unique, "hot", 1, serde.string(), serde.json())
    model.write(bootstrap, [("k", 0), ("other", 0)])
    node = start_node(unique, bootstrap, logs, *engine)
    try:
        node.wait_ready()
        node.wait_caught_up(bootstrap, "hot", model.info.topic)
        if huge_pages.needed(os.environ):  # where the kernel gives them on request, it asked
            started = Path(f"/proc/{node.proc.pid}/environ").read_bytes().split(b"\0")
            assert b"PYTHONMALLOC=malloc" in started
        with httpx.Client(base_url=node.url, timeout=10.0) as http:

            def read(key: str) -> tuple[int, int, int]:
                r = http.get(f"/v1/tables/hot/keys/{key}")
                assert r.status_code == 200, r.text
                body = r.json()
                position = positions.parse(r.headers["x-tablecast-position"]).offsets[0]
                assert body["offset"] < position  # exact at its position: the record is in it
                return body["value"], body["offset"], position

            seen = read("k")
            assert seen == (0, 0, 2)
            assert read("k") == seen  # the same answer again: no write since
            latest = {"k": 0, "other": 0}
            for i in range(1, 16):
                key = "other" if i % 3 == 0 else "k"
                model.write(bootstrap, [(key, i)])  # one record: the end is now 2 + i
                latest[key] = i
                for _ in range(500):  # until this write is seen; never an older answer
                    now = read("k")
                    assert now[2] >= seen[2] and now[1] >= seen[1], (now, seen)
                    seen = now
                    if now[2] == 2 + i:
                        break
                    time.sleep(0.01)
                assert seen[2] == 2 + i and seen[0] == latest["k"], (i, seen)
                assert read("other")[0::2] == (latest["other"], 2 + i)
            detail = http.get("/internal/console/node").json()
            assert detail["cache"]["hits"] > 0  # the kept answers were used
    finally:
        node.stop()


def test_windows(bootstrap: str, unique: str, logs: Path) -> None:
    model = make_table(
        bootstrap,
        unique,
        "per-minute",
        PARTITIONS,
        serde.string(),
        serde.json(),
        kind="window",
        extra={"size_ms": 60_000},
    )
    base = 1_700_000_000_000
    records = [
        (k, base + m * 60_000, {"count": m + i})
        for i, k in enumerate(["u1", "u10", "u2"])
        for m in range(5)
    ]
    write_windows(bootstrap, model, records)
    node = start_node(unique, bootstrap, logs)
    try:
        node.wait_ready()
        node.wait_caught_up(bootstrap, "per-minute", model.info.topic)
        r = node.get(
            "/v1/tables/per-minute/keys/u1/windows",
            params={"from": base + 60_000, "to": base + 180_000},
        )
        assert r.status_code == 200, r.text
        assert r.json()["items"] == [
            {"start": base + m * 60_000, "end": base + (m + 1) * 60_000, "value": {"count": m}}
            for m in (1, 2, 3)
        ]
        every = node.get("/v1/tables/per-minute/keys/u1/windows").json()["items"]
        assert [w["start"] for w in every] == [base + m * 60_000 for m in range(5)]  # not u10's
        assert node.get("/v1/tables/per-minute/count").json() == {"count": 15}
        assert node.get("/v1/tables/per-minute/keys/u1").status_code == 400
        assert node.get("/v1/tables/per-minute/range").status_code == 400
    finally:
        node.stop()


def test_malformed_requests_get_4xx_json(
    bootstrap: str, unique: str, logs: Path, engine: tuple[str, str]
) -> None:
    model = make_table(bootstrap, unique, "ids", 3, serde.long(), serde.json(), store="memory")
    model.write(bootstrap, [(i, {"i": i}) for i in range(-5, 20)])
    node = start_node(unique, bootstrap, logs, *engine)
    try:
        node.wait_ready()
        node.wait_caught_up(bootstrap, "ids", model.info.topic)
        assert node.get("/v1/tables/ids/keys/-5").json()["value"] == {"i": -5}
        cases = [
            ("GET", "/v1/tables/ids/keys/abc", None, 400, "bad_request"),
            ("GET", "/v1/tables/ids/keys/99999999999999999999999", None, 400, "bad_request"),
            ("GET", "/v1/tables/ids/keys/7?max_lag=x", None, 400, "bad_request"),
            ("GET", "/v1/tables/ids/keys/7?min_offset=zz", None, 400, "bad_request"),
            (
                "GET",
                "/v1/tables/ids/keys/7?min_offset=0:0&timeout_ms=999999",
                None,
                400,
                "bad_request",
            ),
            ("GET", "/v1/tables/ids/range?limit=0", None, 400, "bad_request"),
            ("GET", "/v1/tables/ids/range?limit=10001", None, 400, "bad_request"),
            ("GET", "/v1/tables/ids/range?cursor=forged.sig", None, 400, "bad_request"),
            ("GET", "/v1/tables/ids/range?prefix=1", None, 400, "bad_request"),
            ("GET", "/v1/tables/ids/keys/1/windows", None, 400, "bad_request"),
            ("GET", "/v1/tables/missing/count", None, 404, "table_not_found"),
            ("GET", "/v1/tables/ids/keys/12345", None, 404, "key_not_found"),
            ("POST", "/v1/tables/ids/keys:batchGet", b"{", 400, "bad_request"),
            ("POST", "/v1/tables/ids/keys:batchGet", b'{"keys": 3}', 400, "bad_request"),
            ("POST", "/v1/tables/ids/keys:batchGet", b'{"keys": ["x"]}', 400, "bad_request"),
            (
                "POST",
                "/v1/tables/ids/keys:batchGet",
                orjson.dumps({"keys": list(range(1001))}),
                400,
                "bad_request",
            ),
            ("GET", "/v1/tables/ids/keys:batchGet", None, 405, "method_not_allowed"),
            ("DELETE", "/v1/tables/ids/keys/1", None, 405, "method_not_allowed"),
            ("GET", "/v2/whatever", None, 404, "not_found"),
        ]
        for method, path, body, status, code in cases:
            r = httpx.request(method, node.url + path, content=body, timeout=10)
            assert r.status_code == status, (method, path, r.text)
            assert r.json()["error"]["code"] == code, (path, r.text)
            assert r.json()["error"]["message"]
        # a cursor from one query does not continue another
        page = node.get("/v1/tables/ids/range", params={"limit": 2}).json()
        r = node.get(
            "/v1/tables/ids/range", params={"limit": 2, "cursor": page["next_cursor"], "from": "3"}
        )
        assert r.status_code == 400
        # batch with long keys as numbers or digit strings, in request order
        r = httpx.post(f"{node.url}/v1/tables/ids/keys:batchGet", content=b'{"keys": [3, "4", 77]}')
        assert [x["found"] for x in r.json()["results"]] == [True, True, False]
        assert node.get("/openapi.json").json()["openapi"].startswith("3.")
        metrics = node.get("/metrics").text
        assert 'tablecast_http_requests_total{route="key",status="400"}' in metrics
        assert "tablecast_replica_lag" in metrics
    finally:
        node.stop()
