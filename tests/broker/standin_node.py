"""A one-node stand-in for `dledger.node` (same contract, no replication).

Lets the broker's handlers be tested in-process over real sockets on a real
CommitLog, independently of the Raft runtime: a single node is its own
quorum, so a proposal is committed as soon as it is appended. The
multi-process tests use the real runtime.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from commitlog import KIND_NOOP, CommitLog, CommitLogConfig, Entry, HardState


class NotLeaderError(Exception):
    def __init__(self, leader_id: int | None) -> None:
        super().__init__(f"not leader; leader is {leader_id}")
        self.leader_id = leader_id


class ProposalUnknown(Exception):
    pass


@dataclass
class NodeConfig:
    group: str
    node_id: int
    peers: dict[int, tuple[str, int]]
    data_dir: str
    flush: str = "async"
    replicate: str = "sync"
    tick_ms: int = 50
    election_timeout_ticks: int = 10
    heartbeat_interval_ticks: int = 1
    preferred_leader: int = 0
    segment_size_bytes: int = 256 << 20
    commitlog: CommitLogConfig | None = None
    bind_host: str | None = None


class RaftGroupNode:
    def __init__(self, config: NodeConfig, apply: Callable[[Sequence[Entry]], None],
                 on_soft_state: Callable[[Any], None] | None = None) -> None:
        self.config = config
        self.log = CommitLog.open(config.data_dir, config.commitlog or CommitLogConfig())
        self._apply = apply
        self._on_soft_state = on_soft_state
        self.role = "follower"
        self.term = self.log.load_hard_state().term
        self.leader_id: int | None = None
        self.commit_index = 0
        self.applied_index = 0
        self.leader_ready = False
        # Tests flip this to see how the broker answers on a follower.
        self.forced_follower_of: int | None = None

    @property
    def last_index(self) -> int:
        return self.log.last_index

    async def start(self, applied_index: int) -> None:
        self.applied_index = self.commit_index = applied_index
        if self.log.last_index > applied_index:
            entries = self.log.read_entries(applied_index + 1, self.log.last_index + 1)
            self._commit(entries)
        self.term += 1
        self.log.save_hard_state(HardState(self.term, self.config.node_id, self.commit_index))
        self.role, self.leader_id = "leader", self.config.node_id
        self._commit(self._append(KIND_NOOP, b""))
        self.leader_ready = True
        if self._on_soft_state:
            self._on_soft_state(SimpleNamespace(role="leader", leader_id=self.leader_id,
                                                term=self.term))

    def _append(self, kind: int, body: bytes) -> list[Entry]:
        entries = self.log.build_entries(self.term, [(kind, body)])
        self.log.append(entries)
        if self.config.flush == "sync":
            self.log.flush()
        return entries

    def _commit(self, entries: list[Entry]) -> None:
        self.commit_index = entries[-1].index
        self._apply(entries)
        self.applied_index = entries[-1].index

    def step_down(self, leader_id: int) -> None:
        self.role, self.leader_id, self.leader_ready = "follower", leader_id, False

    async def propose(self, kind: int, body: bytes, timeout: float = 3.0) -> Entry:
        if self.role != "leader":
            raise NotLeaderError(self.leader_id)
        entries = self._append(kind, body)
        self._commit(entries)
        return entries[0]

    async def wait_leader_ready(self, timeout: float) -> None:
        return None

    def status(self) -> dict[str, Any]:
        return {"role": self.role, "term": self.term, "commit_index": self.commit_index}

    async def stop(self) -> None:
        self.log.save_hard_state(HardState(self.term, self.config.node_id, self.commit_index))
        self.log.close()
