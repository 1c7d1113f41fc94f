"""Forwarded reads that leave together go to their owner as one signed batch, and each
answer is the one the owner gives that read alone (tablecast.query.coalesce)."""

from __future__ import annotations

import asyncio
import re
import struct
from collections import Counter
from pathlib import Path
from urllib.parse import quote

import httpx
import orjson
import pytest

from tablecast import serde
from tablecast.cluster.signing import Signer
from tablecast.query.coalesce import ANSWERS_PATH, BATCH_PATH
from tablecast.query.consistency import AFTER_HEADER
from tablecast.query.peer_pool import PeerPool
from tablecast.query.request import HOP

from ..support.procs import NodeProcess, eventually, start_node, stop_all
from .tables import make_table

pytestmark = pytest.mark.integration

PARTITIONS = 12
SECRET = "coalesce-cluster-secret-0123456789abcdef"
#: keys a batch must carry through: reserved and non-ASCII characters in the path
ODD = ["a/b", "with space", "ünïcödé", "percent%41", "q?x=1", "hash#tag"]


def _batches(node: NodeProcess) -> int:
    """How many batches `node` answered with 200 (its /metrics)."""
    text = node.get("/metrics").text
    found = re.search(
        r'tablecast_http_requests_total\{route="internal_batch",status="200"\} (\S+)', text
    )
    return int(float(found.group(1))) if found else 0


def _owner(node: NodeProcess, key: str) -> str | None:
    r = node.get(f"/v1/tables/kv/keys/{quote(key, safe='')}/metadata")
    assert r.status_code == 200, r.text
    # no active replica for a moment while the second node takes its partitions over
    active = r.json()["active"]
    return active["url"] if active else None


async def _read_all(url: str, paths: list[str]) -> list[httpx.Response]:
    # many connections at once: the forwarder has many reads for one peer in flight
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as http:
        return await asyncio.gather(*(http.get(p) for p in paths))


#: what a forwarded answer says as the owner's own does (the table does not change meanwhile)
SAME_HEADERS = ("content-type", "x-tablecast-node", "x-tablecast-position")


def _same(forwarded: httpx.Response, direct: httpx.Response) -> bool:
    def said(r: httpx.Response) -> tuple[object, ...]:
        return (r.status_code, r.json(), *(r.headers.get(h) for h in SAME_HEADERS))

    return said(forwarded) == said(direct)


def _signed_batch(
    node: NodeProcess, route: str, paths: list[str], headers: list[tuple[str, str]]
) -> bytes:
    """The body of `node`'s answer to a batch of `paths` signed as a peer signs it."""

    async def ask() -> bytes:
        pool = PeerPool(signer=Signer(SECRET))
        try:
            # not a peer's own 2 s bound: what is checked here is the answer, and a machine
            # the whole suite loads can take longer to give it
            status, _, data = await pool.request(
                node.url, "POST", route, [(HOP, "1"), *headers], orjson.dumps(paths), timeout=30
            )
        finally:
            pool.close()
        assert status == 200, data
        return data

    return asyncio.run(ask())


def _framed_apart(node: NodeProcess, paths: list[str]) -> list[tuple[int, bytes]]:
    """Each read's status and body as `node` answers a signed batch of the version before
    (BATCH_PATH: status, header lines and body framed apart)."""
    data, at, out = _signed_batch(node, BATCH_PATH, paths, []), 0, []
    for _ in paths:
        status, head, size = struct.unpack_from("!HII", data, at)
        at += 10 + head
        out.append((status, data[at : at + size]))
        at += size
    assert at == len(data)
    return out


def _statuses(data: bytes, reads: int) -> list[int]:
    """Each read's status in an answer framed as whole responses (ANSWERS_PATH)."""
    at, out = 0, []
    for _ in range(reads):
        status, size = struct.unpack_from("!HI", data, at)
        out.append(status)
        at += 6 + size
    assert at == len(data)
    return out


def _paths(keys: list[str]) -> list[str]:
    """Reads of these keys: plain, by ?key= with an option, and their history."""
    plain = [f"/v1/tables/kv/keys/{quote(k, safe='')}" for k in keys]
    by_query = [f"/v1/tables/kv/keys?key={quote(k, safe='')}&max_lag=0" for k in keys[:20]]
    return plain + by_query + [f"{p}/history" for p in plain[:5]]


def _compare(nodes: list[NodeProcess], to: dict[str, list[str]], together: bool) -> None:
    """Each node's reads of keys another node owns (`to`: owner URL -> paths) against the
    owner's own answers; `together`: all at once, else one by one (no batch)."""
    for asked in nodes:
        owner = next(n for n in nodes if n is not asked)
        paths = to[owner.url]
        if together:
            forwarded = asyncio.run(_read_all(asked.url, paths))
        else:
            forwarded = [asked.get(p) for p in paths]
        direct = asyncio.run(_read_all(owner.url, paths))
        wrong = [
            (asked.url, p, f.status_code, f.text, d.status_code, d.text)
            for p, f, d in zip(paths, forwarded, direct, strict=True)
            if not _same(f, d)
        ]
        assert not wrong, wrong[:5]
        assert not together or {f.status_code for f in forwarded} >= {200, 404}


@pytest.mark.parametrize("engine", ["loop", "granian"])
def test_reads_forwarded_together_answer_as_alone(
    bootstrap: str, unique: str, logs: Path, engine: str
) -> None:
    """On both HTTP engines: the loop engine writes a forwarded answer's whole response as
    it came, granian is given its headers as pairs; a forwarder of the version before
    (its batches framed apart) is answered too."""
    keys = [f"key-{i}" for i in range(300)] + ODD
    model = make_table(bootstrap, unique, "kv", PARTITIONS, serde.string(), serde.json())
    model.write(bootstrap, [(k, {"k": k, "n": i}) for i, k in enumerate(keys)])
    args = ("--cluster-secret", SECRET, "--http-engine", engine)
    nodes = [start_node(unique, bootstrap, logs, *args) for _ in range(2)]
    try:
        for node in nodes:
            node.wait_ready()
        a, b = nodes

        # every key read through the node that does not own it; keys that do not exist too
        missing = [f"missing-{i}" for i in range(40)]
        owners: dict[str, str | None] = {}

        def owners_split() -> bool:
            owners.update((k, _owner(a, k)) for k in keys + missing)
            return set(owners.values()) == {a.url, b.url}

        eventually(owners_split, timeout=60)

        def handed_over() -> bool:
            """Each partition held by its owner alone: until the node that held them all
            releases the ones it handed over, it answers their max_lag=0 reads itself."""
            held = Counter(
                (r["table"], r["partition"])
                for n in a.get("/v1/cluster").json()["nodes"]
                for r in n["replicas"]
            )
            return sorted(held.values()) == [1] * PARTITIONS

        eventually(handed_over, timeout=60)
        owned: dict[str, list[str]] = {a.url: [], b.url: []}
        for k, url in owners.items():
            assert url is not None
            owned[url].append(k)
        to = {url: _paths(ks) for url, ks in owned.items()}
        before = [_batches(n) for n in nodes]
        _compare(nodes, to, together=True)
        # some of them did travel together, both ways
        assert all(n > was for n, was in zip([_batches(n) for n in nodes], before, strict=True))
        # the odd keys alone, as a quiet node forwards them: each its own signed request
        odd = {url: _paths([k for k in ks if k in ODD]) for url, ks in owned.items()}
        _compare(nodes, odd, together=False)

        # the version before's framing: the same answers, from the owner of the keys asked
        def framed_as_alone() -> bool:
            mine = [k for k in keys if owners[k] == b.url and _owner(b, k) == b.url][:30]
            if not mine:
                return False
            plain = _paths(mine)[: len(mine)]
            direct = asyncio.run(_read_all(b.url, plain))
            want = [(d.status_code, d.content) for d in direct]
            framed = _framed_apart(b, plain)
            if any(_owner(b, k) != b.url for k in mine):
                return False  # a partition moved meanwhile (a batch's reads are b's alone)
            if framed != want:
                held = b.get("/v1/cluster").json()
                odd = [(p, f, w) for p, f, w in zip(plain, framed, want, strict=True) if f != w]
                pytest.fail(f"framed apart {odd[:3]}; cluster then: {held}")
            return True

        eventually(framed_as_alone, timeout=60)
        # a batch's reads after a position are held to it as a lone read is, however fresh
        # their kept answers: a position beyond every partition's end is refused
        beyond = "kv@" + ",".join(f"{p}:{10**12}" for p in range(PARTITIONS))

        def beyond_refused() -> bool:
            held = [k for k in keys if owners[k] == b.url and _owner(b, k) == b.url][:10]
            if not held:
                return False
            mine = _paths(held)[: len(held)]
            if any(r.status_code != 200 for r in asyncio.run(_read_all(b.url, mine))):
                return False  # a partition moving: its reads answered elsewhere meanwhile
            answer = _signed_batch(b, ANSWERS_PATH, mine, [(AFTER_HEADER, beyond)])
            if any(_owner(b, k) != b.url for k in held):
                return False  # a partition moved meanwhile (a batch's reads are b's alone)
            assert _statuses(answer, len(mine)) == [400] * len(mine)
            return True

        eventually(beyond_refused, timeout=60)
        # a batch without the cluster's signature is refused, whoever sends it
        for route in (ANSWERS_PATH, BATCH_PATH):
            r = httpx.post(
                f"{b.url}{route}",
                content=b'["/v1/tables/kv/keys/key-1"]',
                headers={"x-tablecast-hop": "1"},
            )
            assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", r.text
    finally:
        stop_all(nodes)
