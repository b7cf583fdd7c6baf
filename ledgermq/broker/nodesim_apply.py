"""The broker's apply path for the real-node simulator (`dledger/testing/nodesim`).

The simulator may not import `ledgermq.broker` or `consumequeue` (the
`floors` import contract), so this module, which may, supplies its applier: the broker's real state
machine (`BrokerState.apply`) and ConsumeQueue dispatch
(`ConsumeQueueStore`) on the node's (simulated) files, replayed on restart the
way `Broker._recover` does it, with a ConsumeQueue checkpoint every few
applied batches once the CommitLog is durable that far (as the broker's
checkpoint loop waits for it). Nothing here is simulated: the simulator only
swaps the file system underneath.
"""

from __future__ import annotations

from collections.abc import Sequence

from commitlog import KIND_MESSAGES, CommitLog, Entry
from commitlog.columns import scan_body
from consumequeue import ConsumeQueueStore
from dledger.testing.nodesim.apply import Record, read_committed
from ledgermq.broker.state import BrokerState

CHECKPOINT_EVERY = 8  # applied batches between ConsumeQueue checkpoints


class BrokerApplier:
    """`dledger.testing.nodesim.apply.Applier` running the broker's state machine."""

    def __init__(self, log: CommitLog, data_dir: str, record: Record) -> None:
        self._log = log
        self._record = record
        self.state = BrokerState()
        # Small unit files, so dispatch rolls files and recovery sees several.
        self.cq = ConsumeQueueStore(data_dir, log, units_per_file=64)
        self._batches = 0

    def recover(self) -> int:
        """Replay up to the saved commit index (or what the queues already
        hold), like `Broker._recover`."""
        log = self._log
        applied = min(max(log.load_hard_state().commit, self.cq.dispatched_index),
                      log.last_index)
        for entry in read_committed(log, 1, applied):
            self.state.apply(entry)
            self._record(entry)
        self.cq.dispatch_committed(applied)
        return applied

    def apply(self, entries: Sequence[Entry]) -> None:
        scanned = [scan_body(e.body) if e.kind == KIND_MESSAGES else None for e in entries]
        for entry, columns in zip(entries, scanned, strict=True):
            self.state.apply(entry, columns)
            self._record(entry)
        self.cq.dispatch(entries, scanned)
        self._batches += 1
        if self._batches % CHECKPOINT_EVERY == 0 and \
                self.cq.dispatched_index <= self._log.durable_index:
            self.cq.checkpoint()

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
        return (self.state.applied_index, sorted(self.state.queue_next.items()),
                sorted((k, q.min_offset, q.max_offset) for k, q in self.cq.queues.items()))
