"""The read port the Raft core uses to see persisted log state, and an in-memory implementation.

The core never writes storage: the driver persists what `Ready` hands it
(`append`, `truncate_after`, `set_hard_state` on the concrete store) and
reports back with `RaftNode.advance`. The protocol mirrors the planned
`commitlog.CommitLog` (read_entries, term_at, first/last index, end_position,
hard state file) so the adapter stays thin.

A moving first index: a driver may delete a prefix of the log (compaction,
retention) once it holds a snapshot of the applied state covering it, so
`first_index()` can exceed 1. The rule the core relies on: every entry below
`first_index()` is committed and applied (the driver only deletes below a
snapshot of its state machine, and it snapshots only applied state). When the
leader needs entries a follower lacks and they are gone, it sends the
follower `snapshot()` instead (`dledger.messages.InstallSnapshot`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from dledger.entry import Entry, EntryKind, HardState
from dledger.membership import Membership, decode


class LogUnavailable(LookupError):
    """The requested index is outside [first_index - 1, last_index] of the store
    (or is first_index - 1 and the store does not know that entry's term)."""


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    """What a state-machine snapshot covers: the log up to entry `index` of `term`,
    whose CommitLog bytes end at `end_position` (where the next entry is placed)."""

    index: int
    term: int
    end_position: int
    # The configuration in effect at `index` (None: the bootstrap one, for
    # snapshots written before membership changes existed).
    membership: Membership | None = None


class LogStorage(Protocol):
    """Persisted log as the core sees it. Indexes start at 1."""

    def initial_state(self) -> HardState:
        """The hard state found on disk at start-up."""
        ...

    def first_index(self) -> int:
        """Index of the first stored entry (1 unless older entries were deleted)."""
        ...

    def last_index(self) -> int:
        """Index of the last stored entry; first_index - 1 when empty."""
        ...

    def term(self, index: int) -> int:
        """Term of entry `index`; 0 for index 0. Raises `LogUnavailable` outside the
        range; first_index - 1 answers only if the store knows it (its snapshot's)."""
        ...

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        """Entries [lo, hi), stopping once `max_bytes` is exceeded but returning at least one.
        Raises `LogUnavailable` if lo < first_index or hi > last_index + 1."""
        ...

    def end_position(self) -> int:
        """Byte position just past the last stored entry (the snapshot's end when
        the store holds no entry after a snapshot; 0 when empty)."""
        ...

    def snapshot(self) -> SnapshotMeta | None:
        """The newest snapshot this node can send a follower, None if it has none.
        Called by a leader only when entries a follower needs are unavailable."""
        ...


# A store may also offer `config_entries(lo, hi) -> list[Entry]`: the CONFIG
# entries among [lo, hi), in index order. The core calls it once at start to
# find the configurations its log holds; without it the core reads the whole
# stored log through `entries` (cheap in memory, a full read for a large
# on-disk log, which is why a store that indexes entry kinds should offer it).
CONFIG_ENTRIES_HOOK = "config_entries"


def membership_in(entries: list[Entry], before: Membership | None) -> Membership | None:
    """The configuration in effect after `entries`: the last CONFIG entry's, or `before`."""
    for entry in reversed(entries):
        if entry.kind == EntryKind.CONFIG:
            return decode(entry.data)
    return before


class MemoryLogStorage:
    """A `LogStorage` held in a list, with the writers a driver needs.

    Invariant: entries[k].index == first_index + k and positions follow each
    other; after `compact` or `install`, `snapshot()` covers first_index - 1.
    """

    def __init__(
        self,
        hard_state: HardState | None = None,
        entries: list[Entry] | None = None,
        snapshot: SnapshotMeta | None = None,
    ):
        self.hard_state = hard_state or HardState()
        self._snapshot = snapshot
        self._first = snapshot.index + 1 if snapshot is not None else 1
        self._entries: list[Entry] = []
        if entries:
            self.append(entries)

    # -- LogStorage
    def initial_state(self) -> HardState:
        return self.hard_state

    def first_index(self) -> int:
        return self._first

    def last_index(self) -> int:
        return self._first - 1 + len(self._entries)

    def term(self, index: int) -> int:
        if index == 0:
            return 0
        snap = self._snapshot
        if snap is not None and index == snap.index:
            return snap.term
        if not self._first <= index <= self.last_index():
            raise LogUnavailable(index)
        return self._entries[index - self._first].term

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        if lo < self._first or hi > self.last_index() + 1 or lo > hi:
            raise LogUnavailable((lo, hi))
        out: list[Entry] = []
        total = 0
        for entry in self._entries[lo - self._first : hi - self._first]:
            total += entry.size
            if out and total > max_bytes:
                break
            out.append(entry)
        return out

    def end_position(self) -> int:
        if self._entries:
            return self._entries[-1].end_position
        return self._snapshot.end_position if self._snapshot is not None else 0

    def snapshot(self) -> SnapshotMeta | None:
        return self._snapshot

    # -- writers used by drivers and the simulator
    def append(self, entries: list[Entry] | tuple[Entry, ...]) -> None:
        """Store `entries`, first cutting any stored suffix they replace."""
        if not entries:
            return
        first = entries[0].index
        if first > self.last_index() + 1 or first < self._first:
            raise ValueError(
                f"gap: appending index {first} to stored [{self._first}, {self.last_index()}]"
            )
        del self._entries[first - self._first :]
        self._entries.extend(entries)

    def truncate_after(self, index: int) -> None:
        if index < self._first - 1:
            raise ValueError(f"truncating after {index}, below the snapshot at {self._first - 1}")
        del self._entries[index + 1 - self._first :]

    def set_hard_state(self, hard_state: HardState) -> None:
        self.hard_state = hard_state

    def compact(self, index: int) -> SnapshotMeta:
        """Delete entries <= `index` (the caller holds a snapshot of its state at
        `index`, which must be applied); remembers (index, term, end) and the
        configuration in effect at `index` as `snapshot()`.
        A no-op returning the current snapshot if `index` is already compacted."""
        if self._snapshot is not None and index <= self._snapshot.index:
            return self._snapshot
        if not self._first <= index <= self.last_index():
            raise ValueError(f"compacting to {index} outside [{self._first}, {self.last_index()}]")
        entry = self._entries[index - self._first]
        before = self._snapshot.membership if self._snapshot is not None else None
        membership = membership_in(self._entries[: index + 1 - self._first], before)
        self._snapshot = SnapshotMeta(index, entry.term, entry.end_position, membership)
        del self._entries[: index + 1 - self._first]
        self._first = index + 1
        return self._snapshot

    def install(self, meta: SnapshotMeta) -> None:
        """Replace the whole log by snapshot `meta` (a follower's install): no entries,
        first_index = meta.index + 1."""
        self._entries = []
        self._snapshot = meta
        self._first = meta.index + 1

    def all_entries(self) -> list[Entry]:
        """The stored entries, first_index onwards."""
        return list(self._entries)
