"""``?access_token=`` of a watch (http/app.py): it goes on in the Authorization header of
peer calls, so a value that is no RFC 6750 bearer token is refused with 401 where it is
read, before it can break a peer request's head."""

from __future__ import annotations

import time
from urllib.parse import quote, urlencode

import jwt
import pytest

from tablecast.http.app import _query_token
from tablecast.query.auth import Auth
from tablecast.query.errors import ApiError

SECRET = "unit-test-secret-0123456789abcdef0123"
WATCH = "/v1/tables/kv/watch"


def _jwt() -> str:
    return jwt.encode({"exp": int(time.time() + 60), "sub": "u1"}, SECRET, "HS256")


@pytest.mark.parametrize(
    "tail",
    ["\r\n", "\r\nx-tablecast-hop: 1", "\n", "\r", "\u00e9", "\u20ac", "\x00", " x", "\tx", "=x"],
)
def test_a_token_that_could_break_a_header_is_refused(tail: str) -> None:
    token = _jwt() + tail
    with pytest.raises(ApiError) as e:
        _query_token(WATCH, urlencode({"key": "a", "access_token": token}))
    assert e.value.status == 401 and e.value.code == "unauthorized"


def test_the_verifier_alone_would_let_a_trailing_crlf_through() -> None:
    """Why the check is needed where the token is read: the JWT verifies with a CR LF after
    it, and the value as sent is what goes on to peers."""
    assert Auth(SECRET).caller("Bearer " + _jwt() + "\r\n").subject == "u1"
    with pytest.raises(ApiError):
        _query_token(WATCH, "access_token=" + quote(_jwt() + "\r\n"))


@pytest.mark.parametrize("token", [None, "abc", "a-b.c_d~e+f/g", "abc==", "YWJj="])
def test_a_bearer_token_is_taken_as_it_is(token: str | None) -> None:
    token = token or _jwt()
    query = urlencode({"key": "a", "access_token": token})
    assert _query_token(WATCH, query) == "Bearer " + token


@pytest.mark.parametrize("query", ["", "key=a", "access_token="])
def test_no_token_is_none(query: str) -> None:
    assert _query_token(WATCH, query) is None


def test_padding_alone_is_no_token() -> None:
    with pytest.raises(ApiError) as e:
        _query_token(WATCH, "access_token=%3D%3D")
    assert e.value.status == 401


def test_only_a_watch_reads_it() -> None:
    assert _query_token("/v1/tables/kv/range", "access_token=%0D%0A") is None
