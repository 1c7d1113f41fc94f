"""Reads as values: a read sent on to a peer, or named by a redirect, is the read that was
asked. Any query, encoded as the HTTP read it stands for (what a peer is asked), then
matched by the node's one route table and decoded as an HTTP request is, gives the query
back; and the route takes every parameter the encoding uses."""

from __future__ import annotations

from dataclasses import replace
from urllib.parse import parse_qsl

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tablecast.contract.positions import Position
from tablecast.http import decode
from tablecast.http.decode import HttpRequest
from tablecast.http.routes import ROUTES, Routes
from tablecast.live.service import watch_query
from tablecast.query.consistency import DEFAULT_TIMEOUT_MS, NO_OPTIONS, ReadOptions, bound_of
from tablecast.query.errors import ApiError
from tablecast.query.peer_calls import target_of
from tablecast.query.queries import (
    MAX_LIMIT,
    BatchQuery,
    CountQuery,
    HistoryQuery,
    IndexQuery,
    KeyQuery,
    MetadataQuery,
    PartitionCount,
    PartitionScan,
    Query,
    RangeQuery,
    SnapshotShare,
    WatchQuery,
    WindowsQuery,
)

ROUTING = Routes(ROUTES)
PARTITIONS = range(4)
TEXT = st.text(min_size=1, max_size=12)
#: key texts, also ones a path could mistake for another route
KEYS = st.one_of(TEXT, TEXT.map(lambda t: t + "/history"), st.sampled_from(["a/b", "%2F", "é"]))
TIME = st.integers(0, 2**62)
LIMIT = st.integers(1, MAX_LIMIT)
CURSOR = st.none() | st.text(st.characters(codec="ascii"), min_size=1, max_size=20)


@st.composite
def bounds(draw: st.DrawFn, table: str) -> ReadOptions:
    params: dict[str, str] = {}
    for name in ("max_lag", "max_staleness_ms"):
        if draw(st.booleans()):
            params[name] = str(draw(st.integers(0, 2**40)))
    if draw(st.booleans()):
        params["min_offset"] = f"{draw(st.sampled_from(PARTITIONS))}:{draw(st.integers(0, 99))}"
    if draw(st.booleans()):
        params["timeout_ms"] = str(draw(st.integers(0, 30_000)))
    offsets = draw(st.dictionaries(st.sampled_from(PARTITIONS), st.integers(0, 99), max_size=3))
    after = Position(table, offsets).text() if offsets else None
    return bound_of(params, after)


@st.composite
def queries(draw: st.DrawFn) -> Query:
    table = draw(TEXT)
    bound = draw(bounds(table))
    key = draw(KEYS)
    kind = draw(
        st.sampled_from(
            ["key", "windows", "history", "range", "index", "count", "scan", "share", "snapshot"]
        )
    )
    if kind == "key":
        as_of = draw(st.none() | TIME)
        if as_of is None:
            return KeyQuery.latest(table, key, bound)
        return KeyQuery.at(table, key, as_of, bound)
    if kind == "windows":
        return WindowsQuery.between(
            table, key, draw(st.none() | TIME), draw(st.none() | TIME), bound
        )
    if kind == "history":
        return HistoryQuery.versions(
            table,
            key,
            draw(st.none() | TIME),
            draw(st.none() | TIME),
            limit=draw(LIMIT),
            newest_first=draw(st.booleans()),
            cursor=draw(CURSOR),
            bound=bound,
        )
    if kind == "range":
        return RangeQuery.between(
            table,
            draw(st.none() | TEXT),
            draw(st.none() | TEXT),
            prefix=draw(st.none() | TEXT),
            as_of=draw(st.none() | TIME),
            owned=draw(st.booleans()),
            limit=draw(LIMIT),
            cursor=draw(CURSOR),
            bound=bound,
        )
    if kind == "index":
        index, limit, cursor = draw(TEXT), draw(LIMIT), draw(CURSOR)
        if draw(st.booleans()):
            return IndexQuery.equal(table, index, key, limit=limit, cursor=cursor, bound=bound)
        return IndexQuery.between(
            table,
            index,
            draw(st.none() | TEXT),
            draw(st.none() | TEXT),
            limit=limit,
            cursor=cursor,
            bound=bound,
        )
    parts = tuple(draw(st.lists(st.sampled_from(PARTITIONS), unique=True, max_size=4)))
    if kind == "scan":
        view = draw(st.sampled_from([None, "rows", "as_of", "index"]))
        index = draw(TEXT) if view == "index" else None
        return PartitionScan(
            table,
            parts,
            bound,
            view,
            draw(st.none() | st.binary(max_size=6)),
            draw(st.none() | st.binary(max_size=6)),
            draw(st.integers(1, MAX_LIMIT + 1)),
            draw(TIME) if view == "as_of" else None,
            index,
            draw(st.booleans()) if index is not None else True,
        )
    if kind == "share":
        return PartitionCount(table, parts, bound)
    if kind == "snapshot":
        keys = draw(st.none() | st.lists(st.binary(min_size=1, max_size=4), max_size=3))
        spans = draw(
            st.lists(
                st.tuples(st.none() | st.binary(max_size=3), st.none() | st.binary(max_size=3)),
                max_size=3,
            )
        )
        at_least = draw(st.dictionaries(st.sampled_from(PARTITIONS), st.integers(0, 99)))
        return SnapshotShare(
            table,
            parts,
            None if keys is None else tuple(keys),
            () if keys is not None else tuple(spans),
            tuple(sorted(at_least.items())),
        )
    return CountQuery.rows(table, bound)


def as_sent(bound: ReadOptions) -> ReadOptions:
    """What of a bound goes on: not `redirect` (the node it names answers), nor a timeout
    that nothing waits for."""
    if bound is NO_OPTIONS:
        return bound
    timeout = bound.timeout_ms if bound.at_least else DEFAULT_TIMEOUT_MS
    same = replace(bound, redirect=False, timeout_ms=timeout)
    return NO_OPTIONS if same == ReadOptions() else same


def decoded(target: str) -> Query:
    path, _, query = target.partition("?")
    route, args = ROUTING.match("GET", path)
    params = dict(parse_qsl(query, keep_blank_values=True))
    ROUTING.check(route, params)
    req = HttpRequest(params, query, {})
    # a watch's snapshot is answered by the watch service, the others by the router
    read = route.read if route.name != "internal_snapshot" else decode.snapshot_share
    assert read is not None, route
    return read(args, req)


@settings(max_examples=300, deadline=None)
@given(queries())
def test_a_read_sent_on_is_the_read_asked(query: Query) -> None:
    got = decoded(target_of(query, PARTITIONS))
    assert type(got) is type(query)
    if isinstance(query, SnapshotShare):
        # what a span means: from the empty key is from the start; to the empty key, nothing
        spans = tuple((lo or None, hi) for lo, hi in query.spans if hi != b"")
        assert got == query._replace(spans=spans)
    else:
        assert got._replace(bound=as_sent(got.bound)) == query._replace(bound=as_sent(query.bound))


@given(bounds("t"))
def test_a_redirect_names_the_read_without_redirect(bound: ReadOptions) -> None:
    query = KeyQuery.latest("t", "k", replace(bound, redirect=True))
    target = target_of(query, PARTITIONS)
    assert "redirect" not in dict(parse_qsl(target.partition("?")[2]))


def test_a_batch_goes_to_its_route_with_its_bound() -> None:
    bound = bound_of({"max_lag": "3"}, None)
    target = target_of(BatchQuery.of_keys("t t", ["a", 1], bound), PARTITIONS)
    assert target == "/v1/tables/t%20t/keys:batchGet?max_lag=3"


def test_where_a_key_lives_is_never_sent_on() -> None:
    with pytest.raises(TypeError):
        target_of(MetadataQuery.of_key("t", "k"), PARTITIONS)


def test_a_bound_is_held_to_its_table_by_the_router_not_the_decoder() -> None:
    # the decoder reads the token; which table and partitions it names is checked later
    bound = decode.bound(HttpRequest({"after": "other@9:1"}, "", {}))
    assert bound.after_table == "other" and bound.after == {9: 1}
    with pytest.raises(ApiError) as e:
        decode.key_query({"table": "t", "key": "k"}, HttpRequest({"max_lag": "-1"}, "", {}))
    assert e.value.status == 400


def test_the_values_are_immutable() -> None:
    query = KeyQuery.latest("t", "k")
    with pytest.raises(AttributeError):
        query.key = "j"  # type: ignore[misc]
    assert query == KeyQuery("t", "k") and hash(query) == hash(KeyQuery("t", "k"))


def test_a_watch_is_decoded_from_its_parameters() -> None:
    keys = watch_query("t", [("key", "a"), ("key", "b/c"), ("snapshot", "false")], None)
    assert keys == WatchQuery.of_keys("t", ["a", "b/c"], snapshot=False)
    span = watch_query("t", [("prefix", "p"), ("from", "a"), ("since", "tok")], "last")
    assert span == WatchQuery.span("t", "a", None, prefix="p", since="tok")
    assert watch_query("t", [], "last") == WatchQuery.span("t", since="last")
    for pairs in ([("key", "a"), ("key2", "b")], [("to", "a"), ("to", "b")], [("snapshot", "no")]):
        with pytest.raises(ApiError) as e:
            watch_query("t", pairs, None)
        assert e.value.status == 400
