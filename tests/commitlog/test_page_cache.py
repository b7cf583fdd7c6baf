"""The CommitLog's cached tail (`page_cache_tail_bytes`) on real files: what
its syncs drop from the page cache, read back with mincore(2), and on the
simulator's file system, which refuses to drop unsynced bytes."""

from __future__ import annotations

import ctypes
import os
import random

import pytest
from support import require

from commitlog import KIND_MESSAGES, CommitLog, CommitLogConfig, fileio
from commitlog.config import MIB
from commitlog.errors import ConfigError
from dledger.testing.nodesim.simfs import SimFileSystem

PAGE = os.sysconf("SC_PAGE_SIZE")
SEGMENT = 1 * MIB
TAIL = 256 * 1024
BODY = 1000

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)


def resident_pages(path: str) -> list[bool]:
    """Which pages of the file are in the page cache (mincore on a mapping
    that touches none of them)."""
    size = os.path.getsize(path)
    if size == 0:
        return []
    fd = os.open(path, os.O_RDONLY)
    try:
        address = _libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        if address in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        try:
            pages = (size + PAGE - 1) // PAGE
            vector = (ctypes.c_ubyte * pages)()
            if _libc.mincore(address, size, vector) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
            return [bool(v & 1) for v in vector]
        finally:
            _libc.munmap(address, size)
    finally:
        os.close(fd)


def cached_positions(log: CommitLog) -> list[int]:
    """The log positions of the first byte of every cached page."""
    out = []
    for base in log.segments.bases:
        flags = resident_pages(log.segments.path(base))
        out.extend(base + k * PAGE for k, cached in enumerate(flags) if cached)
    return out


def whole_pages(log: CommitLog, start: int, stop: int) -> list[int]:
    """Positions of the pages wholly inside [start, stop) and inside a file."""
    out = []
    for position in range(start - start % PAGE + PAGE, stop - PAGE, PAGE):
        base = position - position % SEGMENT
        if position + PAGE <= base + log.segments.lengths.get(base, 0):
            out.append(position)
    return out


def append(log: CommitLog, megabytes: float, flush_every: int = 64) -> None:
    rng = random.Random(len(log.segments.bases))
    for n in range(int(megabytes * MIB / BODY)):
        log.append_new([(1, [(KIND_MESSAGES, rng.randbytes(BODY))])])
        if n % flush_every == 0:
            log.flush()
    log.flush()


def open_log(path: str, tail: int) -> CommitLog:
    return CommitLog.open(path, CommitLogConfig(segment_size_bytes=SEGMENT,
                                                page_cache_tail_bytes=tail))


def require_droppable(tmp_path) -> None:
    """The file system under the tests drops clean pages when asked (tmpfs,
    for one, cannot)."""
    probe = tmp_path / "probe"
    probe.write_bytes(os.urandom(4 * PAGE))
    fd = os.open(probe, os.O_RDWR)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    require(not any(resident_pages(str(probe))),
            f"the file system of {tmp_path} keeps clean pages after POSIX_FADV_DONTNEED")
    probe.unlink()


def test_syncs_drop_what_falls_out_of_the_cached_tail(tmp_path) -> None:
    require_droppable(tmp_path)
    log = open_log(str(tmp_path / "log"), TAIL)
    append(log, 3.5)
    cached = cached_positions(log)
    # What is left is the tail, plus at most one step not yet worth a drop
    # and the page a drop cut through.
    assert cached and min(cached) >= log.end - TAIL - TAIL - 2 * PAGE
    assert len(cached) * PAGE <= 2 * TAIL + 2 * PAGE
    # The tail itself was just written: every whole page of it is cached.
    assert set(whole_pages(log, log.end - TAIL, log.end)) <= set(cached)
    # Dropped is not lost: the first entries read back from the disk.
    first = log.read_entry(log.first_index)
    assert len(first.body) == BODY
    log.close()


def test_a_zero_tail_leaves_the_page_cache_to_the_kernel(tmp_path) -> None:
    require_droppable(tmp_path)
    log = open_log(str(tmp_path / "log"), 0)
    append(log, 2.5)
    # Nothing dropped: the first segment, written first, is still cached.
    assert cached_positions(log)[0] == 0
    log.close()


def test_a_truncation_below_the_dropped_bytes_lets_their_new_bytes_drop(tmp_path) -> None:
    require_droppable(tmp_path)
    log = open_log(str(tmp_path / "log"), TAIL)
    append(log, 2.5)
    assert min(cached_positions(log)) > MIB  # the first MiB was dropped
    log.truncate_after(log.first_index + 100)
    cut = log.end
    append(log, 2.5)
    cached = cached_positions(log)
    # The bytes written over the cut, now far behind the end, were dropped
    # too: the drop mark came down with the truncation.
    assert not [p for p in cached if cut + PAGE <= p < log.end - 2 * TAIL - PAGE]
    log.close()


def test_a_sync_drops_only_synced_bytes_on_the_simulated_file_system(tmp_path) -> None:
    fs = SimFileSystem(random.Random(7))
    with fileio.use(fs):
        log = open_log("/sim/log", 8 * 1024)
        rng = random.Random(1)
        for n in range(400):
            log.append_new([(1, [(KIND_MESSAGES, rng.randbytes(300))])])
            if n % 10 == 0:
                log.flush()
        log.close()
    assert fs.cache_drops > 0


def test_the_simulated_file_system_refuses_to_drop_unsynced_bytes() -> None:
    fs = SimFileSystem(random.Random(7))
    fs.makedirs("/sim", exist_ok=True)
    fd = fs.open("/sim/f", os.O_RDWR | os.O_CREAT)
    fs.pwrite(fd, b"x" * 8192, 0)
    with pytest.raises(AssertionError, match="unsynced write at 0"):
        fs.drop_cache(fd, 4096, 4096)
    fs.fdatasync(fd)
    fs.pwrite(fd, b"y" * 100, 8192)
    fs.drop_cache(fd, 0, 8192)  # synced: fine; the new write lies after it
    with pytest.raises(AssertionError, match="unsynced write at 8192"):
        fs.drop_cache(fd, 4096, 8192)
    assert fs.cache_drops == 1


@pytest.mark.parametrize("value", [-1, -(1 << 70)])
def test_a_negative_tail_is_refused(value: int) -> None:
    with pytest.raises(ConfigError, match="page_cache_tail_bytes"):
        CommitLogConfig(page_cache_tail_bytes=value)
