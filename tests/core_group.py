"""A small synchronous driver of real `RaftNode`s over `MemoryLogStorage`
for the core's tests (`Group`): a Ready is persisted (snapshot first, then
entries and hard state) before its messages are queued, as the Ready
contract asks."""

from __future__ import annotations

import random

from dledger import (
    Bugs,
    Config,
    EntryKind,
    MemoryLogStorage,
    Message,
    RaftNode,
    Ready,
    segment_placement,
)
from election.config import ElectionConfig
from election.roles import Role

PLACE = segment_placement(256)


class Group:
    """N nodes, one message queue, synchronous persistence; node ids 1..N."""

    def __init__(self, n: int = 3, bugs: Bugs | None = None, **config: int) -> None:
        self.ids = list(range(1, n + 1))
        self.storages = {i: MemoryLogStorage() for i in self.ids}
        self.config = config
        self.bugs = bugs or Bugs()
        self.nodes: dict[int, RaftNode] = {}
        for i in self.ids:
            self.start(i)
        self.queue: list[Message] = []
        self.isolated: set[int] = set()
        self.readies: dict[int, list[Ready]] = {i: [] for i in self.ids}

    def start(self, i: int, applied: int = 0) -> RaftNode:
        election = ElectionConfig(election_timeout_ticks=10, heartbeat_interval_ticks=1,
                                  pre_vote=True, check_quorum=True)
        cfg = Config(i, frozenset(self.ids), election=election, bugs=self.bugs, **self.config)
        node = RaftNode(cfg, self.storages[i], random.Random(i), PLACE, applied=applied)
        self.nodes[i] = node
        return node

    def persist(self, i: int, ready: Ready) -> None:
        storage = self.storages[i]
        if ready.snapshot is not None:
            storage.install(ready.snapshot)
        storage.append(ready.entries)
        if ready.hard_state is not None:
            storage.set_hard_state(ready.hard_state)

    def process(self, i: int) -> bool:
        node = self.nodes[i]
        did = False
        while node.has_ready():
            ready = node.ready()
            self.readies[i].append(ready)
            self.persist(i, ready)
            self.queue.extend(ready.messages)
            self.queue.extend(ready.messages_after_persist)
            node.advance(ready)
            did = True
        return did

    def deliver(self) -> bool:
        due, self.queue = self.queue, []
        for msg in due:
            if msg.src not in self.isolated and msg.dst not in self.isolated:
                self.nodes[msg.dst].step(msg)
        return bool(due)

    def stabilize(self) -> None:
        for _ in range(500):
            progressed = False
            for i in self.ids:
                progressed |= self.process(i)
            progressed |= self.deliver()
            if not progressed:
                return
        raise AssertionError("group did not settle")

    def tick(self, i: int, times: int = 1) -> None:
        for _ in range(times):
            self.nodes[i].tick()

    def settle(self, leader: int) -> None:
        """Stabilize, and let the leader's next heartbeat (every tick here)
        tell the followers its last commit (an idle group's commit travels no
        sooner: RaftNode rule 6)."""
        self.stabilize()
        self.tick(leader)
        self.stabilize()

    def elect(self, i: int) -> RaftNode:
        self.nodes[i].campaign()
        self.settle(i)
        assert self.nodes[i].role is Role.LEADER
        return self.nodes[i]

    def propose(self, i: int, count: int) -> None:
        for k in range(count):
            self.nodes[i].propose(EntryKind.MESSAGES, f"m{k}".encode() * 3)
        self.settle(i)

    def sent(self, kind: type[Message], dst: int | None = None) -> list[Message]:
        return [m for m in self.queue if isinstance(m, kind) and (dst is None or m.dst == dst)]
