"""Segment files of the CommitLog address space.

Segment k covers positions [k*S, (k+1)*S) and is named by k*S in 20 digits
(the naming and the file list are `commitlog.file_queue`'s). Files are not
preallocated: a file's length is what was written to it. This module knows
bytes and positions only; entries are `commitlog.entry`'s job.
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass

from commitlog import fileio
from commitlog.disk import PAGE_SIZE, CachedRange, DirtyFile, sync_directory
from commitlog.errors import ConfigError, PositionMismatchError
from commitlog.file_queue import FileQueue, is_file_name


@dataclass(frozen=True)
class SegmentInfo:
    """One segment as retention sees it."""

    base: int  # start position (the file's name)
    length: int  # bytes in the file
    first_index: int  # Raft index of its first entry
    mtime_ms: int  # last modification (0 when the file system keeps no times)


class SegmentFiles:
    """All segments of one CommitLog; writes go to the last one only."""

    def __init__(self, directory: str, segment_size: int) -> None:
        self.directory = directory
        self.segment_size = segment_size
        self.files = FileQueue(directory, segment_size)
        self.bases = self.files.bases  # sorted; the same list, kept current
        self.lengths = self.files.lengths
        self.foreign = self.files.foreign
        try:
            self._check_size(segment_size)
        except ConfigError:
            self.files.close()
            raise

    def _check_size(self, segment_size: int) -> None:
        """A segment named off the grid, or longer than a segment, means the
        group's segment size changed: refuse rather than misread positions."""
        for path in self.foreign:
            if is_file_name(os.path.basename(path)):
                raise ConfigError(
                    f"segment {path} does not start at a multiple of segment_size_bytes="
                    f"{segment_size}: the group's segment size must not change"
                )
        for base in self.bases:
            if self.lengths[base] > segment_size:
                raise ConfigError(
                    f"segment {self.path(base)} holds {self.lengths[base]} bytes, more than "
                    f"segment_size_bytes={segment_size}: the group's segment size must not change"
                )

    def path(self, base: int) -> str:
        return self.files.path(base)

    def base_of(self, position: int) -> int:
        return position // self.segment_size * self.segment_size

    def write(self, position: int, data: bytes) -> None:
        """Write `data` at `position`, which must be the end of the last segment
        or the start of a new segment after it."""
        base = position - position % self.segment_size
        bases = self.bases
        rolled = not bases or base > bases[-1]
        if not rolled and base != bases[-1]:
            raise PositionMismatchError(f"write at {position} is before the last segment")
        length = 0 if rolled else self.lengths[base]
        if position - base != length:
            raise PositionMismatchError(
                f"write at {position} but segment {self.path(base)} ends at {base + length}")
        if length + len(data) > self.segment_size:
            raise PositionMismatchError(
                f"write of {len(data)} bytes at {position} overruns segment {self.path(base)}")
        try:
            self.files.write(base, length, data)
        except BaseException:
            if length == 0 and len(bases) > 1 and bases[-1] == base:
                self.files.remove(base)  # do not leave an empty segment for a failed roll
            raise

    def read(self, position: int, length: int) -> bytes:
        """Bytes [position, position+length) of one segment (short at its end)."""
        base = self.base_of(position)
        if not self.files.has(base):
            return b""
        available = self.lengths[base] - (position - base)
        if available <= 0:
            return b""
        return self.files.read(base, position - base, min(length, available))

    def truncate(self, end: int) -> None:
        """Drop every byte at or after position `end`."""
        self.files.truncate_from(end)

    def delete_before(self, position: int) -> list[int]:
        """Remove segments wholly before `position`, never the last one."""
        return self.files.delete_below(position, keep_last=True)

    def take_dirty(self) -> tuple[list[DirtyFile], bool]:
        """Segments written since the last call (duplicated fd, path, length),
        and whether the directory changed. The caller syncs and closes them."""
        return self.files.take_dirty(), self.files.take_directory_dirty()

    def cached_ranges(self, start: int, stop: int) -> list[CachedRange]:
        """The bytes of positions [start, stop) in each open segment, as
        (duplicated fd, offset, length) for `disk.drop_cached`. Each range
        starts on a page boundary of its file, so a page a previous range cut
        through is dropped this time (the kernel drops only whole pages)."""
        ranges = []
        for base in self.bases[bisect.bisect_left(self.bases, self.base_of(start)):]:
            if base >= stop:
                break
            first = max(start, base) - base
            first -= first % PAGE_SIZE
            last = min(stop, base + self.lengths[base]) - base
            if last > first:
                ranges.append((fileio.fs.dup(self.files.fd(base)), first, last - first))
        return ranges

    def sync_directory(self) -> None:
        sync_directory(self.directory)

    def close(self) -> None:
        self.files.close()
