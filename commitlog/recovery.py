"""Crash recovery: verify the log from the checkpoint forward and cut a torn tail.

Theory of operation. The checkpoint says which prefix of the log was fsynced
(and that the index files covering it were fsynced too). Everything after it
may have been lost or torn by a crash. Recovery therefore:

1. picks a start segment (the one holding the checkpoint's last durable entry,
   or the first segment when verifying fully or when the index cannot vouch
   for the start);
2. scans every entry from there, checking header CRC, body CRC, index
   continuity, non-decreasing terms and the placement rule;
3. stops at the first invalid byte: if that lies after the durable point it is
   a torn tail and is cut (and reported with path and offset); if it lies at
   or before the durable point, data acknowledged as durable is damaged and
   recovery raises CorruptionError without deleting anything;
4. rewrites the index records of every scanned entry.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from crc32c import crc32c

from commitlog.checkpoint import Checkpoint
from commitlog.entry import HEADER_SIZE, decode_header, place
from commitlog.errors import CorruptionError
from commitlog.index_file import IndexFiles, encode_record
from commitlog.segments import SegmentFiles

_CHUNK = 8 * 1024 * 1024


@dataclass(frozen=True)
class TailCut:
    """A torn or corrupt tail removed by recovery."""

    path: str
    offset: int
    reason: str
    bytes_dropped: int


@dataclass
class RecoveryReport:
    """What opening a CommitLog found and did; printed by the broker at start."""

    data_dir: str
    first_index: int = 1
    last_index: int = 0
    scan_from_index: int = 1
    entries_verified: int = 0
    bytes_verified: int = 0
    cuts: list[TailCut] = field(default_factory=list)
    index_rebuilt_from: int | None = None
    foreign_files: list[str] = field(default_factory=list)
    # (first, last) index of an interrupted snapshot install finished at open.
    install_finished: tuple[int, int] | None = None
    duration_s: float = 0.0

    def lines(self) -> list[str]:
        out = [
            f"commitlog {self.data_dir}: indexes {self.first_index}..{self.last_index}, "
            f"verified {self.entries_verified} entries ({self.bytes_verified} bytes) "
            f"from index {self.scan_from_index} in {self.duration_s:.3f}s"
        ]
        out += [f"cut torn tail at {c.path}:{c.offset} ({c.reason}), {c.bytes_dropped} bytes"
                for c in self.cuts]
        if self.install_finished is not None:
            out.append(f"finished an interrupted snapshot install of indexes "
                       f"{self.install_finished[0]}..{self.install_finished[1]}")
        if self.index_rebuilt_from is not None:
            out.append(f"index rebuilt from index {self.index_rebuilt_from}")
        out += [f"foreign file left in place: {p}" for p in self.foreign_files]
        return out


@dataclass
class RecoveredState:
    first_index: int
    last_index: int
    last_term: int
    end: int


class _Stop(Exception):
    def __init__(self, position: int, reason: str) -> None:
        self.position = position
        self.reason = reason


def _choose_start(segments: SegmentFiles, index: IndexFiles, ck: Checkpoint,
                  full: bool, report: RecoveryReport) -> tuple[int, tuple[int, int, int] | None]:
    """Start segment base and the (index, term, end) of the entry before it, if any."""
    first_base = segments.bases[0]
    if full or ck.durable_index < ck.first_index or ck.durable_end == 0:
        return first_base, None
    base = segments.base_of(ck.durable_end - 1)
    if base < first_base:
        # Retention deleted the segment holding the durable point, and the
        # crash (or a failed write) came before the checkpoint moved past it:
        # everything kept lies after it, so scan from the first kept segment.
        report.index_rebuilt_from = ck.first_index
        return first_base, None
    if base not in segments.lengths:
        raise CorruptionError(segments.path(base), 0,
                              f"segment holding durable index {ck.durable_index} is missing")
    if base == first_base:
        return first_base, None
    head = segments.read(base, HEADER_SIZE)
    header = decode_header(head) if len(head) == HEADER_SIZE else None
    if header is None or header.problem or header.position != base:
        why = "short file" if header is None else (header.problem or "position mismatch")
        raise CorruptionError(segments.path(base), 0, f"first entry of a durable segment: {why}")
    before = index.read(header.index - 1)
    if before is None or place(before.end, header.size, segments.segment_size) != base:
        report.index_rebuilt_from = ck.first_index
        return first_base, None  # the index cannot vouch for the prefix: rescan it all
    return base, (before.index, before.term, before.end)


def _first_index(segments: SegmentFiles, ck: Checkpoint) -> int:
    """The index of the first segment's first entry. Retention deletes
    segments before it writes the checkpoint, so after a crash in between
    the checkpoint's first_index is behind; the segments are the truth. (A
    damaged first header falls back to the checkpoint; reads report it.)"""
    base = segments.bases[0]
    head = segments.read(base, HEADER_SIZE)
    if len(head) == HEADER_SIZE:
        header = decode_header(head)
        if header.problem is None and header.position == base:
            return header.index
    return ck.first_index


def recover(data_dir: str, segments: SegmentFiles, index: IndexFiles,
            checkpoint: Checkpoint | None, segment_size: int, entry_size_limit: int,
            full: bool) -> tuple[RecoveredState, RecoveryReport]:
    """Bring segments and index files to a verified, consistent state."""
    started = time.monotonic()
    ck = checkpoint or Checkpoint()
    report = RecoveryReport(data_dir)
    if not segments.bases:
        if ck.durable_index >= ck.first_index:
            raise CorruptionError(segments.directory, ck.durable_end,
                                  f"no segments, but the checkpoint says index "
                                  f"{ck.durable_index} is durable")
        index.truncate_after(ck.first_index - 1)
        index.delete_before(ck.first_index)
        report.first_index, report.last_index = ck.first_index, ck.first_index - 1
        report.scan_from_index = ck.first_index
        # Every entry was cut (after retention moved the start): the next
        # one goes where the cut left the end, which the checkpoint kept.
        end = ck.durable_end if ck.durable_index == ck.first_index - 1 else 0
        return RecoveredState(ck.first_index, ck.first_index - 1, 0, end), report

    start_base, before = _choose_start(segments, index, ck, full, report)
    records: list[bytes] = []
    prev = before  # (index, term, end) of the last valid entry
    first_index: int | None = None
    if start_base != segments.bases[0]:
        first_index = _first_index(segments, ck)
    scan_from: int | None = None
    stop: _Stop | None = None
    position = start_base
    bi = segments.bases.index(start_base)
    buf = b""
    buf_at = 0
    while True:
        base = segments.bases[bi]
        length = segments.lengths[base]
        if position - base >= length:
            if bi + 1 == len(segments.bases):
                break
            bi += 1
            position = segments.bases[bi]
            if segments.lengths[position] == 0:
                stop = _Stop(position, "empty segment file")
                break
            if prev is None:
                # Nothing valid before this segment: a crash lost the earlier
                # segment's unsynced writes but kept a later one's. Whatever
                # follows lies past a hole, so it cannot be the log.
                stop = _Stop(position, "segment after one holding no valid entry")
                break
            continue
        try:
            if length - (position - base) < HEADER_SIZE:
                raise _Stop(position, "truncated entry header")
            if not (buf_at <= position and position + HEADER_SIZE <= buf_at + len(buf)):
                buf, buf_at = segments.read(position, _CHUNK), position
            header = decode_header(buf, position - buf_at)
            if header.problem:
                raise _Stop(position, header.problem)
            if header.position != position:
                raise _Stop(position, f"entry claims position {header.position}")
            if header.size > entry_size_limit or position - base + header.size > length:
                raise _Stop(position, f"entry of {header.size} bytes runs past the file end")
            if prev is not None:
                if header.index != prev[0] + 1:
                    raise _Stop(position, f"index {header.index} after {prev[0]}")
                if header.term < prev[1]:
                    raise _Stop(position, f"term {header.term} after term {prev[1]}")
                if place(prev[2], header.size, segment_size) != position:
                    raise _Stop(position, "entry is not where the placement rule puts it")
            if position + header.size > buf_at + len(buf):
                buf, buf_at = segments.read(position, max(_CHUNK, header.size)), position
            body = memoryview(buf)[position - buf_at + HEADER_SIZE : position - buf_at
                                   + header.size]
            if crc32c(body) != header.body_crc:
                raise _Stop(position, "body CRC mismatch")
        except _Stop as found:
            stop = found
            break
        if first_index is None:
            first_index = header.index
        if scan_from is None:
            scan_from = header.index
        records.append(encode_record(position, header.term, header.size, header.kind,
                                     header.body_crc))
        report.entries_verified += 1
        report.bytes_verified += header.size
        prev = (header.index, header.term, position + header.size)
        position += header.size

    if first_index is None:
        first_index = ck.first_index
    last_index = prev[0] if prev else first_index - 1
    if last_index < ck.durable_index:
        where = stop.position if stop else (prev[2] if prev else start_base)
        reason = stop.reason if stop else "log ends early"
        raise CorruptionError(
            segments.path(segments.base_of(where)), where - segments.base_of(where),
            f"{reason}; the checkpoint says index {ck.durable_index} is durable but the "
            f"valid log ends at index {last_index}",
        )
    end = prev[2] if prev else start_base
    if stop is not None:
        tail = sum(max(0, b + segments.lengths[b] - max(b, end)) for b in segments.bases)
        report.cuts.append(TailCut(segments.path(segments.base_of(stop.position)),
                                   stop.position - segments.base_of(stop.position),
                                   stop.reason, tail))
        segments.truncate(end)
    scan_from = scan_from if scan_from is not None else last_index + 1
    index.truncate_after(scan_from - 1)
    if records:
        index.append(scan_from, records)
    index.delete_before(first_index)  # left by a retention a crash interrupted
    report.first_index, report.last_index = first_index, last_index
    report.scan_from_index = scan_from
    report.duration_s = time.monotonic() - started
    return RecoveredState(first_index, last_index, prev[1] if prev else 0, end), report
