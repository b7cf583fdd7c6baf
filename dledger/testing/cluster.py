"""`SimCluster`: N `RaftNode`s, one `SimNetwork`, one `SimDisk` each, on a seeded event queue.

Theory of operation
-------------------
Time is an integer count of simulated units. Each node ticks every
`tick_period[node]` units; the periods differ per node (clock skew). Events
(message arrival, tick, fsync completion, client proposal, nemesis action)
sit in a heap ordered by (time, sequence number), so a run is a pure function
of its seed. After every event that touched a node, the node's Ready is
handled the way the real driver will: write entries and hard state, send
`messages`, and once the (simulated) fsync completes, send
`messages_after_persist`, apply `committed_entries` and `advance`.

`SafetyChecker` observes every write, send, commit and leader on the spot, so
the first broken invariant stops the run at the step that broke it.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from dledger.config import Bugs, Config
from dledger.entry import Entry, segment_placement
from dledger.invariants import SafetyChecker
from dledger.messages import Message
from dledger.raw_node import NotLeader, RaftNode
from dledger.ready import Ready
from dledger.testing.disk import SimDisk
from dledger.testing.network import SimNetwork
from election.config import ElectionConfig
from election.roles import Role

# Event kinds, in the order they are processed when due at the same time.
DELIVER, TICK, SYNC_DONE, CALL = range(4)


@dataclass
class Proposal:
    """One client write as the client saw it."""

    data: bytes
    node: int
    index: int = 0
    term: int = 0
    acked: bool = False  # the proposing leader applied it: the client was told "committed"
    rejected: bool = False  # NotLeader: the client was told "failed"


@dataclass
class SimStats:
    steps: int = 0
    elections: int = 0
    crashes: int = 0
    proposals: int = 0
    writes_lost: int = 0
    trace: deque[str] = field(default_factory=lambda: deque(maxlen=60))


class SimCluster:
    """The whole simulated group; drive it with `run_until`."""

    def __init__(
        self,
        seed: int,
        node_count: int,
        bugs: Bugs,
        *,
        segment_size_bytes: int = 1024,
        election: ElectionConfig | None = None,
        trace: Callable[[str], None] | None = None,
    ) -> None:
        self.rng = random.Random(seed)
        self.node_ids = list(range(1, node_count + 1))
        self.voters = frozenset(self.node_ids)
        self.bugs = bugs
        self.place = segment_placement(segment_size_bytes)
        self.network = SimNetwork(self.rng, self.node_ids)
        # Pre-vote and check-quorum are options of the protocol, so every
        # combination must be safe; runs without them churn leaders harder.
        self.election = election or ElectionConfig(
            election_timeout_ticks=10,
            heartbeat_interval_ticks=2,
            pre_vote=self.rng.random() < 0.7,
            check_quorum=self.rng.random() < 0.7,
        )
        self.disks = {n: SimDisk() for n in self.node_ids}
        self.nodes: dict[int, RaftNode | None] = {}
        # Incremented on every crash so that stale fsync completions are ignored.
        self.generation = dict.fromkeys(self.node_ids, 0)
        self.syncing: dict[int, Ready | None] = dict.fromkeys(self.node_ids)
        # Clock skew: every node's tick lasts a different number of units.
        self.tick_period = {n: 10 + self.rng.randint(-3, 3) for n in self.node_ids}
        # Batch and window sizes vary per run: one-entry batches split a new
        # leader's catch-up from its NOOP, which is where Figure 8 hides.
        self.append_entries_max = self.rng.choice((1, 2, 8))
        self.inflight_max = self.rng.choice((1, 4))
        self.now = 0
        self._queue: list[tuple[int, int, int, object]] = []
        self._seq = 0
        self.checker = SafetyChecker()
        self.stats = SimStats()
        self.proposals: list[Proposal] = []
        self._by_position: dict[tuple[int, int], Proposal] = {}
        self._trace_out = trace
        # Nemesis "leader killer": chance that a new leader crashes shortly after winning.
        self.leader_kill_probability = 0.0
        # Cleared when the liveness phase starts: faults already scheduled
        # (a pending leader kill) must not fire into the healed cluster.
        self.faults_active = True
        for n in self.node_ids:
            self._start(n)
            self._schedule(self.rng.randint(1, self.tick_period[n]), TICK, n)

    # ---------------------------------------------------------------- events

    def _schedule(self, at: int, kind: int, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (at, self._seq, kind, payload))

    def call_at(self, at: int, action: Callable[[], None]) -> None:
        self._schedule(at, CALL, action)

    def log(self, text: str) -> None:
        line = f"t={self.now} {text}"
        self.stats.trace.append(line)
        if self._trace_out is not None:
            self._trace_out(line)

    def run_until(self, end: int, stop: Callable[[], bool] | None = None) -> None:
        """Process events due before `end` (or until `stop()` holds, checked each event)."""
        queue = self._queue
        while queue and queue[0][0] < end:
            at, _, kind, payload = heapq.heappop(queue)
            self.now = at
            self.stats.steps += 1
            if kind == DELIVER:
                self._deliver(payload)  # type: ignore[arg-type]
            elif kind == TICK:
                self._tick(payload)  # type: ignore[arg-type]
            elif kind == SYNC_DONE:
                self._sync_done(payload)  # type: ignore[arg-type]
            else:
                payload()  # type: ignore[operator]
            if stop is not None and stop():
                return
        self.now = max(self.now, end)

    # ------------------------------------------------------------- lifecycle

    def _start(self, n: int) -> None:
        config = Config(
            node_id=n,
            voters=self.voters,
            election=self.election,
            append_entries_max=self.append_entries_max,
            append_bytes_max=2048,
            inflight_max=self.inflight_max,
            resend_ticks=4,
            bugs=self.bugs,
        )
        rng = random.Random(self.rng.getrandbits(64))
        self.nodes[n] = RaftNode(config, self.disks[n].volatile, rng, self.place)

    def crash(self, n: int) -> None:
        if self.nodes[n] is None:
            return
        self.nodes[n] = None
        self.syncing[n] = None
        self.generation[n] += 1
        lost = self.disks[n].crash(self.rng)
        self.stats.crashes += 1
        self.stats.writes_lost += lost
        self.log(f"crash {n} (lost {lost} unsynced writes)")
        self.checker.observe_durable_logs(
            {m: self.disks[m].durable_term_any for m in self.node_ids}
        )
        self._check_electable()

    def _kill(self, n: int) -> None:
        if self.faults_active:
            self.crash(n)

    def restart(self, n: int) -> None:
        if self.nodes[n] is not None:
            return
        self._start(n)
        node = self.nodes[n]
        assert node is not None
        self.log(f"restart {n} term={node.term} last={node.log.last_index} commit={node.commit}")
        self._schedule(self.now + self.rng.randint(1, self.tick_period[n]), TICK, n)
        self._drain(n)

    def alive(self) -> list[RaftNode]:
        return [node for node in self.nodes.values() if node is not None]

    # --------------------------------------------------------------- handlers

    def _tick(self, n: int) -> None:
        node = self.nodes[n]
        if node is None:
            return  # a crashed node's tick chain ends; restart starts a new one
        node.tick()
        self._after_step(n)
        self._schedule(self.now + self.tick_period[n], TICK, n)

    def _deliver(self, msg: Message) -> None:
        node = self.nodes[msg.dst]
        if node is None:
            return
        node.step(msg)
        self._after_step(msg.dst)

    def _after_step(self, n: int) -> None:
        node = self.nodes[n]
        assert node is not None
        if node.role is Role.LEADER:
            before = self.checker.leaders.get(node.term)
            self.checker.observe_leader(n, node.term, node.log.term_or_none)
            if before is None:
                self.stats.elections += 1
                self.log(f"leader {n} term={node.term} last={node.log.last_index}")
                if self.rng.random() < self.leader_kill_probability:
                    self.call_at(self.now + self.rng.randint(1, 30), lambda: self._kill(n))
        self._drain(n)

    def _send(self, n: int, messages: tuple[Message, ...]) -> None:
        disk = self.disks[n]
        for msg in messages:
            self.checker.observe_sent(msg, disk.durable_hard_state, disk.durable_term)
            for at in self.network.arrivals(msg, self.now):
                self._schedule(at, DELIVER, msg)

    def _drain(self, n: int) -> None:
        """Handle Readies until the node has none or waits for an fsync."""
        node = self.nodes[n]
        while node is not None and self.syncing[n] is None and node.has_ready():
            ready = node.ready()
            disk = self.disks[n]
            if ready.entries:
                first = ready.entries[0].index
                prev_term = node.log.term_or_none(first - 1)
                self.checker.observe_written(ready.entries, prev_term or 0)
                self._check_electable()
            disk.write(ready.hard_state, ready.entries)
            self._send(n, ready.messages)
            if ready.must_sync:
                self.syncing[n] = ready
                delay = self.rng.randint(1, 6)
                self._schedule(self.now + delay, SYNC_DONE, (n, self.generation[n]))
                return
            self._finish(n, ready)

    def _sync_done(self, payload: tuple[int, int]) -> None:
        n, generation = payload
        ready = self.syncing[n]
        if generation != self.generation[n] or ready is None:
            return  # the node crashed while this fsync was pending
        self.syncing[n] = None
        self.disks[n].sync()
        self._finish(n, ready)
        self._after_step(n)

    def _finish(self, n: int, ready: Ready) -> None:
        node = self.nodes[n]
        assert node is not None
        self._send(n, ready.messages_after_persist)
        if ready.committed_entries:
            self._apply(n, ready.committed_entries)
        node.advance(ready)

    def _check_electable(self) -> None:
        latest = self.checker.latest_committed()
        if latest is None:
            return
        candidates: dict[int, tuple[bool, int, int]] = {}
        voters: dict[int, tuple[int, int]] = {}
        for n in self.node_ids:
            disk = self.disks[n]
            durable = disk.durable_entries
            voters[n] = (durable[-1].term, durable[-1].index) if durable else (0, 0)
            node = self.nodes[n]
            if node is None:
                holds = disk.durable_term_any(latest.index) == latest.term
                candidates[n] = (holds, voters[n][0], voters[n][1])
            else:
                holds = node.log.term_or_none(latest.index) == latest.term
                candidates[n] = (holds, node.log.last_term(), node.log.last_index)
        self.checker.observe_electable(candidates, voters)

    def _apply(self, n: int, entries: tuple[Entry, ...]) -> None:
        self.checker.observe_committed(entries)
        self._check_electable()
        for entry in entries:
            proposal = self._by_position.get((entry.index, entry.term))
            if proposal is not None and proposal.node == n and proposal.data == entry.data:
                proposal.acked = True

    # ----------------------------------------------------------------- client

    def propose(self, data: bytes) -> None:
        """A client write sent to the node it believes leads (or any live node)."""
        leaders = [node for node in self.alive() if node.role is Role.LEADER]
        target = self.rng.choice(leaders or self.alive() or [None])
        self.stats.proposals += 1
        if target is None:
            self.proposals.append(Proposal(data, 0, rejected=True))
            return
        proposal = Proposal(data, target.id)
        try:
            index, term = target.propose(1, data)
        except NotLeader:
            proposal.rejected = True
        else:
            proposal.index, proposal.term = index, term
            self._by_position[(index, term)] = proposal
        self.proposals.append(proposal)
        self._after_step(target.id)
