"""`CommitLogStorage`: the CommitLog seen through the Raft core's `LogStorage` port.

The core reads persisted entries through this adapter (terms for the
consistency check, entries to replicate); the runtime writes through it
(`write`), which converts the core's `dledger.Entry` (index, term, kind, data,
position) into `commitlog.Entry` (index, term, kind, position, body),
truncates a replaced suffix first and keeps an in-memory tail cache.

The tail cache holds the most recently written entries (bounded in bytes) as
`dledger.Entry` objects, so the leader's replication reads of fresh entries
and the follower's term lookups never touch the disk or re-check CRCs; only a
follower that fell further behind than the cache is served from the files.

Snapshots: `snapshot()` is the newest state snapshot on disk
(`commitlog.snapshot.latest_snapshot`, read once and cached); whoever
writes or installs one tells the adapter with `note_snapshot`. The term of
the entry just below `first_index` is known only when a snapshot covers it,
as the core's storage contract asks. The snapshot's membership (the
configuration in effect at its index, stored in the meta as
`dledger.membership.encode`'s JSON) is decoded here, once per snapshot, so
the core gets a `Membership` (None: a snapshot of the bootstrap
configuration, e.g. one written before membership changes existed).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import commitlog
from commitlog.errors import CorruptionError
from commitlog.snapshot import META_FILE, SnapshotInfo, latest_snapshot
from dledger.entry import Entry, HardState
from dledger.log import InvariantViolation, invariant
from dledger.membership import Membership, MembershipError, decode
from dledger.storage import LogUnavailable, SnapshotMeta

DEFAULT_CACHE_BYTES = 64 * 1024 * 1024


class CommitLogStorage:
    """Read port for the core plus the writer the runtime uses. Loop thread only."""

    def __init__(self, log: commitlog.CommitLog, cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.log = log
        self._cache_bytes_max = cache_bytes
        # Invariant: _cache[k].index == _cache_first + k, and the last cached
        # entry is the log's last entry (or the cache is empty).
        self._cache: list[Entry] = []
        self._cache_first = log.last_index + 1
        self._cache_bytes = 0
        self.cache_hits = 0
        self.disk_reads = 0
        # A commit index known from elsewhere (what the state machine applied,
        # set by the runtime before the core starts); the saved one may be lower.
        self.commit_floor = 0
        # The state file's CRC is checked when a snapshot is sent (by the
        # follower) or read (by the state machine), not on every start.
        self._snapshot: SnapshotInfo | None = None
        self._snapshot_meta: SnapshotMeta | None = None
        found = latest_snapshot(log.data_dir, verify_state=False)
        if found is not None:
            self.note_snapshot(found)

    # ------------------------------------------------------------ LogStorage

    def initial_state(self) -> HardState:
        hs = self.log.load_hard_state()
        return HardState(hs.term, hs.vote, max(hs.commit, self.commit_floor))

    def first_index(self) -> int:
        return self.log.first_index

    def last_index(self) -> int:
        return self.log.last_index

    def term(self, index: int) -> int:
        if index == 0:
            return 0
        snap = self._snapshot
        if snap is not None and index == snap.index and index < self.log.first_index:
            return snap.term
        if not self.log.first_index <= index <= self.log.last_index:
            raise LogUnavailable(index)
        k = index - self._cache_first
        if 0 <= k < len(self._cache):
            return self._cache[k].term
        return self.log.term_at(index)

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        if lo < self.log.first_index or hi > self.log.last_index + 1 or lo > hi:
            raise LogUnavailable((lo, hi))
        if lo == hi:
            return []
        if lo >= self._cache_first:
            self.cache_hits += 1
            out: list[Entry] = []
            total = 0
            for entry in self._cache[lo - self._cache_first : hi - self._cache_first]:
                total += entry.size
                if out and total > max_bytes:
                    break
                out.append(entry)
            return out
        self.disk_reads += 1
        return [
            Entry(e.index, e.term, e.kind, e.body, e.position)
            for e in self.log.read_entries(lo, hi, max_bytes)
        ]

    def end_position(self) -> int:
        return self.log.end

    def snapshot(self) -> SnapshotMeta | None:
        return self._snapshot_meta

    # ------------------------------------------------------------- snapshots

    @property
    def snapshot_info(self) -> SnapshotInfo | None:
        """The newest snapshot known (what `snapshot()` describes)."""
        return self._snapshot

    def note_snapshot(self, info: SnapshotInfo) -> None:
        """A snapshot was written or installed; an older one never replaces a newer.

        Raises `CorruptionError` (naming the meta file) if its membership is
        JSON but not a configuration: only a writer's bug produces one, since
        the meta's CRC covers it, and a node must not start on a snapshot
        whose configuration it cannot know."""
        if self._snapshot is not None and info.index < self._snapshot.index:
            return
        self._snapshot_meta = SnapshotMeta(info.index, info.term, info.end_position,
                                           snapshot_membership(info))
        self._snapshot = info

    @property
    def snapshot_membership(self) -> Membership | None:
        """The configuration in effect at the newest snapshot's index (None:
        no snapshot, or one of the bootstrap configuration)."""
        meta = self._snapshot_meta
        return meta.membership if meta is not None else None

    def reset(self) -> None:
        """The log was replaced under the adapter (an install): forget the cache."""
        self._cache = []
        self._cache_bytes = 0
        self._cache_first = self.log.last_index + 1

    # --------------------------------------------------------------- writer

    def write(self, entries: Sequence[Entry], commit: int) -> list[commitlog.Entry]:
        """Store `entries` (from a Ready), first cutting the suffix they replace.

        `commit` is the highest index known committed: cutting at or below it
        would destroy a committed entry, which Raft forbids (checked here too,
        so a core bug cannot reach the disk). Returns the stored entries.
        """
        if not entries:
            return []
        first = entries[0].index
        log = self.log
        last = log.last_index
        # Checked inline: the messages are built only when a check fails.
        if first > last + 1:
            raise InvariantViolation(f"gap: writing {first} after {last}")
        if first <= last:
            invariant(first > commit, f"truncating committed entry {first} (commit {commit})")
            log.truncate_after(first - 1)
            self._cut_cache(first - 1)
        stored = [commitlog.Entry(e.index, e.term, e.kind, e.position, e.data) for e in entries]
        log.append(stored)
        self._cache_append(entries)
        return stored

    def _cut_cache(self, keep: int) -> None:
        k = keep + 1 - self._cache_first
        if k <= 0:
            self._cache = []
            self._cache_bytes = 0
            self._cache_first = keep + 1
            return
        for entry in self._cache[k:]:
            self._cache_bytes -= entry.size
        del self._cache[k:]

    def _cache_append(self, entries: Sequence[Entry]) -> None:
        if entries[0].index != self._cache_first + len(self._cache):
            self._cache = []
            self._cache_bytes = 0
            self._cache_first = entries[0].index
        self._cache.extend(entries)
        self._cache_bytes += sum(e.size for e in entries)
        if self._cache_bytes > self._cache_bytes_max:
            drop = 0
            while self._cache_bytes > self._cache_bytes_max // 2 and drop < len(self._cache) - 1:
                self._cache_bytes -= self._cache[drop].size
                drop += 1
            del self._cache[:drop]
            self._cache_first += drop

    @property
    def cached_entries(self) -> int:
        return len(self._cache)


def snapshot_membership(info: SnapshotInfo) -> Membership | None:
    """The decoded membership of a snapshot on disk (None: the bootstrap
    configuration); `CorruptionError` naming its meta if it does not decode."""
    if info.membership is None:
        return None
    try:
        return decode(info.membership)
    except MembershipError as exc:
        raise CorruptionError(os.path.join(info.path, META_FILE), 0,
                              f"the snapshot's membership is unusable: {exc}") from None
