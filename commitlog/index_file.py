"""Raft-index files: fixed 32-byte records mapping an index to its entry.

Files are named by their first index and hold `records_per_file` records; the
record of index i sits at `(i - first) * 32`. They are derived data: recovery
rebuilds any part that is behind, too long or damaged.
"""

from __future__ import annotations

import contextlib
import struct
from dataclasses import dataclass

from crc32c import crc32c

from commitlog.disk import DirtyFile, sync_and_close, sync_directory
from commitlog.errors import DiskFullError
from commitlog.file_queue import FileQueue

RECORD = struct.Struct("<QQIB3xI")  # 28 bytes covered by the record CRC
RECORD_SIZE = 32
_CRC = struct.Struct("<I")


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
        # Index i is in the file named by the first index of its run of
        # `records_per_file`, counted from index 1.
        self.files = FileQueue(directory, records_per_file, unit_size=RECORD_SIZE, origin=1)
        self.foreign = self.files.foreign
        # Records appended but not yet written: index files are derived data,
        # so they are written in large pieces (at the latest before a sync,
        # a read of those records, a truncation or close) instead of one
        # pwrite per append. Invariant: _pending holds indexes
        # _pending_first .. _pending_first + len(_pending) - 1.
        self._pending: list[bytes] = []
        self._pending_first = 0

    def covered_through(self) -> int:
        """Highest index whose record slot exists in the files (0 if none)."""
        self.write_pending()
        if not self.files.bases:
            return 0
        base = self.files.bases[-1]
        return base - 1 + self.files.lengths[base] // RECORD_SIZE

    def _is_queued(self, index: int) -> bool:
        return bool(self._pending) and 0 <= index - self._pending_first < len(self._pending)

    def _queued(self, index: int) -> IndexRecord | None:
        """The queued record of `index` (None if it is bad); only if `_is_queued`."""
        return decode_record(index, self._pending[index - self._pending_first])

    def read(self, index: int) -> IndexRecord | None:
        if self._is_queued(index):
            return self._queued(index)
        base = self.files.base_of(index)
        if not self.files.has(base) or (index - base + 1) * RECORD_SIZE > self.files.lengths[base]:
            return None
        raw = self.files.read(base, (index - base) * RECORD_SIZE, RECORD_SIZE)
        return decode_record(index, raw) if len(raw) == RECORD_SIZE else None

    def read_range(self, lo: int, hi: int) -> list[IndexRecord | None]:
        """Records of indexes [lo, hi): one pread per file touched; queued
        records are served from memory."""
        result: list[IndexRecord | None] = []
        in_files = min(hi, max(lo, self._pending_first)) if self._pending else hi
        index = lo
        while index < in_files:
            base = self.files.base_of(index)
            stop = min(in_files, base + self.records_per_file)
            raw = self.files.read(base, (index - base) * RECORD_SIZE, (stop - index) * RECORD_SIZE)
            for i in range(index, stop):
                at = (i - index) * RECORD_SIZE
                ok = at + RECORD_SIZE <= len(raw)
                result.append(decode_record(i, raw, at) if ok else None)
            index = stop
        for i in range(index, hi):
            result.append(self._queued(i) if self._is_queued(i) else None)
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
        base = self.files.base_of(first)
        take = min(len(records), base + self.records_per_file - first)
        at = (first - base) * RECORD_SIZE
        length = self.files.lengths.get(base, 0)
        if at < length:
            raise ValueError(
                f"index record {first} is not the next slot of {self.files.path(base)}")
        # A file that starts below the log's first index (retention, an
        # install, a rebuild) gets "no entry" records up to it.
        pad = bytes(at - length)
        self.files.write(base, length, pad + b"".join(records[:take]) if pad
                         else b"".join(records[:take]))
        return take

    def truncate_after(self, index: int) -> None:
        """Drop every record of an index greater than `index`."""
        if self._pending:
            del self._pending[max(0, index - self._pending_first + 1):]
        self.files.truncate_from(index + 1)

    def delete_before(self, index: int) -> None:
        """Remove files whose every record is below `index`."""
        self.write_pending()
        self.files.delete_below(index)

    def dirty_fds(self) -> list[DirtyFile]:
        self.write_pending()
        return self.files.take_dirty()

    def take_directory_dirty(self) -> bool:
        """Whether an index file was created or removed since the last call."""
        return self.files.take_directory_dirty()

    def sync(self) -> None:
        """The records written so far, and the files' names, durable. The
        directory always (this runs only before a checkpoint is lowered or
        an install finishes, both rare): a checkpoint on the Flusher's
        thread may have taken the directory's flag and not synced it yet."""
        sync_and_close(self.dirty_fds())
        self.files.take_directory_dirty()
        sync_directory(self.directory)

    def close(self, write_pending: bool = True) -> None:
        """Close the files; `write_pending=False` drops queued records (a crash)."""
        if write_pending:
            self.write_pending()
        self._pending = []
        self.files.close()
