"""Snapshot install, storage side: replace a log's every segment with staged ones.

A follower too far behind receives the leader's segments (named by their
start positions, exactly as on the leader) into a staging directory inside
its data directory. Installing them:

1. verifies the staged files by a full scan: every entry's CRCs, contiguous
   indexes, non-decreasing terms, the placement rule, the first entry is
   `first_index` at the first segment's start, the last is (`last_index`,
   `last_term`) ending at `end`, and each file ends with its last entry;
2. writes the `INSTALL` marker (the commit point: before it nothing changed,
   after it the install is finished by whoever comes next);
3. removes the old segments and index files and moves the staged segments in;
4. writes the checkpoint (first_index, durable through last_index), then
   removes the marker.

Opening a log whose data directory holds the marker redoes steps 3 and 4
(each is idempotent) and lets recovery re-verify everything and rebuild the
index. A segment moves from the staging directory into `commitlog/` as a
link, made durable before the staged name is removed: a rename across two
directories is not one operation on every file system (ext4 without its
journal writes the two directories back on their own).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from crc32c import crc32c

from commitlog import fileio
from commitlog.checkpoint import Checkpoint, write_checkpoint
from commitlog.disk import (
    atomic_replace,
    link_over,
    read_exact,
    sync_directory,
    sync_fd,
    trace_cut,
    trace_durable,
)
from commitlog.entry import HEADER_SIZE, decode_header, place
from commitlog.errors import CorruptionError, FormatVersionError
from commitlog.file_queue import file_name, is_file_name
from commitlog.index_file import encode_record

MARKER = "INSTALL"
MARKER_MAGIC = 0x49514D4C  # the bytes "LMQI"
MARKER_VERSION = 1
# magic, version, first_index, last_index, last_term, end, segment count, path length
_HEAD = struct.Struct("<IIQQQQII")
_SEGMENT = struct.Struct("<QQ")  # base, length
_CRC = struct.Struct("<I")
_CHUNK = 8 * 1024 * 1024


@dataclass(frozen=True)
class InstallMarker:
    """What an install replaces the log with; `staged` is relative to the data directory."""

    first_index: int
    last_index: int
    last_term: int
    end: int
    staged: str
    segments: tuple[tuple[int, int], ...]  # (base, length), ascending


def encode_marker(marker: InstallMarker) -> bytes:
    path = marker.staged.encode()
    body = _HEAD.pack(MARKER_MAGIC, MARKER_VERSION, marker.first_index, marker.last_index,
                      marker.last_term, marker.end, len(marker.segments), len(path))
    body += path + b"".join(_SEGMENT.pack(base, length) for base, length in marker.segments)
    return body + _CRC.pack(crc32c(body))


def read_marker(data_dir: str) -> InstallMarker | None:
    """The install marker of `data_dir`, verified; None when there is none."""
    path = os.path.join(data_dir, MARKER)
    raw = fileio.fs.read_file(path)
    if raw is None:
        return None
    if len(raw) < _HEAD.size + _CRC.size or \
            _CRC.unpack_from(raw, len(raw) - 4)[0] != crc32c(raw[:-4]):
        raise CorruptionError(path, 0, "install marker short or CRC mismatch")
    magic, version, first, last, term, end, count, path_len = _HEAD.unpack_from(raw)
    if magic != MARKER_MAGIC:
        raise CorruptionError(path, 0, f"bad magic 0x{magic:08X}")
    if version != MARKER_VERSION:
        raise FormatVersionError(path, version)
    if len(raw) != _HEAD.size + path_len + count * _SEGMENT.size + _CRC.size:
        raise CorruptionError(path, _HEAD.size, "install marker length disagrees with its counts")
    staged = raw[_HEAD.size : _HEAD.size + path_len].decode()
    at = _HEAD.size + path_len
    segments = tuple(_SEGMENT.unpack_from(raw, at + i * _SEGMENT.size) for i in range(count))
    return InstallMarker(first, last, term, end, staged, segments)


def write_marker(data_dir: str, marker: InstallMarker) -> None:
    atomic_replace(os.path.join(data_dir, MARKER), encode_marker(marker))


def staged_bases(directory: str, segment_size: int) -> list[int]:
    """The staged segment files, ascending; anything else there is refused."""
    bases = []
    for name in fileio.fs.listdir(directory):
        if name.endswith(".durable"):
            continue  # the chaos harness's durability trace
        if not is_file_name(name) or int(name) % segment_size:
            raise ValueError(f"{os.path.join(directory, name)} is not a segment name on the "
                             f"grid of segment_size_bytes={segment_size}")
        bases.append(int(name))
    return sorted(bases)


class _Reader:
    """Chunked reads of one file (a segment may be far larger than wanted in memory)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = b""
        self.at = 0

    def get(self, offset: int, length: int) -> memoryview:
        if not (self.at <= offset and offset + length <= self.at + len(self.buf)):
            self.buf, self.at = read_exact(self.fd, offset, max(_CHUNK, length)), offset
        start = offset - self.at
        return memoryview(self.buf)[start : start + length]


def verify_segments(directory: str, bases: Sequence[int], segment_size: int,
                    entry_size_limit: int, first_index: int, last_index: int, last_term: int,
                    end: int, sync: bool = False) -> tuple[list[bytes], list[tuple[int, int]]]:
    """Scan segment files `directory/<base>` in full, as an install requires
    (module docstring, step 1); CorruptionError names the first problem.
    Returns the index record of every entry and each file's (base, length);
    with `sync`, each file is fsynced first (it is about to be vouched for)."""
    if not bases:
        raise CorruptionError(directory, 0, "no segment staged")
    records: list[bytes] = []
    lengths: list[tuple[int, int]] = []
    prev: tuple[int, int, int] | None = None  # (index, term, end) of the last entry
    for n, base in enumerate(bases):
        path = os.path.join(directory, file_name(base))
        if n and base != bases[n - 1] + segment_size:
            raise CorruptionError(path, 0, f"segment {base} does not follow {bases[n - 1]}")
        fd = fileio.fs.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            if sync:
                sync_fd(fd)
            length = fileio.fs.size(fd)
            if not 0 < length <= segment_size:
                raise CorruptionError(path, 0, f"a segment of {length} bytes")
            reader = _Reader(fd)
            offset = 0
            while offset < length:
                position = base + offset
                if length - offset < HEADER_SIZE:
                    raise CorruptionError(path, offset, "truncated entry header")
                header = decode_header(reader.get(offset, HEADER_SIZE))
                why = header.problem
                if why is None and header.position != position:
                    why = f"entry claims position {header.position}"
                elif why is None and (header.size > entry_size_limit
                                      or offset + header.size > length):
                    why = f"entry of {header.size} bytes runs past the file end"
                elif why is None and prev is None and (header.index != first_index
                                                       or position != bases[0]):
                    why = f"the first entry is index {header.index}, not {first_index}"
                elif why is None and prev is not None:
                    if header.index != prev[0] + 1:
                        why = f"index {header.index} after {prev[0]}"
                    elif header.term < prev[1]:
                        why = f"term {header.term} after term {prev[1]}"
                    elif place(prev[2], header.size, segment_size) != position:
                        why = "entry is not where the placement rule puts it"
                if why is None and crc32c(reader.get(offset + HEADER_SIZE,
                                                     header.size - HEADER_SIZE)) != header.body_crc:
                    why = "body CRC mismatch"
                if why is not None:
                    raise CorruptionError(path, offset, why)
                records.append(encode_record(position, header.term, header.size, header.kind,
                                             header.body_crc))
                prev = (header.index, header.term, position + header.size)
                offset += header.size
            lengths.append((base, length))
        finally:
            fileio.fs.close(fd)
    assert prev is not None
    if prev != (last_index, last_term, end):
        raise CorruptionError(
            os.path.join(directory, file_name(bases[-1])), prev[2] - bases[-1],
            f"the staged log ends with index {prev[0]} (term {prev[1]}) at position {prev[2]}, "
            f"not index {last_index} (term {last_term}) at {end}")
    return records, lengths


def move_in(data_dir: str, marker: InstallMarker) -> None:
    """Step 3 (idempotent): the old segments and index files go, the staged
    segments come in. Every file the marker names must end up in place."""
    segment_dir = os.path.join(data_dir, "commitlog")
    staged_dir = os.path.join(data_dir, marker.staged)
    index_dir = os.path.join(data_dir, "index")
    fileio.fs.makedirs(segment_dir, exist_ok=True)
    wanted = dict(marker.segments)
    for name in fileio.fs.listdir(segment_dir):
        if is_file_name(name) and int(name) not in wanted:
            path = os.path.join(segment_dir, name)
            fileio.fs.remove(path)
            trace_cut(path, None)
    staged = set(fileio.fs.listdir(staged_dir)) if fileio.fs.isdir(staged_dir) else set()
    # Linked in, made durable, only then unlinked from staging (as
    # `disk.move_across`, one directory fsync per side): a cut at any moment
    # leaves every segment under one name or both, and this step redoes.
    moved = [file_name(base) for base, _ in marker.segments if file_name(base) in staged]
    for name in moved:
        link_over(os.path.join(staged_dir, name), os.path.join(segment_dir, name))
    for base, length in marker.segments:
        target = os.path.join(segment_dir, file_name(base))
        try:
            fd = fileio.fs.open(target, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise CorruptionError(target, 0, "a segment the install marker names is neither "
                                  "in commitlog/ nor staged") from None
        try:
            found = fileio.fs.size(fd)
        finally:
            fileio.fs.close(fd)
        if found != length:
            raise CorruptionError(target, found, f"installed segment holds {found} bytes, "
                                  f"the install marker says {length}")
        if file_name(base) in moved:
            trace_durable(target, length)  # fsynced before the marker was written
    sync_directory(segment_dir)
    for name in moved:
        source = os.path.join(staged_dir, name)
        fileio.fs.remove(source)
        trace_cut(source, None)
    if staged:
        sync_directory(staged_dir)
    if fileio.fs.isdir(index_dir):
        for name in fileio.fs.listdir(index_dir):
            if is_file_name(name):
                path = os.path.join(index_dir, name)
                fileio.fs.remove(path)
                trace_cut(path, None)
        sync_directory(index_dir)


def finish(data_dir: str, marker: InstallMarker) -> None:
    """Step 4: the checkpoint vouches for the installed log; the marker goes."""
    write_checkpoint(data_dir, Checkpoint(marker.last_index, marker.end, marker.last_term,
                                          marker.first_index))
    fileio.fs.remove(os.path.join(data_dir, MARKER))
    sync_directory(data_dir)


def roll_forward(data_dir: str) -> InstallMarker | None:
    """Finish an install a crash interrupted (steps 3 and 4); None if there was none.
    The caller's recovery then verifies every installed entry (the index
    files are gone, so it scans from the first segment) and rebuilds the index."""
    marker = read_marker(data_dir)
    if marker is None:
        return None
    move_in(data_dir, marker)
    finish(data_dir, marker)
    return marker
