"""Log entries, hard state and the placement rule that fixes entry positions.

Every replica stores entry *i* at the same byte position of its CommitLog, so
positions (and message ids derived from them) are valid everywhere. The
leader's core assigns the position when it creates the entry, with the pure
`place` rule of docs/storage-format.md; followers store what they are sent and
check it against the same rule.

`Entry` and `HardState` are values, never changed once built; they are not
`frozen=True` dataclasses only for the cost of a frozen `__init__` (see
`election.messages`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

# Size of the on-disk entry header (docs/storage-format.md, "Entry").
ENTRY_HEADER_BYTES = 48

# Default CommitLog segment capacity (docs/storage-format.md): 256 MiB.
SEGMENT_SIZE_BYTES_DEFAULT = 256 * 1024 * 1024


class EntryKind(enum.IntEnum):
    """Entry kinds, numbered as the `kind` byte of the on-disk header."""

    MESSAGES = 1
    NOOP = 2
    CONTROL = 3
    # The group's whole new configuration (`dledger.membership`), effective once appended.
    CONFIG = 4


@dataclass(slots=True, unsafe_hash=True)
class Entry:
    """One Raft log entry. Identical on every replica, position included."""

    index: int
    term: int
    kind: int
    data: bytes
    position: int

    @property
    def size(self) -> int:
        """Bytes this entry occupies in the CommitLog, header included."""
        return ENTRY_HEADER_BYTES + len(self.data)

    @property
    def end_position(self) -> int:
        return self.position + ENTRY_HEADER_BYTES + len(self.data)


@dataclass(slots=True, unsafe_hash=True)
class HardState:
    """What must survive a crash: term, vote (0 = none) and a lower bound of commit."""

    term: int = 0
    vote: int = 0
    commit: int = 0


# place(end_position, entry_size) -> position of the new entry.
PlaceFunction = Callable[[int, int], int]


def place_in_segments(end_position: int, entry_size: int, segment_size_bytes: int) -> int:
    """Where an entry of `entry_size` bytes goes when the log currently ends at `end_position`.

    An entry never spans two segments: if it does not fit in the rest of the
    current segment it starts the next one.
    """
    if entry_size > segment_size_bytes:
        raise ValueError(f"entry of {entry_size} bytes exceeds segment size {segment_size_bytes}")
    if end_position % segment_size_bytes + entry_size > segment_size_bytes:
        return (end_position // segment_size_bytes + 1) * segment_size_bytes
    return end_position


def segment_placement(segment_size_bytes: int = SEGMENT_SIZE_BYTES_DEFAULT) -> PlaceFunction:
    """The placement rule for segments of `segment_size_bytes`, as a `PlaceFunction`."""
    if segment_size_bytes <= ENTRY_HEADER_BYTES:
        raise ValueError("segment_size_bytes must exceed the entry header size")

    def place(end_position: int, entry_size: int) -> int:
        return place_in_segments(end_position, entry_size, segment_size_bytes)

    return place
