"""File primitives: full writes that roll back on a full disk, syncs, atomic replace.

Every fsync of the storage engine goes through `sync_fd` so there is one place
that knows what is durable.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import mmap
import os
import struct

from commitlog.errors import DiskFullError, LockedError

_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def open_append(path: str) -> int:
    """Open (creating) a file for reading and writing; the caller tracks its length."""
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)


def write_at_end(fd: int, length: int, data: bytes | memoryview, path: str) -> None:
    """Write all of `data` at byte `length` of the file.

    On a full disk the file is cut back to `length` and DiskFullError is
    raised, so a failed append leaves nothing half-written behind.
    """
    done = 0
    try:
        done = os.pwrite(fd, data, length)
        if done == len(data):
            return  # the common case: one call wrote everything
        view = memoryview(data)
        while done < len(view):
            done += os.pwrite(fd, view[done:], length + done)
    except OSError as exc:
        if done or exc.errno in _DISK_FULL_ERRNOS:
            # If even this fails, the next open's recovery cuts the rest by CRC.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, length)
        if exc.errno in _DISK_FULL_ERRNOS:
            raise DiskFullError(f"disk full while writing {path}: {exc.strerror}") from exc
        raise


def read_exact(fd: int, offset: int, length: int) -> bytes:
    """pread that returns fewer bytes only at end of file."""
    chunks = []
    while length > 0:
        chunk = os.pread(fd, length, offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
        length -= len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def sync_fd(fd: int) -> None:
    """Make a file's data durable (fdatasync also covers a grown file size)."""
    os.fdatasync(fd)


# Durability trace for the chaos harness's power-loss fault: when enabled,
# every real fsync records how many bytes of the file it made durable in
# `<file>.durable`, and the nemesis cuts each file back to that length to drop
# exactly what a power cut would. Off in production (one small write per sync).
TRACE_ENV = "LEDGERMQ_DURABILITY_TRACE"
_trace = os.environ.get(TRACE_ENV, "") not in ("", "0")


def set_durability_trace(enabled: bool) -> None:
    global _trace
    _trace = enabled


def record_durable(path: str, length: int) -> None:
    """Write `<path>.durable` = the file's fsynced length (tracing only)."""
    fd = os.open(path + ".durable", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, f"{length}\n".encode())
    finally:
        os.close(fd)


# A file to sync: a duplicated fd (owned by whoever syncs it), its path, and
# its length when the sync was requested (what the sync makes durable).
DirtyFile = tuple[int, str, int]


def sync_files(files: list[DirtyFile]) -> None:
    """fdatasync every file (the fds stay open: see `close_files`)."""
    for fd, path, length in files:
        sync_fd(fd)
        if _trace:
            record_durable(path, length)


def close_files(files: list[DirtyFile]) -> None:
    for fd, _path, _length in files:
        with contextlib.suppress(OSError):  # a dup of ours: nothing to report
            os.close(fd)


def sync_and_close(files: list[DirtyFile]) -> None:
    """fdatasync every file, then close all the fds, also when a sync fails."""
    try:
        sync_files(files)
    finally:
        close_files(files)


def sync_directory(path: str) -> None:
    """Make created, renamed or removed directory entries durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_replace(path: str, data: bytes) -> None:
    """Durably replace `path` with `data`: write a .tmp, fsync, rename, fsync dir."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        write_at_end(fd, 0, data, tmp)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    sync_directory(os.path.dirname(path) or ".")
    if _trace:
        record_durable(path, len(data))


def read_small_file(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def lock_directory(path: str) -> int:
    """Hold an exclusive advisory lock on `<path>/LOCK` for the process lifetime."""
    fd = os.open(os.path.join(path, "LOCK"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        os.close(fd)
        raise LockedError(f"data directory {path} is in use by another process") from exc
    return fd


# ------------------------------------------------------------------ io_uring
# fdatasync without a thread: the event loop submits IORING_OP_FSYNC requests,
# the kernel's io-wq workers run them, and completions are read from the ring
# in shared memory. A Python fsync thread needs the GIL to report back and
# starves while the loop is busy appending (CPython 3.11 hands the GIL back to
# the thread that released it for a pwrite); the ring has no such hand-off.

_NR_IO_URING_SETUP = 425  # the same number on every Linux architecture
_NR_IO_URING_ENTER = 426
_OFF_SQ_RING, _OFF_CQ_RING, _OFF_SQES = 0, 0x8000000, 0x10000000
_FEAT_SINGLE_MMAP = 1
_OP_FSYNC = 3
_FSYNC_DATASYNC = 1
_IOSQE_ASYNC = 1 << 4  # fsync always blocks: go straight to a worker
_SQE = struct.Struct("<BBHiQQIIQ24x")
_CQE = struct.Struct("<QiI")


class Uring:
    """A small io_uring used for fsync only. Not thread-safe (the loop's).

    `submit` queues fsyncs (user_data tags them); `pending()` says whether a
    completion is waiting (a memory read, no syscall); `reap` returns
    (user_data, result) pairs, result < 0 being -errno. `fd` is pollable:
    readable while completions wait.
    """

    def __init__(self, entries: int = 64) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._syscall = libc.syscall
        self._syscall.restype = ctypes.c_long
        params = ctypes.create_string_buffer(120)
        fd = self._syscall(ctypes.c_long(_NR_IO_URING_SETUP), ctypes.c_long(entries), params)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"io_uring_setup: {os.strerror(err)}")
        self.fd = int(fd)
        self._maps: list[mmap.mmap] = []
        try:
            raw = params.raw
            sq_entries, cq_entries = struct.unpack_from("<2I", raw, 0)
            features = struct.unpack_from("<I", raw, 20)[0]
            sq_off = struct.unpack_from("<7I", raw, 40)  # head tail mask entries flags drop array
            cq_off = struct.unpack_from("<6I", raw, 80)  # head tail mask entries overflow cqes
            sq_size = sq_off[6] + sq_entries * 4
            cq_size = cq_off[5] + cq_entries * _CQE.size
            if features & _FEAT_SINGLE_MMAP:
                sq_size = cq_size = max(sq_size, cq_size)
            sq = self._map(sq_size, _OFF_SQ_RING)
            cq = sq if features & _FEAT_SINGLE_MMAP else self._map(cq_size, _OFF_CQ_RING)
            self._sqes = self._map(sq_entries * _SQE.size, _OFF_SQES)
        except BaseException:
            self.close()
            raise
        self._sq, self._cq = sq, cq
        self._sq_words = memoryview(sq).cast("I")
        self._cq_words = memoryview(cq).cast("I")
        self._sq_head, self._sq_tail = sq_off[0] // 4, sq_off[1] // 4
        self._sq_mask = self._sq_words[sq_off[2] // 4]
        self._sq_array = sq_off[6] // 4
        self._sq_entries = sq_entries
        self._cq_head, self._cq_tail = cq_off[0] // 4, cq_off[1] // 4
        self._cq_mask = self._cq_words[cq_off[2] // 4]
        self._cqes = cq_off[5]

    def _map(self, size: int, offset: int) -> mmap.mmap:
        mapped = mmap.mmap(self.fd, size, mmap.MAP_SHARED | mmap.MAP_POPULATE,
                           mmap.PROT_READ | mmap.PROT_WRITE, offset=offset)
        self._maps.append(mapped)
        return mapped

    def submit(self, fsyncs: list[tuple[int, bool]], user_data: int) -> None:
        """Queue fsyncs of (fd, data_only) and hand them to the kernel."""
        words = self._sq_words
        tail = words[self._sq_tail]
        if len(fsyncs) > self._sq_entries - ((tail - words[self._sq_head]) & 0xFFFFFFFF):
            raise OSError(errno.EBUSY, "io_uring submission queue full")
        for fd, data_only in fsyncs:
            slot = tail & self._sq_mask
            _SQE.pack_into(self._sqes, slot * _SQE.size, _OP_FSYNC, _IOSQE_ASYNC, 0, fd, 0, 0, 0,
                           _FSYNC_DATASYNC if data_only else 0, user_data)
            words[self._sq_array + slot] = slot
            tail = (tail + 1) & 0xFFFFFFFF
        words[self._sq_tail] = tail  # x86/arm64 stores are not reordered before this one
        left = len(fsyncs)
        while left:
            done = self._syscall(ctypes.c_long(_NR_IO_URING_ENTER), ctypes.c_long(self.fd),
                                 ctypes.c_long(left), ctypes.c_long(0), ctypes.c_long(0),
                                 None, ctypes.c_long(0))
            if done < 0:
                err = ctypes.get_errno()
                if err == errno.EINTR:
                    continue
                raise OSError(err, f"io_uring_enter: {os.strerror(err)}")
            left -= done

    def pending(self) -> bool:
        words = self._cq_words
        return words[self._cq_tail] != words[self._cq_head]

    def reap(self) -> list[tuple[int, int]]:
        words = self._cq_words
        head, tail = words[self._cq_head], words[self._cq_tail]
        done = []
        while head != tail:
            user_data, result, _flags = _CQE.unpack_from(
                self._cq, self._cqes + (head & self._cq_mask) * _CQE.size)
            done.append((user_data, result))
            head = (head + 1) & 0xFFFFFFFF
        words[self._cq_head] = head
        return done

    def close(self) -> None:
        for view in ("_sq_words", "_cq_words"):
            if hasattr(self, view):
                getattr(self, view).release()
        for mapped in self._maps:
            mapped.close()
        self._maps = []
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def record_synced(files: list[DirtyFile]) -> None:
    """The durability trace of files synced other than by `sync_files`."""
    if _trace:
        for _fd, path, length in files:
            record_durable(path, length)
