"""CRC32C of many rows at once equals the library's, row by row."""

from __future__ import annotations

import numpy as np
import pytest

from spark_audit import crcvec, fmt


def test_rows_get_the_crc32c_of_their_bytes() -> None:
    rng = np.random.default_rng(20)
    for width in (4, 28, 44, 64):
        rows = rng.integers(0, 256, (500, width), dtype=np.uint8)
        want = [fmt.crc(r.tobytes()) for r in rows]
        assert crcvec.crc_rows(rows).tolist() == want
    # A column slice (not contiguous) and no rows at all.
    wide = rng.integers(0, 256, (50, 48), dtype=np.uint8)
    assert crcvec.crc_rows(wide[:, :44]).tolist() == [fmt.crc(r[:44].tobytes()) for r in wide]
    assert len(crcvec.crc_rows(np.zeros((0, 8), np.uint8))) == 0
    assert crcvec.crc_rows(np.frombuffer(b"1234", np.uint8).reshape(1, 4))[0] == fmt.crc(
        b"1234")


def test_widths_must_be_whole_words() -> None:
    with pytest.raises(ValueError):
        crcvec.crc_rows(np.zeros((2, 3), np.uint8))
