"""`Harness`: the simulated world of one real-node run (nodes, disks, network, client).

Each simulated node is a real `RaftGroupNode` (the runtime, its CommitLog,
Flusher and checkpoint code, and the applier's state machine) on its own
`SimLoop`, with a `SimWorker` for fsyncs and hard-state writes, a
`SimTransport`, and its data directory `/sim/n<id>` on the shared
`SimFileSystem`. A run has two phases:

1. *faults* (`fault_s` of virtual time): a client proposes entries to
   whichever node leads while the nemesis (`nemesis.py`) cuts power, restarts,
   pauses, partitions, slows disks and injects disk and network faults;
2. *liveness* (up to `heal_s`): every fault is healed and every node that is
   down is restarted; the group must converge (one ready leader, every node
   caught up and applied) and commit a new proposal.

With `compaction`, the state machine is snapshotted now and then during the
faults and the log below the snapshot deleted (`compaction.py`), so a node
cut off or down for long enough catches up by snapshot install.

With `membership`, the group starts with `nodes` voters and `SPARES` more
nodes running as non-members (`NodeConfig.initial_voters`); `members.py`
changes the group through the leader's `change_membership` while the faults
run, and wipes nodes' disks (`wipe`: a new, empty data directory under a new
directory id). Every node knows the bootstrap members' addresses and its own,
as a real deployment's new node does; the others learn of it from the
configuration. A removed node keeps running; the convergence and state
checks then cover the members of the final configuration only.

`run.py` drives the phases; then `checks.py` compares what every node
applied, the final logs and the client's acknowledged proposals. Everything random comes from
`random.Random(seed)`, so a run is a pure function of (seed, options).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import commitlog
from commitlog.snapshot import SnapshotInfo
from dledger.config import NO_BUGS, Bugs
from dledger.log import UNLIMITED, CommittedDivergence
from dledger.membership import Membership, MembershipError, decode
from dledger.messages import AppendRequest, Message
from dledger.runtime.node import NodeConfig, NodeIO, NotLeaderError, ProposalUnknown, RaftGroupNode
from dledger.testing.nodesim.apply import (
    Applier,
    ApplierFactory,
    RecordingApplier,
    SnapshotApplier,
    digest,
)
from dledger.testing.nodesim.configs import ConfigBook
from dledger.testing.nodesim.connloss import CLOSE_SHARES
from dledger.testing.nodesim.durability import (
    check_acked,
    check_commits,
    observe_replace,
    observe_send,
)
from dledger.testing.nodesim.elections import observe_elections
from dledger.testing.nodesim.network import SimNetwork, SimTransport
from dledger.testing.nodesim.simfs import FAULT_NAMES, NO_FAULTS, SimFileSystem
from dledger.testing.nodesim.vtime import Scheduler, SimLoop, VirtualClock
from dledger.testing.nodesim.worker import SimWorker
from dledger.testing.nodesim.world import Proposal, Slot

GROUP = "sim"
TICK_MS = 50
ELECTION_TICKS = 10
# The CommitLog's cached tail (page_cache_tail_bytes): well under a segment (16
# KiB), so drops cut through segments as well as whole ones.
CACHED_TAIL_BYTES = 2 * 1024
# Membership runs: nodes beyond the bootstrap ones, running as non-members
# until added (ids nodes+1 .. nodes+SPARES; a removed id is never reused).
SPARES = 4
# Share of membership seeds whose transports admit and reach every node
# (no peer filter): the core alone must ignore a removed node's messages.
OPEN_PEERS_SHARE = 0.25
# What membership runs count (members.py and the harness): plans started by
# kind, changes committed by kind, refusals, wipes and repairs, and checks run.
PLAN_KINDS = ("add_learner", "add_voter", "promote", "remove_learner", "remove_voter",
              "replace", "grow", "shrink", "repair")
MEMBERSHIP_COUNTS = (
    *(f"plan_{k}" for k in PLAN_KINDS), *(f"done_{k}" for k in PLAN_KINDS),
    "plans_abandoned",
    "learners_added", "promotions", "removals", "rejoins", "leader_removals",
    "transfers", "changes_committed", "refused_changes", "refused_not_caught_up",
    "refused_not_heard", "refused_pending", "impatient_proposals", "change_timeouts",
    "wipes", "wiped_vote_requests", "removed_running", "removed_sends", "open_peers_runs",
    "snapshot_configs_checked",
)
# The runtime's own counters summed over every node that ran (NodeCounters):
# early elections, and entries a leader applied before its own fsync ended.
NODE_COUNTS = ("leader_lost_notices", "applied_before_fsync")


@dataclass(frozen=True)
class NodeSimOptions:
    """What a run simulates; with the seed, everything that decides it."""

    nodes: int = 3
    # "sync", "async", or "mix" (a quarter of the seeds run flush=async).
    flush: str = "mix"
    bugs: Bugs = NO_BUGS
    runtime_bug: str = ""  # see runtime_bugs.RUNTIME_BUGS
    fault_s: float = 6.0
    heal_s: float = 20.0
    applier: ApplierFactory | None = None
    segment_size: int = 16 * 1024
    # Snapshots and log deletion below them (needs a `SnapshotApplier`).
    compaction: bool = False
    # Membership changes and disk wipes during the faults (members.py).
    membership: bool = False
    # Share of seeds whose network models connections for the nodes' leader
    # watch, with connection resets and wrong reports (connloss.py); drawn
    # from the seed's own stream, so the other seeds replay as before.
    connection_loss: float = 0.5
    # Share of seeds whose leaders batch the reserves' entries (RaftNode rule
    # 8, on in the runtime's defaults), with a batch of 2 or 8 entries;
    # drawn from the seed's own stream, so the other seeds replay as before.
    reserves: float = 0.0


@dataclass
class NodeSimResult:
    seed: int
    nodes: int
    flush: str
    violation: str | None = None
    trace: list[str] = field(default_factory=list)
    steps: int = 0
    virtual_s: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.violation is None


class Violation(Exception):
    """A broken guarantee; ends the run."""


class Harness:
    """The simulated cluster of one run and its bookkeeping (a `world.World`)."""

    def __init__(self, seed: int, options: NodeSimOptions,
                 trace: Callable[[str], None] | None) -> None:
        self.seed = seed
        self.options = options
        # Reserves (RaftNode rule 8), on their own stream like connection loss.
        reserves_rng = random.Random(f"reserves/{seed}")
        self.reserve_batch = (reserves_rng.choice((2, 8))
                              if reserves_rng.random() < options.reserves else 0)
        # Or a batch of bytes: 256 (most entries go at once) or the default.
        self.reserve_bytes = reserves_rng.choice((256, NodeConfig.reserve_batch_bytes))
        rng = random.Random(seed)
        self.rng = rng
        self.flush = options.flush
        if self.flush == "mix":
            self.flush = "async" if rng.random() < 0.25 else "sync"
        self.clock = VirtualClock()
        self.scheduler = Scheduler(self.clock)
        self.fs = SimFileSystem(random.Random(rng.getrandbits(64)))
        self.crash_rng = random.Random(rng.getrandbits(64))
        self.net = SimNetwork(random.Random(rng.getrandbits(64)), lambda: self.clock.now)
        self.disk_rng = random.Random(rng.getrandbits(64))
        self.client_rng = random.Random(rng.getrandbits(64))
        self.nemesis_rng = random.Random(rng.getrandbits(64))
        self.client_loop = SimLoop(self.clock, "client")
        self.scheduler.loops.append(self.client_loop)
        # Its own stream (never drawn from `rng`): runs without membership
        # changes replay exactly as before it existed.
        self.member_rng = random.Random(f"membership/{seed}")
        self.membership = options.membership
        self.bootstrap_ids = frozenset(range(1, options.nodes + 1))
        spares = SPARES if options.membership else 0
        self.slots = {n: Slot(n, f"/sim/n{n}") for n in range(1, options.nodes + spares + 1)}
        if options.membership:
            for slot in self.slots.values():
                slot.directory_id = self._new_directory()
        self.open_peers = options.membership and self.member_rng.random() < OPEN_PEERS_SHARE
        self.configs = ConfigBook(self.node_config(self.slots[1]).bootstrap_membership())
        self.removed: set[int] = set()
        self.repairs_pending: set[int] = set()
        for slot in self.slots.values():
            self.fs.set_faults(slot.data_dir, NO_FAULTS)
        self.fs.on_replace = lambda path: observe_replace(self, path)
        self.fs.on_unsynced_drop = self.fail
        self.dead_loops: list[SimLoop] = []
        self.proposals: list[Proposal] = []
        self.by_digest: dict[str, Proposal] = {}
        self.lines: list[str] = []
        self._trace_out = trace
        self.violation: str | None = None
        self.counts: dict[str, int] = dict.fromkeys(
            ("crashes", "restarts", "pauses", "partitions", "node_failures", "divergences",
             "restart_faults", "stale_appends", "snapshots", "compactions",
             "segments_deleted", "installs", "lags", "async_rewritten_before_install"), 0)
        if options.membership:
            self.counts.update(dict.fromkeys(MEMBERSHIP_COUNTS, 0))
        self.healing = False
        self.leader_killer = False
        self.scenario = False
        # Share of a leader's AppendRequests followed by a stale one (nemesis).
        self.stale_rate = 0.0
        self.stale_rng = random.Random(rng.getrandbits(64))
        # A scenario's hook, called as a node sends and before the network sees it.
        self.on_send: Callable[[int, Sequence[Message]], None] | None = None
        self._doomed: set[tuple[int, int]] = set()
        self.heal_acked = 0
        self.done = False
        # index -> term seen committed; per node, how far its commits were checked
        self.committed_terms: dict[int, int] = {}
        self.commit_checked: dict[int, int] = {}
        # (node, incarnation) -> highest commit index claimed and checked
        self.claimed: dict[tuple[int, int], int] = {}
        # index -> (term, body digest) of committed entries some node deleted
        # (compaction): the final checks' view of the log below the leader's
        # first index.
        self.compacted: dict[int, tuple[int, str]] = {}
        # node id -> its own such records, since its last install or wipe
        # (under flush=async the first record of an index may be of a
        # history the group lost: the final checks take the leader's own).
        self.compacted_by: dict[int, dict[int, tuple[int, str]]] = {}
        # Its own stream (never drawn from `rng`): runs without compaction
        # replay exactly as before it existed.
        self.compact_rng = random.Random(f"compaction/{seed}")
        # Connection loss (connloss.py), likewise on its own stream.
        self.connloss_rng = random.Random(f"connloss/{seed}")
        self.connection_loss = self.connloss_rng.random() < options.connection_loss
        self.close_share = self.connloss_rng.choice(CLOSE_SHARES)
        self.net.model_connections = self.connection_loss
        self.counts.update({"connection_resets": 0, "phantom_losses": 0,
                            "reserve_runs": int(bool(self.reserve_batch)),
                            **dict.fromkeys(NODE_COUNTS, 0)})

    # -------------------------------------------------------------- tracing

    def trace(self, text: str) -> None:
        line = f"t={self.clock.now:8.3f} {text}"
        self.lines.append(line)
        if self._trace_out is not None:
            self._trace_out(line)

    def fail(self, text: str) -> None:
        if self.violation is None:
            self.violation = text
            self.trace(f"VIOLATION {text}")

    # ---------------------------------------------------------- node lifecycle

    def node_config(self, slot: Slot) -> NodeConfig:
        known = self.bootstrap_ids | {slot.nid} if self.membership else self.slots
        peers = {n: ("sim", n) for n in sorted(known)}
        return NodeConfig(
            GROUP, slot.nid, peers, slot.data_dir, flush=self.flush, replicate="sync",
            initial_voters=self.bootstrap_ids if self.membership else frozenset(),
            directory_id=slot.directory_id,
            tick_ms=TICK_MS, election_timeout_ticks=ELECTION_TICKS,
            reserve_batch_entries=self.reserve_batch,
            reserve_batch_bytes=self.reserve_bytes,
            commitlog=commitlog.CommitLogConfig(
                segment_size_bytes=self.options.segment_size, index_file_records=64,
                flush_interval_ms=100, flush_bytes=8192, checkpoint_interval_ms=300,
                # A small cached tail: syncs drop pages all run long, and
                # the file system checks each drop covers synced bytes only.
                page_cache_tail_bytes=CACHED_TAIL_BYTES),
            # Small chunks and window: a transfer is many chunks, exposed to
            # loss, duplication and reordering; a stall is seen within a
            # couple of election timeouts.
            snapshot_chunk_bytes=1024, snapshot_window_bytes=4096, snapshot_stall_s=1.5)

    def disk_latency(self, slot: Slot) -> Callable[[], float]:
        rng = self.disk_rng

        def draw() -> float:
            if slot.disk_mode == "slow":
                # Slower than a network round trip, sometimes a stall.
                if rng.random() < 0.03:
                    return rng.uniform(0.3, 1.2)
                return rng.uniform(0.005, 0.08)
            return rng.uniform(0.0002, 0.003)
        return draw

    def start(self, slot: Slot) -> bool:
        """Start a new incarnation on the node's files (the real recovery)."""
        slot.incarnation += 1
        loop = SimLoop(self.clock, f"n{slot.nid}#{slot.incarnation}")
        index = self.scheduler.loops.index(slot.loop) if slot.loop in self.scheduler.loops \
            else None
        if index is None:
            self.scheduler.loops.append(loop)
        else:
            self.scheduler.loops[index] = loop
        slot.loop = loop
        records = slot.applied.setdefault(slot.incarnation, [])

        def record(entry: commitlog.Entry) -> None:
            records.append((entry.index, entry.term, digest(entry.body)))
            if slot.node is not None:  # applied live, not replayed at start
                check_acked(self, slot, entry.index, entry.term, "applied")

        directory_id = slot.directory_id  # (this incarnation's: a wipe replaces it)
        transports: list[SimTransport] = []

        def transport(group: str, node_id: int, peers: Any, deliver: Any,
                      bind_host: Any) -> SimTransport:
            made = SimTransport(self.net, node_id, loop, deliver, self._observe_send,
                                self.stale_appends, open_peers=self.open_peers,
                                directory_id=directory_id)
            transports.append(made)
            return made

        def installed(info: SnapshotInfo) -> None:
            self.counts["installs"] += 1
            self.trace(f"n{slot.nid} installed snapshot {info.index} (term {info.term})")
            self.check_snapshot_membership(slot, info.index, info.membership, "installed")
            applier = holder[0]
            assert isinstance(applier, SnapshotApplier), "install without a snapshot applier"
            applier.install(info)
            slot.installed_after[slot.incarnation] = len(records)
            # Its log below the snapshot is now the snapshot's source's history.
            self.compacted_by.pop(slot.nid, None)

        io = NodeIO(transport=transport, rng=random.Random(self.rng.getrandbits(64)),
                    fsync_worker=SimWorker(loop, self.disk_latency(slot)),
                    state_worker=SimWorker(loop, self.disk_latency(slot)),
                    clock=loop.time, bugs=self.options.bugs)
        holder: list[Applier] = []
        slot.faults_at_start = self.fs.node_faults(slot.data_dir)
        slot.failure_seen = False
        try:
            node = loop.run_sync(lambda: RaftGroupNode(
                self.node_config(slot), lambda entries: holder[0].apply(entries), io=io,
                on_install=installed))
            # The predicate the runtime hands `PeerTransport` (which nodes
            # not in the configuration it takes connections from).
            transports[0].accept_peer = node._accept_peer
            factory = self.options.applier or RecordingApplier
            applier = factory(node.log, slot.data_dir, record)
            holder.append(applier)
            applied = loop.run_sync(applier.recover)
        except Exception as exc:
            if self.fs.node_faults(slot.data_dir) > slot.faults_at_start:
                self.counts["restart_faults"] += 1
                self.trace(f"n{slot.nid} restart failed on an injected fault: {exc!r}")
                self._abandon(slot)
                return False
            self.fail(f"n{slot.nid} failed to restart: {exc!r}")
            return False
        slot.node, slot.applier, slot.state = node, applier, "up"
        loop.create_task(self._run_start(slot, node, applied))
        self.trace(f"n{slot.nid} started #{slot.incarnation}: log {node.log.first_index}.."
                   f"{node.log.last_index}, commit {node.commit_index}, replayed {applied}")
        return True

    async def _run_start(self, slot: Slot, node: RaftGroupNode, applied: int) -> None:
        try:
            await node.start(applied)
        except Exception as exc:
            self.fail(f"n{slot.nid} start raised {exc!r}")

    def _abandon(self, slot: Slot) -> None:
        """The process is gone: its loop never runs again."""
        if slot.node is not None:
            for name in NODE_COUNTS:
                self.counts[name] += getattr(slot.node.counters, name)
        if slot.loop is not None and not slot.loop.dead:
            slot.loop.abandon()
            self.dead_loops.append(slot.loop)
        self.fs.kill(slot.data_dir)
        slot.node, slot.applier = None, None
        slot.state = "down" if slot.state != "diverged" else "diverged"

    def crash(self, slot: Slot) -> None:
        """Power cut: the process dies and its unsynced data may be lost or torn."""
        self._abandon(slot)
        self.net.detach_node(slot.nid, self._closes())
        lost = self.fs.crash(slot.data_dir, self.crash_rng)
        self.counts["crashes"] += 1
        self.trace(f"n{slot.nid} power cut: lost {lost}")

    def _closes(self) -> bool:
        """Whether a crash closes the node's connections (a killed process)
        or leaves them hanging (a machine without power)."""
        return self.connection_loss and self.connloss_rng.random() < self.close_share

    def restart(self, slot: Slot) -> None:
        if slot.state != "down":
            return
        self.counts["restarts"] += 1
        self.start(slot)

    def _new_directory(self) -> int:
        return self.member_rng.getrandbits(63) or 1

    def wipe(self, slot: Slot) -> None:
        """The node's disk is replaced by an empty one: the process dies, every
        file of its data directory is gone, and it starts again under a new
        directory id (`NodeConfig.directory_id`), with term 0 and no vote."""
        if slot.state == "up":
            self._abandon(slot)
            self.net.detach_node(slot.nid, self._closes())
        self.fs.kill(slot.data_dir)
        self.fs.rmtree(slot.data_dir)
        self.compacted_by.pop(slot.nid, None)
        slot.state = "down"
        slot.directory_id = self._new_directory()
        self.configs.wiped(slot.nid, slot.directory_id)
        self.counts["wipes"] += 1
        self.trace(f"n{slot.nid} disk wiped: new directory {slot.directory_id}")
        self.start(slot)

    def in_play(self) -> list[Slot]:
        """The nodes the nemesis picks from: those that are or were members (a
        spare never added only waits)."""
        if not self.membership:
            return list(self.slots.values())
        ids = set(self.bootstrap_ids)
        for membership in self.configs.seen.values():
            ids |= membership.node_ids
        return [s for s in self.slots.values() if s.nid in ids]

    def members(self) -> frozenset[int]:
        """The members of the leading node's configuration (every node when the
        group never changes; the bootstrap ones while nobody leads)."""
        if not self.membership:
            return frozenset(self.slots)
        leader = self.leader()
        if leader is None or leader.node is None:
            return self.bootstrap_ids
        return leader.node.membership.node_ids

    def check_snapshot_membership(self, slot: Slot, index: int, raw: bytes | None,
                                  what: str) -> None:
        """A snapshot's configuration is the committed one in effect at its
        index (flush=sync; None in the snapshot: the bootstrap one)."""
        if not self.membership or self.flush != "sync":
            return
        try:
            recorded = decode(raw) if raw is not None else self.configs.bootstrap
        except MembershipError as exc:
            self.fail(f"n{slot.nid} {what} snapshot {index} with an unusable membership: {exc}")
            return
        truth = self.configs.committed_at(index)
        self.counts["snapshot_configs_checked"] += truth is not None
        if truth is not None and recorded != truth:
            self.fail(f"n{slot.nid} {what} snapshot {index} recording voters "
                      f"{_describe(recorded)}, but the committed configuration there is "
                      f"{_describe(truth)}")

    def watch(self) -> None:
        """React to nodes that failed (called often from the client loop)."""
        for slot in self.slots.values():
            node = slot.node
            if slot.state != "up" or node is None or node.failed is None or slot.failure_seen:
                continue
            slot.failure_seen = True
            exc = node.failed
            cause: BaseException | None = exc
            while cause is not None and not isinstance(cause, CommittedDivergence):
                cause = cause.__cause__ or cause.__context__
            if cause is not None:
                self.counts["divergences"] += 1
                if self.flush != "async":
                    self.fail(f"n{slot.nid} found committed divergence under flush=sync: "
                              f"{exc!r}")
                    return
                self.trace(f"n{slot.nid} stopped on committed divergence (flush=async): "
                           f"{exc!r}")
                self._abandon(slot)
                slot.state = "diverged"
                continue
            if self.fs.node_faults(slot.data_dir) > slot.faults_at_start:
                self.counts["node_failures"] += 1
                self.trace(f"n{slot.nid} failed on an injected disk fault: {exc!r}")
                # Restarting it is a reboot: the page cache goes too (a failed
                # fsync's pages are not on disk; see docs/raft.md).
                self.crash(slot)
                continue
            self.fail(f"n{slot.nid} failed without an injected fault: {exc!r}")

    def _observe_send(self, src: int, messages: Sequence[Message]) -> None:
        if self.on_send is not None:
            self.on_send(src, messages)  # a scenario may cut links before these leave
        observe_elections(self, src, messages)
        observe_send(self, src, messages)
        if src in self.removed:
            self.counts["removed_sends"] += len(messages)

    def stale_appends(self, src: int, messages: Sequence[Message]) -> list[Message]:
        """Older, still legal slices of the leader's log to send along.

        A leader that probes from a lower next index, or an old
        retransmission arriving late, gives a follower (prev, entries) below
        what it already holds, with the leader's commit of now: e.g. a
        follower whose log goes on past the slice with entries of an older
        term must not commit those (`follower_commit_to_last_index`). Every
        such message is one the leader could send, so a correct follower
        stays safe whatever it receives (the core simulator's stale appends,
        `SimCluster._stale_append`).
        """
        if not self.stale_rate or self.healing:
            return []
        slot = self.slots[src]
        node = slot.node
        core = node.core if node is not None else None
        if core is None or node is None or node.role != "leader":
            return []
        rng = self.stale_rng
        out: list[Message] = []
        for msg in messages:
            if not isinstance(msg, AppendRequest) or msg.term != core.term \
                    or rng.random() >= self.stale_rate:
                continue
            floor = node.log.first_index - 1
            pr = core.progress.get(msg.dst)
            draw = rng.random()
            if draw < 0.4 and pr is not None:
                # From just below what the follower is known to match: the
                # slice is accepted, and anything past it stays as it is.
                top = min(pr.match, msg.prev_index)
                low = max(floor, top - 8)
            else:
                top = msg.prev_index
                low = floor if draw < 0.55 else max(floor, top - 8)
            if low > top:
                continue
            prev = rng.randint(low, top)
            # The slice ends anywhere up to the log's end (at most 16 entries).
            count = rng.randint(0, min(16, core.log.last_index - prev))
            try:
                prev_term = core.log.term(prev)
                entries = core.log.entries(prev + 1, prev + 1 + count, UNLIMITED, count) \
                    if count else []
            except LookupError:
                continue  # compacted meanwhile
            out.append(AppendRequest(src, msg.dst, msg.term, prev, prev_term, tuple(entries),
                                     core.commit))
            self.counts["stale_appends"] += 1
        return out

    # ------------------------------------------------------------- client

    def leader(self) -> Slot | None:
        """The running, healthy node that leads the highest term, if any."""
        best, best_term = None, -1
        for slot in self.slots.values():
            node = slot.node
            if slot.state == "up" and node is not None and node.failed is None \
                    and node.role == "leader" and node.term > best_term:
                best, best_term = slot, node.term
        return best

    def propose(self, slot: Slot) -> None:
        seq = len(self.proposals) + 1
        message = commitlog.Message(topic=f"T{seq % 2}", body=f"p{seq}".encode(),
                                    queue_id=seq % 3, producer_id=1 + seq % 2, sequence=seq)
        body = commitlog.encode_messages([message], 1 << 20)
        proposal = Proposal(seq, body, slot.nid)
        self.proposals.append(proposal)
        self.by_digest[digest(body)] = proposal
        assert slot.loop is not None and slot.node is not None
        slot.loop.create_task(self._propose(slot.node, proposal))

    async def _propose(self, node: RaftGroupNode, p: Proposal) -> None:
        healing = self.healing
        try:
            entry = await node.propose(commitlog.KIND_MESSAGES, p.body, timeout=2.0)
        except NotLeaderError:
            p.outcome = "refused"
        except ProposalUnknown:
            p.outcome = "unknown"
        except Exception as exc:
            self.fail(f"propose on n{node.config.node_id} raised {exc!r}")
        else:
            p.outcome, p.index, p.term = "acked", entry.index, entry.term
            check_acked(self, self.slots[node.config.node_id], entry.index, entry.term,
                        "acknowledged to the client")
            if healing:
                self.heal_acked += 1

    def _doom(self, slot: Slot) -> None:
        """Cut the power of this leader incarnation soon (the leader killer)."""
        key = (slot.nid, slot.incarnation)
        if key in self._doomed:
            return
        self._doomed.add(key)

        def strike() -> None:
            if not self.healing and slot.state == "up" and slot.incarnation == key[1]:
                self.trace(f"leader killer: n{slot.nid}")
                self.crash(slot)
        self.client_loop.call_later(self.client_rng.uniform(0.0, 0.3), strike)

    async def client(self) -> None:
        rng = self.client_rng
        while not self.done:
            await asyncio.sleep(rng.uniform(0.01, 0.15))
            self.watch()
            check_commits(self)
            if self.violation:
                return
            target = self.leader()
            if target is not None and self.leader_killer and not self.healing:
                self._doom(target)
            if target is None:
                up = [s for s in self.slots.values() if s.state == "up"]
                if not up:
                    continue
                target = rng.choice(up)
            for _ in range(rng.randint(1, 4)):
                self.propose(target)

    # -------------------------------------------------------------- liveness

    def heal(self) -> None:
        self.healing = True
        self.net.heal()
        for slot in self.slots.values():
            self.fs.set_faults(slot.data_dir, NO_FAULTS)
            slot.disk_mode = "normal"
            if slot.loop is not None:
                slot.loop.paused_until = 0.0
        self.trace("heal: faults off, restarting every node that is down")
        for slot in self.slots.values():
            self.restart(slot)

    def converged(self) -> str | None:
        """None once the group has converged, else what is still missing."""
        leader = self.leader()
        if leader is None or leader.node is None or not leader.node.leader_ready:
            return "no ready leader"
        lnode = leader.node
        members = self.members()
        for slot in self.slots.values():
            if slot.state == "diverged" or slot.nid not in members:
                continue  # (a removed node, or a spare never added, may lag)
            node = slot.node
            if slot.state != "up" or node is None:
                return f"n{slot.nid} is down"
            if node.failed is not None:
                return f"n{slot.nid} failed: {node.failed!r}"
            if node.term != lnode.term or (slot is not leader and node.leader_id != leader.nid):
                if self.flush == "async" and self._diverged_silently(node, lnode):
                    continue
                return f"n{slot.nid} does not follow n{leader.nid} in term {lnode.term}"
            if (node.commit_index, node.applied_index, node.last_index) != (
                    lnode.commit_index, lnode.commit_index, lnode.last_index):
                return (f"n{slot.nid} commit/applied/last {node.commit_index}/"
                        f"{node.applied_index}/{node.last_index}, leader n{leader.nid} "
                        f"{lnode.commit_index}/{lnode.last_index}")
        if not self.heal_acked:
            return "no proposal acknowledged since the heal"
        if self.repairs_pending:
            return f"wiped nodes {sorted(self.repairs_pending)} not repaired yet"
        return None

    def _diverged_silently(self, node: RaftGroupNode, lnode: RaftGroupNode) -> bool:
        """flush=async: `node` committed an entry the leader's log contradicts
        (the group lost it in power cuts), and has not noticed: the leader may
        be a node its own configuration removed, whose connections it refuses
        (seed 9301447, 3 nodes: n5's committed removal was lost, n5 led term
        7, and n6 never heard it). It is treated as a node that stopped on
        its divergence: it need not converge, and the final checks skip it."""
        commit = node.commit_index
        if commit < max(node.log.first_index, lnode.log.first_index):
            return False
        theirs = lnode.log.term_at(commit) if commit <= lnode.log.last_index else None
        if theirs == node.log.term_at(commit):
            return False
        slot = self.slots[node.config.node_id]
        self.counts["divergences"] += 1
        self.trace(f"n{slot.nid} diverged without noticing (flush=async): its committed entry "
                   f"{commit} has term {node.log.term_at(commit)}, the leader's "
                   f"{'none' if theirs is None else theirs}")
        slot.state = "diverged"
        return True

    async def liveness(self, deadline: float) -> None:
        while self.clock.now < deadline and not self.violation:
            await asyncio.sleep(0.1)
            self.watch()
            if self.violation:
                break
            for slot in self.slots.values():
                # Failed on a fault injected before the heal (seen only now).
                self.restart(slot)
            if self.converged() is None:
                self.done = True
                return

    def fault_counts(self) -> dict[str, int]:
        out = dict(self.counts)
        out.update({name: self.fs.counts.get(name, 0) for name in FAULT_NAMES})
        out["cache_drops"] = self.fs.cache_drops
        out.update({f"net_{k}": v for k, v in sorted(self.net.counts.items())})
        for name in NODE_COUNTS:
            out[name] += sum(getattr(s.node.counters, name)
                             for s in self.slots.values() if s.node is not None)
        out["proposals"] = len(self.proposals)
        out["acked"] = sum(p.outcome == "acked" for p in self.proposals)
        return out


def replay_hint(seed: int, nodes: int, compaction: float = 0.0,
                membership: float = 0.0, connection_loss: float | None = None,
                reserves: float = 0.0) -> str:
    """The command that replays a seed of the real-node simulator."""
    extra = " --compaction 1" if compaction else ""
    extra += " --membership 1" if membership else ""
    if connection_loss is not None and connection_loss != NodeSimOptions.connection_loss:
        extra += f" --connection-loss {connection_loss}"
    extra += f" --reserves {reserves}" if reserves else ""
    return f"ledgermq sim --real-node{extra} --seed {seed} --nodes {nodes} --trace"


def _describe(m: Membership) -> str:
    return f"{sorted(m.voter_ids)} (learners {sorted(m.learner_ids)})"
