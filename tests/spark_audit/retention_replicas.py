"""Replica groups whose logs retention cut at different points, written by the product.

One replica is written with the real ``CommitLog`` and ``ConsumeQueueStore``
and copied to every node; each node's copy is then cut as a broker's
retention would: a snapshot at an applied index ``S`` (written with the
format writer of ``replica_builder``), ``CommitLog.delete_before`` at the
position just past ``S``, then ``ConsumeQueueStore.delete_before`` at the
log's first retained position. Every
group is ``ROOT/<group>/<node>/`` so one audit run covers them all; the
damage helpers below plant faults inside the range every node keeps.
"""

from __future__ import annotations

import os
import shutil
import struct

from commitlog import (
    KIND_MESSAGES,
    CommitLog,
    CommitLogConfig,
    HardState,
    Message,
    decode_messages,
    encode_messages,
)
from consumequeue import ConsumeQueueStore
from spark_audit import fmt

from .replica_builder import write_snapshot

NODES = ("n1", "n2", "n3")
CONFIG = CommitLogConfig(segment_size_bytes=16384, index_file_records=16)
# Small ConsumeQueue files, so that retention removes some of them.
UNITS_PER_FILE = 4
ENTRIES = 90
PRODUCER = 0x5EED5EED5EED5EED
# Where retention cut each node of a normal group (snapshot index): n1 keeps
# everything, n2 and n3 lost different prefixes.
CUTS = {"n1": 0, "n2": 25, "n3": 45}


def _batch(i: int) -> list[Message]:
    return [Message("orders" if (i + j) % 2 else "audit-log", bytes([65 + j]) * 300,
                    queue_id=(i + j) % 3, tags="red" if j % 2 else "", producer_id=PRODUCER,
                    sequence=4 * i + j, born_host="10.1.2.3:4567",
                    born_timestamp_ms=1_700_000_000_000 + i,
                    store_timestamp_ms=1_700_000_000_500) for j in range(4)]


def write_base(data_dir: str, entries: int = ENTRIES) -> list[tuple[int, int, int]]:
    """One replica of the first ``entries`` entries (every base holds the same
    entries at the same positions: a shorter one is a replica that stopped
    there); returns (entry index, sequence, physical offset) of every message."""
    log = CommitLog.open(data_dir, CONFIG)
    try:
        for i in range(entries):
            body = encode_messages(_batch(i), CONFIG.message_size_bytes_max)
            log.append(log.build_entries(1, [(KIND_MESSAGES, body)]))
        store = ConsumeQueueStore.open(data_dir, log, units_per_file=UNITS_PER_FILE)
        store.dispatch_committed(entries)
        store.checkpoint()
        store.close()
        log.save_hard_state(HardState(1, 1, entries))
        return [(e.index, s.message.sequence, s.physical_offset)
                for e in log.read_entries(1, entries + 1)
                for s in decode_messages(e.body, e.position)]
    finally:
        log.close()


def body_of(sequence: int) -> bytes:
    """The body ``write_base`` stored for a message sequence."""
    return _batch(sequence // 4)[sequence % 4].body


def cut(data_dir: str, index: int, snapshot: bool = True, cq_at: int | None = None) -> int:
    """Retention on one replica: a snapshot at ``index``, then the log cut at the
    position just past it (whole segments below it go) and the ConsumeQueues
    at the log's first retained position, as the broker's retention does
    (``cq_at``: at another position instead, a fault). Returns the new first index."""
    log = CommitLog.open(data_dir, CONFIG)
    try:
        end = log.entry_end(index)
        if snapshot:
            write_snapshot(data_dir, index, log.term_at(index), end, b"state at %d" % index)
        log.delete_before(end)
        store = ConsumeQueueStore.open(data_dir, log, units_per_file=UNITS_PER_FILE)
        store.delete_before(log.segments.bases[0] if cq_at is None else cq_at)
        store.checkpoint()
        store.close()
        return log.first_index
    finally:
        log.close()


def write_group(base: str | dict[str, str], group: str, cuts: dict[str, int]) -> str:
    """``group/<node>`` copies of ``base`` (or of each node's own base), each cut
    at its snapshot index (0: kept whole)."""
    for node, at in cuts.items():
        d = os.path.join(group, node)
        shutil.copytree(base if isinstance(base, str) else base[node], d)
        if at:
            cut(d, at)
    return group


# ------------------------------------------------------------------ locating and damage


def segments(data_dir: str) -> list[str]:
    d = os.path.join(data_dir, "commitlog")
    return [os.path.join(d, f) for f in sorted(os.listdir(d))]


def entry_at(data_dir: str, index: int) -> tuple[str, int, int]:
    """(segment path, file offset, entry size) of entry ``index``, by walking the headers."""
    for path in segments(data_dir):
        with open(path, "rb") as f:
            buf = f.read()
        off = 0
        while off + fmt.ENTRY_HEADER_SIZE <= len(buf):
            head = fmt.ENTRY_HEADER.unpack_from(buf, off)
            size, at = head[4], head[6]
            if at == index:
                return path, off, size
            off += size
    raise AssertionError(f"entry {index} not found in {data_dir}")


def first_entry(segment: str) -> int:
    """Index of a segment file's first entry."""
    with open(segment, "rb") as f:
        return int(fmt.ENTRY_HEADER.unpack_from(f.read(fmt.ENTRY_HEADER_SIZE))[6])


def flip_body_byte(data_dir: str, index: int) -> None:
    path, off, _ = entry_at(data_dir, index)
    with open(path, "r+b") as f:
        f.seek(off + fmt.ENTRY_HEADER_SIZE + 100)
        b = f.read(1)
        f.seek(off + fmt.ENTRY_HEADER_SIZE + 100)
        f.write(bytes([b[0] ^ 0x40]))


def rewrite_term(data_dir: str, index: int, term: int) -> None:
    """Another term in entry ``index``'s header, with a valid header CRC."""
    path, off, _ = entry_at(data_dir, index)
    with open(path, "r+b") as f:
        f.seek(off)
        head = bytearray(f.read(fmt.ENTRY_HEADER_SIZE))
        struct.pack_into("<Q", head, 24, term)
        struct.pack_into("<I", head, fmt.ENTRY_HEADER_CRC_AT, fmt.crc(bytes(head[:44])))
        f.seek(off)
        f.write(head)


def remove_segment_of(data_dir: str, index: int) -> str:
    """Delete the segment file holding entry ``index``; returns its path."""
    path, _, _ = entry_at(data_dir, index)
    os.remove(path)
    return path


def shift_unit(data_dir: str, topic: str, queue_id: int) -> int:
    """Point the first unit of a queue's last file one byte further; returns its slot."""
    d = os.path.join(data_dir, "consumequeue", topic, str(queue_id))
    name = sorted(os.listdir(d))[-1]
    with open(os.path.join(d, name), "r+b") as f:
        (offset,) = struct.unpack("<Q", f.read(8))
        f.seek(0)
        f.write(struct.pack("<Q", offset + 1))
    return int(name)


def cut_segment_inside(data_dir: str, index: int) -> None:
    """Truncate the segment file holding entry ``index`` in the middle of that
    entry (what a truncated file leaves: the entry and all after it gone)."""
    path, off, size = entry_at(data_dir, index)
    os.truncate(path, off + size // 2)
    for later in segments(data_dir):
        if int(os.path.basename(later)) > int(os.path.basename(path)):
            os.remove(later)


def snapshot_dir(data_dir: str) -> str:
    d = os.path.join(data_dir, "snapshots")
    return os.path.join(d, sorted(os.listdir(d))[-1])
