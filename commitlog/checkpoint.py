"""The durability checkpoint and the Raft hard state: two small fixed files.

Both are replaced atomically and carry a CRC; their layouts are in
docs/storage-format.md.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from crc32c import crc32c

from commitlog.disk import atomic_replace, read_small_file
from commitlog.errors import CorruptionError, FormatVersionError

CHECKPOINT_MAGIC = 0x43514D4C  # "LMQC"
HARDSTATE_MAGIC = 0x48514D4C  # "LMQH"
_CHECKPOINT = struct.Struct("<IIQQQQI")  # 44 bytes + CRC
_HARDSTATE = struct.Struct("<IIQQQI")  # 36 bytes + CRC
_CRC = struct.Struct("<I")


@dataclass(frozen=True)
class Checkpoint:
    """What recovery may trust without re-reading: entries up to durable_index."""

    durable_index: int = 0
    durable_end: int = 0
    durable_term: int = 0
    first_index: int = 1


@dataclass(frozen=True)
class HardState:
    """Raft's persistent state: current term, vote in that term, known commit."""

    term: int = 0
    vote: int = 0
    commit: int = 0


def _check(path: str, raw: bytes, size: int, magic: int) -> None:
    if len(raw) != size + 4:
        raise CorruptionError(path, 0, f"expected {size + 4} bytes, found {len(raw)}")
    if _CRC.unpack_from(raw, size)[0] != crc32c(raw[:size]):
        raise CorruptionError(path, size, "CRC mismatch")
    found_magic, version = struct.unpack_from("<II", raw)
    if found_magic != magic:
        raise CorruptionError(path, 0, f"bad magic 0x{found_magic:08X}")
    if version != 1:
        raise FormatVersionError(path, version)


def read_checkpoint(data_dir: str) -> Checkpoint | None:
    path = os.path.join(data_dir, "checkpoint")
    raw = read_small_file(path)
    if raw is None:
        return None
    _check(path, raw, _CHECKPOINT.size, CHECKPOINT_MAGIC)
    _m, _v, durable_index, durable_end, durable_term, first_index, _r = _CHECKPOINT.unpack_from(raw)
    return Checkpoint(durable_index, durable_end, durable_term, first_index)


def write_checkpoint(data_dir: str, checkpoint: Checkpoint) -> None:
    head = _CHECKPOINT.pack(
        CHECKPOINT_MAGIC, 1, checkpoint.durable_index, checkpoint.durable_end,
        checkpoint.durable_term, checkpoint.first_index, 0,
    )
    atomic_replace(os.path.join(data_dir, "checkpoint"), head + _CRC.pack(crc32c(head)))


def read_hard_state(data_dir: str) -> HardState | None:
    path = os.path.join(data_dir, "hardstate")
    raw = read_small_file(path)
    return None if raw is None else decode_hard_state(path, raw)


def decode_hard_state(path: str, raw: bytes) -> HardState:
    """The hard state in `raw` (the bytes of the file at `path`), checked."""
    _check(path, raw, _HARDSTATE.size, HARDSTATE_MAGIC)
    _m, _v, term, vote, commit, _r = _HARDSTATE.unpack_from(raw)
    return HardState(term, vote, commit)


def write_hard_state(data_dir: str, state: HardState) -> None:
    """Durably replace the hard state (fsynced before this returns)."""
    head = _HARDSTATE.pack(HARDSTATE_MAGIC, 1, state.term, state.vote, state.commit, 0)
    atomic_replace(os.path.join(data_dir, "hardstate"), head + _CRC.pack(crc32c(head)))
