"""JWT auth on two nodes: every /v1 request needs a valid bearer token, and a forwarded
request carries the caller's token to the owner, which checks it again."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

import tablecast as tc
from tablecast import serde

from ..support.procs import eventually, start_node, stop_all
from .tables import make_table

pytestmark = pytest.mark.integration

SECRET = "s3cret-for-tests-only-0123456789abcdef"


def token(secret: str = SECRET, ttl: float = 300) -> str:
    return jwt.encode({"sub": "tester", "exp": int(time.time() + ttl)}, secret, algorithm="HS256")


def test_hs256_on_two_nodes_and_forwarding(bootstrap: str, unique: str, logs: Path) -> None:
    model = make_table(bootstrap, unique, "kv", 6, serde.string(), serde.json())
    model.write(bootstrap, [(f"k{i}", {"i": i}) for i in range(60)])
    nodes = [start_node(unique, bootstrap, logs, "--auth-jwt-secret", SECRET) for _ in range(2)]
    try:
        for n in nodes:
            n.wait_ready()
        good = {"authorization": f"Bearer {token()}"}

        def both_serve() -> bool:
            served = {
                n.get("/v1/tables/kv/keys/k1", headers=good).headers.get("x-tablecast-node")
                for n in nodes
            }
            return len(served) == 1 and None not in served

        eventually(both_serve, timeout=30)
        owners = set()
        for i in range(60):
            for n in nodes:
                r = n.get(f"/v1/tables/kv/keys/k{i}", headers=good)
                assert r.status_code == 200 and r.json()["value"] == {"i": i}
                owners.add(r.headers["x-tablecast-node"])
        assert len(owners) == 2  # so half the reads above were forwarded, token and all
        for bad in (
            {},
            {"authorization": "Bearer nope"},
            {"authorization": f"Bearer {token(ttl=-10)}"},
            {"authorization": f"Bearer {token(secret='another-secret-0123456789abcdef')}"},
        ):
            r = nodes[0].get("/v1/tables/kv/keys/k1", headers=bad)
            assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
        assert nodes[0].get("/healthz").status_code == 200  # probes need no token
        with tc.Client([n.url for n in nodes], token=token()) as client:
            assert client.get("kv", "k7")["value"] == {"i": 7}
            assert client.count("kv") == 60
    finally:
        stop_all(nodes)


def test_a_token_goes_on_while_auth_is_turned_on_node_by_node(
    bootstrap: str, unique: str, logs: Path
) -> None:
    """A node without auth forwards a client's token with its reads, however often the same
    read comes (a read sent again may take a shorter way): an owner with auth on answers a
    client that sends one, and refuses one that does not."""
    model = make_table(bootstrap, unique, "kv", 6, serde.string(), serde.json())
    model.write(bootstrap, [(f"k{i}", {"i": i}) for i in range(30)])
    open_node = start_node(unique, bootstrap, logs)
    secured = start_node(unique, bootstrap, logs, "--auth-jwt-secret", SECRET)
    try:
        for n in (open_node, secured):
            n.wait_ready()
        good = {"authorization": f"Bearer {token()}"}

        def theirs() -> list[str]:
            # once the partitions are split: before that, the node that was ready first holds
            # them all, and a key seen on the secured node may move to the open one
            view = open_node.get("/v1/cluster").json()["nodes"]
            roles = [{r["role"] for r in n["replicas"] if r["table"] == "kv"} for n in view]
            if len(view) != 2 or not all("active" in r and "warming" not in r for r in roles):
                return []
            found = []
            for i in range(30):
                r = open_node.get(f"/v1/tables/kv/keys/k{i}/metadata")
                active = r.json()["active"] if r.status_code == 200 else None
                if active is None:
                    return []  # still assigning
                if active["url"] == secured.url:
                    found.append(f"k{i}")
            return found

        keys = eventually(theirs, timeout=60)
        with httpx.Client(base_url=open_node.url, timeout=10) as client:  # one connection
            for key in keys:
                for _ in range(4):
                    r = client.get(f"/v1/tables/kv/keys/{key}", headers=good)
                    assert r.status_code == 200, (key, r.text)
                    assert r.json()["value"] == {"i": int(key[1:])}
                r = client.get(f"/v1/tables/kv/keys/{key}")
                assert r.status_code == 401, (key, r.text)
    finally:
        stop_all((open_node, secured))


def test_jwks_file(bootstrap: str, unique: str, logs: Path, tmp_path: Path) -> None:
    model = make_table(bootstrap, unique, "kv", 2, serde.string(), serde.json(), store="memory")
    model.write(bootstrap, [("a", {"v": 1})])
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [{**public, "kid": "k1", "alg": "RS256", "use": "sig"}]}))
    node = start_node(unique, bootstrap, logs, "--auth-jwks", str(jwks))
    try:
        node.wait_ready()
        signed = jwt.encode(
            {"exp": int(time.time()) + 60}, key, algorithm="RS256", headers={"kid": "k1"}
        )
        r = httpx.get(
            f"{node.url}/v1/tables/kv/keys/a", headers={"authorization": f"Bearer {signed}"}
        )
        assert r.status_code == 200 and r.json()["value"] == {"v": 1}
        r = httpx.get(
            f"{node.url}/v1/tables/kv/keys/a", headers={"authorization": f"Bearer {token()}"}
        )
        assert r.status_code == 401
    finally:
        node.stop()
