"""`SimDisk`: a node's log and hard state with a volatile page cache and a durable platter.

Writes land in the volatile view (what the node reads back) and queue as
pending operations; `sync()` makes them durable. `crash()` keeps only a random
prefix of the pending operations, at entry granularity, so an unsynced batch
can survive whole, be lost, or be torn part-way (the torn entry itself fails
its CRC on recovery and is cut, which is the same as losing it). This is the
power-loss model of FoundationDB's AsyncFileNonDurable, reduced to log records.

flush=async (`dledger.testing.cluster`): `sync_hard_state()` models the
separate, always-fsynced hard-state file (term and vote never wait for the
log's flusher), and `sync(upto)` a background flush that covers only the
writes issued before it started.

Snapshots: `compact(snapshot)` is the driver writing a state snapshot
(atomically, fsynced) and deleting the log entries it covers, durable at
once; `install(snapshot)` (a follower's `Ready.snapshot`) is one pending
operation, atomic like the runtime's marker-guarded install: a crash keeps
it whole or not at all. The durable log is then `durable_snapshot` plus
`durable_entries` (the entries after it).
"""

from __future__ import annotations

import random

from dledger.entry import Entry, EntryKind, HardState
from dledger.membership import Membership, decode
from dledger.storage import MemoryLogStorage
from dledger.testing.statemachine import SimSnapshot

# Pending operations: ("append", entry) | ("truncate", index) | ("hard", HardState)
# | ("install", SimSnapshot)
_Op = tuple[str, object]


class SimDisk:
    """Durable and volatile copies of one node's storage."""

    def __init__(self) -> None:
        # Entries after durable_snapshot (from index 1 without one).
        self.durable_entries: list[Entry] = []
        self.durable_hard_state = HardState()
        self.durable_snapshot: SimSnapshot | None = None
        self.volatile = MemoryLogStorage()
        # The snapshot the volatile log starts after (its state, for installs and checks).
        self.volatile_snapshot: SimSnapshot | None = None
        # (sequence number, operation); numbers grow so a flush can cover
        # "everything issued before it started" even if ops are removed meanwhile.
        self._pending: list[tuple[int, _Op]] = []
        self._seq = 0
        self.syncs = 0

    def write(self, hard_state: HardState | None, entries: tuple[Entry, ...]) -> None:
        """Apply a Ready's writes to the volatile view; not durable until `sync()`."""
        if entries:
            first = entries[0].index
            if first <= self.volatile.last_index():
                self.volatile.truncate_after(first - 1)
                self._push(("truncate", first - 1))
            self.volatile.append(entries)
            for e in entries:
                self._push(("append", e))
        if hard_state is not None:
            self.volatile.set_hard_state(hard_state)
            self._push(("hard", hard_state))

    def install(self, snapshot: SimSnapshot) -> None:
        """A follower installs a leader's snapshot: the log becomes just that snapshot."""
        self.volatile.install(snapshot.meta)
        self.volatile_snapshot = snapshot
        self._push(("install", snapshot))

    def compact(self, snapshot: SimSnapshot) -> bool:
        """The driver wrote `snapshot` durably and deletes the entries it covers
        (volatile and durable); False if it is not newer than the current one."""
        index = snapshot.index
        if self.volatile_snapshot is not None and index <= self.volatile_snapshot.index:
            return False
        if index > self.volatile.last_index() or index < self.volatile.first_index():
            raise ValueError(f"compacting to {index}, log holds "
                             f"[{self.volatile.first_index()}, {self.volatile.last_index()}]")
        self.volatile.compact(index)
        self.volatile_snapshot = snapshot
        if self.durable_snapshot is None or index > self.durable_snapshot.index:
            base = self._durable_base()
            self.durable_entries = self.durable_entries[max(0, index - base):]
            self.durable_snapshot = snapshot
        return True

    def _durable_base(self) -> int:
        return self.durable_snapshot.index if self.durable_snapshot is not None else 0

    def durable_last(self) -> tuple[int, int]:
        """(term, index) of the last durable entry, the snapshot's if none follows it."""
        if self.durable_entries:
            return self.durable_entries[-1].term, self.durable_entries[-1].index
        if self.durable_snapshot is not None:
            return self.durable_snapshot.meta.term, self.durable_snapshot.index
        return 0, 0

    def _push(self, op: _Op) -> None:
        self._seq += 1
        self._pending.append((self._seq, op))

    @property
    def issued(self) -> int:
        """Sequence number of the last write issued (a flush started now covers up to it)."""
        return self._seq

    def sync(self, upto: int | None = None) -> None:
        """fsync: every pending write (or every one numbered <= `upto`) becomes durable."""
        keep: list[tuple[int, _Op]] = []
        for seq, op in self._pending:
            if upto is None or seq <= upto:
                self._apply(op)
            else:
                keep.append((seq, op))
        self._pending = keep
        self.syncs += 1

    def sync_hard_state(self) -> None:
        """fsync of the hard-state file alone: the latest term/vote/commit becomes durable."""
        self.durable_hard_state = self.volatile.initial_state()
        self._pending = [(seq, op) for seq, op in self._pending if op[0] != "hard"]

    @property
    def pending(self) -> int:
        return len(self._pending)

    def crash(self, rng: random.Random) -> int:
        """Power loss: a random prefix of the pending writes survives; returns writes lost."""
        keep = rng.randint(0, len(self._pending))
        for _, op in self._pending[:keep]:
            self._apply(op)
        lost = len(self._pending) - keep
        self._pending = []
        snap = self.durable_snapshot
        self.volatile = MemoryLogStorage(self.durable_hard_state, list(self.durable_entries),
                                         snapshot=snap.meta if snap is not None else None)
        self.volatile_snapshot = snap
        return lost

    def _apply(self, op: _Op) -> None:
        kind, value = op
        base = self._durable_base()
        if kind == "append":
            assert isinstance(value, Entry)
            if value.index <= base:
                return  # written before a compaction that now covers it
            assert value.index <= base + len(self.durable_entries) + 1, "gap in the durable log"
            del self.durable_entries[value.index - 1 - base :]
            self.durable_entries.append(value)
        elif kind == "truncate":
            assert isinstance(value, int)
            del self.durable_entries[max(0, value - base):]
        elif kind == "install":
            assert isinstance(value, SimSnapshot)
            self.durable_snapshot = value
            self.durable_entries = []
        else:
            assert isinstance(value, HardState)
            self.durable_hard_state = value

    def durable_term(self, index: int) -> int | None:
        """Term of durable entry `index` if it is also the entry the node now has, else None.
        Entries a snapshot covers count with the term the snapshot's state holds."""
        if index == 0:
            return 0
        term = self.durable_term_any(index)
        if term is None:
            return None
        return term if self._volatile_term(index) == term else None

    def _volatile_term(self, index: int) -> int | None:
        snap = self.volatile_snapshot
        if snap is not None and index <= snap.index:
            return snap.term_at(index)
        if index > self.volatile.last_index():
            return None
        return self.volatile.term(index)

    def durable_membership(self) -> Membership | None:
        """The configuration a node restarted from this disk would start with
        (None: the bootstrap one)."""
        for entry in reversed(self.durable_entries):
            if entry.kind == EntryKind.CONFIG:
                return decode(entry.data)
        snap = self.durable_snapshot
        return snap.meta.membership if snap is not None else None

    def durable_term_any(self, index: int) -> int | None:
        """Term of durable entry `index` regardless of the volatile view (crash analysis)."""
        base = self._durable_base()
        if index <= base:
            assert self.durable_snapshot is not None or index < 1
            return self.durable_snapshot.term_at(index) if self.durable_snapshot else None
        if index <= base + len(self.durable_entries):
            return self.durable_entries[index - 1 - base].term
        return None

    def full_log(self) -> list[Entry]:
        """The node's whole current log: its snapshot's entries, then the stored ones."""
        prefix = list(self.volatile_snapshot.entries) if self.volatile_snapshot else []
        return prefix + self.volatile.all_entries()
