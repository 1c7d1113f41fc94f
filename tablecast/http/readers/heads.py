"""What a read process makes of a request's head (request line and headers, as received):
whether it is a plain key read it may answer itself (:func:`plain_get`), and, if not, whether
it can hand that one request to its node and take the connection back after the answer
(:func:`relayed_body_length`) or must pipe the connection to the node for good.

It parses only as far as that decision needs; the node parses the request itself and
answers anything malformed as it always does.
"""

from __future__ import annotations

import re

from tablecast.http.http1 import received_path
from tablecast.query.consistency import AFTER_HEADER
from tablecast.query.peer_calls import plain_key_read
from tablecast.query.request import HOP

#: a header line as RFC 9110 has it: a token, a colon, visible characters (no obs-fold)
_HEADER_LINE = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*([\x21-\x7e\x80-\xff \t]*)")
#: headers after which a key read is the node's: a body, an upgrade, a wait, a hop
_NOT_PLAIN = {
    b"content-length",
    b"transfer-encoding",
    b"upgrade",
    b"expect",
    HOP.encode(),
}
#: headers after which the connection is piped to the node for good: a body whose end only a
#: parser of chunks finds, a protocol switch, an interim answer before the final one
_PIPED = {b"transfer-encoding", b"upgrade", b"expect"}
#: methods whose answer carries no body though it may say a length (HEAD), or a tunnel
_PIPED_METHODS = {b"HEAD", b"CONNECT"}
_DIGITS = re.compile(rb"[0-9]{1,15}")
#: a request target the node's parser takes: visible ASCII (it refuses any other byte)
_TARGET = re.compile(rb"[\x21-\x7e]+")

AFTER = AFTER_HEADER.encode()


def split(head: bytes) -> tuple[list[bytes], list[tuple[bytes, bytes]]] | None:
    """(request line's three parts, [(lowercased name, value)]), or None if a line is not
    one a read process takes as it is (the node answers it, or refuses it)."""
    lines = head.split(b"\r\n")
    request = lines[0].split(b" ")
    if len(request) != 3:
        return None
    fields = []
    for line in lines[1:]:
        match = _HEADER_LINE.fullmatch(line)
        if match is None:
            return None
        fields.append((match[1].lower(), match[2].rstrip(b" \t")))
    return request, fields


def plain_get(head: bytes) -> tuple[str, str, dict[bytes, bytes]] | None:
    """(table, key text, headers) of a keep-alive ``GET /v1/tables/{t}/keys/{key}`` with no
    query string, body or header that makes it the node's; None for any other head.
    An ``X-Tablecast-After`` header stays in: the answerer serves it when its store is as
    far as the token asks, and hands it to the node (which waits) when not."""
    parts = split(head)
    if parts is None:
        return None
    (method, url, version), fields = parts
    if method != b"GET" or version != b"HTTP/1.1":
        return None
    if not url.startswith(b"/v1/tables/") or b"?" in url or b"#" in url:
        return None
    if _TARGET.fullmatch(url) is None:  # the node refuses it, as malformed
        return None
    headers: dict[bytes, bytes] = {}
    for name, value in fields:
        if name in _NOT_PLAIN:
            return None
        if name == b"connection" and value.lower() != b"keep-alive":
            return None  # a close, or an upgrade: the node's
        headers.setdefault(name, value)
    found = plain_key_read("GET", received_path(url))  # as the node's server takes it
    return None if found is None else (*found, headers)


def relayed_body_length(head: bytes) -> int | None:
    """The length of the body that follows this head when the request can go to the node on
    its own (its answer then ends where its length, or its last chunk, says), or None when
    the connection must be piped to the node from here on: HTTP/1.0, a close, an upgrade, a
    chunked body, ``Expect``, HEAD, a length given twice, or a line the node refuses."""
    parts = split(head)
    if parts is None:
        return None
    (method, _, version), fields = parts
    if version != b"HTTP/1.1" or method in _PIPED_METHODS:
        return None
    length: int | None = None
    for name, value in fields:
        if name in _PIPED:
            return None
        if name == b"connection" and any(
            token.strip() in (b"close", b"upgrade") for token in value.lower().split(b",")
        ):
            return None
        if name == b"content-length":
            if length is not None or not _DIGITS.fullmatch(value):
                return None
            length = int(value)
    return length or 0
