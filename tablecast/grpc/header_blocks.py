"""HPACK decoding of the header blocks a connection's calls arrive with.

``hpack`` decodes a gRPC call's block at a cost several times the rest of the call (a
debug log call per field among it), so blocks are decoded here, with ``hpack``'s static
table and Huffman code. A block that leaves the dynamic table as it was (indexed fields
and literals not indexed) decodes the same way the next time: :attr:`Decoder.generation`
says when, so a connection can keep what a block meant.
"""

from __future__ import annotations

from collections import deque

from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable

Fields = list[tuple[str, str]]

#: an entry of a table: the field, its size as HPACK counts it, its name's octets
Entry = tuple[tuple[str, str], int, int]
#: the static table, 1-based as HPACK counts it
STATIC: tuple[Entry, ...] = (
    (("", ""), 0, 0),
    *(
        ((n.decode(), v.decode()), len(n) + len(v) + 32, len(n))
        for n, v in HeaderTable.STATIC_TABLE
    ),
)
FIRST_DYNAMIC = len(STATIC)


class HpackError(Exception):
    """A block that does not decode (HTTP/2's COMPRESSION_ERROR)."""


def _integer(block: bytes, at: int, bits: int) -> tuple[int, int]:
    """An HPACK integer with a `bits`-bit prefix at `at`, and where the next field begins."""
    limit = (1 << bits) - 1
    value = block[at] & limit
    at += 1
    if value < limit:
        return value, at
    shift = 0
    while True:
        if at >= len(block) or shift > 28:
            raise HpackError("an integer cut short or too large")
        byte = block[at]
        at += 1
        value += (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def _string(block: bytes, at: int) -> tuple[str, int, int]:
    """A string literal at `at`: its text, its decoded length in octets, the next index."""
    if at >= len(block):
        raise HpackError("a field cut short")
    huffman = block[at] & 0x80
    length, at = _integer(block, at, 7)
    end = at + length
    if end > len(block):
        raise HpackError("a string cut short")
    raw = block[at:end]
    if huffman:
        try:
            raw = decode_huffman(raw)
        except Exception as e:  # hpack raises its own error for a bad code
            raise HpackError(f"bad Huffman code: {e}") from None
    return raw.decode("utf-8", "replace"), len(raw), end


class Decoder:
    """One connection's HPACK decoding state: its dynamic table."""

    def __init__(self, table_size: int = 4096, list_size: int = 65536) -> None:
        self.dynamic: deque[Entry] = deque()
        self.size = 0
        #: the most the client may make the table (our SETTINGS_HEADER_TABLE_SIZE)
        self.max_size = table_size
        self.limit = table_size
        #: the most a block may decode to, in octets as HTTP/2 counts them
        self.list_size = list_size
        #: how many times the table changed: a block decoded while it stands still decodes
        #: the same way again
        self.generation = 0

    def _entry(self, index: int) -> Entry:
        if 0 < index < FIRST_DYNAMIC:
            return STATIC[index]
        at = index - FIRST_DYNAMIC
        if 0 <= at < len(self.dynamic):
            return self.dynamic[at]
        raise HpackError(f"no entry {index}")

    def _add(self, field: tuple[str, str], size: int, name_size: int) -> None:
        self.generation += 1
        self.dynamic.appendleft((field, size, name_size))
        self.size += size
        self._evict()

    def _evict(self) -> None:
        while self.size > self.limit:
            self.size -= self.dynamic.pop()[1]

    def decode(self, block: bytes) -> Fields:
        """A block's fields; :attr:`generation` moves when the block changes the table."""
        out: Fields = []
        total = 0
        at, end = 0, len(block)
        dynamic = self.dynamic
        while at < end:
            byte = block[at]
            if byte & 0x80:  # an indexed field
                if byte != 0xFF:
                    index = byte & 0x7F
                    at += 1
                else:
                    index, at = _integer(block, at, 7)
                if 0 < index < FIRST_DYNAMIC:
                    field, size, _ = STATIC[index]
                elif 0 <= index - FIRST_DYNAMIC < len(dynamic):
                    field, size, _ = dynamic[index - FIRST_DYNAMIC]
                else:
                    raise HpackError(f"no entry {index}")
            elif byte & 0xE0 == 0x20:  # a table size update
                size, at = _integer(block, at, 5)
                if size > self.max_size:
                    raise HpackError("a table size over the one allowed")
                self.limit = size
                self.generation += 1
                self._evict()
                continue
            else:
                # a literal: with incremental indexing (01), else not indexed (0000/0001)
                indexing = byte & 0x40
                index, at = _integer(block, at, 6 if indexing else 4)
                if index:
                    (name, _), _, name_size = self._entry(index)
                else:
                    name, name_size, at = _string(block, at)
                value, octets, at = _string(block, at)
                size = name_size + octets + 32
                field = (name, value)
                if indexing:
                    self._add(field, size, name_size)
            total += size
            if total > self.list_size:
                raise HpackError("a header list over the size allowed")
            out.append(field)
        return out
