"""Live tables on real nodes against the real broker: a watch is its table topic from its
snapshot on (judged against the topic read directly), resumes on any node with no gap and no
duplicate, survives partition hand-over, kill -9 and a rolling restart, and a slow consumer is
cut off without slowing the others."""

from __future__ import annotations

import asyncio
import random
import signal
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

import tablecast as tc
from tablecast import serde
from tablecast.kafka.broker import free_port
from tablecast.live.events import SSE as SSE_ENCODER
from tablecast.live.resume_token import parse
from tablecast.live.sinks import Sink

from ..support.procs import NodeProcess, eventually, start_node, tls
from ..support.sse import Stream, read_to_end
from .tables import make_table
from .watch_model import Seen, judge, read_topic

pytestmark = pytest.mark.integration

PARTITIONS = 6


def _updates(n: int, keys: list[str], seed: int) -> list[tuple[str, Any]]:
    rng = random.Random(seed)
    out: list[tuple[str, Any]] = []
    for i in range(n):
        key = rng.choice(keys)
        out.append((key, None if rng.random() < 0.1 else {"n": i, "key": key}))
    return out


def _watch(node: NodeProcess, **params: Any) -> Stream:
    return Stream(f"{node.url}/v1/tables/kv/watch", params=params).start()


def _wait_positions(stream: Stream, offsets: dict[int, int], timeout: float = 30.0) -> None:
    """Until the stream's last id (events or keep-alives) reached `offsets` in each partition."""

    def there(s: Stream) -> bool:
        if s.last_id is None:
            return False
        last = parse(s.last_id)
        return last.after is None and all(last.offsets.get(p, o) >= o for p, o in offsets.items())

    stream.wait_for(there, timeout)


def _ends(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "watch-ends"})
    try:
        return {
            p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        }
    finally:
        c.close()


@pytest.fixture(scope="module")
def one(bootstrap: str, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    app = f"watch{time.monotonic_ns() % 10**8}"
    logs = tmp_path_factory.mktemp("watch")
    kv = make_table(bootstrap, app, "kv", PARTITIONS, serde.string(), serde.json())
    keys = [f"{c}{i:02d}" for c in "abc" for i in range(30)]
    kv.write(bootstrap, [(k, {"n": -1, "key": k}) for k in keys])
    node = start_node(app, bootstrap, logs)
    try:
        node.wait_ready()
        node.wait_caught_up(bootstrap, "kv", kv.info.topic)
        yield node, kv, keys
    finally:
        node.stop()


def test_a_watch_is_its_topic_from_its_snapshot_on(bootstrap: str, one) -> None:  # type: ignore[no-untyped-def]
    node, kv, keys = one
    topic = kv.info.topic
    watches = {
        "keys": (
            _watch(node, key=["a01", "b07", "c29", "zz"]),
            lambda k: k in ("a01", "b07", "c29", "zz"),
        ),
        "prefix": (_watch(node, prefix="b"), lambda k: k.startswith("b")),
        "range": (_watch(node, **{"from": "a15", "to": "b15"}), lambda k: "a15" <= k < "b15"),
        "all": (_watch(node, prefix=""), lambda k: True),
    }
    for stream, _ in watches.values():
        stream.wait_for(lambda s: s.of("ready"))
    now = _ends(bootstrap, topic)  # the node has applied all of it (caught up, no writes since)
    late = _watch(node, prefix="c", snapshot="false")  # changes only, from now on
    late.wait_for(lambda s: s.of("ready"))
    assert late.of("snapshot") == [] and late.of("ready")[0].data == {"rows": 0}
    # "now", not where the feed the other watches just joined has read up to (it starts a
    # little before their snapshots): a watch started there got older records as changes
    assert parse(late.of("ready")[0].id).offsets == now
    kv.write(bootstrap, _updates(400, [*keys, "zz"], seed=1))
    ends = _ends(bootstrap, topic)
    records = read_topic(bootstrap, topic, PARTITIONS)
    for stream, match in watches.values():
        _wait_positions(stream, ends)
        judge(Seen.of(stream.events), records, match)
        stream.stop()
    _wait_positions(late, ends)
    judge(Seen.of(late.events), records, lambda k: k.startswith("c"), snapshot=False)
    late.stop()

    # resume from anywhere in the stream, also from inside the snapshot: the events after it,
    # none twice, none missing (judged by replaying both halves into one client state)
    stream, match = watches["prefix"]
    events = stream.events
    for cut in (3, len([e for e in events if e.event == "snapshot"]) + 5, len(events) - 2):
        head = events[: cut + 1]
        for how in ("header", "since"):
            params: dict[str, Any] = {"prefix": "b"}
            headers = {}
            if how == "since":
                params["since"] = head[-1].id
            else:
                headers["last-event-id"] = head[-1].id
            again = Stream(f"{node.url}/v1/tables/kv/watch", params=params, headers=headers).start()
            _wait_positions(again, ends)
            again.stop()
            _same_state(head, again.events, records, match, parse(again.last_id or ""), ends)
            if head[-1].event == "change":  # past the snapshot: exactly the rest of the stream
                # per partition: the order across partitions is the order records were fetched
                # in, which a resume from the feed's ring (partition by partition) need not repeat
                rest = _by_partition(events[cut + 1 :])
                got = _by_partition(again.events)
                assert {p: got.get(p, [])[: len(r)] for p, r in rest.items()} == rest
                for e in again.events:  # each change's id stands right after it in its partition
                    if e.event == "change":
                        assert parse(e.id).offsets[e.data["partition"]] == e.data["offset"] + 1


def _by_partition(events: Any) -> dict[int, list[tuple[str, Any]]]:
    """A watch's events as each partition's sequence of (event, data)."""
    out: dict[int, list[tuple[str, Any]]] = {}
    for e in events:
        if e.event == "keep-alive":
            continue
        out.setdefault(e.data["partition"], []).append((e.event, e.data))
    return out


def _same_state(  # type: ignore[no-untyped-def]
    head: list, tail: list, records: dict, match: Any, last, ends: dict[int, int]
) -> None:
    """Two halves of one watch, applied in order, give the table at the last id, and no record
    arrives twice."""
    state: dict[str, Any] = {}
    seen_changes: set[tuple[int, int]] = set()
    seen_rows: set[str] = set()
    for e in [*head, *tail]:
        if e.event in ("snapshot", "change"):
            d = e.data
            if e.event == "change":
                at = (d["partition"], d["offset"])
                assert at not in seen_changes, f"change {at} delivered twice"
                seen_changes.add(at)
            else:
                assert d["key"] not in seen_rows, f"snapshot row {d['key']} sent twice"
                seen_rows.add(d["key"])
            if d["value"] is None:
                state.pop(d["key"], None)
            else:
                state[d["key"]] = d["value"]
    assert last.after is None and all(last.offsets[p] >= o for p, o in ends.items())
    from .watch_model import state_at

    want = {k: r.value for k, r in state_at(records, last.offsets, match).items()}
    assert state == want


def test_bad_watches_are_refused_before_the_stream(one) -> None:  # type: ignore[no-untyped-def]
    node, _, _ = one
    cases = [
        ({"key": "a01", "prefix": "a"}, 400, "keys or a prefix"),
        ({"key": "a01", "snapshot": "maybe"}, 400, "snapshot is true or false"),
        ({"key": "a01", "max_lag": "1"}, 400, "unknown query parameter"),
        ({"key": "a01", "since": "nonsense"}, 400, "not a resume token"),
        ({"key": "a01", "since": "other@0:1"}, 400, "of table 'other'"),
        ({"prefix": "a", "since": "kv@0:1"}, 400, "does not cover"),
    ]
    for params, status, says in cases:
        r = node.get("/v1/tables/kv/watch", params=params)
        assert r.status_code == status and says in r.json()["error"]["message"], (params, r.text)
    assert node.get("/v1/tables/nope/watch", params={"key": "x"}).status_code == 404
    r = httpx.post(f"{node.url}/v1/tables/kv/watch", params={"key": "x"})
    assert r.status_code == 405
    # anything else: a 4xx, or a stream (never a 5xx other than 503); streams are closed at once
    rng = random.Random(3)
    texts = ["a01", "", "a", "\u00ff", "zz", "b07/x", "%", "kv@0:1", "kv@0:1,1:2,2:3,3:4,4:5,5:6"]
    names = ["key", "key", "prefix", "from", "to", "snapshot", "since", "other"]
    for _ in range(60):
        params = [(rng.choice(names), rng.choice(texts)) for _ in range(rng.randint(0, 4))]
        url = f"{node.url}/v1/tables/kv/watch"
        with httpx.stream("GET", url, params=params, timeout=10, verify=tls()) as r:
            assert r.status_code < 500 or r.status_code == 503, (params, r.read())


def test_a_slow_consumer_is_cut_off_and_the_others_keep_up(bootstrap: str, one) -> None:  # type: ignore[no-untyped-def]
    """A client that stops reading is closed once its TCP has acknowledged nothing for 10 s
    (nothing waits on it meanwhile); a reader beside it keeps its latency; the slow one
    resumes with the last id it got, with no gap."""
    node, kv, _ = one
    host, port = node.url.split("://")[1].split(":")
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.connect((host, int(port)))
    slow.sendall(b"GET /v1/tables/kv/watch?key=big HTTP/1.1\r\nhost: x\r\n\r\n")
    fast = _watch(node, key="big")
    quiet = _watch(node, key="nobody-writes-this")
    fast.wait_for(lambda s: s.of("ready"))
    pad = "x" * 20_000
    stop = threading.Event()

    def write() -> None:
        i = 0
        while not stop.is_set():
            kv.write(bootstrap, [("big", {"i": i, "t": time.time(), "pad": pad})])
            i += 1
            time.sleep(0.02)

    def cut_off() -> bool:
        text = node.get("/metrics").text
        return 'tablecast_watch_closed_total{reason="slow_consumer"} 1.0' in text

    writer = threading.Thread(target=write, daemon=True)
    started = time.monotonic()
    writer.start()
    try:
        eventually(cut_off, timeout=60, interval=0.5)
        cut_after = time.monotonic() - started
        time.sleep(2)  # the fast reader keeps reading past the cut
    finally:
        stop.set()
        writer.join(30)
    assert cut_after < 40
    latencies = sorted(e.at - e.data["value"]["t"] for e in fast.of("change"))
    assert len(latencies) > 100 and latencies[int(len(latencies) * 0.99)] < 2.0, latencies[-10:]
    # the slow socket was closed by the node: read now, it ends; its last id resumes it
    got = read_to_end(slow)
    slow.close()
    ids = [line[4:] for line in got.split(b"\n") if line.startswith(b"id: ")]
    assert got.endswith(b"0\r\n\r\n") and ids, got[-200:]
    last = ids[-1].decode()
    again = Stream(
        f"{node.url}/v1/tables/kv/watch", params={"key": "big"}, headers={"last-event-id": last}
    ).start()
    resumed_from = parse(last).offsets
    ends = _ends(bootstrap, kv.info.topic)
    _wait_positions(again, ends)
    again.stop()
    records = read_topic(bootstrap, kv.info.topic, PARTITIONS)
    (p,) = resumed_from
    want = [r.offset for r in records[p] if r.offset >= resumed_from[p] and r.key == "big"]
    assert [e.data["offset"] for e in again.of("change")] == want
    # keep-alives at least every 15 s on a watch with nothing to say
    gaps = [b - a for a, b in zip(quiet.comments, quiet.comments[1:], strict=False)]
    assert quiet.comments and all(g <= 15 for g in gaps), gaps
    fast.stop()
    quiet.stop()


class Trio:
    """Three nodes with their own ports and data dirs, restartable by name."""

    def __init__(self, app: str, bootstrap: str, logs: Path) -> None:
        self.app, self.bootstrap, self.logs = app, bootstrap, logs
        self.ports = {name: free_port() for name in ("a", "b", "c")}
        self.nodes: dict[str, NodeProcess] = {}
        self.started: list[NodeProcess] = []

    def start(self, name: str, wait: bool = True) -> NodeProcess:
        node = start_node(
            self.app,
            self.bootstrap,
            self.logs,
            "--data-dir",
            str(self.logs / f"data-{name}"),
            port=self.ports[name],
        )
        self.started.append(node)
        if wait:
            node.wait_ready()
        self.nodes[name] = node
        return node

    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.ports.values()]


def test_watches_survive_hand_over_kill_and_rolling_restart(
    bootstrap: str, unique: str, logs: Path
) -> None:
    kv = make_table(bootstrap, unique, "kv", PARTITIONS, serde.string(), serde.json())
    keys = [f"k{i:03d}" for i in range(120)]
    kv.write(bootstrap, [(k, {"n": -1}) for k in keys])
    trio = Trio(unique, bootstrap, logs)
    trio.start("a")
    got: list[Any] = []
    done = threading.Event()
    errors: list[BaseException] = []

    def follow() -> None:
        try:
            with tc.Client(trio.urls()) as client:
                for event in client.watch("kv", prefix="k"):
                    got.append(event)
                    if done.is_set() and event.event == "change" and event.value == {"n": "last"}:
                        return
        except BaseException as e:  # reported by the test thread
            errors.append(e)

    watcher = threading.Thread(target=follow, daemon=True)
    watcher.start()
    eventually(lambda: any(e.event == "ready" for e in got), timeout=30)
    writes = iter(_updates(10_000, keys, seed=7))

    def write(n: int) -> None:
        kv.write(bootstrap, [next(writes) for _ in range(n)])

    try:
        write(50)
        trio.start("b")  # partitions move from a to b: the watch on a goes on
        write(50)
        trio.start("c")
        write(50)
        serving = got[-1].node  # the node id is its address
        name = next(k for k, p in trio.ports.items() if serving == f"127.0.0.1:{p}")
        victim = trio.nodes.pop(name)
        victim.proc.send_signal(signal.SIGKILL)  # the serving node dies: resumed elsewhere
        victim.proc.wait(10)
        write(50)
        eventually(lambda: got[-1].node != serving, timeout=30)
        trio.start(name)
        write(50)
        for name in ("a", "b", "c"):  # rolling restart, writes going on
            trio.nodes[name].stop()
            write(30)
            trio.start(name)
            write(30)
        done.set()
        kv.write(bootstrap, [("k000", {"n": "last"})])
        watcher.join(60)
        assert not errors, errors
        assert not watcher.is_alive(), "the watch did not reach the last write"
        records = read_topic(bootstrap, kv.info.topic, PARTITIONS)
        judge(Seen.of(got), records, lambda k: k.startswith("k"), complete=False)
        last = parse(got[-1].id)
        nodes_seen = {e.node for e in got}
        assert len(nodes_seen) >= 2, nodes_seen
        # complete up to the last event's position: every record below it arrived, once
        seen_changes = [(e.partition, e.offset) for e in got if e.event == "change"]
        assert len(seen_changes) == len(set(seen_changes))
        ready = parse(next(e.id for e in got if e.event == "ready"))
        want = sum(
            1
            for p, rs in records.items()
            for r in rs
            if ready.offsets[p] <= r.offset < last.offsets[p] and r.key.startswith("k")
        )
        assert len(seen_changes) == want
    finally:
        done.set()
        for n in trio.started:
            if n.proc.poll() is None:
                n.stop()


def test_an_id_from_one_node_resumes_on_another(one, bootstrap: str) -> None:  # type: ignore[no-untyped-def]
    """Last-Event-ID from one node's stream is good on another node of the app (one that holds
    no replica yet: it reads the topic itself)."""
    node, kv, _ = one
    other = start_node(node_app(node), bootstrap, Path(node.log_file).parent)
    try:
        other.wait_ready()
        first = _watch(node, prefix="a")
        first.wait_for(lambda s: s.of("ready"))
        kv.write(bootstrap, [(f"a{i:02d}", {"round": 2, "i": i}) for i in range(10)])
        first.wait_for(lambda s: len(s.of("change")) >= 10)
        first.stop()
        cut = first.events[-4]
        kv.write(bootstrap, [(f"a{i:02d}", {"round": 3, "i": i}) for i in range(10)])
        again = Stream(
            f"{other.url}/v1/tables/kv/watch",
            params={"prefix": "a"},
            headers={"last-event-id": cut.id},
        ).start()
        again.wait_for(lambda s: len(s.of("change")) >= 13)
        again.stop()
        got = [(e.data["key"], e.data["value"]) for e in again.of("change")]
        want = [(e.data["key"], e.data["value"]) for e in first.events[-3:]]
        want += [(f"a{i:02d}", {"round": 3, "i": i}) for i in range(10)]
        assert sorted(got[:13], key=orjson.dumps) == sorted(want, key=orjson.dumps)
        assert again.of("snapshot") == [] and again.of("ready") == []
    finally:
        other.stop()


def node_app(node: NodeProcess) -> str:
    args = node.proc.args  # type: ignore[attr-defined]
    return args[args.index("--app") + 1]


def test_the_feeds_end_offset_answers_while_the_feed_consumes(bootstrap: str, unique: str) -> None:
    """The end of a partition the feed does not read (a watch without a snapshot, on a
    partition this node neither holds nor feeds) is asked from another thread while the
    feed thread consumes; through the feed's own consumer that call waited 52 s for its
    turn (confluent-kafka lets one thread at a time into a client)."""
    from tablecast.cluster.validate import checker
    from tablecast.live.events import Renderer
    from tablecast.live.topic_feed import Feed, Source

    model = make_table(bootstrap, unique, "kv", 2, serde.string(), serde.json(), store="memory")
    model.write(bootstrap, [(f"k{i}", {"n": i}) for i in range(30)])
    feed = Feed(bootstrap, unique, lambda batch: feed.taken())
    feed.assign(Source(model.info.topic, Renderer(model.info), checker(model.info)), 0, 0, 1)
    feed.start()
    try:
        time.sleep(2)  # the feed thread is in its consume loop, at the end of partition 0
        ends: list[int] = []
        # on a thread of its own: the call this replaced never returned (a 600 s test timeout)
        asker = threading.Thread(
            target=lambda: ends.extend(feed.end_offset(model.info.topic, p) for p in (0, 1)),
            daemon=True,
        )
        asker.start()
        asker.join(20)
        assert not asker.is_alive(), "end_offset did not answer within 20 s"
        assert sum(ends) == 30, ends
    finally:
        feed.stop()


def _fresh_table(node: NodeProcess, bootstrap: str, name: str) -> Any:
    """A table of the node's app that no watch of the node has followed yet, served by it."""
    model = make_table(bootstrap, node_app(node), name, PARTITIONS, serde.string(), serde.json())
    model.write(bootstrap, [(f"k{i:02d}", {"n": i}) for i in range(24)])
    eventually(lambda: node.get(f"/v1/tables/{name}/count").status_code == 200, timeout=60)
    node.wait_caught_up(bootstrap, name, model.info.topic)
    return model


def test_positions_beyond_the_topic_end_are_refused_and_the_feed_stays_whole(
    bootstrap: str, one
) -> None:  # type: ignore[no-untyped-def]
    """A resume token or an after position beyond its partition's end is no position a node
    handed out: 400 on every way in, before the watch feed every watcher of the node shares
    is started from it; the watchers after it get every change."""
    from ..support.ws import WebSocket

    node, _, _ = one
    model = _fresh_table(node, bootstrap, "fresh")
    topic = model.info.topic
    ends = _ends(bootstrap, topic)
    far = ",".join(f"{p}:{10**12}" for p in range(PARTITIONS))
    path = "/v1/tables/fresh/watch"
    status, body = _opened(node, path, {"prefix": "", "since": f"fresh@{far}"})
    assert status == 400 and "beyond its end" in body["error"]["message"], body
    one_ahead = ",".join(f"{p}:{ends[p] + (p == 0)}" for p in range(PARTITIONS))
    status, body = _opened(node, path, {"prefix": ""}, {"last-event-id": f"fresh@{one_ahead}"})
    assert status == 400 and body["error"]["code"] == "bad_request", body
    ws = WebSocket(f"{node.url}{path}", params={"prefix": "", "since": f"fresh@{far}"})
    message = ws.receive()
    assert message is not None and message["data"]["error"]["code"] == "bad_request", message
    assert ws.receive() is None  # closed
    ws.close()
    # reads: an after position beyond the end is refused, one at the end answers at once
    key = "k03"
    p = model.info.partition_of(model.info.key_serde.serialize(key))
    beyond = f"fresh@{p}:{ends[p] + 1}"
    for route, params in ((f"/v1/tables/fresh/keys/{key}", {}), ("/v1/tables/fresh/range", {})):
        r = node.get(route, params={**params, "after": beyond, "timeout_ms": "20000"})
        assert r.status_code == 400 and "beyond its end" in r.text, (route, r.text)
        r = node.get(route, headers={"x-tablecast-after": beyond})
        assert r.status_code == 400, (route, r.text)
        r = node.get(route, params={**params, "after": f"fresh@{p}:{ends[p]}"})
        assert r.status_code == 200, (route, r.text)
    # a token at the end: a watch from there on
    at_end = ",".join(f"{q}:{ends[q]}" for q in range(PARTITIONS))
    watchers = [
        Stream(f"{node.url}{path}", params={"prefix": "", "since": f"fresh@{at_end}"}).start()
        for _ in range(3)
    ] + [_watch_table(node, "fresh", prefix="") for _ in range(3)]
    for w in watchers[:3]:
        w.wait_for(lambda s: s.status == 200)  # its head goes out as the watch begins
    for w in watchers[3:]:
        w.wait_for(lambda s: s.of("ready"))
    model.write(bootstrap, [(f"new{i:02d}", {"i": i}) for i in range(14)])
    for w in watchers:
        w.wait_for(lambda s: len(s.of("change")) >= 14)
        w.stop()
    assert all(len(w.of("change")) == 14 for w in watchers)


def _opened(
    node: NodeProcess, path: str, params: dict[str, str], headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    """A watch's status and, when refused, its error (a stream is closed at once)."""
    with httpx.stream("GET", node.url + path, params=params, headers=headers, timeout=10) as r:
        return r.status_code, None if r.status_code == 200 else orjson.loads(r.read())


def _watch_table(node: NodeProcess, table: str, **params: Any) -> Stream:
    return Stream(f"{node.url}/v1/tables/{table}/watch", params=params).start()


def test_open_watches_keep_their_changes_after_a_catalog_change(bootstrap: str, one) -> None:  # type: ignore[no-untyped-def]
    """An index added to a table while watches follow it: the next watch's start takes the
    new catalog entry, and the watches opened before go on getting changes."""
    from tablecast.kafka import catalog

    node, _, _ = one
    model = _fresh_table(node, bootstrap, "cat")
    before = _watch_table(node, "cat", prefix="")
    before.wait_for(lambda s: s.of("ready"))
    indexed = replace(model.info, extra={"indexes": ["color"]})
    catalog.publish(bootstrap, node_app(node), [indexed])

    def sees_the_index() -> bool:
        tables = node.get("/v1/tables").json()["tables"]
        return any(t["name"] == "cat" and "color" in str(t) for t in tables)

    eventually(sees_the_index, timeout=60)
    after = _watch_table(node, "cat", prefix="", snapshot="false")
    after.wait_for(lambda s: s.of("ready"))
    model.write(bootstrap, [(f"k{i:02d}", {"n": 100 + i}) for i in range(5)])
    for w in (after, before):
        w.wait_for(lambda s: len(s.of("change")) >= 5, timeout=30)
        w.stop()
    assert [e.data["value"]["n"] for e in before.of("change")] == [
        e.data["value"]["n"] for e in after.of("change")
    ]


class _Kept(Sink):
    """A sink that keeps the change events flushed to it (SSE-encoded)."""

    def __init__(self, touched: Any) -> None:
        super().__init__(touched)
        self.changes = 0

    def flush(self) -> None:
        self.changes += sum(e.count(b"event: change\n") for e in self.pending)
        self.pending.clear()


def test_a_feed_begun_beyond_the_end_reads_on_and_its_catch_ups_rejoin(
    bootstrap: str, unique: str
) -> None:
    """The hub on its own (no service to refuse the position): a watch at offsets beyond the
    topic's end starts the partitions' feed there; the watches that come after it at the real
    end read privately first (four at a time), and must join the feed and give their
    reader's slot back, so that every one of them gets every change."""
    from tablecast.live.hub import CATCH_UPS, Hub, Start, Watch
    from tablecast.live.selection import Selection

    model = make_table(bootstrap, unique, "kv", 2, serde.string(), serde.json(), store="memory")
    info = model.info
    model.write(bootstrap, [(f"k{i:02d}", {"n": i}) for i in range(20)])
    ends = _ends(bootstrap, info.topic, 2)

    async def run() -> None:
        hub = Hub(bootstrap, unique, lambda: {"kv": info})
        hub.start()
        try:
            renderer, _ = hub.source(info)
            everything = Selection.of_span(info, None, None, None)

            def open_at(positions: dict[int, int]) -> _Kept:
                sink = _Kept(hub.touched)
                watch = Watch(hub, info, renderer, everything, SSE_ENCODER)
                hub.begin(watch, sink, Start([], positions, snapshot=False))
                return sink

            open_at({p: 10**12 for p in range(2)})
            sinks = [open_at(dict(ends)) for _ in range(6)]
            await asyncio.sleep(3)
            await asyncio.to_thread(
                model.write, bootstrap, [(f"n{i:02d}", {"i": i}) for i in range(14)]
            )
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and (
                any(s.changes < 14 for s in sinks) or hub._catch_up_slots._value < CATCH_UPS
            ):
                await asyncio.sleep(0.2)
            assert [s.changes for s in sinks] == [14] * 6
            assert hub._catch_up_slots._value == CATCH_UPS  # every private reader let go
        finally:
            hub.stop()

    asyncio.run(run())
