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
`messages_after_persist`, apply `committed_entries` and `advance`. A
leader's Ready that waits only for its entries' fsync while earlier entries
are still in flight is advanced at once (`advance(ready, durable=False)`)
and its fsync's end reported with `durable_to`, as the runtime does
(docs/raft.md, "Apply"): its next Ready goes out meanwhile. A lone one
waits, as the runtime syncs it in place.

`SafetyChecker` observes every write, send, commit and leader on the spot, so
the first broken invariant stops the run at the step that broke it.

Timing comes from a `FaultProfile` (`dledger.testing.faults`): fsync latency,
message delays and their tail, process pauses and clock skew. A paused node
processes nothing (its ticks are counted, its messages and fsync completions
wait) until it resumes, then takes the missed ticks as one burst or drops
them, as drivers differ.

flush=async (`flush_async=True`) models the runtime's `flush="async"`: a
Ready's entries are written and acknowledged without waiting; only a new term
or vote waits, for the fsync of the hard state alone; a background flush every
few ticks makes the writes issued before it durable. A crash therefore loses
acknowledged entries, which the contract allows. A node that finds its
committed prefix contradicted by the leader raises `CommittedDivergence`: in
async mode it stops for good (recorded in `stopped`), in sync mode that is a
violation.

Each node applies committed entries to a `SimStateMachine`; with compaction
on (`dledger.testing.compaction`), nodes snapshot it and delete log prefixes,
and followers too far behind install a leader's snapshot (Ready.snapshot,
installed before the Ready's entries). A node restarts from its durable
snapshot plus the log after it. The checks read a compacted entry through
the node's snapshot (`term_at`, `entries_of`).

Leader-connection notices (`dledger.testing.connloss`): followers of a
crashed node are told after a grace that its connections closed, and now
and then a follower of a live leader is told so wrongly.

Membership: every node has a data-directory id (drawn from the run's
identity rng) and starts from the bootstrap configuration of the first
`node_count` nodes. `add_node` starts a new, empty node (a member once a
configuration adds it, `dledger.testing.membership`), `wipe` restarts a node
on an empty disk under a new directory id, `decommission` stops a removed
node for good. The checks count voters of the configuration that matters
(the claiming leader's, each candidate's own) under their pinned directory.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from dledger.config import Bugs, Config
from dledger.entry import Entry, EntryKind, segment_placement
from dledger.invariants import SafetyChecker, SafetyViolation
from dledger.log import UNLIMITED, CommittedDivergence
from dledger.membership import Membership, bootstrap
from dledger.messages import AppendRequest, InstallSnapshot, Message
from dledger.raw_node import NotLeader, RaftNode
from dledger.ready import Ready
from dledger.storage import LogUnavailable
from dledger.testing.compaction import SnapshotSim
from dledger.testing.connloss import ConnectionLossSim
from dledger.testing.disk import SimDisk
from dledger.testing.faults import CLASSIC, FaultProfile
from dledger.testing.membership import MembershipSim
from dledger.testing.network import SimNetwork
from dledger.testing.statemachine import SimStateMachine
from election.config import ElectionConfig
from election.roles import Role

# Events besides a message's arrival (a `Message` is its own event). Events due
# at the same time run in the order they were scheduled.


@dataclass(frozen=True, slots=True)
class _Tick:
    node: int


@dataclass(frozen=True, slots=True)
class _SyncDone:
    """The fsync of a Ready completes (ignored if the node crashed meanwhile)."""

    node: int
    generation: int


@dataclass(frozen=True, slots=True)
class _FlushDone:
    """flush=async: a background flush made writes up to `upto` durable; or
    (`leader`) the fsync of a leader's Ready it advanced before that fsync."""

    node: int
    generation: int
    upto: int
    leader: bool = False


@dataclass(frozen=True, slots=True)
class _Resume:
    node: int
    generation: int


@dataclass(frozen=True, slots=True)
class _Call:
    """A client proposal or a nemesis action."""

    action: Callable[[], None]


_Event = Message | _Tick | _SyncDone | _FlushDone | _Resume | _Call


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
    pauses: int = 0
    stale_appends: int = 0
    # Restarts of a node whose durable log starts after a snapshot.
    snapshot_restarts: int = 0
    wipes: int = 0
    # Entries a leader applied while its own fsync of them ran.
    applied_before_fsync: int = 0
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
        profile: FaultProfile = CLASSIC,
        flush_async: bool = False,
        rng: random.Random | None = None,
        compaction: bool = False,
        compaction_rng: random.Random | None = None,
        install_mutant: str | None = None,
        identity_rng: random.Random | None = None,
        promote_lag_max: int = 0,
        membership: bool = False,
        membership_rng: random.Random | None = None,
        connection_loss: bool = False,
        connection_loss_rng: random.Random | None = None,
        reserve_batch: int = 0,
        reserve_bytes: int = 64 * 1024,
    ) -> None:
        self.rng = rng or random.Random(seed)
        # Directory ids come from their own rng: the main one's draws stay as they were.
        self.identity_rng = identity_rng or random.Random(f"identity:{seed}")
        self.promote_lag_max = promote_lag_max
        self.reserve_batch = reserve_batch  # RaftNode rule 8; 0: off
        self.reserve_bytes = reserve_bytes
        # Compaction draws come from their own rng (see dledger.testing.compaction).
        self.snapshots = SnapshotSim(
            self, compaction_rng or random.Random(f"compaction:{seed}"), compaction,
            install_mutant,
        )
        self.profile = profile
        self.flush_async = flush_async
        self.node_ids = list(range(1, node_count + 1))
        self.voters = frozenset(self.node_ids)
        self.bootstrap: Membership = bootstrap(dict.fromkeys(self.node_ids, ""))
        self.directory = {n: self._new_directory() for n in self.node_ids}
        # Removed nodes stopped for good when the group is healed.
        self.decommissioned: set[int] = set()
        # Configuration of a crashed node's durable log (what it restarts with).
        self._crashed_view: dict[int, Membership] = {}
        # Voters (with pins) of the configuration of the last leader claim.
        self._claim_voters: tuple[tuple[int, int], ...] = ()
        self.bugs = bugs
        self.place = segment_placement(segment_size_bytes)
        self.network = SimNetwork(self.rng, self.node_ids)
        faults = self.network.faults
        faults.delay_control = profile.delay_control
        faults.delay_replication = profile.delay_replication
        faults.long_delay_probability = profile.long_delay_probability
        faults.long_delay_units = profile.long_delay_units
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
        self.tick_period = {n: self.rng.randint(*profile.tick_period_units) for n in self.node_ids}
        # Batch and window sizes vary per run: one-entry batches split a new
        # leader's catch-up from its NOOP, which is where Figure 8 hides.
        self.append_entries_max = self.rng.choice((1, 2, 8))
        self.inflight_max = self.rng.choice((1, 4))
        self.now = 0
        self._queue: list[tuple[int, int, _Event]] = []
        self._seq = 0
        self.checker = SafetyChecker(flush_async=flush_async)
        self.checker.bootstrap = self.bootstrap
        self.stats = SimStats()
        self.proposals: list[Proposal] = []
        self._by_position: dict[tuple[int, int], Proposal] = {}
        self._trace_out = trace
        # Nemesis "leader killer": chance that a new leader crashes shortly after winning.
        self.leader_kill_probability = 0.0
        # Cleared when the liveness phase starts: faults already scheduled
        # (a pending leader kill) must not fire into the healed cluster.
        self.faults_active = True
        # Process pauses: until when, ticks missed, and whether they burst on resume.
        self.paused_until = dict.fromkeys(self.node_ids, 0)
        self.missed_ticks = dict.fromkeys(self.node_ids, 0)
        self._pause_burst = dict.fromkeys(self.node_ids, False)
        # flush=async: background flush every few ticks, one at a time per node.
        self.flush_every = {n: self.rng.randint(2, 6) for n in self.node_ids}
        self._ticks_since_flush = dict.fromkeys(self.node_ids, 0)
        self._flushing = dict.fromkeys(self.node_ids, False)
        # Nodes stopped for good after detecting lost committed data (async only).
        self.stopped: dict[int, str] = {}
        # Highest commit index each node has claimed so far (checked on change).
        self._claimed = dict.fromkeys(self.node_ids, 0)
        # Entries each running incarnation handed to its state machine.
        self.applied_logs: dict[int, dict[int, Entry]] = {n: {} for n in self.node_ids}
        # Each running incarnation's state machine (from its durable snapshot on restart).
        self.machines: dict[int, SimStateMachine] = {}
        # Scenario hooks: called with (node id) when a node first leads a term.
        self.on_new_leader: Callable[[int], None] | None = None
        # A running scenario holds off the random nemesis and the leader killer.
        self.scenario_active = False
        for n in self.node_ids:
            self._start(n)
            self._schedule(self.rng.randint(1, self.tick_period[n]), _Tick(n))
        self.snapshots.start()
        # Leader-connection notices (their own rng, like compaction's).
        self.connloss = ConnectionLossSim(
            self, connection_loss_rng or random.Random(f"connloss:{seed}"), connection_loss)
        # Membership plans and wipes (their own rng, like compaction's).
        self.members = MembershipSim(
            self, membership_rng or random.Random(f"membership:{seed}"), membership, node_count)

    # ---------------------------------------------------------------- events

    def _schedule(self, at: int, event: _Event) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (at, self._seq, event))

    def call_at(self, at: int, action: Callable[[], None]) -> None:
        self._schedule(at, _Call(action))

    def log(self, text: str) -> None:
        line = f"t={self.now} {text}"
        self.stats.trace.append(line)
        if self._trace_out is not None:
            self._trace_out(line)

    def run_until(self, end: int, stop: Callable[[], bool] | None = None) -> None:
        """Process events due before `end` (or until `stop()` holds, checked each event)."""
        queue = self._queue
        while queue and queue[0][0] < end:
            at, _, event = heapq.heappop(queue)
            self.now = at
            self.stats.steps += 1
            match event:
                case Message():
                    if not self._defer(event.dst, event):
                        self._deliver(event)
                case _Tick():
                    self._tick(event.node)
                case _SyncDone():
                    if not self._defer(event.node, event):
                        self._sync_done(event)
                case _FlushDone():
                    if not self._defer(event.node, event):
                        self._flush_done(event)
                case _Resume():
                    self._resume(event)
                case _Call():
                    event.action()
            if stop is not None and stop():
                return
        self.now = max(self.now, end)

    def _defer(self, n: int, event: _Event) -> bool:
        """A paused node processes nothing: push the event to its resume time."""
        until = self.paused_until[n]
        if self.now < until:
            self._schedule(until, event)
            return True
        return False

    # ------------------------------------------------------------- lifecycle

    def _new_directory(self) -> int:
        return self.identity_rng.randrange(1, 1 << 63)

    def add_node(self, n: int) -> None:
        """Start node `n` on a new, empty disk; it joins once a configuration adds it."""
        if n in self.disks:
            raise ValueError(f"node {n} exists")
        self.node_ids.append(n)
        self.directory[n] = self._new_directory()
        self.disks[n] = SimDisk()
        self.generation[n] = 0
        self.syncing[n] = None
        self.tick_period[n] = self.rng.randint(*self.profile.tick_period_units)
        self.paused_until[n] = 0
        self.missed_ticks[n] = 0
        self._pause_burst[n] = False
        self.flush_every[n] = self.rng.randint(2, 6)
        self._ticks_since_flush[n] = 0
        self._flushing[n] = False
        self._claimed[n] = 0
        self.applied_logs[n] = {}
        self.nodes[n] = None
        if self.network.node_ids is not self.node_ids:
            self.network.node_ids.append(n)
        self.log(f"add node {n} directory={self.directory[n]:#x}")
        self.restart(n)

    def wipe(self, n: int) -> None:
        """Node `n` loses its disk: it restarts empty, under a new directory id."""
        if n in self.stopped or n in self.decommissioned:
            return
        self.crash(n)
        old = self.directory[n]
        self.disks[n] = SimDisk()
        self._crashed_view.pop(n, None)
        self.directory[n] = self._new_directory()
        self.checker.observe_wipe(n, self.directory[n])
        self.stats.wipes += 1
        self.log(f"wipe {n}: directory {old:#x} -> {self.directory[n]:#x}")
        self.restart(n)

    def decommission(self, n: int) -> None:
        """A removed node is stopped for good (what the runtime does once it learns it)."""
        if n in self.decommissioned:
            return
        self.crash(n)
        self.decommissioned.add(n)
        self.log(f"decommission {n}")

    def view_of(self, n: int) -> Membership:
        """The configuration node `n` acts on: in memory, or its durable log's when down."""
        node = self.nodes[n]
        if node is not None:
            return node.membership
        view = self._crashed_view.get(n)
        if view is None:
            view = self.disks[n].durable_membership() or self.bootstrap
            self._crashed_view[n] = view
        return view

    def _start(self, n: int) -> None:
        config = Config(
            node_id=n,
            voters=self.voters,
            membership=self.bootstrap,
            directory_id=self.directory[n],
            promote_lag_max=self.promote_lag_max,
            election=self.election,
            append_entries_max=self.append_entries_max,
            append_bytes_max=2048,
            inflight_max=self.inflight_max,
            reserve_batch_entries=self.reserve_batch,
            reserve_batch_bytes=self.reserve_bytes,
            resend_ticks=4,
            snapshot_timeout_ticks=self.snapshots.snapshot_timeout_ticks,
            bugs=self.bugs,
        )
        rng = random.Random(self.rng.getrandbits(64))
        disk = self.disks[n]
        machine = SimStateMachine(disk.volatile_snapshot)
        self.machines[n] = machine
        self.nodes[n] = RaftNode(config, disk.volatile, rng, self.place, applied=machine.index)
        if disk.volatile_snapshot is not None:
            # The restarted state is the durable snapshot's: the same as every
            # other state seen at its index.
            self.checker.observe_state(n, machine.index, machine.digest)

    def crash(self, n: int) -> None:
        if self.nodes[n] is None:
            return
        self.nodes[n] = None
        self.syncing[n] = None
        self.generation[n] += 1
        self.paused_until[n] = 0
        self._flushing[n] = False
        self._claimed[n] = 0
        self.applied_logs[n] = {}
        self.machines.pop(n, None)
        lost = self.disks[n].crash(self.rng)
        self._crashed_view.pop(n, None)
        self.stats.crashes += 1
        self.stats.writes_lost += lost
        self.log(f"crash {n} (lost {lost} unsynced writes)")
        self._check_durable_quorum()
        self._check_electable()
        self.connloss.crashed(n)

    def _kill(self, n: int) -> None:
        if self.faults_active and not self.scenario_active:
            self.crash(n)

    def stop_for_good(self, n: int, reason: str) -> None:
        """flush=async: the node found its committed log contradicted; it stops, not restarts."""
        self.log(f"stop {n}: {reason}")
        self.crash(n)
        self.stopped[n] = reason

    def pause(self, n: int, units: int, burst: bool) -> None:
        """Process pause: `n` handles nothing for `units`, then resumes (see module doc)."""
        if self.nodes[n] is None or self.now < self.paused_until[n]:
            return
        self.paused_until[n] = self.now + units
        self.missed_ticks[n] = 0
        self._pause_burst[n] = burst
        self.stats.pauses += 1
        self.log(f"pause {n} for {units} ({'burst' if burst else 'drop'} ticks on resume)")
        self._schedule(self.now + units, _Resume(n, self.generation[n]))

    def _resume(self, event: _Resume) -> None:
        n, generation = event.node, event.generation
        node = self.nodes[n]
        if node is None or generation != self.generation[n]:
            return
        missed = self.missed_ticks[n] if self._pause_burst[n] else 0
        self.missed_ticks[n] = 0
        self.log(f"resume {n} ({missed} ticks at once)")
        for _ in range(missed):
            node.tick()
        self._after_step(n)

    def restart(self, n: int) -> None:
        if self.nodes[n] is not None or n in self.stopped or n in self.decommissioned:
            return
        self._start(n)
        node = self.nodes[n]
        assert node is not None
        first = node.log.first_index()
        if first > 1:
            self.stats.snapshot_restarts += 1
        self.log(f"restart {n} term={node.term} first={first} last={node.log.last_index} "
                 f"commit={node.commit}")
        self._schedule(self.now + self.rng.randint(1, self.tick_period[n]), _Tick(n))
        self._drain(n)

    def alive(self) -> list[RaftNode]:
        return [node for node in self.nodes.values() if node is not None]

    def running_ids(self) -> list[int]:
        """Nodes that are not stopped for good (alive or crashed and restartable)."""
        return [n for n in self.node_ids if n not in self.stopped and n not in self.decommissioned]

    # --------------------------------------------------------------- handlers

    def _tick(self, n: int) -> None:
        node = self.nodes[n]
        if node is None:
            return  # a crashed node's tick chain ends; restart starts a new one
        self._schedule(self.now + self.tick_period[n], _Tick(n))
        if self.now < self.paused_until[n]:
            self.missed_ticks[n] += 1  # the clock moves on; the process does not
            return
        node.tick()
        if self.flush_async:
            self._maybe_flush(n)
        self._after_step(n)

    def _maybe_flush(self, n: int) -> None:
        """flush=async: every few ticks, fsync what was written so far (in the background)."""
        self._ticks_since_flush[n] += 1
        disk = self.disks[n]
        due = self._ticks_since_flush[n] >= self.flush_every[n]
        if self._flushing[n] or not due or not disk.pending:
            return
        self._ticks_since_flush[n] = 0
        self._flushing[n] = True
        at = self.now + self.profile.fsync_delay(self.rng)
        self._schedule(at, _FlushDone(n, self.generation[n], disk.issued))

    def _flush_done(self, event: _FlushDone) -> None:
        n, generation, upto = event.node, event.generation, event.upto
        if generation != self.generation[n]:
            return
        self.disks[n].sync(upto)
        if not event.leader:
            self._flushing[n] = False
            return
        node = self.nodes[n]
        if node is not None:
            node.durable_to(self._durable_prefix(n))
            self._after_step(n)

    def _deliver(self, msg: Message) -> None:
        node = self.nodes[msg.dst]
        if node is None:
            return
        try:
            node.step(msg)
        except CommittedDivergence as exc:
            if not self.flush_async:
                raise SafetyViolation(f"node {msg.dst} under flush=sync: {exc}") from exc
            self.stop_for_good(msg.dst, str(exc))
            return
        self._after_step(msg.dst)

    def after_step(self, n: int) -> None:
        """Handle what an input to node `n` produced (Readies, checks)."""
        self._after_step(n)

    def _after_step(self, n: int) -> None:
        node = self.nodes[n]
        assert node is not None
        if node.role is Role.LEADER:
            before = self.checker.leaders.get(node.term)
            self.checker.observe_leader(n, node.term, lambda i: self.term_at(n, i))
            if before is None:
                self.stats.elections += 1
                self.log(f"leader {n} term={node.term} last={node.log.last_index}")
                self.checker.observe_election(n, node.term, self.directory[n],
                                              node.elector.elected_by)
                if self.rng.random() < self.leader_kill_probability:
                    self.call_at(self.now + self.rng.randint(1, 30), lambda: self._kill(n))
                if self.on_new_leader is not None:
                    self.on_new_leader(n)  # before the NOOP leaves: a scenario may cut links
        self._drain(n)
        self._check_claim(n)

    def _check_claim(self, n: int) -> None:
        """The commit index a node holds is a claim: check it when it moves.

        Under flush=sync the entries up to it are committed (one entry per
        index across the cluster) and the claimed entry is durable on a
        quorum; so a leader that counts its own unsynced write is caught the
        moment it claims, before any crash. Under flush=async the claim is
        not checked here (the contract lets a quorum's power loss undo it).
        """
        node = self.nodes[n]
        if node is None or node.commit <= self._claimed[n]:
            return
        low, self._claimed[n] = self._claimed[n], node.commit
        if self.flush_async:
            return
        entries = self.entries_of(n, low + 1, node.commit + 1)
        self.checker.observe_committed(entries, node.term)
        if node.role is Role.LEADER:
            # Check the claim over the voters the leader counted (its
            # configuration when the index moved: the latest in its log, or
            # under config_on_commit the committed one). A follower's
            # configuration may lag the one its leader counted.
            last = entries[-1]
            voters = node.commit_voters
            latest = self.checker.latest_committed()
            if latest is None or last.index >= latest.index:
                # The voters of the newest claim: a stale leader (paused
                # through a newer leader's term) claiming an older index
                # does not speak for the newest committed entry.
                self._claim_voters = voters
            holders, abstaining = self._holders(voters, last.index, last.term)
            self.checker.observe_leader_claim(n, last, holders, abstaining, len(voters))
        self._check_electable()

    def _holders(self, voters: tuple[tuple[int, int], ...], index: int,
                 term: int) -> tuple[int, int]:
        """(voters holding entry (index, term) durably under their pinned directory,
        voters abstaining: a wiped node's replacement, which votes for no one)."""
        holders = abstaining = 0
        for v, pinned in voters:
            directory = self.directory.get(v)
            if directory is None or v in self.stopped:
                continue
            if not self.checker.entitled(v, directory):
                abstaining += 1
            elif pinned in (0, directory) and self.disks[v].durable_term_any(index) == term:
                holders += 1
        return holders, abstaining

    def _check_durable_quorum(self) -> None:
        """After a crash: the latest committed entry is still durable on a quorum
        of the voters that committed the latest claim (flush=sync only)."""
        latest = self.checker.latest_committed()
        if self.flush_async or latest is None or not self._claim_voters:
            return
        holders, abstaining = self._holders(self._claim_voters, latest.index, latest.term)
        if holders + abstaining < len(self._claim_voters) // 2 + 1:
            raise SafetyViolation(
                f"committed entry {latest.index}/{latest.term} durable on only {holders} of "
                f"{len(self._claim_voters)} voters")

    def _send(self, n: int, messages: tuple[Message, ...]) -> None:
        disk = self.disks[n]
        stale_p = self.profile.stale_append_probability if self.faults_active else 0.0
        for msg in messages:
            self.checker.observe_sent(msg, disk.durable_hard_state, disk.durable_term)
            if isinstance(msg, InstallSnapshot):
                arrivals = self.snapshots.transfer(n, msg)
            else:
                arrivals = self.network.arrivals(msg, self.now)
            for at in arrivals:
                self._schedule(at, msg)
            if stale_p and isinstance(msg, AppendRequest) and self.rng.random() < stale_p:
                self._stale_append(n, msg)

    def _stale_append(self, n: int, msg: AppendRequest) -> None:
        """Also send an older slice of the leader's log, as a leader probing from a lower
        next index (or an old retransmission arriving late) would: prev anywhere at or
        below this append's, entries the leader holds, its commit of now. Every such
        message is legal, so a correct follower must stay safe whatever it receives."""
        node = self.nodes[n]
        if node is None or node.role is not Role.LEADER or node.term != msg.term:
            return
        # Mostly a little below (a probe that backs off further than needed),
        # sometimes anywhere down to the start of the log.
        low = 0 if self.rng.random() < 0.2 else max(0, msg.prev_index - 8)
        # Never below what the leader still holds (a real leader would send a snapshot).
        low = max(low, node.log.first_index() - 1)
        if low > msg.prev_index:
            return
        prev = self.rng.randint(low, msg.prev_index)
        count = self.rng.randint(0, self.append_entries_max)
        try:
            entries = (node.log.entries(prev + 1, prev + 1 + count, UNLIMITED, count)
                       if count else [])
            prev_term = node.log.term(prev)
        except LogUnavailable:
            return
        stale = AppendRequest(n, msg.dst, msg.term, prev, prev_term, tuple(entries), node.commit)
        self.stats.stale_appends += 1
        disk = self.disks[n]
        self.checker.observe_sent(stale, disk.durable_hard_state, disk.durable_term)
        for at in self.network.arrivals(stale, self.now):
            self._schedule(at, stale)

    def _drain(self, n: int) -> None:
        """Handle Readies until the node has none or waits for an fsync."""
        node = self.nodes[n]
        while node is not None and self.syncing[n] is None and node.has_ready():
            ready = node.ready()
            disk = self.disks[n]
            if ready.snapshot is not None:
                # Install first: the entries of this Ready follow the snapshot.
                self.snapshots.install(n, ready.snapshot)
            if ready.entries:
                first = ready.entries[0].index
                prev_term = node.log.term_or_none(first - 1)
                self.checker.observe_written(ready.entries, prev_term or 0)
                if node.role is Role.LEADER and any(
                        e.kind == EntryKind.CONFIG for e in ready.entries):
                    self._check_one_change(node)
                self._check_electable()
            durable = disk.durable_hard_state
            disk.write(ready.hard_state, ready.entries)
            self._send(n, ready.messages)
            wait = ready.must_sync
            if self.flush_async:
                # Only a new term or vote waits, for the hard-state file alone,
                # and an install, which is synchronous in every flush mode.
                hs = ready.hard_state
                wait = hs is not None and (hs.term, hs.vote) != (durable.term, durable.vote)
                wait = wait or ready.snapshot is not None
            hs = ready.hard_state
            if wait and (node.role is Role.LEADER and ready.entries and ready.snapshot is None
                         and not ready.messages_after_persist
                         and (hs is None or (hs.term, hs.vote) == (durable.term, durable.vote))
                         and node.commit < ready.entries[0].index - 1):
                # A leader's Ready whose only wait is its entries' fsync,
                # while earlier entries are still in flight: on at once, the
                # fsync's end reported by _flush_done. With nothing else in
                # flight it waits, as the runtime syncs a lone entry in place
                # (dledger/runtime/node.py, `_syncs_in_place`).
                delay = self.profile.fsync_delay(self.rng)
                self._schedule(self.now + delay, _FlushDone(n, self.generation[n], disk.issued,
                                                            leader=True))
                self._finish(n, ready, durable=False)
                continue
            if wait:
                self.syncing[n] = ready
                delay = self.profile.fsync_delay(self.rng)
                self._schedule(self.now + delay, _SyncDone(n, self.generation[n]))
                return
            self._finish(n, ready)

    def _sync_done(self, event: _SyncDone) -> None:
        n, generation = event.node, event.generation
        ready = self.syncing[n]
        if generation != self.generation[n] or ready is None:
            return  # the node crashed while this fsync was pending
        self.syncing[n] = None
        if self.flush_async and ready.snapshot is None:
            self.disks[n].sync_hard_state()
        else:
            self.disks[n].sync()
        self._finish(n, ready)
        self._after_step(n)

    def _finish(self, n: int, ready: Ready, durable: bool = True) -> None:
        node = self.nodes[n]
        assert node is not None
        self._send(n, ready.messages_after_persist)
        if ready.committed_entries:
            if node.role is Role.LEADER:
                synced = self._durable_prefix(n)
                self.stats.applied_before_fsync += sum(
                    e.index > synced for e in ready.committed_entries)
            self._apply(n, ready.committed_entries)
        node.advance(ready, durable)

    def _durable_prefix(self, n: int) -> int:
        """How far node n's current log is durable: the last durable entry
        whose term matches the log's (Log Matching covers the prefix), as a
        CommitLog's `durable_index` drops what a truncation cut."""
        node, disk = self.nodes[n], self.disks[n]
        assert node is not None
        index = min(disk.durable_last()[1], node.log.last_index)
        while index > 0:
            term = node.log.term_or_none(index)
            if term is None:
                return 0  # below what the log can tell: claims nothing new
            if disk.durable_term_any(index) == term:
                return index
            index -= 1
        return 0

    def _check_one_change(self, leader: RaftNode) -> None:
        """A leader's log holds at most one uncommitted CONFIG entry of its term."""
        first = max(leader.commit + 1, leader.log.first_index())
        mine = [e.index for e in leader.log.entries(first, leader.log.last_index + 1,
                                                     UNLIMITED, UNLIMITED)
                if e.kind == EntryKind.CONFIG and e.term == leader.term]
        if len(mine) > 1:
            raise SafetyViolation(
                f"leader {leader.id} of term {leader.term} holds {len(mine)} uncommitted "
                f"configuration entries of its term: {mine} (commit {leader.commit})")

    def _check_electable(self) -> None:
        if self.flush_async:
            return  # a crash may lose committed entries by contract
        latest = self.checker.latest_committed()
        if latest is None:
            return
        candidates: dict[int, tuple[bool, int, int]] = {}
        voters: dict[int, tuple[int, int]] = {}
        views: dict[int, tuple[frozenset[int], int]] = {}
        directory = self.directory
        for n in self.node_ids:
            if n in self.stopped or n in self.decommissioned:
                continue
            disk = self.disks[n]
            durable_last = disk.durable_last()
            if self.checker.entitled(n, directory[n]):
                voters[n] = durable_last
            view = self.view_of(n)
            if not view.can_vote(n, directory[n]):
                continue  # it never campaigns
            node = self.nodes[n]
            if node is None:
                holds = disk.durable_term_any(latest.index) == latest.term
                candidates[n] = (holds, durable_last[0], durable_last[1])
            else:
                holds = self.term_at(n, latest.index) == latest.term
                candidates[n] = (holds, node.log.last_term(), node.log.last_index)
            views[n] = self._electorate(view)
        self.checker.observe_electable(candidates, voters, views)

    def _electorate(self, view: Membership) -> tuple[frozenset[int], int]:
        """The nodes whose votes a candidate with configuration `view` counts,
        and its quorum: pinned voters under their directory once a quorum is
        pinned, else every voter not pinned elsewhere (`election.VoteTally`'s
        rule, restated)."""
        strict = sum(1 for m in view.voters if m.directory_id) >= len(view.voters) // 2 + 1
        counted = frozenset(
            m.node_id for m in view.voters
            if (m.directory_id == self.directory.get(m.node_id) if strict
                else m.directory_id in (0, self.directory.get(m.node_id))))
        return counted, len(view.voters) // 2 + 1

    def _apply(self, n: int, entries: tuple[Entry, ...]) -> None:
        node = self.nodes[n]
        self.checker.observe_committed(entries, node.term if node is not None else None)
        self._check_electable()
        applied = self.applied_logs[n]
        machine = self.machines[n]
        for entry in entries:
            try:
                digest = machine.apply(entry)
            except ValueError as exc:
                raise SafetyViolation(f"node {n}: {exc}") from exc
            self.checker.observe_state(n, entry.index, digest)
            applied[entry.index] = entry
            proposal = self._by_position.get((entry.index, entry.term))
            if proposal is not None and proposal.node == n and proposal.data == entry.data:
                proposal.acked = True

    # ------------------------------------------------------------ log views

    def term_at(self, n: int, index: int) -> int | None:
        """Term of entry `index` in node `n`'s log, read through its snapshot if compacted."""
        node = self.nodes[n]
        if node is None:
            return self.disks[n].durable_term_any(index)
        term = node.log.term_or_none(index)
        if term is not None or index > node.log.last_index:
            return term
        snap = self.snapshots.snapshot_of(n)
        return snap.term_at(index) if snap is not None else None

    def entries_of(self, n: int, lo: int, hi: int) -> list[Entry]:
        """Entries [lo, hi) of node `n`'s log, the compacted ones from its snapshot."""
        node = self.nodes[n]
        assert node is not None
        first = node.log.first_index()
        out: list[Entry] = []
        if lo < first:
            snap = self.snapshots.snapshot_of(n)
            assert snap is not None, f"node {n}'s log starts at {first} without a snapshot"
            out = list(snap.entries[lo - 1 : min(hi, first) - 1])
        if hi > first:
            out += node.log.entries(max(lo, first), hi, UNLIMITED, UNLIMITED)
        return out

    # ----------------------------------------------------------------- client

    def propose(self, data: bytes, to: int | None = None) -> None:
        """A client write sent to node `to`, or to one it believes leads (or any live node)."""
        if to is not None:
            target = self.nodes[to]
            if target is not None and self.now < self.paused_until[to]:
                # The request waits in the socket until the process resumes.
                self.call_at(self.paused_until[to], lambda: self.propose(data, to))
                return
        else:
            leaders = [node for node in self.alive() if node.role is Role.LEADER]
            target = self.rng.choice(leaders or self.alive() or [None])
            if target is not None and self.now < self.paused_until[target.id]:
                to = target.id
                self.call_at(self.paused_until[to], lambda: self.propose(data, to))
                return
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
