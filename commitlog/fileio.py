"""The file-system seam: every file call of `commitlog/` and `consumequeue/`.

Production uses `OsFileSystem` (plain `os` calls, nothing added). The
real-node simulator (`dledger/testing/nodesim`) installs an in-memory file
system with crash and fault semantics through `use(fs)`, and runs the very
same storage code on it.

Callers write `fileio.fs.pwrite(...)` instead of `os.pwrite(...)`: one
attribute lookup more per call. `OsFileSystem` binds the `os` functions as
instance attributes, so no Python frame is added on the production path.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Iterator
from typing import Protocol


class FileSystem(Protocol):
    """The operations the storage engine uses; `os` semantics and errors
    (OSError with an errno, BlockingIOError for a held lock)."""

    def open(self, path: str, flags: int, mode: int = 0o777) -> int: ...

    def close(self, fd: int) -> None: ...

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int: ...

    def pread(self, fd: int, length: int, offset: int) -> bytes: ...

    def write(self, fd: int, data: bytes) -> int: ...

    def ftruncate(self, fd: int, length: int) -> None: ...

    def fsync(self, fd: int) -> None: ...

    def fdatasync(self, fd: int) -> None: ...

    def dup(self, fd: int) -> int: ...

    def drop_cache(self, fd: int, offset: int, length: int) -> None:
        """Drop the file's clean cached pages wholly inside [offset,
        offset+length) (POSIX_FADV_DONTNEED): advice, never a loss of data."""

    def size(self, fd: int) -> int: ...

    def replace(self, src: str, dst: str) -> None:
        """Rename within one directory (the engine's only use): atomic, also
        across a crash. Across directories see `disk.move_across`."""

    def link(self, src: str, dst: str) -> None:
        """A second name for `src`'s file; FileExistsError if `dst` exists."""

    def remove(self, path: str) -> None: ...

    def listdir(self, path: str) -> list[str]: ...

    def makedirs(self, path: str, exist_ok: bool = False) -> None: ...

    def isdir(self, path: str) -> bool: ...

    def rmtree(self, path: str) -> None: ...

    def lock(self, fd: int) -> None: ...

    def read_file(self, path: str) -> bytes | None: ...


def _size(fd: int) -> int:
    return os.fstat(fd).st_size


def _drop_cache(fd: int, offset: int, length: int) -> None:
    os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


def _lock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _makedirs(path: str, exist_ok: bool = False) -> None:
    # os.makedirs takes `mode` second: a wrapper keeps the seam's signature
    # (and directories are made rarely, so the frame costs nothing).
    os.makedirs(path, exist_ok=exist_ok)


def _rmtree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _mtime_ms(path: str) -> int:
    return os.stat(path).st_mtime_ns // 1_000_000


def _read_file(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


class OsFileSystem:
    """The real file system: the `os` functions themselves (thread-safe as
    they are). Bound in `__init__` so a call is one instance-dict lookup."""

    def __init__(self) -> None:
        self.open = os.open
        self.close = os.close
        self.pwrite = os.pwrite
        self.pread = os.pread
        self.write = os.write
        self.ftruncate = os.ftruncate
        self.fsync = os.fsync
        self.fdatasync = os.fdatasync
        self.dup = os.dup
        self.drop_cache = _drop_cache
        self.size = _size
        self.replace = os.replace
        self.link = os.link
        self.remove = os.remove
        self.listdir = os.listdir
        self.makedirs = _makedirs
        self.isdir = os.path.isdir
        self.rmtree = _rmtree
        self.lock = _lock
        self.read_file = _read_file
        self.mtime_ms = _mtime_ms


OS: FileSystem = OsFileSystem()

# The backend every storage call goes through. Swapped only by `use`.
fs: FileSystem = OS


def mtime_ms(path: str) -> int:
    """When `path` was last modified, in ms since the epoch; 0 when the
    backend keeps no times. Optional for a backend (not in `FileSystem`): one
    that has a `mtime_ms(path)` method (the simulator's, on its own clock)
    answers it."""
    getter = getattr(fs, "mtime_ms", None)
    return 0 if getter is None else int(getter(path))


@contextlib.contextmanager
def use(backend: FileSystem) -> Iterator[FileSystem]:
    """Route every storage file call through `backend` inside the block.

    Process-wide (the simulator runs every simulated node in one thread);
    not for production, where the default never changes.
    """
    global fs
    previous, fs = fs, backend
    try:
        yield backend
    finally:
        fs = previous
