"""History cursors (query/reads.py): a page continues where the last one stopped, and any
cursor that does not name a history's last time is a 400, never a 500 — also one this app
signed for another query of the same shape (an index page's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from tablecast.http import decode
from tablecast.http.decode import HttpRequest
from tablecast.query.errors import ApiError
from tablecast.query.reads import TIME_MAX, Router
from tablecast.store import Write

from ..support.nodes import history_router

KEY = {"table": "t", "key": "k"}


@pytest.fixture(params=["memory", "rocksdb"])
def router(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    writes = [Write(b"k", orjson.dumps(f"v{i}"), i, 1000 + i) for i in range(3)]
    with history_router(request.param, tmp_path, writes) as router:
        yield router


def _history(router: Router, **params: str) -> Any:
    req = HttpRequest({"limit": "2", **params}, "", {})
    code, body, _ = router.history(decode.history_query(KEY, req), req)
    assert code == 200
    return orjson.loads(body)


def test_pages_continue_from_the_cursor(router: Router) -> None:
    first = _history(router)
    assert [v["value"] for v in first["items"]] == ["v0", "v1"]
    rest = _history(router, cursor=first["next_cursor"])
    assert [v["value"] for v in rest["items"]] == ["v2"] and rest["next_cursor"] is None


@pytest.mark.parametrize(
    "last_key",
    [b"", b"\x00" * 7, b"\x00" * 9, b"idx-value\x00k"],  # an index page's last row, say
)
def test_a_signed_cursor_that_holds_no_time_is_a_400(router: Router, last_key: bytes) -> None:
    # the same query list an index page of an index named "k" has: its cursor passes the check
    cursor = router.cursors.encode(last_key, ["k", None, None])
    with pytest.raises(ApiError) as e:
        _history(router, cursor=cursor)
    assert e.value.status == 400 and e.value.code == "bad_request"


@pytest.mark.parametrize("cursor", ["x", "x.y", "é.é", "\udcff", "a" * 40 + ".", "..."])
def test_a_made_up_cursor_is_a_400(router: Router, cursor: str) -> None:
    with pytest.raises(ApiError) as e:
        _history(router, cursor=cursor)
    assert e.value.status == 400


def test_a_cursor_at_the_greatest_time_is_an_empty_page(router: Router) -> None:
    cursor = router.cursors.encode(TIME_MAX.to_bytes(8, "big", signed=True), ["k", None, None])
    assert _history(router, cursor=cursor) == {"items": [], "next_cursor": None}
