"""Writes replica data directories by the format page, for audit tests and the benchmark.

This is an independent, minimal writer of docs/storage-format.md: segments
with the placement rule and rollover, Raft-index files, checkpoint,
hardstate, ConsumeQueue files, the dispatch checkpoint and snapshots. It knows nothing
about Raft; callers decide what each replica holds. The helpers at the bottom
damage a written replica in the ways the audit must catch.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from spark_audit import fmt

HOST = b"127.0.0.1:40000"


@dataclass(frozen=True)
class Msg:
    topic: str
    queue_id: int
    body: bytes
    tags: bytes = b""
    keys: bytes = b""
    producer_id: int = 0
    sequence: int = 0
    properties: bytes = b""
    born_ts: int = 1_700_000_000_000
    store_ts: int = 1_700_000_000_001


def encode_message(m: Msg) -> bytes:
    topic = m.topic.encode()
    size = 68 + len(topic) + len(m.tags) + len(m.keys) + len(HOST) + len(m.properties) + len(
        m.body)
    head = fmt.MESSAGE_HEADER.pack(
        size, m.queue_id, 0, 0, m.born_ts, m.store_ts, m.producer_id, m.sequence, 0,
        len(topic), len(m.tags), len(m.keys), len(HOST), len(m.properties), len(m.body))
    return b"".join((head, topic, m.tags, m.keys, HOST, m.properties, m.body))


@dataclass
class Entry:
    index: int
    term: int
    kind: int = fmt.KIND_MESSAGES
    messages: list[Msg] = field(default_factory=list)
    body: bytes | None = None  # explicit body (CONTROL, or a hand-made MESSAGES body)

    def payload(self) -> bytes:
        if self.body is not None:
            return self.body
        if self.kind == fmt.KIND_MESSAGES:
            return b"".join(encode_message(m) for m in self.messages)
        return b""


def encode_entry(index: int, term: int, kind: int, position: int, body: bytes) -> bytes:
    size = 48 + len(body)
    head = fmt.ENTRY_HEADER.pack(fmt.ENTRY_MAGIC, 1, kind, 0, size, fmt.crc(body), index, term,
                                 position, 0)
    return head + struct.pack("<I", fmt.crc(head)) + body


def make_log(batches: Iterable[list[Msg]], term: int = 1, first_index: int = 1) -> list[Entry]:
    """One MESSAGES entry per batch, consecutive indexes, one term."""
    return [Entry(first_index + i, term, fmt.KIND_MESSAGES, list(b)) for i, b in enumerate(batches)]


@dataclass
class Placed:
    index: int
    term: int
    kind: int
    position: int
    size: int
    body_crc: int
    segment: int  # segment start position
    # (topic, queue_id, phys_offset, record size, tag hash) of each message.
    messages: list[tuple[str, int, int, int, int]]


@dataclass
class Layout:
    root: str
    segment_size: int
    entries: list[Placed]
    # (topic, queue_id) -> list of (slot, phys_offset)
    units: dict[tuple[str, int], list[tuple[int, int]]]

    def entry(self, index: int) -> Placed:
        return next(p for p in self.entries if p.index == index)

    def segment_path(self, start: int) -> str:
        return os.path.join(self.root, "commitlog", f"{start:020d}")

    def cq_path(self, topic: str, queue_id: int, units_per_file: int, slot: int) -> str:
        first = slot - slot % units_per_file
        return os.path.join(self.root, "consumequeue", topic, str(queue_id), f"{first:020d}")


def _records(body: bytes) -> Iterator[tuple[int, bytes]]:
    off = 0
    while off < len(body):
        (size,) = struct.unpack_from("<I", body, off)
        yield off, body[off:off + size]
        off += size


def write_replica(root: str, entries: list[Entry], *, segment_size: int = 1 << 20,
                  commit: int | None = None, term: int | None = None,
                  durable_index: int | None = None, index_file_records: int = 1024,
                  units_per_file: int = 1000, dispatched_index: int | None = None,
                  first_position: int = 0, skip_before: dict[str, int] | None = None
                  ) -> Layout:
    """Write one replica's data directory holding ``entries`` (a contiguous run).

    ``commit`` goes to the hardstate (default: the last index) and bounds the
    ConsumeQueue dispatch; ``durable_index`` to the checkpoint (default: last).
    ``skip_before``: topic -> entry index of its deletion; its messages in
    earlier entries are not dispatched (as a broker that applied it does).
    """
    skip = skip_before or {}
    os.makedirs(os.path.join(root, "commitlog"), exist_ok=True)
    os.makedirs(os.path.join(root, "index"), exist_ok=True)
    last = entries[-1].index if entries else 0
    commit = last if commit is None else commit
    durable_index = last if durable_index is None else durable_index
    dispatched = commit if dispatched_index is None else dispatched_index
    placed: list[Placed] = []
    end = first_position
    seg_start = -1
    seg_file = None
    try:
        for e in entries:
            body = e.payload()
            size = 48 + len(body)
            pos = end
            if end % segment_size + size > segment_size:
                pos = (end // segment_size + 1) * segment_size
            start = pos - pos % segment_size
            if start != seg_start:
                if seg_file:
                    seg_file.close()
                seg_file = open(os.path.join(root, "commitlog", f"{start:020d}"), "wb")  # noqa: SIM115
                seg_start = start
            seg_file.write(encode_entry(e.index, e.term, e.kind, pos, body))
            msgs = []
            if e.kind == fmt.KIND_MESSAGES:
                for off, rec in _records(body):
                    (tl,) = struct.unpack_from("<H", rec, 52)
                    (gl,) = struct.unpack_from("<H", rec, 54)
                    (qid,) = struct.unpack_from("<I", rec, 4)
                    topic = rec[68:68 + tl].decode()
                    tags = rec[68 + tl:68 + tl + gl]
                    msgs.append((topic, qid, pos + 48 + off, len(rec), fmt.tag_hash(tags)))
            placed.append(Placed(e.index, e.term, e.kind, pos, size, fmt.crc(body), start, msgs))
            end = pos + size
    finally:
        if seg_file:
            seg_file.close()

    # Raft-index files.
    by_file: dict[int, list[Placed]] = {}
    for p in placed:
        first = 1 + (p.index - 1) // index_file_records * index_file_records
        by_file.setdefault(first, []).append(p)
    for first, ps in by_file.items():
        buf = bytearray((ps[-1].index - first + 1) * 32)
        for p in ps:
            rec = fmt.INDEX_RECORD.pack(p.position, p.term, p.size, p.kind, p.body_crc)
            buf[(p.index - first) * 32:(p.index - first + 1) * 32] = rec + struct.pack(
                "<I", fmt.crc(rec))
        with open(os.path.join(root, "index", f"{first:020d}"), "wb") as f:
            f.write(buf)

    dur = [p for p in placed if p.index <= durable_index]
    cp = fmt.Checkpoint(durable_index, dur[-1].position + dur[-1].size if dur else 0,
                        dur[-1].term if dur else 0, entries[0].index if entries else 1)
    with open(os.path.join(root, "checkpoint"), "wb") as f:
        f.write(fmt.encode_checkpoint(cp))
    hs_term = term if term is not None else (placed[-1].term if placed else 1)
    with open(os.path.join(root, "hardstate"), "wb") as f:
        f.write(fmt.encode_hardstate(fmt.HardState(hs_term, 0, commit)))

    units: dict[tuple[str, int], list[tuple[int, int]]] = {}
    raw: dict[tuple[str, int], list[bytes]] = {}
    disp_end = 0
    for p in placed:
        if p.index > dispatched:
            break
        disp_end = p.position + p.size
        for topic, qid, off, size, th in p.messages:
            if p.index < skip.get(topic, 0):
                continue
            q = units.setdefault((topic, qid), [])
            q.append((len(q), off))
            raw.setdefault((topic, qid), []).append(fmt.CQ_UNIT.pack(off, size, th))
    for (topic, qid), recs in raw.items():
        d = os.path.join(root, "consumequeue", topic, str(qid))
        os.makedirs(d, exist_ok=True)
        for first in range(0, len(recs), units_per_file):
            with open(os.path.join(d, f"{first:020d}"), "wb") as f:
                f.write(b"".join(recs[first:first + units_per_file]))
    os.makedirs(os.path.join(root, "consumequeue"), exist_ok=True)
    dc = fmt.DispatchCheckpoint(min(dispatched, last), disp_end,
                                tuple((t, q, len(r)) for (t, q), r in sorted(raw.items())))
    with open(os.path.join(root, "consumequeue", "checkpoint"), "wb") as f:
        f.write(fmt.encode_dispatch_checkpoint(dc))
    return Layout(root, segment_size, placed, units)


def write_snapshot(root: str, index: int, term: int, end_position: int, state: bytes,
                   created_ms: int = 1_700_000_000_000) -> str:
    """``snapshots/<index>/{state,meta}`` of a replica, by the format page; returns the dir."""
    d = os.path.join(root, "snapshots", f"{index:020d}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "state"), "wb") as f:
        f.write(state)
    meta = fmt.SnapshotMeta(index, term, end_position, created_ms, len(state), fmt.crc(state))
    with open(os.path.join(d, "meta"), "wb") as f:
        f.write(fmt.encode_snapshot_meta(meta))
    return d


# ----------------------------------------------------------------- damage helpers


def rewrite_entry_term(layout: Layout, index: int, term: int) -> None:
    """Rewrite one entry's header with another term and a valid header CRC."""
    p = layout.entry(index)
    path = layout.segment_path(p.segment)
    with open(path, "r+b") as f:
        f.seek(p.position - p.segment)
        head = bytearray(f.read(48))
        struct.pack_into("<Q", head, 24, term)
        struct.pack_into("<I", head, 44, fmt.crc(bytes(head[:44])))
        f.seek(p.position - p.segment)
        f.write(head)


def truncate_log(layout: Layout, keep_through: int) -> None:
    """Cut the log right after entry ``keep_through`` (later segments are removed)."""
    p = layout.entry(keep_through)
    cut = p.position + p.size
    for q in layout.entries:
        path = layout.segment_path(q.segment)
        if q.segment > p.segment and os.path.exists(path):
            os.remove(path)
    with open(layout.segment_path(p.segment), "r+b") as f:
        f.truncate(cut - p.segment)


def flip_byte(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


def set_cq_unit_offset(layout: Layout, topic: str, queue_id: int, slot: int, offset: int,
                       units_per_file: int = 1000) -> None:
    """Point one ConsumeQueue unit at another physical offset (size and tag kept)."""
    path = layout.cq_path(topic, queue_id, units_per_file, slot)
    with open(path, "r+b") as f:
        f.seek(slot % units_per_file * 20)
        f.write(struct.pack("<Q", offset))
