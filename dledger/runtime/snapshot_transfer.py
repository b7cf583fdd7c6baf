"""Snapshot transfer: the leader streams a snapshot and the log under it to a follower.

When the core asks for an `InstallSnapshot` to a follower whose next entries
were deleted by retention, the leader's runtime first ships the files the
follower needs to install it, then sends the core's message. This module is
both ends of that stream; `node.RaftGroupNode` wires them to the core and the
transport (docs/raft.md, "Snapshot transfer").

What travels: the snapshot's `state` file, then every CommitLog segment from
the leader's first one up to the one holding the snapshot's last entry (that
one only up to `end_position`), as one byte stream in manifest order. The
follower stages them under `<data_dir>/install.tmp/` (`state`,
`commitlog/<base>`), named exactly as on the leader, so after the install
both replicas hold byte-identical files at the same positions.

Messages (runtime-level, on the replication channel, never stepped into the
core; `codec.py` encodes them):

- `SnapshotOffer`: the manifest — which snapshot (index, term, end
  position), the first index of the first segment, the state file's CRC and
  every file's name and size. The follower refuses an offer it cannot hold
  (bad manifest, more bytes than it allows or has free) and otherwise
  answers with the stream offset it already holds: 0, or what an earlier
  interrupted transfer of the very same manifest staged (resume).
- `SnapshotChunk`: `data` of `file` at `offset` with its crc32c; `last` marks
  the stream's final chunk. Chunks never span files and carry at most
  `CHUNK_BYTES_MAX` bytes.
- `SnapshotAck`: the stream offset the follower has staged (cumulative), or
  `ok=False` with a reason, which ends the transfer.

Flow control and loss: the sender keeps at most `window_bytes` un-acked.
A chunk that does not continue the staged prefix is not written; the
follower re-acks its offset, and the sender, seeing an ack that does not
move while chunks are out, goes back to it (once per offset: a window of
out-of-order chunks produces several such acks). With no progress for
`retransmit_s` it goes back too (a lost ack or a lost last chunk); with none
for `stall_s` the transfer is abandoned and the node reports the snapshot
failed to the core, which retries it later (a new offer, which may resume).

Bounded resources: the follower writes each chunk at once (no buffering), to
one open file at a time, and never more than the manifest announced; the
manifest's total is capped by `max_bytes` and the disk's free space. The
leader holds one open descriptor per file sent (opened at the start, so
retention deleting a segment meanwhile does not disturb the transfer) and
reads a chunk only when the window allows it.

Every file call goes through `commitlog.fileio`, so the real-node simulator
runs this code on its simulated disks.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from crc32c import crc32c

from commitlog import CommitLog, fileio
from commitlog.disk import atomic_replace, move_across, read_exact, sync_fd
from commitlog.file_queue import file_name
from commitlog.snapshot import (
    SnapshotInfo,
    adopt_snapshot,
    latest_snapshot,
    snapshot_path,
    sync_snapshot_names,
)
from dledger.messages import CHANNEL_REPLICATION, Message

# A chunk's payload as sent, and the most a follower accepts in one.
CHUNK_BYTES = 512 * 1024
CHUNK_BYTES_MAX = 1024 * 1024
# Un-acked bytes in flight per transfer.
WINDOW_BYTES = 4 * CHUNK_BYTES
# No ack that moves the stream for this long: go back to the acked offset.
RETRANSMIT_S = 2.0
# No ack that moves the stream for this long: abandon the transfer.
STALL_S = 10.0
# The most files one manifest may name (the state + segments).
MANIFEST_FILES_MAX = 1 << 16
# A refusal's reason is cut to this many characters.
REASON_MAX = 200

STAGING_DIR = "install.tmp"
MANIFEST_FILE = "manifest"
STATE_FILE = "state"
SEGMENT_DIR = "commitlog"
_SEGMENT_NAME = re.compile(r"commitlog/[0-9]{20}")


def valid_file_name(name: str) -> bool:
    """Whether `name` may appear in a transfer: the state file or a segment
    named by its 20-digit base (nothing else can reach the staging directory)."""
    return name == STATE_FILE or _SEGMENT_NAME.fullmatch(name) is not None


def segment_base(name: str) -> int:
    """The start position of segment `name` ("commitlog/<base>")."""
    return int(name[len(SEGMENT_DIR) + 1:])


# ------------------------------------------------------------------ messages


@dataclass(slots=True, unsafe_hash=True)
class SnapshotOffer(Message):
    """The leader's manifest of a transfer (see the module docstring)."""

    transfer: int        # the sender's id of this attempt; echoed by every ack
    index: int           # the snapshot's last index
    snap_term: int       # and its term
    end_position: int    # CommitLog position just past that entry
    first_index: int     # index of the first entry of the first segment sent
    state_crc: int       # crc32c of the whole state file
    files: tuple[tuple[str, int], ...]  # (name, size) in stream order

    channel: ClassVar[str] = CHANNEL_REPLICATION
    from_leader: ClassVar[bool] = True

    @property
    def total(self) -> int:
        return sum(size for _, size in self.files)


@dataclass(slots=True, unsafe_hash=True)
class SnapshotChunk(Message):
    """`data` of `file` at byte `offset`; `crc` is crc32c(data)."""

    transfer: int
    index: int
    file: str
    offset: int
    data: bytes
    crc: int
    last: bool

    channel: ClassVar[str] = CHANNEL_REPLICATION
    from_leader: ClassVar[bool] = True


@dataclass(slots=True, unsafe_hash=True)
class SnapshotAck(Message):
    """Stream bytes staged so far, or a refusal (`ok=False`, `reason`)."""

    transfer: int
    index: int
    offset: int
    ok: bool
    reason: str = ""

    channel: ClassVar[str] = CHANNEL_REPLICATION


TRANSFER_MESSAGES = (SnapshotOffer, SnapshotChunk, SnapshotAck)


# -------------------------------------------------------------------- sender


@dataclass(frozen=True, slots=True)
class Source:
    """One file to send: its transfer name, an open descriptor, the bytes to send."""

    name: str
    fd: int
    size: int


class SourceUnavailable(Exception):
    """The leader cannot send this snapshot (its files are gone or do not match)."""


def open_sources(state_path: str, segment_dir: str, segment_bases: Sequence[int],
                 segment_size: int, end_position: int) -> list[Source]:
    """Open the state file and the segments up to `end_position`, in stream order.

    `segment_bases` are the log's current segments (sorted); every segment
    from the first up to the one holding byte `end_position - 1` is sent, the
    last one only up to `end_position`. Descriptors are opened read-only at
    once: a segment deleted by retention afterwards stays readable. Raises
    `SourceUnavailable` if a needed file is missing.
    """
    if end_position <= 0:
        raise SourceUnavailable(f"end position {end_position}: nothing to send")
    last_base = (end_position - 1) // segment_size * segment_size
    bases = [b for b in segment_bases if b <= last_base]
    if not bases or bases[-1] != last_base:
        raise SourceUnavailable(f"the segment holding position {end_position - 1} is gone "
                                f"(segments {list(segment_bases)[:4]}...)")
    for a, b in itertools.pairwise(bases):
        if b != a + segment_size:
            raise SourceUnavailable(f"segments {a} and {b} are not contiguous")
    sources: list[Source] = []
    try:
        sources.append(_open(STATE_FILE, state_path, None))
        for base in bases:
            limit = end_position - base if base == last_base else None
            sources.append(_open(f"{SEGMENT_DIR}/{file_name(base)}",
                                 os.path.join(segment_dir, file_name(base)), limit))
    except BaseException:
        close_sources(sources)
        raise
    return sources


def _open(name: str, path: str, limit: int | None) -> Source:
    try:
        fd = fileio.fs.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise SourceUnavailable(f"{path} is gone") from exc
    size = fileio.fs.size(fd)
    if limit is not None:
        if size < limit:
            fileio.fs.close(fd)
            raise SourceUnavailable(f"{path} holds {size} bytes, the snapshot ends at {limit}")
        size = limit
    return Source(name, fd, size)


def close_sources(sources: Sequence[Source]) -> None:
    for source in sources:
        # Closing a read-only descriptor loses nothing, whatever it says.
        with contextlib.suppress(OSError):
            fileio.fs.close(source.fd)


class SnapshotSender:
    """One transfer to one follower (leader side). Loop thread only.

    `start` gives the offer; `on_ack` and `poll` (call it every tick) give
    the chunks the window allows. `done` once every byte is acked (then send
    the core's InstallSnapshot), `failed` (a reason) once refused or stalled;
    either way `close` the descriptors.
    """

    def __init__(self, src: int, dst: int, term: int, transfer: int, index: int,
                 snap_term: int, end_position: int, first_index: int, state_crc: int,
                 sources: Sequence[Source], now: float, *, chunk_bytes: int = CHUNK_BYTES,
                 window_bytes: int = WINDOW_BYTES, retransmit_s: float = RETRANSMIT_S,
                 stall_s: float = STALL_S) -> None:
        if not 0 < chunk_bytes <= CHUNK_BYTES_MAX:
            raise ValueError(f"chunk_bytes must be in (0, {CHUNK_BYTES_MAX}]")
        self.src, self.dst, self.term, self.transfer = src, dst, term, transfer
        self.index, self.snap_term, self.end_position = index, snap_term, end_position
        self.first_index = first_index
        self.sources = list(sources)
        self.offer = SnapshotOffer(src, dst, term, transfer, index, snap_term, end_position,
                                   first_index, state_crc,
                                   tuple((s.name, s.size) for s in self.sources))
        self.total = self.offer.total
        self._starts: list[int] = []
        at = 0
        for s in self.sources:
            self._starts.append(at)
            at += s.size
        self.chunk_bytes = chunk_bytes
        self.window_bytes = max(window_bytes, chunk_bytes)
        self.retransmit_s = retransmit_s
        self.stall_s = stall_s
        self.started_at = now
        self.accepted = False   # the follower answered the offer
        self.acked = 0          # stream bytes the follower staged
        self.sent = 0           # next stream byte to send
        self.resumed_from = 0   # what the follower already held at the offer
        self.bytes_sent = 0     # chunk bytes sent, resends included
        self.resends = 0
        self._progress_at = now
        self._offer_at = now
        self._rewound_at = -1   # the offset a duplicate ack last sent us back to
        self._timeout_at = now  # when a retransmit timeout last sent us back
        self.failed: str | None = None
        self.closed = False

    @property
    def done(self) -> bool:
        return self.accepted and self.acked == self.total and self.failed is None

    def start(self) -> SnapshotOffer:
        return self.offer

    def on_ack(self, ack: SnapshotAck, now: float) -> list[Message]:
        """Take the follower's answer; returns what to send next."""
        if ack.transfer != self.transfer or self.failed is not None or self.done:
            return []
        if not ack.ok:
            self.failed = f"refused by node {ack.src}: {ack.reason}"
            return []
        if ack.offset > self.total or (self.accepted and ack.offset > self.sent):
            self.failed = (f"node {ack.src} acked byte {ack.offset}, only {self.sent} of "
                           f"{self.total} sent")
            return []
        if not self.accepted:
            self.accepted = True
            self.acked = self.sent = self.resumed_from = ack.offset
            self._progress_at = now
        elif ack.offset > self.acked:
            self.acked = ack.offset
            self._progress_at = now
        elif ack.offset == self.acked < self.sent and self._rewound_at != self.acked:
            # The follower holds nothing past `acked`: what we sent after it
            # was lost or came out of order. Go back once for this offset.
            self._rewind()
        return self.poll(now)

    def _rewind(self) -> None:
        self.resends += 1
        self._rewound_at = self.acked
        self.sent = self.acked

    def poll(self, now: float) -> list[Message]:
        """Chunks the window allows now; detects stalls and lost acks."""
        if self.failed is not None or self.done:
            return []
        if now - self._progress_at > self.stall_s:
            self.failed = (f"no progress from node {self.dst} for {self.stall_s:g} s "
                           f"({self.acked} of {self.total} bytes acked)")
            return []
        if not self.accepted:
            if now - self._offer_at > self.retransmit_s:
                self._offer_at = now
                return [self.offer]
            return []
        if self.sent > self.acked and \
                now - max(self._progress_at, self._timeout_at) > self.retransmit_s:
            # Nothing moved for a while: the chunk after `acked`, or its
            # ack, was lost. Send from `acked` again.
            self.resends += 1
            self.sent = self.acked
            self._timeout_at = now
        out: list[Message] = []
        while self.sent < self.total and self.sent - self.acked < self.window_bytes:
            out.append(self._chunk())
        return out

    def _chunk(self) -> SnapshotChunk:
        k = self._file_at(self.sent)
        source, start = self.sources[k], self._starts[k]
        offset = self.sent - start
        n = min(self.chunk_bytes, source.size - offset)
        data = read_exact(source.fd, offset, n)
        if len(data) != n:
            # Segments below a snapshot are immutable; a short read means
            # the file was cut under us: this transfer cannot be trusted.
            raise SourceUnavailable(f"{source.name}: read {len(data)} of {n} bytes at {offset}")
        self.sent += n
        self.bytes_sent += n
        return SnapshotChunk(self.src, self.dst, self.term, self.transfer, self.index,
                             source.name, offset, data, crc32c(data), self.sent == self.total)

    def _file_at(self, position: int) -> int:
        # Files are few (the state + the retained segments): a linear scan
        # from the end finds the current one in a step or two.
        for k in range(len(self._starts) - 1, -1, -1):
            if self._starts[k] <= position and self.sources[k].size:
                return k
        raise AssertionError(f"no file at stream position {position}")

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            close_sources(self.sources)


# ------------------------------------------------------------------ receiver


@dataclass(frozen=True, slots=True)
class StagedInstall:
    """A complete, verified transfer waiting in the staging directory."""

    index: int
    snap_term: int
    end_position: int
    first_index: int
    state_path: str
    state_crc: int
    state_bytes: int
    commitlog_dir: str
    segments: tuple[tuple[int, int], ...]  # (base, size)
    total: int


@dataclass
class _Incoming:
    offer: SnapshotOffer
    starts: list[int]
    staged: int = 0
    fd: int | None = None
    file: int = -1          # index in offer.files of the open fd
    state_crc: int = 0      # running crc32c of the state file
    complete: bool = False


def free_bytes(path: str) -> int | None:
    """Free space of the file system holding `path`; None when the storage
    runs on a simulated file system (nodesim), which has no such notion."""
    if fileio.fs is not fileio.OS:
        return None
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def check_offer(offer: SnapshotOffer, segment_size: int) -> str | None:
    """Why `offer`'s manifest cannot be installed, or None: a state file
    first, then contiguous segments on this log's grid, each within a
    segment, the last ending at `end_position`."""
    files = offer.files
    if not files or files[0][0] != STATE_FILE:
        return "the manifest does not start with the state file"
    if len(files) < 2:
        return "the manifest names no segment"
    if not 1 <= offer.first_index <= offer.index:
        return f"first index {offer.first_index} outside [1, {offer.index}]"
    previous = -1
    for name, size in files[1:]:
        if not valid_file_name(name) or name == STATE_FILE:
            return f"bad file name {name!r}"
        base = segment_base(name)
        if base % segment_size:
            return f"segment {base} is off this log's {segment_size}-byte grid"
        if previous >= 0 and base != previous + segment_size:
            return f"segment {base} does not follow segment {previous}"
        if not 0 < size <= segment_size:
            return f"segment {base} announced with {size} bytes"
        previous = base
    last_base, last_size = segment_base(files[-1][0]), files[-1][1]
    if last_base + last_size != offer.end_position:
        return (f"the segments end at {last_base + last_size}, the snapshot at "
                f"{offer.end_position}")
    return None


class SnapshotReceiver:
    """The follower's staging of one incoming transfer. Loop thread only.

    `on_offer` / `on_chunk` return the ack to send. Once the stream is
    complete (every byte written, the state file's CRC checked) `staged()`
    describes it until `discard()` or `take()`; an install consumes it.
    """

    def __init__(self, data_dir: str, segment_size: int, max_bytes: int,
                 free: Callable[[str], int | None] = free_bytes) -> None:
        self.data_dir = data_dir
        self.directory = os.path.join(data_dir, STAGING_DIR)
        self.segment_size = segment_size
        self.max_bytes = max_bytes
        self._free = free
        self._in: _Incoming | None = None
        self.refused: dict[str, int] = {}
        self.bytes_received = 0

    @property
    def active(self) -> SnapshotOffer | None:
        return self._in.offer if self._in is not None else None

    def _ack(self, msg: SnapshotOffer | SnapshotChunk, offset: int, reason: str = "") \
            -> SnapshotAck:
        return SnapshotAck(msg.dst, msg.src, msg.term, msg.transfer, msg.index, offset,
                           not reason, reason[:REASON_MAX])

    def _refuse(self, msg: SnapshotOffer | SnapshotChunk, reason: str, kind: str) \
            -> SnapshotAck:
        self.refused[kind] = self.refused.get(kind, 0) + 1
        return self._ack(msg, 0, reason)

    def on_offer(self, offer: SnapshotOffer) -> SnapshotAck:
        cur = self._in
        if cur is not None and _same_manifest(cur.offer, offer):
            # The same files offered again (a retry, maybe by another
            # leader): keep what is staged, adopt the new sender's ids.
            cur.offer = offer
            return self._ack(offer, cur.staged)
        self.discard()
        why = check_offer(offer, self.segment_size)
        if why is not None:
            return self._refuse(offer, f"bad manifest: {why}", "manifest")
        total = offer.total
        if total > self.max_bytes:
            return self._refuse(offer, f"{total} bytes offered, at most {self.max_bytes} "
                                "accepted", "too_large")
        free = self._free(self.data_dir)
        if free is not None and total > free:
            return self._refuse(offer, f"{total} bytes offered, {free} free on disk",
                                "disk_space")
        fileio.fs.rmtree(self.directory)
        fileio.fs.makedirs(os.path.join(self.directory, SEGMENT_DIR), exist_ok=True)
        starts, at = [], 0
        for _, size in offer.files:
            starts.append(at)
            at += size
        self._in = _Incoming(offer, starts)
        self._open_through(self._in)
        return self._ack(offer, 0)

    def on_chunk(self, chunk: SnapshotChunk) -> SnapshotAck | None:
        cur = self._in
        if cur is None or (cur.offer.src, cur.offer.term, cur.offer.transfer) != (
                chunk.src, chunk.term, chunk.transfer):
            # Not the transfer in progress (an old attempt's leftovers, or
            # staging was discarded): tell the sender so it stops.
            return self._refuse(chunk, "no such transfer in progress", "unknown_transfer")
        offer = cur.offer
        names = [name for name, _ in offer.files]
        if chunk.file not in names:
            return self._abort(chunk, f"{chunk.file!r} is not in the manifest", "forged")
        k = names.index(chunk.file)
        size = offer.files[k][1]
        n = len(chunk.data)
        if n == 0 or n > CHUNK_BYTES_MAX or chunk.offset + n > size:
            return self._abort(chunk, f"{n} bytes at {chunk.offset} of {chunk.file}, which "
                               f"holds {size}", "forged")
        if crc32c(chunk.data) != chunk.crc:
            return self._abort(chunk, f"bad CRC of {chunk.file} at {chunk.offset}", "forged")
        position = cur.starts[k] + chunk.offset
        if chunk.last != (position + n == offer.total):
            return self._abort(chunk, "misplaced end of stream", "forged")
        if cur.complete or position != cur.staged:
            # A duplicate, or a chunk after a lost one: not written; the
            # ack of what is staged tells the sender where to resume.
            self.refused["out_of_order"] = self.refused.get("out_of_order", 0) + 1
            return self._ack(chunk, cur.staged)
        self._write(cur, k, chunk.offset, chunk.data)
        cur.staged += n
        self.bytes_received += n
        self._open_through(cur)
        if cur.staged == offer.total:
            if cur.state_crc != offer.state_crc:
                return self._abort(chunk, "the state file's CRC does not match the offer",
                                   "forged")
            self._close_fd(cur)
            cur.complete = True
        return self._ack(chunk, cur.staged)

    def _abort(self, chunk: SnapshotChunk, reason: str, kind: str) -> SnapshotAck:
        self.discard()
        return self._refuse(chunk, reason, kind)

    def _open_through(self, cur: _Incoming) -> None:
        """Make the file holding stream byte `staged` the open one, creating
        every (possibly empty) file before it."""
        files = cur.offer.files
        while True:
            k = cur.file
            if k >= 0 and cur.staged < cur.starts[k] + files[k][1]:
                return
            if k + 1 >= len(files):
                return
            self._close_fd(cur)
            cur.file = k + 1
            cur.fd = fileio.fs.open(self._path(files[k + 1][0]),
                                    os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)

    def _write(self, cur: _Incoming, k: int, offset: int, data: bytes) -> None:
        assert cur.fd is not None and cur.file == k
        done = 0
        while done < len(data):
            done += fileio.fs.pwrite(cur.fd, memoryview(data)[done:], offset + done)
        if k == 0:
            cur.state_crc = crc32c(data, cur.state_crc)

    def _close_fd(self, cur: _Incoming) -> None:
        if cur.fd is not None:
            fd, cur.fd = cur.fd, None
            fileio.fs.close(fd)

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, *name.split("/"))

    def staged(self, index: int, snap_term: int, end_position: int) -> StagedInstall | None:
        """The complete transfer of exactly this snapshot, or None."""
        cur = self._in
        if cur is None or not cur.complete:
            return None
        o = cur.offer
        if (o.index, o.snap_term, o.end_position) != (index, snap_term, end_position):
            return None
        return StagedInstall(
            index=o.index, snap_term=o.snap_term, end_position=o.end_position,
            first_index=o.first_index, state_path=self._path(STATE_FILE),
            state_crc=o.state_crc, state_bytes=o.files[0][1],
            commitlog_dir=os.path.join(self.directory, SEGMENT_DIR),
            segments=tuple((segment_base(name), size) for name, size in o.files[1:]),
            total=o.total)

    def seal(self, staged: StagedInstall, membership: bytes | None = None) -> None:
        """Make the staged state file durable and record what the staging
        holds, with the configuration in effect at the snapshot's index
        (`dledger.membership.encode`; blocking: run it on a worker). After
        it, a power cut between the log's install and the state's adoption
        finds the state file whole and `finish_interrupted_install` knows
        what to adopt. (The segments are made durable by `CommitLog.install`,
        which verifies them.)"""
        fd = fileio.fs.open(staged.state_path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            sync_fd(fd)
        finally:
            fileio.fs.close(fd)
        atomic_replace(os.path.join(self.directory, MANIFEST_FILE),
                       encode_manifest(staged, membership))

    def discard(self) -> None:
        """Drop the transfer in progress and everything staged."""
        cur, self._in = self._in, None
        if cur is not None:
            self._close_fd(cur)
        if fileio.fs.isdir(self.directory):
            fileio.fs.rmtree(self.directory)

    def forget(self) -> None:
        """The staged files were consumed (installed): forget them without touching disk."""
        cur, self._in = self._in, None
        if cur is not None:
            self._close_fd(cur)


def _same_manifest(a: SnapshotOffer, b: SnapshotOffer) -> bool:
    return (a.index, a.snap_term, a.end_position, a.first_index, a.state_crc, a.files) == \
        (b.index, b.snap_term, b.end_position, b.first_index, b.state_crc, b.files)



# ------------------------------------------------------------ crash recovery

# The sealed manifest of a staged install: magic "LMQT", version, index,
# term, end_position, first_index, state_bytes, state_crc; version 2 then a
# u32 length and the configuration at the index (empty: none); then crc32c
# of everything before it.
_MANIFEST = struct.Struct("<IIQQQQQI")
_MEMBERSHIP_LEN = struct.Struct("<I")
_MANIFEST_CRC = struct.Struct("<I")
MANIFEST_MAGIC = 0x54514D4C  # the bytes "LMQT"
MANIFEST_VERSION = 2
# A configuration is a few hundred bytes; anything longer is not one.
_MEMBERSHIP_MAX = 1 << 20


def encode_manifest(staged: StagedInstall, membership: bytes | None = None) -> bytes:
    body = membership or b""
    head = _MANIFEST.pack(MANIFEST_MAGIC, MANIFEST_VERSION, staged.index, staged.snap_term,
                          staged.end_position, staged.first_index, staged.state_bytes,
                          staged.state_crc) + _MEMBERSHIP_LEN.pack(len(body)) + body
    return head + _MANIFEST_CRC.pack(crc32c(head))


@dataclass(frozen=True, slots=True)
class SealedManifest:
    """What a sealed staging directory holds (see `SnapshotReceiver.seal`)."""

    index: int
    snap_term: int
    end_position: int
    first_index: int
    state_bytes: int
    state_crc: int
    state_path: str
    membership: bytes | None = None


def read_manifest(data_dir: str) -> SealedManifest | None:
    """The sealed manifest of `<data_dir>/install.tmp`, or None if there is
    none or it does not verify (a transfer that never completed)."""
    directory = os.path.join(data_dir, STAGING_DIR)
    raw = fileio.fs.read_file(os.path.join(directory, MANIFEST_FILE))
    if raw is None or len(raw) < _MANIFEST.size + _MANIFEST_CRC.size:
        return None
    body_end = len(raw) - _MANIFEST_CRC.size
    if _MANIFEST_CRC.unpack_from(raw, body_end)[0] != crc32c(raw[:body_end]):
        return None
    magic, version, index, term, end, first, size, crc = _MANIFEST.unpack_from(raw)
    if magic != MANIFEST_MAGIC or version not in (1, 2):
        return None
    membership = None
    if version == 1:
        if body_end != _MANIFEST.size:
            return None
    else:
        if body_end < _MANIFEST.size + _MEMBERSHIP_LEN.size:
            return None
        (length,) = _MEMBERSHIP_LEN.unpack_from(raw, _MANIFEST.size)
        start = _MANIFEST.size + _MEMBERSHIP_LEN.size
        if length > _MEMBERSHIP_MAX or start + length != body_end:
            return None
        membership = raw[start:body_end] or None
    return SealedManifest(index, term, end, first, size, crc,
                          os.path.join(directory, STATE_FILE), membership)


def remove_staging(data_dir: str) -> None:
    directory = os.path.join(data_dir, STAGING_DIR)
    if fileio.fs.isdir(directory):
        fileio.fs.rmtree(directory)


def finish_interrupted_install(log: CommitLog) -> SnapshotInfo | None:
    """At open: make the snapshots' names durable (`sync_snapshot_names`: a
    process that died before syncing one left it visible only), complete an
    install a power cut interrupted, and clear staging.

    The install replaces the log first and adopts the state second (see
    `RaftGroupNode._install_snapshot`). If the log now is exactly what the
    sealed manifest names (the replacement went through) and no snapshot at
    or past its index exists, the state file waiting in staging is adopted,
    after checking it is the one the manifest vouches for. Anything else in
    staging (a transfer that never completed, an install rolled back) is
    deleted. Returns the adopted snapshot, if any.
    """
    data_dir = log.data_dir
    sync_snapshot_names(data_dir)
    adopted = None
    m = read_manifest(data_dir)
    if m is not None and (log.first_index, log.last_index, log.last_term, log.end) == (
            m.first_index, m.index, m.snap_term, m.end_position):
        newest = latest_snapshot(data_dir, verify_state=False)
        if newest is None or newest.index < m.index:
            # The adoption may have moved the state file into the snapshot's
            # directory before its meta was written: take it back first.
            moved = os.path.join(snapshot_path(data_dir, m.index), STATE_FILE)
            if not _holds_state(m.state_path, m) and _holds_state(moved, m):
                move_across(moved, m.state_path)
            if _holds_state(m.state_path, m):
                adopted = adopt_snapshot(data_dir, m.state_path, m.index, m.snap_term,
                                         m.end_position, membership=m.membership)
    remove_staging(data_dir)
    return adopted


def _holds_state(path: str, m: SealedManifest) -> bool:
    state = fileio.fs.read_file(path)
    return state is not None and len(state) == m.state_bytes and crc32c(state) == m.state_crc
