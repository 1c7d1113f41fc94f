"""Position tokens: how far into a table topic an answer reflects (``X-Tablecast-Position``).

A token is ``TABLE@P:O,P:O,...``: for every listed partition P of the table's
topic, every record below offset O is reflected in the answer and none at or
above it (O is the *next* offset, as a Kafka consumer's position is). The
table name is percent-encoded, so ``@`` and ``,`` in it cannot confuse a
parser. A one-partition read says ``TABLE@P:O``, the form every key read has
always carried; a fan-out read lists every partition it read. A watch
event's id has the same form, optionally followed by ``;...`` (where inside a
snapshot it was taken): the part before ``;`` is a position like any other.

Clients treat tokens as opaque and pass them back (``?after=`` or
``X-Tablecast-After``); a node then answers only from replicas at least that
far, per partition. Tokens of one table merge by taking the larger offset of
each partition, so a client can keep one token per table however its reads
are spread. A producer's acknowledged records make a token too: a record
acknowledged at offset O of partition P of the table topic is reflected by
position ``P:O+1`` (:func:`after_record`), which is read-your-writes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

_DIGITS = re.compile(r"[0-9]{1,19}")
#: tokens longer than this are not ours (a table has at most a few thousand partitions)
MAX_TOKEN = 65_536


class BadToken(ValueError):
    """Text that is not a position token."""


@dataclass(frozen=True)
class Position:
    table: str
    #: partition -> the next offset: every record below it reflected, none above
    offsets: Mapping[int, int] = field(default_factory=dict)

    def text(self) -> str:
        body = ",".join(f"{p}:{o}" for p, o in sorted(self.offsets.items()))
        return f"{quote(self.table, safe='')}@{body}"

    __str__ = text

    def merge(self, other: Position) -> Position:
        """The later of the two, partition by partition (both of one table)."""
        if other.table != self.table:
            raise ValueError(f"positions of {self.table!r} and {other.table!r} do not merge")
        offsets = dict(self.offsets)
        for p, o in other.offsets.items():
            if o > offsets.get(p, -1):
                offsets[p] = o
        return Position(self.table, offsets)


def token(table: str, partition: int, position: int) -> str:
    """The token of a read of one partition at `position`."""
    return f"{quote(table, safe='')}@{partition}:{position}"


def after_record(table: str, acks: Iterable[tuple[int, int]]) -> Position:
    """The position that reflects the acknowledged records ``(partition, offset)`` of the
    table's topic: a read ``after`` it sees them (or something later)."""
    offsets: dict[int, int] = {}
    for p, o in acks:
        if p < 0 or o < 0:
            raise ValueError(f"not an acknowledged record: partition {p}, offset {o}")
        offsets[p] = max(offsets.get(p, 0), o + 1)
    return Position(table, offsets)


def parse(text: str) -> Position:
    """A token as a client sent it back; :class:`BadToken` if it is not one."""
    if not text or len(text) > MAX_TOKEN:
        raise BadToken("empty or too long")
    body = text.strip().partition(";")[0]  # a watch id's snapshot part is not a position
    table, at, vector = body.rpartition("@")
    if not at or not table:
        raise BadToken("no TABLE@ before the offsets")
    offsets: dict[int, int] = {}
    for item in vector.split(","):
        p_text, colon, o_text = item.partition(":")
        if not colon or not _DIGITS.fullmatch(p_text) or not _DIGITS.fullmatch(o_text):
            raise BadToken(f"{item!r} is not PARTITION:OFFSET")
        p, o = int(p_text), int(o_text)
        if p in offsets:
            raise BadToken(f"partition {p} twice")
        if p >= 2**31 or o >= 2**63:
            raise BadToken(f"{item!r} is out of range")
        offsets[p] = o
    return Position(unquote(table), offsets)
