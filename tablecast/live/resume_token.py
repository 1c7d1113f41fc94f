"""A watch's resume token: a position over the partitions the watch covers.

``TABLE@P:O,P:O`` says that, for every listed partition P, every record below
offset O has been handed to the watcher (the ones its filter matched) and
none above: the same form ``X-Tablecast-Position`` gives a key read, with
more partitions. Reconnecting with it continues at exactly those offsets, on
any node, because offsets belong to the table topic, not to a node.

A token taken inside a snapshot also says how far the snapshot got:
``TABLE@P:O,...;after=HEX`` — rows with serialized keys up to HEX were sent
as of those offsets, and rows above it not yet. Snapshot rows go out in key
order (across partitions), so that is all a resume needs to finish the
snapshot without sending a row twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote, unquote

from tablecast.query.errors import ApiError

#: tokens longer than this are not ours (a table has at most a few thousand partitions)
MAX_TOKEN = 65_536


@dataclass(frozen=True)
class Token:
    table: str
    #: partition -> the next offset to hand over (every record below it handled)
    offsets: dict[int, int]
    #: inside a snapshot: the last row's serialized key (rows above it not sent yet)
    after: bytes | None = None

    def text(self) -> str:
        body = ",".join(f"{p}:{o}" for p, o in sorted(self.offsets.items()))
        tail = "" if self.after is None else ";after=" + self.after.hex()
        return f"{quote(self.table, safe='')}@{body}{tail}"

    def __str__(self) -> str:
        return self.text()


def single(table_quoted: str, partition: int, offset: int) -> str:
    """The token of a one-partition watch: what a key read's ``X-Tablecast-Position`` says."""
    return f"{table_quoted}@{partition}:{offset}"


def parse(text: str) -> Token:
    """A token as a client sent it back (``Last-Event-ID`` or ``?since=``); 400 if it is not one."""
    bad = ApiError(
        "bad_request",
        "not a resume token (TABLE@PARTITION:OFFSET,...): pass back an event's id as it came",
    )
    if not text or len(text) > MAX_TOKEN:
        raise bad
    text = text.strip()
    body, _, tail = text.partition(";")
    table, at, vector = body.rpartition("@")
    if not at or not table:
        raise bad
    offsets: dict[int, int] = {}
    try:
        for item in vector.split(","):
            p_text, colon, o_text = item.partition(":")
            if not colon:
                raise ValueError(item)
            p, o = int(p_text), int(o_text)
            if p < 0 or o < 0 or p in offsets:
                raise ValueError(item)
            offsets[p] = o
        after = None
        if tail:
            name, eq, value = tail.partition("=")
            if name != "after" or not eq:
                raise ValueError(tail)
            after = bytes.fromhex(value)
    except ValueError:
        raise bad from None
    return Token(unquote(table), offsets, after)
