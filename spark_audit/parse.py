"""Bulk parsers: one file's bytes in, Arrow tables out.

Each function takes a whole file as a buffer and returns Arrow tables whose
schemas are fixed below, so that the same function can run in-process or inside
a Spark ``mapInArrow`` task. Entry headers are variable-length records walked
with a tight ``struct`` loop; message records, index records and ConsumeQueue
units are decoded with numpy over whole buffers (the message walk advances all
entries of a segment in lock step, one record per step).

The ``gid``/``rid``/``fid`` columns are small integer ids the caller assigns to
the group, replica and file; they keep rows narrow (no repeated path strings).
Unsigned 64-bit fields (producer id, sequence) are stored as int64 with the
same bits, because Spark has no unsigned types.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from spark_audit import fmt

ID_FIELDS = [("gid", pa.int32()), ("rid", pa.int32()), ("fid", pa.int32())]

ENTRY_SCHEMA = pa.schema([
    *ID_FIELDS,
    ("file_offset", pa.int64()),
    ("index", pa.int64()),
    ("term", pa.int64()),
    ("position", pa.int64()),
    ("size", pa.int32()),
    ("kind", pa.int8()),
    ("body_crc", pa.int64()),
    ("crc_ok", pa.bool_()),
])

MESSAGE_SCHEMA = pa.schema([
    *ID_FIELDS,
    ("index", pa.int64()),
    ("phys_offset", pa.int64()),
    ("msg_size", pa.int32()),
    ("topic", pa.string()),
    ("queue_id", pa.int32()),
    ("producer_id", pa.int64()),
    ("sequence", pa.int64()),
    ("tag_hash", pa.int64()),
])

INDEX_SCHEMA = pa.schema([
    *ID_FIELDS,
    ("index", pa.int64()),
    ("position", pa.int64()),
    ("term", pa.int64()),
    ("size", pa.int32()),
    ("kind", pa.int8()),
    ("body_crc", pa.int64()),
    ("rec_ok", pa.bool_()),
])

CQ_SCHEMA = pa.schema([
    *ID_FIELDS,
    ("topic", pa.string()),
    ("queue_id", pa.int32()),
    ("slot", pa.int64()),
    ("offset", pa.int64()),
    ("msg_size", pa.int32()),
    ("tag_hash", pa.int64()),
])

PROBLEM_SCHEMA = pa.schema([
    *ID_FIELDS,
    ("file_offset", pa.int64()),
    ("index", pa.int64()),
    ("problem", pa.string()),
    ("detail", pa.string()),
])

TABLES = {
    "entries": ENTRY_SCHEMA,
    "messages": MESSAGE_SCHEMA,
    "index": INDEX_SCHEMA,
    "cq": CQ_SCHEMA,
    "problems": PROBLEM_SCHEMA,
}

# Message record layout as a numpy structured dtype (68 bytes, packed).
MESSAGE_DTYPE = np.dtype([
    ("size", "<u4"), ("queue_id", "<u4"), ("flag", "<u4"), ("sys_flag", "<u4"),
    ("born_ts", "<i8"), ("store_ts", "<i8"), ("producer_id", "<u8"), ("sequence", "<u8"),
    ("reconsume", "<u4"), ("topic_len", "<u2"), ("tags_len", "<u2"), ("keys_len", "<u2"),
    ("host_len", "<u2"), ("props_len", "<u4"), ("body_len", "<u4"),
])
assert MESSAGE_DTYPE.itemsize == fmt.MESSAGE_HEADER_SIZE

INDEX_DTYPE = np.dtype([
    ("position", "<u8"), ("term", "<u8"), ("size", "<u4"), ("kind", "u1"),
    ("reserved", "V3"), ("body_crc", "<u4"), ("record_crc", "<u4"),
])
CQ_DTYPE = np.dtype([("offset", "<u8"), ("size", "<u4"), ("tag_hash", "<u8")])

# Message headers are gathered in blocks so the (records x 68) index matrix
# stays a few MiB whatever the segment size.
_GATHER_BLOCK = 16384
_HEADER_COLS = np.arange(fmt.MESSAGE_HEADER_SIZE, dtype=np.int64)


@dataclass
class FileId:
    """Ids stamped on every row parsed from one file."""

    gid: int
    rid: int
    fid: int


@dataclass
class Problems:
    """Accumulates problem rows (corruption, torn tails, malformed records)."""

    ids: FileId
    rows: list[tuple[int, int, str, str]] = field(default_factory=list)

    def add(self, file_offset: int, index: int, problem: str, detail: str) -> None:
        self.rows.append((file_offset, index, problem, detail))

    def table(self) -> pa.Table:
        n = len(self.rows)
        cols = list(zip(*self.rows, strict=True)) if n else [[], [], [], []]
        return pa.table({
            "gid": pa.array([self.ids.gid] * n, pa.int32()),
            "rid": pa.array([self.ids.rid] * n, pa.int32()),
            "fid": pa.array([self.ids.fid] * n, pa.int32()),
            "file_offset": pa.array(cols[0], pa.int64()),
            "index": pa.array(cols[1], pa.int64()),
            "problem": pa.array(cols[2], pa.string()),
            "detail": pa.array(cols[3], pa.string()),
        }, schema=PROBLEM_SCHEMA)


def _ids(ids: FileId, n: int) -> dict[str, pa.Array]:
    return {
        "gid": pa.array(np.full(n, ids.gid, np.int32)),
        "rid": pa.array(np.full(n, ids.rid, np.int32)),
        "fid": pa.array(np.full(n, ids.fid, np.int32)),
    }


def _u32_at(a: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Little-endian u32 at each (unaligned) byte position of ``a``."""
    return (a[pos].astype(np.uint32) | (a[pos + 1].astype(np.uint32) << 8)
            | (a[pos + 2].astype(np.uint32) << 16) | (a[pos + 3].astype(np.uint32) << 24))


def gather_binary(a: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """A binary Arrow array of the byte ranges ``a[s:s+l]``, built without a Python loop."""
    n = len(starts)
    lengths = lengths.astype(np.int64)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    take = np.repeat(starts.astype(np.int64) - offsets[:-1], lengths) + np.arange(total)
    data = a[take] if total else np.zeros(0, np.uint8)
    return pa.Array.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)]
    )


def binary_to_string(arr: pa.Array) -> pa.Array:
    """Cast to string; a corrupt (non UTF-8) value is decoded with replacement characters."""
    try:
        return arr.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array([None if v is None else v.decode("utf-8", "replace")
                         for v in arr.to_pylist()], pa.string())


def tag_hashes(tags: pa.Array) -> np.ndarray:
    """Tag hash of every value, computing the CRC once per distinct tag."""
    enc = tags.dictionary_encode()
    uniq = [fmt.tag_hash(v) for v in enc.dictionary.to_pylist()]
    table = np.array(uniq, dtype=np.int64) if uniq else np.zeros(0, np.int64)
    return table[enc.indices.to_numpy(zero_copy_only=False)]


@dataclass
class SegmentResult:
    entries: pa.Table
    messages: pa.Table
    problems: pa.Table
    valid_end: int  # file offset just past the last valid entry


def _resync(buf: bytes | memoryview, start: int, base: int, n: int, raw: list) -> int:
    """Offset of the next plausible entry header after ``start``, or ``n``.

    A header is plausible when its magic, header CRC and self-recorded
    position all agree: a position equal to the offset it is found at cannot
    be matched by chance inside a message body that is not a copied header.
    """
    if not raw:
        raw.append(bytes(buf))
    data = raw[0]
    at = start + 1
    while True:
        at = data.find(fmt.ENTRY_MAGIC_BYTES, at)
        if at < 0 or at + fmt.ENTRY_HEADER_SIZE > n:
            return n
        head = fmt.ENTRY_HEADER.unpack_from(data, at)
        (stored_crc,) = struct.unpack_from("<I", data, at + 44)
        if head[8] == base + at and fmt.crc(data[at:at + 44]) == stored_crc:
            return at
        at += 1


def parse_segment(
    buf: bytes | memoryview | pa.Buffer,
    base_position: int,
    ids: FileId,
    max_entry_size: int = fmt.DEFAULT_MAX_ENTRY_SIZE,
) -> SegmentResult:
    """Parse one CommitLog segment that starts at log position ``base_position``.

    Every valid entry becomes a row of ``entries`` (with ``crc_ok`` false when
    only its body CRC fails, since its header, and so its identity, is still
    trustworthy); every record of a MESSAGES entry a row of ``messages``.
    Damaged headers are reported and skipped by scanning for the next
    plausible header; bytes after the last valid entry are a torn tail.
    """
    mv = memoryview(buf)
    n = len(mv)
    crc = fmt.crc
    unpack_head = fmt.ENTRY_HEADER.unpack_from
    unpack_u32 = struct.Struct("<I").unpack_from
    probs = Problems(ids)
    raw: list = []

    e_off: list[int] = []
    e_index: list[int] = []
    e_term: list[int] = []
    e_pos: list[int] = []
    e_size: list[int] = []
    e_kind: list[int] = []
    e_bcrc: list[int] = []
    e_ok: list[bool] = []
    body_start: list[int] = []
    body_end: list[int] = []
    body_entry: list[int] = []

    off = 0
    valid_end = 0
    while off < n:
        if n - off < fmt.ENTRY_HEADER_SIZE:
            probs.add(off, -1, "torn_tail", f"{n - off} bytes after the last entry")
            break
        magic, version, kind, _flags, size, bcrc, index, term, position, _r = unpack_head(mv, off)
        if magic != fmt.ENTRY_MAGIC or crc(mv[off:off + 44]) != unpack_u32(mv, off + 44)[0]:
            what = "bad_magic" if magic != fmt.ENTRY_MAGIC else "header_crc"
            nxt = _resync(mv, off, base_position, n, raw)
            if nxt >= n:
                probs.add(off, -1, what,
                          f"{what}; no valid header in the {n - off} bytes to end of file")
                break
            probs.add(off, -1, what, f"{what}; skipped {nxt - off} bytes to the next header")
            off = nxt
            continue
        if version != fmt.FORMAT_VERSION:
            probs.add(off, index, "unknown_version", f"entry version {version}")
        elif kind not in fmt.KINDS:
            probs.add(off, index, "unknown_kind", f"entry kind {kind}")
        if size < fmt.ENTRY_HEADER_SIZE or size > max_entry_size:
            probs.add(off, index, "bad_size", f"entry size {size}")
            nxt = _resync(mv, off, base_position, n, raw)
            if nxt >= n:
                break
            off = nxt
            continue
        if off + size > n:
            probs.add(off, index, "torn_tail",
                      f"entry of {size} bytes ends {off + size - n} bytes past end of file")
            break
        if position != base_position + off:
            probs.add(off, index, "position_mismatch",
                      f"header position {position} found at {base_position + off}")
        ok = crc(mv[off + 48:off + size]) == bcrc
        if not ok:
            probs.add(off, index, "body_crc", f"body CRC mismatch in entry {index}")
        if version == fmt.FORMAT_VERSION and kind == fmt.KIND_NOOP and size != 48:
            probs.add(off, index, "bad_noop", f"NOOP entry with a {size - 48}-byte body")
        e_off.append(off)
        e_index.append(index)
        e_term.append(term)
        e_pos.append(base_position + off)
        e_size.append(size)
        e_kind.append(kind)
        e_bcrc.append(bcrc)
        e_ok.append(ok)
        if kind == fmt.KIND_MESSAGES and version == fmt.FORMAT_VERSION:
            body_start.append(off + 48)
            body_end.append(off + size)
            body_entry.append(len(e_off) - 1)
        off += size
        valid_end = off

    m = len(e_off)
    entries = pa.table({
        **_ids(ids, m),
        "file_offset": pa.array(e_off, pa.int64()),
        "index": pa.array(np.array(e_index, np.uint64).view(np.int64)),
        "term": pa.array(np.array(e_term, np.uint64).view(np.int64)),
        "position": pa.array(e_pos, pa.int64()),
        "size": pa.array(e_size, pa.int32()),
        "kind": pa.array(e_kind, pa.int8()),
        "body_crc": pa.array(e_bcrc, pa.int64()),
        "crc_ok": pa.array(e_ok, pa.bool_()),
    }, schema=ENTRY_SCHEMA)
    a = np.frombuffer(mv, dtype=np.uint8)
    messages = _parse_messages(a, np.array(body_start, np.int64), np.array(body_end, np.int64),
                               np.array(body_entry, np.int64), entries, base_position, ids, probs)
    return SegmentResult(entries, messages, probs.table(), valid_end)


def _parse_messages(a: np.ndarray, starts: np.ndarray, ends: np.ndarray, entry_row: np.ndarray,
                    entries: pa.Table, base: int, ids: FileId, probs: Problems) -> pa.Table:
    """Walk every MESSAGES body of a segment in lock step and decode the records."""
    entry_index = entries.column("index").to_numpy()
    entry_off = entries.column("file_offset").to_numpy()
    rec_start: list[np.ndarray] = []
    rec_entry: list[np.ndarray] = []
    pos, end, row = starts, ends, entry_row
    empty = pos >= end
    for r in row[empty]:
        probs.add(int(entry_off[r]), int(entry_index[r]), "bad_message",
                  "MESSAGES entry with an empty body")
    keep = ~empty
    pos, end, row = pos[keep], end[keep], row[keep]
    while len(pos):
        fits = pos + fmt.MESSAGE_HEADER_SIZE <= end
        size = np.zeros(len(pos), np.int64)
        size[fits] = _u32_at(a, pos[fits])
        bad = ~fits | (size < fmt.MESSAGE_HEADER_SIZE) | (pos + size > end)
        for p, r in zip(pos[bad], row[bad], strict=True):
            probs.add(int(p), int(entry_index[r]), "bad_message",
                      f"message record at body offset {int(p - entry_off[r] - 48)} "
                      "does not fit its entry")
        good = ~bad
        rec_start.append(pos[good])
        rec_entry.append(row[good])
        pos = pos[good] + size[good]
        end, row = end[good], row[good]
        more = pos < end
        pos, end, row = pos[more], end[more], row[more]

    starts_all = np.concatenate(rec_start) if rec_start else np.zeros(0, np.int64)
    rows_all = np.concatenate(rec_entry) if rec_entry else np.zeros(0, np.int64)
    # Records were produced step by step; put them back in log order.
    order = np.argsort(starts_all, kind="stable")
    starts_all, rows_all = starts_all[order], rows_all[order]
    k = len(starts_all)
    head = np.empty(k, MESSAGE_DTYPE)
    for b in range(0, k, _GATHER_BLOCK):
        blk = starts_all[b:b + _GATHER_BLOCK]
        head[b:b + len(blk)] = a[blk[:, None] + _HEADER_COLS].view(MESSAGE_DTYPE)[:, 0]
    lens = (68 + head["topic_len"].astype(np.int64) + head["tags_len"] + head["keys_len"]
            + head["host_len"] + head["props_len"].astype(np.int64)
            + head["body_len"].astype(np.int64))
    mismatch = lens != head["size"]
    for p, r in zip(starts_all[mismatch], rows_all[mismatch], strict=True):
        probs.add(int(p), int(entry_index[r]), "bad_message",
                  "message record size does not match its field lengths")
    if mismatch.any():
        ok = ~mismatch
        starts_all, rows_all, head = starts_all[ok], rows_all[ok], head[ok]
        k = len(starts_all)
    topic_at = starts_all + fmt.MESSAGE_HEADER_SIZE
    topics = binary_to_string(gather_binary(a, topic_at, head["topic_len"]))
    tags = gather_binary(a, topic_at + head["topic_len"], head["tags_len"])
    return pa.table({
        **_ids(ids, k),
        "index": pa.array(entry_index[rows_all] if k else np.zeros(0, np.int64)),
        "phys_offset": pa.array(starts_all + base, pa.int64()),
        "msg_size": pa.array(head["size"].astype(np.int32)),
        "topic": topics,
        "queue_id": pa.array(head["queue_id"].astype(np.int32)),
        "producer_id": pa.array(head["producer_id"].view(np.int64)),
        "sequence": pa.array(head["sequence"].view(np.int64)),
        "tag_hash": pa.array(tag_hashes(tags)),
    }, schema=MESSAGE_SCHEMA)


def parse_index_file(buf: bytes | memoryview | pa.Buffer, first_index: int, ids: FileId
                     ) -> tuple[pa.Table, pa.Table]:
    """Parse a Raft-index file; all-zero records ("no entry") are dropped.

    Returns the records (``rec_ok`` false when the record CRC fails) and the
    problems (a trailing partial record).
    """
    probs = Problems(ids)
    mv = memoryview(buf)
    n = len(mv) // fmt.INDEX_RECORD_SIZE
    if len(mv) % fmt.INDEX_RECORD_SIZE:
        probs.add(n * fmt.INDEX_RECORD_SIZE, -1, "index_partial_record",
                  f"{len(mv) % fmt.INDEX_RECORD_SIZE} trailing bytes")
    raw = np.frombuffer(mv[:n * fmt.INDEX_RECORD_SIZE], dtype=np.uint8).reshape(n, 32)
    nonzero = raw.any(axis=1)
    rec = raw.view(INDEX_DTYPE)[:, 0]
    slots = np.nonzero(nonzero)[0]
    rec = rec[slots]
    ok = np.fromiter((fmt.crc(raw[i, :28].tobytes()) for i in slots), np.uint32, len(slots))
    ok = ok == rec["record_crc"]
    table = pa.table({
        **_ids(ids, len(slots)),
        "index": pa.array(slots.astype(np.int64) + first_index),
        "position": pa.array(rec["position"].view(np.int64)),
        "term": pa.array(rec["term"].view(np.int64)),
        "size": pa.array(rec["size"].astype(np.int32)),
        "kind": pa.array(rec["kind"].astype(np.int8)),
        "body_crc": pa.array(rec["body_crc"].astype(np.int64)),
        "rec_ok": pa.array(ok),
    }, schema=INDEX_SCHEMA)
    return table, probs.table()


def parse_cq_file(buf: bytes | memoryview | pa.Buffer, topic: str, queue_id: int,
                  first_slot: int, ids: FileId) -> tuple[pa.Table, pa.Table]:
    """Parse a ConsumeQueue file; empty (all-zero) slots are dropped.

    Holes are found later from the slot numbers of the remaining units, which
    also catches holes spanning a missing file.
    """
    probs = Problems(ids)
    mv = memoryview(buf)
    n = len(mv) // fmt.CQ_UNIT_SIZE
    if len(mv) % fmt.CQ_UNIT_SIZE:
        probs.add(n * fmt.CQ_UNIT_SIZE, -1, "cq_partial_unit",
                  f"{len(mv) % fmt.CQ_UNIT_SIZE} trailing bytes")
    units = np.frombuffer(mv[:n * fmt.CQ_UNIT_SIZE], dtype=CQ_DTYPE)
    nonzero = (units["offset"] != 0) | (units["size"] != 0) | (units["tag_hash"] != 0)
    slots = np.nonzero(nonzero)[0]
    units = units[slots]
    k = len(slots)
    table = pa.table({
        **_ids(ids, k),
        "topic": pa.array([topic] * k, pa.string()),
        "queue_id": pa.array(np.full(k, queue_id, np.int32)),
        "slot": pa.array(slots.astype(np.int64) + first_slot),
        "offset": pa.array(units["offset"].view(np.int64)),
        "msg_size": pa.array(units["size"].astype(np.int32)),
        "tag_hash": pa.array(units["tag_hash"].view(np.int64)),
    }, schema=CQ_SCHEMA)
    return table, probs.table()
