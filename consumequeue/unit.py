"""ConsumeQueue units: 20 bytes (physical offset, size, tag hash), docs/storage-format.md."""

from __future__ import annotations

import struct

import numpy as np

UNIT = struct.Struct("<QIQ")
UNIT_SIZE = 20
# Packed (align=False) so numpy reads whole files of units in one call.
UNIT_DTYPE = np.dtype([("offset", "<u8"), ("size", "<u4"), ("tag_hash", "<u8")])
assert UNIT_DTYPE.itemsize == UNIT_SIZE


def encode_units(units: list[tuple[int, int, int]]) -> bytes:
    return b"".join(UNIT.pack(*u) for u in units)


def decode_units(raw: bytes) -> np.ndarray:
    usable = len(raw) - len(raw) % UNIT_SIZE
    return np.frombuffer(raw, dtype=UNIT_DTYPE, count=usable // UNIT_SIZE)
