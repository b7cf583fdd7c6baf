"""File primitives: full writes that roll back on a full disk, syncs, atomic replace.

Every fsync of the storage engine goes through `sync_fd` so there is one place
that knows what is durable.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import threading

from commitlog import fileio
from commitlog.errors import DiskFullError, LockedError

_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def open_append(path: str) -> int:
    """Open (creating) a file for reading and writing; the caller tracks its length."""
    return fileio.fs.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)


def write_at_end(fd: int, length: int, data: bytes | memoryview, path: str) -> None:
    """Write all of `data` at byte `length` of the file.

    On a full disk the file is cut back to `length` and DiskFullError is
    raised, so a failed append leaves nothing half-written behind.
    """
    done = 0
    try:
        done = fileio.fs.pwrite(fd, data, length)
        if done == len(data):
            return  # the common case: one call wrote everything
        view = memoryview(data)
        while done < len(view):
            done += fileio.fs.pwrite(fd, view[done:], length + done)
    except OSError as exc:
        if done or exc.errno in _DISK_FULL_ERRNOS:
            # If even this fails, the next open's recovery cuts the rest by CRC.
            with contextlib.suppress(OSError):
                fileio.fs.ftruncate(fd, length)
        if exc.errno in _DISK_FULL_ERRNOS:
            raise DiskFullError(f"disk full while writing {path}: {exc.strerror}") from exc
        raise


def read_exact(fd: int, offset: int, length: int) -> bytes:
    """pread that returns fewer bytes only at end of file."""
    chunks = []
    while length > 0:
        chunk = fileio.fs.pread(fd, length, offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
        length -= len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def sync_fd(fd: int) -> None:
    """Make a file's data durable (fdatasync also covers a grown file size)."""
    fileio.fs.fdatasync(fd)


# Durability trace for the chaos harness's power-loss fault: when enabled,
# every real fsync records how many bytes of the file it made durable in
# `<file>.durable`, and the nemesis cuts each file back to that length to drop
# exactly what a power cut would. Off in production (one small write per sync).
TRACE_ENV = "LEDGERMQ_DURABILITY_TRACE"
TRACE_SUFFIX = ".durable"
_trace = os.environ.get(TRACE_ENV, "") not in ("", "0")


class TraceError(ValueError):
    """A durability trace that cannot be read as one whole length."""


def set_durability_trace(enabled: bool) -> None:
    global _trace
    _trace = enabled


def record_durable(path: str, length: int) -> None:
    """Replace `<path>.durable` with the file's fsynced length (tracing only).

    Write-then-rename: the trace is a whole earlier value or a whole new one,
    whenever the process is killed. Truncating it in place would leave it
    empty between the open and the write, and an empty trace would say no
    byte of the file is durable. The temporary name is per thread so that two
    threads tracing the same file never write into one temporary. No fsync:
    the harness kills processes, not the kernel, and reads the trace from the
    same page cache.
    """
    trace = path + TRACE_SUFFIX
    tmp = f"{trace}.{threading.get_native_id()}.tmp"
    fd = fileio.fs.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        fileio.fs.write(fd, f"{length}\n".encode())
    finally:
        fileio.fs.close(fd)
    fileio.fs.replace(tmp, trace)


def trace_cut(path: str, length: int | None) -> None:
    """Tracing only: `path` was cut to `length` bytes (None: removed).

    The trace must never claim more than the file now holds of what was
    fsynced: after a cut, bytes written later at the same offsets are not
    durable, and a removed file's trace must not pass on to a new file of the
    same name (a segment re-created at the same base). Lower it (or drop it).
    """
    if not _trace:
        return
    trace = path + TRACE_SUFFIX
    if length is None:
        with contextlib.suppress(FileNotFoundError):
            fileio.fs.remove(trace)
        return
    recorded = read_durable(path)
    if recorded is not None and recorded > length:
        record_durable(path, length)


def trace_durable(path: str, length: int) -> None:
    """Tracing only: `path` holds `length` fsynced bytes (a file renamed into place)."""
    if _trace:
        record_durable(path, length)


def is_trace_file(name: str) -> bool:
    """A trace or a trace's temporary (left behind by a kill before its rename)."""
    return name.endswith(TRACE_SUFFIX) or (TRACE_SUFFIX + "." in name and name.endswith(".tmp"))


def read_durable(path: str) -> int | None:
    """The fsynced length `<path>.durable` records; None when the file has no trace.

    Raises TraceError unless the trace is exactly one decimal length and a
    newline: a torn or damaged trace is a harness failure, never "0 durable".
    """
    try:
        with open(path + TRACE_SUFFIX, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise TraceError(f"durability trace {path}{TRACE_SUFFIX} unreadable: {exc}") from exc
    text = raw[:-1] if raw.endswith(b"\n") else b""
    if not text.isdigit():
        raise TraceError(f"durability trace {path}{TRACE_SUFFIX} is torn or damaged: {raw[:40]!r}")
    return int(text)


# A file to sync: a duplicated fd (owned by whoever syncs it), its path, and
# its length when the sync was requested (what the sync makes durable).
DirtyFile = tuple[int, str, int]


def sync_and_close(files: list[DirtyFile]) -> None:
    """fdatasync every file, then close all the fds, also when a sync fails."""
    try:
        for fd, path, length in files:
            sync_fd(fd)
            if _trace:
                record_durable(path, length)
    finally:
        for fd, _path, _length in files:
            fileio.fs.close(fd)


# Bytes of a file to drop from the page cache: a duplicated fd (owned by
# whoever drops them), the offset and the length.
CachedRange = tuple[int, int, int]
PAGE_SIZE = 4096


def drop_cached(ranges: list[CachedRange], *, drop: bool = True) -> None:
    """Drop these synced ranges from the page cache (unless `drop` is
    False), then close the fds. Advice only: a refusal (a file system
    without it) changes nothing but the cache, so it is ignored."""
    try:
        for fd, offset, length in ranges if drop else ():
            with contextlib.suppress(OSError):
                fileio.fs.drop_cache(fd, offset, length)
    finally:
        for fd, _offset, _length in ranges:
            fileio.fs.close(fd)


def sync_directory(path: str) -> None:
    """Make created, renamed or removed directory entries durable."""
    fd = fileio.fs.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fileio.fs.fsync(fd)
    finally:
        fileio.fs.close(fd)


def link_over(source: str, target: str) -> None:
    """Give `source`'s file the name `target`, replacing a file of that name."""
    with contextlib.suppress(FileNotFoundError):
        fileio.fs.remove(target)
    fileio.fs.link(source, target)


def move_across(source: str, target: str) -> None:
    """Move a file into another directory of the same file system so that a
    power cut at any moment leaves it under one name or both, never none:
    linked as `target` (over what has that name), the target's directory
    fsynced, then unlinked from `source` and its directory fsynced.

    A rename across directories is one journaled operation on ext4 and xfs
    with their journals, but only there: without a journal (this project's
    VM runs ext4 so) the two directories are written back on their own,
    and a cut can keep the source's removal without the target's entry
    (the real-node simulator, seed 7000190 on 5 nodes: a snapshot install's
    segment lost both names)."""
    link_over(source, target)
    sync_directory(os.path.dirname(target) or ".")
    fileio.fs.remove(source)
    sync_directory(os.path.dirname(source) or ".")


_tmp_names = itertools.count()


def atomic_replace(path: str, data: bytes) -> None:
    """Durably replace `path` with `data`: write a temporary file, fsync,
    rename, fsync the directory.

    Every call uses its own temporary name (`<path>.<pid>.<n>.tmp`): two
    writers of one file (say a thread and the loop) can never rename each
    other's half-written file, or find theirs gone.
    """
    tmp = f"{path}.{os.getpid()}.{next(_tmp_names)}.tmp"
    fd = fileio.fs.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        try:
            write_at_end(fd, 0, data, tmp)
            fileio.fs.fsync(fd)
        finally:
            fileio.fs.close(fd)
        if _trace:
            # Tracing: before the rename, the trace must cover the new file
            # whole. Recorded only after it, a kill in between would leave the
            # new file with the old, shorter trace, and a power cut would cut
            # it to that length and tear it: a state no disk produces (a
            # renamed file is there whole or not at all). A longer old trace
            # is kept until the rename is done.
            recorded = read_durable(path)
            if recorded is None or recorded < len(data):
                record_durable(path, len(data))
        fileio.fs.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            fileio.fs.remove(tmp)
        raise
    sync_directory(os.path.dirname(path) or ".")
    if _trace:
        record_durable(path, len(data))


def read_small_file(path: str) -> bytes | None:
    return fileio.fs.read_file(path)


def lock_directory(path: str) -> int:
    """Hold an exclusive advisory lock on `<path>/LOCK` for the process lifetime."""
    fd = fileio.fs.open(os.path.join(path, "LOCK"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fileio.fs.lock(fd)
    except BlockingIOError as exc:
        fileio.fs.close(fd)
        raise LockedError(f"data directory {path} is in use by another process") from exc
    return fd
