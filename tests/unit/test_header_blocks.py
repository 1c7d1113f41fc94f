"""HPACK decoding of request header blocks: what hpack's encoder writes (indexed fields,
literals with and without indexing, Huffman or not, table size updates, evictions) reads
back as it was written, block after block on one connection; and a block cannot make the
decoder hold more than it allows."""

from __future__ import annotations

import pytest
from hpack import Encoder
from hypothesis import given, settings
from hypothesis import strategies as st

from tablecast.grpc.header_blocks import Decoder, HpackError

NAMES = st.sampled_from(
    [":path", ":authority", "content-type", "grpc-timeout", "authorization", "x-a", "x-bb"]
)
VALUES = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=300)
BLOCK = st.lists(st.tuples(NAMES, VALUES), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(
    blocks=st.lists(BLOCK, min_size=1, max_size=30),
    huffman=st.booleans(),
    sizes=st.lists(st.sampled_from([0, 64, 256, 4096]), max_size=3),
)
def test_what_hpack_writes_reads_back(
    blocks: list[list[tuple[str, str]]], huffman: bool, sizes: list[int]
) -> None:
    encoder, decoder = Encoder(), Decoder()
    for n, fields in enumerate(blocks):
        if sizes and n % 7 == 3:
            encoder.header_table_size = sizes[n % len(sizes)]  # a size update in the next block
        block = encoder.encode(fields, huffman=huffman)
        before = decoder.generation
        assert decoder.decode(block) == fields
        if decoder.generation == before:  # unchanged table: the block decodes the same again
            assert decoder.decode(block) == fields


def test_a_block_cannot_decode_to_more_than_the_list_size() -> None:
    encoder, decoder = Encoder(), Decoder(list_size=4096)
    decoder.decode(encoder.encode([("x-big", "v" * 3000)]))  # now in the dynamic table
    # one byte per field, each naming the 3 KB entry: a bomb of a few bytes
    with pytest.raises(HpackError):
        decoder.decode(bytes([0x80 | 62]) * 10)


@pytest.mark.parametrize(
    "block",
    [
        b"\x80",  # index 0
        bytes([0x80 | 70]),  # past the tables
        b"\x7f",  # an integer cut short
        b"\x00\x05ab",  # a string cut short
        b"\x3f\xff\xff\xff\xff\x0f",  # a table size over the one allowed
    ],
)
def test_malformed_blocks_are_refused(block: bytes) -> None:
    with pytest.raises(HpackError):
        Decoder().decode(block)
