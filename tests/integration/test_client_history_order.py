"""``/history?order=desc`` and the Client's HTTP API names on two real node processes.

One cluster for the module: a history table (versions written out of time order, a
delete among them) and a window table, written directly to their topics, served by two
nodes that share the partitions, so some reads are answered where they are asked and
some are forwarded to the other node.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import orjson
import pytest

from tablecast import serde
from tablecast.client import Client

from ..support.procs import NodeProcess, eventually, start_node, stop_all
from .tables import Logged, make_table, write_logged, write_windows

pytestmark = pytest.mark.integration

PARTITIONS = 4
TABLE = "prices"
WINDOWS = "visits"
KEYS = [f"k{i}" for i in range(6)]
#: per key, the offsets of its versions' times after the base, in the order written: late
#: records take their place by time; the None is a delete
VERSIONS: list[tuple[int, Any]] = [(3, 30), (0, 0), (5, None), (1, 10), (4, 40), (2, 20)]
MINUTE = 60_000


@dataclass
class Cluster:
    nodes: list[NodeProcess]
    #: node id -> its URL
    ids: dict[str, str]
    base: int
    #: one connection pool for the test's own requests (a new client costs an SSL context)
    http: httpx.Client

    def expected(self, key: str) -> list[dict[str, Any]]:
        """The key's versions oldest first, as /history renders them."""
        return [
            {"value": None if v is None else {"key": key, "v": v}, "timestamp": ts}
            for ts, v in sorted((self.base + dt, v) for dt, v in VERSIONS)
        ]


@pytest.fixture(scope="module")
def cluster(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    logs = tmp_path_factory.mktemp("logs")
    app = f"o{uuid.uuid4().hex[:10]}"
    table = make_table(
        bootstrap,
        app,
        TABLE,
        PARTITIONS,
        serde.string(),
        serde.json(),
        extra={"history_ms": 24 * 3_600_000},
    )
    windows = make_table(
        bootstrap,
        app,
        WINDOWS,
        PARTITIONS,
        serde.string(),
        serde.json(),
        kind="window",
        extra={"size_ms": MINUTE},
    )
    # recent: the broker's retention deletes records stamped older than 7 days
    base = int(time.time() * 1000) - 3_600_000
    records = [
        Logged(
            k.encode(),
            None if v is None else orjson.dumps({"key": k, "v": v}),
            base + dt,
            None,
        )
        for k in KEYS
        for dt, v in VERSIONS
    ]
    write_logged(bootstrap, table.info.topic, records)
    write_windows(
        bootstrap, windows, [(k, base + m * MINUTE, {"m": m}) for k in KEYS for m in (0, 1, 2)]
    )
    nodes = [start_node(app, bootstrap, logs) for _ in range(2)]
    try:
        for n in nodes:
            n.wait_ready()

        def settled() -> bool:
            views = [n.get("/v1/cluster").json()["nodes"] for n in nodes]
            actives = {
                (r["table"], r["partition"]): m["id"]
                for m in views[0]
                for r in m["replicas"]
                if r["role"] == "active"
            }
            # both nodes see both, and every partition has its active: a plain read on the
            # node that is not a key's active is forwarded to it
            return all(len(v) == 2 for v in views) and len(actives) == 2 * PARTITIONS

        eventually(settled, 120)
        for n in nodes:
            n.wait_caught_up(bootstrap, TABLE, table.info.topic)
            n.wait_caught_up(bootstrap, WINDOWS, windows.info.topic)
        ids = {m["id"]: m["url"] for m in nodes[0].get("/v1/cluster").json()["nodes"]}
        with httpx.Client(timeout=30.0) as http:
            yield Cluster(nodes, ids, base, http)
    finally:
        stop_all(nodes)


def _pages(http: httpx.Client, url: str, params: dict[str, str]) -> tuple[list[Any], set[str]]:
    """Every item of a paged read, 2 a page, and the nodes that read the stores."""
    items: list[Any] = []
    answered: set[str] = set()
    cursor = None
    for _ in range(20):
        page = {**params, "limit": "2", **({"cursor": cursor} if cursor else {})}
        r = http.get(url, params=page)
        assert r.status_code == 200, (url, page, r.text)
        answered.add(r.headers["x-tablecast-node"])
        items += r.json()["items"]
        cursor = r.json()["next_cursor"]
        if cursor is None:
            return items, answered
    raise AssertionError("more pages than versions")


def test_desc_pages_newest_first_on_every_route(cluster: Cluster) -> None:
    http = cluster.http
    forwarded = local = 0
    for me, url in cluster.ids.items():
        for key in KEYS:
            path = f"{url}/v1/tables/{TABLE}/keys/{quote(key)}/history"
            asc, _ = _pages(http, path, {})
            assert [{k: v[k] for k in ("value", "timestamp")} for v in asc] == cluster.expected(key)
            position = http.get(path).headers["x-tablecast-position"]
            # plain, after a position (waits on whichever node reads), bounded staleness (a
            # standby may answer), and the key as ?key=
            for route, params in [
                (path, {"order": "desc"}),
                (path, {"order": "desc", "after": position, "timeout_ms": "5000"}),
                (path, {"order": "desc", "max_lag": "1000"}),
                (f"{url}/v1/tables/{TABLE}/history", {"order": "desc", "key": key}),
            ]:
                desc, answered = _pages(http, route, params)
                assert desc == asc[::-1], (url, key, params)
                forwarded += answered != {me}
                local += answered == {me}
            latest = http.get(path, params={"order": "desc", "limit": "1"}).json()["items"]
            assert latest == asc[-1:]
            # bounds are the same in either order: from inclusive, to exclusive
            bounded = {"from": str(cluster.base + 1), "to": str(cluster.base + 4)}
            assert _pages(http, path, {**bounded, "order": "desc"})[0] == asc[1:4][::-1]
    assert forwarded and local  # both paths were taken


def test_a_cursor_pages_its_own_order_and_order_is_checked(cluster: Cluster) -> None:
    http = cluster.http
    for url in cluster.ids.values():
        path = f"{url}/v1/tables/{TABLE}/keys/k0/history"
        cursor = http.get(path, params={"order": "desc", "limit": "2"}).json()["next_cursor"]
        r = http.get(path, params={"order": "asc", "limit": "2", "cursor": cursor})
        assert r.status_code == 400 and r.json()["error"]["code"] == "bad_request"
        assert "order=desc" in r.json()["error"]["message"]
        r = http.get(path, params={"limit": "2", "cursor": cursor})  # asc is the default
        assert r.status_code == 400
        r = http.get(path, params={"order": "newest"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "bad_request"
        assert "order" in r.json()["error"]["message"]
        doc = http.get(f"{url}/openapi.json").json()["paths"]
        params = doc["/v1/tables/{table}/keys/{key}/history"]["get"]["parameters"]
        (order,) = [p for p in params if p["name"] == "order"]
        assert order["schema"] == {"enum": ["asc", "desc"]}


def test_the_client_takes_the_http_api_names(cluster: Cluster) -> None:
    base = cluster.base
    with Client([n.url for n in cluster.nodes]) as client:
        every = list(client.history(TABLE, "k1"))
        latest = client.history(TABLE, "k1", order="desc", limit=2, max_lag=1000)
        assert list(latest) == every[::-1][:2]
        rest = client.history(TABLE, "k1", order="desc", cursor=latest.next_cursor)
        assert list(rest) == every[::-1][2:]
        assert list(client.history(TABLE, "k1", from_=base + 1, to=base + 3)) == every[1:3]

        # a plain read answers the latest record by offset (the last written, +2's), not
        # the latest by time (+5's delete)
        assert dict(client.range(TABLE)) == {k: {"key": k, "v": 20} for k in KEYS}
        first = client.range(TABLE, from_="k1", to="k5", limit=2)
        assert list(first) == [("k1", {"key": "k1", "v": 20}), ("k2", {"key": "k2", "v": 20})]
        after = client.range(TABLE, from_="k1", to="k5", cursor=first.next_cursor)
        assert [k for k, _ in after] == ["k3", "k4"]

        got = client.windows(WINDOWS, "k2", from_=base + MINUTE, to=base + 3 * MINUTE)
        assert [w["value"] for w in got] == [{"m": 1}, {"m": 2}]
        with pytest.warns(DeprecationWarning):
            assert (
                client.windows(WINDOWS, "k2", from_ms=base + MINUTE, to_ms=base + 3 * MINUTE) == got
            )

        token = client.position(TABLE)
        assert token is not None
        assert client.get(TABLE, "k0", after=token, timeout_ms=5000)["value"] == {
            "key": "k0",
            "v": 20,
        }

        def snapshot(**span: Any) -> list[str]:
            keys = []
            for event in client.watch(TABLE, **span):
                if event.event == "ready":
                    return sorted(keys)
                keys.append(event.key)
            raise AssertionError("the watch ended")

        assert snapshot(from_="k1", to="k4") == ["k1", "k2", "k3"]
        with pytest.warns(DeprecationWarning):
            assert snapshot(start="k1", end="k4") == ["k1", "k2", "k3"]


def test_the_cli_lists_a_keys_history_in_either_order(cluster: Cluster) -> None:
    """`tablecast history T K --order desc` prints the versions newest first; a wrong order
    is one line and exit 2."""
    url = ",".join(cluster.ids.values())

    def history(*more: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "tablecast.cli.main", "history", TABLE, KEYS[0]]
        return subprocess.run(
            [*argv, "--url", url, *more], capture_output=True, text=True, timeout=60
        )

    shown = {}
    for order in ("asc", "desc"):
        done = history("--order", order)
        assert done.returncode == 0, done.stderr
        shown[order] = [
            {k: v[k] for k in ("value", "timestamp")} for v in orjson.loads(done.stdout)["items"]
        ]
    assert shown["asc"] == cluster.expected(KEYS[0])
    assert shown["desc"] == shown["asc"][::-1]
    refused = history("--order", "newest")
    assert refused.returncode == 2 and refused.stderr.startswith("tablecast: error: --order")
