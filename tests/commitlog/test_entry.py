"""Entry header codec and the placement rule."""

from __future__ import annotations

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from commitlog.entry import (
    HEADER_SIZE,
    KIND_MESSAGES,
    KIND_NOOP,
    decode_header,
    encode_entry,
    place,
)


def test_crc32c_is_castagnoli() -> None:
    # The check value docs/storage-format.md promises readers.
    assert crc32c.crc32c(b"123456789") == 0xE3069283


@given(
    index=st.integers(1, 2**63), term=st.integers(1, 2**63),
    position=st.integers(0, 2**62), body=st.binary(max_size=300),
)
def test_header_round_trip(index: int, term: int, position: int, body: bytes) -> None:
    raw = encode_entry(index, term, KIND_MESSAGES, position, body)
    assert len(raw) == HEADER_SIZE + len(body)
    header = decode_header(raw)
    assert header.problem is None
    assert (header.index, header.term, header.position, header.size) == (
        index, term, position, len(raw))
    assert header.body_crc == crc32c.crc32c(body)


@pytest.mark.parametrize("byte", range(HEADER_SIZE))
def test_any_flipped_header_byte_is_detected(byte: int) -> None:
    raw = bytearray(encode_entry(7, 3, KIND_NOOP, 4096, b""))
    raw[byte] ^= 0x40
    assert decode_header(bytes(raw)).problem is not None


def test_header_layout_is_little_endian_as_documented() -> None:
    raw = encode_entry(0x0102, 0x0304, KIND_MESSAGES, 0x0506, b"ab")
    assert raw[0:4] == b"LMQE"
    assert raw[4] == 1 and raw[5] == KIND_MESSAGES
    assert int.from_bytes(raw[8:12], "little") == HEADER_SIZE + 2
    assert int.from_bytes(raw[16:24], "little") == 0x0102
    assert int.from_bytes(raw[24:32], "little") == 0x0304
    assert int.from_bytes(raw[32:40], "little") == 0x0506
    assert int.from_bytes(raw[44:48], "little") == crc32c.crc32c(raw[:44])


def test_placement_rolls_to_the_next_segment_only_when_the_entry_does_not_fit() -> None:
    assert place(0, 100, 1000) == 0
    assert place(900, 100, 1000) == 900  # fills the segment exactly
    assert place(901, 100, 1000) == 1000
    assert place(1000, 1000, 1000) == 1000
    assert place(1500, 600, 1000) == 2000
