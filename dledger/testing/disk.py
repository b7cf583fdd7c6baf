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
"""

from __future__ import annotations

import random

from dledger.entry import Entry, HardState
from dledger.storage import MemoryLogStorage

# Pending operations: ("append", entry) | ("truncate", index) | ("hard", HardState)
_Op = tuple[str, object]


class SimDisk:
    """Durable and volatile copies of one node's storage."""

    def __init__(self) -> None:
        self.durable_entries: list[Entry] = []
        self.durable_hard_state = HardState()
        self.volatile = MemoryLogStorage()
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
        self.volatile = MemoryLogStorage(self.durable_hard_state, list(self.durable_entries))
        return lost

    def _apply(self, op: _Op) -> None:
        kind, value = op
        if kind == "append":
            assert isinstance(value, Entry)
            del self.durable_entries[value.index - 1 :]
            self.durable_entries.append(value)
        elif kind == "truncate":
            assert isinstance(value, int)
            del self.durable_entries[value:]
        else:
            assert isinstance(value, HardState)
            self.durable_hard_state = value

    def durable_term(self, index: int) -> int | None:
        """Term of durable entry `index` if it is also the entry the node now has, else None."""
        if index == 0:
            return 0
        if index > len(self.durable_entries) or index > self.volatile.last_index():
            return None
        term = self.durable_entries[index - 1].term
        return term if self.volatile.term(index) == term else None

    def durable_term_any(self, index: int) -> int | None:
        """Term of durable entry `index` regardless of the volatile view (crash analysis)."""
        if 1 <= index <= len(self.durable_entries):
            return self.durable_entries[index - 1].term
        return None
