"""Whose data a data directory holds: the `IDENTITY` file and the format version.

Every data directory carries one small file, `IDENTITY` (layout in
docs/storage-format.md), naming the cluster and the node it belongs to, a
random *directory id* and the on-disk format version it is written in. It is
created the first time a node uses the directory and never rewritten after.

Why each field:

- *Cluster and node id.* A node pointed at another cluster's directory, or at
  another node's, would replay a log and a vote that are not its own: it
  refuses to start instead (`ForeignDataDirError`).
- *Directory id* (random, 63 bits, nonzero). Raft's safety rests on a node
  remembering its term, its vote and its log. A node whose disk was wiped has
  forgotten them and could vote twice in one term. The group pins each
  voter's directory id in its configuration (`dledger.membership`) and counts
  votes only from the pinned directory, so a wiped node, which gets a new id
  here, cannot vote until it has rejoined through a membership change.
- *Format version* (of docs/storage-format.md). A build opens only the
  versions it knows (`FORMAT_VERSION_MIN`..`FORMAT_VERSION`) and refuses any
  other with both versions named (`UnsupportedFormatError`), never guessing.

An identity file that fails its checks (truncated, bit flips) refuses the
start (`IdentityCorruptError`): it is never silently regenerated, since a new
identity on an old log would hide whatever damaged the directory.
A directory from before identities existed (it holds a log or a hard state but
no `IDENTITY`) is adopted: it gets an identity in format version 1 and a new
directory id, which is safe for the same reason a wiped one is.

`ledgermq node repair` (`repair`) sets a damaged directory aside, whole and
untouched, and leaves a fresh one with a new identity in its place.

Runtime-side (file I/O through `commitlog.fileio`, so the real-node simulator
can run it on its simulated disk); the consensus core only ever sees the
directory id, through its configuration.
"""

from __future__ import annotations

import logging
import os
import secrets
import struct
import time
from dataclasses import asdict, dataclass
from typing import Any, Literal

from crc32c import crc32c

from commitlog import fileio
from commitlog.disk import atomic_replace, lock_directory, read_small_file, sync_directory
from commitlog.errors import StorageError
from commitlog.log import KNOWN_TOP_LEVEL

__all__ = [
    "CLUSTER_ID_MAX_BYTES",
    "DAMAGED",
    "FORMAT_VERSION",
    "FORMAT_VERSION_MIN",
    "IDENTITY_FILE",
    "DataDirIdentity",
    "ForeignDataDirError",
    "IdentityCorruptError",
    "IdentityError",
    "Opened",
    "Repaired",
    "UnsupportedFormatError",
    "check_cluster_id",
    "check_format",
    "decode_identity",
    "holds_data",
    "new_directory_id",
    "open_identity",
    "read_identity",
    "repair",
    "write_identity",
]

log = logging.getLogger(__name__)

IDENTITY_FILE = "IDENTITY"
IDENTITY_MAGIC = 0x49514D4C  # "LMQI"
# The on-disk format (docs/storage-format.md) this build writes, and the
# oldest it still opens. Bumped only with a change older builds cannot read.
FORMAT_VERSION = 1
FORMAT_VERSION_MIN = 1
CLUSTER_ID_MAX_BYTES = 255
_MAX_ID = (1 << 63) - 1

# Fixed forever, whatever the version: magic and format version first, the
# CRC of everything before it last, so any build can tell "newer" from
# "damaged". The rest is version 1's layout.
_PREFIX = struct.Struct("<II")  # magic, format version
_V1 = struct.Struct("<IIQQQH")  # magic, version, node id, directory id, created ms, id length
_CRC = struct.Struct("<I")
# A directory holding any of these has data of its own (a log, a vote, state).
_DATA_NAMES = KNOWN_TOP_LEVEL - {"LOCK", IDENTITY_FILE}
# What `repair` sets aside a data directory as: `<dir>.damaged-<UTC time>`,
# or `<dir>/damaged-<UTC time>/` when the directory is a mount point.
DAMAGED = "damaged-"


class IdentityError(StorageError):
    """The data directory cannot be used by this node (the message says why
    and what to do)."""


class IdentityCorruptError(IdentityError):
    """The identity file exists but fails its checks."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(
            f"{path} is damaged ({reason}): refusing to start. It is never regenerated; "
            f"set the directory aside and rejoin the group with `ledgermq node repair"
            f" --data-dir {os.path.dirname(path)}` (docs/operations.md, \"Replica repair\")")
        self.path = path
        self.reason = reason


class ForeignDataDirError(IdentityError):
    """The directory belongs to another cluster or another node."""


class UnsupportedFormatError(IdentityError):
    """The directory's format version is not one this build opens."""

    def __init__(self, path: str, found: int, lo: int = FORMAT_VERSION_MIN,
                 hi: int = FORMAT_VERSION) -> None:
        supported = f"version {hi}" if lo == hi else f"versions {lo} to {hi}"
        if found > hi:
            advice = (f"run a LedgerMQ release that reads format version {found} (a directory"
                      " is never converted back to an older format)")
            what = "newer than"
        else:
            advice = (f"first run a release that reads both format {found} and format {lo}, "
                      "or repair the node so it copies the group's data (`ledgermq node repair`)")
            what = "older than"
        super().__init__(
            f"{path}: the data directory is in on-disk format version {found}, {what} this "
            f"build supports ({supported}): refusing to start; {advice}"
            " (docs/operations.md, \"Format version and upgrades\")")
        self.path = path
        self.found = found
        self.supported = (lo, hi)


@dataclass(frozen=True, slots=True)
class DataDirIdentity:
    """What `IDENTITY` holds."""

    cluster_id: str
    node_id: int
    directory_id: int
    format_version: int = FORMAT_VERSION
    created_ms: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.node_id <= _MAX_ID:
            raise ValueError(f"node id {self.node_id} out of range")
        if not 0 < self.directory_id <= _MAX_ID:
            raise ValueError(f"directory id {self.directory_id} out of range 1..2^63-1")
        check_cluster_id(self.cluster_id)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def encode(self) -> bytes:
        """The file's bytes (always this build's format version's layout)."""
        name = self.cluster_id.encode()
        head = _V1.pack(IDENTITY_MAGIC, self.format_version, self.node_id, self.directory_id,
                        self.created_ms, len(name)) + name
        return head + _CRC.pack(crc32c(head))


@dataclass(frozen=True, slots=True)
class Opened:
    """The identity a node starts with, and how it came to be: "existing",
    "created" (a new or wiped directory) or "adopted" (data from before
    identities)."""

    identity: DataDirIdentity
    how: Literal["existing", "created", "adopted"]


@dataclass(frozen=True, slots=True)
class Repaired:
    """What `repair` did: where the old directory went (None: there was
    nothing to set aside), what its identity was (None: missing or damaged,
    see `previous_problem`) and the new identity."""

    data_dir: str
    aside: str | None
    previous: DataDirIdentity | None
    previous_problem: str
    identity: DataDirIdentity


def check_cluster_id(cluster_id: str) -> None:
    """A cluster id is 1..255 bytes of UTF-8 with no control characters."""
    if not isinstance(cluster_id, str) or not cluster_id:
        raise ValueError("the cluster id is a non-empty string")
    if len(cluster_id.encode()) > CLUSTER_ID_MAX_BYTES:
        raise ValueError(f"the cluster id is at most {CLUSTER_ID_MAX_BYTES} bytes of UTF-8")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in cluster_id):
        raise ValueError("the cluster id holds no control characters")


def check_format(path: str, version: int, lo: int = FORMAT_VERSION_MIN,
                 hi: int = FORMAT_VERSION) -> None:
    """Refuse a format version outside [lo, hi] (UnsupportedFormatError)."""
    if not lo <= version <= hi:
        raise UnsupportedFormatError(path, version, lo, hi)


def new_directory_id() -> int:
    """A random directory id: 63 bits from the OS, never 0 (0 = unpinned)."""
    while True:
        value = secrets.randbits(63)
        if value:
            return value


def decode_identity(path: str, raw: bytes) -> DataDirIdentity:
    """The identity in `raw` (the bytes of the file at `path`), checked:
    IdentityCorruptError when damaged, UnsupportedFormatError when intact but
    in a format version this build does not open."""
    if len(raw) < _PREFIX.size + _CRC.size:
        raise IdentityCorruptError(path, f"truncated to {len(raw)} bytes")
    if _CRC.unpack_from(raw, len(raw) - _CRC.size)[0] != crc32c(raw[:-_CRC.size]):
        raise IdentityCorruptError(path, "CRC mismatch")
    magic, version = _PREFIX.unpack_from(raw)
    if magic != IDENTITY_MAGIC:
        raise IdentityCorruptError(path, f"bad magic 0x{magic:08X}")
    check_format(path, version)
    if len(raw) < _V1.size + _CRC.size:
        raise IdentityCorruptError(path, f"{len(raw)} bytes, shorter than its header")
    _m, _v, node_id, directory_id, created_ms, length = _V1.unpack_from(raw)
    if len(raw) != _V1.size + length + _CRC.size:
        raise IdentityCorruptError(path, f"{len(raw)} bytes for a {length}-byte cluster id")
    try:
        return DataDirIdentity(raw[_V1.size:_V1.size + length].decode(), node_id, directory_id,
                               version, created_ms)
    except (UnicodeDecodeError, ValueError) as exc:
        raise IdentityCorruptError(path, str(exc)) from None


def read_identity(data_dir: str) -> DataDirIdentity | None:
    """The directory's identity; None when it has no `IDENTITY` file."""
    path = os.path.join(data_dir, IDENTITY_FILE)
    raw = read_small_file(path)
    return None if raw is None else decode_identity(path, raw)


def write_identity(data_dir: str, identity: DataDirIdentity) -> None:
    """Durably write `IDENTITY` (temporary file, fsync, rename, fsync the directory)."""
    atomic_replace(os.path.join(data_dir, IDENTITY_FILE), identity.encode())


def holds_data(data_dir: str) -> bool:
    """True when the directory holds a log, a hard state or other state of a
    node (not only its lock, its identity or leftovers)."""
    return not _DATA_NAMES.isdisjoint(fileio.fs.listdir(data_dir))


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def open_identity(data_dir: str, cluster_id: str, node_id: int) -> Opened:
    """The identity node `node_id` of cluster `cluster_id` starts with from
    `data_dir`, created (new or wiped directory) or adopted (data from before
    identities) when missing. Refuses, with IdentityError, a directory of
    another cluster or node, in an unsupported format, or with a damaged
    identity; LockedError when another process uses the directory.

    Call it before anything else opens the directory."""
    check_cluster_id(cluster_id)
    fileio.fs.makedirs(data_dir, exist_ok=True)
    # The lock makes "read, else create" one step: two processes started on
    # one directory cannot both create an identity (the loser would run with
    # an id the file no longer holds). Released at once: the CommitLog takes
    # it again for the life of the node.
    lock = lock_directory(data_dir)
    try:
        found = read_identity(data_dir)
        if found is None:
            how: Literal["created", "adopted"] = "adopted" if holds_data(data_dir) else "created"
            identity = DataDirIdentity(cluster_id, node_id, new_directory_id(),
                                       FORMAT_VERSION, _now_ms())
            write_identity(data_dir, identity)
            if how == "adopted":
                log.warning("%s: data directory from before identities adopted: node %d of"
                            " cluster %r, directory id %d, format version %d", data_dir,
                            node_id, cluster_id, identity.directory_id, FORMAT_VERSION)
            else:
                log.info("%s: new data directory: node %d of cluster %r, directory id %d",
                         data_dir, node_id, cluster_id, identity.directory_id)
            return Opened(identity, how)
    finally:
        fileio.fs.close(lock)
    if found.cluster_id != cluster_id:
        raise ForeignDataDirError(
            f"{data_dir} belongs to cluster {found.cluster_id!r}, not to {cluster_id!r}:"
            " refusing to start; point data_dir at this cluster's directory (or, if the"
            " cluster was only renamed, set cluster_id to its old name)")
    if found.node_id != node_id:
        raise ForeignDataDirError(
            f"{data_dir} belongs to node {found.node_id} of cluster {cluster_id!r}, not to"
            f" node {node_id}: refusing to start; every node needs its own data directory"
            " (check node_id and data_dir)")
    return Opened(found, "existing")


def _utc_stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def _free_name(base: str) -> str:
    """`base`, or `base-2`, `base-3`, ... whichever does not exist yet."""
    name, n = base, 1
    while os.path.lexists(name):
        n += 1
        name = f"{base}-{n}"
    return name


def repair(data_dir: str, cluster_id: str | None = None, node_id: int | None = None) -> Repaired:
    """Set `data_dir` aside whole, as `<data_dir>.damaged-<UTC time>` next to
    it (`<data_dir>/damaged-<UTC time>/` when it is a mount point, which
    cannot be renamed), and leave in its place an empty directory with a new
    identity. Nothing is deleted or modified in what is set aside.

    The new identity's cluster and node default to the old identity's; when
    that is missing or damaged they must be given. LockedError when a node
    runs on the directory. A symbolic link is followed: the directory it
    points to is set aside next to itself, and the link keeps working."""
    data_dir = os.path.realpath(data_dir)
    previous: DataDirIdentity | None = None
    problem = ""
    exists = os.path.isdir(data_dir)
    if exists:
        try:
            previous = read_identity(data_dir)
            if previous is None:
                problem = f"no {IDENTITY_FILE} file"
        except IdentityError as exc:
            problem = str(exc)
    cluster_id = cluster_id or (previous.cluster_id if previous else None)
    node_id = node_id or (previous.node_id if previous else None)
    if not cluster_id or not node_id:
        raise IdentityError(
            f"{data_dir}: the old identity cannot be read ({problem or 'no directory'}), so"
            " give the node's cluster id and node id (or its broker config file)")
    check_cluster_id(cluster_id)
    identity = DataDirIdentity(cluster_id, node_id, new_directory_id(), FORMAT_VERSION,
                               _now_ms())
    aside: str | None = None
    if exists and any(name != "LOCK" for name in os.listdir(data_dir)):
        lock = lock_directory(data_dir)  # refuses while a node runs on it
        try:
            aside = _set_aside(data_dir)
        finally:
            fileio.fs.close(lock)
    os.makedirs(data_dir, exist_ok=True)
    write_identity(data_dir, identity)
    sync_directory(os.path.dirname(data_dir))
    log.info("%s: %s; new directory id %d", data_dir,
             f"set aside as {aside}" if aside else "nothing to set aside",
             identity.directory_id)
    return Repaired(data_dir, aside, previous, problem, identity)


def _set_aside(data_dir: str) -> str:
    """Move the directory's content aside (see `repair`); where it went."""
    stamp = _utc_stamp()
    if not os.path.ismount(data_dir):
        aside = _free_name(f"{data_dir}.{DAMAGED}{stamp}")
        mode = os.stat(data_dir).st_mode & 0o7777
        os.rename(data_dir, aside)
        os.mkdir(data_dir, mode)
        sync_directory(os.path.dirname(data_dir))
        return aside
    # A mount point stays where it is: its entries move into a subdirectory
    # (same file system, so each move is a rename). Earlier repairs' sets stay.
    aside = _free_name(os.path.join(data_dir, f"{DAMAGED}{stamp}"))
    os.mkdir(aside, 0o755)
    for name in sorted(os.listdir(data_dir)):
        path = os.path.join(data_dir, name)
        if path != aside and not name.startswith(DAMAGED) and name != "lost+found":
            os.rename(path, os.path.join(aside, name))
    sync_directory(aside)
    sync_directory(data_dir)
    return aside
