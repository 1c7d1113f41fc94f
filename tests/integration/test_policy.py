"""Authorization policy (--auth-policy) on real nodes: a caller reads only granted rows on every
route, from either node (forwarded reads and fan-outs included), and neither a forged hop
header nor a peer's cluster secret gets around it; rate limits, offset-wait caps, auth on
/metrics, and a slowloris client that does not starve the others."""

from __future__ import annotations

import resource
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import jwt
import orjson
import pytest

from tablecast import serde
from tablecast.cluster.signing import Signer
from tablecast.query.peer_pool import SIGNATURE, signed_parts

from ..support.procs import NodeProcess, eventually, start_node, stop_all
from .kafka_io import produce
from .tables import TableModel, make_table, write_windows

pytestmark = pytest.mark.integration

SECRET = "policy-tests-secret-0123456789abcdef0123"
POLICY = """
rules:
  - tables:                      # everyone: their own rows
      kv: {key_prefix: "{sub}/"}
      win: {key_prefix: "{sub}"}
  - match: {role: admin}
    tables: {"*": "*"}
  - match: {groups: auditors}    # a list claim that contains it
    tables: {audit: "*"}
"""
USERS = ("alice", "bob", "carol", "al")  # "al" is a prefix of "alice": grants end in "/"


def token(**claims: Any) -> dict[str, str]:
    body = {"exp": int(time.time() + 86_400), **claims}  # made at collection; the suite runs long
    return {"authorization": f"Bearer {jwt.encode(body, SECRET, algorithm='HS256')}"}


ALICE, BOB = token(sub="alice"), token(sub="bob")
AL = token(sub="al")
ADMIN = token(sub="root", role="admin")
AUDITOR = token(sub="aud", groups=["staff", "auditors"])
NOBODY = token(role="user")  # no sub: the {sub} grants give nothing


def _rows(model: TableModel, user: str | None = None) -> dict[str, Any]:
    return {
        k.decode(): v
        for k, v in sorted(model.rows.items())
        if user is None or k.decode().startswith(user + "/")
    }


def _policy_file(tmp_path: Path) -> str:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    return str(path)


def _both_serve(nodes: list[NodeProcess], key: str, headers: dict[str, str]) -> None:
    """Wait until the cluster's ownership settled: both nodes name one owner for `key`, and
    both count the whole table (every partition has a ready replica: two nodes started
    together can leave one without for a moment after both report ready, a known gap), and
    each node answers for some of kv's partitions, none of them still warming (on a slow
    machine the first node holds them all for a while)."""

    def settled() -> bool:
        served = {
            n.get(f"/v1/tables/kv/keys/{key}", headers=headers).headers.get("x-tablecast-node")
            for n in nodes
        }
        counted = all(
            n.get("/v1/tables/kv/count", headers=headers).status_code == 200 for n in nodes
        )
        view = nodes[0].get("/v1/cluster", headers=headers).json()["nodes"]
        roles = [{r["role"] for r in v["replicas"] if r["table"] == "kv"} for v in view]
        split = len(view) == 2 and all("active" in r and "warming" not in r for r in roles)
        return len(served) == 1 and None not in served and counted and split

    eventually(settled, timeout=60)


@pytest.fixture(scope="module")
def cluster(bootstrap: str, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    app = f"policy{time.monotonic_ns() % 10**8}"
    tmp = tmp_path_factory.mktemp("policy")
    kv = make_table(bootstrap, app, "kv", 6, serde.string(), serde.json())
    kv.write(bootstrap, [(f"{u}/{i:02d}", {"u": u, "i": i}) for u in USERS for i in range(15)])
    audit = make_table(bootstrap, app, "audit", 2, serde.string(), serde.json(), store="memory")
    audit.write(bootstrap, [(f"e{i}", {"event": i}) for i in range(5)])
    win = make_table(
        bootstrap, app, "win", 3, serde.string(), serde.json(), kind="window",
        extra={"size_ms": 60_000},
    )  # fmt: skip
    base = 1_700_000_000_000
    write_windows(
        bootstrap, win, [(u, base + 60_000 * i, i) for u in ("alice", "bob") for i in range(3)]
    )
    args = ("--auth-jwt-secret", SECRET, "--auth-policy", _policy_file(tmp))
    nodes = [start_node(app, bootstrap, tmp, *args) for _ in range(2)]
    try:
        for n in nodes:
            n.wait_ready()
            n.headers = ADMIN  # for the cluster view wait_caught_up reads
            n.wait_caught_up(bootstrap, "win", win.info.topic)
            n.headers = {}
        _both_serve(nodes, "alice/01", ADMIN)
        yield nodes, kv, audit
    finally:
        stop_all(nodes)


def test_key_reads_answer_only_granted_keys_on_every_node(cluster) -> None:  # type: ignore[no-untyped-def]
    nodes, kv, _ = cluster
    readers = set()
    for key, value in _rows(kv, "alice").items():
        for n in nodes:
            r = n.get(f"/v1/tables/kv/keys/{key}", headers=ALICE)
            assert r.status_code == 200 and r.json()["value"] == value, r.text
            readers.add(r.headers["x-tablecast-node"])
            r = n.get("/v1/tables/kv/keys", params={"key": key}, headers=ALICE)
            assert r.status_code == 200
    assert len(readers) == 2  # half of them were forwarded, and answered by their owner
    for key in [*_rows(kv, "bob"), *_rows(kv, "al"), "alice", "alic", "bob/99"]:
        for n in nodes:
            r = n.get(f"/v1/tables/kv/keys/{key}", headers=ALICE)
            assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", (key, r.text)
            assert "value" not in r.text
    # a missing key inside the grant is a 404; a table without any grant is a 403 whether or
    # not it exists, so a caller cannot learn which tables there are
    assert nodes[0].get("/v1/tables/kv/keys/alice/99", headers=ALICE).status_code == 404
    for table in ("audit", "nope"):
        r = nodes[1].get(f"/v1/tables/{table}/keys/e1", headers=ALICE)
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
    assert nodes[1].get("/v1/tables/nope/keys/e1", headers=ADMIN).status_code == 404
    assert nodes[1].get("/v1/tables/audit/keys/e1", headers=AUDITOR).json()["value"] == {"event": 1}
    assert nodes[0].get("/v1/tables/kv/keys/bob/03", headers=ADMIN).json()["value"]["u"] == "bob"
    for n in nodes:  # no sub: its one grant on kv cannot be filled, so kv is not granted
        assert n.get("/v1/tables/kv/keys/alice/01", headers=NOBODY).status_code == 403


def test_batch_get_marks_keys_outside_the_grants_forbidden(cluster) -> None:  # type: ignore[no-untyped-def]
    nodes, kv, _ = cluster
    keys = ["alice/01", "bob/01", "alice/99", "carol/02", "al/00", *_rows(kv, "alice")]
    for n in nodes:
        r = httpx.post(
            f"{n.url}/v1/tables/kv/keys:batchGet", json={"keys": keys}, headers=ALICE, timeout=10
        )
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert [x["key"] for x in results] == keys
        for item in results:
            if item["key"].startswith("alice/"):
                want = kv.rows.get(item["key"].encode())
                assert item == (
                    {"key": item["key"], "found": True, "value": want}
                    if want is not None
                    else {"key": item["key"], "found": False}
                )
            else:
                assert item == {"key": item["key"], "found": False, "forbidden": True}
        r = httpx.post(
            f"{n.url}/v1/tables/audit/keys:batchGet", json={"keys": ["e1"]}, headers=ALICE
        )
        assert r.status_code == 403


def _scan(node: NodeProcess, headers: dict[str, str], **params: Any) -> list[tuple[str, Any]]:
    """Every page of a range, following cursors."""
    out: list[tuple[str, Any]] = []
    cursor = None
    while True:
        q = {**params, **({"cursor": cursor} if cursor else {})}
        r = node.get("/v1/tables/kv/range", params=q, headers=headers)
        assert r.status_code == 200, r.text
        body = r.json()
        out += [(x["key"], x["value"]) for x in body["items"]]
        cursor = body["next_cursor"]
        if cursor is None:
            return out


def test_range_and_count_never_reveal_hidden_rows(cluster) -> None:  # type: ignore[no-untyped-def]
    nodes, kv, _ = cluster
    alice = list(_rows(kv, "alice").items())
    for n in nodes:
        assert _scan(n, ALICE) == alice
        assert _scan(n, ALICE, limit=4) == alice  # pages across partitions and nodes
        assert _scan(n, ALICE, limit=1, prefix="alice/0") == alice[:10]
        assert _scan(n, ALICE, prefix="a") == alice  # "al/…" shares the "a" but is not hers
        assert _scan(n, ALICE, prefix="bob/") == []
        assert _scan(n, ALICE, **{"from": "a", "to": "z"}) == alice
        assert _scan(n, ALICE, **{"from": "alice/05", "to": "bob/05"}) == alice[5:]
        assert _scan(n, AL) == list(_rows(kv, "al").items())
        assert _scan(n, ADMIN) == list(_rows(kv).items())
        assert _scan(n, AUDITOR) == []  # granted "aud/", which holds nothing
        assert n.get("/v1/tables/kv/count", headers=ALICE).json() == {"count": len(alice)}
        assert n.get("/v1/tables/kv/count", headers=AUDITOR).json() == {"count": 0}
        assert n.get("/v1/tables/kv/count", headers=ADMIN).json() == {"count": len(kv.rows)}
        assert n.get("/v1/tables/audit/count", headers=AUDITOR).json() == {"count": 5}
        for route in ("range", "count"):
            assert n.get(f"/v1/tables/audit/{route}", headers=ALICE).status_code == 403
            assert n.get(f"/v1/tables/kv/{route}", headers=NOBODY).status_code == 403


def test_windows_metadata_and_listings_follow_the_grants(cluster) -> None:  # type: ignore[no-untyped-def]
    nodes, _, _ = cluster
    for n in nodes:
        r = n.get("/v1/tables/win/keys/alice/windows", headers=ALICE)
        assert r.status_code == 200 and [w["value"] for w in r.json()["items"]] == [0, 1, 2]
        assert n.get("/v1/tables/win/keys/bob/windows", headers=ALICE).status_code == 403
        assert (
            n.get("/v1/tables/win/windows", params={"key": "bob"}, headers=ALICE).status_code == 403
        )
        assert n.get("/v1/tables/kv/keys/alice/01/metadata", headers=ALICE).status_code == 200
        for path in ("/v1/tables/kv/keys/bob/01/metadata", "/v1/tables/audit/keys/e1/metadata"):
            r = n.get(path, headers=ALICE)
            assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"

        for who, tables in (
            (ALICE, {"kv", "win"}),
            (AUDITOR, {"kv", "win", "audit"}),
            (ADMIN, {"kv", "win", "audit"}),
            (NOBODY, set()),
        ):
            listed = n.get("/v1/tables", headers=who).json()["tables"]
            assert {t["name"] for t in listed} == tables
        shown = {
            r["table"]
            for node in n.get("/v1/cluster", headers=ALICE).json()["nodes"]
            for r in node["replicas"]
        }
        assert shown == {"kv", "win"}


def test_internal_routes_and_forged_hops_apply_the_callers_grants(cluster) -> None:  # type: ignore[no-untyped-def]
    """Without a cluster secret anyone may call the internal routes or claim to be a
    forwarded request: the reading node still applies the caller's own grants."""
    nodes, kv, _ = cluster
    seen: dict[str, Any] = {}
    counted = 0
    for p in range(6):
        for n in nodes:
            r = n.get(
                "/internal/tables/kv/scan", params={"partitions": p, "limit": 1000}, headers=ALICE
            )
            if r.status_code != 200:
                continue  # this node does not hold partition p
            seen.update((bytes.fromhex(k).decode(), v) for k, v in r.json()["items"])
            counted += n.get(
                "/internal/tables/kv/count", params={"partitions": p}, headers=ALICE
            ).json()["count"]
            break
    assert seen == _rows(kv, "alice") and counted == len(seen)
    assert nodes[0].get("/internal/tables/kv/scan", params={"partitions": 0}).status_code == 401
    hop = {"x-tablecast-hop": "1"}
    for n in nodes:
        r = n.get("/v1/tables/kv/keys/bob/01", headers={**ALICE, **hop})
        assert r.status_code == 403
        r = n.get("/v1/tables/kv/range", params={"limit": 1000}, headers={**ALICE, **hop})
        # answered from this node's own partitions only (a hop is never forwarded again)
        assert r.status_code in (200, 503)
        if r.status_code == 200:
            assert all(x["key"].startswith("alice/") for x in r.json()["items"])


def test_a_peer_with_the_cluster_secret_gets_only_the_callers_rows(
    bootstrap: str, unique: str, logs: Path, tmp_path: Path
) -> None:
    kv = make_table(bootstrap, unique, "kv", 4, serde.string(), serde.json(), store="memory")
    kv.write(bootstrap, [(f"{u}/{i}", {"i": i}) for u in USERS for i in range(6)])
    cluster_secret = "cluster-secret-for-policy-tests-0123456789"
    args = ("--auth-jwt-secret", SECRET, "--auth-policy", _policy_file(tmp_path))
    nodes = [
        start_node(unique, bootstrap, logs, *args, "--cluster-secret", cluster_secret)
        for _ in range(2)
    ]
    try:
        for n in nodes:
            n.wait_ready()
        _both_serve(nodes, "alice/1", ADMIN)
        for n in nodes:  # forwarding (signed hops) still works, and still filters
            assert [k for k, _ in _scan(n, ALICE)] == list(_rows(kv, "alice"))
            forged = n.get("/v1/tables/kv/keys/alice/1", headers={**ALICE, "x-tablecast-hop": "1"})
            assert forged.status_code == 403  # not signed: refused before any read
        # a peer (anyone holding the cluster secret) signs an internal scan of every partition
        peer = Signer(cluster_secret)
        rows: dict[str, Any] = {}
        for n in nodes:
            for p in range(4):
                target = f"/internal/tables/kv/scan?partitions={p}&limit=100"
                for auth in (ALICE, {}):
                    sig = {SIGNATURE: peer.sign(*signed_parts("GET", target, b""))}
                    r = httpx.get(n.url + target, headers={**auth, **sig})
                    if not auth:
                        assert r.status_code == 401  # the secret is no token
                    elif r.status_code == 200:
                        rows.update((bytes.fromhex(k).decode(), v) for k, v in r.json()["items"])
        assert rows == _rows(kv, "alice")
    finally:
        stop_all(nodes)


def test_rate_limits_wait_caps_and_auth_on_metrics(
    bootstrap: str, unique: str, logs: Path, tmp_path: Path
) -> None:
    kv = make_table(bootstrap, unique, "kv", 2, serde.string(), serde.json(), store="memory")
    kv.write(bootstrap, [("alice/1", {"v": 1}), ("bob/1", {"v": 1})])
    node = start_node(
        unique, bootstrap, logs,
        "--auth-jwt-secret", SECRET, "--auth-policy", _policy_file(tmp_path),
        "--rate-limit", "5", "--max-waits", "2", "--auth-metrics",
    )  # fmt: skip
    try:
        node.wait_ready()  # /readyz answers its status without a token
        eventually(lambda: node.get("/v1/tables/kv/keys/bob/1", headers=BOB).status_code == 200)
        time.sleep(1)  # bob's bucket refills
        # the burst (5) goes through, then 429 with Retry-After; bob has his own bucket
        with httpx.Client(base_url=node.url, headers=ALICE) as client:
            started = time.monotonic()
            answers = [client.get("/v1/tables/kv/keys/alice/1") for _ in range(40)]
            took = time.monotonic() - started
        limited = [r for r in answers if r.status_code == 429]
        # at most the burst plus what refilled meanwhile got through
        assert answers[0].status_code == 200 and len(answers) - len(limited) <= 5 + 5 * took + 1
        assert limited
        assert all(r.status_code in (200, 429) for r in answers)
        assert limited[0].json()["error"]["code"] == "rate_limited"
        retry = int(limited[0].headers["retry-after"])
        assert 1 <= retry <= 2
        assert node.get("/v1/tables/kv/keys/bob/1", headers=BOB).status_code == 200
        time.sleep(retry)
        assert node.get("/v1/tables/kv/keys/alice/1", headers=ALICE).status_code == 200
        assert node.get("/healthz").status_code == 200  # probes are not rate limited

        # min_offset waits: at most 2 of alice's at once, woken as soon as the offset lands
        raw = b"alice/1"
        partition = kv.info.partition_of(raw)
        next_offset = sum(kv.info.partition_of(k) == partition for k in kv.rows)
        target = f"/v1/tables/kv/keys/alice/1?min_offset={partition}:{next_offset}&timeout_ms=20000"
        time.sleep(1.5)  # a fresh bucket for the three waits below
        results: list[tuple[int, float]] = []

        def wait() -> None:
            r = httpx.get(node.url + target, headers=ALICE, timeout=30)
            results.append((r.status_code, time.monotonic()))

        waiters = [threading.Thread(target=wait) for _ in range(3)]
        for t in waiters:
            t.start()
            time.sleep(0.2)
        time.sleep(0.5)
        assert [code for code, _ in results] == [429]  # the third one, at once
        produce(bootstrap, kv.info.topic, [(raw, orjson.dumps({"v": 2}))])
        produced = time.monotonic()
        for t in waiters:
            t.join(30)
        assert sorted(code for code, _ in results) == [200, 200, 429]
        woke = max(at for code, at in results if code == 200) - produced
        assert woke < 3.0  # applied and answered; no waiting out the 20 s timeout
        again = node.get(target, headers=ALICE)  # already applied: no wait, no slot
        assert again.json()["value"] == {"v": 2}

        # /metrics needs a token; /readyz without one says only whether the node is ready
        assert node.get("/metrics").status_code == 401
        metrics = node.get("/metrics", headers=BOB)
        assert metrics.status_code == 200
        assert 'tablecast_rate_limited_total{limit="rate"}' in metrics.text
        assert 'tablecast_rate_limited_total{limit="waits"} 1.0' in metrics.text
        assert node.get("/readyz").json() == {"ready": True}
        assert "restoring" in node.get("/readyz", headers=BOB).json()
        assert node.get("/readyz", headers={"authorization": "Bearer nope"}).status_code == 401

        # made-up tokens count against the client's address before they cost a check
        with httpx.Client(base_url=node.url) as client:
            codes = [
                client.get("/v1/tables", headers={"authorization": f"Bearer x{i}"}).status_code
                for i in range(30)
            ]
        assert set(codes) == {401, 429} and codes[0] == 401
    finally:
        node.stop()


def test_the_policy_refuses_to_start_without_auth_or_with_a_bad_file(tmp_path: Path) -> None:
    policy = _policy_file(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - tables: {kv: everything}\n")
    for extra, says in (
        (["--auth-policy", policy], "--auth-policy needs --auth-jwt-secret or --auth-jwks"),
        (["--auth-jwt-secret", SECRET, "--auth-policy", str(bad)], f"{bad}: rule 1: tables.kv"),
        (["--auth-metrics"], "--auth-metrics needs"),
        (["--auth-jwt-secret", SECRET, "--rate-limit", "0"], "--rate-limit is a positive"),
    ):
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "tablecast.cli.main", "serve", "--app", "x", *extra],
            capture_output=True,
            text=True,
            timeout=60,
            # an unreachable broker: the settings are refused before Kafka is asked
            env={"TABLECAST_BOOTSTRAP_SERVERS": "127.0.0.1:1", "PATH": "/usr/bin:/bin"},
        )
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("tablecast: error: ") and says in lines[0]
        assert time.monotonic() - started < 20


def test_a_slowloris_client_does_not_starve_the_others(
    bootstrap: str, unique: str, logs: Path
) -> None:
    """3000 connections that send nothing or half a request head — more than granian's own
    default cap of 1024, at which a node stopped answering anyone (measured) — while a
    normal client keeps being answered; the half-sent ones are closed after 10 s."""
    kv = make_table(bootstrap, unique, "kv", 2, serde.string(), serde.json(), store="memory")
    kv.write(bootstrap, [("k", {"v": 1})])
    node = start_node(unique, bootstrap, logs)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 8000 <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (8000, hard))
    held: list[socket.socket] = []
    try:
        node.wait_ready()
        host, port = node.url.split("://")[1].split(":")
        for i in range(3000):
            s = socket.create_connection((host, int(port)), timeout=5)
            if i % 2:
                s.sendall(b"GET /v1/tables/kv/keys/k HTTP/1.1\r\nhost: x\r\n")  # never ends
            held.append(s)
        for _ in range(10):
            started = time.monotonic()
            r = httpx.get(f"{node.url}/v1/tables/kv/keys/k", timeout=5)
            assert r.status_code == 200 and time.monotonic() - started < 2.0
        half_sent = held[1]
        half_sent.settimeout(30)
        started = time.monotonic()
        assert half_sent.recv(100) == b""  # closed by the node, not answered
        assert time.monotonic() - started < 15
    finally:
        for s in held:
            s.close()
        if soft < 8000 <= hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        node.stop()
