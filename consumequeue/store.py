"""All ConsumeQueues of a node: dispatch from committed entries, lookups, recovery.

Only committed entries are dispatched, in log order, so every replica derives
the same queues from the same committed log: a message's queue offset is the
number of messages of its (topic, queue) committed before it.

Recovery (in `__init__`): the dispatch checkpoint says up to which entry the
queue files were fsynced. Units pointing at or past that entry's end are
dropped (they may be torn or refer to entries a crash removed), queues whose
files are missing or short are rebuilt from the CommitLog (durably, file by
file), queues the checkpoint does not know yet hold units it covers are the
remains of a `drop_topic` cut short (their files go), and the owner then
calls `dispatch_committed(commit_index)` to re-dispatch the rest. A damaged
checkpoint (CRC, shape) is not fatal: it is reported in
`recovery.checkpoint_damaged` and the owner rebuilds every queue from the log
(`needs_rebuild`), as after an install. Opening a
queue costs the tail written after the checkpoint, not the queue's length:
the files below each queue's checkpointed next offset are checked by length
(`DispatchCheckpoint.files_synced`, docs/storage-format.md).

Topic deletion: `skip_before[topic] = i` means messages of `topic` in entries
below index i are never indexed again (the topic was deleted by entry i), by
dispatch, by recovery's rebuild and by `rebuild`; so a re-created topic starts
at queue offset 0 and its old messages stay invisible while the CommitLog
still holds them.
"""

from __future__ import annotations

import os
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from commitlog import HEADER_SIZE, KIND_MESSAGES, CommitLog, Entry, fileio, iter_records, tag_hash
from commitlog.columns import RecordColumns, queue_groups, scan_body
from commitlog.disk import DirtyFile, sync_and_close, sync_directory
from commitlog.errors import CorruptionError
from commitlog.message import valid_topic
from consumequeue.checkpoint import (
    DispatchCheckpoint,
    read_dispatch_checkpoint,
    write_dispatch_checkpoint,
)
from consumequeue.queue import ConsumeQueue, Unit
from consumequeue.unit import UNIT, UNIT_DTYPE, UNIT_SIZE, encode_units
from ledgermq.base.message_record import MESSAGE_HEAD_SIZE


@dataclass
class CheckpointToken:
    """A checkpoint in two halves (see ConsumeQueueStore.begin_checkpoint)."""

    fds: list[DirtyFile]
    value: DispatchCheckpoint
    generation: int = 0


QueueKey = tuple[str, int]


@dataclass
class DispatchRecovery:
    """What opening the ConsumeQueues found and did."""

    dispatched_index: int = 0
    units_dropped: int = 0
    queues_rebuilt: list[QueueKey] = field(default_factory=list)
    # Queues of a dropped topic whose deletion a crash cut short, finished now.
    queues_dropped: list[QueueKey] = field(default_factory=list)
    # The log starts after what the queues were dispatched to (a snapshot
    # install replaced it): entries in between are gone, so queue offsets
    # cannot be continued; the owner must call `rebuild` with its state's
    # next offsets.
    needs_rebuild: bool = False
    # Why the dispatch checkpoint could not be read (CRC, shape), if it could
    # not: recovery then trusts no queue file and sets needs_rebuild.
    checkpoint_damaged: str | None = None
    foreign_files: list[str] = field(default_factory=list)


_pack_unit = UNIT.pack


def encoded_units_by_queue(entry: Entry, columns: RecordColumns | None = None
                           ) -> list[tuple[QueueKey, bytes, int]]:
    """`units_by_queue` as encoded bytes and unit counts. A body of a few
    records whose heads the scan kept as tuples (`RecordColumns.rows`) is
    packed with `struct`, not through numpy (the same bytes)."""
    if columns is None or columns.rows is None:
        return [(key, units.tobytes(), len(units)) for key, units in units_by_queue(entry, columns)]
    rows = columns.rows
    base = entry.position + HEADER_SIZE
    starts = columns.starts.tolist()
    hashes = columns.tag_hashes.tolist()
    out = []
    for key, members in queue_groups(columns):
        records = range(len(rows)) if members is None else members
        out.append((key, b"".join([_pack_unit(base + starts[i], rows[i][0], hashes[i])
                                   for i in records]), len(records)))
    return out


def units_by_queue(entry: Entry, columns: RecordColumns | None = None
                   ) -> list[tuple[QueueKey, np.ndarray]]:
    """The ConsumeQueue units (UNIT_DTYPE) of a MESSAGES entry, per queue, in
    log order; `columns` is the body's `scan_body` if the caller has it."""
    if columns is None:
        columns = scan_body(entry.body)
    units = np.empty(len(columns), dtype=UNIT_DTYPE)
    units["offset"] = columns.starts + (entry.position + HEADER_SIZE)
    units["size"] = columns.heads["size"]
    units["tag_hash"] = columns.tag_hashes
    groups = queue_groups(columns)
    if len(groups) == 1 and groups[0][1] is None:
        return [(groups[0][0], units)]
    # One gather puts each queue's units together; then a slice per queue.
    order = units[[i for _, members in groups for i in members]]  # type: ignore[union-attr]
    out = []
    at = 0
    for key, members in groups:
        count = len(members)  # type: ignore[arg-type]
        out.append((key, order[at : at + count]))
        at += count
    return out


def units_of_entry(entry: Entry) -> Iterable[tuple[QueueKey, tuple[int, int, int]]]:
    """((topic, queue id), (physical offset, size, tag hash)) of each message."""
    if entry.kind != KIND_MESSAGES:
        return
    body = entry.body
    base = entry.position + HEADER_SIZE
    for offset, fields in iter_records(body):
        p = offset + MESSAGE_HEAD_SIZE
        topic_len, tags_len = fields[9], fields[10]
        topic = body[p : p + topic_len].decode()
        tags = body[p + topic_len : p + topic_len + tags_len]
        yield (topic, fields[1]), (base + offset, fields[0], tag_hash(tags))


def _skipped(skip_before: Mapping[str, int], topic: str, index: int) -> bool:
    """Whether a message of `topic` in entry `index` belongs to a deleted topic."""
    return index < skip_before.get(topic, 0)


class ConsumeQueueStore:
    """The ConsumeQueues under `<data_dir>/consumequeue`, fed from one CommitLog.

    `skip_before` (topic -> entry index, see the module docstring) is the
    default of every dispatch; give the deleted topics known at start so
    recovery's rebuild skips them too.
    """

    def __init__(self, data_dir: str, log: CommitLog, units_per_file: int = 300_000,
                 skip_before: Mapping[str, int] | None = None) -> None:
        self.directory = os.path.join(data_dir, "consumequeue")
        self.log = log
        self.units_per_file = units_per_file
        self.queues: dict[QueueKey, ConsumeQueue] = {}
        self.skip_before: dict[str, int] = dict(skip_before or {})
        # Bumped (under the lock) by whatever removes queues: a checkpoint
        # captured before that, written on another thread after it, would
        # claim the removed queues again; it drops itself instead.
        self._generation = 0
        self._checkpoint_lock = threading.Lock()
        # Set when a checkpoint's fsync failed: the kernel may have dropped
        # the pages, so later checkpoints stop vouching for the files below
        # their claims (see DispatchCheckpoint.files_synced).
        self._sync_failed = False
        fileio.fs.makedirs(self.directory, exist_ok=True)
        self.recovery = DispatchRecovery()
        self._recover()

    @classmethod
    def open(cls, data_dir: str, log: CommitLog, units_per_file: int = 300_000,
             skip_before: Mapping[str, int] | None = None) -> ConsumeQueueStore:
        return cls(data_dir, log, units_per_file, skip_before)

    # --------------------------------------------------------------- recovery

    def _entry_end(self, index: int) -> int:
        if index >= self.log.first_index:
            return self.log.entry_end(index)
        return self.log.segments.bases[0] if self.log.segments.bases else 0

    def _read_checkpoint(self) -> DispatchCheckpoint | None:
        """The dispatch checkpoint; a damaged one is reported and read as none
        with `needs_rebuild` set: the queues are derived data, so the owner
        rebuilds them all from the log with its state's counts instead of
        refusing to start (the files the checkpoint vouched for are trusted
        no further)."""
        try:
            return read_dispatch_checkpoint(self.directory)
        except CorruptionError as error:
            self.recovery.checkpoint_damaged = str(error)
            return None

    def _recover(self) -> None:
        checkpoint = self._read_checkpoint()
        log = self.log
        limit_index = log.first_index - 1
        if checkpoint is not None:
            limit_index = max(limit_index, min(checkpoint.dispatched_index, log.last_index))
        self.recovery.needs_rebuild = self.recovery.checkpoint_damaged is not None or (
            log.first_index > 1 and (
                checkpoint is None or checkpoint.dispatched_index < log.first_index - 1))
        limit_end = self._entry_end(limit_index)
        # A checkpoint whose files were synced vouches for each queue's slots
        # below its next offset: those files are checked by length only.
        self._open_existing(checkpoint.queues if checkpoint and checkpoint.files_synced else {})
        for key, queue in list(self.queues.items()):
            before = queue.max_offset
            queue.truncate_to(queue.first_offset_at_or_after(limit_end))
            self.recovery.units_dropped += before - queue.max_offset
            if checkpoint is not None and key not in checkpoint.queues:
                # Every queue dispatched to is in every later checkpoint: one
                # the checkpoint does not know either is newer than it (and is
                # empty now; the re-dispatch makes it again) or holds units it
                # covers, and then its topic was dropped and a crash came
                # before its files went. Either way its files go.
                if queue.max_offset > queue.min_offset:
                    self.recovery.queues_dropped.append(key)
                self._remove_queue(key)
                continue
            if queue.max_offset == queue.min_offset:
                # Nothing durable is left: the queue restarts where the log says
                # (the rebuild below, when the checkpoint knows it), not at a
                # slot a torn file happened to leave.
                queue.truncate_to(0)
                queue.start_at(0)
        self.dispatched_index, self.dispatched_end = limit_index, limit_end
        if checkpoint is not None and checkpoint.files_synced and any(
                key not in self.queues or self.queues[key].max_offset < nxt
                for key, nxt in checkpoint.queues.items()):
            # What comes next (the rebuild below, the owner's re-dispatch)
            # writes slots the checkpoint vouches for, unsynced: it stops
            # vouching first, until the next checkpoint has synced them.
            write_dispatch_checkpoint(self.directory, replace(checkpoint, files_synced=False))
        # The checkpoint's per-queue counts describe exactly `limit_index` only
        # when the log still holds everything the checkpoint covered.
        if checkpoint is not None and checkpoint.dispatched_index == limit_index:
            damaged = {key: nxt for key, nxt in checkpoint.queues.items()
                       if key not in self.queues or self.queues[key].max_offset != nxt}
            if damaged:
                self._rebuild(damaged)
        if log.segments.bases:
            # Retention may have removed messages that queue files still point at.
            for queue in self.queues.values():
                queue.correct_min_offset(log.segments.bases[0])
        self.recovery.dispatched_index = self.dispatched_index

    def _open_existing(self, trusted_next: Mapping[QueueKey, int]) -> None:
        for topic in sorted(fileio.fs.listdir(self.directory)):
            topic_dir = os.path.join(self.directory, topic)
            if topic == "checkpoint" or topic.endswith((".tmp", ".durable")):
                continue
            if not (fileio.fs.isdir(topic_dir) and valid_topic(topic)):
                self.recovery.foreign_files.append(topic_dir)
                continue
            names = sorted(fileio.fs.listdir(topic_dir))
            if not names:
                fileio.fs.rmtree(topic_dir)  # a drop_topic cut short at its last step
                continue
            for queue_name in names:
                queue_dir = os.path.join(topic_dir, queue_name)
                if not (queue_name.isascii() and queue_name.isdigit()
                        and fileio.fs.isdir(queue_dir)):
                    self.recovery.foreign_files.append(queue_dir)
                    continue
                key = (topic, int(queue_name))
                queue = ConsumeQueue(queue_dir, topic, key[1], self.units_per_file,
                                     trusted_next.get(key))
                self.recovery.foreign_files += queue.foreign
                self.queues[key] = queue

    def _rebuild(self, expected_next: dict[QueueKey, int]) -> None:
        """Rebuild queues from the CommitLog up to dispatched_index; a queue's
        first offset is its expected next offset minus what the log still holds."""
        found: dict[QueueKey, list[tuple[int, int, int]]] = defaultdict(list)
        skip = self.skip_before
        for entry in self._scan(self.log.first_index, self.dispatched_index):
            for key, unit in units_of_entry(entry):
                if key in expected_next and not _skipped(skip, key[0], entry.index):
                    found[key].append(unit)
        for key, nxt in expected_next.items():
            units = found[key]
            # Durably, file by file: these are slots the checkpoint claims;
            # torn by a power cut before a checkpoint synced them, a first
            # page of zeros would pass for empty leading slots.
            self._queue(key).rewrite(max(0, nxt - len(units)), encode_units(units), len(units))
            self.recovery.queues_rebuilt.append(key)

    def _scan(self, lo: int, hi: int, batch_bytes: int = 8 << 20) -> Iterable[Entry]:
        index = lo
        while index <= hi:
            entries = self.log.read_entries(index, hi + 1, batch_bytes)
            yield from entries
            index = entries[-1].index + 1

    # --------------------------------------------------------------- dispatch

    def _queue(self, key: QueueKey) -> ConsumeQueue:
        queue = self.queues.get(key)
        if queue is None:
            queue = ConsumeQueue(os.path.join(self.directory, key[0], str(key[1])),
                                 key[0], key[1], self.units_per_file)
            self.queues[key] = queue
        return queue

    def dispatch(self, entries: Sequence[Entry],
                 columns: Sequence[RecordColumns | None] | None = None,
                 skip_before: Mapping[str, int] | None = None) -> int:
        """Index committed entries, which must directly follow dispatched_index.
        `columns[i]`: entry i's `scan_body` when the caller already has it.
        `skip_before` (default: the store's): messages of a topic in entries
        below its index are not indexed (the topic was deleted)."""
        skip = self.skip_before if skip_before is None else skip_before
        pending: dict[QueueKey, tuple[list[bytes], list[int]]] = {}
        index, end = self.dispatched_index, self.dispatched_end
        for i, entry in enumerate(entries):
            if entry.index != index + 1:
                raise ValueError(f"dispatch of entry {entry.index} after {index}")
            if entry.kind == KIND_MESSAGES:
                scanned = columns[i] if columns is not None else None
                for key, raw, count in encoded_units_by_queue(entry, scanned):
                    if not (skip and _skipped(skip, key[0], entry.index)):
                        parts = pending.get(key)
                        if parts is None:
                            pending[key] = ([raw], [count])
                        else:
                            parts[0].append(raw)
                            parts[1].append(count)
            index, end = entry.index, entry.end
        for key, (raws, counts) in pending.items():
            self._queue(key).append_encoded(raws[0] if len(raws) == 1 else b"".join(raws),
                                            sum(counts))
        self.dispatched_index, self.dispatched_end = index, end
        return len(entries)

    def dispatch_committed(self, commit_index: int, batch_bytes: int = 4 << 20,
                           skip_before: Mapping[str, int] | None = None) -> int:
        """Dispatch every entry up to `commit_index` not yet dispatched."""
        upto = min(commit_index, self.log.last_index)
        count = 0
        while self.dispatched_index < upto:
            entries = self.log.read_entries(self.dispatched_index + 1, upto + 1, batch_bytes)
            count += self.dispatch(entries, skip_before=skip_before)
        return count

    # ------------------------------------------------- deletion and rebuilding

    def _remove_queue(self, key: QueueKey) -> int:
        """Delete a queue's files (and its directory once nothing else is in
        it); the bytes freed."""
        queue = self.queues.pop(key)
        freed = queue.remove_files()
        queue_dir = queue.directory
        topic_dir = os.path.dirname(queue_dir)
        for directory in (queue_dir, topic_dir):
            if any(not name.endswith(".durable") for name in fileio.fs.listdir(directory)):
                sync_directory(directory)  # foreign files stay, and so does their directory
                break
            fileio.fs.rmtree(directory)
        sync_directory(self.directory)
        return freed

    def drop_topic(self, topic: str, skip_before: int | None = None) -> int:
        """Delete every queue file of `topic` (topic deletion); the bytes
        freed. With `skip_before` (the deleting entry's index), the topic's
        older messages are never indexed again (see `skip_before`).

        The checkpoint stops claiming the topic before its files go: a crash
        in between leaves files that no checkpoint claims, and the next open
        finishes the deletion.
        """
        if skip_before is not None:
            self.skip_before[topic] = max(self.skip_before.get(topic, 0), skip_before)
        keys = sorted(key for key in self.queues if key[0] == topic)
        if not keys:
            return 0
        token = self.begin_checkpoint()
        for key in keys:
            del token.value.queues[key]
        with self._checkpoint_lock:
            self._generation += 1
        token.generation = self._generation
        self.run_checkpoint(token)
        return sum(self._remove_queue(key) for key in keys)

    def rebuild(self, first_index: int, last_index: int, expected_next: Mapping[QueueKey, int],
                skip_before: Mapping[str, int] | None = None) -> None:
        """Destroy every queue and rebuild them from the log's entries
        [first_index, last_index] (after a snapshot install): a queue's first
        offset is `expected_next` (the state machine's next offset at
        last_index) minus the messages of that queue found in the range.
        `skip_before` replaces the store's. Crash-safe: a checkpoint naming
        every queue's first offset is written before the range is dispatched,
        so an interrupted rebuild resumes as an ordinary recovery."""
        log = self.log
        if first_index != log.first_index or not first_index - 1 <= last_index <= log.last_index:
            raise ValueError(f"rebuild of [{first_index}, {last_index}] but the log holds "
                             f"[{log.first_index}, {log.last_index}]")
        if skip_before is not None:
            self.skip_before = dict(skip_before)
        counts: dict[QueueKey, int] = defaultdict(int)
        for entry in self._scan(first_index, last_index):
            if entry.kind == KIND_MESSAGES:
                for key, units in units_by_queue(entry):
                    if not _skipped(self.skip_before, key[0], entry.index):
                        counts[key] += len(units)
        unknown = sorted(key for key, n in counts.items() if n > expected_next.get(key, 0))
        if unknown:
            raise ValueError(f"the log holds more messages than expected_next says for "
                             f"{unknown[:5]}: the state does not match the log")
        starts = {key: nxt - counts.get(key, 0) for key, nxt in expected_next.items() if nxt > 0}
        with self._checkpoint_lock:
            self._generation += 1
            for key in list(self.queues):
                self._remove_queue(key)
            self.dispatched_index = first_index - 1
            self.dispatched_end = self._entry_end(first_index - 1)
            write_dispatch_checkpoint(self.directory, DispatchCheckpoint(
                self.dispatched_index, self.dispatched_end, dict(starts)))
        for key, start in sorted(starts.items()):
            self._queue(key).start_at(start)
        self.recovery.queues_rebuilt = sorted(starts)
        self.recovery.needs_rebuild = False
        self.dispatch_committed(last_index)
        self.checkpoint()

    # ------------------------------------------------- one queue's repair

    @property
    def generation(self) -> int:
        """Changes whenever queues are removed, rebuilt or replaced: work that
        read the queues before must not write what it derived after."""
        return self._generation

    def units_in_log(self, key: QueueKey, lo: int, hi: int, batch_bytes: int = 8 << 20
                     ) -> tuple[bytes, int, int]:
        """One step of scanning the log for one queue's units: those of `key`
        in the entries from `lo` to at most `hi` that one read of
        `batch_bytes` returns, encoded, their count, and the index to go on
        from (past `hi`: done). Messages of a deleted topic (`skip_before`)
        are left out, as dispatch leaves them out."""
        entries = self.log.read_entries(lo, hi + 1, batch_bytes)
        skip = self.skip_before
        parts = [units for entry in entries if entry.kind == KIND_MESSAGES
                 and not _skipped(skip, key[0], entry.index)
                 for k, units in units_by_queue(entry) if k == key]
        return b"".join(u.tobytes() for u in parts), sum(len(u) for u in parts), \
            entries[-1].index + 1

    def replace_queue(self, key: QueueKey, first_offset: int, raw: bytes, count: int,
                      upto: int) -> None:
        """Durably replace `key`'s slots below `upto` by `count` encoded units
        from slot `first_offset` on, keeping the slots from `upto` to the
        queue's end (dispatched while the units were scanned for) as they
        are: a queue whose files were found damaged, refilled from the log.
        A checkpoint under way on another thread drops itself (the files
        change under it); a crash part way leaves a queue shorter than the
        checkpoint claims, which recovery rebuilds."""
        queue = self.queues[key]
        if not 0 <= first_offset <= upto <= queue.max_offset or \
                first_offset + count != upto or len(raw) != count * UNIT_SIZE:
            raise ValueError(f"replacing queue {key} up to {upto} with {count} units from"
                             f" {first_offset}, but it holds [{queue.min_offset}, "
                             f"{queue.max_offset})")
        tail = encode_units([(u.physical_offset, u.size, u.tag_hash)
                             for u in queue.read(upto, queue.max_offset - upto)])
        with self._checkpoint_lock:
            self._generation += 1
            queue.rewrite(first_offset, raw + tail, queue.max_offset - first_offset)
        if self.log.segments.bases:
            queue.correct_min_offset(self.log.segments.bases[0])

    # ---------------------------------------------------------------- lookups

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def offsets(self, topic: str, queue_id: int) -> tuple[int, int]:
        """(min offset, max offset) of a queue; (0, 0) for one never written."""
        queue = self.queues.get((topic, queue_id))
        return (queue.min_offset, queue.max_offset) if queue else (0, 0)

    def read(self, topic: str, queue_id: int, offset: int, count: int) -> list[Unit]:
        queue = self.queues.get((topic, queue_id))
        return queue.read(offset, count) if queue else []

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """First queue offset whose message was stored at or after `timestamp_ms`
        (max offset if none). Store timestamps come from successive leaders'
        clocks, so this is exact only as far as those clocks agree."""
        queue = self.queues.get((topic, queue_id))
        if queue is None:
            return 0
        lo, hi = queue.min_offset, queue.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            unit = queue.read(mid, 1)[0]
            stored = self.log.read_message(unit.physical_offset, unit.size)
            if stored.message.store_timestamp_ms >= timestamp_ms:
                hi = mid
            else:
                lo = mid + 1
        return lo

    # ------------------------------------------------------------ durability

    def checkpoint(self) -> DispatchCheckpoint:
        """Fsync the queue files, then record how far they go (all on this thread)."""
        token = self.begin_checkpoint()
        self.run_checkpoint(token)
        return token.value

    def begin_checkpoint(self) -> CheckpointToken:
        """What a checkpoint covers: the queue files written so far (duplicated
        fds) and the dispatched point now. Call on the owning thread; run it
        with `run_checkpoint`, which may be on another thread while dispatch
        goes on (later units are simply not claimed). The CommitLog is synced
        first if dispatch ran ahead of its durable point, so the queues never
        claim entries the log could lose (the broker has its Flusher do that
        beforehand, off the loop)."""
        if self.dispatched_index > self.log.durable_index:
            self.log.flush()
        fds = [fd for queue in self.queues.values() for fd in queue.dirty_fds()]
        value = DispatchCheckpoint(
            self.dispatched_index, self.dispatched_end,
            {key: q.max_offset for key, q in self.queues.items()},
            files_synced=not self._sync_failed,
        )
        return CheckpointToken(fds, value, self._generation)

    def run_checkpoint(self, token: CheckpointToken) -> bool:
        """Fsync the token's queue files, then replace the checkpoint file.
        Safe on another thread; one at a time per store. Returns False,
        writing nothing, when queues were dropped or rebuilt since the token
        was taken (it could claim them again)."""
        try:
            sync_and_close(token.fds)
        except BaseException:
            self._sync_failed = True
            raise
        with self._checkpoint_lock:
            if token.generation != self._generation:
                return False
            write_dispatch_checkpoint(self.directory, token.value)
            return True

    def delete_before(self, physical_offset: int) -> int:
        """Retention: drop queue files wholly before a CommitLog position and
        raise every queue's min_offset to its first unit at or after it; the
        number of files removed."""
        return sum(q.delete_files_before(physical_offset) for q in self.queues.values())

    def disk_bytes(self) -> int:
        """Bytes of every queue file (not the checkpoint)."""
        return sum(q.disk_bytes() for q in self.queues.values())

    def close(self) -> None:
        self.checkpoint()
        for queue in self.queues.values():
            queue.close()
        self.queues.clear()

    def abandon(self) -> None:
        """Close files without a checkpoint: what a crash leaves (tests)."""
        for queue in self.queues.values():
            queue.close()
        self.queues.clear()

    @staticmethod
    def destroy(data_dir: str) -> None:
        """Remove every ConsumeQueue file (to rebuild them from the CommitLog)."""
        fileio.fs.rmtree(os.path.join(data_dir, "consumequeue"))
