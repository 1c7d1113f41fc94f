"""HTTP/1.1 answers as the bytes that go on the wire: the loop engine writes them, and an
owner sends forwarded reads' answers in this form (:mod:`tablecast.query.coalesce`) so the
forwarder writes them as they came."""

from __future__ import annotations

from http import HTTPStatus

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
_LENGTH = b"content-length: "


def head(status: int, headers: list[tuple[str, str]], extra: bytes) -> bytes:
    """The status line and headers, then `extra` (more header lines, as they go on the wire)."""
    lines = b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in headers)
    return b"HTTP/1.1 %d %s\r\n%s%s\r\n" % (status, _REASONS.get(status, b""), lines, extra)


def sized_head(
    status: int, headers: list[tuple[str, str]], size: int, close: bool, lines: bytes = b""
) -> bytes:
    """The head of an answer whose body (`size` bytes) follows whole; `lines`: more
    headers, as they go on the wire."""
    close_line = b"connection: close\r\n" if close else b""
    return head(status, headers, b"%scontent-length: %d\r\n%s" % (lines, size, close_line))


def kept_alive(status: int, headers: list[tuple[str, str]], body: bytes) -> bytes:
    """A whole answer on a connection that stays open."""
    return sized_head(status, headers, len(body), False) + body


def split(wire: bytes) -> tuple[int, bytes, bytes]:
    """The status, header lines (without the length) and body of :func:`kept_alive`'s answer.

    Raises ValueError when `wire` is not such an answer."""
    if not wire.startswith(b"HTTP/1.1 "):
        raise ValueError("not an HTTP/1.1 answer")
    end = wire.index(b"\r\n\r\n")
    first = wire.index(b"\r\n")
    status = int(wire[9:12])
    lines = [
        line + b"\r\n"
        for line in wire[first + 2 : end].split(b"\r\n")
        if line and not line.startswith(_LENGTH)
    ]
    return status, b"".join(lines), wire[end + 4 :]
