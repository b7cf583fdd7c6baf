"""Byte layouts of storage format version 1 and parsers for the small files.

Every constant here is transcribed from ``docs/storage-format.md``; the bulk
parsers live in ``parse.py``. Integers are little-endian, CRCs are CRC32C.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c
import msgpack

FORMAT_VERSION = 1

ENTRY_MAGIC = 0x45514D4C  # the bytes "LMQE" on disk
# The magic as it appears on disk (a little-endian u32): the resync scan after a
# damaged header searches for these bytes.
ENTRY_MAGIC_BYTES = struct.pack("<I", ENTRY_MAGIC)
ENTRY_HEADER = struct.Struct("<IBBHIIQQQI")  # bytes [0, 44)
ENTRY_HEADER_SIZE = 48
ENTRY_HEADER_CRC_AT = 44

KIND_MESSAGES = 1
KIND_NOOP = 2
KIND_CONTROL = 3
KINDS = (KIND_MESSAGES, KIND_NOOP, KIND_CONTROL)
KIND_NAMES = {KIND_MESSAGES: "MESSAGES", KIND_NOOP: "NOOP", KIND_CONTROL: "CONTROL"}

# Largest entry the audit accepts. The broker's entry_size_bytes_max is a
# configuration value the files do not record; an entry must at least fit in a
# segment, and the audit is told the real limit with --max-entry-size.
DEFAULT_MAX_ENTRY_SIZE = 64 * 1024 * 1024
DEFAULT_SEGMENT_SIZE = 256 * 1024 * 1024

MESSAGE_HEADER = struct.Struct("<IIIIqqQQIHHHHII")
MESSAGE_HEADER_SIZE = 68

INDEX_RECORD = struct.Struct("<QQIB3xI")  # bytes [0, 28), then the record CRC
INDEX_RECORD_SIZE = 32
DEFAULT_INDEX_FILE_RECORDS = 1_048_576

CQ_UNIT = struct.Struct("<QIQ")
CQ_UNIT_SIZE = 20
DEFAULT_CQ_UNITS_PER_FILE = 300_000

CHECKPOINT_MAGIC = 0x43514D4C  # "LMQC"
CHECKPOINT = struct.Struct("<IIQQQQI")  # bytes [0, 44), then the CRC
CHECKPOINT_SIZE = 48

HARDSTATE_MAGIC = 0x48514D4C  # "LMQH"
HARDSTATE = struct.Struct("<IIQQQI")  # bytes [0, 36), then the CRC
HARDSTATE_SIZE = 40


def crc(data: bytes | memoryview) -> int:
    """CRC32C of ``data`` (the only checksum the format uses)."""
    return crc32c.crc32c(data)


def tag_hash(tags: bytes) -> int:
    """The ConsumeQueue tag hash: CRC of the tag bytes, 0 for no tag."""
    return crc32c.crc32c(tags) if tags else 0


class FormatError(ValueError):
    """A small file that cannot be decoded (bad magic, version, CRC or length)."""


@dataclass(frozen=True)
class Checkpoint:
    durable_index: int
    durable_end: int
    durable_term: int
    first_index: int


@dataclass(frozen=True)
class HardState:
    term: int
    vote: int
    commit: int


@dataclass(frozen=True)
class DispatchCheckpoint:
    dispatched_index: int
    dispatched_end: int
    queues: tuple[tuple[str, int, int], ...]


def parse_checkpoint(data: bytes) -> Checkpoint:
    """Decode the 48-byte CommitLog durability checkpoint."""
    if len(data) != CHECKPOINT_SIZE:
        raise FormatError(f"checkpoint is {len(data)} bytes, expected {CHECKPOINT_SIZE}")
    magic, version, durable_index, durable_end, durable_term, first_index, _ = (
        CHECKPOINT.unpack_from(data)
    )
    if magic != CHECKPOINT_MAGIC:
        raise FormatError(f"checkpoint magic {magic:#x}")
    if version != FORMAT_VERSION:
        raise FormatError(f"checkpoint version {version} is not known")
    if crc(data[:44]) != struct.unpack_from("<I", data, 44)[0]:
        raise FormatError("checkpoint CRC mismatch")
    return Checkpoint(durable_index, durable_end, durable_term, first_index)


def parse_hardstate(data: bytes) -> HardState:
    """Decode the 40-byte Raft hard state."""
    if len(data) != HARDSTATE_SIZE:
        raise FormatError(f"hardstate is {len(data)} bytes, expected {HARDSTATE_SIZE}")
    magic, version, term, vote, commit, _ = HARDSTATE.unpack_from(data)
    if magic != HARDSTATE_MAGIC:
        raise FormatError(f"hardstate magic {magic:#x}")
    if version != FORMAT_VERSION:
        raise FormatError(f"hardstate version {version} is not known")
    if crc(data[:36]) != struct.unpack_from("<I", data, 36)[0]:
        raise FormatError("hardstate CRC mismatch")
    return HardState(term, vote, commit)


def parse_dispatch_checkpoint(data: bytes) -> DispatchCheckpoint:
    """Decode ``consumequeue/checkpoint``: a msgpack map followed by its CRC."""
    if len(data) < 5:
        raise FormatError("dispatch checkpoint too short")
    body, stored = data[:-4], struct.unpack_from("<I", data, len(data) - 4)[0]
    if crc(body) != stored:
        raise FormatError("dispatch checkpoint CRC mismatch")
    try:
        doc = msgpack.unpackb(body, raw=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise FormatError(f"dispatch checkpoint is not msgpack: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION:
        raise FormatError("dispatch checkpoint version is not known")
    queues = tuple((str(t), int(q), int(n)) for t, q, n in doc.get("queues", []))
    return DispatchCheckpoint(int(doc["dispatched_index"]), int(doc["dispatched_end"]), queues)


def encode_checkpoint(cp: Checkpoint) -> bytes:
    """Inverse of ``parse_checkpoint`` (used by tests and the benchmark)."""
    head = CHECKPOINT.pack(
        CHECKPOINT_MAGIC, FORMAT_VERSION, cp.durable_index, cp.durable_end,
        cp.durable_term, cp.first_index, 0,
    )
    return head + struct.pack("<I", crc(head))


def encode_hardstate(hs: HardState) -> bytes:
    """Inverse of ``parse_hardstate``."""
    head = HARDSTATE.pack(HARDSTATE_MAGIC, FORMAT_VERSION, hs.term, hs.vote, hs.commit, 0)
    return head + struct.pack("<I", crc(head))


def encode_dispatch_checkpoint(dc: DispatchCheckpoint) -> bytes:
    """Inverse of ``parse_dispatch_checkpoint``."""
    body = msgpack.packb({
        "version": FORMAT_VERSION,
        "dispatched_index": dc.dispatched_index,
        "dispatched_end": dc.dispatched_end,
        "queues": [list(q) for q in dc.queues],
    })
    return body + struct.pack("<I", crc(body))
