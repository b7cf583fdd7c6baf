"""Which files to audit: group specs, replica discovery and the file inventory.

A group spec is either ``NAME=DIR,DIR,...`` (one data directory per replica)
or a root directory laid out as ``ROOT/<group>/<node>/`` (every node directory
holding a ``commitlog/`` is a replica). Directories are local paths or any URI
the Hadoop FileSystem of the Spark session can list (``hdfs://``, ``s3a://``,
``file:``); listing a non-local URI therefore needs the Spark engine.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import numpy as np

_NAME20 = re.compile(r"[0-9]{20}")  # matched whole: not "...\n", not other digits

SEGMENT, INDEX, CQ, CHECKPOINT, HARDSTATE, CQ_CHECKPOINT, OTHER = (
    "segment", "index", "cq", "checkpoint", "hardstate", "cq_checkpoint", "other")
# A snapshot's two files (``snapshots/<index>/meta`` and ``state``), and the
# marker a snapshot install leaves until it is rolled forward or back.
SNAPSHOT_META, SNAPSHOT_STATE, INSTALL_MARKER = "snapshot_meta", "snapshot_state", "install"
# ``IDENTITY``: the cluster, node and directory the replica's data belongs to.
IDENTITY = "identity"
# A file named like a segment, index file, ConsumeQueue file or snapshot, but
# with a number that puts it above 2^63-1 (a position, Raft index or slot no
# log reaches): reported (``prepare``), never read.
BAD_NAME = "bad_name"
_NAME_MAX = (1 << 63) - 1
BULK_KINDS = (SEGMENT, INDEX, CQ, SNAPSHOT_STATE)
SMALL_KINDS = (CHECKPOINT, HARDSTATE, CQ_CHECKPOINT, SNAPSHOT_META, IDENTITY)
# Files the storage engine itself ignores or owns transiently: anything named
# or inside something named ``*.tmp`` (a snapshot being written, a transfer
# being staged under ``install.tmp/``) is not part of the replica yet.
_IGNORED = re.compile(r"(^|/)LOCK\Z|\.tmp(/|\Z)|\.durable\Z")


@dataclass(frozen=True)
class Replica:
    gid: int
    rid: int
    group: str
    name: str
    root: str


@dataclass(frozen=True)
class View:
    """The part of a file an audit with a cut or a window reads (``window``).

    Segments and Raft-index files are read from byte ``start`` (an entry
    header, a record boundary) to byte ``end``; nothing outside is read.
    ConsumeQueue files are read whole, and their units pointing outside
    ``[pos_lo, pos_hi)`` are dropped as they are parsed: they are neither
    read into the checks nor judged.
    """

    start: int = 0
    end: int = -1  # -1: to the end of the file
    pos_lo: int = 0
    pos_hi: int = -1  # -1: no upper bound
    # The group is audited up to a cut while its broker may still append: a
    # trailing partial ConsumeQueue unit is one being written, not judged.
    open_tail: bool = False

    def keep_units(self, units: np.ndarray) -> np.ndarray:
        """The units (``parse.UNIT_DTYPE``) pointing inside ``[pos_lo, pos_hi)``."""
        off = units["offset"]
        keep = off >= self.pos_lo
        if self.pos_hi >= 0:
            keep &= off < self.pos_hi
        return units if bool(keep.all()) else units[keep]


@dataclass(frozen=True)
class FileInfo:
    fid: int
    gid: int
    rid: int
    path: str
    kind: str
    length: int  # bytes the audit reads (the view's, when there is one)
    start: int = 0  # segment base position, first Raft index, first queue slot, snapshot index
    topic: str = ""
    queue_id: int = -1
    view: View | None = None  # None: the whole file

    @property
    def name(self) -> str:
        return self.path.rstrip("/").rsplit("/", 1)[-1]

    @property
    def read_from(self) -> int:
        """The first byte the audit reads (the view's start; 0 for a whole file)."""
        return self.view.start if self.view is not None else 0


def clip(buf: Any, info: FileInfo) -> Any:
    """``buf`` (a whole file's bytes) cut at the end of ``info``'s view, without a copy.

    File offsets stay those of the file: parsers start at ``info.read_from``.
    """
    if info.view is None or info.view.end < 0:
        return buf
    return memoryview(buf).cast("B")[:info.view.end]


def is_local(path: str) -> bool:
    """True for plain paths and ``file:`` URIs, which Python can open directly."""
    scheme = urlparse(path).scheme
    return scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt")


def local_path(path: str) -> str:
    return urlparse(path).path if path.startswith("file:") else path


def path_key(path: str) -> str:
    """A key that matches a file however Spark or the inventory spells its URI."""
    parsed = urlparse(path)
    return os.path.normpath(parsed.path if parsed.scheme else path)


class Lister:
    """Minimal directory listing used for discovery (local or Hadoop)."""

    def __init__(self, list_dir: Callable[[str], list[tuple[str, bool, int]]]) -> None:
        self._list_dir = list_dir

    def children(self, path: str) -> list[tuple[str, bool, int]]:
        """(name, is_dir, length) of the entries of ``path``; empty if it does not exist."""
        return self._list_dir(path)

    def walk(self, path: str) -> Iterable[tuple[str, int]]:
        """Every file below ``path`` as (relative path, length). A local
        directory already walked (a link back to a parent, or a second link to
        one directory) is not walked again: a link loop inside a replica used
        to list its files again at every level, until the kernel's ELOOP
        stopped the whole audit."""
        stack = [""]
        walked: set[tuple[int, int]] = set()
        while stack:
            rel = stack.pop()
            here = join(path, rel) if rel else path
            same = file_identity(here)
            if same is not None:
                if same in walked:
                    continue
                walked.add(same)
            for name, is_dir, length in self.children(here):
                child = f"{rel}/{name}" if rel else name
                if is_dir:
                    stack.append(child)
                else:
                    yield child, length


def file_identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of a local file or directory, links followed; None for a
    remote path (its file system has no such thing to compare) or one gone."""
    if not is_local(path):
        return None
    try:
        st = os.stat(local_path(path))
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _local_list(path: str) -> list[tuple[str, bool, int]]:
    try:
        it = os.scandir(local_path(path))
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    with it:
        for entry in it:
            try:
                is_dir = entry.is_dir()
                size = 0 if is_dir else entry.stat().st_size
            except FileNotFoundError:
                # Gone since the directory was read: a live broker renames
                # its temporary files into place and deletes old segments.
                # It is not part of the listing; the whole directory used to
                # read as empty ("replica directory ... missing or empty").
                continue
            found.append((entry.name, is_dir, size))
    return sorted(found)


LOCAL = Lister(_local_list)


def join(base: str, rel: str) -> str:
    return base.rstrip("/") + "/" + rel


# What `ledgermq node repair` renames a damaged data directory to:
# ``<dir>.damaged-<UTC time>``, or ``<dir>/damaged-<UTC time>/`` when the
# directory is a mount point (docs/operations.md, "Replica repair").
_SET_ASIDE = re.compile(r"\.damaged-[^/]*\Z")
_SET_ASIDE_INSIDE = re.compile(r"^damaged-[^/]*/")


def _is_replica_dir(lister: Lister, path: str, skipped: list[str] | None = None) -> bool:
    """A directory holding ``commitlog/``, unless repair set it aside (then it is
    added to ``skipped``: out of service, not a replica of its group)."""
    if not any(name == "commitlog" and is_dir for name, is_dir, _ in lister.children(path)):
        return False
    if _SET_ASIDE.search(path.rstrip("/")):
        if skipped is not None and path not in skipped:
            skipped.append(path)
        return False
    return True


def split_spec(spec: str) -> tuple[str | None, list[str]]:
    """(group name, its replica directories) of a ``NAME=DIR,DIR,...`` spec;
    (None, [spec]) for a bare directory (a root, or a group named after it)."""
    if "=" in spec and not spec.startswith(("/", ".")):
        name, listed = spec.split("=", 1)
        return name, [d for d in listed.split(",") if d]
    return None, [spec]


def parse_group_specs(specs: list[str], lister: Lister = LOCAL,
                      skipped: list[str] | None = None) -> list[Replica]:
    """Expand command-line group specs into replicas with ids.

    ``NAME=DIR,DIR,...`` names a group and its replica directories (replica
    names are the directory base names). A bare directory is a root holding
    ``<group>/<node>/``; if the directory is itself a group (its children are
    replica directories) it is taken as one group named after it. Under a
    root, directories `ledgermq node repair` set aside (``<dir>.damaged-*``)
    are not replicas: they are added to ``skipped``.
    """
    groups: dict[str, list[str]] = {}
    for spec in specs:
        name, listed = split_spec(spec)
        if name is not None:
            for d in listed:
                if not lister.children(d):
                    raise ValueError(f"{name}: replica directory {d} is missing or empty")
                groups.setdefault(name, []).append(d)
            continue
        root = spec.rstrip("/")
        kids = [n for n, is_dir, _ in lister.children(root) if is_dir]
        if not kids:
            raise ValueError(f"{spec}: no such directory or nothing in it")
        own = [join(root, k) for k in kids if _is_replica_dir(lister, join(root, k), skipped)]
        if own:
            groups.setdefault(root.rsplit("/", 1)[-1], []).extend(own)
            continue
        for g in kids:
            nodes = [join(join(root, g), n) for n, is_dir, _ in lister.children(join(root, g))
                     if is_dir and _is_replica_dir(lister, join(join(root, g), n), skipped)]
            if nodes:
                groups.setdefault(g, []).extend(nodes)
    if not groups:
        raise ValueError("no replica directories found in " + " ".join(specs))
    replicas = []
    for gid, (group, dirs) in enumerate(sorted(groups.items())):
        names = [d.rstrip("/").rsplit("/", 1)[-1] for d in dirs]
        if len(set(names)) != len(names):
            names = [f"r{i}:{n}" for i, n in enumerate(names)]
        for rid, (name, d) in enumerate(zip(names, dirs, strict=True)):
            replicas.append(Replica(gid, rid, group, name, d.rstrip("/")))
    return replicas


def classify(rel: str) -> tuple[str, int, str, int]:
    """(kind, start, topic, queue_id) of a data-directory-relative path."""
    parts = rel.split("/")
    if rel == "checkpoint":
        return CHECKPOINT, 0, "", -1
    if rel == "hardstate":
        return HARDSTATE, 0, "", -1
    if rel == "IDENTITY":
        return IDENTITY, 0, "", -1
    if rel == "consumequeue/checkpoint":
        return CQ_CHECKPOINT, 0, "", -1
    if rel == "INSTALL":
        return INSTALL_MARKER, 0, "", -1
    if len(parts) == 3 and parts[0] == "snapshots" and _NAME20.fullmatch(parts[1]):
        if parts[2] == "meta":
            return SNAPSHOT_META, int(parts[1]), "", -1
        if parts[2] == "state":
            return SNAPSHOT_STATE, int(parts[1]), "", -1
    if len(parts) == 2 and parts[0] == "commitlog" and _NAME20.fullmatch(parts[1]):
        return SEGMENT, int(parts[1]), "", -1
    if len(parts) == 2 and parts[0] == "index" and _NAME20.fullmatch(parts[1]):
        return INDEX, int(parts[1]), "", -1
    # Queue ids are u32 in the format; a larger number is not a queue directory.
    if (len(parts) == 4 and parts[0] == "consumequeue"
            and parts[2].isascii() and parts[2].isdigit()
            and int(parts[2]) < 1 << 32 and _NAME20.fullmatch(parts[3])):
        return CQ, int(parts[3]), parts[1], int(parts[2])
    return OTHER, 0, "", -1


def inventory(replicas: list[Replica], lister: Lister = LOCAL,
              skipped: list[str] | None = None,
              shared: list[tuple[FileInfo, FileInfo]] | None = None) -> list[FileInfo]:
    """Every file of every replica, classified, with a unique file id. What repair
    set aside inside a replica (``damaged-*/``) is not read: its directory is
    added to ``skipped``. A local file that is the same file (device and
    inode: a symbolic or hard link, or a linked directory) as one of another
    replica is added to ``shared`` with the first one: those replicas do not
    hold copies of their own."""
    files: list[FileInfo] = []
    owner: dict[tuple[int, int], FileInfo] = {}
    for rep in replicas:
        for rel, length in sorted(lister.walk(rep.root)):
            if _IGNORED.search(rel):
                continue
            aside = _SET_ASIDE_INSIDE.match(rel)
            if aside:
                path = join(rep.root, aside.group(0).rstrip("/"))
                if skipped is not None and path not in skipped:
                    skipped.append(path)
                continue
            kind, start, topic, qid = classify(rel)
            # start + length bounds the file's last position, index or slot (a
            # record is at least a byte); past 2^63-1 none of it can be decoded.
            if kind != OTHER and start + length > _NAME_MAX:
                kind = BAD_NAME
            info = FileInfo(len(files), rep.gid, rep.rid, join(rep.root, rel), kind,
                            length, start, topic, qid)
            files.append(info)
            same = file_identity(info.path) if shared is not None else None
            if shared is not None and same is not None:
                first = owner.setdefault(same, info)
                if (first.gid, first.rid) != (info.gid, info.rid):
                    shared.append((info, first))
    return files
