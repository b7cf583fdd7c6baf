"""State snapshots at a Raft index: `<data_dir>/snapshots/<index>/{state,meta}`.

A snapshot is the state machine's state after applying every entry up to
`index`, so the log before it may go (retention) and a start replays only
what follows. The `state` bytes are the state machine's own (opaque here);
`meta` (docs/storage-format.md) names the index, its term, the CommitLog
position just past that entry, the state's size and CRC and, from version 2
on, the group's membership in effect at the index: the canonical JSON of
`dledger.membership.encode`, opaque here (this package imports nothing of the
consensus code) beyond being a JSON object. A snapshot without a membership
(None: the group's bootstrap configuration) is written as version 1, the
fixed 60-byte record of before, so it stays readable by older releases.

Atomicity: `state` is written first (temporary name, fsync, rename), `meta`
last the same way; a snapshot exists once its `meta` verifies, and `meta`
vouches for the state's size and CRC, so a crash at any point leaves either
the previous snapshots or a complete new one. Only whole files are renamed
(never directories), which the real-node simulator's file system models too.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import time
from dataclasses import dataclass, field

from crc32c import crc32c

from commitlog import fileio
from commitlog.disk import atomic_replace, move_across, read_exact, sync_directory, sync_fd
from commitlog.errors import CorruptionError, FormatVersionError, StorageError
from commitlog.file_queue import file_name, is_file_name

SNAPSHOTS_DIR = "snapshots"
STATE_FILE = "state"
META_FILE = "meta"
META_MAGIC = 0x53514D4C  # the bytes "LMQS"
# Version 1: the fixed fields and their CRC. Version 2: the fixed fields, a
# u32 length, that many bytes of membership JSON, then the CRC of all of it.
META_VERSION_V1 = 1
META_VERSION = 2
META_VERSIONS = (META_VERSION_V1, META_VERSION)
# magic, version, index, term, end_position, created_ms, state_bytes, state_crc, reserved
_META = struct.Struct("<IIQQQQQII")  # 56 bytes, then the CRC of them
_LEN = struct.Struct("<I")
_CRC = struct.Struct("<I")
META_SIZE = _META.size + _CRC.size  # of version 1; version 2 adds 4 + the membership
# The largest membership a meta may carry: a sanity bound on the length field
# (a configuration of 3 000 members with 255-byte addresses still fits).
MEMBERSHIP_BYTES_MAX = 1 << 20
_CHUNK = 8 * 1024 * 1024

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SnapshotInfo:
    """One snapshot on disk, as its verified `meta` describes it."""

    index: int  # last log entry the snapshot covers
    term: int  # that entry's term
    end_position: int  # CommitLog byte position just past that entry
    created_ms: int
    state_bytes: int
    state_crc: int  # crc32c of the state file
    path: str  # the snapshot's directory
    # The membership in effect at `index` (`dledger.membership.encode`'s
    # canonical JSON), None for a snapshot of the bootstrap configuration.
    membership: bytes | None = None

    @property
    def state_path(self) -> str:
        return os.path.join(self.path, STATE_FILE)


@dataclass(frozen=True)
class BadSnapshot:
    """A snapshot directory that is not (or no longer) a usable snapshot."""

    path: str
    reason: str


@dataclass
class SnapshotScan:
    """What `scan_snapshots` found: usable snapshots (oldest first) and the rest."""

    good: list[SnapshotInfo] = field(default_factory=list)
    bad: list[BadSnapshot] = field(default_factory=list)


def snapshots_root(data_dir: str) -> str:
    return os.path.join(data_dir, SNAPSHOTS_DIR)


def snapshot_path(data_dir: str, index: int) -> str:
    """The directory of the snapshot at `index`."""
    return os.path.join(snapshots_root(data_dir), file_name(index))


def encode_meta(index: int, term: int, end_position: int, created_ms: int, state_bytes: int,
                state_crc: int, membership: bytes | None = None) -> bytes:
    """The meta record: version 1 without a membership, version 2 with one."""
    version = META_VERSION_V1 if membership is None else META_VERSION
    head = _META.pack(META_MAGIC, version, index, term, end_position, created_ms,
                      state_bytes, state_crc, 0)
    if membership is not None:
        head += _LEN.pack(len(membership)) + membership
    return head + _CRC.pack(crc32c(head))


def _membership_problem(membership: bytes) -> str | None:
    """Why `membership` cannot be a snapshot's membership, None if it can: a
    JSON object of 1..MEMBERSHIP_BYTES_MAX bytes (its meaning is the consensus
    code's to check, `dledger.membership.decode`)."""
    if not 0 < len(membership) <= MEMBERSHIP_BYTES_MAX:
        return f"membership of {len(membership)} bytes (1..{MEMBERSHIP_BYTES_MAX} allowed)"
    try:
        doc = json.loads(membership)
    except (ValueError, RecursionError) as exc:
        return f"membership is not JSON: {type(exc).__name__}"
    if not isinstance(doc, dict):
        return "membership is not a JSON object"
    return None


def read_meta(directory: str) -> SnapshotInfo:
    """The verified meta of the snapshot in `directory` (version 1 or 2).

    Raises CorruptionError (missing, short, bad CRC or magic, an index that is
    not the directory's name, impossible values, a membership length that does
    not fit the file or is not a JSON object) or FormatVersionError (a version
    this code does not know, e.g. written by a newer release).
    """
    path = os.path.join(directory, META_FILE)
    raw = fileio.fs.read_file(path)
    if raw is None:
        raise CorruptionError(path, 0, "no meta file (a snapshot write cut short?)")
    if len(raw) < META_SIZE:
        raise CorruptionError(path, 0, f"expected at least {META_SIZE} bytes, found {len(raw)}")
    magic, version, index, term, end, created, size, state_crc, _r = _META.unpack_from(raw)
    if magic != META_MAGIC:
        raise CorruptionError(path, 0, f"bad magic 0x{magic:08X}")
    membership: bytes | None = None
    if version == META_VERSION_V1:
        expected = META_SIZE
    elif version == META_VERSION:
        length = _LEN.unpack_from(raw, _META.size)[0]
        if not 0 < length <= MEMBERSHIP_BYTES_MAX:
            raise CorruptionError(path, _META.size, f"membership length {length} outside "
                                  f"1..{MEMBERSHIP_BYTES_MAX}")
        expected = _META.size + _LEN.size + length + _CRC.size
    else:
        raise FormatVersionError(path, version)
    if len(raw) != expected:
        raise CorruptionError(path, 0, f"version {version} meta of {expected} bytes expected, "
                              f"found {len(raw)}")
    at = expected - _CRC.size
    if _CRC.unpack_from(raw, at)[0] != crc32c(raw[:at]):
        raise CorruptionError(path, at, "CRC mismatch")
    if version == META_VERSION:
        membership = raw[_META.size + _LEN.size : at]
        problem = _membership_problem(membership)
        if problem is not None:
            raise CorruptionError(path, _META.size + _LEN.size, problem)
    name = os.path.basename(os.path.normpath(directory))
    if not is_file_name(name) or int(name) != index:
        raise CorruptionError(path, 8, f"meta says index {index} but the directory is {name}")
    if index < 1 or term < 1 or end < 1:
        raise CorruptionError(path, 8, f"impossible index {index}, term {term} or end {end}")
    return SnapshotInfo(index, term, end, created, size, state_crc, directory, membership)


def _file_size(path: str) -> int | None:
    try:
        fd = fileio.fs.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        return fileio.fs.size(fd)
    finally:
        fileio.fs.close(fd)


def _crc_of_file(path: str, sync: bool = False) -> tuple[int, int]:
    """(size, crc32c) of a whole file, read in chunks; fsynced first if `sync`."""
    fd = fileio.fs.open(path, (os.O_RDWR if sync else os.O_RDONLY) | os.O_CLOEXEC)
    try:
        if sync:
            sync_fd(fd)
        crc = 0
        offset = 0
        while True:
            chunk = read_exact(fd, offset, _CHUNK)
            if not chunk:
                return offset, crc
            crc = crc32c(chunk, crc)
            offset += len(chunk)
    finally:
        fileio.fs.close(fd)


def _check_state(info: SnapshotInfo, with_crc: bool) -> str | None:
    """Why the state file does not match the meta, or None when it does."""
    size = _file_size(info.state_path)
    if size is None:
        return "state file missing"
    if size != info.state_bytes:
        return f"state file holds {size} bytes, meta says {info.state_bytes}"
    if with_crc:
        _size, crc = _crc_of_file(info.state_path)
        if crc != info.state_crc:
            return f"state CRC 0x{crc:08X}, meta says 0x{info.state_crc:08X}"
    return None


def scan_snapshots(data_dir: str, verify_state: bool = False) -> SnapshotScan:
    """Every snapshot directory, checked: meta CRC, version and index, state
    size (and with `verify_state` the state's CRC, reading it whole)."""
    scan = SnapshotScan()
    root = snapshots_root(data_dir)
    if not fileio.fs.isdir(root):
        return scan
    for name in sorted(fileio.fs.listdir(root)):
        path = os.path.join(root, name)
        if not is_file_name(name) or not fileio.fs.isdir(path):
            if not name.endswith((".tmp", ".durable")):
                scan.bad.append(BadSnapshot(path, "not a snapshot directory"))
            continue
        try:
            info = read_meta(path)
        except StorageError as exc:
            scan.bad.append(BadSnapshot(path, str(exc)))
            continue
        problem = _check_state(info, verify_state)
        if problem is not None:
            scan.bad.append(BadSnapshot(path, problem))
            continue
        scan.good.append(info)
    return scan


def list_snapshots(data_dir: str) -> list[SnapshotInfo]:
    """Usable snapshots, oldest first: meta verified, state of the right size
    (its CRC is checked by `read_state` and `latest_snapshot`)."""
    return scan_snapshots(data_dir).good


def latest_snapshot(data_dir: str, verify_state: bool = True) -> SnapshotInfo | None:
    """The newest snapshot that verifies (meta and, with `verify_state`, the
    state's CRC); damaged ones are logged and skipped, so a start falls back
    to an older snapshot rather than trusting a bad one."""
    scan = scan_snapshots(data_dir)
    for bad in scan.bad:
        log.warning("snapshot %s skipped: %s", bad.path, bad.reason)
    for info in reversed(scan.good):
        problem = _check_state(info, verify_state) if verify_state else None
        if problem is None:
            return info
        log.warning("snapshot %s skipped: %s", info.path, problem)
    return None


def read_state(info: SnapshotInfo) -> bytes:
    """The snapshot's state bytes, verified against the meta's size and CRC."""
    path = info.state_path
    raw = fileio.fs.read_file(path)
    if raw is None:
        raise CorruptionError(path, 0, "state file missing")
    if len(raw) != info.state_bytes:
        raise CorruptionError(path, min(len(raw), info.state_bytes),
                              f"state holds {len(raw)} bytes, meta says {info.state_bytes}")
    if crc32c(raw) != info.state_crc:
        raise CorruptionError(path, 0, "state CRC mismatch")
    return raw


def _check_args(index: int, term: int, end_position: int, keep: int,
                membership: bytes | None) -> None:
    if index < 1 or term < 1 or end_position < 1:
        raise ValueError(f"a snapshot needs index, term and end_position >= 1, "
                         f"not {index}, {term}, {end_position}")
    if keep < 1:
        raise ValueError("keep must be at least 1")
    if membership is not None:
        problem = _membership_problem(membership)
        if problem is not None:
            raise ValueError(f"cannot write a snapshot with this {problem}")


def _prepare_directory(data_dir: str, index: int) -> str:
    """Make the snapshot's directory exist durably, with no meta in it: an
    earlier snapshot at this index stops counting before its files change."""
    root = snapshots_root(data_dir)
    if not fileio.fs.isdir(root):
        fileio.fs.makedirs(root, exist_ok=True)
        sync_directory(data_dir)
    directory = snapshot_path(data_dir, index)
    if fileio.fs.isdir(directory):
        for name in fileio.fs.listdir(directory):
            if name == META_FILE or name.endswith(".tmp"):
                fileio.fs.remove(os.path.join(directory, name))
        sync_directory(directory)
    else:
        fileio.fs.makedirs(directory, exist_ok=True)
        sync_directory(root)
    return directory


def _same(data_dir: str, index: int, term: int, end_position: int, size: int,
          crc: int, membership: bytes | None) -> SnapshotInfo | None:
    """The existing snapshot at `index` if it already holds exactly this."""
    directory = snapshot_path(data_dir, index)
    if not fileio.fs.isdir(directory):
        return None
    try:
        info = read_meta(directory)
    except StorageError:
        return None
    if (info.term, info.end_position, info.state_bytes, info.state_crc, info.membership) != (
            term, end_position, size, crc, membership) or _check_state(info, True) is not None:
        return None
    return info


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def write_snapshot(data_dir: str, index: int, term: int, end_position: int, state: bytes,
                   keep: int = 2, created_ms: int | None = None,
                   membership: bytes | None = None) -> SnapshotInfo:
    """Durably write the snapshot at `index` and prune older ones to `keep`.

    `created_ms` defaults to the wall clock (the simulators pass their own).
    `membership` is the configuration in effect at `index`
    (`dledger.membership.encode`), None for the bootstrap one. Writing the
    same snapshot again is a no-op; a different state (or membership) at the
    same index replaces it.
    """
    _check_args(index, term, end_position, keep, membership)
    crc = crc32c(state)
    info = _same(data_dir, index, term, end_position, len(state), crc, membership)
    if info is None:
        directory = _prepare_directory(data_dir, index)
        atomic_replace(os.path.join(directory, STATE_FILE), state)
        info = _commit_meta(directory, index, term, end_position, len(state), crc, created_ms,
                            membership)
    prune_snapshots(data_dir, keep)
    return info


def adopt_snapshot(data_dir: str, staged_state_path: str, index: int, term: int,
                   end_position: int, keep: int = 2, created_ms: int | None = None,
                   membership: bytes | None = None) -> SnapshotInfo:
    """Install a received state file (a snapshot install) as the snapshot at
    `index`: the file is fsynced and moved in (it must be on the data
    directory's file system, e.g. under `<data_dir>/install.tmp/`), then the
    meta is written (with `membership`, as `write_snapshot`). Older snapshots
    are pruned to `keep`."""
    _check_args(index, term, end_position, keep, membership)
    size, crc = _crc_of_file(staged_state_path, sync=True)
    info = _same(data_dir, index, term, end_position, size, crc, membership)
    if info is None:
        directory = _prepare_directory(data_dir, index)
        move_across(staged_state_path, os.path.join(directory, STATE_FILE))
        info = _commit_meta(directory, index, term, end_position, size, crc, created_ms,
                            membership)
    else:
        fileio.fs.remove(staged_state_path)
    prune_snapshots(data_dir, keep)
    return info


def _commit_meta(directory: str, index: int, term: int, end_position: int, size: int, crc: int,
                 created_ms: int | None, membership: bytes | None) -> SnapshotInfo:
    """Write the meta: the moment the snapshot starts to exist."""
    created = _now_ms() if created_ms is None else created_ms
    atomic_replace(os.path.join(directory, META_FILE),
                   encode_meta(index, term, end_position, created, size, crc, membership))
    return SnapshotInfo(index, term, end_position, created, size, crc, directory, membership)


def sync_snapshot_names(data_dir: str) -> None:
    """At open: make every snapshot's names durable. A process that died
    between a meta's rename and its directory's fsync, or whose fsync of it
    failed, left a snapshot that every read sees and a power cut may take;
    recovery must not build on it (keep a log that starts above what the
    older snapshots cover, drop the staging of the install that made it)
    while it is not durable (the real-node simulator, seed 18511427)."""
    root = snapshots_root(data_dir)
    if not fileio.fs.isdir(root):
        return
    for name in fileio.fs.listdir(root):
        path = os.path.join(root, name)
        if fileio.fs.isdir(path):
            sync_directory(path)
    sync_directory(root)


def prune_snapshots(data_dir: str, keep: int) -> list[str]:
    """Remove every snapshot directory except the `keep` newest usable ones;
    damaged directories newer than the newest usable one stay (evidence, or a
    write in progress). Returns the directories removed."""
    root = snapshots_root(data_dir)
    if not fileio.fs.isdir(root):
        return []
    scan = scan_snapshots(data_dir)
    kept = {info.path for info in scan.good[-keep:]}
    newest = scan.good[-1].index if scan.good else 0
    removed = []
    for name in fileio.fs.listdir(root):
        path = os.path.join(root, name)
        if path in kept or not is_file_name(name) or not fileio.fs.isdir(path):
            continue
        if int(name) < newest:
            fileio.fs.rmtree(path)
            removed.append(path)
    if removed:
        sync_directory(root)
    return removed


__all__ = [
    "MEMBERSHIP_BYTES_MAX",
    "META_SIZE",
    "META_VERSION",
    "META_VERSIONS",
    "SNAPSHOTS_DIR",
    "BadSnapshot",
    "SnapshotInfo",
    "SnapshotScan",
    "adopt_snapshot",
    "latest_snapshot",
    "list_snapshots",
    "prune_snapshots",
    "read_meta",
    "read_state",
    "scan_snapshots",
    "snapshot_path",
    "sync_snapshot_names",
    "write_snapshot",
]
