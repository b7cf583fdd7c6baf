"""The broker's apply path for the real-node simulator (`dledger/testing/nodesim`).

The simulator may not import `ledgermq.broker` or `consumequeue` (the
`floors` import contract), so this module, which may, supplies its applier: the broker's real state
machine (`BrokerState.apply`) and ConsumeQueue dispatch
(`ConsumeQueueStore`) on the node's (simulated) files, recovered on restart
the way `Broker._recover` does it (the newest snapshot, then the log after
it), with a ConsumeQueue checkpoint every few applied batches once the
CommitLog is durable that far (as the broker's checkpoint loop waits for it).
It is a `SnapshotApplier`: with compaction on, the simulator snapshots its
state (`BrokerState.to_snapshot`) and installs leaders' snapshots into it
(state from the snapshot, ConsumeQueues rebuilt from the installed log), as
`Broker._on_install` does. Nothing here is simulated: the simulator only
swaps the file system underneath.
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from commitlog import KIND_MESSAGES, CommitLog, Entry, fileio
from commitlog.columns import RecordColumns, scan_body
from commitlog.snapshot import SnapshotInfo, latest_snapshot, read_state
from consumequeue import ConsumeQueueStore
from dledger.runtime.node import ApplyRest
from dledger.testing.nodesim.apply import Record, read_committed, replay_point
from ledgermq.broker.state import BrokerState

CHECKPOINT_EVERY = 8  # applied batches between ConsumeQueue checkpoints
UNITS_PER_FILE = 64  # small unit files, so dispatch rolls files and recovery sees several


@dataclass
class CheckpointRot:
    """Damage to the ConsumeQueue dispatch checkpoint before a restart's
    recovery, in `share` of the restarts that find one: a byte flipped, the
    file torn, or emptied, durably. The broker must rebuild every queue from
    the log (`DispatchRecovery.checkpoint_damaged`) to the same queues its
    state counts; the simulator's checks compare them. Drawn from the
    node's files alone, so a seed replays alike."""

    share: float
    damaged: int = 0

    def apply(self, data_dir: str, log: CommitLog) -> None:
        path = os.path.join(data_dir, "consumequeue", "checkpoint")
        raw = fileio.fs.read_file(path)
        if not raw:
            return
        rng = random.Random(f"{data_dir}/{log.first_index}/{log.last_index}/{len(raw)}")
        if rng.random() >= self.share:
            return
        how = rng.randrange(3)
        if how == 0:
            at = rng.randrange(len(raw))
            raw = raw[:at] + bytes([raw[at] ^ (1 << rng.randrange(8))]) + raw[at + 1:]
        else:
            raw = raw[: rng.randrange(len(raw))] if how == 1 else b""
        self.damaged += 1
        fd = fileio.fs.open(path, os.O_RDWR)
        try:
            fileio.fs.ftruncate(fd, 0)
            fileio.fs.pwrite(fd, raw, 0)
            fileio.fs.fsync(fd)
        except OSError:
            pass  # an injected disk fault: the file is damaged some other way
        finally:
            fileio.fs.close(fd)


class BrokerApplier:
    """`dledger.testing.nodesim.apply.SnapshotApplier` running the broker's state machine.

    `rot`: damage the ConsumeQueue checkpoint before some recoveries
    (`CheckpointRot`); give it with `functools.partial`."""

    def __init__(self, log: CommitLog, data_dir: str, record: Record,
                 rot: CheckpointRot | None = None) -> None:
        self._log = log
        self._data_dir = data_dir
        self._record = record
        self._rot = rot
        self.state = BrokerState()
        self._cq: ConsumeQueueStore | None = None
        self._batches = 0

    @property
    def cq(self) -> ConsumeQueueStore:
        if self._cq is None:
            raise RuntimeError("recover() first")
        return self._cq

    def recover(self) -> int:
        """The newest snapshot, the committed log after it, then the queues
        (opened knowing the deleted topics), like `Broker._recover`."""
        log = self._log
        snap = latest_snapshot(self._data_dir)
        if snap is not None:
            self.state = BrokerState.from_snapshot(read_state(snap))
        if self.state.applied_index < log.first_index - 1:
            raise RuntimeError(f"the log starts at {log.first_index} but the newest snapshot "
                               f"covers only up to {self.state.applied_index}")
        applied = max(replay_point(log), self.state.applied_index)
        self._replay(self.state.applied_index + 1, applied)
        if self._rot is not None:
            self._rot.apply(self._data_dir, log)
        self._cq = ConsumeQueueStore(self._data_dir, log, units_per_file=UNITS_PER_FILE,
                                     skip_before=self.state.deleted_before)
        dispatched = self._cq.dispatched_index
        if dispatched > applied:  # dispatched entries were committed
            self._replay(applied + 1, dispatched)
            applied = dispatched
        state = self.state
        state.take_deleted()
        if self._cq.recovery.needs_rebuild:
            self._cq.rebuild(log.first_index, applied, dict(state.queue_next),
                             state.deleted_before)
        else:
            for topic, index in state.deleted_before.items():
                if index > dispatched:
                    self._cq.drop_topic(topic, index)
            self._cq.dispatch_committed(applied, skip_before=state.deleted_before)
        return applied

    def _replay(self, lo: int, hi: int) -> None:
        for entry in read_committed(self._log, lo, hi):
            self.state.apply(entry)
            self._record(entry)

    def apply(self, entries: Sequence[Entry]) -> ApplyRest:
        """The state now, the queues in the rest, as `Broker._apply` splits them."""
        scanned = [scan_body(e.body) if e.kind == KIND_MESSAGES else None for e in entries]
        state = self.state
        for entry, columns in zip(entries, scanned, strict=True):
            state.apply(entry, columns)
            self._record(entry)
        return partial(self._dispatch, entries, scanned)

    def _dispatch(self, entries: Sequence[Entry],
                  scanned: Sequence[RecordColumns | None]) -> None:
        state = self.state
        for topic in state.take_deleted():
            self.cq.drop_topic(topic, state.deleted_before[topic])
        self.cq.dispatch(entries, scanned, skip_before=state.deleted_before)
        self._batches += 1
        if self._batches % CHECKPOINT_EVERY == 0 and \
                self.cq.dispatched_index <= self._log.durable_index:
            self.cq.checkpoint()

    def snapshot_state(self) -> tuple[int, bytes]:
        return self.state.applied_index, self.state.to_snapshot()

    def install(self, info: SnapshotInfo) -> None:
        """The node installed a leader's snapshot: its state, and queues
        rebuilt from the installed log with its counts."""
        self.state = BrokerState.from_snapshot(read_state(info))
        self.cq.rebuild(self._log.first_index, info.index, dict(self.state.queue_next),
                        self.state.deleted_before)

    def check(self) -> str | None:
        """Both counts of messages per queue come from the same log: they agree."""
        for key, queue in self.cq.queues.items():
            if self.state.queue_next.get(key, 0) != queue.max_offset:
                return (f"queue {key}: state machine counts {self.state.queue_next.get(key, 0)}"
                        f" messages, ConsumeQueue {queue.max_offset}")
        if self.cq.dispatched_index != self.state.applied_index:
            return (f"dispatched {self.cq.dispatched_index} but applied "
                    f"{self.state.applied_index}")
        return None

    def summary(self) -> object:
        """Applied index, queue ends and a digest of the whole replicated state
        (its snapshot encoding is canonical). Queue *starts* are left out:
        replicas delete their logs below different snapshots, and so are
        queues that never held a unit: a replica whose unsynced tail a power
        cut took (flush=async) cuts its ConsumeQueues back to the log and can
        keep an empty one, which serves what an absent one does (seed
        19300254: T0/1 empty on n1, absent on the others)."""
        return (self.state.applied_index, sorted(self.state.queue_next.items()),
                sorted((k, q.max_offset) for k, q in self.cq.queues.items() if q.max_offset),
                hashlib.blake2b(self.state.to_snapshot(), digest_size=16).hexdigest())
