"""The unit of distributed work: one file in, one compact result row out.

A ``FileTask`` names a bulk file and what to take from it; ``run_task``
parses the file's bytes with ``parse`` and returns a ``FileResult`` of numpy
arrays; ``to_batch``/``from_table`` turn results into one Arrow row each
(arrays as binary columns) and back, so a Spark task ships per file a few
blobs, never a row per record. Both engines run exactly this code, so their
results are identical by construction.

Modes:

- ``scan``: a segment's entry headers and body CRCs, and the topic deletions
  of its CONTROL entries (``control``);
- ``scan_msgs``: the same plus every message record (the reference replica);
- ``msgs``: the message records of given entries only (entries where a
  replica differs from every replica already decoded);
- ``index``: a Raft-index file's records;
- ``cq_hash``: a ConsumeQueue file's CRC, length and unit count (its units
  are only needed when it differs from the reference replica's file);
- ``cq_units``: the same plus its units;
- ``crc``: a file's CRC and length only (a snapshot's state file).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import time
from dataclasses import dataclass, field

import msgpack
import numpy as np
import pyarrow as pa
import zstandard

from spark_audit import control, fmt, inputs, parse
from spark_audit.inputs import FileInfo

SCAN, SCAN_MSGS, MSGS, INDEX, CQ_HASH, CQ_UNITS, CRC = (
    "scan", "scan_msgs", "msgs", "index", "cq_hash", "cq_units", "crc")

# Relative cost per byte of each mode, measured on 256 MiB segments of 1 KiB
# messages (CRC ~11 GB/s, record decoding ~1.3 GB/s); used to balance partitions.
_COST = {SCAN: 1.0, SCAN_MSGS: 6.0, MSGS: 5.0, INDEX: 0.5, CQ_HASH: 0.3, CQ_UNITS: 1.0,
         CRC: 0.1}


@dataclass(frozen=True)
class FileTask:
    tid: int
    info: FileInfo
    mode: str
    # MSGS: the ENTRY_DTYPE rows (of this file) whose records to decode, as bytes.
    entries: bytes = b""
    # SCAN_MSGS, MSGS: also compute each record's body CRC (a history has digests).
    digests: bool = False

    @property
    def cost(self) -> float:
        if self.mode == MSGS:
            rows = np.frombuffer(self.entries, parse.ENTRY_DTYPE)
            return float(rows["size"].astype(np.int64).sum()) * _COST[MSGS] + 1e5
        return self.info.length * _COST[self.mode] + 1e5


@dataclass
class FileResult:
    tid: int
    entries: np.ndarray | None = None  # ENTRY_DTYPE
    messages: np.ndarray | None = None  # MSG_DTYPE
    counts: np.ndarray | None = None  # records per entry of ``entries`` or of the task's rows
    topics: list[str] = field(default_factory=list)
    index: np.ndarray | None = None  # INDEX_OUT_DTYPE
    units: np.ndarray | None = None  # UNIT_DTYPE
    problems: list[parse.Problem] = field(default_factory=list)
    msg_problems: list[tuple[int, int, str, str, int]] = field(default_factory=list)
    deletions: list[control.Deletion] = field(default_factory=list)  # SCAN, SCAN_MSGS
    crc: int = 0
    length: int = 0
    count: int = 0  # non-empty ConsumeQueue units
    seconds: float = 0.0  # wall time of the parse (file open and serialization excluded)
    cpu: float = 0.0  # CPU time of the parse (user + system, this process)


def produced(arr: np.ndarray | None) -> np.ndarray:
    """An array of a ``FileResult`` that its task's mode always fills.

    (The fields are None only for the modes that do not produce them.)
    """
    if arr is None:
        raise ValueError("a file task's result lacks an array its mode produces")
    return arr


def run_task(task: FileTask, buf: parse.Buffer, max_entry_size: int) -> FileResult:
    """Parse one file's bytes as the task asks."""
    t0, c0 = time.perf_counter(), time.process_time()
    info = task.info
    buf = inputs.clip(buf, info)
    res = FileResult(task.tid, length=len(memoryview(buf)))
    if task.mode in (SCAN, SCAN_MSGS):
        scan = parse.scan_segment(buf, info.start, max_entry_size, start=info.read_from)
        res.entries, res.problems = scan.entries, scan.problems
        res.deletions = control.topic_deletions(buf, scan.entries)
        if task.mode == SCAN_MSGS:
            _add_messages(res, parse.parse_messages(buf, info.start, scan.entries,
                                                    task.digests))
    elif task.mode == MSGS:
        rows = np.frombuffer(task.entries, parse.ENTRY_DTYPE)
        _add_messages(res, parse.parse_messages(buf, info.start, rows, task.digests))
    elif task.mode == INDEX:
        res.index, res.problems = parse.parse_index_file(buf, info.start, info.read_from)
    elif task.mode == CRC:
        res.crc = fmt.crc(memoryview(buf))
    elif task.mode in (CQ_HASH, CQ_UNITS):
        res.crc = fmt.crc(memoryview(buf).cast("B")[info.read_from:])
        if task.mode == CQ_UNITS or info.view is not None:
            units, res.problems = cq_units(buf, info)
            res.count = len(units)
            if task.mode == CQ_UNITS:
                res.units = units
        else:
            res.problems = parse.cq_partial(res.length)
            res.count = parse.cq_unit_count(buf)
    else:
        raise ValueError(f"unknown task mode {task.mode}")
    res.seconds, res.cpu = time.perf_counter() - t0, time.process_time() - c0
    return res


def cq_units(buf: parse.Buffer, info: FileInfo) -> tuple[np.ndarray, list[parse.Problem]]:
    """A ConsumeQueue file's units and problems, as its view (if any) lets the audit see
    them: units pointing outside the view are dropped, and a trailing partial unit of a
    file still being written past a cut is not a problem."""
    units, probs = parse.parse_cq_file(buf, info.start, info.read_from)
    v = info.view
    if v is None:
        return units, probs
    if v.open_tail:
        probs = [p for p in probs if p[2] != "cq_partial_unit"]
    return v.keep_units(units), probs


def _add_messages(res: FileResult, scan: parse.MessageScan) -> None:
    res.messages, res.counts, res.topics = scan.messages, scan.counts, scan.topics
    res.msg_problems = scan.problems


def read_local(path: str) -> mmap.mmap | bytes:
    """The bytes of a local file, memory-mapped (no copy; empty files give ``b""``)."""
    with open(inputs.local_path(path), "rb") as fh:
        try:
            return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            return b""


class FileChangedError(OSError):
    """A file was shorter when read than when it was listed: a live broker cut it."""


def read_file(info: FileInfo) -> mmap.mmap | bytes:
    """The bytes of a local file as the audit reads it: whole, or its view's bytes.

    A whole file (no view: the deployment is stopped) is memory-mapped. A
    file under a view (an audit up to a cut of a live deployment) is read
    with ``preadv``, only ``[view.start, view.end)``, into anonymous memory
    (the pages before ``view.start`` are never touched, so they cost
    nothing): the broker may still cut a file it is writing after the
    listing (the uncommitted tail of a deposed leader), and touching a mapped
    page past a file's new end kills the process with SIGBUS, where a read
    just comes back short. A short read raises ``FileChangedError``, and the
    audit lists its files again (``runs.audit_listing_again``).
    """
    view = info.view
    if view is None:
        return read_local(info.path)
    start = view.start
    end = view.end if view.end >= 0 else start + info.length  # -1: to the listed end
    if end <= 0:
        return b""
    buf = mmap.mmap(-1, end)
    with open(inputs.local_path(info.path), "rb") as fh:
        at = start
        while at < end:
            got = os.preadv(fh.fileno(), [memoryview(buf)[at:end]], at)
            if got == 0:
                buf.close()
                raise FileChangedError(
                    f"{info.path}: {at} bytes when read, {end} when listed (cut meanwhile)")
            at += got
    return buf


def read_local_range(path: str, offset: int, length: int) -> bytes:
    """Up to ``length`` bytes of a local file from ``offset`` (fewer at its end)."""
    with open(inputs.local_path(path), "rb") as fh:
        fh.seek(offset)
        return fh.read(length)


def run_local(task: FileTask, max_entry_size: int) -> FileResult:
    """``run_task`` on a local file."""
    buf = read_file(task.info)
    try:
        return run_task(task, buf, max_entry_size)
    finally:
        if isinstance(buf, mmap.mmap):
            # A view still alive keeps the map open until it is collected.
            with contextlib.suppress(BufferError):
                buf.close()


# ------------------------------------------------------------------ Arrow rows

RESULT_SCHEMA = pa.schema([
    ("tid", pa.int32()),
    ("entries", pa.binary()),
    ("messages", pa.binary()),
    ("counts", pa.binary()),
    ("index", pa.binary()),
    ("units", pa.binary()),
    ("meta", pa.binary()),  # msgpack: topics, problems, msg_problems, deletions
    ("crc", pa.int64()),
    ("length", pa.int64()),
    ("count", pa.int64()),
    ("seconds", pa.float64()),
    ("cpu", pa.float64()),
])

_ARRAYS = (("entries", parse.ENTRY_DTYPE), ("messages", parse.MSG_DTYPE),
           ("counts", np.dtype("<i4")), ("index", parse.INDEX_OUT_DTYPE),
           ("units", parse.UNIT_DTYPE))


def pack(arr: np.ndarray) -> bytes:
    """A structured (or plain) array as a compact blob: columns, delta-coded, zstd.

    Stored field by field; integer fields of 4 or more bytes as differences
    from the previous row (offsets, indexes and sequences advance in small
    steps), then zstd. Records of a log compress well this way (offsets step
    by record sizes, producer ids and tags repeat), which cuts the bytes that
    cross the JVM; incompressible data costs one zstd pass.
    """
    names = arr.dtype.names or (None,)
    cols = []
    for name in names:
        col = np.ascontiguousarray(arr[name] if name else arr)
        if col.dtype.kind in "iu" and col.dtype.itemsize >= 4 and len(col):
            col = np.diff(col, prepend=col.dtype.type(0))  # wraps around: exact inverse
        cols.append(col.tobytes())
    head = struct.pack("<Q", len(arr))
    return head + zstandard.ZstdCompressor(level=3).compress(b"".join(cols))


def unpack(blob: bytes | memoryview | pa.Buffer, dtype: np.dtype) -> np.ndarray:
    """Inverse of ``pack``."""
    mv = memoryview(blob)
    (n,) = struct.unpack_from("<Q", mv)
    raw = zstandard.ZstdDecompressor().decompress(mv[8:], max_output_size=n * dtype.itemsize)
    out = np.empty(n, dtype)
    at = 0
    for name in dtype.names or (None,):
        ft = dtype[name] if name else dtype
        col = np.frombuffer(raw, ft, n, at)
        at += n * ft.itemsize
        if col.dtype.kind in "iu" and col.dtype.itemsize >= 4 and n:
            col = np.cumsum(col, dtype=ft)
        if name:
            out[name] = col
        else:
            out[:] = col
    return out


def to_batch(res: FileResult) -> pa.RecordBatch:
    """One result as a one-row batch of ``RESULT_SCHEMA``."""
    cols: list[pa.Array] = [pa.array([res.tid], pa.int32())]
    for name, _ in _ARRAYS:
        arr = getattr(res, name)
        cols.append(pa.array([None if arr is None else pack(arr)], pa.binary()))
    meta = msgpack.packb([res.topics, res.problems, res.msg_problems, res.deletions])
    cols.append(pa.array([meta], pa.binary()))
    cols += [pa.array([res.crc], pa.int64()), pa.array([res.length], pa.int64()),
             pa.array([res.count], pa.int64()), pa.array([res.seconds], pa.float64()),
             pa.array([res.cpu], pa.float64())]
    return pa.RecordBatch.from_arrays(cols, schema=RESULT_SCHEMA)


def from_table(table: pa.Table) -> list[FileResult]:
    """Inverse of ``to_batch`` over collected rows (batch by batch: no 2 GB column limit)."""
    out = []
    for batch in table.to_batches():
        cols = {name: batch.column(name) for name in RESULT_SCHEMA.names}
        for i in range(batch.num_rows):
            res = FileResult(int(cols["tid"][i].as_py()))
            for name, dtype in _ARRAYS:
                v = cols[name][i]
                if v.is_valid:
                    setattr(res, name, unpack(v.as_buffer(), dtype))
            topics, problems, msg_problems, deletions = msgpack.unpackb(
                cols["meta"][i].as_py())
            res.topics = list(topics)
            res.problems = [tuple(p) for p in problems]
            res.msg_problems = [tuple(p) for p in msg_problems]
            res.deletions = [(int(d), str(t)) for d, t in deletions]
            res.crc, res.length, res.count = (int(cols[k][i].as_py())
                                              for k in ("crc", "length", "count"))
            res.seconds = float(cols["seconds"][i].as_py())
            res.cpu = float(cols["cpu"][i].as_py())
            out.append(res)
    return out


def balance(tasks: list[FileTask], parts: int) -> list[list[FileTask]]:
    """Deal tasks into ``parts`` lists of similar cost (longest first, to the lightest).

    The lists come heaviest first: Spark starts partitions in order, so the
    heavy ones start first and the light ones fill in at the end.
    """
    parts = max(1, min(parts, len(tasks)))
    load = [0.0] * parts
    out: list[list[FileTask]] = [[] for _ in range(parts)]
    for t in sorted(tasks, key=lambda t: -t.cost):
        j = min(range(parts), key=load.__getitem__)
        out[j].append(t)
        load[j] += t.cost
    return [out[j] for j in sorted(range(parts), key=lambda j: -load[j])]
