"""The node's view of its log: persisted entries (storage) plus an unstable tail.

Theory of operation
-------------------
Entries the core appends (leader proposals, entries received by a follower)
go to `unstable` first. `take_unpersisted()` hands the not-yet-handed-out part
to a `Ready`; once the driver reports them durable (`stable_to`) they leave
`unstable` and are read back through `LogStorage`.

Invariants:
- entries with index < `offset` are read from storage, the rest from `unstable`;
  last_index == offset - 1 + len(unstable).
- offset - 1 <= in_progress <= last_index: entries up to `in_progress` were
  already handed to a Ready.
- storage may hold a stale tail beyond offset - 1 (written before a
  truncation the driver has not persisted yet); it is never read.

Snapshots and a moving first index
----------------------------------
Storage may start after a snapshot (`first_index() > 1`): entries below it
were committed, applied and deleted by the driver. `snapshot` (the one the
log starts after) answers the term at its index, so the boundary entry's
term stays known. A follower too far behind restores a leader's snapshot
(`restore`): every entry goes, offset = index + 1, and until the driver has
installed it (`Ready.snapshot`, then `snapshot_persisted`) storage is stale
and nothing below offset is read from it. Reads below the first available
index raise `LogUnavailable`, which tells a leader to send a snapshot.
"""

from __future__ import annotations

from dledger.entry import Entry, PlaceFunction
from dledger.storage import LogStorage, LogUnavailable, SnapshotMeta

# A `max_bytes` / `max_count` for `RaftLog.entries` that never binds: read the
# whole range asked for (applying committed entries, reading one entry back).
UNLIMITED = 1 << 62


class InvariantViolation(AssertionError):
    """A broken Raft invariant inside the core: always a bug, never an operating error."""


class CommittedDivergence(Exception):
    """The leader's log disagrees with entries this node has committed.

    Raft never lets that happen while every acknowledged entry is durable; it
    means this node (or a quorum) lost data it had acknowledged — a power cut
    under flush=async, a disk that lied about an fsync, files changed by hand.
    Re-anchoring at the local commit index (and acknowledging entries on top
    of a different history) would hide the loss, so the node must stop instead,
    as etcd-raft panics. Repairing the replica is an operator's decision.
    """

    def __init__(self, index: int, ours: int, leaders: int, anchor: int = 0) -> None:
        if anchor:
            # `index` lies in a snapshot here: its term is unknown, but terms
            # never decrease along a log, so it is at most `ours` (anchor's).
            what = (f"entry {index} has term {leaders} at the leader, later than the term "
                    f"{ours} of committed entry {anchor} here (a snapshot)")
        else:
            what = f"committed entry {index} has term {ours} here but term {leaders} at the leader"
        super().__init__(
            f"{what}: "
            "this replica's committed log diverged from the group (acknowledged data was lost); "
            "it stops (the broker's on_divergence decides: roll back or wait for repair)")
        self.index = index
        self.ours = ours
        self.leaders = leaders
        self.anchor = anchor


def invariant(condition: bool, message: str) -> None:
    """Raise `InvariantViolation` unless `condition`; unlike `assert`, survives `-O`."""
    if not condition:
        raise InvariantViolation(message)


class RaftLog:
    """Storage plus unstable entries, with the position bookkeeping of the CommitLog."""

    def __init__(self, storage: LogStorage, place: PlaceFunction) -> None:
        self._storage = storage
        self._place = place
        self.offset = storage.last_index() + 1
        self.unstable: list[Entry] = []
        # offset - 1 + len(unstable), kept as a field: read a few dozen times
        # per message (set where `offset` or `unstable` change length).
        self.last_index = self.offset - 1
        self.in_progress = self.offset - 1
        # Byte position just past the last entry; the next entry is placed from it.
        self.end_position = storage.end_position()
        # The snapshot this log starts after, once its first index moved past 1
        # (it answers the term at first_index - 1).
        self.snapshot: SnapshotMeta | None = (
            storage.snapshot() if storage.first_index() > 1 else None
        )
        # Restored from a leader's snapshot, not yet durable: storage is stale
        # below offset until the driver installs it. Handed to one Ready only.
        self.unstable_snapshot: SnapshotMeta | None = None
        self._snapshot_handed_out = False

    def last_term(self) -> int:
        return self.term(self.last_index)

    def first_index(self) -> int:
        """The first index whose entry this log can read (below it: a snapshot)."""
        if self.unstable_snapshot is not None:
            return self.offset
        return min(self._storage.first_index(), self.offset)

    def term(self, index: int) -> int:
        """Term of `index` (0 for index 0). Raises LookupError outside the log
        (`LogUnavailable` below the first available index)."""
        if index == 0:
            return 0
        snap = self.unstable_snapshot or self.snapshot
        if snap is not None and index == snap.index:
            return snap.term
        if index >= self.offset:
            return self.unstable[index - self.offset].term
        if self.unstable_snapshot is not None:
            raise LogUnavailable(index)
        return self._storage.term(index)

    def term_or_none(self, index: int) -> int | None:
        if index < 0 or index > self.last_index:
            return None
        try:
            return self.term(index)
        except LookupError:
            return None

    def match_term(self, index: int, term: int) -> bool:
        return self.term_or_none(index) == term

    def entries(self, lo: int, hi: int, max_bytes: int, max_count: int) -> list[Entry]:
        """Up to `max_count` entries of [lo, hi) within `max_bytes` (at least one)."""
        hi = min(hi, lo + max_count, self.last_index + 1)
        if lo >= hi:
            return []
        out: list[Entry] = []
        if lo < self.offset:
            if self.unstable_snapshot is not None:
                raise LogUnavailable((lo, hi))
            out = self._storage.entries(lo, min(hi, self.offset), max_bytes)
            if len(out) < min(hi, self.offset) - lo:
                return out  # byte limit reached inside storage
        if hi <= self.offset:
            return out
        total = sum(e.size for e in out)
        start = max(lo, self.offset)
        for entry in self.unstable[start - self.offset : hi - self.offset]:
            total += entry.size
            if out and total > max_bytes:
                break
            out.append(entry)
        return out

    def entry(self, index: int) -> Entry:
        if index >= self.offset:
            return self.unstable[index - self.offset]
        if self.unstable_snapshot is not None:
            raise LogUnavailable(index)
        return self._storage.entries(index, index + 1, UNLIMITED)[0]

    def next_position(self, size: int) -> int:
        """Position a new entry of `size` bytes gets at the end of this log (leader)."""
        return self._place(self.end_position, size)

    def append(self, entries: list[Entry] | tuple[Entry, ...], commit: int) -> None:
        """Append `entries`, replacing any conflicting suffix from entries[0].index on.

        `commit` guards Raft's core promise: a committed entry is never removed.
        """
        if not entries:
            return
        first = entries[0].index
        # `if not ...: raise` rather than invariant(): the messages are built
        # only when one fails (this runs for every entry of every append).
        if first > self.last_index + 1:
            raise InvariantViolation(f"gap: append at {first} after {self.last_index}")
        if first <= commit:
            raise InvariantViolation(f"truncating committed entry {first} (commit {commit})")
        prev_end = self.end_position if first == self.last_index + 1 else self._end_of(first - 1)
        place = self._place
        for entry in entries:
            # Every replica must derive the same position from the same prefix.
            expected = place(prev_end, entry.size)
            if entry.position != expected:
                raise InvariantViolation(
                    f"entry {entry.index} at position {entry.position}, rule says {expected}")
            prev_end = entry.end_position
        if first == self.last_index + 1:
            self.unstable.extend(entries)
        elif first >= self.offset:
            del self.unstable[first - self.offset :]
            self.unstable.extend(entries)
            self.in_progress = min(self.in_progress, first - 1)
        else:
            # The cut reaches into persisted entries: the unstable tail now
            # starts at `first`; the driver truncates storage when it persists.
            self.unstable = list(entries)
            self.offset = first
            self.in_progress = first - 1
        self.last_index = self.offset - 1 + len(self.unstable)
        self.end_position = prev_end

    def end_of(self, index: int) -> int:
        """The CommitLog position where entry `index` ends (0 for index 0);
        raises LogUnavailable below the stored log and its snapshot."""
        return self._end_of(index)

    def _end_of(self, index: int) -> int:
        if index == 0:
            return 0
        snap = self.unstable_snapshot or self.snapshot
        if snap is not None and index == snap.index:
            return snap.end_position
        if self.unstable_snapshot is None and index < self._storage.first_index():
            # The driver compacted storage since this log started: ask its snapshot.
            stored = self._storage.snapshot()
            if stored is not None and index == stored.index:
                return stored.end_position
        return self.entry(index).end_position

    def take_unpersisted(self) -> tuple[Entry, ...]:
        """Entries not yet handed to a Ready; marks them as handed out."""
        if self.in_progress >= self.last_index:
            return ()
        out = tuple(self.unstable[self.in_progress + 1 - self.offset :])
        self.in_progress = self.last_index
        return out

    def has_unpersisted(self) -> bool:
        return self.in_progress < self.last_index

    def stable_to(self, index: int, term: int) -> bool:
        """The driver made entries up to (index, term) durable; True if still current."""
        if index < self.offset or not self.match_term(index, term):
            return False  # superseded by a truncation since it was handed out
        del self.unstable[: index + 1 - self.offset]
        self.offset = index + 1
        return True

    def find_conflict_by_term(self, index: int, term: int) -> int:
        """Largest i <= index whose term is <= `term` (fast backtracking)."""
        index = min(index, self.last_index)
        while index > 0:
            t = self.term_or_none(index)
            if t is None or t <= term:
                return index
            index -= 1
        return 0

    # -- snapshots

    def restore(self, meta: SnapshotMeta) -> None:
        """Replace the whole log by the snapshot `meta` (a follower too far behind).

        Every entry goes, the log ends at meta.index, the next entry is placed
        after meta.end_position. The driver installs the snapshot from the next
        Ready (`take_snapshot`) and reports it with `snapshot_persisted`.
        """
        self.unstable = []
        self.offset = meta.index + 1
        self.last_index = meta.index
        self.in_progress = meta.index
        self.end_position = meta.end_position
        self.unstable_snapshot = meta
        self._snapshot_handed_out = False

    def take_snapshot(self) -> SnapshotMeta | None:
        """The restored snapshot if not yet handed to a Ready; marks it handed out."""
        if self.unstable_snapshot is None or self._snapshot_handed_out:
            return None
        self._snapshot_handed_out = True
        return self.unstable_snapshot

    def has_unpersisted_snapshot(self) -> bool:
        return self.unstable_snapshot is not None and not self._snapshot_handed_out

    def snapshot_persisted(self, meta: SnapshotMeta) -> bool:
        """The driver installed `meta`; False if a newer restore superseded it."""
        if self.unstable_snapshot != meta:
            return False
        self.snapshot = meta
        self.unstable_snapshot = None
        return True

    def snapshot_covering(self, index: int) -> SnapshotMeta | None:
        """A snapshot of this node (so committed) that covers `index`, if it knows one."""
        stored = self._storage.snapshot() if index < self._storage.first_index() else None
        for meta in (self.unstable_snapshot, self.snapshot, stored):
            if meta is not None and meta.index >= index:
                return meta
        return None

    def snapshot_to_send(self) -> SnapshotMeta | None:
        """The newest snapshot storage can send (a leader whose follower needs it)."""
        return self._storage.snapshot()
