"""`RaftGroupNode`: the asyncio runtime that runs one replica of a broker group.

Theory of operation
-------------------
The sans-I/O core (`dledger.raw_node.RaftNode`) decides; this module does
the I/O, all on one event loop (uvloop when `ledgermq.base.loop` installs it):

- *Inputs go straight into the core.* Peer messages are stepped as soon as the
  transport decodes them; a ticker task calls `tick()` every `tick_ms` on the
  loop's monotonic clock; `propose()` queues the proposal and wakes the driver,
  which hands every queued proposal to the core at once (`propose_many`), so
  many `propose()` calls of one loop iteration become one Ready, one CommitLog
  append and one fsync (group commit) and one batched append per follower.
- *One driver task carries out Readies*, one at a time (the core produces no
  new Ready before `advance`). For each Ready, in this order:
  1. send `messages` (allowed before the write);
  2. write `entries` (cutting a replaced suffix, never a committed entry) and,
     when term or vote changed, the hard state (always durable: atomic
     replace with fsync, on a thread); with `flush="sync"` and `must_sync`,
     wait for the group-commit fsync of the entries (on the Flusher's thread);
  3. send `messages_after_persist` (acks, granted votes, new-term traffic);
  4. `apply(committed entries)`, then resolve the proposals they complete;
  5. report soft-state changes; `advance`.
  While the driver waits for an fsync, the loop keeps stepping messages and
  queueing proposals; they land in the next Ready.
- *Ack points.* `replicate="sync"`: a proposal completes when its entry (same
  index and term) is in `committed_entries` and has been applied locally; with
  `flush="sync"` that implies it was fsynced on a quorum (followers ack only
  after their fsync, the leader counts itself only up to its fsynced index).
  `replicate="async"`: it completes once the leader's core reports the entry
  stable (written, and fsynced when `flush="sync"`); replication continues in
  the background and a failover can lose it.
- The commit index is persisted lazily (with every term/vote change, about
  once a second while it moves, and at `stop()`), so a restarted broker can
  replay up to it before `start()`.

- *Snapshots.* A follower whose next entries retention deleted gets the
  leader's snapshot: the core emits `InstallSnapshot`, the runtime streams
  the snapshot's state file and the segments under it first
  (`snapshot_transfer.py`) and sends the core's message only once the
  follower staged every byte; the follower steps it into its core then, and
  carries out the `Ready.snapshot` that follows before anything else of that
  Ready: the staged segments replace its log (`CommitLog.install`), the
  state file becomes its newest snapshot (`adopt_snapshot`), the commit
  index is saved, and `on_install(info)` resets the state machine.

See docs/raft.md, "Runtime" and "Snapshot transfer", for the knobs and why
the defaults give sub-second failover on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import random
import ssl
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Protocol

import commitlog
from commitlog import CommitLog, CommitLogConfig, Flusher
from commitlog.errors import DurableDataLostError, StorageError
from commitlog.flush import FlushObserver, Worker
from commitlog.snapshot import SnapshotInfo, adopt_snapshot, list_snapshots
from commitlog.sync_thread import SyncThread
from dledger.config import NO_BUGS, RESERVE_BATCH_BYTES, Bugs, Config
from dledger.entry import HardState, segment_placement
from dledger.log import CommittedDivergence, InvariantViolation, invariant
from dledger.membership import Membership, bootstrap
from dledger.membership import encode as encode_membership
from dledger.messages import AppendResponse, InstallSnapshot, Message
from dledger.raw_node import NotLeader, RaftNode, stored_membership
from dledger.ready import Ready, SoftState
from dledger.runtime.codec import CodecError, format_address, parse_address
from dledger.runtime.snapshot_transfer import (
    CHUNK_BYTES,
    CHUNK_BYTES_MAX,
    REASON_MAX,
    STALL_S,
    TRANSFER_MESSAGES,
    WINDOW_BYTES,
    SnapshotAck,
    SnapshotChunk,
    SnapshotOffer,
    SnapshotReceiver,
    SnapshotSender,
    SourceUnavailable,
    finish_interrupted_install,
    open_sources,
    remove_staging,
)
from dledger.runtime.storage import CommitLogStorage
from dledger.runtime.transport import PeerTransport
from dledger.storage import SnapshotMeta
from election.config import ElectionConfig
from election.roles import Role
from ledgermq.base.errors import NotLeaderError as WireNotLeaderError
from ledgermq.base.tasks import cancel_and_wait
from ledgermq.wire.auth import SECRET_BYTES_MIN

__all__ = [
    "NO_OBSERVER",
    "FollowerStatus",
    "LeaderStatus",
    "NodeConfig",
    "NodeCounters",
    "NodeObserver",
    "NodeStatus",
    "NotLeaderError",
    "ProposalUnknown",
    "RaftGroupNode",
    "SoftStateInfo",
]

log = logging.getLogger(__name__)

ROLE_NAMES: dict[Role, str] = {
    Role.LEADER: "leader",
    Role.FOLLOWER: "follower",
    Role.CANDIDATE: "candidate",
    Role.PRE_CANDIDATE: "pre_candidate",
}

# The commit index is written to the hard-state file at most this often.
COMMIT_PERSIST_INTERVAL_S = 1.0
# A follower's apply batch is handed over at once when it holds this many entries.
FOLLOWER_APPLY_BATCH_MAX = 256
# flush="sync": a Ready's entries of at most this many bytes are fsynced on
# the loop's thread (Flusher.sync_now) when the flusher idles (and, on a
# leader, no earlier proposal is still in flight); larger ones, and a
# leader's pipelined rounds, go to the fsync thread, so the loop goes on
# reading (requests, appends) during the sync.
INLINE_SYNC_MAX_BYTES = 32 * 1024
# stop() lets the driver finish the Ready in progress for at most this long.
DRIVER_STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class NodeConfig:
    """Everything one replica needs; every node of a group uses the same
    `peers`, `segment_size_bytes` and timing knobs.

    `flush` is also written into the CommitLog config (`commitlog` overrides
    everything else of it), so the two can never disagree.

    `cluster_secret` (every node of the group holds the same; empty = the
    group's peers are not authenticated) and `tls_server` / `tls_client`
    (both or neither, see `dledger.runtime.transport.tls_contexts`) secure
    the Raft port (docs/raft.md, "Peer authentication").
    """

    group: str
    node_id: int
    peers: dict[int, tuple[str, int]]
    data_dir: str
    flush: str = "sync"
    replicate: str = "sync"
    tick_ms: int = 50
    # 10 ticks x 50 ms: a follower campaigns 0.5-1.0 s after the last
    # heartbeat; heartbeats go every tick, so 10 consecutive losses are needed.
    election_timeout_ticks: int = 10
    heartbeat_interval_ticks: int = 1
    # A follower that sees every connection to and from its leader closed for
    # this many ticks in a row (a killed process's sockets close at once)
    # tells its core, which campaigns within `lost_leader_ticks` ticks instead
    # of an election timeout (docs/raft.md, "Leader connection loss"). 0: off.
    leader_lost_grace_ticks: int = 2
    lost_leader_ticks: int = 4
    preferred_leader: int = 0
    segment_size_bytes: int = 256 * 1024 * 1024
    commitlog: CommitLogConfig | None = None
    bind_host: str | None = None
    cluster_secret: bytes = field(default=b"", repr=False)
    tls_server: ssl.SSLContext | None = field(default=None, repr=False)
    tls_client: ssl.SSLContext | None = field(default=None, repr=False)
    # Snapshot transfer (docs/raft.md, "Snapshot transfer"): chunk size,
    # un-acked bytes in flight, how long without progress before a transfer
    # is abandoned (and retried), and the most bytes a follower stages.
    snapshot_chunk_bytes: int = CHUNK_BYTES
    snapshot_window_bytes: int = WINDOW_BYTES
    snapshot_stall_s: float = STALL_S
    install_max_bytes: int = 1 << 40
    # Membership (docs/raft.md, "Membership changes"): the group's first
    # voters (empty: every node of `peers`; used only while the log holds no
    # configuration), the client address of each node (opaque to Raft, for
    # leader hints).
    initial_voters: frozenset[int] = frozenset()
    client_addresses: dict[int, str] = field(default_factory=dict)
    # The id of this node's data directory (dledger/runtime/identity.py,
    # random, 63 bits): the group counts this node's votes only while it holds
    # the directory its configuration pinned. 0 = unknown (never pinned).
    directory_id: int = 0
    # A follower hands committed entries to its state machine in batches: at
    # most this long after the first of a batch was committed (or at
    # FOLLOWER_APPLY_BATCH_MAX entries), at once when it stops following, and
    # before a snapshot install or a stop. Nobody waits for a follower's
    # apply (its acks are sent before it), and a batch costs the state
    # machine's fixed work once. 0: apply in the pass that learned the commit.
    follower_apply_delay_ms: int = 5
    # The leader sends the voting followers its commit does not need (the
    # reserves, RaftNode rule 8) new entries once this many wait, or at the
    # next tick; the others get each entry at once. Saves each reserve a Ready
    # round per request and the leader an acknowledgement to read when
    # requests come one at a time. 0: every follower gets every entry at once.
    reserve_batch_entries: int = 8
    # ... or once this many bytes of entries wait (so that a large entry, a
    # merged batch of messages, goes to every follower at once).
    reserve_batch_bytes: int = RESERVE_BATCH_BYTES
    # After sending entries, poll the peers' connections this long for the
    # acknowledgements before the loop may sleep (ledgermq/wire/busy_poll.py;
    # 0: off).
    busy_poll_us: int = 0

    def __post_init__(self) -> None:
        if self.node_id not in self.peers:
            raise ValueError(f"node_id {self.node_id} is not among the peers {sorted(self.peers)}")
        if any(n <= 0 for n in self.peers):
            raise ValueError("node ids are positive integers")
        if self.flush not in ("sync", "async"):
            raise ValueError(f"flush must be 'sync' or 'async', not {self.flush!r}")
        if self.replicate not in ("sync", "async"):
            raise ValueError(f"replicate must be 'sync' or 'async', not {self.replicate!r}")
        if self.tick_ms < 1:
            raise ValueError("tick_ms must be >= 1")
        if self.leader_lost_grace_ticks < 0:
            raise ValueError("leader_lost_grace_ticks must be >= 0 (0: off)")
        if self.preferred_leader and self.preferred_leader not in self.peers:
            raise ValueError(f"preferred_leader {self.preferred_leader} is not a peer")
        if not self.initial_voters <= set(self.peers):
            raise ValueError(f"initial voters {sorted(self.initial_voters - set(self.peers))} "
                             "are not among the peers")
        if self.cluster_secret and len(self.cluster_secret) < SECRET_BYTES_MIN:
            raise ValueError(f"the cluster secret is at least {SECRET_BYTES_MIN} bytes")
        if (self.tls_server is None) != (self.tls_client is None):
            raise ValueError("TLS on the Raft port needs both tls_server and tls_client")
        if not 0 < self.snapshot_chunk_bytes <= CHUNK_BYTES_MAX:
            raise ValueError(f"snapshot_chunk_bytes must be in 1..{CHUNK_BYTES_MAX}")
        if self.snapshot_window_bytes < self.snapshot_chunk_bytes:
            raise ValueError("snapshot_window_bytes must hold at least one chunk")
        if self.snapshot_stall_s <= 0 or self.install_max_bytes <= 0:
            raise ValueError("snapshot_stall_s and install_max_bytes must be positive")
        if self.follower_apply_delay_ms < 0 or self.busy_poll_us < 0:
            raise ValueError("follower_apply_delay_ms and busy_poll_us must be >= 0")
        if self.reserve_batch_entries < 0 or self.reserve_batch_bytes < 1:
            raise ValueError("reserve_batch_entries must be >= 0, reserve_batch_bytes >= 1")
        if not 0 <= self.directory_id < 1 << 63:
            raise ValueError(f"directory_id {self.directory_id} is not in 0..2^63-1")
        # Validates the tick counts (>= 2, heartbeat below the timeout).
        self.election_config()

    def election_config(self) -> ElectionConfig:
        return ElectionConfig(
            election_timeout_ticks=self.election_timeout_ticks,
            heartbeat_interval_ticks=self.heartbeat_interval_ticks,
            pre_vote=True,
            check_quorum=True,
            preferred_leader=self.preferred_leader,
            lost_leader_ticks=self.lost_leader_ticks,
        )

    def commitlog_config(self) -> CommitLogConfig:
        base = self.commitlog or CommitLogConfig(segment_size_bytes=self.segment_size_bytes)
        return replace(base, flush=self.flush)

    def bootstrap_membership(self) -> Membership:
        """The configuration the group starts with: `initial_voters` (default
        every peer) as voters, unpinned, with their addresses."""
        voters = self.initial_voters or frozenset(self.peers)
        return bootstrap({n: format_address(self.peers[n]) for n in voters},
                         {n: self.client_addresses.get(n, "") for n in voters})


class Transport(Protocol):
    """What the node needs of its peer transport (`PeerTransport` on TCP, a
    simulated network in the real-node simulator)."""

    async def start(self) -> Any: ...

    def send(self, messages: Sequence[Message]) -> None: ...

    async def close(self) -> None: ...

    def stats(self) -> dict[str, Any]: ...

    def set_peers(self, peers: dict[int, tuple[str, int]]) -> None:
        """Talk to exactly these nodes (the configuration's members) from now on."""

    def connected(self, peer: int) -> bool:
        """Whether a live link to `peer` exists (status and health checks)."""

    def peer_lost(self, peer: int) -> bool:
        """Whether every connection to and from `peer` is closed (its process
        is gone, or something reset them): the node's leader watch."""


# (group, node_id, peers, deliver, bind_host) -> transport
TransportFactory = Callable[
    [str, int, dict[int, tuple[str, int]], Callable[[list[Message]], None], str | None],
    Transport]


@dataclass
class NodeIO:
    """Everything a node does I/O or draws chance with. The defaults are
    production's; the real-node simulator (dledger/testing/nodesim) passes
    its own seeded, virtual-time parts and runs this very runtime."""

    # None: TCP (`PeerTransport`) with the config's secret and TLS contexts.
    transport: TransportFactory | None = None
    # Seeds election timeouts; production draws it from the OS.
    rng: random.Random | None = None
    # Runs the Flusher's fsyncs and checkpoint writes (SyncThread by default).
    fsync_worker: Worker | None = None
    # Runs hard-state writes (SyncThread by default).
    state_worker: Worker | None = None
    clock: Callable[[], float] = time.perf_counter
    # Deliberate bugs (simulator only), passed to the core.
    bugs: Bugs = field(default=NO_BUGS)


@dataclass(frozen=True)
class SoftStateInfo:
    """What the broker reacts to: role ("leader", "follower", "candidate",
    "pre_candidate"), the known leader (0 = unknown) and the term."""

    role: str
    leader_id: int
    term: int


class NodeObserver(FlushObserver, Protocol):
    """Told of each step the runtime takes once per batch (the broker's
    metrics implement it; `NO_OBSERVER` ignores it). Every call is on the
    event loop; `synced` comes from the node's Flusher."""

    def appended(self, seconds: float, entries: int) -> None:
        """One Ready's `entries` were written to the CommitLog in `seconds`."""

    def acked(self, seconds: float) -> None:
        """A proposal reached its ack point `seconds` after `propose` was called."""


class _IgnoreAll:
    def synced(self, seconds: float, entries: int) -> None:
        pass

    def appended(self, seconds: float, entries: int) -> None:
        pass

    def acked(self, seconds: float) -> None:
        pass


NO_OBSERVER: NodeObserver = _IgnoreAll()


@dataclass(slots=True)
class NodeCounters:
    """What the runtime has done since it started (status() and metrics)."""

    readies: int = 0
    inline_readies: int = 0  # of them, carried out in the pass of the input (_carry_out)
    proposals: int = 0
    proposal_batches: int = 0
    proposals_acked: int = 0
    proposals_unknown: int = 0
    elections: int = 0
    leader_changes: int = 0
    # Follower: times every connection with the leader stayed closed for the
    # grace and the core took the notice (an early election, docs/raft.md).
    leader_lost_notices: int = 0
    hard_state_saves: int = 0
    entries_written: int = 0
    acks_sent: int = 0
    acks_not_durable: int = 0  # acks of entries the follower had not fsynced yet
    # Leader: entries applied (their clients answered) while its own fsync of
    # them still ran: committed on a quorum of the others (RaftNode rule 3).
    applied_before_fsync: int = 0
    peer_errors: int = 0
    # Peer connections refused before their handshake completed, by reason
    # (bad_proof, no_proof, unknown_peer, connection_limit, ..., see transport.py).
    auth_failures: dict[str, int] = field(default_factory=dict)
    # Snapshot transfers (docs/raft.md, "Snapshot transfer").
    installs_sent: int = 0          # leader: transfers completed, InstallSnapshot sent
    installs_received: int = 0      # follower: snapshots installed
    install_failures: int = 0       # leader: transfers abandoned or impossible
    install_bytes_sent: int = 0     # leader: chunk bytes sent, resends included
    install_bytes_received: int = 0  # follower: chunk bytes staged
    transfer_seconds: float = 0.0   # leader: offer to the last ack, summed
    install_seconds: float = 0.0    # follower: staged files to installed log + state
    # Follower: transfer messages refused or not written, by reason.
    transfer_refusals: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FollowerStatus:
    """The leader's view of one peer's replication."""

    match: int
    next: int
    state: str
    inflight: int
    lag: int  # entries behind the leader's last index
    learner: bool = False
    directory_id: int = 0  # the data directory its messages come from (0: none heard)
    identity_mismatch: bool = False  # pinned to another directory: wiped, needs rejoin
    connected: bool = False  # the transport has a live link to it
    reserve: bool = False  # gets new entries in batches (RaftNode rule 8)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class LeaderStatus:
    """The part of `NodeStatus` that exists once the core runs."""

    stable_index: int
    vote: int
    elections_won: int
    followers: dict[int, FollowerStatus]  # meaningful on the leader only
    transport: dict[str, Any]
    # RaftNode rule 8: appends sent to reserves, changes of the reserves.
    reserve_appends: int = 0
    reserve_changes: int = 0


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """A snapshot of one replica; `to_json()` is what the admin API shows."""

    group: str
    node_id: int
    role: str
    term: int
    leader_id: int
    leader_ready: bool
    commit_index: int
    applied_index: int
    last_index: int
    durable_index: int
    flush: str
    replicate: str
    failed: str | None
    fsyncs: int
    fsyncs_in_place: int  # of `fsyncs`, run on the loop's thread (Flusher.sync_now)
    fsynced_entries: int
    fsync_seconds: float
    fsync_handoff_seconds: float
    entries_per_fsync: float
    pending_proposals: int
    first_index: int
    snapshot_index: int  # the newest snapshot's (0: none)
    # Outgoing transfers in progress: peer -> index, acked/total bytes.
    transfers: dict[int, dict[str, int]]
    counters: NodeCounters
    core: LeaderStatus | None  # None before start()
    # The configuration in effect (docs/raft.md, "Membership changes"), the
    # index of its CONFIG entry (0: bootstrap) and whether it is uncommitted.
    membership: Membership | None = None
    membership_index: int = 0
    membership_pending: bool = False
    directory_id: int = 0

    def to_json(self) -> dict[str, Any]:
        """A flat map: the fields, the counters, then the core's figures."""
        out: dict[str, Any] = {name: getattr(self, name) for name in _STATUS_FIELDS}
        out.update(asdict(self.counters))
        if self.membership is not None:
            out["membership"] = self.membership.to_dict()
        if self.core is not None:
            out["stable_index"] = self.core.stable_index
            out["vote"] = self.core.vote
            out["elections_won"] = self.core.elections_won
            out["reserve_appends"] = self.core.reserve_appends
            out["reserve_changes"] = self.core.reserve_changes
            out["followers"] = {peer: asdict(f) for peer, f in self.core.followers.items()}
            out["transport"] = self.core.transport
        return out


_STATUS_FIELDS = [f.name for f in fields(NodeStatus)
                  if f.name not in ("counters", "core", "membership")]


class NotLeaderError(WireNotLeaderError):
    """This node cannot take the proposal; `leader_id` is where to retry (0 = unknown).

    A `ledgermq.base.errors.NotLeaderError` (wire code NOT_LEADER), so the broker can
    answer it as is after filling in the leader's client address.
    """

    def __init__(self, leader_id: int, message: str | None = None) -> None:
        text = message or (f"not leader; leader is node {leader_id}" if leader_id
                           else "not leader; leader unknown")
        super().__init__(text, data={"leader": None, "leader_id": leader_id})
        self.leader_id = leader_id


class ProposalUnknown(Exception):
    """The proposal may or may not commit: it was appended, but leadership was
    lost, the node stopped, or the timeout passed before the ack point."""

    def __init__(self, message: str, index: int = 0, term: int = 0) -> None:
        super().__init__(message)
        self.index = index
        self.term = term


# How a proposal's caller learns its outcome: (entry, None) at its ack
# point, (None, error) otherwise. Called once, from the node's loop, at a
# point where no Ready is being carried out (see `_run_completions`).
Completion = Callable[["commitlog.Entry | None", "BaseException | None"], None]
# What an `apply` may leave for later in its pass (RaftGroupNode.__init__).
ApplyRest = Callable[[], None]


@dataclass(slots=True, eq=False)
class _Proposal:
    """A proposal, queued for the core and then appended, until its outcome
    is known."""

    kind: int
    body: bytes
    then: Completion
    deadline: float  # loop time: ProposalUnknown after it (checked each tick)
    timeout: float
    started: float  # the node's clock, for the ack-latency observer
    # The future of `propose_nowait`: a caller that cancelled it gave up,
    # and its proposal is dropped if it was not appended yet.
    future: asyncio.Future[commitlog.Entry] | None = None
    term: int = 0
    entry: commitlog.Entry | None = None
    done: bool = False


class RaftGroupNode:
    """One replica: CommitLog + Raft core + peer transport on the running loop."""

    def __init__(
        self,
        config: NodeConfig,
        apply: Callable[[Sequence[commitlog.Entry]], ApplyRest | None],
        on_soft_state: Callable[[SoftStateInfo], None] | None = None,
        io: NodeIO | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
        observer: NodeObserver = NO_OBSERVER,
        on_install: Callable[[SnapshotInfo], None] | None = None,
    ) -> None:
        """`on_install(info)` is called (on the loop) after this replica
        installed a leader's snapshot: its log now starts below `info.index`
        and ends there, and the state machine must reset itself to
        `read_state(info)`; entries after it follow through `apply`.

        `apply(entries)` may return the rest of its work (`ApplyRest`): what
        neither the proposals' outcomes nor the next `apply` depend on. It
        runs once the pass that applied has told its proposals' callers
        (`_run_completions`), so their answers leave first, and always before
        the next `apply` (`_hand_over`)."""
        self.config = config
        self._on_install = on_install
        self._observer = observer
        self._apply_cb = apply
        self._apply_rest: ApplyRest | None = None
        self._on_soft_state = on_soft_state
        self._on_failure = on_failure
        io = io or NodeIO()
        self._bugs = io.bugs
        # Opened (and recovered) now so the broker can replay before start().
        self.log: CommitLog = CommitLog.open(config.data_dir, config.commitlog_config())
        try:
            # A power cut between replacing the log and adopting the state
            # of an install: adopt it now (or drop a partial transfer).
            finish_interrupted_install(self.log)
        except BaseException:
            self.log.close()
            raise
        self.storage = CommitLogStorage(self.log)
        self._initial_hard_state = self.storage.initial_state()
        if self._initial_hard_state.commit > self.log.last_index:
            # The commit index is saved only up to what was fsynced, so the
            # entries it covers survived any crash: if they are gone, the disk
            # lost acknowledged data. Serving would hide it.
            self.log.close()
            raise DurableDataLostError(
                f"{config.data_dir}: the hard state says entry {self._initial_hard_state.commit}"
                f" is committed but the log ends at {self.log.last_index}: durable entries "
                "were lost")
        self._core: RaftNode | None = None
        self._clock = io.clock
        self._flusher = Flusher(self.log, worker=io.fsync_worker, clock=io.clock,
                                on_failure=self._fail, observer=observer)
        self._state_worker: Worker = io.state_worker or SyncThread("hardstate")
        self.counters = NodeCounters()
        self._transport: Transport
        if io.transport is None:
            self._transport = PeerTransport(
                config.group, config.node_id, config.peers, self._deliver,
                bind_host=config.bind_host, secret=config.cluster_secret,
                server_ssl=config.tls_server, client_ssl=config.tls_client,
                on_auth_failure=self._auth_failure, accept_peer=self._accept_peer,
                directory_id=config.directory_id, busy_poll_s=config.busy_poll_us / 1e6)
        else:
            self._transport = io.transport(config.group, config.node_id, config.peers,
                                           self._deliver, config.bind_host)
        # Election timeouts are randomised by the core through this rng; the
        # runtime seeds it from the OS so the replicas never draw alike.
        self._rng = io.rng or random.Random(int.from_bytes(os.urandom(16), "little"))
        self._queue: list[_Proposal] = []
        # A Ready `_carry_out` took from the core but could not carry out
        # without waiting: the driver's next.
        self._handoff: Ready | None = None
        # A leader's Readies advanced before their fsync ended
        # (`_handle_unsynced`): the last of their entries, and the task
        # telling the core when the log is durable that far.
        # `membership` before start, and the log's (first, last) index it was read at.
        self._stored_membership: tuple[tuple[int, int], Membership] | None = None
        self._unsynced_target = 0
        self._unsynced_wake = asyncio.Event()
        self._durability_task: asyncio.Task[None] | None = None
        self._pending: dict[int, _Proposal] = {}
        # Outcomes of proposals, told to their callers once no Ready is being
        # carried out in this call stack (`_depth` 0): a caller may then
        # propose again or answer its client at once, without a loop hop.
        self._completions: list[tuple[Completion, commitlog.Entry | None,
                                      BaseException | None]] = []
        self._depth = 0
        self._wake = asyncio.Event()
        # The driver waits for `_wake` with nothing in hand: a proposal's
        # round may then run in a callback (`_propose_round`) instead.
        self._driver_idle = False
        self._round_scheduled = False
        self._state_waiters: list[asyncio.Future[None]] = []
        self._driver: asyncio.Task[None] | None = None
        self._ticker_task: asyncio.Task[None] | None = None
        self._bg: set[asyncio.Task[Any]] = set()
        self._hs_lock = asyncio.Lock()
        self._started = False
        self._stopping = False
        self._stopped = False
        self.failed: BaseException | None = None
        self._applied = 0
        self._applied_term = 0
        # A follower's committed entries not handed to the state machine yet
        # (`follower_apply_delay_ms`), and the timer that hands them over.
        self._apply_batch: list[commitlog.Entry] = []
        self._apply_timer: asyncio.TimerHandle | None = None
        # The leader watch (_watch_leader): whose connections are closed, for
        # how many ticks in a row.
        self._lost_leader = 0
        self._lost_ticks = 0
        self._soft = SoftState(Role.FOLLOWER, 0, self._initial_hard_state.term)
        # Hard state as handed out by the core (latest) and as on disk.
        self._hs_latest = self._initial_hard_state
        self._hs_saved = self._initial_hard_state
        # Snapshot transfer: outgoing per peer (leader), incoming (follower).
        self._senders: dict[int, SnapshotSender] = {}
        self._transfer_ids = itertools.count(1)
        self._receiver = SnapshotReceiver(config.data_dir, self.log.config.segment_size_bytes,
                                          config.install_max_bytes)
        self._receiver.refused = self.counters.transfer_refusals  # one live dict
        self._installing = False
        self._installed: SnapshotMeta | None = None  # the last snapshot installed
        # The configuration the transport was last told about, and every node
        # id seen in a committed configuration (a node seen there and then
        # dropped was removed: its connections are refused). Committed only:
        # a node named by a configuration that was appended and then cut
        # (an isolated leader's) is no removed node, and may come back as
        # the leader that added it for good (seed 20400970, real-node). Not
        # `peers`: that is an address book, and a spare or wiped node must
        # accept a leader added by a configuration it has not received yet.
        self._peers_of: Membership | None = None
        self._known_nodes: set[int] = set()
        # Leader: the configuration each outgoing snapshot transfer carries.
        self._transfer_membership: dict[int, Membership | None] = {}

    # ------------------------------------------------------------ observation

    @property
    def core(self) -> RaftNode | None:
        """The sans-I/O core (None before start), for simulators to read; never to drive."""
        return self._core

    @property
    def role(self) -> str:
        if self._core is None or self.failed is not None:
            return "follower"  # a failed node leads nothing (status() says why)
        return ROLE_NAMES[self._core.role]

    @property
    def term(self) -> int:
        return self._core.term if self._core else self._initial_hard_state.term

    @property
    def leader_id(self) -> int:
        return self._core.leader_id if self._core and self.failed is None else 0

    @property
    def commit_index(self) -> int:
        if self._core:
            return self._core.commit
        return self._initial_hard_state.commit

    @property
    def applied_index(self) -> int:
        return self._applied

    @property
    def install_pending(self) -> bool:
        """The core restored a leader's snapshot that the driver has not
        installed yet: `commit_index` already counts it, `log` does not."""
        core = self._core
        if core is None:
            return False
        restored = core.log.unstable_snapshot  # until the core's advance
        return self._installing or (restored is not None and restored != self._installed)

    @property
    def last_index(self) -> int:
        return self._core.log.last_index if self._core else self.log.last_index

    @property
    def leader_ready(self) -> bool:
        """Leader whose current-term NOOP is committed and applied: entries of
        earlier terms are all applied too, so the broker's state is complete."""
        core = self._core
        return (core is not None and self.failed is None and core.role is Role.LEADER
                and self._applied_term == core.term)

    async def wait_leader_ready(self, timeout: float) -> bool:
        return await self._wait_for(lambda: self.leader_ready, timeout)

    def note_snapshot(self, info: SnapshotInfo) -> None:
        """A snapshot of the state machine was written (the broker calls this
        after `write_snapshot`): it is what a follower that needs entries
        deleted below it will be sent."""
        self.storage.note_snapshot(info)

    def status(self) -> NodeStatus:
        core = self._core
        flusher = self._flusher
        snap = self.storage.snapshot_info
        leading = None
        if core is not None:
            st = core.status()
            leading = LeaderStatus(
                stable_index=st.stable_index, vote=st.vote, elections_won=core.elections_won,
                followers={peer: FollowerStatus(
                    f.match, f.next, f.state, f.inflight, st.last_index - f.match,
                    learner=f.learner, directory_id=f.directory_id,
                    identity_mismatch=f.identity_mismatch,
                    connected=self._transport.connected(peer), reserve=f.reserve)
                           for peer, f in st.progress.items()},
                transport=self._transport.stats(),
                reserve_appends=core.reserve_appends, reserve_changes=core.reserve_changes)
        return NodeStatus(
            group=self.config.group,
            node_id=self.config.node_id,
            role=self.role,
            term=self.term,
            leader_id=self.leader_id,
            leader_ready=self.leader_ready,
            commit_index=self.commit_index,
            applied_index=self._applied,
            last_index=self.last_index,
            durable_index=self.log.durable_index,
            flush=self.config.flush,
            replicate=self.config.replicate,
            failed=repr(self.failed) if self.failed else None,
            fsyncs=flusher.syncs,
            fsyncs_in_place=flusher.inline_syncs,
            fsynced_entries=flusher.synced_entries,
            fsync_seconds=round(flusher.sync_s, 6),
            fsync_handoff_seconds=round(flusher.sync_start_wait_s + flusher.sync_resume_wait_s,
                                        6),
            entries_per_fsync=(flusher.synced_entries / flusher.syncs
                               if flusher.syncs else 0.0),
            pending_proposals=len(self._pending) + len(self._queue),
            first_index=self.log.first_index,
            snapshot_index=snap.index if snap is not None else 0,
            transfers={peer: {"index": t.index, "acked": t.acked, "total": t.total}
                       for peer, t in self._senders.items()},
            counters=replace(self.counters, auth_failures=dict(self.counters.auth_failures),
                             transfer_refusals=dict(self.counters.transfer_refusals)),
            core=leading,
            membership=self.membership,
            membership_index=core.membership_index if core is not None else 0,
            membership_pending=core.membership_pending if core is not None else False,
            directory_id=self.config.directory_id,
        )

    # ------------------------------------------------------------- membership

    @property
    def membership(self) -> Membership:
        """The configuration in effect; before start, the one the core will
        start with (the stored log's last CONFIG entry, its snapshot's, or
        the bootstrap one)."""
        core = self._core
        if core is not None:
            return core.membership
        # Read once per shape of the log: the CommitLog storage has no index
        # of entry kinds, so this reads the stored log (as the core does at
        # start); a repair before start (a cut tail) reads it again.
        shape = (self.log.first_index, self.log.last_index)
        cached = self._stored_membership
        if cached is None or cached[0] != shape:
            cached = self._stored_membership = (shape, stored_membership(
                self.storage, self.config.bootstrap_membership()))
        return cached[1]

    @property
    def directory_id(self) -> int:
        return self.config.directory_id

    @property
    def node_id(self) -> int:
        return self.config.node_id

    def membership_at(self, index: int) -> Membership:
        """The configuration in effect at log index `index` (for snapshots).

        LookupError when the core no longer knows it: `index` lies below its
        log's start, which happens while an install is pending (the core
        restored a leader's later snapshot, whose configuration it would
        otherwise give for every older index, while the CommitLog and the
        state machine are still at `index`: seed 12003263)."""
        core = self._core
        if core is None:
            info = self.storage.snapshot_membership
            return info if info is not None else self.config.bootstrap_membership()
        if index < core.log.first_index() - 1:
            raise LookupError(f"the configuration at index {index} is no longer known here "
                              f"(the log starts at {core.log.first_index()})")
        return core.membership_at(index)

    async def change_membership(self, new: Membership, timeout: float = 10.0) -> int:
        """Propose `new` as the next configuration; its CONFIG entry's index once
        committed. Raises NotLeaderError, `dledger.MembershipChangeRefused`
        (the core's rules: one change at a time, single-server, ...),
        ProposalUnknown if this node stopped leading before it committed,
        TimeoutError."""
        core = self._require_core()
        if self.failed is not None or self._stopping:
            raise NotLeaderError(0, f"node unavailable: {self.failed or 'stopping'}")
        try:
            proposed = core.propose_membership(new)
        except NotLeader as exc:
            raise NotLeaderError(exc.leader_id) from None
        self._sync_peers()
        self._wake.set()

        def settled() -> bool:
            # A leader that stepped down (check-quorum: it lost its quorum)
            # cannot commit the entry any more; only a later leader can, so
            # its outcome is unknown from that moment, not at the timeout.
            return core.commit >= proposed.index or core.term != proposed.term \
                or core.role is not Role.LEADER

        if not await self._wait_for(settled, timeout):
            raise TimeoutError(f"configuration entry {proposed.index} not committed within "
                               f"{timeout:g}s")
        if core.log.term_or_none(proposed.index) != proposed.term or \
                core.commit < proposed.index:
            raise ProposalUnknown("the configuration entry was not committed in its term",
                                  proposed.index, proposed.term)
        return proposed.index

    def _sync_peers(self) -> None:
        """Tell the transport the configuration's members, whenever it changed
        (an appended or truncated CONFIG entry, a snapshot installed)."""
        core = self._core
        if core is None:
            return
        membership = core.membership
        if membership is self._peers_of:
            return
        self._peers_of = membership
        self._note_committed_members(core)
        peers: dict[int, tuple[str, int]] = {}
        for m in membership.voters + membership.learners:
            if m.address:
                peers[m.node_id] = parse_address(m.address)
            elif m.node_id in self.config.peers:
                peers[m.node_id] = self.config.peers[m.node_id]
        self._transport.set_peers(peers)

    def _accept_peer(self, node_id: int) -> bool:
        """Whether an inbound connection from a node not among the transport's
        peers is taken: a member, or a node never seen in any configuration
        (added by a configuration this node has not received yet); never a
        node whose removal is committed. A removal only appended may still be
        undone by the very node it removes: if that node wins the next
        election, it must reach this one to truncate the entry."""
        core = self._core
        if core is None:
            return node_id in self.config.peers
        self._note_committed_members(core)
        return (node_id in core.membership.node_ids
                or node_id in core.committed_membership.node_ids
                or node_id not in self._known_nodes)

    def _note_committed_members(self, core: RaftNode) -> None:
        """Add the members of every committed configuration the core's
        history holds to `_known_nodes` (called when the configuration in
        effect changes and when an unlisted node dials: both rare)."""
        commit = core.commit
        for index, membership in core.configs.items():
            if index > commit:
                break
            self._known_nodes |= membership.node_ids

    # -------------------------------------------------------------- lifecycle

    async def start(self, applied_index: int) -> None:
        """Bind the Raft port and start ticking; entries after `applied_index`
        are handed to `apply` once committed."""
        if self._started:
            raise RuntimeError("node already started")
        self._started = True
        cfg = self.config
        # What the state machine applied was committed, though the lazily
        # saved commit index may be lower (a snapshot taken after the last
        # save, restored at start): the core must know, or it would let a
        # leader replace those entries (possible only under flush=async,
        # after a quorum lost them) without noticing the divergence.
        self.storage.commit_floor = min(applied_index, self.log.last_index)
        core_config = Config(
            node_id=cfg.node_id,
            voters=cfg.initial_voters or frozenset(cfg.peers),
            membership=cfg.bootstrap_membership(),
            directory_id=cfg.directory_id,
            election=cfg.election_config(),
            append_entries_max=256,
            append_bytes_max=1 << 20,
            reserve_batch_entries=cfg.reserve_batch_entries,
            reserve_batch_bytes=cfg.reserve_batch_bytes,
            bugs=self._bugs,
        )
        self._core = RaftNode(core_config, self.storage, self._rng,
                              place=segment_placement(self.log.config.segment_size_bytes),
                              applied=applied_index)
        self._applied = applied_index
        # Mirror the core's starting hard state (its commit is clamped to the log).
        self._hs_latest = HardState(self._initial_hard_state.term, self._initial_hard_state.vote,
                                    self._core.commit)
        if 0 < applied_index <= self.log.last_index:
            with contextlib.suppress(LookupError):  # below the log and no snapshot there
                self._applied_term = self.storage.term(applied_index)
        self._sync_peers()
        await self._flusher.start()
        await self._transport.start()
        loop = asyncio.get_running_loop()
        self._driver = loop.create_task(self._drive(), name=f"raft-driver-{cfg.node_id}")
        self._ticker_task = loop.create_task(self._ticker(), name=f"raft-ticker-{cfg.node_id}")

    async def wait_durable(self, index: int) -> None:
        """Wait until the local CommitLog has fsynced entry `index` (through the
        Flusher, so the fsync runs on its thread, never on the loop)."""
        await self._flusher.wait_durable(index)

    async def stop(self) -> None:
        """Close sockets, finish the Ready in progress, flush, checkpoint, close the log.

        Every step runs even if an earlier one failed. Storage errors are
        expected on a failing disk (the log is crash-safe without the step)
        and only logged; any other error of a step is logged, and the first
        one is raised once all steps have run.
        """
        if self._stopped:
            return
        self._stopped = True
        self._stopping = True
        if not self._started:
            self._state_worker.shutdown()
            self.log.close()
            return
        failures: list[Exception] = []
        if self._ticker_task is not None:
            await self._step(failures, "ticker", cancel_and_wait([self._ticker_task]))
        if self._durability_task is not None:
            await self._step(failures, "durability reports",
                             cancel_and_wait([self._durability_task]))
        self._wake.set()
        if self._driver is not None:
            # The driver returns after the Ready in progress (it turns its own
            # errors into `failed`); one stuck on a dead disk is cancelled.
            _, late = await asyncio.wait([self._driver], timeout=DRIVER_STOP_TIMEOUT_S)
            if late:
                log.error("raft %s/%d: the driver did not stop within %g s; cancelling it",
                          self.config.group, self.config.node_id, DRIVER_STOP_TIMEOUT_S)
            await self._step(failures, "driver", cancel_and_wait([self._driver]))
        self._fail_proposals("node stopped")
        self._run_completions()
        if self.failed is None:
            try:
                self._hand_over_batch()
            except Exception as exc:  # the state machine's storage: logged, stop goes on
                log.error("raft %s/%d: applying the last batch failed: %r", self.config.group,
                          self.config.node_id, exc)
        await self._step(failures, "transport", self._transport.close())
        self._drop_transfers()
        self._receiver.forget()
        # Background saves and closes run to their end (a hard-state write cut
        # short would leave the state worker busy at shutdown).
        background = list(self._bg)
        if background:
            await asyncio.wait(background)
        for task in background:
            if not task.cancelled() and task.exception() is not None:
                await self._step(failures, "background task", task)
        await self._step(failures, "flusher", self._flusher.close())
        if self.failed is None:
            try:
                await self._save_hard_state()
            except (OSError, StorageError) as exc:
                log.error("raft %s/%d: final hard-state save failed: %r", self.config.group,
                          self.config.node_id, exc)
        self._state_worker.shutdown()
        self.log.close()
        self._notify_state()
        if failures:
            raise failures[0]

    async def _step(self, failures: list[Exception], what: str,
                    step: Coroutine[Any, Any, Any] | asyncio.Future[Any]) -> None:
        """Await one step of `stop()`: log a storage error, log and collect
        any other (the caller's own cancellation still propagates)."""
        try:
            await step
        except (OSError, StorageError) as exc:
            log.error("raft %s/%d: stopping the %s failed on storage: %r", self.config.group,
                      self.config.node_id, what, exc)
        except Exception as exc:
            log.error("raft %s/%d: stopping the %s failed: %r", self.config.group,
                      self.config.node_id, what, exc, exc_info=exc)
            failures.append(exc)

    # -------------------------------------------------------------- proposals

    async def propose(self, kind: int, body: bytes, timeout: float = 3.0) -> commitlog.Entry:
        """Append an entry as leader; return it once the configured guarantee holds.

        Raises NotLeaderError at once when this node cannot take it (with the
        leader it knows), commitlog.MessageTooLargeError for an entry too big
        for the log, ProposalUnknown when the outcome cannot be known.
        """
        return await self.propose_nowait(kind, body, timeout)

    def propose_nowait(self, kind: int, body: bytes,
                       timeout: float = 3.0) -> asyncio.Future[commitlog.Entry]:
        """`propose` without a coroutine: what it raises at once is raised
        here, the rest (the entry, or ProposalUnknown, NotLeaderError) comes
        in the future returned. Cancelling the future abandons the proposal
        if it was not appended."""
        future: asyncio.Future[commitlog.Entry] = asyncio.get_running_loop().create_future()
        self._propose(kind, body, functools.partial(_settle, future), timeout, future)
        return future

    def propose_then(self, kind: int, body: bytes, then: Completion,
                     timeout: float = 3.0) -> None:
        """`propose` for the per-message path: what it raises at once is
        raised here; the outcome goes to `then(entry, error)`, called once,
        synchronously from the node at its ack point (or at the deadline,
        with ProposalUnknown), never from inside a Ready being carried out.
        While the driver idles the proposal's round runs right here, so a
        caller that collected a loop pass's requests (the broker's group
        commit) sends them to the followers without another loop hop.
        `then` may run before this returns (a one-node group commits at once)."""
        self._propose(kind, body, then, timeout, None)

    def _propose(self, kind: int, body: bytes, then: Completion, timeout: float,
                 future: asyncio.Future[commitlog.Entry] | None) -> None:
        core = self._require_core()
        if self.failed is not None or self._stopping:
            raise NotLeaderError(0, f"node unavailable: {self.failed or 'stopping'}")
        if core.role is not Role.LEADER:
            raise NotLeaderError(core.leader_id)
        if core.elector.transferee:
            raise NotLeaderError(core.elector.transferee)
        size = commitlog.HEADER_SIZE + len(body)
        if size > self.log.config.entry_size_limit:
            raise commitlog.MessageTooLargeError("entry", size, self.log.config.entry_size_limit)
        loop = asyncio.get_running_loop()
        # No timer per proposal (this is the per-message path): the ticker
        # fails the proposals whose deadline passed (`_expire_proposals`).
        self._queue.append(_Proposal(kind, body, then, loop.time() + timeout, timeout,
                                     self._clock(), future))
        self.counters.proposals += 1
        if self._driver_idle:
            # With flush="sync" the round syncs in place when its entries are
            # small (`_syncs_in_place`); otherwise `_carry_out` hands it to
            # the driver, which waits for the fsync thread.
            if future is None and self._depth == 0 and self._handoff is None:
                self._propose_round()
            elif not self._round_scheduled:
                # One callback, not a wake-up of the driver task: the round
                # runs after the callbacks already queued (their proposals
                # join it).
                self._round_scheduled = True
                loop.call_soon(self._propose_round)
        else:
            self._wake.set()

    def _expire_proposals(self) -> None:
        """Proposals whose deadline passed: their callers stop waiting (the
        entry may still commit; `_apply` skips a proposal that is done)."""
        now = asyncio.get_running_loop().time()
        for p in [*self._queue, *self._pending.values()]:
            if not p.done and now >= p.deadline:
                self.counters.proposals_unknown += 1
                self._complete(p, None, ProposalUnknown(
                    f"no ack within {p.timeout} s; the entry may still commit"))

    def _complete(self, p: _Proposal, entry: commitlog.Entry | None,
                  error: BaseException | None) -> None:
        """Record a proposal's outcome; its caller is told in `_run_completions`."""
        if p.done:
            return
        p.done = True
        if error is None:
            self._observer.acked(self._clock() - p.started)
        self._completions.append((p.then, entry, error))

    def _run_completions(self) -> None:
        """Tell the callers the outcomes recorded so far, then run the
        state machine's rest of the last apply (`ApplyRest`), unless a Ready
        is being carried out further up this call stack (its outermost
        caller runs them when it is done)."""
        if self._depth or not (self._completions or self._apply_rest):
            return
        self._depth += 1
        try:
            while self._completions:
                done, self._completions = self._completions, []
                for then, entry, error in done:
                    try:
                        then(entry, error)
                    except Exception:
                        log.exception("raft %s/%d: a proposal's completion failed",
                                      self.config.group, self.config.node_id)
        finally:
            self._depth -= 1
        try:
            self._run_apply_rest()
        except Exception as exc:  # the state machine's storage, as in `apply`
            self._fail(exc)

    def _run_apply_rest(self) -> None:
        """The last apply's rest, once; what it raises goes to the caller, as
        an error of `apply` would (nothing after it in the pass runs)."""
        rest, self._apply_rest = self._apply_rest, None
        if rest is not None:
            rest()

    def _propose_round(self) -> None:
        """Queued proposals' round, while the driver idles: drained into the
        core and carried out here when nothing of it must be awaited (else
        `_carry_out` hands it to the driver)."""
        self._round_scheduled = False
        if not self._queue:
            return
        if (not self._driver_idle or self._handoff is not None or self._core is None
                or self._stopping):
            # The driver has a Ready to carry out first (no Ready may be out
            # when proposals go into the core): its round takes them.
            self._wake.set()
            return
        try:
            self._drain_proposals()
        except Exception as exc:
            self._fail(exc)
            self._run_completions()
            return
        self._carry_out()

    def _drain_proposals(self) -> None:
        core = self._require_core()
        queued, self._queue = self._queue, []
        # A proposal whose caller gave up before it was appended is dropped:
        # nothing was written, so nothing can commit.
        live = [q for q in queued
                if not q.done and (q.future is None or not q.future.done())]
        if not live:
            return
        try:
            proposed = core.propose_many([(q.kind, q.body) for q in live])
        except NotLeader as exc:
            for q in live:
                self._complete(q, None, NotLeaderError(exc.leader_id))
            return
        self.counters.proposal_batches += 1
        unstable, offset = core.log.unstable, core.log.offset
        for q, p in zip(live, proposed, strict=True):
            q.term = p.term
            q.entry = commitlog.Entry(p.index, p.term, q.kind,
                                      unstable[p.index - offset].position, q.body)
            self._pending[p.index] = q

    def _fail_proposals(self, reason: str) -> None:
        queued, self._queue = self._queue, []
        for q in queued:
            self._complete(q, None, NotLeaderError(0, f"not appended: {reason}"))
        pending, self._pending = self._pending, {}
        for index, p in pending.items():
            if not p.done:
                self.counters.proposals_unknown += 1
                self._complete(p, None, ProposalUnknown(reason, index, p.term))

    # ------------------------------------------------------- leadership transfer

    async def transfer_leadership(self, to: int, timeout: float = 3.0) -> bool:
        """Hand leadership to `to`; True once `to` is known to lead. Returns
        False as soon as another node is known to lead instead (the target
        lost its campaign): `leader_id` then names the node that won."""
        core = self._require_core()
        if to == self.config.node_id:
            return core.role is Role.LEADER
        if core.role is not Role.LEADER or not core.transfer_leadership(to):
            return False
        self._wake.set()
        await self._wait_for(
            lambda: core.role is not Role.LEADER and core.leader_id not in (0, self.config.node_id),
            timeout)
        return core.role is not Role.LEADER and core.leader_id == to

    # ---------------------------------------------------------------- driver

    def _require_core(self) -> RaftNode:
        if self._core is None:
            raise RuntimeError("node not started")
        return self._core

    def _auth_failure(self, reason: str) -> None:
        failures = self.counters.auth_failures
        failures[reason] = failures.get(reason, 0) + 1

    def _deliver(self, messages: list[Message]) -> None:
        core = self._core
        if core is None or self._stopping or self.failed is not None:
            return
        try:
            for msg in messages:
                if isinstance(msg, TRANSFER_MESSAGES):
                    self._on_transfer(msg)
                elif isinstance(msg, InstallSnapshot) and not self._may_install(msg):
                    # Its files are not (or no longer) staged here: the leader
                    # times out and streams them again.
                    self._refusal("install_not_staged")
                else:
                    core.step(msg)
        except CommittedDivergence as exc:
            # Not the peer's fault: this replica lost data it had committed.
            self._fail(exc)
        except (InvariantViolation, LookupError, ValueError, TypeError) as exc:
            # A peer's message broke a rule the core checks (e.g. an entry at
            # the wrong position; checks run before any state changes):
            # refuse that peer's connection, keep serving the others.
            self.counters.peer_errors += 1
            log.error("raft %s/%d: message rejected by the core: %r", self.config.group,
                      self.config.node_id, exc)
            raise CodecError(f"message rejected: {exc!r}") from exc
        finally:
            self._carry_out()

    def _carry_out(self) -> None:
        """After an input (messages stepped, a tick): carry out the Ready it
        produced in this same pass when nothing of it must be awaited, else
        wake the driver.

        The acks a leader steps commit entries: their Ready (the commit
        index for the followers, the entries to apply, the clients to
        answer) needs no write, so it is handled here, in the pass that read
        the acks, instead of in a second driver round after the proposal's
        round. The same holds for a follower's commit-only append, for
        heartbeats and, with flush="async" (nothing to fsync before an ack),
        for a follower's appends. The Ready contract is the driver's
        (dledger/ready.py): this runs only when no Ready is out (the core
        hands out none while one is, so every earlier write is done), and a
        Ready that must wait (a snapshot to install, a term or vote to save,
        entries to fsync) goes to the driver as it is. Queued proposals also
        go to the driver, so that their round carries this one's work too.
        """
        core = self._core
        if core is None or self._stopping or self.failed is not None:
            self._run_completions()
            return
        if not self._queue and self._handoff is None:
            self._depth += 1
            try:
                while core.has_ready():
                    rd = core.ready()
                    durable = True
                    if self._must_wait(rd):
                        if self._syncs_in_place(rd, core):
                            self.counters.inline_readies += 1
                            self._handle_synced_now(rd)
                        elif self._leader_unsynced(rd, core):
                            self.counters.inline_readies += 1
                            self._handle_unsynced(rd)
                            durable = False
                        else:
                            self._handoff = rd
                            break
                    else:
                        self.counters.inline_readies += 1
                        self._handle_now(rd)
                    core.advance(rd, durable)
                    self._advanced()
            except Exception as exc:
                self._fail(exc)
            finally:
                self._depth -= 1
            # The loop stopped at a Ready it handed off, or when the core had
            # none left: only the completions' callbacks can have made more.
            completions = bool(self._completions)
            self._run_completions()
            if self.failed is not None or (
                    self._handoff is None and not (completions and core.has_ready())):
                return
        self._wake.set()

    async def _ticker(self) -> None:
        core = self._require_core()
        loop = asyncio.get_running_loop()
        interval = self.config.tick_ms / 1000
        commit_every = max(1, round(COMMIT_PERSIST_INTERVAL_S / interval))
        grace = self.config.leader_lost_grace_ticks
        n = 0
        next_at = loop.time() + interval
        while not self._stopping:
            delay = next_at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            now = loop.time()
            # Missed ticks are dropped, not replayed: after a stall of the
            # loop a burst of ticks would start an election at once.
            next_at = max(next_at + interval, now + interval / 2)
            if self.failed is not None:
                return
            core.tick()
            if grace:
                self._watch_leader(core, grace)
            if self._senders:
                self._poll_transfers()
            if self._queue or self._pending:
                self._expire_proposals()
            self._carry_out()
            n += 1
            if n % commit_every == 0 and min(self._hs_latest.commit, self.log.durable_index) \
                    > self._hs_saved.commit:
                self._spawn(self._save_in_background())

    def _watch_leader(self, core: RaftNode, grace: int) -> None:
        """Tell the core once every connection to and from its leader has been
        closed at `grace` ticks in a row: the leader's process is most likely
        gone (the kernel closes a killed process's sockets at once), so the
        group need not wait out an election timeout. A reset the peers repair
        by re-dialling (20 ms) passes within the grace; a wrong notice is
        harmless (pre-vote and the other followers' leases, see
        `RaftNode.leader_unreachable`)."""
        leader = core.leader_id
        if (leader == 0 or leader == self.config.node_id or core.role is not Role.FOLLOWER
                or not self._transport.peer_lost(leader)):
            self._lost_ticks = 0
            return
        if leader != self._lost_leader:
            self._lost_leader, self._lost_ticks = leader, 0
        self._lost_ticks += 1
        if self._lost_ticks == grace and core.leader_unreachable(leader):
            self.counters.leader_lost_notices += 1
            log.info("raft %s/%d: every connection with leader %d closed for %d ticks: "
                     "campaigning early", self.config.group, self.config.node_id, leader, grace)

    async def _drive(self) -> None:
        core = self._require_core()
        try:
            while not self._stopping:
                ready = self._handoff
                if ready is None:
                    if self._queue:
                        self._drain_proposals()
                    if not core.has_ready():
                        self._wake.clear()
                        self._driver_idle = True
                        try:
                            await self._wake.wait()
                        finally:
                            self._driver_idle = False
                        continue
                    ready = core.ready()
                else:
                    self._handoff = None  # taken by _carry_out, which could not wait
                if self._leader_unsynced(ready, core):
                    self._handle_unsynced(ready)
                    core.advance(ready, durable=False)
                else:
                    await self._handle_ready(ready)
                    core.advance(ready)
                self._advanced()
                self._run_completions()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._fail(exc)

    def _advanced(self) -> None:
        if self.config.replicate == "async" and self._pending:
            self._ack_stable()
        self._notify_state()

    def _must_wait(self, rd: Ready) -> bool:
        """Whether carrying out `rd` awaits something (see _write)."""
        if rd.snapshot is not None:
            return True
        if rd.entries and rd.must_sync and self.config.flush == "sync":
            return True
        hs = rd.hard_state
        return hs is not None and (hs.term, hs.vote) != (self._hs_latest.term,
                                                          self._hs_latest.vote)

    def _handle_now(self, rd: Ready) -> None:
        """Carry out a Ready that awaits nothing (`_must_wait` is False)."""
        self.counters.readies += 1
        # The messages first (the contract lets `messages` leave before the
        # write; acknowledgements are in `messages_after_persist`): a
        # leader's appends then reach the followers while it writes. Writing
        # first, as before, cost W=1 with flush=async 9 % of its throughput
        # (p50 0.68 -> 0.59 ms, docs/broker.md "Reserves").
        self._send_now(rd)
        waits = self._write(rd)
        if waits:
            raise InvariantViolation("a Ready carried out at once had something to wait for")
        self._finish(rd)

    def _syncs_in_place(self, rd: Ready, core: RaftNode) -> bool:
        """Whether a Ready that waits only for its entries' fsync (flush=sync)
        can have it here and now (`Flusher.sync_now`): the flusher idles, the
        entries are small (INLINE_SYNC_MAX_BYTES) and, on a leader, they are
        all that is in flight (one request at a time, where the hand-off to
        the fsync thread would cost more than the sync)."""
        if rd.snapshot is not None or not rd.entries or not self._flusher.idle:
            return False
        hs = rd.hard_state
        if hs is not None and (hs.term, hs.vote) != (self._hs_latest.term, self._hs_latest.vote):
            return False
        if sum(len(e.data) for e in rd.entries) > INLINE_SYNC_MAX_BYTES:
            return False
        return core.role is not Role.LEADER or (
            not self._pending or next(iter(self._pending)) >= rd.entries[0].index)

    def _handle_synced_now(self, rd: Ready) -> None:
        """Carry out a Ready whose only wait is its entries' fsync, with the
        fsync done here: the messages (a leader's appends) leave first, so
        the followers write while this node syncs."""
        self.counters.readies += 1
        self._send_now(rd)
        waits = self._write(rd, sync_in_place=True)
        invariant(not waits, "a Ready synced in place had something else to wait for")
        self._flusher.sync_now()
        invariant(self.log.durable_index >= rd.entries[-1].index,
                  "a Ready synced in place is not durable")
        self._finish(rd)

    async def _handle_ready(self, rd: Ready) -> None:
        self.counters.readies += 1
        if rd.snapshot is not None:
            # First, before anything else of this Ready (dledger/ready.py).
            await self._install_snapshot(rd)
        self._send_now(rd)
        waits = self._write(rd)
        if waits:
            await asyncio.gather(*waits)
        self._finish(rd)

    def _leader_unsynced(self, rd: Ready, core: RaftNode) -> bool:
        """Whether `rd` is a leader's Ready whose only wait is its entries'
        fsync (flush=sync; no snapshot, no new term or vote, nothing to send
        after the persist): carried out and advanced at once, its fsync's
        end told to the core later (`_handle_unsynced`)."""
        hs = rd.hard_state
        return (core.role is Role.LEADER and self.config.flush == "sync" and bool(rd.entries)
                and rd.snapshot is None and not rd.messages_after_persist
                and (hs is None or (hs.term, hs.vote) == (self._hs_latest.term,
                                                          self._hs_latest.vote)))

    def _handle_unsynced(self, rd: Ready) -> None:
        """A leader's Ready that waits only for its entries' fsync, carried
        out without waiting (RaftNode rule 3): the appends leave, the
        entries are written and handed to the fsync, the committed entries
        are applied. The caller advances it with `durable=False`; the
        durability task reports the fsync's end (`RaftNode.durable_to`).
        Until then the leader does not count these entries toward a commit,
        so what it answers meanwhile a quorum of the others holds durably,
        and its next Ready need not wait for its disk."""
        self.counters.readies += 1
        self._send_now(rd)
        self._write(rd, reported=True)
        self._unsynced_target = max(self._unsynced_target, rd.entries[-1].index)
        self._unsynced_wake.set()
        if self._durability_task is None:
            self._durability_task = asyncio.get_running_loop().create_task(
                self._report_durable(), name=f"raft-{self.config.node_id}-durable")
        self._finish(rd)

    async def _report_durable(self) -> None:
        """Tell the core how far the log is durable whenever a fsync of a
        leader's unsynced entries ends (see _handle_unsynced)."""
        log = self.log
        try:
            while not self._stopping:
                await self._unsynced_wake.wait()
                self._unsynced_wake.clear()
                while (core := self._core) is not None and self.failed is None:
                    target = min(self._unsynced_target, log.last_index)
                    if log.durable_index < target:
                        try:
                            await self._flusher.wait_durable(target)
                        except StorageError:
                            if self._flusher.failed is not None or log.failed is not None:
                                raise
                            break  # truncated meanwhile: not leading any more
                    before = core.stable_index
                    if log.durable_index > before:
                        core.durable_to(log.durable_index)
                    if core.stable_index == before:
                        # Nothing new it may count (a follower's entries
                        # synced before its Ready was advanced are its own
                        # driver's to report).
                        break
                    self._advanced()
                    self._carry_out()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._fail(exc)

    def _send_now(self, rd: Ready) -> None:
        """Step 2 of the contract: `messages` may leave before the write."""
        # A CONFIG entry takes effect when appended: the transport must know
        # a new member before this Ready's appends to it leave.
        self._sync_peers()
        if rd.messages:
            messages: Sequence[Message] = rd.messages
            for first in messages:
                if isinstance(first, InstallSnapshot):
                    # Not sent as is: its files go first (see _begin_transfer).
                    for msg in messages:
                        if isinstance(msg, InstallSnapshot):
                            self._begin_transfer(msg)
                    messages = [m for m in messages if not isinstance(m, InstallSnapshot)]
                    break
            self._transport.send(messages)

    def _write(self, rd: Ready, sync_in_place: bool = False,
               reported: bool = False) -> list[Awaitable[Any]]:
        """Step 1: write the entries and the hard state; what must be awaited
        before `messages_after_persist` leave (fsync of the entries under
        flush="sync", unless the caller syncs them in place or has their
        fsync `reported` to the core, and a new term or vote always)."""
        waits: list[Awaitable[Any]] = []
        if rd.entries:
            # Only entries above the last commit handed out may be replaced.
            started = self._clock()
            self.storage.write(rd.entries, self._hs_latest.commit)
            self._observer.appended(self._clock() - started, len(rd.entries))
            self.counters.entries_written += len(rd.entries)
            if not sync_in_place:
                self._flusher.appended()
            if rd.must_sync and self.config.flush == "sync" and not (sync_in_place or reported):
                waits.append(self._flusher.wait_durable(rd.entries[-1].index, self.log.generation))
        if rd.hard_state is not None:
            hs = rd.hard_state
            term_or_vote = (hs.term, hs.vote) != (self._hs_latest.term, self._hs_latest.vote)
            self._hs_latest = hs
            if term_or_vote:
                # Always durable, whatever `flush` says: a forgotten vote or
                # term lets a node vote twice in one term.
                waits.append(self._save_hard_state())
        return waits

    def _finish(self, rd: Ready) -> None:
        """Steps 3 and 4, once step 1 is durable: acknowledgements, apply,
        then the soft state."""
        self._sync_peers()
        if rd.messages_after_persist:
            for msg in rd.messages_after_persist:
                if isinstance(msg, AppendResponse) and msg.success:
                    self.counters.acks_sent += 1
                    if self.log.durable_index < msg.index:
                        self.counters.acks_not_durable += 1
            self._transport.send(rd.messages_after_persist)
        if rd.committed_entries:
            # As inside a pass, also in the driver's round (which runs the
            # completions next): the apply's rest waits for them.
            self._depth += 1
            try:
                self._apply(rd)
            finally:
                self._depth -= 1
        if rd.soft_state is not None:
            self._soft_state_changed(rd.soft_state)

    def _apply(self, rd: Ready) -> None:
        batch = self._apply_batch
        last = batch[-1].index if batch else self._applied
        out = [commitlog.Entry(e.index, e.term, e.kind, e.position, e.data)
               for e in rd.committed_entries if e.index > last]
        if out and self.config.flush == "sync" and out[-1].index > self.log.durable_index:
            # A leader's (RaftNode rule 3): durable on a quorum of the others.
            self.counters.applied_before_fsync += (
                out[-1].index - max(self.log.durable_index, out[0].index - 1))
        if out:
            delay = self.config.follower_apply_delay_ms
            core = self._core
            if delay and core is not None and core.role is Role.FOLLOWER:
                batch.extend(out)
                if len(batch) >= FOLLOWER_APPLY_BATCH_MAX:
                    self._hand_over_batch()
                elif self._apply_timer is None:
                    self._apply_timer = asyncio.get_running_loop().call_later(
                        delay / 1000, self._apply_batch_due)
            else:
                self._hand_over_batch()
                self._hand_over(out)
        if not self._pending:
            return
        for e in rd.committed_entries:
            p = self._pending.pop(e.index, None)
            if p is None or p.done:
                continue
            if e.term == p.term:
                self.counters.proposals_acked += 1
                self._complete(p, p.entry, None)
            else:
                self.counters.proposals_unknown += 1
                self._complete(p, None, ProposalUnknown(
                    f"entry {e.index} of term {p.term} was replaced by term {e.term}",
                    e.index, p.term))

    def _hand_over(self, entries: list[commitlog.Entry]) -> None:
        self._run_apply_rest()  # the previous apply's, before this one
        rest = self._apply_cb(entries)
        self._applied = entries[-1].index
        self._applied_term = entries[-1].term
        if rest is not None:
            # Inside a pass (from `_finish`, or a role change there): after
            # the completions its outermost caller runs next; otherwise (a
            # follower's batch timer, a stop, an install) at once.
            self._apply_rest = rest
            if not self._depth:
                self._run_apply_rest()

    def _hand_over_batch(self) -> None:
        """Give the state machine a follower's batch of committed entries
        now (before anything applied after them, a role change, an install
        or a stop)."""
        if self._apply_timer is not None:
            self._apply_timer.cancel()
            self._apply_timer = None
        if self._apply_batch:
            batch, self._apply_batch = self._apply_batch, []
            self._hand_over(batch)

    def _apply_batch_due(self) -> None:
        self._apply_timer = None
        if self.failed is not None or not self._apply_batch:
            return
        try:
            self._hand_over_batch()
        except Exception as exc:
            self._fail(exc)
            return
        self._notify_state()

    def _ack_stable(self) -> None:
        """replicate=async: complete proposals the leader has persisted locally."""
        core = self._require_core()
        stable = core.stable_index
        for index in list(self._pending):
            if index > stable:
                break
            p = self._pending.pop(index)
            if p.done:
                continue
            if core.log.term_or_none(index) == p.term:
                self.counters.proposals_acked += 1
                self._complete(p, p.entry, None)
            else:
                self.counters.proposals_unknown += 1
                self._complete(p, None, ProposalUnknown(f"entry {index} was replaced", index,
                                                        p.term))

    def _soft_state_changed(self, ss: SoftState) -> None:
        old = self._soft
        self._soft = ss
        if ss.role is Role.CANDIDATE and (old.role is not Role.CANDIDATE or old.term != ss.term):
            self.counters.elections += 1
        if ss.leader_id and (ss.leader_id, ss.term) != (old.leader_id, old.term):
            self.counters.leader_changes += 1
        if ss.role is not Role.FOLLOWER:
            self._hand_over_batch()
        if ss.role is not Role.LEADER:
            self._fail_proposals(f"node {self.config.node_id} lost leadership (term {ss.term})")
            self._drop_transfers()
        log.info("raft %s/%d: %s term %d leader %d", self.config.group, self.config.node_id,
                 ROLE_NAMES[ss.role], ss.term, ss.leader_id)
        if self._on_soft_state is not None:
            try:
                self._on_soft_state(SoftStateInfo(ROLE_NAMES[ss.role], ss.leader_id, ss.term))
            except Exception:
                log.exception("on_soft_state callback failed")

    async def _save_hard_state(self) -> None:
        """Durably write the latest hard state handed out by the core.

        Serialised, and always the *latest* value read under the lock: a lazy
        commit-only save that started earlier must never overwrite a newer
        term or vote written meanwhile. The commit index saved never exceeds
        what the log has fsynced: a restart replays up to it, so it must not
        name entries a power cut could take back.
        """
        async with self._hs_lock:
            latest = self._hs_latest
            hs = HardState(latest.term, latest.vote, min(latest.commit, self.log.durable_index))
            if hs.commit < self._hs_saved.commit and (hs.term, hs.vote) == (
                    self._hs_saved.term, self._hs_saved.vote):
                return  # never lower a saved commit (the log was cut above it)
            if hs == self._hs_saved:
                return
            state = commitlog.HardState(hs.term, hs.vote, hs.commit)
            await self._state_worker.submit(self.log.save_hard_state, state)
            self._hs_saved = hs
            self.counters.hard_state_saves += 1

    async def _save_in_background(self) -> None:
        try:
            await self._save_hard_state()
        except Exception as exc:  # a full or broken disk: fail loudly, never silently
            self._fail(exc)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    def _fail(self, exc: BaseException) -> None:
        """A storage error (or a bug) in the Ready path or the Flusher, or lost
        committed data: this replica stops taking part (no ticks, no peers, no
        proposals) and says why in `failed`, `status()` and the broker's
        health; the others elect a leader without it. Restart to recover."""
        if self.failed is not None:
            return
        self.failed = exc
        log.error("raft %s/%d: node failed: %r", self.config.group, self.config.node_id, exc,
                  exc_info=exc)
        self._fail_proposals(f"node failed: {exc!r}")
        self._run_completions()
        if self._ticker_task is not None:
            self._ticker_task.cancel()
        self._spawn(self._transport.close())
        self._notify_state()
        if self._on_failure is not None:
            try:
                self._on_failure(exc)
            except Exception:
                log.exception("on_failure callback failed")

    # -------------------------------------------------------- snapshot transfer

    def _refusal(self, reason: str) -> None:
        refused = self._receiver.refused
        refused[reason] = refused.get(reason, 0) + 1

    def _begin_transfer(self, msg: InstallSnapshot) -> None:
        """Leader: the core wants `msg.dst` to install a snapshot; stream its
        files first. One transfer per follower: while one runs, the core's
        repeated InstallSnapshot (its snapshot timeout) changes nothing."""
        current = self._senders.get(msg.dst)
        if current is not None:
            if current.term == msg.term:
                return
            self._end_transfer(current, ok=False, report=False)
        log_ = self.log
        try:
            info = self._snapshot_at(msg.index)
            if info is None or (info.term, info.end_position) != (msg.snap_term,
                                                                  msg.end_position):
                raise SourceUnavailable(f"no snapshot ({msg.index}, {msg.snap_term}) on disk")
            if not (log_.first_index <= msg.index <= log_.last_index
                    and log_.term_at(msg.index) == msg.snap_term
                    and log_.entry_end(msg.index) == msg.end_position):
                raise SourceUnavailable(
                    f"the log ({log_.first_index}..{log_.last_index}) does not hold the "
                    f"snapshot's entry {msg.index} of term {msg.snap_term}")
            sources = open_sources(info.state_path, log_.segments.directory,
                                   log_.segments.bases, log_.config.segment_size_bytes,
                                   msg.end_position)
        except (SourceUnavailable, OSError, StorageError) as exc:
            self.counters.install_failures += 1
            log.error("raft %s/%d: cannot send snapshot %d to node %d: %s", self.config.group,
                      self.config.node_id, msg.index, msg.dst, exc)
            self._require_core().report_snapshot(msg.dst, False)
            return
        cfg = self.config
        sender = SnapshotSender(
            cfg.node_id, msg.dst, msg.term, next(self._transfer_ids), msg.index, msg.snap_term,
            msg.end_position, log_.first_index, info.state_crc, sources, self._clock(),
            chunk_bytes=cfg.snapshot_chunk_bytes, window_bytes=cfg.snapshot_window_bytes,
            stall_s=cfg.snapshot_stall_s, retransmit_s=min(2.0, cfg.snapshot_stall_s / 4))
        self._senders[msg.dst] = sender
        self._transfer_membership[msg.dst] = msg.membership
        log.info("raft %s/%d: sending snapshot %d (%d bytes, log from %d) to node %d",
                 cfg.group, cfg.node_id, msg.index, sender.total, log_.first_index, msg.dst)
        self._transport.send([sender.start()])

    def _snapshot_at(self, index: int) -> SnapshotInfo | None:
        info = self.storage.snapshot_info
        if info is not None and info.index == index:
            return info
        return next((i for i in list_snapshots(self.config.data_dir) if i.index == index), None)

    def _poll_transfers(self) -> None:
        core = self._require_core()
        now = self._clock()
        for sender in list(self._senders.values()):
            if core.role is not Role.LEADER or core.term != sender.term:
                self._end_transfer(sender, ok=False, report=False)
                continue
            self._sender_step(sender, functools.partial(sender.poll, now))

    def _sender_step(self, sender: SnapshotSender,
                     step: Callable[[], list[Message]]) -> None:
        """Run one step of a sender; send what it gives; finish it when done or failed."""
        try:
            out = step()
        except (SourceUnavailable, OSError) as exc:
            sender.failed = f"reading the snapshot's files failed: {exc}"
            out = []
        if out:
            self._transport.send(out)
        if sender.failed is not None:
            log.warning("raft %s/%d: snapshot %d to node %d abandoned: %s", self.config.group,
                        self.config.node_id, sender.index, sender.dst, sender.failed)
            self._end_transfer(sender, ok=False)
        elif sender.done:
            core = self._require_core()
            if core.role is Role.LEADER and core.term == sender.term:
                self._transport.send([InstallSnapshot(
                    self.config.node_id, sender.dst, core.term, sender.index,
                    sender.snap_term, sender.end_position,
                    self._transfer_membership.get(sender.dst))])
                self.counters.installs_sent += 1
                self.counters.transfer_seconds += self._clock() - sender.started_at
                log.info("raft %s/%d: snapshot %d streamed to node %d (%d bytes, %d resent)",
                         self.config.group, self.config.node_id, sender.index, sender.dst,
                         sender.total - sender.resumed_from, sender.resends)
            self._end_transfer(sender, ok=True)

    def _end_transfer(self, sender: SnapshotSender, ok: bool, report: bool = True) -> None:
        sender.close()
        if self._senders.get(sender.dst) is sender:
            del self._senders[sender.dst]
            self._transfer_membership.pop(sender.dst, None)
        self.counters.install_bytes_sent += sender.bytes_sent
        core = self._core
        if not report or core is None:
            return
        if not ok:
            self.counters.install_failures += 1
        # ok: the InstallSnapshot went out; the follower's answer, or a probe
        # after it, resumes replication past the snapshot.
        core.report_snapshot(sender.dst, ok)
        self._wake.set()

    def _drop_transfers(self) -> None:
        for sender in list(self._senders.values()):
            self._end_transfer(sender, ok=False, report=False)

    def _on_transfer(self, msg: SnapshotOffer | SnapshotChunk | SnapshotAck) -> None:
        """A transfer message from a peer: acks to our senders, offers and
        chunks to our receiver."""
        if isinstance(msg, SnapshotAck):
            sender = self._senders.get(msg.src)
            if sender is not None and msg.term == sender.term:
                now = self._clock()
                self._sender_step(sender, functools.partial(sender.on_ack, msg, now))
            return
        core = self._require_core()
        if msg.term < core.term or self.install_pending:
            # From a deposed leader; or an install is running or about to
            # (the core restored a snapshot whose staged files the driver
            # has yet to install: a new offer, or a failing write of one,
            # would discard them). The sender retransmits once it is over.
            return
        receiver = self._receiver
        ack: SnapshotAck | None
        if isinstance(msg, SnapshotOffer) and self._holds(msg.index, msg.snap_term):
            # Already covered (an answer to an earlier install was lost):
            # nothing to stage, the InstallSnapshot will be acked at once.
            ack = SnapshotAck(msg.dst, msg.src, msg.term, msg.transfer, msg.index, msg.total,
                              True)
        else:
            before = receiver.bytes_received
            try:
                ack = receiver.on_offer(msg) if isinstance(msg, SnapshotOffer) \
                    else receiver.on_chunk(msg)
            except OSError as exc:
                # A full or failing disk: this transfer cannot be staged.
                log.error("raft %s/%d: staging a snapshot failed: %r", self.config.group,
                          self.config.node_id, exc)
                with contextlib.suppress(OSError):
                    receiver.discard()
                self._refusal("disk_error")
                ack = SnapshotAck(msg.dst, msg.src, msg.term, msg.transfer, msg.index, 0, False,
                                  f"staging failed: {exc}"[:REASON_MAX])
            self.counters.install_bytes_received += receiver.bytes_received - before
        if ack is not None:
            self._transport.send([ack])

    def _holds(self, index: int, term: int) -> bool:
        core = self._require_core()
        return index <= core.commit or core.log.term_or_none(index) == term

    def _may_install(self, msg: InstallSnapshot) -> bool:
        """Step this InstallSnapshot into the core? Only if the core will not
        restore it (stale, or the log holds it) or its files are staged."""
        core = self._require_core()
        if msg.term < core.term or self._holds(msg.index, msg.snap_term):
            return True
        return not self._installing and self._receiver.staged(
            msg.index, msg.snap_term, msg.end_position) is not None

    async def _install_snapshot(self, rd: Ready) -> None:
        """Follower: the core restored a leader's snapshot; make the disk match.

        Order (crash-safe, see finish_interrupted_install): the staged files
        are fsynced and their manifest written; the log is replaced (the
        CommitLog's own INSTALL marker rolls a cut-short install back or
        forward); the state file is adopted as the newest snapshot; the
        commit index is saved. A power cut between the last two finds the
        manifest and adopts the state at the next start.
        """
        meta = rd.snapshot
        assert meta is not None
        # The state machine takes what it was owed before it is reset.
        self._hand_over_batch()
        started = self._clock()
        staged = self._receiver.staged(meta.index, meta.term, meta.end_position)
        invariant(staged is not None, f"the core restored snapshot {meta} but its files are "
                                      "not staged")
        assert staged is not None
        membership = encode_membership(meta.membership) if meta.membership else None
        self._installing = True
        try:
            await self._state_worker.submit(
                functools.partial(self._receiver.seal, membership=membership), staged)
            self.log.install(staged.commitlog_dir, staged.first_index, meta.index, meta.term,
                             meta.end_position)
            self.storage.reset()
            info = adopt_snapshot(self.config.data_dir, staged.state_path, meta.index,
                                  meta.term, meta.end_position, membership=membership)
            self._receiver.forget()
            remove_staging(self.config.data_dir)
            self.storage.note_snapshot(info)
            hs = rd.hard_state or self._hs_latest
            self._hs_latest = HardState(hs.term, hs.vote, max(hs.commit, meta.index))
            await self._save_hard_state()
            self._applied = meta.index
            self._applied_term = meta.term
            self.counters.installs_received += 1
            self.counters.install_seconds += self._clock() - started
            log.info("raft %s/%d: installed snapshot %d (term %d): log %d..%d, %d bytes",
                     self.config.group, self.config.node_id, meta.index, meta.term,
                     self.log.first_index, self.log.last_index, staged.total)
            if self._on_install is not None:
                # Not caught: a state machine that cannot reset leaves this
                # replica unusable, and the driver fails it (restart to recover).
                self._on_install(info)
            self._installed = meta
        finally:
            self._installing = False

    # ---------------------------------------------------------------- waiting

    def _notify_state(self) -> None:
        waiters, self._state_waiters = self._state_waiters, []
        for future in waiters:
            if not future.done():
                future.set_result(None)

    async def _wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate():
            remaining = deadline - loop.time()
            if remaining <= 0 or self._stopped:
                return predicate()
            future: asyncio.Future[None] = loop.create_future()
            self._state_waiters.append(future)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await future
        return True


def _settle(future: asyncio.Future[commitlog.Entry], entry: commitlog.Entry | None,
            error: BaseException | None) -> None:
    """`propose_nowait`'s completion: the outcome into its future."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        assert entry is not None
        future.set_result(entry)
