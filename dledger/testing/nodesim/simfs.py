"""`SimFileSystem`: an in-memory file system with power cuts and named, seeded faults.

It implements `commitlog.fileio.FileSystem`, so the real storage code
(`commitlog/`, `consumequeue/`) runs on it unchanged. Every simulated node
lives under its own directory; one `SimFileSystem` holds them all.

What survives a power cut (`crash(prefix, rng)`):

- *File data.* Each file has what reads see and what is durable. A write or
  truncation is applied to the first at once and queued; `fsync`/`fdatasync`
  applies the queue to the durable content. A crash keeps the durable content
  plus a seeded prefix of the queued operations; the first operation not kept
  whole may be torn: each 4 KiB page it touches is kept or not on its own
  (a page not kept beyond the old end reads as zeros, as a hole).
- *Names.* Creating, renaming and removing a name are operations of its
  directory, durable once the directory is fsynced; a crash keeps a seeded
  prefix of a directory's unsynced operations (a rename within a directory
  is one operation: it is never half done; a rename across directories is
  two, one in each, kept or lost on their own, as on a file system without
  a journal). Directories themselves are durable once made (the
  storage engine never fsyncs a directory's parent; real file systems journal
  mkdir within seconds; simulating that loss would only re-find this choice).
- *A failed fsync* (EIO) drops the file's queued operations from the durable
  side, as Linux marks the pages clean after a writeback error: reads still see
  them, a later fsync does not write them, a power cut loses them.

Faults are drawn per call from the file system's own seeded rng with the
rates of `DiskFaults` for the node owning the path; each injected fault is
counted under its name in `counts` (see `FAULT_NAMES`).
"""

from __future__ import annotations

import errno
import os
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

PAGE = 4096

# Every fault the file system can inject, by the name used in counts and traces.
FAULT_NAMES = ("enospc_write", "enospc_partial_write", "eio_write", "eio_fsync",
               "enospc_rename", "eio_rename")

_Op = tuple[str, int, bytes]  # ("w", offset, data) or ("t", length, b"")


@dataclass(frozen=True)
class DiskFaults:
    """Per-call probabilities of each injected fault on one node's files."""

    enospc_write: float = 0.0
    eio_write: float = 0.0
    eio_fsync: float = 0.0
    enospc_rename: float = 0.0
    eio_rename: float = 0.0

    @property
    def any(self) -> bool:
        return any((self.enospc_write, self.eio_write, self.eio_fsync, self.enospc_rename,
                    self.eio_rename))


NO_FAULTS = DiskFaults()


@dataclass
class _Inode:
    ino: int
    data: bytearray = field(default_factory=bytearray)
    durable: bytearray = field(default_factory=bytearray)
    pending: list[_Op] = field(default_factory=list)


@dataclass
class _Dir:
    entries: dict[str, _Inode] = field(default_factory=dict)
    durable: dict[str, _Inode] = field(default_factory=dict)
    # Unsynced name operations, oldest first; each a list of (name, inode or
    # None) assignments applied together.
    pending: list[list[tuple[str, _Inode | None]]] = field(default_factory=list)


@dataclass
class _Fd:
    inode: _Inode | None  # None: a directory
    path: str
    node: str
    offset: int = 0


def _apply(buf: bytearray, op: _Op) -> None:
    kind, at, data = op
    if kind == "w":
        if at > len(buf):
            buf.extend(bytes(at - len(buf)))
        buf[at:at + len(data)] = data
    elif at < len(buf):
        del buf[at:]
    else:
        buf.extend(bytes(at - len(buf)))


def _oserror(code: int, path: str) -> OSError:
    return OSError(code, f"{os.strerror(code)} (simulated)", path)


class SimFileSystem:
    """The shared in-memory file system of one simulated run. Single-threaded."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._dirs: dict[str, _Dir] = {"/": _Dir()}
        self._fds: dict[int, _Fd] = {}
        self._next_fd = 3
        self._next_ino = 1
        self._locks: dict[int, int] = {}  # inode number -> fd holding the lock
        self._faults: dict[str, DiskFaults] = {}
        self._full: set[str] = set()  # nodes whose next write fails (after a partial one)
        self.counts: Counter[str] = Counter()
        self._node_counts: Counter[str] = Counter()
        # Called with the destination after every successful replace (the
        # harness checks what checkpoints and hard states claim).
        self.on_replace: Callable[[str], None] | None = None
        # Told when the storage engine asks to drop unsynced bytes from the
        # page cache (the harness fails the run); unset, that raises.
        self.on_unsynced_drop: Callable[[str], None] | None = None
        self.cache_drops = 0

    # ------------------------------------------------------------- harness

    def node_faults(self, prefix: str) -> int:
        """How many faults were injected on the node owning `prefix` so far."""
        return self._node_counts[os.path.normpath(prefix)]

    def set_faults(self, prefix: str, faults: DiskFaults) -> None:
        """Inject faults on the files under `prefix` (a node's data directory)."""
        self._faults[os.path.normpath(prefix)] = faults

    def _node(self, path: str) -> str:
        for prefix in self._faults:
            if path == prefix or path.startswith(prefix + "/"):
                return prefix
        return ""

    def _roll(self, node: str, name: str) -> bool:
        faults = self._faults.get(node)
        if faults is None or not faults.any:
            return False
        rate = getattr(faults, name)
        if rate and self._rng.random() < rate:
            self.counts[name] += 1
            self._node_counts[node] += 1
            return True
        return False

    def kill(self, prefix: str) -> None:
        """The node's process exited: its descriptors (and locks) are closed;
        the page cache, and so every write, stays."""
        prefix = os.path.normpath(prefix)
        for fd in [fd for fd, f in self._fds.items() if f.node == prefix]:
            self._close(fd)

    def crash(self, prefix: str, rng: random.Random) -> dict[str, int]:
        """A power cut of the node owning `prefix`: its open files are gone and
        its files and names keep what is durable plus a seeded prefix of the
        rest (see the module docstring). Returns what was lost, for the trace."""
        prefix = os.path.normpath(prefix)
        lost = Counter[str]()
        for fd in [fd for fd, f in self._fds.items() if f.node == prefix]:
            self._close(fd)
        self._full.discard(prefix)
        inodes: dict[int, _Inode] = {}
        for path, d in self._dirs.items():
            if not (path == prefix or path.startswith(prefix + "/")):
                continue
            keep = rng.randint(0, len(d.pending))
            lost["name_ops"] += len(d.pending) - keep
            names = dict(d.durable)
            for name_op in d.pending[:keep]:
                for name, inode in name_op:
                    if inode is None:
                        names.pop(name, None)
                    else:
                        names[name] = inode
            d.entries, d.durable, d.pending = names, dict(names), []
            for inode in names.values():
                inodes[inode.ino] = inode
        for ino in sorted(inodes):
            inode = inodes[ino]
            content = inode.durable
            ops = inode.pending
            keep = rng.randint(0, len(ops))
            for op in ops[:keep]:
                _apply(content, op)
            if keep < len(ops):
                lost["data_ops"] += len(ops) - keep
                kind, at, data = ops[keep]
                if kind == "w":
                    lost["torn_pages"] += self._torn(content, at, data, rng)
            inode.data, inode.durable, inode.pending = bytearray(content), content, []
        return dict(lost)

    @staticmethod
    def _torn(content: bytearray, at: int, data: bytes, rng: random.Random) -> int:
        """Apply the pages of a write that a crash cut, each with even odds;
        returns how many pages were dropped."""
        dropped = 0
        start = at
        end = at + len(data)
        while start < end:
            stop = min(end, (start // PAGE + 1) * PAGE)
            if rng.random() < 0.5:
                _apply(content, ("w", start, data[start - at:stop - at]))
            else:
                dropped += 1
            start = stop
        return dropped

    def durable_slice(self, path: str, offset: int, length: int) -> bytes | None:
        """Bytes of `path` a power cut now would certainly keep (None: the
        name itself is not durable)."""
        d, name, _ = self._split(path)
        inode = d.durable.get(name)
        if inode is None:
            return None
        return bytes(inode.durable[offset:offset + length])

    def volatile_slice(self, path: str, offset: int, length: int) -> bytes | None:
        """Bytes of `path` as reads see them (None: no such file)."""
        d, name, _ = self._split(path)
        inode = d.entries.get(name)
        return None if inode is None else bytes(inode.data[offset:offset + length])

    def files(self, prefix: str) -> dict[str, bytes]:
        """Every file under `prefix` as reads see it (tests, debugging)."""
        prefix = os.path.normpath(prefix)
        out = {}
        for path, d in self._dirs.items():
            if path == prefix or path.startswith(prefix + "/"):
                for name, inode in d.entries.items():
                    out[os.path.join(path, name)] = bytes(inode.data)
        return out

    # ------------------------------------------------------------- helpers

    def _split(self, path: str) -> tuple[_Dir, str, str]:
        path = os.path.normpath(path)
        parent, name = os.path.split(path)
        d = self._dirs.get(parent)
        if d is None:
            raise _oserror(errno.ENOENT, path)
        return d, name, path

    def _fd(self, fd: int) -> _Fd:
        f = self._fds.get(fd)
        if f is None:
            raise _oserror(errno.EBADF, str(fd))
        return f

    def _file(self, fd: int) -> tuple[_Fd, _Inode]:
        f = self._fd(fd)
        if f.inode is None:
            raise _oserror(errno.EISDIR, f.path)
        return f, f.inode

    def _new_fd(self, f: _Fd) -> int:
        fd = self._next_fd
        self._next_fd += 1
        self._fds[fd] = f
        return fd

    def _close(self, fd: int) -> None:
        f = self._fds.pop(fd)
        if f.inode is not None and self._locks.get(f.inode.ino) == fd:
            del self._locks[f.inode.ino]

    @staticmethod
    def _name_op(d: _Dir, op: list[tuple[str, _Inode | None]]) -> None:
        for name, inode in op:
            if inode is None:
                d.entries.pop(name, None)
            else:
                d.entries[name] = inode
        d.pending.append(op)

    # ------------------------------------------------------------ FileSystem

    def open(self, path: str, flags: int, mode: int = 0o777) -> int:
        path = os.path.normpath(path)
        node = self._node(path)
        if flags & os.O_DIRECTORY:
            if path not in self._dirs:
                raise _oserror(errno.ENOENT, path)
            return self._new_fd(_Fd(None, path, node))
        d, name, path = self._split(path)
        if path in self._dirs:
            raise _oserror(errno.EISDIR, path)
        inode = d.entries.get(name)
        if inode is None:
            if not flags & os.O_CREAT:
                raise _oserror(errno.ENOENT, path)
            inode = _Inode(self._next_ino)
            self._next_ino += 1
            self._name_op(d, [(name, inode)])
        elif flags & os.O_TRUNC and inode.data:
            del inode.data[:]
            inode.pending.append(("t", 0, b""))
        return self._new_fd(_Fd(inode, path, node))

    def close(self, fd: int) -> None:
        self._fd(fd)
        self._close(fd)

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        f, inode = self._file(fd)
        node = f.node
        if node in self._full:
            # The disk full that an injected short write announced: counted
            # as the node's injected fault too, since it may come in a later
            # incarnation (a restart's first write: seed 16001537).
            self._full.discard(node)
            self._node_counts[node] += 1
            raise _oserror(errno.ENOSPC, f.path)
        data = bytes(data)
        if self._roll(node, "enospc_write"):
            if len(data) < 2 or self._rng.random() < 0.5:
                raise _oserror(errno.ENOSPC, f.path)
            # A short write; the next write of this node finds the disk full.
            self.counts["enospc_partial_write"] += 1
            self._full.add(node)
            data = data[:self._rng.randint(1, len(data) - 1)]
        elif self._roll(node, "eio_write"):
            raise _oserror(errno.EIO, f.path)
        op = ("w", offset, data)
        _apply(inode.data, op)
        inode.pending.append(op)
        return len(data)

    def pread(self, fd: int, length: int, offset: int) -> bytes:
        _, inode = self._file(fd)
        return bytes(inode.data[offset:offset + length])

    def write(self, fd: int, data: bytes) -> int:
        f, _ = self._file(fd)
        n = self.pwrite(fd, data, f.offset)
        f.offset += n
        return n

    def ftruncate(self, fd: int, length: int) -> None:
        _, inode = self._file(fd)
        op = ("t", length, b"")
        _apply(inode.data, op)
        inode.pending.append(op)

    def fsync(self, fd: int) -> None:
        f = self._fd(fd)
        if f.inode is None:
            if self._roll(f.node, "eio_fsync"):
                raise _oserror(errno.EIO, f.path)
            d = self._dirs[f.path]
            d.durable, d.pending = dict(d.entries), []
            return
        self.fdatasync(fd)

    def fdatasync(self, fd: int) -> None:
        f, inode = self._file(fd)
        if self._roll(f.node, "eio_fsync"):
            inode.pending = []  # the pages are clean now, and never written
            raise _oserror(errno.EIO, f.path)
        for op in inode.pending:
            _apply(inode.durable, op)
        inode.pending = []

    def drop_cache(self, fd: int, offset: int, length: int) -> None:
        """Nothing to drop in memory; checks the storage engine's promise
        that it only ever drops synced bytes (whose pages are clean)."""
        f, inode = self._file(fd)
        end = offset + length
        for kind, at, data in inode.pending:
            if at < end and (kind == "t" or at + len(data) > offset):
                text = (f"asked to drop [{offset}, {end}) of {f.path} from the page cache,"
                        f" but an unsynced {'write' if kind == 'w' else 'truncation'} at {at}"
                        f" is in it")
                if self.on_unsynced_drop is None:
                    raise AssertionError(text)
                self.on_unsynced_drop(text)
                return
        self.cache_drops += 1

    def dup(self, fd: int) -> int:
        f = self._fd(fd)
        return self._new_fd(_Fd(f.inode, f.path, f.node))

    def size(self, fd: int) -> int:
        _, inode = self._file(fd)
        return len(inode.data)

    def _new_name(self, src: str, dst: str) -> tuple[_Dir, str, _Dir, str, _Inode]:
        """What a rename or a link of `src` as `dst` works on: the source's
        directory, name and inode, the target's directory and name (the
        injected faults of a name operation drawn first)."""
        sd, sname, src = self._split(src)
        dd, dname, dst = self._split(dst)
        node = self._node(src)
        if self._roll(node, "enospc_rename"):
            raise _oserror(errno.ENOSPC, dst)
        if self._roll(node, "eio_rename"):
            raise _oserror(errno.EIO, dst)
        inode = sd.entries.get(sname)
        if inode is None:
            raise _oserror(errno.ENOENT, src)
        return sd, sname, dd, dname, inode

    def replace(self, src: str, dst: str) -> None:
        sd, sname, dd, dname, inode = self._new_name(src, dst)
        if sd is dd:
            self._name_op(sd, [(dname, inode), (sname, None)])
        else:
            # Two directories, two operations, each kept or lost on its own
            # (ext4 without a journal): the storage engine moves files
            # across directories with `link` instead (`disk.move_across`).
            self._name_op(dd, [(dname, inode)])
            self._name_op(sd, [(sname, None)])
        if self.on_replace is not None:
            self.on_replace(os.path.normpath(dst))

    def link(self, src: str, dst: str) -> None:
        _, _, dd, dname, inode = self._new_name(src, dst)
        if dname in dd.entries:
            raise _oserror(errno.EEXIST, dst)
        self._name_op(dd, [(dname, inode)])

    def remove(self, path: str) -> None:
        d, name, path = self._split(path)
        if name not in d.entries:
            raise _oserror(errno.ENOENT, path)
        self._name_op(d, [(name, None)])

    def listdir(self, path: str) -> list[str]:
        path = os.path.normpath(path)
        d = self._dirs.get(path)
        if d is None:
            raise _oserror(errno.ENOENT, path)
        subdirs = [os.path.basename(p) for p in self._dirs
                   if p != path and os.path.dirname(p) == path]
        return sorted([*d.entries, *subdirs])

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        path = os.path.normpath(path)
        if path in self._dirs:
            if not exist_ok:
                raise _oserror(errno.EEXIST, path)
            return
        parent = os.path.dirname(path)
        if parent not in self._dirs:
            self.makedirs(parent, exist_ok=True)
        if os.path.basename(path) in self._dirs[parent].entries:
            raise _oserror(errno.EEXIST, path)
        self._dirs[path] = _Dir()

    def isdir(self, path: str) -> bool:
        return os.path.normpath(path) in self._dirs

    def rmtree(self, path: str) -> None:
        path = os.path.normpath(path)
        for p in [p for p in self._dirs if p == path or p.startswith(path + "/")]:
            del self._dirs[p]

    def lock(self, fd: int) -> None:
        f, inode = self._file(fd)
        holder = self._locks.get(inode.ino)
        if holder is not None and holder != fd:
            raise BlockingIOError(errno.EWOULDBLOCK, "lock held (simulated)", f.path)
        self._locks[inode.ino] = fd

    def read_file(self, path: str) -> bytes | None:
        try:
            d, name, _ = self._split(path)
        except FileNotFoundError:
            return None
        inode = d.entries.get(name)
        return None if inode is None else bytes(inode.data)
