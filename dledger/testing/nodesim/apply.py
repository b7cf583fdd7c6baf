"""What a simulated node does with committed entries, and the record of it.

The harness builds one `Applier` per node incarnation through an
`ApplierFactory`. The default, `RecordingApplier`, only records; the broker's
real state machine and ConsumeQueue dispatch run through
`broker.nodesim_apply.BrokerApplier` (the layering keeps `dledger/` from
importing `broker/` or `consumequeue/`, so the broker side lives there and
the CLI and tests pass it in).

Every applier reports each entry it applies, replayed ones included, to the
harness's `record(entry)`: (index, term, body digest) per incarnation is what
the checks compare across nodes and against the final committed log.

Snapshots (compaction runs, `NodeSimOptions.compaction`): an applier that
also has `snapshot_state()` and `install(info)` (`SnapshotApplier`) can be
snapshotted, so its node may delete the log below the snapshot, and can be
reset from a leader's snapshot that its node installed. `recover` then starts
from the newest snapshot on disk and replays only what follows it. Entries a
snapshot covers are not reported to `record` (they were not applied here).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import commitlog
from commitlog.snapshot import SnapshotInfo, latest_snapshot, read_state
from dledger.runtime.node import ApplyRest

Record = Callable[[commitlog.Entry], None]


def digest(body: bytes) -> str:
    """A short digest of an entry body (what the checks compare)."""
    return hashlib.blake2b(body, digest_size=8).hexdigest()


class Applier(Protocol):
    """One incarnation's state machine."""

    def recover(self) -> int:
        """Replay the committed log (as a broker does before `start`); return
        the applied index to start the node with."""
        ...

    def apply(self, entries: Sequence[commitlog.Entry]) -> ApplyRest | None:
        """Apply committed entries; what it returns the node runs later in
        its pass, after its completions (RaftGroupNode's ApplyRest)."""
        ...

    def check(self) -> str | None:
        """A problem with the state machine's own consistency, or None."""
        ...

    def summary(self) -> object:
        """A value equal on replicas that applied the same log."""
        ...


@runtime_checkable
class SnapshotApplier(Applier, Protocol):
    """An applier whose state can be snapshotted and restored."""

    def snapshot_state(self) -> tuple[int, bytes]:
        """(applied index, the state after it), for `write_snapshot`."""
        ...

    def install(self, info: SnapshotInfo) -> None:
        """Reset to the state of a snapshot the node installed."""
        ...


# (log, data_dir, record) -> Applier
ApplierFactory = Callable[[commitlog.CommitLog, str, Record], Applier]


def replay_point(log: commitlog.CommitLog) -> int:
    """Where a restarted node's state machine resumes: the saved commit index,
    never beyond the log."""
    return min(log.load_hard_state().commit, log.last_index)


def read_committed(log: commitlog.CommitLog, lo: int, hi: int) -> list[commitlog.Entry]:
    """Entries lo..hi (inclusive) from the log, in batches."""
    out: list[commitlog.Entry] = []
    while lo <= hi:
        batch = log.read_entries(lo, hi + 1, 4 << 20)
        out += batch
        lo = batch[-1].index + 1
    return out


_HEAD = struct.Struct("<Q16s")  # applied index, chain digest
_RECENT = struct.Struct("<QQ8s")  # index, term, body digest
RECENT_KEPT = 64


class RecordingApplier:
    """Records what is applied; its state machine is a hash chain over
    (index, term, body digest) of every applied entry, plus the last
    `RECENT_KEPT` of them, so equal states mean equal applied logs and a
    snapshot is a few KiB (several transfer chunks in the simulator)."""

    def __init__(self, log: commitlog.CommitLog, data_dir: str, record: Record) -> None:
        self._log = log
        self._data_dir = data_dir
        self._record = record
        self.applied = 0
        self.chain = bytes(16)
        self.recent: list[tuple[int, int, bytes]] = []

    def recover(self) -> int:
        start = 1
        snap = latest_snapshot(self._data_dir)
        if snap is not None:
            self._restore(read_state(snap))
            if self.applied != snap.index:
                raise RuntimeError(f"snapshot {snap.index} holds the state at {self.applied}")
            start = snap.index + 1
        if start < self._log.first_index:
            raise RuntimeError(f"the log starts at {self._log.first_index} but the newest "
                               f"snapshot covers only up to {start - 1}")
        self.apply(read_committed(self._log, start, replay_point(self._log)))
        return self.applied

    def apply(self, entries: Sequence[commitlog.Entry]) -> None:
        for entry in entries:
            self._record(entry)
            dig = hashlib.blake2b(entry.body, digest_size=8).digest()
            self.chain = hashlib.blake2b(self.chain + _RECENT.pack(entry.index, entry.term, dig),
                                         digest_size=16).digest()
            self.recent.append((entry.index, entry.term, dig))
            self.applied = entry.index
        del self.recent[:-RECENT_KEPT]

    def snapshot_state(self) -> tuple[int, bytes]:
        return self.applied, _HEAD.pack(self.applied, self.chain) + b"".join(
            _RECENT.pack(*r) for r in self.recent)

    def install(self, info: SnapshotInfo) -> None:
        self._restore(read_state(info))
        if self.applied != info.index:
            raise RuntimeError(f"installed snapshot {info.index} holds the state at "
                               f"{self.applied}")

    def _restore(self, state: bytes) -> None:
        self.applied, self.chain = _HEAD.unpack_from(state)
        self.recent = [_RECENT.unpack_from(state, at)
                       for at in range(_HEAD.size, len(state), _RECENT.size)]

    def check(self) -> str | None:
        return None

    def summary(self) -> object:
        return (self.applied, self.chain.hex())
