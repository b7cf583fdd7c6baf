"""Segment files of the CommitLog address space.

Segment k covers positions [k*S, (k+1)*S) and is named by k*S in 20 digits.
Files are not preallocated: a file's length is what was written to it. This
module knows bytes and positions only; entries are `commitlog.entry`'s job.
"""

from __future__ import annotations

import os

from commitlog import fileio
from commitlog.disk import (
    DirtyFile,
    open_append,
    read_exact,
    sync_directory,
    trace_cut,
    write_at_end,
)
from commitlog.errors import ConfigError, PositionMismatchError

NAME_DIGITS = 20


class SegmentFiles:
    """All segments of one CommitLog; writes go to the last one only."""

    def __init__(self, directory: str, segment_size: int) -> None:
        self.directory = directory
        self.segment_size = segment_size
        fileio.fs.makedirs(directory, exist_ok=True)
        self.bases: list[int] = []  # sorted
        self._fds: dict[int, int] = {}
        self.lengths: dict[int, int] = {}
        self._dirty: set[int] = set()
        self._directory_dirty = False
        self.foreign: list[str] = []
        self._paths: dict[int, str] = {}
        for name in sorted(fileio.fs.listdir(directory)):
            path = os.path.join(directory, name)
            if name.endswith(".durable"):
                continue  # the chaos harness's durability trace
            if name.endswith(".tmp"):
                fileio.fs.remove(path)
                continue
            if not (len(name) == NAME_DIGITS and name.isdigit()):
                self.foreign.append(path)
                continue
            base = int(name)
            if base % segment_size:
                raise ConfigError(
                    f"segment {path} does not start at a multiple of segment_size_bytes="
                    f"{segment_size}: the group's segment size must not change"
                )
            fd = open_append(path)
            length = fileio.fs.size(fd)
            if length > segment_size:
                fileio.fs.close(fd)
                raise ConfigError(
                    f"segment {path} holds {length} bytes, more than segment_size_bytes="
                    f"{segment_size}: the group's segment size must not change"
                )
            self.bases.append(base)
            self._fds[base] = fd
            self.lengths[base] = length

    def path(self, base: int) -> str:
        path = self._paths.get(base)
        if path is None:
            path = self._paths[base] = os.path.join(self.directory, f"{base:0{NAME_DIGITS}d}")
        return path

    def base_of(self, position: int) -> int:
        return position // self.segment_size * self.segment_size

    def write(self, position: int, data: bytes) -> None:
        """Write `data` at `position`, which must be the end of the last segment
        or the start of a new segment after it."""
        base = position - position % self.segment_size
        bases = self.bases
        if not bases or base > bases[-1]:
            self._fds[base] = open_append(self.path(base))  # also caches the path
            self.lengths[base] = 0
            bases.append(base)
            self._directory_dirty = True
        elif base != bases[-1]:
            raise PositionMismatchError(f"write at {position} is before the last segment")
        length = self.lengths[base]
        if position - base != length:
            raise PositionMismatchError(
                f"write at {position} but segment {self.path(base)} ends at {base + length}")
        if length + len(data) > self.segment_size:
            raise PositionMismatchError(
                f"write of {len(data)} bytes at {position} overruns segment {self.path(base)}")
        try:
            write_at_end(self._fds[base], length, data, self._paths.get(base) or "")
        except BaseException:
            if length == 0 and base == bases[-1] and len(bases) > 1:
                self._remove(base)  # do not leave an empty segment for a failed roll
            raise
        self.lengths[base] = length + len(data)
        self._dirty.add(base)

    def read(self, position: int, length: int) -> bytes:
        """Bytes [position, position+length) of one segment (short at its end)."""
        base = self.base_of(position)
        fd = self._fds.get(base)
        if fd is None:
            return b""
        available = self.lengths[base] - (position - base)
        if available <= 0:
            return b""
        return read_exact(fd, position - base, min(length, available))

    def truncate(self, end: int) -> None:
        """Drop every byte at or after position `end`."""
        for base in reversed(list(self.bases)):
            if base >= end:
                self._remove(base)
            elif base + self.lengths[base] > end:
                fileio.fs.ftruncate(self._fds[base], end - base)
                trace_cut(self.path(base), end - base)
                self.lengths[base] = end - base
                self._dirty.add(base)

    def delete_before(self, position: int) -> list[int]:
        """Remove segments wholly before `position`, never the last one."""
        removed = []
        for base in list(self.bases[:-1]):
            if base + self.segment_size <= position:
                self._remove(base)
                removed.append(base)
        return removed

    def _remove(self, base: int) -> None:
        fileio.fs.close(self._fds.pop(base))
        del self.lengths[base]
        self.bases.remove(base)
        self._dirty.discard(base)
        fileio.fs.remove(self.path(base))
        trace_cut(self.path(base), None)
        self._directory_dirty = True

    def take_dirty(self) -> tuple[list[DirtyFile], bool]:
        """Segments written since the last call (duplicated fd, path, length),
        and whether the directory changed. The caller syncs and closes them;
        dup() keeps a concurrent truncate from closing an fd under a syncing
        thread."""
        fds = [(fileio.fs.dup(self._fds[b]), self.path(b), self.lengths[b])
               for b in self._dirty if b in self._fds]
        self._dirty.clear()
        directory_dirty, self._directory_dirty = self._directory_dirty, False
        return fds, directory_dirty

    def sync_directory(self) -> None:
        sync_directory(self.directory)

    def close(self) -> None:
        for fd in self._fds.values():
            fileio.fs.close(fd)
        self._fds.clear()
