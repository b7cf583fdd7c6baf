"""Raft-index files: fixed 32-byte records mapping an index to its entry.

Files are named by their first index and hold `records_per_file` records; the
record of index i sits at `(i - first) * 32`. They are derived data: recovery
rebuilds any part that is behind, too long or damaged.
"""

from __future__ import annotations

import contextlib
import os
import struct
from dataclasses import dataclass

from crc32c import crc32c

from commitlog import fileio
from commitlog.disk import (
    DirtyFile,
    open_append,
    read_exact,
    sync_and_close,
    trace_cut,
    write_at_end,
)
from commitlog.errors import DiskFullError

RECORD = struct.Struct("<QQIB3xI")  # 28 bytes covered by the record CRC
RECORD_SIZE = 32
_CRC = struct.Struct("<I")
NAME_DIGITS = 20


@dataclass(frozen=True, slots=True)
class IndexRecord:
    index: int
    position: int
    term: int
    size: int
    kind: int
    body_crc: int

    @property
    def end(self) -> int:
        return self.position + self.size


def encode_record(position: int, term: int, size: int, kind: int, body_crc: int) -> bytes:
    head = RECORD.pack(position, term, size, kind, body_crc)
    return head + _CRC.pack(crc32c(head))


def decode_record(index: int, raw: bytes, offset: int = 0) -> IndexRecord | None:
    """The record, or None when it is empty or fails its CRC."""
    position, term, size, kind, body_crc = RECORD.unpack_from(raw, offset)
    if _CRC.unpack_from(raw, offset + 28)[0] != crc32c(raw[offset : offset + 28]):
        return None
    if size == 0:
        return None
    return IndexRecord(index, position, term, size, kind, body_crc)


class IndexFiles:
    """The set of index files of one CommitLog.

    Invariant: records exist for exactly the indexes `first_index ..
    last_index` seen through the files' lengths (after `load()` and every
    mutation).
    """

    def __init__(self, directory: str, records_per_file: int) -> None:
        self.directory = directory
        self.records_per_file = records_per_file
        fileio.fs.makedirs(directory, exist_ok=True)
        self._fds: dict[int, int] = {}  # file first index -> fd
        self._lengths: dict[int, int] = {}  # file first index -> bytes
        self._dirty: set[int] = set()
        self._paths: dict[int, str] = {}
        # Records appended but not yet written: index files are derived data,
        # so they are written in large pieces (at the latest before a sync,
        # a read of those records, a truncation or close) instead of one
        # pwrite per append. Invariant: _pending holds indexes
        # _pending_first .. _pending_first + len(_pending) - 1.
        self._pending: list[bytes] = []
        self._pending_first = 0
        self.foreign: list[str] = []
        for name in sorted(fileio.fs.listdir(directory)):
            path = os.path.join(directory, name)
            if name.endswith(".durable"):
                continue  # the chaos harness's durability trace
            if name.endswith(".tmp"):
                fileio.fs.remove(path)
            elif len(name) == NAME_DIGITS and name.isdigit() and self._is_base(int(name)):
                base = int(name)
                self._fds[base] = open_append(path)
                self._lengths[base] = fileio.fs.size(self._fds[base])
            else:
                self.foreign.append(path)

    def _is_base(self, first: int) -> bool:
        return first >= 1 and (first - 1) % self.records_per_file == 0

    def _base_of(self, index: int) -> int:
        return (index - 1) // self.records_per_file * self.records_per_file + 1

    def _path(self, base: int) -> str:
        path = self._paths.get(base)
        if path is None:
            path = self._paths[base] = os.path.join(self.directory, f"{base:0{NAME_DIGITS}d}")
        return path

    def _fd(self, base: int) -> int:
        fd = self._fds.get(base)
        if fd is None:
            fd = self._fds[base] = open_append(self._path(base))
            self._lengths[base] = 0
        return fd

    def covered_through(self) -> int:
        """Highest index whose record slot exists in the files (0 if none)."""
        self.write_pending()
        if not self._fds:
            return 0
        base = max(self._fds)
        return base - 1 + self._lengths[base] // RECORD_SIZE

    def _queued(self, index: int) -> IndexRecord | bool | None:
        """The queued record of `index`; None if queued but bad; False if not queued."""
        at = index - self._pending_first
        if not self._pending or not 0 <= at < len(self._pending):
            return False
        return decode_record(index, self._pending[at])

    def read(self, index: int) -> IndexRecord | None:
        queued = self._queued(index)
        if queued is not False:
            return queued
        base = self._base_of(index)
        fd = self._fds.get(base)
        if fd is None or (index - base + 1) * RECORD_SIZE > self._lengths[base]:
            return None
        raw = read_exact(fd, (index - base) * RECORD_SIZE, RECORD_SIZE)
        return decode_record(index, raw) if len(raw) == RECORD_SIZE else None

    def read_range(self, lo: int, hi: int) -> list[IndexRecord | None]:
        """Records of indexes [lo, hi): one pread per file touched; queued
        records are served from memory."""
        result: list[IndexRecord | None] = []
        in_files = min(hi, max(lo, self._pending_first)) if self._pending else hi
        index = lo
        while index < in_files:
            base = self._base_of(index)
            stop = min(in_files, base + self.records_per_file)
            fd = self._fds.get(base)
            raw = b""
            if fd is not None:
                raw = read_exact(fd, (index - base) * RECORD_SIZE, (stop - index) * RECORD_SIZE)
            for i in range(index, stop):
                at = (i - index) * RECORD_SIZE
                ok = at + RECORD_SIZE <= len(raw)
                result.append(decode_record(i, raw, at) if ok else None)
            index = stop
        for i in range(index, hi):
            queued = self._queued(i)
            result.append(None if queued is False else queued)
        return result

    def append(self, first: int, records: list[bytes]) -> None:
        """Queue encoded records for indexes first, first+1, … (slots must be next)."""
        if self._pending:
            if first != self._pending_first + len(self._pending):
                raise ValueError(f"index record {first} does not follow the queued records")
        else:
            self._pending_first = first
        self._pending += records
        if len(self._pending) >= 2048:
            # Opportunistic: on a full disk the records stay queued (reads are
            # served from memory) and the next sync reports the error.
            with contextlib.suppress(DiskFullError):
                self.write_pending()

    def write_pending(self) -> None:
        """Write queued records to the files, one pwrite per file touched.
        A record leaves the queue only once it is written."""
        while self._pending:
            written = self._write_one_file(self._pending_first, self._pending)
            del self._pending[:written]
            self._pending_first += written

    def _write_one_file(self, first: int, records: list[bytes]) -> int:
        """Write the leading records that belong to one file; return how many."""
        base = self._base_of(first)
        take = min(len(records), base + self.records_per_file - first)
        fd = self._fd(base)
        at = (first - base) * RECORD_SIZE
        if at != self._lengths[base]:
            raise ValueError(f"index record {first} is not the next slot of {self._path(base)}")
        write_at_end(fd, at, b"".join(records[:take]), self._path(base))
        self._lengths[base] = at + take * RECORD_SIZE
        self._dirty.add(base)
        return take

    def truncate_after(self, index: int) -> None:
        """Drop every record of an index greater than `index`."""
        if self._pending:
            del self._pending[max(0, index - self._pending_first + 1):]
        for base in sorted(self._fds, reverse=True):
            if base > index:
                self._remove(base)
            else:
                keep = (index - base + 1) * RECORD_SIZE
                if self._lengths[base] > keep:
                    fileio.fs.ftruncate(self._fds[base], keep)
                    trace_cut(self._path(base), keep)
                    self._lengths[base] = keep
                    self._dirty.add(base)
                break

    def delete_before(self, index: int) -> None:
        """Remove files whose every record is below `index`."""
        self.write_pending()
        for base in sorted(self._fds):
            if base + self.records_per_file <= index:
                self._remove(base)

    def _remove(self, base: int) -> None:
        fileio.fs.close(self._fds.pop(base))
        del self._lengths[base]
        self._dirty.discard(base)
        fileio.fs.remove(self._path(base))
        trace_cut(self._path(base), None)

    def dirty_fds(self) -> list[DirtyFile]:
        self.write_pending()
        fds = [(fileio.fs.dup(self._fds[b]), self._path(b), self._lengths[b])
               for b in self._dirty if b in self._fds]
        self._dirty.clear()
        return fds

    def sync(self) -> None:
        sync_and_close(self.dirty_fds())

    def close(self, write_pending: bool = True) -> None:
        """Close the files; `write_pending=False` drops queued records (a crash)."""
        if write_pending:
            self.write_pending()
        self._pending = []
        for fd in self._fds.values():
            fileio.fs.close(fd)
        self._fds.clear()
        self._lengths.clear()
