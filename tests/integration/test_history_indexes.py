"""History, as-of reads and secondary indexes on real node processes, judged by a reference
model of the table topic at the positions each answer reports: out-of-order timestamps,
deletes, index values that move, kill -9 restarts and hand-overs to a joining node; then
reads racing a writer, and ``after`` across nodes."""

from __future__ import annotations

import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tablecast import serde
from tablecast.contract import index_codec
from tablecast.contract.partitioner import partition_for

from ..support.procs import NodeProcess, eventually, start_node, stop_all, tls
from .history_model import TopicModel, position, value_of
from .tables import Logged, make_table, write_logged

pytestmark = pytest.mark.integration

PARTITIONS = 4
HISTORY_MS = 20_000
NAMES = ("color", "size")
KEYS = [f"k{i:02d}" for i in range(12)]
TABLE = "trips"
LOOKUPS: list[Any] = ["red", "blue", "green", 1, 2, 2.5, 10]

headers = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {},
        optional={
            "color": st.one_of(
                st.none(),
                st.sampled_from(["red", "blue", "green"]),
                st.lists(st.sampled_from(["red", "blue"]), max_size=2),
            ),
            "size": st.sampled_from([1, 2, 2.5, 10]),
        },
    ),
)
writes = st.lists(
    st.tuples(
        st.integers(0, len(KEYS) - 1),
        st.one_of(st.none(), st.integers(0, 99)),
        st.integers(0, 60_000),  # timestamps out of offset order
        headers,
    ),
    min_size=1,
    max_size=16,
)
# every scenario restarts the node with kill -9 and hands partitions over to a joining node,
# between writes drawn at random
steps = st.tuples(writes, writes, writes).map(
    lambda w: [("write", w[0]), ("restart",), ("write", w[1]), ("join",), ("write", w[2])]
)


class Cluster:
    """One or two node processes of a fresh app, with RocksDB stores on disk."""

    def __init__(self, bootstrap: str, logs: Path) -> None:
        self.bootstrap = bootstrap
        self.logs = logs
        self.app = f"h{uuid.uuid4().hex[:10]}"
        self.dirs = [logs / f"{self.app}-n0", logs / f"{self.app}-n1"]
        self.nodes: list[NodeProcess] = []

    def start(self, i: int) -> NodeProcess:
        node = start_node(self.app, self.bootstrap, self.logs, "--data-dir", str(self.dirs[i]))
        if i < len(self.nodes):
            self.nodes[i] = node
        else:
            self.nodes.append(node)
        node.wait_ready()
        return node

    def stop(self) -> None:
        stop_all(self.nodes)


def _base() -> int:
    # recent: the broker's retention deletes records stamped older than 7 days
    return int(time.time() * 1000) - 3_600_000


@settings(
    max_examples=2,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
@given(scenario=steps)
def test_history_and_indexes_match_the_model(bootstrap: str, logs: Path, scenario: list) -> None:  # type: ignore[type-arg]
    cluster = Cluster(bootstrap, logs)
    table = make_table(
        bootstrap,
        cluster.app,
        TABLE,
        PARTITIONS,
        serde.string(),
        serde.json(),
        extra={"history_ms": HISTORY_MS, "indexes": list(NAMES)},
    )
    model = TopicModel(HISTORY_MS, NAMES)
    base = _base()
    try:
        cluster.start(0)
        for step in scenario:
            if step[0] == "write":
                records = [
                    Logged(
                        KEYS[k].encode(),
                        None if v is None else orjson.dumps({"v": v, "k": k}),
                        base + ts,
                        header,
                    )
                    for k, v, ts, header in step[1]
                ]
                model.add(write_logged(bootstrap, table.info.topic, records))
            elif step[0] == "restart":  # kill -9: the stores resume from what is on disk
                cluster.nodes[0].stop(signal.SIGKILL)
                cluster.start(0)
            elif len(cluster.nodes) == 1:  # a second node joins: partitions are handed over
                cluster.start(1)
            for node in cluster.nodes:
                node.wait_caught_up(bootstrap, TABLE, table.info.topic)
            for node in cluster.nodes:
                check_node(node, model)
        if len(cluster.nodes) == 2:
            check_after_across_nodes(*cluster.nodes)
    finally:
        cluster.stop()


def check_node(node: NodeProcess, model: TopicModel) -> None:
    ends = model.ends()
    floors = {p: model.floor(ends, p) for p in range(PARTITIONS)}
    floor = max(f for f in floors.values() if f is not None)
    times = [floor + d for d in (0, 3_000, 9_000, 19_999, 40_000, 70_000)]
    for key in KEYS:
        raw = key.encode()
        part = partition_for(raw, PARTITIONS)
        r = node.get(f"/v1/tables/{TABLE}/keys/{key}")
        at = position(r.headers, TABLE)
        row = model.rows(at).get(raw)
        assert (r.status_code, r.json().get("value")) == (
            (200, value_of(row)) if row else (404, None)
        ), (key, at)
        for when in times:
            if floors[part] is not None and when < floors[part]:
                continue
            r = node.get(f"/v1/tables/{TABLE}/keys/{key}", params={"as_of": when})
            at = position(r.headers, TABLE)
            found = model.as_of(at, raw, when)
            if found is None:
                assert r.status_code == 404, (key, when, r.text)
            else:
                assert r.status_code == 200, r.text
                body = r.json()
                assert (body["value"], body["timestamp"], body["offset"]) == (
                    value_of(found),
                    found.timestamp,
                    found.offset,
                ), (key, when)
        if floors[part] is not None:
            r = node.get(f"/v1/tables/{TABLE}/keys/{key}", params={"as_of": floors[part] - 1})
            assert r.status_code == 400 and "history" in r.json()["error"]["message"]
        check_history(node, model, key, part)
    for when in times[1:]:
        check_pages(node, model, f"/v1/tables/{TABLE}/range", {"as_of": str(when)}, as_of=when)
    check_pages(node, model, f"/v1/tables/{TABLE}/range", {})
    for name in NAMES:
        check_pages(node, model, f"/v1/tables/{TABLE}/index/{name}", {}, index=(name, None))
        for v in LOOKUPS:
            text = v if isinstance(v, str) else orjson.dumps(v).decode()
            path = f"/v1/tables/{TABLE}/index/{name}/{quote(text, safe='')}"
            check_pages(node, model, path, {}, index=(name, v))
    check_pages(
        node,
        model,
        f"/v1/tables/{TABLE}/index/size",
        {"from": "2", "to": '"a"'},  # 2 <= value < "a": every number from 2, no string
        index=("size", (2, "a")),
    )
    r = node.get(f"/v1/tables/{TABLE}/count")
    assert r.json()["count"] == len(model.rows(position(r.headers, TABLE)))
    r = httpx.post(f"{node.url}/v1/tables/{TABLE}/keys:batchGet", json={"keys": KEYS})
    rows = model.rows(position(r.headers, TABLE))
    assert r.json()["results"] == [
        {"key": k, "found": True, "value": value_of(rows[k.encode()])}
        if k.encode() in rows
        else {"key": k, "found": False}
        for k in KEYS
    ]


def check_history(node: NodeProcess, model: TopicModel, key: str, part: int) -> None:
    items: list[dict[str, Any]] = []
    cursor = None
    at: dict[int, int] = {}
    for _ in range(100):
        q = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        r = node.get(f"/v1/tables/{TABLE}/keys/{key}/history", params=q)
        assert r.status_code == 200, r.text
        at = position(r.headers, TABLE)
        items += r.json()["items"]
        cursor = r.json()["next_cursor"]
        if cursor is None:
            break
    want = [
        {
            "value": None if v.value is None else value_of(v),
            "timestamp": v.timestamp,
            "offset": v.offset,
        }
        for v in model.kept(at, key.encode(), part)
    ]
    assert items == want, key


def check_pages(
    node: NodeProcess,
    model: TopicModel,
    path: str,
    params: dict[str, str],
    as_of: int | None = None,
    index: tuple[str, Any] | None = None,
) -> None:
    """Page by page (3 rows each), every page exactly what the model holds at the positions
    the page reports, after the previous page's last row."""
    last: bytes | None = None
    cursor = None
    for _ in range(100):
        q = {**params, "limit": "3", **({"cursor": cursor} if cursor else {})}
        r = node.get(path, params=q)
        assert r.status_code == 200, (path, q, r.text)
        at = position(r.headers, TABLE)
        assert sorted(at) == list(range(PARTITIONS)), at  # a fan-out reflects every partition
        body = r.json()
        rows = expected_rows(model, at, as_of, index)
        rest = [(s, item) for s, item in rows if last is None or s > last]
        assert body["items"] == [item for _, item in rest[:3]], (path, q, at)
        cursor = body["next_cursor"]
        assert (cursor is None) == (len(rest) <= 3), (path, q, at)
        if cursor is None:
            return
        last = rest[2][0]
    raise AssertionError("pagination did not end")


def expected_rows(
    model: TopicModel, at: dict[int, int], as_of: int | None, index: tuple[str, Any] | None
) -> list[tuple[bytes, dict[str, Any]]]:
    if index is None:
        out = []
        for key in sorted(k.encode() for k in KEYS):
            row = model.rows(at).get(key) if as_of is None else model.as_of(at, key, as_of)
            if row is not None:
                out.append((key, {"key": key.decode(), "value": value_of(row)}))
        return out
    name, want = index
    rows = []
    for sort, value, row in model.index(at, name):
        item = {"key": row.key.decode(), "value": value_of(row)}
        if want is None:
            rows.append((sort, {"index": value, **item}))
        elif isinstance(want, tuple):
            lo, hi = (index_codec.encode_value(x) for x in want)
            if lo <= sort < hi:
                rows.append((sort, {"index": value, **item}))
        elif index_codec.encode_value(value) == index_codec.encode_value(want):
            rows.append((sort, item))
    return rows


def check_after_across_nodes(a: NodeProcess, b: NodeProcess) -> None:
    """A token from one node's answer, passed to the other: answered at least that far."""
    paths = ("range", "index/color", "count", "keys/k01", "keys/k01/history")
    for path in (f"/v1/tables/{TABLE}/{p}" for p in paths):
        token = a.get(path).headers["x-tablecast-position"]
        r = b.get(path, params={"after": token})
        assert r.status_code in (200, 404), r.text
        mine = position(r.headers, TABLE)
        asked = position({"x-tablecast-position": token}, TABLE)
        assert all(mine[p] >= o for p, o in asked.items()), (token, mine)


def _table(bootstrap: str, app: str) -> Any:
    return make_table(
        bootstrap,
        app,
        TABLE,
        PARTITIONS,
        serde.string(),
        serde.json(),
        extra={"history_ms": HISTORY_MS, "indexes": list(NAMES)},
    )


def test_reads_racing_a_writer_are_exact_at_their_positions(bootstrap: str, logs: Path) -> None:
    """While records keep arriving, every answer is what the topic held at its position."""
    import random

    cluster = Cluster(bootstrap, logs)
    table = _table(bootstrap, cluster.app)
    model = TopicModel(HISTORY_MS, NAMES)
    lock = threading.Lock()
    rng = random.Random(5)
    base = _base()
    done = threading.Event()

    def write() -> None:
        try:
            for n in range(40):
                batch = [
                    Logged(
                        rng.choice(KEYS).encode(),
                        None if rng.random() < 0.2 else orjson.dumps({"v": n, "i": i}),
                        base + rng.randrange(120_000),
                        rng.choice([None, {"color": rng.choice(["red", "blue"])}, {"size": 2}]),
                    )
                    for i in range(10)
                ]
                write_logged(bootstrap, table.info.topic, batch)
                with lock:
                    model.add(batch)
                time.sleep(0.05)
        finally:
            done.set()

    def settled(at: dict[int, int]) -> TopicModel:
        """The model once it holds every record below `at` (their acks may trail the read)."""

        def covered() -> bool:
            with lock:
                ends = model.ends()
            return all(ends.get(p, 0) >= o for p, o in at.items())

        eventually(covered, 30, 0.02)
        with lock:
            judged = TopicModel(HISTORY_MS, NAMES)
            judged.add(list(model.log))
        return judged

    try:
        node = cluster.start(0)
        writer = threading.Thread(target=write)
        writer.start()
        reads = 0
        while not done.is_set() or reads < 20:
            key = rng.choice(KEYS)
            raw = key.encode()
            route = reads % 4
            if route == 0:
                r = node.get(f"/v1/tables/{TABLE}/keys/{key}")
                at = position(r.headers, TABLE)
                row = settled(at).rows(at).get(raw)
                assert r.status_code == (200 if row else 404), (key, at, r.text)
                if row:
                    assert r.json()["value"] == value_of(row)
            elif route == 1:  # far ahead of every record: the latest version by time
                when = base + 10**6
                r = node.get(f"/v1/tables/{TABLE}/keys/{key}", params={"as_of": when})
                at = position(r.headers, TABLE)
                found = settled(at).as_of(at, raw, when)
                assert r.status_code == (200 if found else 404), (key, at, r.text)
                if found:
                    assert r.json()["offset"] == found.offset
            elif route == 2:
                r = node.get(f"/v1/tables/{TABLE}/index/color/red", params={"limit": "1000"})
                at = position(r.headers, TABLE)
                want = expected_rows(settled(at), at, None, ("color", "red"))
                assert r.json()["items"] == [item for _, item in want], at
            else:
                r = node.get(f"/v1/tables/{TABLE}/range", params={"limit": "1000"})
                at = position(r.headers, TABLE)
                want = expected_rows(settled(at), at, None, None)
                assert r.json()["items"] == [item for _, item in want], at
            reads += 1
        writer.join()
        assert reads >= 20
    finally:
        done.set()
        cluster.stop()


def test_after_waits_for_the_write_on_every_route(bootstrap: str, logs: Path) -> None:
    """A position ahead of the node (min_offset naming the next record) makes it wait until
    the record arrives (woken by the ingest thread), then answer at least that far; one never
    reached answers 504. An after token beyond the topic's end is no position a node handed
    out: 400 at once. The client keeps the positions itself, and a producer's acknowledged
    offset is read-your-writes."""
    from tablecast import Client

    cluster = Cluster(bootstrap, logs)
    table = _table(bootstrap, cluster.app)
    base = _base()
    first = write_logged(
        bootstrap,
        table.info.topic,
        [Logged(b"k01", b'{"v": 1}', base, {"color": "red"})],
    )[0]
    try:
        node = cluster.start(0)
        node.wait_caught_up(bootstrap, TABLE, table.info.topic)
        p = first.partition
        beyond = Client.token_for(TABLE, p, first.offset + 1)  # the next record of p
        ahead = {"min_offset": f"{p}:{first.offset + 1}"}  # the same, waited for
        routes = [
            ("GET", f"/v1/tables/{TABLE}/keys/k01", {}),
            ("GET", f"/v1/tables/{TABLE}/keys/k01/history", {}),
            ("GET", f"/v1/tables/{TABLE}/keys/k01", {"as_of": str(base + 5)}),
            ("GET", f"/v1/tables/{TABLE}/range", {}),
            ("GET", f"/v1/tables/{TABLE}/range", {"as_of": str(base + 5)}),
            ("GET", f"/v1/tables/{TABLE}/count", {}),
            ("GET", f"/v1/tables/{TABLE}/index/color/red", {}),
            ("GET", f"/v1/tables/{TABLE}/index/color", {}),
            ("POST", f"/v1/tables/{TABLE}/keys:batchGet", {}),
        ]
        for method, path, params in routes:
            for extra in ({"after": beyond}, ahead):
                r = httpx.request(
                    method,
                    node.url + path,
                    params={**params, **extra, "timeout_ms": "300"},
                    json={"keys": ["k01"]} if method == "POST" else None,
                    verify=tls(),
                )
                code = "bad_request" if "after" in extra else "timeout"
                assert r.json()["error"]["code"] == code, (path, extra, r.text)
        answers: dict[str, httpx.Response] = {}

        def ask(method: str, path: str, params: dict[str, str]) -> None:
            answers[path + str(params)] = httpx.request(
                method,
                node.url + path,
                params={**params, **ahead},
                json={"keys": ["k01"]} if method == "POST" else None,
                timeout=30,
                verify=tls(),
            )

        waiting = [
            threading.Thread(target=ask, args=(m, path, {**q, "timeout_ms": "20000"}))
            for m, path, q in routes
        ]
        for t in waiting:
            t.start()
        time.sleep(1.0)
        assert not answers  # all still waiting for the record
        write_logged(
            bootstrap,
            table.info.topic,
            [Logged(b"k01", b'{"v": 2}', base + 1, {"color": "red"})],
        )
        for t in waiting:
            t.join(30)
        assert len(answers) == len(routes)
        for name, r in answers.items():
            assert r.status_code == 200, (name, r.text)
            assert position(r.headers, TABLE)[p] >= first.offset + 2, name
        assert answers[f"/v1/tables/{TABLE}/keys/k01{{'timeout_ms': '20000'}}"].json()["value"] == {
            "v": 2
        }
        # the other options every read route takes
        for _, path, q in routes[:-1]:
            for extra in ({"max_staleness_ms": "60000"}, {"max_lag": "0"}, {"redirect": "true"}):
                r = node.get(path, params={**q, **extra})
                assert r.status_code == 200, (path, extra, r.text)
                assert "x-tablecast-position" in r.headers
            r = node.get(path, params={**q, "min_offset": f"{p}:{first.offset + 1}"})
            assert r.status_code == 200, (path, r.text)

        # the client: monotonic by default, and a producer's ack is read-your-writes
        with Client(node.url) as client:
            assert client.get(TABLE, "k01")["value"] == {"v": 2}
            assert client.position(TABLE) is not None
            third = write_logged(
                bootstrap, table.info.topic, [Logged(b"k01", b'{"v": 3}', base + 2, None)]
            )[0]
            client.wrote(TABLE, third.partition, third.offset)
            assert client.get(TABLE, "k01")["value"] == {"v": 3}
            assert [v["value"] for v in client.history(TABLE, "k01")] == [
                {"v": 1},
                {"v": 2},
                {"v": 3},
            ]
            assert client.get(TABLE, "k01", as_of=base + 1)["value"] == {"v": 2}
            assert list(client.index(TABLE, "color", "red")) == []  # v3 has no index header
            assert list(client.range(TABLE, as_of=base + 1)) == [("k01", {"v": 2})]
            client.observe(Client.token_for(TABLE, p, third.offset + 5))
            with pytest.raises(Exception, match="400"):  # beyond the topic's end
                client.get(TABLE, "k01", timeout_ms=200)
    finally:
        cluster.stop()
