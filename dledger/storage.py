"""The read port the Raft core uses to see persisted log state, and an in-memory implementation.

The core never writes storage: the driver persists what `Ready` hands it
(`append`, `truncate_after`, `set_hard_state` on the concrete store) and
reports back with `RaftNode.advance`. The protocol mirrors the planned
`commitlog.CommitLog` (read_entries, term_at, first/last index, end_position,
hard state file) so the adapter stays thin.
"""

from __future__ import annotations

from typing import Protocol

from dledger.entry import Entry, HardState


class LogUnavailable(LookupError):
    """The requested index is outside [first_index - 1, last_index] of the store."""


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
        """Term of entry `index`; 0 for index 0. Raises `LogUnavailable` outside the range."""
        ...

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        """Entries [lo, hi), stopping once `max_bytes` is exceeded but returning at least one."""
        ...

    def end_position(self) -> int:
        """Byte position just past the last stored entry (0 when empty)."""
        ...


class MemoryLogStorage:
    """A `LogStorage` held in a list, with the writers a driver needs.

    Invariant: entries[k].index == k + 1 and positions follow each other.
    """

    def __init__(self, hard_state: HardState | None = None, entries: list[Entry] | None = None):
        self.hard_state = hard_state or HardState()
        self._entries: list[Entry] = []
        if entries:
            self.append(entries)

    # -- LogStorage
    def initial_state(self) -> HardState:
        return self.hard_state

    def first_index(self) -> int:
        return 1

    def last_index(self) -> int:
        return len(self._entries)

    def term(self, index: int) -> int:
        if index == 0:
            return 0
        if not 1 <= index <= len(self._entries):
            raise LogUnavailable(index)
        return self._entries[index - 1].term

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        if lo < 1 or hi > len(self._entries) + 1 or lo > hi:
            raise LogUnavailable((lo, hi))
        out: list[Entry] = []
        total = 0
        for entry in self._entries[lo - 1 : hi - 1]:
            total += entry.size
            if out and total > max_bytes:
                break
            out.append(entry)
        return out

    def end_position(self) -> int:
        return self._entries[-1].end_position if self._entries else 0

    # -- writers used by drivers and the simulator
    def append(self, entries: list[Entry] | tuple[Entry, ...]) -> None:
        """Store `entries`, first cutting any stored suffix they replace."""
        if not entries:
            return
        first = entries[0].index
        if first > len(self._entries) + 1 or first < 1:
            raise ValueError(f"gap: appending index {first} after {len(self._entries)}")
        del self._entries[first - 1 :]
        self._entries.extend(entries)

    def truncate_after(self, index: int) -> None:
        del self._entries[index:]

    def set_hard_state(self, hard_state: HardState) -> None:
        self.hard_state = hard_state

    def all_entries(self) -> list[Entry]:
        return list(self._entries)
