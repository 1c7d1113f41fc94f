"""No input gets a 5xx (beyond the API's 503/504), on any route, from any node — and with a
policy on, no answer ever carries a row the policy forbids.

- schemathesis generates requests from the node's own /openapi.json — a key-value table with
  a history and indexes (so every route has data: history, as_of, index lookups and
  ranges), window and Avro-keyed tables, with auth off, auth on, and auth with a policy
  (``--auth-policy``)
  that grants one key prefix of one table — against the node that does not own most
  partitions, so forwarding and fan-out are exercised; with the policy, every answer is
  judged by ``policy_oracle.violations`` (a schemathesis check loaded as a hook);
- hypothesis fuzzes the internal routes (scan, count) that are not in the public document,
  and, with the policy, every read route with keys, prefixes and bounds drawn from the
  table's own keys (random text would almost never touch a granted or forbidden row);
- a raw-socket fuzzer sends malformed request lines, huge headers, bad encodings, pipelined
  and half-sent requests, and checks after each that the node still answers a normal GET.

``python -m bench fuzz`` runs the same with thousands of examples.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import jwt
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tablecast import serde

from ..support.procs import NodeProcess, eventually, start_node, stop_all
from . import policy_oracle
from .tables import Logged, make_table, write_logged

pytestmark = pytest.mark.integration

SECRET = "fuzz-secret-0123456789abcdef0123456789"
AVRO_KEY = serde.avro({"type": "record", "name": "K", "fields": [{"name": "id", "type": "long"}]})
#: schemathesis examples per operation and hypothesis examples per internal-route test: a
#: few in the suite (every operation, every mode, a fixed seed), thousands in `python -m
#: bench fuzz`, which raises them through these variables
EXAMPLES = int(os.environ.get("TABLECAST_FUZZ_EXAMPLES", "10"))
INTERNAL_EXAMPLES = int(os.environ.get("TABLECAST_FUZZ_INTERNAL_EXAMPLES", "60"))


ROOT = Path(__file__).resolve().parents[2]
KV_KEYS = [f"k{i}" for i in range(40)] + ["a/metadata"]


def _token(claims: dict | None = None) -> str:  # type: ignore[type-arg]
    body = {"sub": "fuzz", **(claims or {}), "exp": int(time.time() + 86_400)}
    return jwt.encode(body, SECRET, "HS256")


# auth on with a policy covers the token checks too: CI runs that and auth off, and `python -m
# bench fuzz` all three
@pytest.fixture(
    scope="module",
    params=["auth-off", pytest.param("auth-on", marks=pytest.mark.long), "policy"],
)
def two_nodes(request, bootstrap: str, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """(nodes, headers, mode): two nodes of an app with kv, window and Avro-keyed tables."""
    mode = request.param
    app = f"fuzz{mode.replace('-', '')}{time.monotonic_ns() % 10**6}"
    logs = tmp_path_factory.mktemp("fuzz")
    kv = make_table(
        bootstrap,
        app,
        "kv",
        6,
        serde.string(),
        serde.json(),
        store="memory",
        extra={"history_ms": 3_600_000, "indexes": ["n", "tag"]},
    )
    now = int(time.time() * 1000)
    rows = [(k, {"i": i}) for i, k in enumerate(KV_KEYS[:-1])] + [(KV_KEYS[-1], {"odd": 1})]
    write_logged(
        bootstrap,
        kv.info.topic,
        [  # two versions of each key, the later one stamped earlier, with index values
            Logged(
                k.encode(),
                orjson.dumps(v),
                now - 60_000 + 1000 * (i % 7) - 500 * version,
                {"n": i % 5, "tag": ["a", f"t{i % 3}"]} if version else {"n": 2.5},
            )
            for version in (0, 1)
            for i, (k, v) in enumerate(rows)
        ],
    )
    make_table(
        bootstrap,
        app,
        "win",
        3,
        serde.string(),
        serde.long(),
        kind="window",
        extra={"size_ms": 60_000},
    )
    avro = make_table(bootstrap, app, "avro", 3, AVRO_KEY, serde.json())
    avro.write(bootstrap, [({"id": i}, {"i": i}) for i in range(10)])
    extra = ["--auth-jwt-secret", SECRET] if mode != "auth-off" else []
    claims = None
    if mode == "policy":
        policy = logs / "policy.json"
        policy.write_bytes(orjson.dumps(policy_oracle.POLICY))
        extra += ["--auth-policy", str(policy)]
        claims = policy_oracle.CLAIMS
    nodes = [start_node(app, bootstrap, logs, *extra) for _ in range(2)]
    headers = {"authorization": f"Bearer {_token(claims)}"} if extra else {}
    try:
        for n in nodes:
            n.headers = headers
            n.wait_ready()
        # both nodes hold their share before fuzzing starts: reads are forwarded
        eventually(lambda: len({_owner(n, "k1") for n in nodes}) == 1, timeout=30)
        yield nodes, headers, mode
    finally:
        stop_all(nodes)


def _owner(node: NodeProcess, key: str) -> str | None:
    return node.get(f"/v1/tables/kv/keys/{key}").headers.get("x-tablecast-node")


def _check_answer(r: httpx.Response) -> None:
    assert r.status_code < 500 or r.status_code in (503, 504), (r.request.url, r.text[:500])
    body = orjson.loads(r.content)  # always JSON
    if r.status_code >= 400:
        assert set(body) == {"error"} and {"code", "message"} <= set(body["error"]), body


def test_schemathesis_finds_no_server_error(two_nodes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    nodes, headers, mode = two_nodes
    cli = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    assert cli, "schemathesis is a dev dependency"
    checks = "not_a_server_error" + (",policy_holds" if mode == "policy" else "")
    argv = [cli, "run", f"{nodes[1].url}/openapi.json", "--checks", checks]
    argv += ["--max-examples", str(EXAMPLES), "--workers", "1", "--seed", "1"]
    # a watch streams until the client leaves: schemathesis would wait for its end. Its
    # parameters are fuzzed by test_watch.py instead
    argv += ["--exclude-path-regex", "/watch$"]
    for k, v in headers.items():
        argv += ["--header", f"{k}: {v}"]
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "tests.integration.schemathesis_policy_hook",
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(argv, capture_output=True, text=True, timeout=400, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout[-4000:]
    assert "passed" in done.stdout
    assert all(n.proc.poll() is None for n in nodes)


def test_awkward_keys_and_parameters(two_nodes) -> None:  # type: ignore[no-untyped-def]
    nodes, _, mode = two_nodes
    if mode == "policy":
        pytest.skip("reads keys and tables the policy forbids; the policy's own test is below")
    node = nodes[1]
    # a key whose text ends like a sub-route is read with ?key=
    r = node.get("/v1/tables/kv/keys", params={"key": "a/metadata"})
    assert r.status_code == 200 and r.json()["value"] == {"odd": 1}
    assert node.get("/v1/tables/kv/metadata", params={"key": "a/metadata"}).status_code == 200
    r = node.get("/v1/tables/kv/keys/k1", params={"max-lag": "3"})
    assert r.status_code == 400 and "max-lag" in r.json()["error"]["message"]
    # history and indexes of the kv table (two versions per key, the last one by offset
    # stamped earlier), from the node that owns few of its partitions
    history = node.get("/v1/tables/kv/history", params={"key": "a/metadata"}).json()["items"]
    assert [v["value"] for v in history] == [{"odd": 1}, {"odd": 1}]
    assert history[0]["offset"] > history[1]["offset"]  # oldest by time first
    items = node.get("/v1/tables/kv/index/tag", params={"limit": 1000}).json()["items"]
    assert len(items) == 2 * len(KV_KEYS) and items[0]["index"] == "a"
    assert {x["key"] for x in node.get("/v1/tables/kv/index/n/2").json()["items"]} == {
        k for i, k in enumerate(KV_KEYS) if i % 5 == 2
    }
    for bad in ({"as_of": "yesterday"}, {"after": "nope"}, {"after": "kv@0:x"}, {"redirect": "x"}):
        assert node.get("/v1/tables/kv/range", params=bad).status_code == 400
    assert node.get("/v1/tables/kv/index/nope/1").status_code == 404
    assert node.get("/v1/tables/win/keys/x/history").status_code == 400
    for to in (str(2**64), "-1", "9" * 40):
        assert node.get("/v1/tables/win/keys/x/windows", params={"to": to}).status_code == 400
    assert (
        node.get("/v1/tables/win/keys/x/windows", params={"to": str(2**63 - 1)}).status_code == 200
    )
    assert node.get("/v1/tables/avro/keys/not-json").status_code == 400
    assert node.get("/v1/tables/avro/keys/" + quote('{"id": 3}')).json()["value"] == {"i": 3}
    assert node.get("/v1/tables/kv/keys/" + "x" * 5000).status_code == 400
    big = httpx.post(
        f"{node.url}/v1/tables/kv/keys:batchGet",
        content=b'{"keys": ["' + b"x" * (2 << 20) + b'"]}',
        headers=node.headers,
        timeout=30,
    )
    assert big.status_code == 413 and big.json()["error"]["code"] == "payload_too_large"
    for body in (b'{"keys": [{"a": 1}, null, [[]]]}', b"[]", b'{"keys": 3}', b"\xff\xfe"):
        r = httpx.post(f"{node.url}/v1/tables/kv/keys:batchGet", content=body, headers=node.headers)
        _check_answer(r)


_text = st.text(st.characters(codec="utf-8"), max_size=30)


@settings(max_examples=INTERNAL_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    route=st.sampled_from(["scan", "count"]),
    table=st.sampled_from(["kv", "win", "avro", "nope", ""]),
    params=st.dictionaries(
        st.sampled_from(
            ["partitions", "start", "end", "limit", "max_lag", "view", "index", "as_of", "other"]
        ),
        st.one_of(
            _text,
            st.integers().map(str),
            st.lists(st.integers(-2, 9)).map(lambda xs: ",".join(map(str, xs))),
        ),
        max_size=4,
    ),
)
def test_internal_routes_fuzzed(two_nodes, route: str, table: str, params: dict) -> None:  # type: ignore[no-untyped-def]
    nodes, _, _ = two_nodes
    _check_answer(nodes[0].get(f"/internal/tables/{quote(table, safe='')}/{route}", params=params))


_key = st.sampled_from([*KV_KEYS, "k", "k1/", "", "a", "k1\u00ff", "zz"])
_bound = st.one_of(_key, st.sampled_from(["k0", "k19", "k2", "k1/", "k1~"]), _text)


@settings(max_examples=INTERNAL_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    which=st.integers(0, 1),
    route=st.sampled_from(
        ["key", "metadata", "history", "index", "batch", "range", "count", "scan", "icount"]
    ),
    key=_key,
    keys=st.lists(_key, max_size=12),
    params=st.dictionaries(
        st.sampled_from(["from", "to", "prefix", "limit", "partitions"]),
        st.one_of(_bound, st.integers(1, 50).map(str)),
        max_size=3,
    ),
)
def test_the_policy_never_shows_a_forbidden_row(  # type: ignore[no-untyped-def]
    two_nodes, which: int, route: str, key: str, keys: list[str], params: dict
) -> None:
    """Keys, prefixes and bounds drawn from the table's own keys, on every read route of
    either node: nothing outside the grants is ever shown (checked by the oracle)."""
    nodes, headers, mode = two_nodes
    if mode != "policy":
        pytest.skip("the policy's own test")
    node = nodes[which]
    k = quote(key, safe="")
    if route == "batch":
        r = httpx.post(
            f"{node.url}/v1/tables/kv/keys:batchGet", json={"keys": keys}, headers=headers
        )
    elif route in ("scan", "icount"):
        q = {"partitions": params.get("partitions", "0,1,2,3,4,5"), "limit": "100"}
        r = node.get(f"/internal/tables/kv/{'scan' if route == 'scan' else 'count'}", params=q)
    else:
        path = {
            "key": f"/v1/tables/kv/keys/{k}",
            "metadata": f"/v1/tables/kv/keys/{k}/metadata",
            "history": f"/v1/tables/kv/keys/{k}/history",
            "index": "/v1/tables/kv/index/tag",
            "range": "/v1/tables/kv/range",
            "count": "/v1/tables/kv/count",
        }[route]
        q = (
            {n: v for n, v in params.items() if n != "partitions" and n != "prefix"}
            if route in ("range", "index")
            else {}
        )
        if route == "range" and "prefix" in params:
            q["prefix"] = params["prefix"]
        r = node.get(path, params=q)
    _check_answer(r)
    assert not policy_oracle.violations(
        r.request.method, str(r.request.url), r.status_code, r.content
    ), r.text[:500]


def test_the_policy_shows_every_granted_row(two_nodes) -> None:  # type: ignore[no-untyped-def]
    """The other half: what the grants cover is all there, from either node."""
    nodes, _, mode = two_nodes
    if mode != "policy":
        pytest.skip("the policy's own test")
    granted = sorted(k for k in KV_KEYS if k.startswith(policy_oracle.PREFIX))
    assert len(granted) == policy_oracle.GRANTED_ROWS
    for n in nodes:
        items = n.get("/v1/tables/kv/range", params={"limit": 1000}).json()["items"]
        assert [x["key"] for x in items] == granted
        assert n.get("/v1/tables/kv/count").json() == {"count": len(granted)}
        items = n.get("/v1/tables/kv/index/tag/a", params={"limit": 1000}).json()["items"]
        assert [x["key"] for x in items] == granted  # every row has tag "a"
        assert n.get("/v1/tables/kv/keys/k10/history").json()["items"]


RAW_CASES = [
    b"GARBAGE\r\n\r\n",
    b"GET\r\n\r\n",
    b"GET /v1/tables HTTP/9.9\r\n\r\n",
    b"GET /v1/tables/kv/keys/%zz HTTP/1.1\r\nhost: x\r\n\r\n",
    b"GET /v1/tables/kv/keys/\xff\xfe HTTP/1.1\r\nhost: x\r\n\r\n",
    b"GET /v1/tables HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 200_000 + b"\r\n\r\n",
    b"GET /v1/tables HTTP/1.1\r\n" + b"".join(b"h%d: v\r\n" % i for i in range(500)) + b"\r\n",
    b"POST /v1/tables/kv/keys:batchGet HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n{",
    b"POST /v1/tables/kv/keys:batchGet HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
    b"zz\r\n",
    b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n" * 50,  # pipelined
    b"GET /v1/tables/kv/keys/k1 HTTP/1.1\r\nhost: x\r\n",  # never finished
]


def test_raw_http_garbage_never_stops_the_node(two_nodes) -> None:  # type: ignore[no-untyped-def]
    nodes, _, mode = two_nodes
    if mode != "auth-off":
        pytest.skip("a request is parsed before its token is read: once is enough")
    node = nodes[0]
    host, port = node.url.split("://")[1].split(":")
    for case in RAW_CASES:
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(case)
            s.settimeout(2)
            try:
                while s.recv(65536):
                    pass
            except (TimeoutError, ConnectionResetError):
                pass
        assert node.get("/healthz").status_code == 200, case[:60]
    assert node.proc.poll() is None
