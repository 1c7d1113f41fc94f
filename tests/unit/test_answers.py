"""Kept answers of plain key reads are answered only while the read path would give the same.

The HTTP hot path answers ``GET /v1/tables/{t}/keys/{k}`` from whole answers kept
by URL path (query/kept_answers.py). Each way the read path's answer can change must
make a kept answer unusable: an apply (of any key of the partition: the position
header moves), a new topic end (the lag header), staleness, a release or reopen,
another owner, a changed catalog entry, and a read that overlapped an apply must
not be kept at all."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
import pytest

from tablecast.cluster.replica import Replica
from tablecast.cluster.replica_lifecycle import Freshness, Writes
from tablecast.http import decode
from tablecast.http.decode import HttpRequest
from tablecast.query.cursor import Cursors
from tablecast.query.errors import ApiError
from tablecast.query.kept_answers import (
    ENTRY_OVERHEAD,
    JSON,
    MAX_REQUESTS_PER_ANSWER,
    REQUEST_OVERHEAD,
    WIRE_OVERHEAD,
    Answers,
)
from tablecast.query.queries import KeyQuery
from tablecast.query.reads import Router
from tablecast.query.request import Request
from tablecast.store import Write
from tablecast.store.memory import MemoryStore

from ..support.nodes import PLAIN_INFO, OneReplicaNode

INFO = PLAIN_INFO
PATH = "/v1/tables/t/keys/k"


def _setup(max_bytes: int = 1 << 20) -> tuple[Router, Answers, Replica, OneReplicaNode]:
    replica = Replica(INFO, 0, MemoryStore(), freshness=Freshness.CURRENT)
    replica.apply([Write(b"k", orjson.dumps("v0"), 0, 0), Write(b"j", b"1", 1, 0)])
    replica.end_offset = replica.position
    node = OneReplicaNode(INFO, replica)
    answers = Answers(node, max_bytes)  # type: ignore[arg-type]
    router = Router(node, Cursors(b"s" * 32), None, answers=answers)  # type: ignore[arg-type]
    return router, answers, replica, node


def _read(router: Router, key: str = "k", headers: Any = None, **params: str) -> Any:
    req = HttpRequest(params, "", headers or {})
    query = decode.key_query({"table": "t", "key": key}, req)
    return router.key(query, req, f"/v1/tables/t/keys/{key}")


def _write(replica: Replica, key: bytes, value: object) -> None:
    replica.apply([Write(key, orjson.dumps(value), replica.position, 0)])
    replica.end_offset = replica.position


def test_a_read_is_kept_whole_and_answered_as_the_read_path_would() -> None:
    router, answers, _, _ = _setup()
    code, body, headers = _read(router)
    assert code == 200 and orjson.loads(body)["value"] == "v0"
    entry = answers.get(PATH)
    assert entry is not None
    assert entry.body == body and entry.headers == [JSON, *headers]
    assert answers.hits == 1


@pytest.mark.parametrize("key", [b"k", b"j"])
def test_any_apply_to_the_partition_ends_it(key: bytes) -> None:
    router, answers, replica, _ = _setup()
    _read(router)
    _write(replica, key, "v1")  # another key too: the position header moved
    assert answers.get(PATH) is None
    assert answers.get_many([PATH]) == [None]
    _, body, headers = _read(router)
    entry = answers.get(PATH)
    assert entry is not None and entry.body == body and entry.headers == [JSON, *headers]
    assert orjson.loads(body)["value"] == ("v1" if key == b"k" else "v0")


def test_a_new_topic_end_ends_it_lag_is_in_the_headers() -> None:
    router, answers, replica, _ = _setup()
    _read(router)
    replica.end_offset += 5
    assert answers.get(PATH) is None
    _, _, headers = _read(router)
    assert ("x-tablecast-lag", "5") in headers
    assert answers.get(PATH) is not None


@pytest.mark.parametrize(
    "change",
    [
        lambda r, n: setattr(r, "stale_since", 1.0),
        lambda r, n: r.move(Freshness.BEHIND),
        lambda r, n: r.release(),
        lambda r, n: [r.move(Writes.FAILED), r.move(Writes.REOPENING)],
        lambda r, n: n.view.target.__setitem__(("t", 0), ["peer", "me"]),
        lambda r, n: n.ingestor.tables.__setitem__("t", dataclasses.replace(INFO)),
        lambda r, n: n.ingestor.tables.pop("t"),
    ],
    ids=["stale", "behind", "released", "reopening", "other owner", "catalog", "dropped"],
)
def test_whatever_would_change_the_answer_ends_it(change: Any) -> None:
    router, answers, replica, node = _setup()
    _read(router)
    _read(router, "j")
    both = [PATH, "/v1/tables/t/keys/j", "/v1/tables/t/keys/unread"]
    entry = answers.get(PATH)
    assert entry is not None
    # a forwarded batch's reads, all at once, find what each would alone
    assert answers.get_many(both) == [entry, answers.get(both[1]), None]
    change(replica, node)
    assert answers.get(PATH) is None
    assert answers.get_many(both) == [None, None, None]


def test_a_read_that_overlapped_an_apply_is_not_kept() -> None:
    router, answers, replica, _ = _setup()
    local = router.local
    real_headers = local.headers

    def headers_then_apply(r: Replica, position: int) -> Any:
        made = real_headers(r, position)
        # an apply lands after the store was read, before the answer is kept (the topic's
        # end known already): the answer is exact at the old position, not the new one
        local.headers = real_headers  # type: ignore[method-assign]
        replica.apply([Write(b"k", orjson.dumps("v1"), replica.position, 0)])
        return made

    local.headers = headers_then_apply  # type: ignore[method-assign]
    code, body, _ = _read(router)
    assert code == 200 and orjson.loads(body)["value"] == "v0"
    assert answers.get(PATH) is None
    _, body, _ = _read(router)
    assert orjson.loads(body)["value"] == "v1"
    entry = answers.get(PATH)
    assert entry is not None and orjson.loads(entry.body)["value"] == "v1"


@pytest.mark.parametrize("move", ["skipped", "fresh again"])
def test_a_read_whose_replica_moved_without_an_apply_is_not_kept(move: str) -> None:
    """The position moves on past a record left out (or a transaction's marker) and a stale
    replica turns fresh without an apply: an answer made before either says what it was
    then (lag, staleness), so it is not kept at the replica's new standing."""
    router, answers, replica, _ = _setup()
    local = router.local
    real_headers = local.headers
    if move == "skipped":
        replica.end_offset = replica.position + 1  # one record more, to be left out
    else:
        replica.stale_since = 1.0

    def headers_then_move(r: Replica, position: int) -> Any:
        made = real_headers(r, position)
        local.headers = real_headers  # type: ignore[method-assign]
        if move == "skipped":
            replica.skip_past(replica.position)
        else:
            replica.stale_since = None
        return made

    local.headers = headers_then_move  # type: ignore[method-assign]
    _, _, then = _read(router)
    assert answers.get(PATH) is None
    _, body, now = _read(router)
    assert now != then
    entry = answers.get(PATH)
    assert entry is not None and entry.body == body and entry.headers == [JSON, *now]


def test_only_plain_found_reads_are_kept() -> None:
    router, answers, _, _ = _setup()
    with pytest.raises(ApiError):
        _read(router, "missing")
    assert answers.get("/v1/tables/t/keys/missing") is None
    _read(router, max_lag="0")  # consistency options: not the plain read
    assert answers.get(PATH) is None
    router.key(KeyQuery.latest("t", "k"), Request({}))  # another caller: no path
    assert answers.get(PATH) is None


def test_when_full_it_drops_its_oldest_answers_and_stays_nearly_full() -> None:
    router, answers, replica, _ = _setup(max_bytes=40_000)  # about forty answers
    for i in range(200):
        _write(replica, f"k{i}".encode(), i)
    for i in range(200):
        _read(router, f"k{i}")
        assert answers._bytes <= answers.max_bytes
    kept = [i for i in range(200) if f"/v1/tables/t/keys/k{i}" in answers._entries]
    # the newest ones, a run up to the last: the oldest went first
    assert kept == list(range(200 - len(kept), 200))
    # starting over when full left it half full on average; dropping an eighth keeps 7/8
    assert answers._bytes >= answers.max_bytes * 7 // 8 - 1000
    assert answers._bytes == sum(len(p) + 2 * len(e.body) for p, e in answers._entries.items()) + (
        len(answers) * (ENTRY_OVERHEAD + WIRE_OVERHEAD)
    )


def test_keeping_a_path_again_counts_it_once() -> None:
    router, answers, replica, _ = _setup()
    for i in range(20):  # each write moves the position: the next read keeps it anew
        _write(replica, b"k", "x" * i)
        _read(router, "k")
    entry = answers._entries[PATH]
    assert len(answers) == 1 and answers._bytes == len(PATH) + 2 * len(entry.body) + (
        ENTRY_OVERHEAD + WIRE_OVERHEAD
    )


def test_what_it_counts_covers_the_memory_it_takes() -> None:
    """--answers-mb bounds the memory: each entry's path, body, headers and objects, the
    whole response the loop engine keeps beside it once written (Entry.wire), and the
    request it keeps it under."""
    import gc
    import tracemalloc

    router, answers, replica, _ = _setup(max_bytes=1 << 30)
    keys = [f"key-{i:06d}" for i in range(2000)]
    replica.apply(
        [
            Write(k.encode(), orjson.dumps({"n": i, "text": "x" * 80}), i, 0)
            for i, k in enumerate(keys)
        ]
    )
    replica.end_offset = replica.position
    tracemalloc.start()
    try:
        for k in keys:
            _read(router, k)
        for path, entry in list(answers._entries.items()):  # as the loop engine does
            entry.whole()
            answers.keep_request(f"GET {path} HTTP/1.1\r\nhost: n\r\n\r\n".encode(), entry)
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        counted = answers._bytes
        answers._entries = {}
        answers._requests = {}
        gc.collect()
        taken = before - tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(keys) * 300 < taken <= counted, (taken, counted)


class _GrpcApp:
    """What the gRPC service reads with, around the router above (no auth, no limit)."""

    def __init__(self, router: Router, node: OneReplicaNode) -> None:
        from tablecast.query.auth import Auth
        from tablecast.query.gate import Gate

        self.node, self.router, self.live = node, router, None
        self.gate = Gate(Auth(), None)


def test_a_grpc_get_is_kept_apart_and_ends_with_the_same_moves() -> None:
    from tablecast.grpc.http2 import Call
    from tablecast.grpc.service import Tables, kept_name
    from tablecast.proto import tables_pb2 as pb

    router, answers, replica, node = _setup()
    tables = Tables(_GrpcApp(router, node))  # type: ignore[arg-type]
    call = Call({}, "127.0.0.1:1", None)

    def get() -> pb.GetResponse:
        answer = tables.get(pb.GetRequest(table="t", key="k"), call)
        return pb.GetResponse.FromString(answer)

    first = get()
    assert first.found and first.row.value == '"v0"'
    assert answers.get(kept_name("t", "k")) is not None and answers.get(PATH) is None
    assert get() == first  # from the kept bytes, equal to the read's
    http_headers = _read(router)[2]  # HTTP's own entry beside it
    assert dict(http_headers)["x-tablecast-position"] == first.position
    _write(replica, b"j", 1)  # another key of the partition: the position moved
    assert answers.get(kept_name("t", "k")) is None
    second = get()
    assert second.row.value == '"v0"' and second.position != first.position
    _write(replica, b"k", "v1")
    assert get().row.value == '"v1"'
    # a call that says it is a peer's hop is refused, kept answer or not
    with pytest.raises(Exception, match="nodes' own calls"):
        tables.get(pb.GetRequest(table="t", key="k"), Call({"x-tablecast-hop": "1"}, "", None))


def test_kept_answers_count_as_key_reads_when_the_figures_are_read() -> None:
    from tablecast.query.stats import HttpStats

    stats = HttpStats()
    stats.record("key", 200, 0.002)
    stats.kept += 3  # what the hot path does for each kept answer given
    families = {f.name: f for f in stats.collect()}
    requests = {
        (s.labels["route"], s.labels["status"]): s.value
        for s in families["tablecast_http_requests"].samples
    }
    assert requests == {("key", "200"): 4} and stats.kept == 0
    first_bucket = next(
        s.value
        for s in families["tablecast_http_request_duration_seconds"].samples
        if s.name.endswith("_bucket") and s.labels["le"] == "0.0005"
    )
    assert first_bucket == 3
    stats.kept += 2  # a read process's report (all since its last one) carries them too
    delta = orjson.loads(stats.delta())
    assert delta["requests"] == [["key", 200, 6]] and delta["buckets"]["key"][0] == 5


RAW = b"GET /v1/tables/t/keys/k HTTP/1.1\r\nhost: n\r\n\r\n"


def test_an_answer_kept_under_a_request_s_bytes_ends_with_it() -> None:
    """The loop engine keeps an answer under the bytes of a request it answered, to answer
    the same bytes again unparsed: every move that ends the answer ends that name too."""
    router, answers, replica, _ = _setup()
    _read(router)
    entry = answers.get(PATH)
    assert entry is not None
    alone = answers._bytes
    answers.keep_request(RAW, entry)
    assert answers.get_request(RAW) is entry
    assert answers._bytes == alone + len(RAW) + REQUEST_OVERHEAD
    _write(replica, b"j", "moved")  # another key of the partition: the position moved
    assert answers.get_request(RAW) is None
    _read(router)  # kept anew: the old entry and the request's name with it go
    new = answers.get(PATH)
    assert new is not None and new is not entry
    assert answers.get_request(RAW) is None and not answers._requests
    assert answers._bytes == len(PATH) + 2 * len(new.body) + ENTRY_OVERHEAD + WIRE_OVERHEAD
    answers.keep_request(RAW, entry)  # an entry no longer kept is not kept under a request
    assert answers.get_request(RAW) is None
    answers.keep_request(RAW, new)
    assert answers.get_request(RAW) is new


def _written_and_read(max_bytes: int, written: int, read: int) -> tuple[Router, Answers]:
    """Keys k0.. written, then the first `read` of them read (kept) in order."""
    router, answers, replica, _ = _setup(max_bytes)
    for i in range(written):
        _write(replica, f"k{i}".encode(), i)
    for i in range(read):
        _read(router, f"k{i}")
    return router, answers


def test_requests_names_go_with_their_answers_when_full() -> None:
    router, answers = _written_and_read(40_000, 200, 0)
    for i in range(200):
        _read(router, f"k{i}")
        entry = answers.get(f"/v1/tables/t/keys/k{i}")
        assert entry is not None
        answers.keep_request(RAW.replace(b"/k ", f"/k{i} ".encode()), entry)
        assert answers._bytes <= answers.max_bytes
    assert set(answers._requests.values()) <= set(answers._entries.values())
    # answers come first: when full, a request's name waits for room; none pushes one out
    assert 0 < len(answers._requests) <= len(answers)
    full = len(answers)
    for n in range(100):  # names for the answers kept: none pushes an answer out
        for entry in list(answers._entries.values()):
            answers.keep_request(b"%d " % n + RAW, entry)
    assert len(answers) == full and answers._bytes <= answers.max_bytes
    counted = sum(len(p) + 2 * len(e.body) for p, e in answers._entries.items())
    counted += len(answers) * (ENTRY_OVERHEAD + WIRE_OVERHEAD)
    counted += sum(len(r) + REQUEST_OVERHEAD for r in answers._requests)
    assert answers._bytes == counted


def test_an_answer_takes_the_room_of_requests_names_first() -> None:
    router, answers = _written_and_read(40_000, 31, 30)
    entries = list(answers._entries.values())
    for n in range(1000):  # names until no more fit
        answers.keep_request(b"%d " % n + RAW, entries[n % len(entries)])
    assert answers._bytes > answers.max_bytes - (len(RAW) + 4 + REQUEST_OVERHEAD)
    kept, names = len(answers), len(answers._requests)
    _read(router, "k30")
    assert len(answers) == kept + 1  # the new answer took names' room, not an answer's
    assert 0 < len(answers._requests) < names
    assert all(answers._requests[r] is e for e in answers._entries.values() for r in e.requests)
    assert sum(len(e.requests) for e in answers._entries.values()) == len(answers._requests)


def test_an_answer_is_kept_under_a_few_requests_at_most() -> None:
    """A client whose every request differs (a trace id) piles no names on a hot answer."""
    router, answers, _, _ = _setup()
    _read(router)
    entry = answers.get(PATH)
    assert entry is not None
    for n in range(100):
        answers.keep_request(RAW.replace(b"\r\n\r\n", b"\r\nx-trace: %d\r\n\r\n" % n), entry)
    assert len(entry.requests) == len(answers._requests) == MAX_REQUESTS_PER_ANSWER
