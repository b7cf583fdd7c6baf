"""The simulator's state machine and its snapshots: a running digest of the applied log.

Every node of `dledger.testing.cluster.SimCluster` applies committed entries
to a `SimStateMachine`: its state is the sequence of entries applied so far,
summarised by a chained CRC (`digest`). Two nodes whose machines reached the
same index must have the same digest there (state-machine safety, checked
through snapshots as well as through applied entries).

A `SimSnapshot` is that state at one index: the meta the Raft core sees
(`SnapshotMeta`), the digest, and the entries it summarises (a real state
machine keeps only their effect; the simulator keeps them so that the final
checks can rebuild a replica's whole log, prefix included, and count every
acknowledged write). A snapshot records the configuration in effect at its
index (`SnapshotMeta.membership`: the last CONFIG entry applied, None when
there was none), as a real driver must.
"""

from __future__ import annotations

import bisect
import zlib
from dataclasses import dataclass

from dledger.entry import Entry, EntryKind
from dledger.membership import Membership, decode
from dledger.storage import SnapshotMeta

EMPTY_DIGEST = 0


def chain(digest: int, entry: Entry) -> int:
    """The digest after applying `entry` to a state whose digest is `digest`."""
    head = f"{digest}:{entry.index}:{entry.term}:{entry.kind}:{entry.position}:".encode()
    return zlib.crc32(entry.data, zlib.crc32(head))


def digest_of(entries: list[Entry] | tuple[Entry, ...]) -> int:
    """Digest of a state that applied exactly `entries` (indexes 1..n) in order."""
    digest = EMPTY_DIGEST
    for entry in entries:
        digest = chain(digest, entry)
    return digest


@dataclass(frozen=True, slots=True)
class SimSnapshot:
    """A state-machine snapshot at meta.index; `entries` are 1..meta.index."""

    meta: SnapshotMeta
    digest: int
    entries: tuple[Entry, ...]

    @property
    def index(self) -> int:
        return self.meta.index

    def term_at(self, index: int) -> int | None:
        """Term of entry `index` as this snapshot's state holds it (None past it)."""
        if 1 <= index <= self.meta.index:
            return self.entries[index - 1].term
        return None


class SimStateMachine:
    """Applied entries of one node incarnation, from a snapshot (or empty) onwards."""

    def __init__(self, snapshot: SimSnapshot | None = None) -> None:
        self._entries: list[Entry] = list(snapshot.entries) if snapshot is not None else []
        self._digests: list[int] = []
        digest = EMPTY_DIGEST if snapshot is None else snapshot.digest
        # _digests[k] is the digest at index _base + k.
        self._base = 0 if snapshot is None else snapshot.index
        self._digests = [digest]
        # (index, configuration) of every CONFIG entry applied, in order.
        self._config_index: list[int] = []
        self._configs: list[Membership] = []
        for entry in self._entries:
            self._note_config(entry)

    def _note_config(self, entry: Entry) -> None:
        if entry.kind == EntryKind.CONFIG:
            self._config_index.append(entry.index)
            self._configs.append(decode(entry.data))

    def membership_at(self, index: int) -> Membership | None:
        """The configuration of the last CONFIG entry at or below `index` (None: none)."""
        k = bisect.bisect_right(self._config_index, index)
        return self._configs[k - 1] if k else None

    @property
    def index(self) -> int:
        return len(self._entries)

    @property
    def digest(self) -> int:
        return self._digests[-1]

    def digest_at(self, index: int) -> int:
        return self._digests[index - self._base]

    def apply(self, entry: Entry) -> int:
        """Apply the next entry; returns the new digest. ValueError on a gap or repeat."""
        if entry.index != self.index + 1:
            raise ValueError(f"state machine at {self.index} handed entry {entry.index}")
        self._entries.append(entry)
        self._digests.append(chain(self.digest, entry))
        self._note_config(entry)
        return self.digest

    def snapshot(self, index: int) -> SimSnapshot:
        """The state at `index` (base <= index <= applied), as a snapshot."""
        if not self._base <= index <= self.index or index < 1:
            raise ValueError(f"no state at {index}: machine holds {self._base}..{self.index}")
        entry = self._entries[index - 1]
        meta = SnapshotMeta(index, entry.term, entry.end_position, self.membership_at(index))
        return SimSnapshot(meta, self.digest_at(index), tuple(self._entries[:index]))
