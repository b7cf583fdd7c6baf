"""Bulk parsers: one file's bytes in, compact numpy arrays out.

Each function takes a whole file as a buffer and returns numpy structured
arrays of fixed dtypes (below) plus a short list of problems, so the same
function runs in-process or inside a Spark task, and its output crosses the
JVM as a few binary blobs per file, never as rows per record.

A segment is read in two steps because the second is needed for one replica
only (see docs/audit.md, "Who decodes what"):

- ``scan_segment`` walks the entry headers (a tight ``struct`` loop over a
  few thousand entries per segment) and checks every body CRC; cost is one
  pass of hardware CRC over the bytes.
- ``parse_messages`` decodes the message records of chosen MESSAGES entries
  with numpy over the whole buffer: all bodies are walked in lock step (one
  record per step), then the 68-byte record headers are copied row-wise
  out of a strided window and viewed as a structured dtype.

Unsigned 64-bit fields (producer id, sequence, tag hash) are kept as int64
with the same bits, matching the Arrow/Spark tables the findings use.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from typing import TypeAlias

import crc32c
import numpy as np
import pandas as pd
import pyarrow as pa

from spark_audit import crcvec, fmt

# One row per valid entry header. ``file_offset`` is where the header is in
# its file, ``position`` where that is in the log (segment base + offset);
# ``crc_ok`` is false when only the body CRC fails (the header, and so the
# entry's identity, is still trustworthy); ``has_msgs`` marks MESSAGES entries
# of a known version, the ones whose records are decoded.
ENTRY_DTYPE = np.dtype([
    ("file_offset", "<i8"), ("index", "<i8"), ("term", "<i8"), ("position", "<i8"),
    ("body_crc", "<u4"), ("size", "<i4"), ("kind", "i1"), ("crc_ok", "?"), ("has_msgs", "?"),
])

# One row per decoded message record. ``topic`` indexes the topic list returned
# with the array (per file; the driver maps it to global ids).
# ``body_crc`` is the CRC32C of the record's body bytes, computed only when asked
# (a history with body digests to compare against); 0 otherwise.
MSG_DTYPE = np.dtype([
    ("index", "<i8"), ("phys_offset", "<i8"), ("producer_id", "<i8"), ("sequence", "<i8"),
    ("tag_hash", "<i8"), ("size", "<i4"), ("queue_id", "<i4"), ("topic", "<i4"),
    ("body_crc", "<u4"),
])

# One row per non-empty Raft-index record; ``rec_ok`` is its record CRC.
INDEX_OUT_DTYPE = np.dtype([
    ("index", "<i8"), ("position", "<i8"), ("term", "<i8"), ("body_crc", "<u4"),
    ("size", "<i4"), ("kind", "i1"), ("rec_ok", "?"),
])

# One row per non-empty ConsumeQueue unit.
UNIT_DTYPE = np.dtype([("slot", "<i8"), ("offset", "<i8"), ("tag_hash", "<i8"), ("size", "<i4")])

# On-disk layouts.
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

# Bytes after a record header gathered with it: topic and tags usually fit.
_TEXT_BYTES = 60

# What the parsers read: a whole file's bytes, however they were obtained
# (read, memory-mapped, or an Arrow buffer of a file's content in a Spark task).
Buffer: TypeAlias = bytes | bytearray | memoryview | mmap.mmap | pa.Buffer

# A problem: (file_offset, index, kind, detail); -1 when not known.
Problem = tuple[int, int, str, str]


@dataclass
class SegmentScan:
    """Entry headers of one segment and what was wrong with the file."""

    entries: np.ndarray  # ENTRY_DTYPE, in file order
    problems: list[Problem] = field(default_factory=list)
    valid_end: int = 0  # file offset just past the last valid entry


@dataclass
class MessageScan:
    """Decoded records of some entries of one segment."""

    messages: np.ndarray  # MSG_DTYPE, in log order
    topics: list[str]  # values of MSG_DTYPE["topic"]
    counts: np.ndarray  # records decoded per entry given (aligned with the entries)
    # (file_offset, index, kind, detail, row of the entry given)
    problems: list[tuple[int, int, str, str, int]] = field(default_factory=list)


def field_names(dtype: np.dtype) -> tuple[str, ...]:
    """The field names of a structured dtype, in order."""
    if dtype.names is None:
        raise TypeError(f"{dtype} is not a structured dtype")
    return dtype.names


def at_every_byte(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A view of ``a`` with one ``dtype`` item starting at every byte offset.

    ``view[p]`` is the (unaligned, little-endian) value whose bytes start at
    ``a[p]``; indexing it with an array of positions gathers whole values, or
    single fields of a structured dtype, without copying anything else.
    """
    n = max(len(a) - dtype.itemsize + 1, 0)
    if not n:
        return np.zeros(0, dtype)
    return np.ndarray((n,), dtype, buffer=a, offset=0, strides=(1,))


def gather_rows(a: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """``a[s:s+width]`` for every start as a (len(starts), width) copy.

    Indexing the first axis of a strided window copies whole rows, which is
    several times faster than an element-wise gather with an index matrix;
    bytes past the end of ``a`` read as zero.
    """
    n = len(a)
    if not len(starts):
        return np.zeros((0, width), np.uint8)
    if n < width:
        a = np.concatenate([a, np.zeros(width - n, np.uint8)])
    win = np.lib.stride_tricks.as_strided(a, shape=(len(a) - width + 1, width),
                                          strides=(1, 1), writeable=False)
    over = starts > len(a) - width
    rows = win[np.where(over, 0, starts)]
    for j in np.nonzero(over)[0]:  # rows running past the end (the last few): zero-padded
        rows[j] = 0
        rows[j, :n - starts[j]] = a[starts[j]:n]
    return rows


def distinct_values(rows: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, list[bytes]]:
    """Distinct byte strings ``rows[i, :lengths[i]]``: (id of each row, values).

    Bytes past a row's length are zeroed and its length appended, so two rows
    are equal exactly when their strings are; Arrow's hash-based dictionary
    encoding then dedupes the fixed-width rows.
    """
    n, width = rows.shape
    kw = max(width + 2, 8) if width + 2 <= 8 else width + 2
    key = np.zeros((n, kw), np.uint8)
    key[:, :width] = rows
    key[:, :width][np.arange(width)[None, :] >= lengths[:, None].astype(np.int64)] = 0
    key[:, kw - 2:] = lengths.astype("<u2").view(np.uint8).reshape(n, 2)
    if kw == 8:
        # Up to 6 bytes: the key is one u64, hashed by pandas' factorize.
        codes, uniq = pd.factorize(key.view("<u8")[:, 0], sort=False)
        firsts = uniq.astype("<u8").view(np.uint8).reshape(-1, 8)
        values = [bytes(v[:int.from_bytes(bytes(v[6:]), "little")]) for v in firsts]
        return codes.astype(np.int32), values
    fixed = pa.FixedSizeBinaryArray.from_buffers(pa.binary(kw), n, [None, pa.py_buffer(key)])
    enc = fixed.dictionary_encode()
    values = [v[:int.from_bytes(v[kw - 2:], "little")] for v in enc.dictionary.to_pylist()]
    return enc.indices.to_numpy(zero_copy_only=False).astype(np.int32), values


def short_strings(a: np.ndarray, starts: np.ndarray, lengths: np.ndarray
                  ) -> tuple[np.ndarray, list[bytes]]:
    """Distinct values of the byte ranges ``a[s:s+l]``: (id of each range, values)."""
    width = int(lengths.max()) if len(starts) else 0
    if width > 256:  # long values: a variable-width array instead of fixed rows
        enc = gather_binary(a, starts, lengths).dictionary_encode()
        return (enc.indices.to_numpy(zero_copy_only=False).astype(np.int32),
                enc.dictionary.to_pylist())
    return distinct_values(gather_rows(a, starts, width), lengths)


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


def _resync(data: bytes, start: int, base: int) -> int:
    """Offset of the next plausible entry header after ``start``, or ``len(data)``.

    A header is plausible when its magic, header CRC and self-recorded
    position all agree: a position equal to the offset it is found at cannot
    be matched by chance inside a message body that is not a copied header.
    """
    n = len(data)
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


# An entry header as it lies on disk (``fmt.ENTRY_HEADER`` and its CRC).
HEADER_DTYPE = np.dtype([
    ("magic", "<u4"), ("version", "u1"), ("kind", "u1"), ("flags", "<u2"), ("size", "<u4"),
    ("body_crc", "<u4"), ("index", "<u8"), ("term", "<u8"), ("position", "<u8"),
    ("reserved", "<u4"), ("header_crc", "<u4"),
])
assert HEADER_DTYPE.itemsize == fmt.ENTRY_HEADER_SIZE


def _scan_intact(mv: memoryview, base: int, max_entry_size: int, bodies: bool, start: int = 0
                 ) -> SegmentScan | None:
    """``scan_segment`` for a segment whose every header is intact, else None.

    The walk from entry to entry (each size gives the next offset) is the only
    loop per entry; the headers are then gathered in one copy and checked as
    arrays (magic, version, kind, placement, plausible index and term, NOOP
    size), their CRCs and the bodies' one call each. Anything unexpected,
    including a tail that is not a whole entry, returns None and the careful
    walk (``scan_segment``) reads the file instead, so both give the same rows
    and problems.
    """
    n = len(mv)
    size_at = struct.Struct("<I").unpack_from
    offs: list[int] = []
    add = offs.append
    off = start
    try:
        while off < n:
            size = size_at(mv, off + 8)[0]
            if size < fmt.ENTRY_HEADER_SIZE or size > max_entry_size:
                return None
            add(off)
            off += size
    except struct.error:  # a header cut by the end of the file
        return None
    if off != n:
        return None
    at = np.array(offs, np.int64)
    raw = gather_rows(np.frombuffer(mv, np.uint8), at, fmt.ENTRY_HEADER_SIZE)
    h = raw.view(HEADER_DTYPE)[:, 0] if len(at) else np.zeros(0, HEADER_DTYPE)
    kinds = np.array(fmt.KINDS, np.uint8)
    if not (bool((h["magic"] == fmt.ENTRY_MAGIC).all())
            and bool((h["version"] == fmt.FORMAT_VERSION).all())
            and bool(np.isin(h["kind"], kinds).all())
            and bool((h["position"] == np.uint64(base) + at.astype(np.uint64)).all())
            and bool(((h["index"] >= 1) & (h["index"] <= fmt.MAX_PLAUSIBLE)).all())
            and bool(((h["term"] >= 1) & (h["term"] <= fmt.MAX_PLAUSIBLE)).all())
            and bool(((h["kind"] != fmt.KIND_NOOP) | (h["size"] == 48)).all())):
        return None
    if not bool((crcvec.crc_rows(raw[:, :fmt.ENTRY_HEADER_CRC_AT]) == h["header_crc"]).all()):
        return None
    size = h["size"].astype(np.int64)
    if bodies:
        ends = (at + size).tolist()
        crc = crc32c.crc32c  # one call per body, the wrapper's cost is not worth paying
        body = np.fromiter((crc(mv[o + 48:e]) for o, e in zip(offs, ends, strict=True)),
                           np.uint32, len(offs))
        ok = body == h["body_crc"]
    else:
        ok = np.ones(len(offs), bool)
    entries = np.zeros(len(offs), ENTRY_DTYPE)
    entries["file_offset"] = at
    entries["index"] = h["index"].view(np.int64)
    entries["term"] = h["term"].view(np.int64)
    entries["position"] = base + at
    entries["body_crc"] = h["body_crc"]
    entries["size"] = size
    entries["kind"] = h["kind"].view(np.int8)
    entries["crc_ok"] = ok
    entries["has_msgs"] = h["kind"] == fmt.KIND_MESSAGES
    probs: list[Problem] = [(int(at[j]), int(entries["index"][j]), "body_crc",
                             f"body CRC mismatch in entry {int(entries['index'][j])}")
                            for j in np.nonzero(~ok)[0]]
    return SegmentScan(entries, probs, n)


def scan_segment(buf: Buffer, base_position: int,
                 max_entry_size: int = fmt.DEFAULT_MAX_ENTRY_SIZE, bodies: bool = True,
                 start: int = 0) -> SegmentScan:
    """Walk the entry headers of one segment that starts at log position ``base_position``.

    Every valid header becomes a row (with ``crc_ok`` false when only its body
    CRC fails). Damaged headers are reported and skipped by scanning for the
    next plausible header; bytes after the last valid entry are a torn tail.
    With ``bodies`` false the body CRCs are not computed (every ``crc_ok`` is
    true): the walk alone, for a second read of a file already checked.
    ``start`` (an entry header's file offset) starts the walk there: the bytes
    before it are not read (an audit window, ``window``); file offsets stay
    the file's.
    """
    mv = memoryview(buf).cast("B")
    fast = _scan_intact(mv, base_position, max_entry_size, bodies, start)
    if fast is not None:
        return fast
    n = len(mv)
    crc = fmt.crc
    unpack_head = fmt.ENTRY_HEADER.unpack_from
    unpack_u32 = struct.Struct("<I").unpack_from
    probs: list[Problem] = []
    raw: list[bytes] = []  # the file as bytes, made only if a resync is needed

    def resync(at: int) -> int:
        if not raw:
            raw.append(bytes(mv))
        return _resync(raw[0], at, base_position)

    # One ENTRY_DTYPE row per valid entry (fields in order).
    rows: list[tuple[int, int, int, int, int, int, int, bool, bool]] = []
    off = start
    valid_end = start
    while off < n:
        if n - off < fmt.ENTRY_HEADER_SIZE:
            probs.append((off, -1, "torn_tail", f"{n - off} bytes after the last entry"))
            break
        magic, version, kind, _flags, size, bcrc, index, term, position, _r = unpack_head(mv, off)
        if magic != fmt.ENTRY_MAGIC or crc(mv[off:off + 44]) != unpack_u32(mv, off + 44)[0]:
            what = "bad_magic" if magic != fmt.ENTRY_MAGIC else "header_crc"
            nxt = resync(off)
            if nxt >= n:
                probs.append((off, -1, what,
                              f"{what}; no valid header in the {n - off} bytes to end of file"))
                break
            probs.append((off, -1, what, f"{what}; skipped {nxt - off} bytes to the next header"))
            off = nxt
            continue
        if version != fmt.FORMAT_VERSION:
            probs.append((off, index, "unknown_version", f"entry version {version}"))
        elif kind not in fmt.KINDS:
            probs.append((off, index, "unknown_kind", f"entry kind {kind}"))
        if size < fmt.ENTRY_HEADER_SIZE or size > max_entry_size:
            probs.append((off, index, "bad_size", f"entry size {size}"))
            nxt = resync(off)
            if nxt >= n:
                break
            off = nxt
            continue
        if off + size > n:
            probs.append((off, index, "torn_tail",
                          f"entry of {size} bytes ends {off + size - n} bytes past end of file"))
            break
        if not (1 <= index <= fmt.MAX_PLAUSIBLE and 1 <= term <= fmt.MAX_PLAUSIBLE):
            # CRC-valid, so not a torn write: a header rewritten with a value no
            # log can hold. Skipped whole (its size is sane), never carried on.
            probs.append((off, -1, "implausible_value",
                          f"entry header index {index}, term {term} outside [1, 2^63-1]"))
            off += size
            valid_end = off
            continue
        if position != base_position + off:
            probs.append((off, index, "position_mismatch",
                          f"header position {position} found at {base_position + off}"))
        ok = not bodies or crc(mv[off + 48:off + size]) == bcrc
        if not ok:
            probs.append((off, index, "body_crc", f"body CRC mismatch in entry {index}"))
        if version == fmt.FORMAT_VERSION and kind == fmt.KIND_NOOP and size != 48:
            probs.append((off, index, "bad_noop", f"NOOP entry with a {size - 48}-byte body"))
        rows.append((off, index, term, base_position + off, bcrc, size, kind, ok,
                     kind == fmt.KIND_MESSAGES and version == fmt.FORMAT_VERSION))
        off += size
        valid_end = off

    entries = np.zeros(len(rows), ENTRY_DTYPE)
    if rows:
        cols = list(zip(*rows, strict=True))
        for name, col in zip(field_names(ENTRY_DTYPE), cols, strict=True):
            if name in ("index", "term"):
                # u64 on disk; kept as the int64 with the same bits.
                entries[name] = np.array(col, np.uint64).view(np.int64)
            else:
                entries[name] = col
    return SegmentScan(entries, probs, valid_end)


def parse_messages(buf: Buffer, base_position: int, entries: np.ndarray,
                   body_crcs: bool = False) -> MessageScan:
    """Decode the records of the ``has_msgs`` rows of ``entries`` (rows of this segment).

    Records that do not fit their entry, or whose length fields disagree with
    their size, are reported (``bad_message``) and not decoded; the walk of
    that entry stops at the first record that does not fit. With
    ``body_crcs`` each record's body CRC32C is computed too (one CRC call per
    record, so only when a history's digests are to be compared).
    """
    raw = memoryview(buf).cast("B")
    a = np.frombuffer(raw, dtype=np.uint8)
    probs: list[tuple[int, int, str, str, int]] = []
    entry_index = entries["index"]
    entry_off = entries["file_offset"]
    want = np.nonzero(entries["has_msgs"])[0]
    pos = entry_off[want] + fmt.ENTRY_HEADER_SIZE
    end = entry_off[want] + entries["size"][want].astype(np.int64)
    row = want.astype(np.int64)
    empty = pos >= end
    for r in row[empty]:
        probs.append((int(entry_off[r]), int(entry_index[r]), "bad_message",
                      "MESSAGES entry with an empty body", int(r)))
    keep = ~empty
    pos, end, row = pos[keep], end[keep], row[keep]
    u32 = at_every_byte(a, np.dtype("<u4"))
    rec_start: list[np.ndarray] = []
    rec_entry: list[np.ndarray] = []
    while len(pos):
        fits = pos + fmt.MESSAGE_HEADER_SIZE <= end
        size = np.zeros(len(pos), np.int64)
        size[fits] = u32[pos[fits]]
        bad = ~fits | (size < fmt.MESSAGE_HEADER_SIZE) | (pos + size > end)
        for p, r in zip(pos[bad], row[bad], strict=True):
            probs.append((int(p), int(entry_index[r]), "bad_message",
                          f"message record at body offset {int(p - entry_off[r] - 48)} "
                          "does not fit its entry", int(r)))
        good = ~bad
        rec_start.append(pos[good])
        rec_entry.append(row[good])
        pos = pos[good] + size[good]
        end, row = end[good], row[good]
        more = pos < end
        pos, end, row = pos[more], end[more], row[more]

    starts = np.concatenate(rec_start) if rec_start else np.zeros(0, np.int64)
    rows_of = np.concatenate(rec_entry) if rec_entry else np.zeros(0, np.int64)
    # Records were produced step by step; put them back in log order.
    order = np.argsort(starts, kind="stable")
    starts, rows_of = starts[order], rows_of[order]
    # One gather of each record's first bytes (header, then usually topic and
    # tags): records are ~1 KiB apart, so each access is a cache miss and one
    # wide copy per record beats several narrow ones.
    rows = gather_rows(a, starts, fmt.MESSAGE_HEADER_SIZE + _TEXT_BYTES)
    head = np.ascontiguousarray(rows[:, :fmt.MESSAGE_HEADER_SIZE]).view(MESSAGE_DTYPE)[:, 0]
    topic_len, tags_len = head["topic_len"], head["tags_len"]
    lens = (68 + topic_len.astype(np.int64) + tags_len + head["keys_len"]
            + head["host_len"] + head["props_len"].astype(np.int64)
            + head["body_len"].astype(np.int64))
    mismatch = lens != head["size"]
    for p, r in zip(starts[mismatch], rows_of[mismatch], strict=True):
        probs.append((int(p), int(entry_index[r]), "bad_message",
                      "message record size does not match its field lengths", int(r)))
    if mismatch.any():
        ok = ~mismatch
        starts, rows_of, rows, head = starts[ok], rows_of[ok], rows[ok], head[ok]
        topic_len, tags_len = head["topic_len"], head["tags_len"]
    topic_at = starts + fmt.MESSAGE_HEADER_SIZE
    wt = int(topic_len.max()) if len(starts) else 0
    wg = int(tags_len.max()) if len(starts) else 0
    if wt + wg <= _TEXT_BYTES:
        text = rows[:, fmt.MESSAGE_HEADER_SIZE:]
        topic_ids, topics = distinct_values(text[:, :wt], topic_len)
        cols = topic_len[:, None].astype(np.int64) + np.arange(wg)[None, :]
        tag_ids, tags = distinct_values(np.take_along_axis(text, cols, 1), tags_len)
    else:
        topic_ids, topics = short_strings(a, topic_at, topic_len)
        tag_ids, tags = short_strings(a, topic_at + topic_len, tags_len)
    # A corrupt (non UTF-8) topic is decoded with replacement characters.
    topic_names = [v.decode("utf-8", "replace") for v in topics]
    out = np.empty(len(starts), MSG_DTYPE)
    out["index"] = entry_index[rows_of]
    out["phys_offset"] = starts + base_position
    out["producer_id"] = head["producer_id"].view(np.int64)
    out["sequence"] = head["sequence"].view(np.int64)
    tag_table = np.array([fmt.tag_hash(t) for t in tags] or [0], np.uint64).view(np.int64)
    out["tag_hash"] = tag_table[tag_ids]
    out["size"] = head["size"].view(np.int32)
    out["queue_id"] = head["queue_id"].view(np.int32)
    out["topic"] = topic_ids
    out["body_crc"] = 0
    if body_crcs and len(starts):
        body_len = head["body_len"].astype(np.int64)
        body_at = starts + head["size"].astype(np.int64) - body_len
        crc = fmt.crc
        mv = raw  # the bytes `a` views
        out["body_crc"] = np.fromiter(
            (crc(mv[p:p + n]) for p, n in zip(body_at.tolist(), body_len.tolist(), strict=True)),
            np.uint32, len(starts))
    counts = np.bincount(rows_of, minlength=len(entries)).astype(np.int32)
    return MessageScan(out, topic_names, counts, probs)


def parse_index_file(buf: Buffer, first_index: int, start: int = 0
                     ) -> tuple[np.ndarray, list[Problem]]:
    """Parse a Raft-index file; all-zero records ("no entry") are dropped.

    Returns the records (``rec_ok`` false when the record CRC fails) and the
    problems (a trailing partial record). ``start`` (a multiple of the record
    size) skips the records before it unread (an audit window).
    """
    if start:
        skip = start - start % fmt.INDEX_RECORD_SIZE
        recs, found = parse_index_file(memoryview(buf).cast("B")[skip:],
                                       first_index + skip // fmt.INDEX_RECORD_SIZE)
        return recs, [(p[0] + skip, p[1], p[2], p[3]) for p in found]
    probs: list[Problem] = []
    mv = memoryview(buf).cast("B")
    n = len(mv) // fmt.INDEX_RECORD_SIZE
    if len(mv) % fmt.INDEX_RECORD_SIZE:
        probs.append((n * fmt.INDEX_RECORD_SIZE, -1, "index_partial_record",
                      f"{len(mv) % fmt.INDEX_RECORD_SIZE} trailing bytes"))
    raw = np.frombuffer(mv[:n * fmt.INDEX_RECORD_SIZE], dtype=np.uint8).reshape(n, 32)
    # A record is empty when its four 8-byte words are zero (faster than any() per byte).
    words = raw.view("<u8")
    slots = np.nonzero(words[:, 0] | words[:, 1] | words[:, 2] | words[:, 3])[0]
    rec = raw.view(INDEX_DTYPE)[slots, 0]
    wild = (rec["position"] > fmt.MAX_PLAUSIBLE) | (rec["term"] > fmt.MAX_PLAUSIBLE)
    for j in np.nonzero(wild)[0]:
        probs.append((int(slots[j]) * fmt.INDEX_RECORD_SIZE, int(slots[j]) + first_index,
                      "implausible_value", f"index record position {int(rec['position'][j])}, "
                                           f"term {int(rec['term'][j])} outside [0, 2^63-1]"))
    slots, rec = slots[~wild], rec[~wild]
    ok = crcvec.crc_rows(raw[:, :28] if len(slots) == n else raw[slots, :28])
    out = np.empty(len(slots), INDEX_OUT_DTYPE)
    out["index"] = slots.astype(np.int64) + first_index
    out["position"] = rec["position"].view(np.int64)
    out["term"] = rec["term"].view(np.int64)
    out["body_crc"] = rec["body_crc"]
    out["size"] = rec["size"].view(np.int32)
    out["kind"] = rec["kind"].view(np.int8)
    out["rec_ok"] = ok == rec["record_crc"]
    return out, probs


def cq_partial(length: int) -> list[Problem]:
    """The problem of a ConsumeQueue file whose length is not a multiple of a unit."""
    n = length // fmt.CQ_UNIT_SIZE
    if length % fmt.CQ_UNIT_SIZE:
        return [(n * fmt.CQ_UNIT_SIZE, -1, "cq_partial_unit",
                 f"{length % fmt.CQ_UNIT_SIZE} trailing bytes")]
    return []


def parse_cq_file(buf: Buffer, first_slot: int, start: int = 0
                  ) -> tuple[np.ndarray, list[Problem]]:
    """Parse a ConsumeQueue file; empty (all-zero) slots are dropped.

    Holes are found later from the slot numbers of the remaining units, which
    also catches holes spanning a missing file. ``start`` (a multiple of the
    unit size) skips the units before it unread (an audit window).
    """
    if start:
        skip = start - start % fmt.CQ_UNIT_SIZE
        units, found = parse_cq_file(memoryview(buf).cast("B")[skip:],
                                     first_slot + skip // fmt.CQ_UNIT_SIZE)
        return units, [(p[0] + skip, p[1], p[2], p[3]) for p in found]
    mv = memoryview(buf).cast("B")
    n = len(mv) // fmt.CQ_UNIT_SIZE
    units = np.frombuffer(mv[:n * fmt.CQ_UNIT_SIZE], dtype=CQ_DTYPE)
    nonzero = (units["offset"] != 0) | (units["size"] != 0) | (units["tag_hash"] != 0)
    slots = np.nonzero(nonzero)[0]
    units = units[slots]
    probs = cq_partial(len(mv))
    wild = units["offset"] > fmt.MAX_PLAUSIBLE
    for j in np.nonzero(wild)[0]:
        probs.append((int(slots[j]) * fmt.CQ_UNIT_SIZE, -1, "implausible_value",
                      f"unit of slot {int(slots[j]) + first_slot} points at offset "
                      f"{int(units['offset'][j])}, outside [0, 2^63-1]"))
    slots, units = slots[~wild], units[~wild]
    out = np.empty(len(slots), UNIT_DTYPE)
    out["slot"] = slots.astype(np.int64) + first_slot
    out["offset"] = units["offset"].view(np.int64)
    out["tag_hash"] = units["tag_hash"].view(np.int64)
    out["size"] = units["size"].view(np.int32)
    return out, probs


def cq_unit_count(buf: Buffer) -> int:
    """Number of non-empty units of a ConsumeQueue file (without keeping them)."""
    mv = memoryview(buf).cast("B")
    n = len(mv) // fmt.CQ_UNIT_SIZE
    raw = np.frombuffer(mv[:n * fmt.CQ_UNIT_SIZE], dtype=np.uint8).reshape(n, fmt.CQ_UNIT_SIZE)
    return int(raw.any(axis=1).sum()) if n else 0
