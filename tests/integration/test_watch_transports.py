"""The watch over SSE, WebSocket and gRPC on two real nodes with auth and a policy: the three
transports carry the same events with the same ids, gRPC's Get/BatchGet/Range answer as HTTP
does, and a watch never delivers a row the caller's grants do not cover, on any transport."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import grpc
import jwt
import orjson
import pytest

from tablecast import serde
from tablecast.grpc.service import TablesStub
from tablecast.kafka.broker import free_port
from tablecast.proto import tables_pb2 as pb

from ..support.procs import NodeProcess, eventually, start_node
from ..support.sse import Stream
from ..support.ws import WebSocket
from .tables import make_table

pytestmark = pytest.mark.integration

SECRET = "watch-transport-tests-secret-0123456789ab"
POLICY = """
rules:
  - tables: {kv: {key_prefix: "{sub}/"}}
  - match: {role: admin}
    tables: {"*": "*"}
"""


def bearer(ttl: float = 86_400, **claims: Any) -> str:  # made at collection; the suite runs long
    return jwt.encode({"exp": int(time.time() + ttl), **claims}, SECRET, algorithm="HS256")


ADMIN = bearer(sub="root", role="admin")
ALICE = bearer(sub="alice")
#: watches one caller may have open on a node (the other tests stay well under it)
MAX_WATCHES = 8


def auth(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


class Node:
    def __init__(self, proc: NodeProcess, grpc_port: int) -> None:
        self.proc, self.url, self.grpc = proc, proc.url, f"127.0.0.1:{grpc_port}"


@pytest.fixture(scope="module")
def nodes(bootstrap: str, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    app = f"wtr{time.monotonic_ns() % 10**8}"
    tmp = tmp_path_factory.mktemp("wtr")
    policy = tmp / "policy.yaml"
    policy.write_text(POLICY)
    kv = make_table(bootstrap, app, "kv", 4, serde.string(), serde.json())
    kv.write(
        bootstrap, [(f"{u}/{i:02d}", {"u": u, "i": i}) for u in ("alice", "bob") for i in range(12)]
    )
    out = []
    for _ in range(2):
        port = free_port()
        proc = start_node(
            app, bootstrap, tmp,
            "--auth-jwt-secret", SECRET, "--auth-policy", str(policy), "--grpc-port", str(port),
            "--max-watches", str(MAX_WATCHES),
        )  # fmt: skip
        out.append(Node(proc, port))
    try:
        for n in out:
            n.proc.wait_ready()

        def settled() -> bool:  # both nodes answer for every partition (ownership settled)
            return all(
                n.proc.get("/v1/tables/kv/count", headers=auth(ADMIN)).status_code == 200
                for n in out
            )

        eventually(settled, timeout=60)
        yield out, kv
    finally:
        for n in out:
            n.proc.stop()


def _sse(node: Node, token: str | None, **params: Any) -> Stream:
    return Stream(
        f"{node.url}/v1/tables/kv/watch", params=params, headers=auth(token) if token else {}
    ).start()


def _ws_events(node: Node, token: str, params: Any, until: Any, timeout: float = 30) -> list[dict]:  # type: ignore[type-arg]
    ws = WebSocket(f"{node.url}/v1/tables/kv/watch", params=params, headers=auth(token))
    assert ws.status == 101
    out: list[dict] = []  # type: ignore[type-arg]
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            message = ws.receive()
            if message is None:
                break
            if message["event"] != "keep-alive":
                out.append(message)
            if until(out):
                return out
    finally:
        ws.close()
    raise AssertionError(f"the WebSocket watch did not get there: {out[-3:]}")


def _grpc_events(
    node: Node, token: str, request: pb.WatchRequest, until: Any, timeout: float = 30
) -> list:  # type: ignore[type-arg]
    async def run() -> list:  # type: ignore[type-arg]
        out = []
        async with grpc.aio.insecure_channel(node.grpc) as channel:
            call = TablesStub(channel).Watch(
                request, metadata=(("authorization", f"Bearer {token}"),)
            )
            async with asyncio.timeout(timeout):
                async for event in call:
                    if event.event != "keep-alive":
                        out.append(event)
                    if until(out):
                        call.cancel()
                        return out
        raise AssertionError(f"the gRPC watch ended: {out[-3:]}")

    return asyncio.run(run())


def _ready(events: list) -> bool:  # type: ignore[type-arg]
    return any((e["event"] if isinstance(e, dict) else e.event) == "ready" for e in events)


def _changes(n: int):  # type: ignore[no-untyped-def]
    return lambda events: (
        sum(1 for e in events if (e["event"] if isinstance(e, dict) else e.event) == "change") >= n
    )


def _per_partition(events: list[tuple[str, str, dict[str, Any]]]) -> dict[int, list]:  # type: ignore[type-arg]
    """Each partition's events in order, and the position every stream reaches at its end.
    Every id must name its own event's position (offset + 1 for the event's partition)."""
    out: dict[int, list] = {}  # type: ignore[type-arg]
    for kind, token, data in events:
        position = dict(p.split(":") for p in token.split("@", 1)[1].split(";")[0].split(","))
        assert int(position[str(data["partition"])]) == data["offset"] + 1, (token, data)
        out.setdefault(data["partition"], []).append((kind, data))
    out[-1] = [events[-1][1]] if events else []
    return out


def test_sse_websocket_and_grpc_carry_the_same_events(bootstrap: str, nodes) -> None:  # type: ignore[no-untyped-def]
    (a, b), kv = nodes
    sse = _sse(a, ADMIN, prefix="alice/")
    sse.wait_for(lambda s: s.of("ready"))
    ready = sse.of("ready")[0].id
    kv.write(bootstrap, [(f"alice/{i:02d}", {"u": "alice", "i": i, "round": 2}) for i in range(5)])
    sse.wait_for(lambda s: len(s.of("change")) >= 5)
    sse.stop()
    want = [(e.event, e.id, e.data) for e in sse.events]
    # the same watch resumed from its ready id on the other node, over each transport
    ws = _ws_events(b, ADMIN, {"prefix": "alice/", "since": ready}, _changes(5))
    want = want[len(want) - 5 :]
    # the API orders changes per partition only: another node may interleave partitions otherwise,
    # and an id is the position after its event, so ids agree where the interleaving does
    assert _per_partition([(m["event"], m["id"], m["data"]) for m in ws]) == _per_partition(want)
    full = _ws_events(
        a, ADMIN, {"prefix": "alice/"}, lambda out: any(m["event"] == "ready" for m in out)
    )
    assert [m["data"]["key"] for m in full if m["event"] == "snapshot"] == [
        f"alice/{i:02d}" for i in range(12)
    ]
    events = _grpc_events(
        b, ADMIN, pb.WatchRequest(table="kv", prefix="alice/", since=ready), _changes(5)
    )
    got = [
        (
            e.event,
            e.id,
            {
                "key": e.row.key,
                "value": orjson.loads(e.row.value),
                "partition": e.row.partition,
                "offset": e.row.offset,
            },
        )
        for e in events
    ]
    assert _per_partition(got) == _per_partition(
        [(k, i, {f: d[f] for f in ("key", "value", "partition", "offset")}) for k, i, d in want]
    )
    snap = _grpc_events(
        a,
        ADMIN,
        pb.WatchRequest(table="kv", keys=["bob/03", "alice/01"]),
        lambda out: out[-1].event == "ready",
    )
    assert [(e.event, e.row.key) for e in snap] == [
        ("snapshot", "alice/01"),
        ("snapshot", "bob/03"),
        ("ready", ""),
    ]
    assert snap[-1].rows == 2


def test_grpc_reads_answer_as_http_does(nodes) -> None:  # type: ignore[no-untyped-def]
    (a, b), kv = nodes

    async def run(node: Node, token: str) -> dict[str, Any]:
        md = (("authorization", f"Bearer {token}"),)
        async with grpc.aio.insecure_channel(node.grpc) as channel:
            stub = TablesStub(channel)
            out: dict[str, Any] = {}
            out["get"] = await stub.Get(pb.GetRequest(table="kv", key="alice/03"), metadata=md)
            out["missing"] = await stub.Get(pb.GetRequest(table="kv", key="alice/99"), metadata=md)
            out["batch"] = await stub.BatchGet(
                pb.BatchGetRequest(table="kv", keys=["alice/01", "bob/01", "alice/99"]), metadata=md
            )
            pages, cursor, positions = [], "", []
            while True:
                page = await stub.Range(
                    pb.RangeRequest(table="kv", limit=5, cursor=cursor), metadata=md
                )
                pages += [(i.key, i.value, i.partition, i.offset, i.timestamp) for i in page.items]
                positions.append((page.position, page.node))
                cursor = page.next_cursor
                if not cursor:
                    break
            out["range"], out["range_positions"] = pages, positions
            for name, call in (
                ("bob", stub.Get(pb.GetRequest(table="kv", key="bob/01"), metadata=md)),
                ("nobody", stub.Get(pb.GetRequest(table="kv", key="alice/01"))),
                ("bad", stub.Range(pb.RangeRequest(table="kv", limit=100_000), metadata=md)),
            ):
                try:
                    await call
                    out[name] = None
                except grpc.aio.AioRpcError as e:
                    out[name] = (e.code(), dict(e.trailing_metadata() or ()).get("tablecast-error"))
            return out

    for node in (a, b):
        got = asyncio.run(run(node, ALICE))
        row = got["get"].row
        assert got["get"].found and row.key == "alice/03"
        assert orjson.loads(row.value) == kv.rows[b"alice/03"]
        assert got["get"].position.startswith("kv@") and got["get"].node
        assert not got["missing"].found
        assert [(r.key, r.found, r.forbidden) for r in got["batch"].results] == [
            ("alice/01", True, False),
            ("bob/01", False, True),
            ("alice/99", False, False),
        ]
        assert [item[0] for item in got["range"]] == [f"alice/{i:02d}" for i in range(12)]
        # each range item names its record as Get's row does
        item = next(item for item in got["range"] if item[0] == "alice/03")
        assert item[2:] == (row.partition, row.offset, row.timestamp) and row.timestamp > 0
        # every answer says the position it is exact at and who answered, as Get's does
        for position, answered in [
            *got["range_positions"],
            (got["batch"].position, got["batch"].node),
        ]:
            assert position.startswith("kv@") and answered, (position, answered)
        assert got["bob"] == (grpc.StatusCode.PERMISSION_DENIED, "forbidden")
        assert got["nobody"] == (grpc.StatusCode.UNAUTHENTICATED, "unauthorized")
        assert got["bad"] == (grpc.StatusCode.INVALID_ARGUMENT, "bad_request")


def test_a_watch_never_delivers_a_row_the_grants_do_not_cover(bootstrap: str, nodes) -> None:  # type: ignore[no-untyped-def]
    (a, b), kv = nodes
    for node in (a, b):
        # every key, as alice: her rows only, in the snapshot and in the changes
        sse = _sse(node, ALICE, prefix="")
        sse.wait_for(lambda s: s.of("ready"))
        kv.write(
            bootstrap,
            [
                ("bob/01", {"secret": 1}),
                ("alice/00", {"mine": 1}),
                ("bob/02", None),
                ("alicex", {"x": 1}),
            ],
        )
        sse.wait_for(lambda s: any(e.data["key"] == "alice/00" for e in s.of("change")))
        sse.stop()
        # the other transports from the same start: bob's changes come by them too, and must
        # not come out; then a fresh snapshot of each
        ready = sse.of("ready")[0].id
        mine = _changes(1)
        ws = _ws_events(node, ALICE, {"from": "a", "to": "z", "since": ready}, mine)
        ws += _ws_events(node, ALICE, {"from": "a", "to": "z"}, _ready)
        rpc = _grpc_events(node, ALICE, pb.WatchRequest(table="kv", prefix="", since=ready), mine)
        rpc += _grpc_events(node, ALICE, pb.WatchRequest(table="kv", start="a"), _ready)
        shown = (
            [e.data["key"] for e in sse.events if e.event in ("snapshot", "change")]
            + [m["data"]["key"] for m in ws if m["event"] in ("snapshot", "change")]
            + [e.row.key for e in rpc if e.event in ("snapshot", "change")]
        )
        assert shown and all(k.startswith("alice/") for k in shown), sorted(set(shown))
        # a key outside the grants: refused on every transport; no token: refused
        r = _sse(node, ALICE, key="bob/01")
        r.ended.wait(10)
        assert r.status == 403
        ws_refused = WebSocket(
            f"{node.url}/v1/tables/kv/watch", params={"key": "bob/01"}, headers=auth(ALICE)
        )
        message = ws_refused.receive()
        assert message is not None and message["event"] == "error"
        assert message["data"]["error"]["code"] == "forbidden"
        ws_refused.close()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            _grpc_events(
                node, ALICE, pb.WatchRequest(table="kv", keys=["bob/01"]), lambda out: False, 10
            )
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        anonymous = _sse(node, None, key="alice/01")
        anonymous.ended.wait(10)
        assert anonymous.status == 401
        # browsers' EventSource and WebSocket cannot send a header: ?access_token= instead
        by_query = Stream(
            f"{node.url}/v1/tables/kv/watch", params={"key": "alice/01", "access_token": ALICE}
        ).start()
        by_query.wait_for(lambda s: s.of("ready"))
        by_query.stop()
        assert [e.data["key"] for e in by_query.of("snapshot")] == ["alice/01"]


def test_a_watch_ends_when_its_token_expires(nodes) -> None:  # type: ignore[no-untyped-def]
    (a, _), _ = nodes
    short = bearer(ttl=3, sub="alice")
    stream = _sse(a, short, key="alice/02")
    stream.wait_for(lambda s: s.of("ready"))
    assert stream.ended.wait(15), "the stream outlived its token"
    errors = stream.of("error")
    assert errors and errors[0].data["error"]["code"] == "unauthorized"
    eventually(lambda: 'reason="unauthorized"' in a.proc.get("/metrics", headers=auth(ADMIN)).text)


def _grpc_refusal(node: Node, call: Any) -> tuple[grpc.StatusCode, str | None]:
    """The status and tablecast-error of a gRPC call that must be refused."""

    async def run() -> tuple[grpc.StatusCode, str | None]:
        async with grpc.aio.insecure_channel(node.grpc) as channel:
            try:
                answer = call(TablesStub(channel))
                if hasattr(answer, "__aiter__"):
                    async with asyncio.timeout(20):
                        async for _ in answer:
                            pass
                else:
                    await answer
            except grpc.aio.AioRpcError as e:
                return e.code(), dict(e.trailing_metadata() or ()).get("tablecast-error")
        raise AssertionError("the call was answered")

    return asyncio.run(run())


def test_a_grpc_client_is_never_a_hop_nor_past_the_topic_end(nodes) -> None:  # type: ignore[no-untyped-def]
    """x-tablecast-hop marks the nodes' own forwarded calls over HTTP: set by a gRPC client it
    is refused, as an unsigned hop is over HTTP, whichever node holds the key (a hop is
    answered from what the node holds, or not at all); and a Watch.since beyond its
    partition's end is refused like the HTTP resume."""
    (a, b), _ = nodes
    md = (("authorization", f"Bearer {ADMIN}"), ("x-tablecast-hop", "1"))
    for node in (a, b):
        for key in ("alice/01", "alice/02", "bob/01", "bob/02"):
            got = _grpc_refusal(
                node, lambda stub, k=key: stub.Get(pb.GetRequest(table="kv", key=k), metadata=md)
            )
            assert got == (grpc.StatusCode.PERMISSION_DENIED, "forbidden"), (key, got)
        got = _grpc_refusal(
            node, lambda stub: stub.Watch(pb.WatchRequest(table="kv", prefix=""), metadata=md)
        )
        assert got == (grpc.StatusCode.PERMISSION_DENIED, "forbidden"), got
        far = ",".join(f"{p}:{10**12}" for p in range(4))
        request = pb.WatchRequest(table="kv", prefix="alice/", since=f"kv@{far}")
        got = _grpc_refusal(node, lambda stub, r=request: stub.Watch(r, metadata=md[:1]))
        assert got == (grpc.StatusCode.INVALID_ARGUMENT, "bad_request"), got


def test_a_caller_has_at_most_so_many_watches_open(nodes) -> None:  # type: ignore[no-untyped-def]
    """--max-watches per caller (its token's subject), on every transport; a watch that ends
    gives its place back, and other callers are not counted against it."""
    (a, _), _ = nodes
    capped = bearer(sub="capped")
    host, port = a.url.split("://")[1].split(":")
    held = []
    try:
        for _ in range(MAX_WATCHES):
            s = socket.create_connection((host, int(port)), timeout=10)
            s.sendall(
                b"GET /v1/tables/kv/watch?key=capped/01 HTTP/1.1\r\nhost: x\r\n"
                b"authorization: Bearer " + capped.encode() + b"\r\n\r\n"
            )
            assert s.recv(12) == b"HTTP/1.1 200"
            held.append(s)
        over = _sse(a, capped, key="capped/01")
        over.ended.wait(10)
        assert over.status == 429 and b"rate_limited" in over.body, (over.status, over.body)
        ws = WebSocket(
            f"{a.url}/v1/tables/kv/watch", params={"key": "capped/01"}, headers=auth(capped)
        )
        message = ws.receive()
        assert message is not None and message["data"]["error"]["code"] == "rate_limited"
        assert ws.close_code() == 1008
        ws.sock.close()
        got = _grpc_refusal(
            a,
            lambda stub: stub.Watch(
                pb.WatchRequest(table="kv", keys=["capped/01"]),
                metadata=(("authorization", f"Bearer {capped}"),),
            ),
        )
        assert got == (grpc.StatusCode.RESOURCE_EXHAUSTED, "rate_limited"), got
        other = _sse(a, ALICE, key="alice/01")  # another caller
        other.wait_for(lambda s: s.of("ready"))
        other.stop()
        held.pop().close()  # one ends: its place is given back

        def opens() -> bool:
            again = _sse(a, capped, key="capped/01")
            again.wait_for(lambda s: s.status is not None)
            again.stop()
            return again.status == 200

        eventually(opens, timeout=10)
    finally:
        for s in held:
            s.close()


def test_grpc_reflection_and_health_answer_without_a_token(nodes) -> None:  # type: ignore[no-untyped-def]
    """What grpcurl, grpcui and Kubernetes' gRPC probes ask: the services listed and
    described by server reflection, no proto file at hand, and grpc.health.v1 saying
    SERVING for the server and the service of a ready node; no token needed for either."""
    from google.protobuf.descriptor_pool import DescriptorPool
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )

    node = nodes[0][0]
    with grpc.insecure_channel(node.grpc) as channel:
        db = ProtoReflectionDescriptorDatabase(channel)
        assert set(db.get_services()) == {
            "tablecast.v1.Tables",
            "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection",
            "grpc.reflection.v1.ServerReflection",
        }
        pool = DescriptorPool(db)
        service = pool.FindServiceByName("tablecast.v1.Tables")
        assert [m.name for m in service.methods] == ["Get", "BatchGet", "Range", "Watch"]
        get = pool.FindMessageTypeByName("tablecast.v1.GetRequest")
        assert [f.name for f in get.fields] == ["table", "key", "max_lag"]
        health = health_pb2_grpc.HealthStub(channel)

        def serving(name: str) -> bool:  # the status follows readiness within half a second
            answer = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
            return answer.status == health_pb2.HealthCheckResponse.SERVING

        for name in ("", "tablecast.v1.Tables"):
            eventually(lambda name=name: serving(name), timeout=10)  # type: ignore[misc]
        with pytest.raises(grpc.RpcError) as unknown:
            health.Check(health_pb2.HealthCheckRequest(service="nothing.Here"), timeout=10)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
