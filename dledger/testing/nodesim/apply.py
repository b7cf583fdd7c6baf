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
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Protocol

import commitlog

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

    def apply(self, entries: Sequence[commitlog.Entry]) -> None: ...

    def check(self) -> str | None:
        """A problem with the state machine's own consistency, or None."""
        ...

    def summary(self) -> object:
        """A value equal on replicas that applied the same log."""
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


class RecordingApplier:
    """Records what is applied; no state machine."""

    def __init__(self, log: commitlog.CommitLog, data_dir: str, record: Record) -> None:
        self._log = log
        self._record = record
        self.applied = 0

    def recover(self) -> int:
        self.apply(read_committed(self._log, 1, replay_point(self._log)))
        return self.applied

    def apply(self, entries: Sequence[commitlog.Entry]) -> None:
        for entry in entries:
            self._record(entry)
            self.applied = entry.index

    def check(self) -> str | None:
        return None

    def summary(self) -> object:
        return self.applied
