"""A directory of files named by the address of their first unit (RocketMQ's MappedFileQueue).

The CommitLog's segments (address = byte position, one byte a unit), its
Raft-index files (address = Raft index from 1, 32-byte records) and each
ConsumeQueue (address = queue offset, 20-byte units) are all such a list:
file k covers addresses [origin + k*span, origin + (k+1)*span) and is named by
its first address in 20 digits. This module owns the names, the open file
descriptors, their lengths in bytes, and what must be synced; what the bytes
mean stays with each user. Every file call goes through `commitlog.fileio` so
the real-node simulator can substitute the file system.
"""

from __future__ import annotations

import os

from commitlog import fileio
from commitlog.disk import (
    DirtyFile,
    atomic_replace,
    open_append,
    read_exact,
    trace_cut,
    write_at_end,
)

NAME_DIGITS = 20


def file_name(base: int) -> str:
    """The on-disk name of the file whose first address is `base`."""
    return f"{base:0{NAME_DIGITS}d}"


def is_file_name(name: str) -> bool:
    """Whether `name` has the shape of a file name (alignment aside)."""
    # ASCII digits only: str.isdigit() also takes "²" (int() refuses it) and
    # "٣" (int() reads it as 3).
    return len(name) == NAME_DIGITS and name.isascii() and name.isdigit()


class FileQueue:
    """The files of one directory, opened at construction.

    `bases` is sorted; `lengths[base]` is a file's length in bytes. Names that
    are neither files of this queue (of the right shape and on a file
    boundary) nor leftovers it knows are listed in `foreign` and left alone:
    recovery reports them.
    """

    def __init__(self, directory: str, span: int, unit_size: int = 1, origin: int = 0) -> None:
        self.directory = directory
        self.span = span  # addresses per file
        self.unit_size = unit_size  # bytes per address
        self.origin = origin  # the first address of the first file
        self.bases: list[int] = []
        self.lengths: dict[int, int] = {}
        self.foreign: list[str] = []
        self._fds: dict[int, int] = {}
        self._paths: dict[int, str] = {}
        self._dirty: set[int] = set()
        self._directory_dirty = False
        fileio.fs.makedirs(directory, exist_ok=True)
        for name in sorted(fileio.fs.listdir(directory)):
            path = os.path.join(directory, name)
            if name.endswith(".durable"):
                continue  # the chaos harness's durability trace
            if name.endswith(".tmp"):
                fileio.fs.remove(path)  # a write-then-rename cut short by a crash
            elif is_file_name(name) and self.is_base(int(name)):
                self._open(int(name))
            else:
                self.foreign.append(path)

    def is_base(self, address: int) -> bool:
        return address >= self.origin and (address - self.origin) % self.span == 0

    def base_of(self, address: int) -> int:
        """The first address of the file that holds `address`."""
        return address - (address - self.origin) % self.span

    def path(self, base: int) -> str:
        path = self._paths.get(base)
        if path is None:  # cached: the append path asks for it on every write
            path = self._paths[base] = os.path.join(self.directory, file_name(base))
        return path

    def has(self, base: int) -> bool:
        return base in self._fds

    def fd(self, base: int) -> int:
        return self._fds[base]

    def _open(self, base: int) -> int:
        fd = self._fds[base] = open_append(self.path(base))
        self.lengths[base] = fileio.fs.size(fd)
        self.bases.append(base)
        self.bases.sort()
        return fd

    def create(self, base: int) -> int:
        """Open (creating) the file at `base` if it is not open; its fd."""
        fd = self._fds.get(base)
        if fd is None:
            fd = self._open(base)
            self._directory_dirty = True
        return fd

    def write(self, base: int, at: int, data: bytes | memoryview) -> None:
        """Write `data` at byte `at` of the file at `base` (created if need be).
        On a full disk nothing of `data` stays (see `disk.write_at_end`)."""
        fd = self.create(base)
        write_at_end(fd, at, data, self.path(base))
        self.lengths[base] = max(self.lengths[base], at + len(data))
        self._dirty.add(base)

    def read(self, base: int, at: int, length: int) -> bytes:
        """Up to `length` bytes from byte `at` of the file at `base` (b"" if none)."""
        fd = self._fds.get(base)
        if fd is None:
            return b""
        return read_exact(fd, at, length)

    def cut(self, base: int, keep: int) -> None:
        """Shorten the file at `base` to `keep` bytes (if it is longer)."""
        if self.lengths[base] > keep:
            fileio.fs.ftruncate(self._fds[base], keep)
            trace_cut(self.path(base), keep)
            self.lengths[base] = keep
            self._dirty.add(base)

    def install(self, base: int, data: bytes) -> None:
        """Durably make `data` the whole file at `base`: written under a
        temporary name, fsynced, renamed over any file there, the directory
        fsynced (`disk.atomic_replace`). A crash leaves the old file or all of
        the new one, never a torn mix."""
        fd = self._fds.pop(base, None)
        if fd is not None:
            fileio.fs.close(fd)
            del self.lengths[base]
            self.bases.remove(base)
            self._dirty.discard(base)
        atomic_replace(self.path(base), data)
        self._open(base)

    def remove(self, base: int) -> None:
        fileio.fs.close(self._fds.pop(base))
        del self.lengths[base]
        self.bases.remove(base)
        self._dirty.discard(base)
        fileio.fs.remove(self.path(base))
        trace_cut(self.path(base), None)
        self._directory_dirty = True

    def truncate_from(self, address: int) -> None:
        """Drop every unit at or after `address`: later files go, the file
        holding it is cut."""
        for base in reversed(list(self.bases)):
            if base >= address:
                self.remove(base)
            else:
                self.cut(base, (address - base) * self.unit_size)
                break

    def delete_below(self, address: int, keep_last: bool = False) -> list[int]:
        """Remove the files whose every address is below `address` (with
        `keep_last`, never the last file); the bases removed."""
        candidates = self.bases[:-1] if keep_last else self.bases
        removed = [base for base in candidates if base + self.span <= address]
        for base in removed:
            self.remove(base)
        return removed

    def distrust_from(self, address: int) -> None:
        """Have the next sync include every file holding `address` or later,
        and the directory: found on disk, not vouched for, their bytes and
        names may be in the page cache only (written by a process that died
        before syncing them; a crash without power loss keeps them)."""
        for base in self.bases:
            if base + self.span > address:
                self._dirty.add(base)
        self._directory_dirty = True

    def take_dirty(self) -> list[DirtyFile]:
        """Files written since the last call (duplicated fd, path, length).
        The caller syncs and closes them; dup() keeps a concurrent truncate
        from closing an fd under a syncing thread."""
        files = [(fileio.fs.dup(self._fds[b]), self.path(b), self.lengths[b])
                 for b in self._dirty if b in self._fds]
        self._dirty.clear()
        return files

    def take_directory_dirty(self) -> bool:
        """Whether a file was created or removed since the last call."""
        dirty, self._directory_dirty = self._directory_dirty, False
        return dirty

    def close(self) -> None:
        for fd in self._fds.values():
            fileio.fs.close(fd)
        self._fds.clear()
        self.bases.clear()
        self.lengths.clear()
