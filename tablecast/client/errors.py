"""What ``tablecast.Client`` raises, in a module of its own: ``tablecast.QueryError`` and
the others are imported without loading the HTTP client.

Besides these the client raises ``ConnectionError`` when no node answered at all, and
``ValueError`` (``TypeError``) for arguments it cannot send.
"""

from __future__ import annotations


class _Answered(Exception):
    """An error answer: its HTTP status, the API's error code, and its message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message


class QueryError(_Answered):
    """A query the cluster answered with an error (the API's error code and message).

    An answer that is not the API's JSON (an HTML page of a proxy in front of the
    nodes, say) is one too: its HTTP status, a code made of the status's reason
    phrase, and the start of its text as the message.
    """


class AuthError(QueryError):
    """The token was refused: 401 (none, or not valid) or 403 (its grants do not cover
    what was asked), by a node or by a proxy in front of the nodes. Every node applies
    one policy, so no other node is asked."""


class WatchError(_Answered):
    """The watch cannot go on (a bad request, a refused token, no node serving it)."""


class WatchAuthError(WatchError, AuthError):
    """A watch refused for its token: a :class:`WatchError` as every failed watch is, and
    an :class:`AuthError` as every refused token is."""


__all__ = ["AuthError", "QueryError", "WatchAuthError", "WatchError"]
