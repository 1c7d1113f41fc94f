"""HTTPS between nodes and trusted peers: nodes serve TLS and call each other over
it, verified against the cluster's CA; with a cluster secret, internal routes and forwarded
requests answer only signed calls — an unsigned, replayed or wrongly signed call gets 403."""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx
import psycopg
import pytest

import tablecast as tc
from tablecast import serde
from tablecast.cluster.signing import Signer
from tablecast.kafka.broker import free_port
from tablecast.kafka.secure import make_certificates
from tablecast.query.peer_pool import SIGNATURE, signed_parts

from ..support.procs import NodeProcess, eventually, start_node, stop_all
from .tables import make_table

pytestmark = pytest.mark.integration

SECRET = "cluster-secret-for-tests-0123456789"
KEYS = 60


def certificate_files(tmp: Path, hosts: list[str]) -> tuple[str, str, str]:
    """A CA, and a certificate for `hosts` it signed, as files: (ca, cert, key)."""
    ca_pem, bundle = make_certificates(hosts)
    blocks = ["-----BEGIN" + b for b in bundle.split("-----BEGIN")[1:]]
    key_pem, cert_pem = blocks[0], "".join(blocks[1:])
    paths = []
    for name, text in (("ca.pem", ca_pem), ("node.pem", cert_pem), ("node.key", key_pem)):
        (tmp / name).write_text(text)
        paths.append(str(tmp / name))
    return paths[0], paths[1], paths[2]


@pytest.fixture
def tls_cluster(bootstrap: str, unique: str, logs: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    ca, cert, key = certificate_files(tmp_path, ["127.0.0.1"])
    model = make_table(bootstrap, unique, "kv", 6, serde.string(), serde.json())
    model.write(bootstrap, [(f"k{i}", {"i": i}) for i in range(KEYS)])
    tls = ["--tls-cert", cert, "--tls-key", key, "--tls-ca", ca, "--cluster-secret", SECRET]
    # the first node speaks SQL too, over TLS with the same certificate
    nodes = [
        start_node(unique, bootstrap, logs, *tls, *pg)
        for pg in (["--pg-port", str(free_port())], [])
    ]
    try:
        for n in nodes:
            n.verify = ssl.create_default_context(cafile=ca)
            n.wait_ready()
        yield nodes, ca
    finally:
        stop_all(nodes)


def test_nodes_forward_over_https(tls_cluster: tuple[list[NodeProcess], str]) -> None:
    nodes, ca = tls_cluster

    def both_assigned() -> bool:
        served = {n.get("/v1/tables/kv/keys/k1").headers.get("x-tablecast-node") for n in nodes}
        return len(served) == 1 and None not in served

    eventually(both_assigned, timeout=30)

    def every_key_from_both() -> set[str]:
        # the two nodes started together: their first assignment settles before every
        # partition has a ready replica (a 503 meanwhile), which is not what this tests
        answered_by = set()
        for i in range(KEYS):
            for n in nodes:
                r = n.get(f"/v1/tables/kv/keys/k{i}")
                assert r.status_code == 200 and r.json()["value"] == {"i": i}, r.text
                answered_by.add(r.headers["x-tablecast-node"])
        return answered_by

    answered_by = eventually(every_key_from_both, timeout=60)
    assert len(answered_by) == 2  # half the reads above were forwarded, over HTTPS, signed
    page = nodes[0].get("/v1/tables/kv/range", params={"limit": 1000}).json()
    assert len(page["items"]) == KEYS  # the fan-out's internal scans are signed too
    with tc.Client([n.url for n in nodes], verify=ca) as client:
        assert client.get("kv", "k7")["value"] == {"i": 7}
    with pytest.raises(httpx.ConnectError):  # a client that does not trust the CA
        httpx.get(nodes[0].url + "/healthz", timeout=5)
    # SQL on the first node: its reads of the other's partitions go over HTTPS, signed
    pg_port = nodes[0].proc.args[nodes[0].proc.args.index("--pg-port") + 1]  # type: ignore[union-attr]
    dsn = (
        f"host=127.0.0.1 port={pg_port} dbname=tablecast user=peer "
        f"sslmode=verify-full sslrootcert={ca}"
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        keys = [f"k{i}" for i in range(KEYS)]
        for key in keys:
            row = conn.execute("SELECT value FROM kv WHERE key = %s", (key,)).fetchone()
            assert row == ({"i": int(key[1:])},), key
        whole = conn.execute("SELECT key FROM kv ORDER BY key").fetchall()
        assert sorted(k for (k,) in whole) == sorted(keys)


def test_internal_calls_need_a_peer_signature(tls_cluster: tuple[list[NodeProcess], str]) -> None:
    nodes, _ = tls_cluster
    node = nodes[0]

    def held() -> list[int]:
        me = node.get("/healthz").headers.get("x-tablecast-node") or node.url.split("://")[1]
        cluster = node.get("/v1/cluster").json()["nodes"]
        mine = [n for n in cluster if n["id"] == me or n["url"] == node.url]
        return sorted(r["partition"] for n in mine for r in n["replicas"] if r["role"] == "active")

    parts = eventually(held, timeout=30)
    scan = f"/internal/tables/kv/scan?partitions={','.join(map(str, parts))}&limit=10"

    def call(target: str, headers: dict[str, str]) -> httpx.Response:
        return node.get(target, headers=headers)

    unsigned = call(scan, {})
    assert unsigned.status_code == 403
    assert unsigned.json()["error"]["code"] == "forbidden"
    # a client cannot claim to be a forwarding peer
    assert call("/v1/tables/kv/keys/k1", {"x-tablecast-hop": "1"}).status_code == 403
    wrong = Signer("not-the-cluster-secret").sign(*signed_parts("GET", scan, b""))
    assert call(scan, {SIGNATURE: wrong}).status_code == 403
    good = Signer(SECRET).sign(*signed_parts("GET", scan, b""))
    first = call(scan, {SIGNATURE: good})
    assert first.status_code == 200 and first.json()["items"]
    assert call(scan, {SIGNATURE: good}).status_code == 403  # the same signature replayed
    other = Signer(SECRET).sign(*signed_parts("GET", scan.replace("limit=10", "limit=99"), b""))
    assert call(scan, {SIGNATURE: other}).status_code == 403  # signed for another target
