"""The CommitLog: a segmented, append-only log of entries that is also the Raft log.

The log knows Raft indexes and terms only as numbers it stores and checks
(contiguous indexes, non-decreasing terms); it knows nothing of leaders or
votes. Callers give it complete entries, positions included: the leader places
them with `build_entries`, followers append what the leader sent, and both go
through the same checks, so every replica's files are byte-identical.

Durability is explicit: `append` writes to the OS; `begin_sync`/`run_sync`/
`finish_sync` make written bytes durable (the asyncio `Flusher` runs
`run_sync` on a thread so appends continue meanwhile, which is what turns
concurrent appends into one group commit); `durable_index` says how far that
got.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from crc32c import crc32c

from commitlog import fileio, install
from commitlog.checkpoint import (
    Checkpoint,
    HardState,
    read_checkpoint,
    read_hard_state,
    write_checkpoint,
    write_hard_state,
)
from commitlog.config import MIB, CommitLogConfig
from commitlog.disk import (
    CachedRange,
    DirtyFile,
    drop_cached,
    lock_directory,
    sync_and_close,
    sync_directory,
)
from commitlog.entry import HEADER_SIZE, KINDS, Entry, decode_header, encode_header, place
from commitlog.errors import (
    CorruptionError,
    MessageTooLargeError,
    PositionMismatchError,
    StorageError,
)
from commitlog.index_file import IndexFiles, IndexRecord, encode_record
from commitlog.message import StoredMessage, decode_message_at
from commitlog.recovery import RecoveredState, RecoveryReport, recover
from commitlog.segments import SegmentFiles, SegmentInfo

# Names a data directory may hold; anything else is reported, never deleted.
KNOWN_TOP_LEVEL = frozenset(("LOCK", "checkpoint", "hardstate", "commitlog", "index", "ROLLBACK",
                             "consumequeue", "snapshots", "install.tmp", "INSTALL", "IDENTITY"))


@dataclass
class SyncToken:
    """What one sync covers: files to fdatasync and the log state they reach."""

    fds: list[DirtyFile]
    directory_dirty: bool
    index: int
    end: int
    term: int
    generation: int
    # Synced bytes out of the page-cache tail, dropped after the sync.
    cached: list[CachedRange] = dataclasses.field(default_factory=list)
    # Order among the syncs begun (`CommitLog.finish_sync` keeps it).
    seq: int = 0


@dataclass
class CheckpointToken:
    fds: list[DirtyFile]
    checkpoint: Checkpoint
    generation: int
    # An index file was created or removed: its directory is synced too.
    index_directory_dirty: bool = False


class CommitLog:
    """One node's CommitLog. Not thread-safe: use it from one thread (the event
    loop); only `run_sync`/`run_checkpoint` may run elsewhere."""

    def __init__(self, data_dir: str, config: CommitLogConfig) -> None:
        self.data_dir = data_dir
        self.config = config
        self._entry_size_limit = config.entry_size_limit  # the config is frozen
        fileio.fs.makedirs(data_dir, exist_ok=True)
        self._lock_fd = lock_directory(data_dir)
        try:
            # An install a crash interrupted is finished first (the marker
            # means the old log is already being replaced).
            installed = install.roll_forward(data_dir)
            checkpoint = read_checkpoint(data_dir)
            segments, index, state, recovery = self._open_files(
                checkpoint, full=config.verify_on_open == "full")
        except BaseException:
            self._release_lock()  # `_open_files` closed what it opened, unsynced
            raise
        if installed is not None:
            recovery.install_finished = (installed.first_index, installed.last_index)
        self.segments: SegmentFiles = segments
        self.index: IndexFiles = index
        self.recovery = recovery
        self.recovery.foreign_files = self._foreign_files()
        self.first_index = state.first_index
        self.last_index = state.last_index
        self.last_term = state.last_term
        self.end = state.end
        self._generation = 0
        # Syncs begun and not finished (by `SyncToken.seq`), and what those
        # finished before an earlier one reach: (index, end, term, generation).
        # A sync covers only the files and the directory changes it took, so
        # the durable point moves to its end only once every sync begun
        # before it has finished too (finish_sync).
        self._next_sync = 0
        self._syncs_open: set[int] = set()
        self._syncs_done: dict[int, tuple[int, int, int, int]] = {}
        # (generation after the cut, index kept): lets a waiter learn that the
        # entry it waits for was cut (and maybe replaced) meanwhile.
        self._truncations: list[tuple[int, int]] = []
        self.failed: BaseException | None = None
        # The one owner of the checkpoint and hard-state files: every write of
        # either holds this lock (the Flusher's thread writes checkpoints, the
        # loop writes them on truncation and retention), and a checkpoint
        # captured before a truncation is never written after it.
        self._state_files = threading.Lock()
        # Everything recovered is on disk now (a crash without power loss keeps
        # the page cache): make it durable so the checkpoint can cover it.
        # What lies past the old checkpoint was read, not vouched for: its
        # files and names are synced by the flush and the checkpoint below
        # (without this the flush found nothing dirty, the durable point
        # moved to the end anyway, and a power cut after a process crash
        # could take entries this process had called durable). The
        # checkpoint's write syncs the data directory, so the hard state's
        # name is durable too before anyone reads it (tests/commitlog/
        # test_reopen_after_kill.py).
        vouched = checkpoint or Checkpoint()
        segments.files.distrust_from(vouched.durable_end)
        index.files.distrust_from(vouched.durable_index + 1)
        self.durable_index = self.first_index - 1
        self.durable_end = 0
        self.durable_term = 0
        # Positions below this are out of the page cache (or were asked to
        # be): each sync drops what fell out of the cached tail since.
        self._uncached_below = self.segments.bases[0] if self.segments.bases else 0
        try:
            self.flush()
            self.checkpoint()
        except BaseException:
            self.abandon()  # release the directory lock: a retry in this process may open it
            raise

    @classmethod
    def open(cls, data_dir: str, config: CommitLogConfig | None = None) -> CommitLog:
        """Open (creating if needed) and recover the log in `data_dir`."""
        return cls(data_dir, config or CommitLogConfig())

    def _open_files(self, checkpoint: Checkpoint | None, full: bool
                    ) -> tuple[SegmentFiles, IndexFiles, RecoveredState, RecoveryReport]:
        """Open the segment and index files and recover them (closed again on failure)."""
        config = self.config
        segments = SegmentFiles(os.path.join(self.data_dir, "commitlog"),
                                config.segment_size_bytes)
        try:
            index = IndexFiles(os.path.join(self.data_dir, "index"), config.index_file_records)
        except BaseException:
            segments.close()
            raise
        try:
            state, recovery = recover(
                self.data_dir, segments, index, checkpoint,
                config.segment_size_bytes, config.entry_size_limit, full,
            )
        except BaseException:
            segments.close()
            index.close(write_pending=False)
            raise
        return segments, index, state, recovery

    def _foreign_files(self) -> list[str]:
        found = list(self.segments.foreign) + list(self.index.foreign)
        for name in sorted(fileio.fs.listdir(self.data_dir)):
            # diverged-*: kept by a rollback (broker); damaged-*: set aside by
            # `ledgermq node repair` in a data directory that is a mount point.
            if name in KNOWN_TOP_LEVEL or name.endswith((".durable", ".tmp")) \
                    or name.startswith(("diverged-", "damaged-")):
                continue
            found.append(os.path.join(self.data_dir, name))
        return found

    # ----------------------------------------------------------------- writes

    def _check_usable(self) -> None:
        if self.failed is not None:
            raise StorageError(f"commitlog {self.data_dir} failed earlier ({self.failed}); "
                               "restart the node to recover")

    def build_entries(self, term: int, items: Sequence[tuple[int, bytes]]) -> list[Entry]:
        """Place new entries (kind, body) after the current end, as a leader does.

        Nothing is written; pass the result to `append`.
        """
        entries = []
        index, end = self.last_index, self.end
        for kind, body in items:
            index += 1
            position = place(end, HEADER_SIZE + len(body), self.config.segment_size_bytes)
            entries.append(Entry(index, term, kind, position, body))
            end = position + HEADER_SIZE + len(body)
        return entries

    def check_items(self, items: Sequence[tuple[int, bytes]]) -> None:
        """Raise what `append_new` would for these (kind, body) pairs' sizes and
        kinds, so a caller can refuse one request without failing a batch."""
        for kind, body in items:
            size = HEADER_SIZE + len(body)
            if size > self._entry_size_limit:
                raise MessageTooLargeError("entry", size, self._entry_size_limit)
            if kind not in KINDS:
                raise ValueError(f"unknown entry kind {kind}")

    def append(self, entries: Sequence[Entry]) -> None:
        """Write entries after the last one. All are checked before any byte is
        written; if the write fails (e.g. a full disk) nothing of it is kept."""
        self._check_usable()
        if not entries:
            return
        limit = self._entry_size_limit
        index, term, end = self.last_index, self.last_term, self.end
        runs: list[tuple[int, list[bytes]]] = []  # (position, parts) per segment run
        records: list[bytes] = []
        for entry in entries:
            body = entry.body
            size = HEADER_SIZE + len(body)
            if size > limit:
                raise MessageTooLargeError("entry", size, limit)
            if entry.index != index + 1:
                raise PositionMismatchError(f"entry index {entry.index} does not follow {index}")
            if entry.term < term:
                raise PositionMismatchError(f"entry term {entry.term} is below {term}")
            if entry.kind not in KINDS:
                raise ValueError(f"unknown entry kind {entry.kind}")
            position = self._encode(runs, records, entry.index, entry.term, entry.kind, body, end)
            if entry.position != position:
                raise PositionMismatchError(
                    f"entry {entry.index} claims position {entry.position}, placement says "
                    f"{position}: the replicas' segment sizes or logs differ")
            index, term, end = entry.index, entry.term, position + size
        self._write(runs, records, index, term, end)

    def append_new(self, batches: Sequence[tuple[int, Sequence[tuple[int, bytes]]]],
                   checked: bool = False) -> list[int]:
        """Place and write new entries as the log's only writer (no Raft leader
        placing them): `batches` are (term, [(kind, body), ...]); returns the
        index of each batch's last entry. Checked like `append`, and like it
        all or nothing: one write per segment for every batch. `checked=True`:
        every batch's items already passed `check_items` (not checked again)."""
        self._check_usable()
        index, term, end = self.last_index, self.last_term, self.end
        runs: list[tuple[int, list[bytes]]] = []
        records: list[bytes] = []
        lasts = []
        for batch_term, items in batches:
            if batch_term < term:
                raise PositionMismatchError(f"entry term {batch_term} is below {term}")
            if not checked:
                self.check_items(items)
            for kind, body in items:
                index += 1
                end = self._encode(runs, records, index, batch_term, kind, body, end) + (
                    HEADER_SIZE + len(body))
            term = batch_term
            lasts.append(index)
        if runs:
            self._write(runs, records, index, term, end)
        return lasts

    def _encode(self, runs: list[tuple[int, list[bytes]]], records: list[bytes], index: int,
                term: int, kind: int, body: bytes, end: int) -> int:
        """Place an entry after `end`, add its bytes to `runs` and its index
        record to `records`; return its position."""
        segment_size = self.config.segment_size_bytes
        size = HEADER_SIZE + len(body)
        position = end
        if end % segment_size + size > segment_size:
            position = (end // segment_size + 1) * segment_size  # see entry.place
        header, body_crc = encode_header(index, term, kind, position, body)
        # One write per segment: an entry that starts a segment (even one
        # directly after an entry that filled the previous) opens a new run.
        if position != end or position % segment_size == 0 or not runs:
            runs.append((position, []))
        parts = runs[-1][1]
        parts.append(header)
        parts.append(body)
        records.append(encode_record(position, term, size, kind, body_crc))
        return position

    def _write(self, runs: list[tuple[int, list[bytes]]], records: list[bytes],
               index: int, term: int, end: int) -> None:
        """Write encoded entries; on failure cut everything back, then raise."""
        old_end, old_last = self.end, self.last_index
        try:
            for position, run in runs:
                self.segments.write(position, b"".join(run))
            self.index.append(old_last + 1, records)
        except BaseException:
            self.segments.truncate(old_end)
            self.index.truncate_after(old_last)
            raise
        self.last_index, self.last_term, self.end = index, term, end

    def truncate_after(self, index: int) -> None:
        """Remove every entry after `index` (Raft conflict repair).

        The checkpoint is lowered and made durable before any byte is cut, so a
        crash in between cannot make recovery mistake the cut for corruption.
        """
        self._check_usable()
        if index >= self.last_index:
            return
        if index < self.first_index - 1:
            raise ValueError(f"cannot truncate to {index}: the log starts at {self.first_index}")
        if index >= self.first_index:
            record = self._record(index)
            new_end, new_term = record.end, record.term
        else:
            new_end = self.segments.bases[0] if self.segments.bases else 0
            new_term = 0
        with self._state_files:
            if index < self.durable_index:
                # The index records the lowered checkpoint vouches for must be on disk.
                self.index.sync()
                self.durable_index, self.durable_end, self.durable_term = index, new_end, new_term
                write_checkpoint(self.data_dir, self._checkpoint_value())
            # Under the lock: a checkpoint captured before this cut sees the
            # new generation when it comes to write, and drops itself.
            self._generation += 1
        self._truncations.append((self._generation, index))
        del self._truncations[:-64]
        self._uncached_below = min(self._uncached_below, new_end)
        self.segments.truncate(new_end)
        self.index.truncate_after(index)
        self.last_index, self.last_term, self.end = index, new_term, new_end
        # The cut is made durable before anything is written after it. Left to
        # the next periodic sync (flush=async), the entries that replace the cut
        # ones may reach the disk in the next segment file while this file's
        # cut does not: after a power cut the log reads as the old entry
        # followed by the new ones, well formed and wrong, and the follower
        # commits the stale entry when the leader's next append matches past
        # it (the real-node simulator, seed 190 with --membership 1). One
        # fsync per conflict repair, which is rare.
        self.flush()

    def delete_before(self, position: int) -> int:
        """Retention: delete segments wholly before `position`; returns how
        many were deleted. Never the last segment, nothing not yet durable,
        and never the segment holding the last durable entry (recovery
        starts there).

        Crash-safe in this order: segments removed (directory fsynced), index
        files removed, checkpoint rewritten. Recovery takes the first index
        from the first segment, so a crash anywhere in between reopens a
        consistent log starting at whichever segment is first.
        """
        self._check_usable()
        if self.durable_index < self.first_index:
            return 0
        limit = min(position, self.segments.base_of(self.durable_end - 1))
        removed = self.segments.delete_before(limit)
        if not removed:
            return 0
        self.segments.sync_directory()
        head = decode_header(self.segments.read(self.segments.bases[0], HEADER_SIZE))
        if head.problem is not None or head.position != self.segments.bases[0]:
            raise CorruptionError(self.segments.path(self.segments.bases[0]), 0,
                                  f"first entry after retention: {head.problem or 'position'}")
        self.first_index = head.index
        self.index.delete_before(self.first_index)
        self.index.sync()
        with self._state_files:
            write_checkpoint(self.data_dir, self._checkpoint_value())
        return len(removed)

    # --------------------------------------------------------------- install

    def install(self, staged_commitlog_dir: str, first_index: int, last_index: int,
                last_term: int, end: int) -> None:
        """Replace every segment and index file with the staged segments (a
        snapshot install): afterwards the log holds exactly [first_index,
        last_index], durable, the last entry of term `last_term` ending at
        position `end`.

        `staged_commitlog_dir` holds segment files named by their start
        positions, as on the leader, and must be inside the data directory
        (e.g. `<data_dir>/install.tmp/commitlog`): they are moved, not copied.
        They are verified in full first; anything wrong raises
        CorruptionError (or ValueError for bad arguments) and changes
        nothing. From the `INSTALL` marker on, a failure leaves the log
        unusable (`failed`) and the next open finishes the install (see
        `commitlog.install`).
        """
        self._check_usable()
        config = self.config
        staged = os.path.normpath(os.path.abspath(staged_commitlog_dir))
        relative = os.path.relpath(staged, os.path.abspath(self.data_dir))
        if relative.startswith("..") or relative in (".", "commitlog", "index"):
            raise ValueError(f"staged segments must be in a directory of their own inside "
                             f"{self.data_dir}, not {staged_commitlog_dir}")
        if not 1 <= first_index <= last_index or last_term < 1:
            raise ValueError(f"cannot install indexes {first_index}..{last_index} "
                             f"(term {last_term})")
        bases = install.staged_bases(staged, config.segment_size_bytes)
        records, lengths = install.verify_segments(
            staged, bases, config.segment_size_bytes, config.entry_size_limit,
            first_index, last_index, last_term, end, sync=True)
        sync_directory(staged)
        marker = install.InstallMarker(first_index, last_index, last_term, end, relative,
                                       tuple(lengths))
        with self._state_files:
            # A checkpoint or sync captured before now must not land after:
            # it describes the log being replaced.
            self._generation += 1
            install.write_marker(self.data_dir, marker)
        self._truncations.append((self._generation, min(self.last_index, first_index - 1)))
        del self._truncations[:-64]
        self.segments.close()
        self.index.close(write_pending=False)
        try:
            install.move_in(self.data_dir, marker)
            index = IndexFiles(os.path.join(self.data_dir, "index"), config.index_file_records)
            try:
                index.append(first_index, records)
                index.sync()
            finally:
                index.close()
            with self._state_files:
                install.finish(self.data_dir, marker)
            segments, index, state, recovery = self._open_files(
                read_checkpoint(self.data_dir), full=False)
        except BaseException as exc:
            self.failed = exc
            raise
        self.segments, self.index = segments, index
        self.recovery = recovery
        recovery.foreign_files = self._foreign_files()
        if (state.first_index, state.last_index, state.last_term, state.end) != (
                first_index, last_index, last_term, end):
            self.failed = CorruptionError(self.data_dir, end, "installed log reopened as "
                                          f"{state} after its install")
            raise self.failed
        self.first_index, self.last_index, self.last_term, self.end = (
            first_index, last_index, last_term, end)
        self.durable_index, self.durable_end, self.durable_term = last_index, end, last_term
        # The installed segments were written and synced here: the next sync
        # drops what of them lies before the cached tail.
        self._uncached_below = self.segments.bases[0] if self.segments.bases else 0

    # ------------------------------------------------------------------ sizes

    def disk_bytes(self) -> int:
        """Bytes of every segment and index file."""
        self.index.write_pending()
        return sum(self.segments.lengths.values()) + sum(self.index.files.lengths.values())

    def segment_infos(self) -> list[SegmentInfo]:
        """Every segment, oldest first, with its first entry's index and its
        modification time (retention by age, as RocketMQ's fileReservedTime)."""
        infos = []
        for base in list(self.segments.bases):
            head = self.segments.read(base, HEADER_SIZE)
            header = decode_header(head) if len(head) == HEADER_SIZE else None
            if header is None or header.problem or header.position != base:
                why = "short file" if header is None else header.problem or "position mismatch"
                raise CorruptionError(self.segments.path(base), 0, f"first entry: {why}")
            infos.append(SegmentInfo(base, self.segments.lengths[base], header.index,
                                     fileio.mtime_ms(self.segments.path(base))))
        return infos

    # ------------------------------------------------------------ durability

    @property
    def generation(self) -> int:
        """Bumped by every truncation."""
        return self._generation

    def cut_since(self, generation: int) -> int | None:
        """Lowest index kept by a truncation after `generation`, or None."""
        kept = [index for gen, index in self._truncations if gen > generation]
        if generation < self._generation - 64:
            return 0  # too old to know: assume the worst
        return min(kept) if kept else None

    def begin_sync(self) -> SyncToken:
        """Collect what a sync must cover (call on the owning thread)."""
        fds, directory_dirty = self.segments.take_dirty()
        seq, self._next_sync = self._next_sync, self._next_sync + 1
        self._syncs_open.add(seq)
        return SyncToken(fds, directory_dirty, self.last_index, self.end, self.last_term,
                         self._generation, self._take_uncached(), seq)

    def _take_uncached(self) -> list[CachedRange]:
        """The synced bytes that fell out of the cached tail since the last
        call (`config.page_cache_tail_bytes`), once there is at least a MiB
        of them (or the whole tail, if smaller): for the sync to drop.

        Only bytes below `durable_end`: their pages are clean, so dropping
        them costs nothing but a later read. Why drop at all: on this
        project's VM the kernel's cost per written byte grew fivefold once
        ~6.5 GB of pages were cached (docs/architecture.md, "The page
        cache")."""
        tail = self.config.page_cache_tail_bytes
        if not tail:
            return []
        stop = min(self.durable_end, self.end - tail)
        if stop - self._uncached_below < min(MIB, tail):
            return []
        start, self._uncached_below = self._uncached_below, stop
        return self.segments.cached_ranges(start, stop)

    def run_sync(self, token: SyncToken) -> None:
        """fdatasync the token's files; safe to run on another thread."""
        # The directory first: a new segment's name must be durable before the
        # trace may say its bytes are.
        if token.directory_dirty:
            sync_directory(self.segments.directory)
        try:
            sync_and_close(token.fds)
        finally:
            # Not after a truncation since the token was taken: new, unsynced
            # bytes may have taken the cut ones' places.
            drop_cached(token.cached, drop=token.generation == self._generation)

    def finish_sync(self, token: SyncToken, error: BaseException | None = None) -> None:
        """Advance the durable point (call on the owning thread).

        Only as far as every sync begun before this one has finished too: a
        sync begun while an earlier one is still running (the synchronous
        flush of a conflict repair while the Flusher's round is on its
        thread) did not take the files and the directory entries that the
        earlier one took, so its end is durable only once those are (the
        real-node simulator, seed 7000784 on 5 nodes: a new segment's name
        was still unsynced when the hard state claimed its first entry)."""
        self._syncs_open.discard(token.seq)
        if error is not None:
            # A failed fsync may have dropped dirty pages: nothing written since
            # the last good sync can be trusted, so stop accepting writes.
            self.failed = error
            raise StorageError(f"fsync failed in {self.data_dir}: {error}") from error
        self._syncs_done[token.seq] = (token.index, token.end, token.term, token.generation)
        oldest_open = min(self._syncs_open, default=None)
        for seq in sorted(self._syncs_done):
            if oldest_open is not None and seq > oldest_open:
                break
            index, end, term, generation = self._syncs_done.pop(seq)
            if generation == self._generation and index > self.durable_index:
                self.durable_index, self.durable_end, self.durable_term = index, end, term

    def flush(self) -> int:
        """Synchronously fsync everything written; returns durable_index,
        which reaches the end only once every sync begun before this one (a
        Flusher round still on its thread) has finished too (finish_sync)."""
        token = self.begin_sync()
        try:
            self.run_sync(token)
        except OSError as exc:
            self.finish_sync(token, exc)
        self.finish_sync(token)
        return self.durable_index

    def _checkpoint_value(self) -> Checkpoint:
        return Checkpoint(self.durable_index, self.durable_end, self.durable_term,
                          self.first_index)

    def begin_checkpoint(self) -> CheckpointToken:
        return CheckpointToken(self.index.dirty_fds(), self._checkpoint_value(),
                               self._generation, self.index.take_directory_dirty())

    def run_checkpoint(self, token: CheckpointToken) -> bool:
        """Sync the index files, then record the checkpoint (any thread).

        Returns False, writing nothing, when a truncation happened since
        `begin_checkpoint`: the captured value may vouch for entries that are
        gone, and the truncation wrote its own (lowered) checkpoint.
        """
        sync_and_close(token.fds)
        if token.index_directory_dirty:
            # The records' files by name too: recovery trusts the index below
            # the checkpoint, and a new index file's name lost in a power cut
            # (or a removed one back) gave it stale records (the real-node
            # simulator, seed 9101397 on 3 nodes).
            sync_directory(self.index.directory)
        with self._state_files:
            if token.generation != self._generation:
                return False
            checkpoint = token.checkpoint
            if checkpoint.first_index < self.first_index:
                # Retention moved the start meanwhile (it wrote its own checkpoint).
                checkpoint = dataclasses.replace(checkpoint, first_index=self.first_index)
            write_checkpoint(self.data_dir, checkpoint)
            return True

    def checkpoint(self) -> Checkpoint:
        token = self.begin_checkpoint()
        self.run_checkpoint(token)
        return token.checkpoint

    def load_hard_state(self) -> HardState:
        return read_hard_state(self.data_dir) or HardState()

    def save_hard_state(self, state: HardState) -> None:
        """Durably record Raft's term, vote and known commit index (any thread;
        callers serialise their own values, see `RaftGroupNode`)."""
        with self._state_files:
            write_hard_state(self.data_dir, state)

    # ------------------------------------------------------------------ reads

    def _record(self, index: int) -> IndexRecord:
        if not self.first_index <= index <= self.last_index:
            raise IndexError(f"index {index} outside {self.first_index}..{self.last_index}")
        record = self.index.read(index)
        if record is None:
            raise CorruptionError(self.index.directory, index, "index record missing or bad")
        return record

    def entry_end(self, index: int) -> int:
        """Position just past the entry at `index`."""
        if index == self.last_index:
            return self.end
        return self._record(index).end

    def term_at(self, index: int) -> int:
        """Term of the entry at `index`; 0 for index 0."""
        if index == 0:
            return 0
        if index == self.last_index:
            return self.last_term
        return self._record(index).term

    def read_entry(self, index: int) -> Entry:
        return self.read_entries(index, index + 1)[0]

    def read_entries(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        """Entries [lo, hi), stopping once `max_bytes` is reached (at least one
        entry is returned). Every entry is checked before it is returned."""
        if lo < self.first_index or hi > self.last_index + 1 or lo > hi:
            raise IndexError(f"range [{lo}, {hi}) outside {self.first_index}..{self.last_index}")
        records = self.index.read_range(lo, hi)
        if max_bytes is not None:
            total = 0
            for n, record in enumerate(records):
                total += record.size if record else 0
                if total > max_bytes and n > 0:
                    records = records[:n]
                    break
        entries: list[Entry] = []
        run: list[IndexRecord] = []
        for n, record in enumerate(records):
            if record is None:
                raise CorruptionError(self.index.directory, lo + n, "index record missing or bad")
            if run and (record.position != run[-1].end
                        or self.segments.base_of(record.position)
                        != self.segments.base_of(run[0].position)):
                entries += self._read_run(run)
                run = []
            run.append(record)
        if run:
            entries += self._read_run(run)
        return entries

    def _read_run(self, run: list[IndexRecord]) -> list[Entry]:
        start = run[0].position
        raw = self.segments.read(start, run[-1].end - start)
        base = self.segments.base_of(start)
        entries = []
        for record in run:
            at = record.position - start
            path, offset = self.segments.path(base), record.position - base
            if at + record.size > len(raw):
                raise CorruptionError(path, offset, "entry missing from the segment")
            header = decode_header(raw, at)
            if header.problem:
                raise CorruptionError(path, offset, header.problem)
            if (header.index, header.term, header.position, header.size) != (
                    record.index, record.term, record.position, record.size):
                raise CorruptionError(path, offset, "entry header disagrees with the index")
            body = raw[at + HEADER_SIZE : at + record.size]
            if crc32c(body) != header.body_crc:
                raise CorruptionError(path, offset, "body CRC mismatch")
            entries.append(Entry(header.index, header.term, header.kind, header.position, body))
        return entries

    def read_bytes(self, position: int, length: int) -> bytes:
        """Raw bytes from one segment, never beyond the end of the log."""
        if position < 0 or position >= self.end:
            return b""
        return self.segments.read(position, min(length, self.end - position))

    def read_message(self, physical_offset: int, size: int) -> StoredMessage:
        """Decode the message record at a physical offset (from a ConsumeQueue unit)."""
        raw = self.read_bytes(physical_offset, size)
        if len(raw) != size:
            raise CorruptionError(self.segments.path(self.segments.base_of(physical_offset)),
                                  physical_offset, f"message of {size} bytes not in the log")
        try:
            return decode_message_at(raw, physical_offset)
        except ValueError as exc:
            raise CorruptionError(self.segments.path(self.segments.base_of(physical_offset)),
                                  physical_offset, str(exc)) from exc

    # -------------------------------------------------------------- lifecycle

    def close(self) -> None:
        """Sync, checkpoint and release the directory."""
        if self._lock_fd < 0:
            return
        try:
            if self.failed is None:
                self.flush()
                self.checkpoint()
        finally:
            self.segments.close()
            # A failed log writes nothing more: its next open recovers from
            # what is on disk (index records are rebuilt from the segments).
            self.index.close(write_pending=self.failed is None)
            fileio.fs.close(self._lock_fd)
            self._lock_fd = -1

    def abandon(self) -> None:
        """Close file descriptors without syncing: what a crash leaves (tests)."""
        self.segments.close()
        self.index.close(write_pending=False)
        self._release_lock()

    def _release_lock(self) -> None:
        if self._lock_fd >= 0:
            fileio.fs.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> CommitLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
