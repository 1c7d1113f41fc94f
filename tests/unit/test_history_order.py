"""``/history?order=desc`` (query/reads.py, query/local.py): newest first, pages that
continue in that order, and cursors that page their own order only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from tablecast.http import decode
from tablecast.http.decode import HttpRequest
from tablecast.http.openapi import document
from tablecast.http.routes import Routes
from tablecast.query.errors import ApiError
from tablecast.query.local import newest_versions
from tablecast.query.reads import Router
from tablecast.store import Write

from ..support.nodes import history_router

#: versions v0..v4 of "k" at 1000, 1010, ... (written out of time order), and one of a key
#: that shares its first byte, which no read of "k" may show
TIMES = [1000, 1010, 1020, 1030, 1040]

KEY = {"table": "t", "key": "k"}


@pytest.fixture(params=["memory", "rocksdb"])
def router(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    order = [3, 0, 4, 1, 2]  # late records take their place by time
    writes = [Write(b"k", orjson.dumps(f"v{i}"), n, TIMES[i]) for n, i in enumerate(order)]
    with history_router(
        request.param, tmp_path, [*writes, Write(b"kk", orjson.dumps("other"), 5, 1050)]
    ) as router:
        yield router


def _history(router: Router, **params: str) -> Any:
    req = HttpRequest(params, "", {})
    code, body, _ = router.history(decode.history_query(KEY, req), req)
    assert code == 200
    return orjson.loads(body)


def _values(page: dict[str, Any]) -> list[str]:
    return [v["value"] for v in page["items"]]


def _all_pages(router: Router, **params: str) -> list[list[str]]:
    pages, cursor = [], None
    while True:
        page = _history(router, **params, **({"cursor": cursor} if cursor else {}))
        pages.append(_values(page))
        cursor = page["next_cursor"]
        if cursor is None:
            return pages


def test_desc_gives_the_newest_first(router: Router) -> None:
    assert _values(_history(router, order="desc")) == ["v4", "v3", "v2", "v1", "v0"]
    assert _values(_history(router, order="asc")) == ["v0", "v1", "v2", "v3", "v4"]
    assert _values(_history(router)) == ["v0", "v1", "v2", "v3", "v4"]


def test_desc_limit_is_the_latest_versions(router: Router) -> None:
    page = _history(router, order="desc", limit="2")
    assert _values(page) == ["v4", "v3"] and page["next_cursor"]
    assert [v["timestamp"] for v in page["items"]] == [1040, 1030]


def test_cursors_page_through_every_version_once_in_either_order(router: Router) -> None:
    expected = ["v0", "v1", "v2", "v3", "v4"]
    assert _all_pages(router, order="desc", limit="2") == [["v4", "v3"], ["v2", "v1"], ["v0"]]
    assert _all_pages(router, order="asc", limit="2") == [["v0", "v1"], ["v2", "v3"], ["v4"]]
    # asc is the default: the cursor of a read that named no order continues with order=asc
    cursor = _history(router, limit="2")["next_cursor"]
    assert _values(_history(router, order="asc", limit="3", cursor=cursor)) == expected[2:]


def test_desc_keeps_to_the_time_bounds(router: Router) -> None:
    # from is inclusive, to exclusive, in both orders
    bounds = {"from": "1010", "to": "1040", "limit": "2"}
    assert _all_pages(router, order="desc", **bounds) == [["v3", "v2"], ["v1"]]
    assert _all_pages(router, order="asc", **bounds) == [["v1", "v2"], ["v3"]]
    assert _history(router, order="desc", **{"from": "1041"}) == {"items": [], "next_cursor": None}


@pytest.mark.parametrize(("made", "given"), [("desc", "asc"), ("asc", "desc")])
def test_a_cursor_pages_its_own_order_only(router: Router, made: str, given: str) -> None:
    cursor = _history(router, order=made, limit="2")["next_cursor"]
    with pytest.raises(ApiError) as e:
        _history(router, order=given, limit="2", cursor=cursor)
    assert e.value.status == 400 and e.value.code == "bad_request"
    assert f"order={made}" in e.value.message


@pytest.mark.parametrize("order", ["DESC", "newest", "", "desc "])
def test_any_other_order_is_a_400_naming_it(router: Router, order: str) -> None:
    with pytest.raises(ApiError) as e:
        _history(router, order=order)
    assert e.value.status == 400 and e.value.code == "bad_request"
    assert "order" in e.value.message


def test_newest_versions_reads_backwards_within_bounds(router: Router) -> None:
    store = router.node.ingestor.replicas[("t", 0)].store  # type: ignore[attr-defined]
    times = [v.timestamp for v in newest_versions(store, b"k", 1005, 1031, 10)]
    assert times == [1030, 1020, 1010]
    assert [v.timestamp for v in newest_versions(store, b"k", -(2**63), 2**63 - 1, 2)] == [
        1040,
        1030,
    ]
    assert newest_versions(store, b"k", 1000, 1000, 5) == []
    assert newest_versions(store, b"absent", -(2**63), 2**63 - 1, 5) == []


def test_the_route_and_its_document_take_order() -> None:
    routes = Routes()
    for path in ("/v1/tables/t/keys/k/history", "/v1/tables/t/history"):
        route, _ = routes.match("GET", path)
        routes.check(route, {"order": "desc"})  # not refused as unknown
    doc = document()["paths"]
    for path in ("/v1/tables/{table}/keys/{key}/history", "/v1/tables/{table}/history"):
        (order,) = [p for p in doc[path]["get"]["parameters"] if p["name"] == "order"]
        assert order["schema"] == {"enum": ["asc", "desc"]}
