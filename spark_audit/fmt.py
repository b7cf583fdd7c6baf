"""Byte layouts of storage format version 1 and parsers for the small files.

Every constant here is transcribed from ``docs/storage-format.md``; the bulk
parsers live in ``parse.py``. Integers are little-endian, CRCs are CRC32C.
"""

from __future__ import annotations

import json
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
KIND_CONFIG = 4
KINDS = (KIND_MESSAGES, KIND_NOOP, KIND_CONTROL, KIND_CONFIG)
KIND_NAMES = {KIND_MESSAGES: "MESSAGES", KIND_NOOP: "NOOP", KIND_CONTROL: "CONTROL",
              KIND_CONFIG: "CONFIG"}

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

# A snapshot's ``meta`` file (``snapshots/<index:020d>/meta``, written by
# ``commitlog/snapshot.py``): magic, version, index, term, end_position,
# created_ms, state_bytes, state_crc, reserved; version 1 then has the CRC of
# those 56 bytes, version 2 a u32 length, that many bytes of membership JSON
# (the CONFIG entry's encoding) and the CRC of everything before it.
# ``IDENTITY`` (whose directory this is): magic, format version, node id,
# directory id, created ms, cluster id length L; then L bytes of cluster id
# and the CRC of everything before it.
IDENTITY_MAGIC = 0x49514D4C  # "LMQI"
IDENTITY_HEAD = struct.Struct("<IIQQQH")  # bytes [0, 34)
IDENTITY_PREFIX = struct.Struct("<II")  # magic and format version, the same in every version
CLUSTER_ID_MAX_BYTES = 255

SNAPSHOT_MAGIC = 0x53514D4C  # "LMQS"
SNAPSHOT_META = struct.Struct("<IIQQQQQII")  # bytes [0, 56)
SNAPSHOT_META_SIZE = 60  # version 1; version 2 is 64 + the membership's length
SNAPSHOT_META_V1 = 1
SNAPSHOT_META_V2 = 2
SNAPSHOT_MEMBERSHIP_MAX = 1 << 20


def crc(data: bytes | memoryview) -> int:
    """CRC32C of ``data`` (the only checksum the format uses)."""
    return crc32c.crc32c(data)


def tag_hash(tags: bytes) -> int:
    """The ConsumeQueue tag hash: CRC of the tag bytes, 0 for no tag."""
    return crc32c.crc32c(tags) if tags else 0


# Largest plausible Raft index, term, log position or queue offset. The format
# stores them as u64; the audit decodes the full range and reports anything
# above this (2^63 - 1: no log reaches it, and every table keeps these as
# int64) as ``implausible_value`` instead of carrying it into the checks.
MAX_PLAUSIBLE = (1 << 63) - 1


class FormatError(ValueError):
    """A small file that cannot be decoded (bad magic, version, CRC or length)."""


class ImplausibleValue(FormatError):
    """A small file that decodes (magic, version and CRC agree) but holds a value
    outside the plausible range (see ``MAX_PLAUSIBLE``)."""


def check_plausible(what: str, **fields: int) -> None:
    """Raise ``ImplausibleValue`` naming the first field outside [0, MAX_PLAUSIBLE]."""
    for name, value in fields.items():
        if not 0 <= value <= MAX_PLAUSIBLE:
            raise ImplausibleValue(f"{what} {name} = {value} is outside [0, 2^63-1]")


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
class SnapshotMeta:
    """What a snapshot's ``meta`` says: the state covers the log up to ``index``."""

    index: int
    term: int
    end_position: int  # CommitLog position just past entry ``index``
    created_ms: int
    state_bytes: int
    state_crc: int
    # Version 2: the membership in effect at ``index``, the canonical JSON
    # bytes a CONFIG entry holds (compare as bytes); None in version 1.
    membership: bytes | None = None


@dataclass(frozen=True)
class Identity:
    """What a replica's ``IDENTITY`` says it is."""

    node_id: int
    directory_id: int
    created_ms: int
    cluster_id: str


class UnsupportedFormat(FormatError):
    """An intact ``IDENTITY`` (magic and CRC agree) naming a format version this
    audit does not read: the directory's files cannot be judged by this audit."""


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
    check_plausible("checkpoint", durable_index=durable_index, durable_end=durable_end,
                    durable_term=durable_term, first_index=first_index)
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
    check_plausible("hardstate", term=term, vote=vote, commit=commit)
    return HardState(term, vote, commit)


def parse_identity(data: bytes) -> Identity:
    """Decode ``IDENTITY``. Magic, version and CRC are checked in the order that
    tells a newer format (intact, unknown version: ``UnsupportedFormat``) from
    damage (``FormatError``)."""
    if len(data) < IDENTITY_PREFIX.size + 4:
        raise FormatError(f"identity is {len(data)} bytes, too short for its header")
    magic, version = IDENTITY_PREFIX.unpack_from(data)
    if magic != IDENTITY_MAGIC:
        raise FormatError(f"identity magic {magic:#x}")
    if crc(data[:-4]) != struct.unpack_from("<I", data, len(data) - 4)[0]:
        raise FormatError("identity CRC mismatch")
    if version != FORMAT_VERSION:
        raise UnsupportedFormat(f"the directory is in on-disk format version {version}; this "
                                f"audit reads version {FORMAT_VERSION} only")
    if len(data) < IDENTITY_HEAD.size + 4:
        raise FormatError(f"identity is {len(data)} bytes, too short for version 1")
    _, _, node_id, directory_id, created_ms, length = IDENTITY_HEAD.unpack_from(data)
    if not 1 <= length <= CLUSTER_ID_MAX_BYTES or len(data) != IDENTITY_HEAD.size + length + 4:
        raise FormatError(f"identity is {len(data)} bytes but names a cluster id of {length}")
    try:
        cluster_id = data[IDENTITY_HEAD.size:IDENTITY_HEAD.size + length].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(f"identity cluster id is not UTF-8: {exc}") from exc
    check_plausible("identity", created_ms=created_ms)
    for name, value in (("node_id", node_id), ("directory_id", directory_id)):
        if not 1 <= value <= MAX_PLAUSIBLE:  # both drawn from 1..2^63-1 by the broker
            raise ImplausibleValue(f"identity {name} = {value} is outside [1, 2^63-1]")
    return Identity(node_id, directory_id, created_ms, cluster_id)


def parse_snapshot_meta(data: bytes) -> SnapshotMeta:
    """Decode a snapshot's ``meta``: version 1 (fixed 60 bytes) or version 2
    (the fixed fields, a u32 length and the membership JSON, then the CRC)."""
    if len(data) < SNAPSHOT_META_SIZE:
        raise FormatError(f"snapshot meta is {len(data)} bytes, expected at least "
                          f"{SNAPSHOT_META_SIZE}")
    magic, version, index, term, end, created, size, state_crc, _ = SNAPSHOT_META.unpack_from(
        data)
    if magic != SNAPSHOT_MAGIC:
        raise FormatError(f"snapshot meta magic {magic:#x}")
    at = SNAPSHOT_META.size
    if version == SNAPSHOT_META_V1:
        expected = SNAPSHOT_META_SIZE
    elif version == SNAPSHOT_META_V2:
        length = struct.unpack_from("<I", data, at)[0]
        if not 0 < length <= SNAPSHOT_MEMBERSHIP_MAX:
            raise FormatError(f"snapshot meta membership length {length} is outside "
                              f"1..{SNAPSHOT_MEMBERSHIP_MAX}")
        expected = SNAPSHOT_META_SIZE + 4 + length
    else:
        raise FormatError(f"snapshot meta version {version} is not known")
    if len(data) != expected:
        raise FormatError(f"snapshot meta version {version} is {len(data)} bytes, expected "
                          f"{expected}")
    if crc(data[:expected - 4]) != struct.unpack_from("<I", data, expected - 4)[0]:
        raise FormatError("snapshot meta CRC mismatch")
    membership = None
    if version == SNAPSHOT_META_V2:
        membership = data[at + 4 : expected - 4]
        _check_snapshot_membership(membership)
    check_plausible("snapshot meta", index=index, term=term, end_position=end,
                    created_ms=created, state_bytes=size)
    if min(index, term, end) < 1:  # a snapshot covers at least entry 1 of term 1
        raise ImplausibleValue(f"snapshot meta index {index}, term {term}, end_position {end}: "
                               "each must be at least 1")
    return SnapshotMeta(index, term, end, created, size, state_crc, membership)


def _check_snapshot_membership(raw: bytes) -> None:
    """The membership JSON of a version 2 snapshot meta, checked against the
    format page: ``{"v": 1, "voters": [...], "learners": [...]}``, members
    ``{"node_id": int > 0, "address": str, "directory_id": int >= 0}`` (and
    an optional ``"client_address": str``), at least one voter, no node twice."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise FormatError(f"snapshot meta membership is not JSON: {type(exc).__name__}"
                          ) from None
    if not isinstance(doc, dict) or doc.get("v") != 1:
        raise FormatError("snapshot meta membership has no known version")
    voters, learners = doc.get("voters"), doc.get("learners")
    if not isinstance(voters, list) or not isinstance(learners, list) or not voters:
        raise FormatError("snapshot meta membership needs a voter list (non-empty) and a "
                          "learner list")
    ids = []
    for member in voters + learners:
        if not isinstance(member, dict):
            raise FormatError("snapshot meta membership member is not an object")
        node_id, address, directory_id = (member.get("node_id"), member.get("address"),
                                          member.get("directory_id"))
        if (type(node_id) is not int or type(directory_id) is not int
                or not isinstance(address, str)
                or not isinstance(member.get("client_address", ""), str)):
            raise FormatError("snapshot meta membership member fields have the wrong types")
        check_plausible("snapshot meta membership", node_id=node_id,
                        directory_id=directory_id)
        if node_id < 1:
            raise ImplausibleValue("snapshot meta membership node id 0")
        ids.append(node_id)
    if len(ids) != len(set(ids)):
        raise FormatError(f"snapshot meta membership lists a node twice: {sorted(ids)}")


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
    try:
        queues = tuple((str(t), _int(q), _int(n)) for t, q, n in doc.get("queues", []))
        index, end = _int(doc["dispatched_index"]), _int(doc["dispatched_end"])
    except (KeyError, TypeError, ValueError) as exc:
        raise FormatError(f"dispatch checkpoint fields are malformed: {exc!r}") from exc
    check_plausible("dispatch checkpoint", dispatched_index=index, dispatched_end=end)
    for topic, queue_id, next_offset in queues:
        check_plausible(f"dispatch checkpoint queue {topic}/{queue_id}", next_offset=next_offset)
        if not 0 <= queue_id < 1 << 31:
            raise ImplausibleValue(f"dispatch checkpoint queue id {queue_id} of {topic} is "
                                   "outside [0, 2^31)")
    return DispatchCheckpoint(index, end, queues)


def _int(v: object) -> int:
    """An integer field of the msgpack checkpoint (a bool or float is malformed)."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{v!r} is not an integer")
    return v


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


def encode_identity(ident: Identity, version: int = FORMAT_VERSION) -> bytes:
    """Inverse of ``parse_identity`` (the planted suite writes replicas' identities)."""
    cluster = ident.cluster_id.encode("utf-8")
    head = IDENTITY_HEAD.pack(IDENTITY_MAGIC, version, ident.node_id, ident.directory_id,
                              ident.created_ms, len(cluster)) + cluster
    return head + struct.pack("<I", crc(head))


def encode_snapshot_meta(m: SnapshotMeta) -> bytes:
    """Inverse of ``parse_snapshot_meta`` (version 2 when ``m`` has a membership)."""
    version = SNAPSHOT_META_V1 if m.membership is None else SNAPSHOT_META_V2
    head = SNAPSHOT_META.pack(SNAPSHOT_MAGIC, version, m.index, m.term, m.end_position,
                              m.created_ms, m.state_bytes, m.state_crc, 0)
    if m.membership is not None:
        head += struct.pack("<I", len(m.membership)) + m.membership
    return head + struct.pack("<I", crc(head))


def encode_dispatch_checkpoint(dc: DispatchCheckpoint) -> bytes:
    """Inverse of ``parse_dispatch_checkpoint``."""
    body: bytes = msgpack.packb({
        "version": FORMAT_VERSION,
        "dispatched_index": dc.dispatched_index,
        "dispatched_end": dc.dispatched_end,
        "queues": [list(q) for q in dc.queues],
    })
    return body + struct.pack("<I", crc(body))
