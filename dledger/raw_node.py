"""`RaftNode`: election (from `election`) and log replication as one synchronous state machine.

Theory of operation
-------------------
Inputs: `tick()`, `step(message)`, `propose(kind, data)`, `campaign()`,
`transfer_leadership(to)`, `leader_unreachable(leader_id)`. They only change
memory and queue messages.
Outputs: `ready()` returns a `Ready` (see `dledger.ready` for the contract:
persist, then send `messages_after_persist`, apply `committed_entries`), and
`advance(ready)` tells the node the driver did all of it.

Rules
-----
1. Messages are classified when a Ready is built: while term or vote differ
   from the last hard state handed out, *every* message waits for the persist
   (nothing leaves in a term that is not yet on disk); acknowledgements of
   entries and granted votes always wait for the persist.
2. The leader counts itself in the commit quorum only for entries the driver
   reported durable (`stable_index`), and commits only an index whose entry
   has the current term (Raft §5.4.2). A new leader appends a NOOP so that
   earlier entries commit without waiting for a client write.
3. Committed entries are handed out only when also durable locally, so every
   applied entry survives a crash of this node; except on a leader, whose
   commit is durable on a quorum without it (rule 2): its clients need not
   wait for its own fsync, and after its crash the entries survive on that
   quorum. A leader's driver may therefore advance a Ready before its fsync
   ends (`advance(ready, durable=False)`, then `durable_to`), so that the
   next Ready's appends and answers do not queue behind its own disk.
4. The leader assigns each new entry's CommitLog position with the injected
   placement rule; followers check it (`RaftLog.append`).
5. Snapshots: when the entries (or the previous term) a follower needs are
   no longer in the leader's storage (`LogUnavailable`), the leader sends
   `InstallSnapshot` for `storage.snapshot()` and pauses that follower
   (Progress SNAPSHOT) until it acknowledges at or past the snapshot, the
   attempt times out (`snapshot_timeout_ticks`) or the driver reports it
   failed (`report_snapshot`). A follower whose commit already covers the
   snapshot acknowledges its commit; one whose log holds (index, term)
   commits to it; any other restores it (`RaftLog.restore`: commit = applied
   = index), hands it to the driver in `Ready.snapshot` and acknowledges only
   once it is durable.
6. A commit index that moves is not broadcast by itself: followers learn it
   from the next append (which the next proposal sends at once) or, on an
   idle group, from the next heartbeat (`min(commit, match)`, every
   heartbeat interval). The leader answers its clients from its own
   commit; a commit-only append per commit, with its acknowledgement,
   doubled the messages and the followers' Ready rounds per request when
   requests come one at a time.
7. Membership (`dledger.membership`, docs/raft.md "Membership changes"): the
   configuration in effect is the last CONFIG entry of the log (effective
   once appended, undone when truncated), else the snapshot's, else the
   bootstrap one (`Config.membership` or `Config.voters`). Votes, commit and
   check-quorum count voters only, each only while it answers from the data
   directory it is pinned to; learners are replicated to, never counted.
   `propose_membership` accepts single-server changes, one in flight, from a
   leader that has committed an entry of its term, never removing itself.
   A leader pins the unpinned members it has heard from, with one CONFIG
   entry at a time (its first entry of a term, instead of the NOOP, when it
   can): every log of a group that tracks identity starts with pins of a
   quorum (the leader and the voters that elected it). Once a configuration
   pins a quorum of its voters, a candidate counts only the grants of pinned
   voters from their pinned directory (`election.VoteTally`), and no change
   may leave fewer than a quorum pinned. A node whose own configuration pins
   it to another directory (its disk was wiped) does not campaign. Votes are
   granted on term, vote and log alone: identity is the counting side's
   business, since the granting side may lag behind a rejoin (refusing
   there left groups without a leader in the simulator, seeds 30650 and
   32089 with membership changes on every seed; see docs/raft.md).
8. Reserves (`Config.reserve_batch_entries`): a commit needs the acks of only
   so many followers (a quorum less the leader). The voting followers with
   the highest match (counted as in rule 2) are sent each new entry at
   once; the others, the reserves, get new entries in batches: once that
   many wait (or `reserve_batch_bytes` of them), at every tick and after
   each heartbeat answer. A reserve whose acknowledgement moves the commit
   (the quick ones were slow or gone) is made quick at once; the choice
   is made again at every tick. Learners,
   the transferee and the preferred leader are never reserves. This only
   delays messages, which Raft allows any network to do, so safety does not
   rest on it; it saves a reserve one Ready round per request and the leader
   one acknowledgement to read, when requests come one at a time. Off
   (0) in the core's defaults, on in the runtime's.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from dledger.config import Config
from dledger.entry import (
    ENTRY_HEADER_BYTES,
    Entry,
    EntryKind,
    HardState,
    PlaceFunction,
    segment_placement,
)
from dledger.log import UNLIMITED, CommittedDivergence, InvariantViolation, RaftLog, invariant
from dledger.membership import (
    UNPINNED,
    ConfigHistory,
    Membership,
    MembershipError,
    decode,
    encode,
    pin,
    single_server_change,
)
from dledger.messages import (
    AppendRequest,
    AppendResponse,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    Message,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from dledger.progress import Progress, ProgressState
from dledger.quorum import quorum_index
from dledger.ready import Ready, SoftState
from dledger.storage import CONFIG_ENTRIES_HOOK, LogStorage, LogUnavailable, SnapshotMeta
from election.elector import Elector, RandomSource, TickAction
from election.roles import Role
from election.votes import VoteOutcome, strict_identity

__all__ = [
    "FollowerStatus",
    "MembershipChangeRefused",
    "NotLeader",
    "Proposed",
    "RaftNode",
    "Status",
]

# Entries read per call while scanning the stored log for CONFIG entries at start.
_SCAN_BYTES = 4 << 20


class NotLeader(Exception):
    """A proposal reached a node that cannot accept it; `leader_id` is a hint (0 = unknown)."""

    def __init__(self, leader_id: int) -> None:
        super().__init__(f"not leader; try {leader_id}" if leader_id else "not leader")
        self.leader_id = leader_id


class MembershipChangeRefused(Exception):
    """`propose_membership` refused a change; `reason` says which rule.
    `transient`: the refusal passes by itself (a change still committing,
    a learner catching up or not pinned yet, the leader's first commit of
    its term), so the same change may be asked again later."""

    def __init__(self, reason: str, *, transient: bool = False) -> None:
        super().__init__(f"membership change refused: {reason}")
        self.reason = reason
        self.transient = transient


@dataclass(frozen=True, slots=True)
class Proposed:
    """Where a proposal went: it is committed iff the committed entry at `index` has `term`.

    Unpacks as `index, term = node.propose(...)`. Not a NamedTuple: a field
    named `index` would shadow `tuple.index`.
    """

    index: int
    term: int

    def __iter__(self) -> Iterator[int]:
        return iter((self.index, self.term))


@dataclass(frozen=True, slots=True)
class FollowerStatus:
    match: int
    next: int
    state: str
    inflight: int
    # SNAPSHOT state: index of the snapshot sent (0 otherwise).
    pending_snapshot: int = 0
    # A learner of the configuration in effect (replicated, not counted).
    learner: bool = False
    # The data-directory id its last message came from (0: none heard).
    directory_id: int = 0
    # Pinned to another directory than the one it answers from: its disk was
    # wiped or replaced; repair = rejoin (as a learner), catch up, promote.
    identity_mismatch: bool = False
    # A reserve of this leader (rule 8): its new entries go in batches.
    reserve: bool = False


@dataclass(frozen=True, slots=True)
class Status:
    """Observability snapshot for the broker's status page and metrics."""

    node_id: int
    role: Role
    term: int
    vote: int
    leader_id: int
    commit_index: int
    applied_index: int
    last_index: int
    last_term: int
    stable_index: int
    progress: dict[int, FollowerStatus]
    # First index of the log still stored (1 until a prefix was deleted).
    first_index: int = 1
    # The configuration in effect, the index of its CONFIG entry (0: the
    # bootstrap one; a snapshot's index when it came with a snapshot) and
    # whether that entry is not committed yet.
    membership: Membership | None = None
    membership_index: int = 0
    membership_pending: bool = False


class RaftNode:
    """One Raft replica, sans I/O. Not thread-safe: the driver serialises calls."""

    def __init__(
        self,
        config: Config,
        storage: LogStorage,
        rng: RandomSource,
        place: PlaceFunction | None = None,
        applied: int = 0,
    ) -> None:
        hard_state = storage.initial_state()
        self.config = config
        self.id = config.node_id
        self.bugs = config.bugs
        self._dir = config.directory_id
        self._bootstrap = config.bootstrap_membership()
        self.configs = _configs_of(storage, self._bootstrap)
        base = self.configs.current[1]
        self.elector = Elector(
            config.node_id, base.voter_ids, config.election, rng, hard_state.term,
            hard_state.vote, directory_id=self._dir,
        )
        self.log = RaftLog(storage, place or segment_placement())
        # Invariant: applied <= commit <= last_index. The stored commit is a
        # lower bound written lazily, so it can only be too low, never too high
        # unless the log lost durable entries (clamped defensively). Entries
        # below the first stored index are committed and applied by the
        # storage contract (only applied entries are ever deleted).
        floor = self.log.first_index() - 1
        self.commit = max(min(hard_state.commit, self.log.last_index), floor)
        self.applied = min(max(applied, floor), self.commit)
        # Highest index the driver reported durable (and still in our log).
        self.stable_index = self.log.last_index
        # Leader only: one Progress per peer; the voting followers sent new
        # entries in batches (rule 8).
        self.progress: dict[int, Progress] = {}
        self._reserves: frozenset[int] = frozenset()
        self._reserves_chosen = False  # by this leader, since it was elected
        self._reserve_marks: dict[int, tuple[int, int]] = {}  # peer: (index, end position)
        self._outbox: list[Message] = []
        # Hard and soft state as of the last Ready handed out.
        self._last_hard_state = HardState(hard_state.term, hard_state.vote, self.commit)
        self._last_soft_state = SoftState(Role.FOLLOWER, 0, hard_state.term)
        self._in_flight: Ready | None = None
        # Counters for the simulator and metrics.
        self.elections_won = 0
        self.snapshots_sent = 0
        # Rule 8: appends with entries sent to reserves (their batches), and
        # how often the set of reserves changed after a leader's first choice.
        self.reserve_appends = 0
        self.reserve_changes = 0
        self.snapshots_restored = 0
        # The acknowledgement of a restored snapshot (bug injection sends it early).
        self._snapshot_ack: AppendResponse | None = None
        # Last data-directory id heard from each node (pins, identity checks).
        self._heard: dict[int, int] = {}
        # Leader: index of its first entry of this term (committed => it may
        # propose membership changes).
        self._term_start = 0
        # The configuration applied to the elector and the progress map, and
        # the voters with the directory each is pinned to (commit counting).
        self._membership: Membership = base
        self._membership_index = -1
        self._voter_pins: tuple[tuple[int, int], ...] = ()
        self._unpinned: frozenset[int] = frozenset()
        self._sync_membership()
        # Leader: the voters (node, pinned directory) its commit index was last
        # counted over (the simulator checks the claim against them).
        self.commit_voters: tuple[tuple[int, int], ...] = ()

    # ------------------------------------------------------------ observation

    @property
    def role(self) -> Role:
        return self.elector.role

    @property
    def term(self) -> int:
        return self.elector.term

    @property
    def leader_id(self) -> int:
        return self.elector.leader_id

    @property
    def directory_id(self) -> int:
        return self._dir

    @property
    def membership(self) -> Membership:
        """The configuration in effect (see rule 7)."""
        return self._membership

    @property
    def membership_index(self) -> int:
        """Index of the CONFIG entry in effect; 0 for the bootstrap configuration
        (the snapshot's index for one that came with a snapshot)."""
        return self._membership_index

    @property
    def membership_pending(self) -> bool:
        """The CONFIG entry in effect is not committed yet (the log's last
        CONFIG entry: they are the same but under the `config_on_commit` bug)."""
        return self.configs.current[0] > self.commit

    @property
    def committed_membership(self) -> Membership:
        """The configuration of the last CONFIG entry at or below the commit index."""
        return self.configs.at(self.commit)[1]

    def membership_at(self, index: int) -> Membership:
        """The configuration in effect at log index `index` (>= the log's first
        index - 1): what a snapshot taken at `index` must record."""
        return self.configs.at(index)[1]

    def status(self) -> Status:
        return Status(
            node_id=self.id,
            role=self.role,
            term=self.term,
            vote=self.elector.vote,
            leader_id=self.leader_id,
            commit_index=self.commit,
            applied_index=self.applied,
            last_index=self.log.last_index,
            last_term=self.log.last_term(),
            stable_index=self.stable_index,
            progress={
                peer: self._follower_status(peer, pr) for peer, pr in self.progress.items()
            },
            first_index=self.log.first_index(),
            membership=self._membership,
            membership_index=self._membership_index,
            membership_pending=self.membership_pending,
        )

    def _follower_status(self, peer: int, pr: Progress) -> FollowerStatus:
        member = self._membership.member(peer)
        heard = self._heard.get(peer, 0)
        pinned = member.directory_id if member is not None else UNPINNED
        return FollowerStatus(
            pr.match, pr.next, pr.state.name, len(pr.inflight), pr.pending_snapshot,
            learner=peer in self._membership.learner_ids,
            directory_id=heard,
            identity_mismatch=pinned != UNPINNED and heard != 0 and heard != pinned,
            reserve=peer in self._reserves,
        )

    # ----------------------------------------------------------------- inputs

    def tick(self) -> None:
        """One unit of logical time."""
        action = self.elector.tick()
        if action & TickAction.CAMPAIGN:
            if self._may_campaign():
                self.campaign()
            else:
                # A learner (or a node pinned elsewhere) heard no leader for an
                # election timeout: it cannot campaign, but its leader lease
                # is over, or it would ignore the candidates of newer terms
                # forever (and one of them may need its vote once promoted).
                self.elector.leader_id = 0
        if action & TickAction.STEPPED_DOWN:
            self.progress = {}
        if action & TickAction.HEARTBEAT:
            self._broadcast_heartbeat()
        if action & TickAction.LEADER_CHECK:
            self._check_preferred_leader()
        if self.role is Role.LEADER:
            self._tick_resend()
            if self.config.reserve_batch_entries:
                self._choose_reserves()
                for peer in self._reserves:
                    if peer in self.progress:
                        self._fill_window(peer, flush=True)

    def propose(self, kind: int, data: bytes) -> Proposed:
        """Append a client entry; raises `NotLeader` unless leading and not transferring."""
        if self.role is not Role.LEADER:
            raise NotLeader(self.leader_id)
        if self.elector.transferee:
            raise NotLeader(self.elector.transferee)
        _not_config(kind)
        entry = self._append_as_leader(kind, data)
        self._broadcast_append()
        return Proposed(entry.index, entry.term)

    def propose_many(self, items: list[tuple[int, bytes]]) -> list[Proposed]:
        """`propose` for a batch: all entries are appended before one broadcast,
        so a group commit of N proposals sends batched appends, not N small ones."""
        if self.role is not Role.LEADER:
            raise NotLeader(self.leader_id)
        if self.elector.transferee:
            raise NotLeader(self.elector.transferee)
        out = []
        for kind, _ in items:
            _not_config(kind)
        for kind, data in items:
            entry = self._append_as_leader(kind, data)
            out.append(Proposed(entry.index, entry.term))
        if out:
            self._broadcast_append()
        return out

    def propose_membership(self, new: Membership) -> Proposed:
        """Append a CONFIG entry holding `new`, the whole next configuration.

        Raises `NotLeader` (as `propose`), or `MembershipChangeRefused` when a
        change is pending, the leader has not committed an entry of its term,
        more than one voter would change, the leader would remove or demote
        itself, a voter is added other than by promoting a caught-up learner,
        a voter's pinned directory would change (that takes a rejoin), or
        `new` is the configuration in effect. The change takes effect here at
        once (rule 7); it is done once the entry commits.
        """
        if self.role is not Role.LEADER:
            raise NotLeader(self.leader_id)
        if self.elector.transferee:
            raise NotLeader(self.elector.transferee)
        refused = self._refuse_change(self._membership, new)
        if refused is not None:
            raise refused
        entry = self._append_as_leader(EntryKind.CONFIG, encode(new), new)
        self._broadcast_append()
        return Proposed(entry.index, entry.term)

    def campaign(self, transfer: bool = False) -> None:
        """Start an election now (pre-vote first unless disabled or a transfer).
        A node that is not a voter of its configuration (under its own data
        directory) never campaigns. A node that tracks identity and holds an
        empty log runs a pre-vote round even with pre-vote off: it cannot tell
        whether it is a member of a new group or a wiped one, so it asks
        before it raises its term (a wiped node raising terms again and again
        kept a group from electing a leader in the simulator, seed 32865)."""
        if self.role is Role.LEADER or not self._may_campaign():
            return
        if not (self.elector.config.pre_vote or self._asks_first()) or transfer:
            self._campaign_for_real(transfer)
            return
        self.elector.become_pre_candidate()
        if self.elector.tally is not None and self.elector.tally.outcome() is VoteOutcome.WON:
            self._won_round()  # single-node group
            return
        last_index, last_term = self.log.last_index, self.log.last_term()
        for peer in self.elector.peers:
            # Pre-vote asks for the term we *would* use; ours stays unchanged.
            self._outbox.append(
                VoteRequest(self.id, peer, self.term + 1, last_index, last_term, pre_vote=True,
                            directory_id=self._dir)
            )

    def _asks_first(self) -> bool:
        """Whether this node campaigns by pre-vote even with pre-vote off: it
        tracks identity and holds an empty log (see `campaign`)."""
        return bool(self._dir) and self.log.last_index == 0

    def leader_unreachable(self, leader_id: int) -> bool:
        """The driver saw every connection to and from `leader_id` close and
        stay closed for a short grace (its process is gone: the kernel closes
        a killed process's sockets at once). A voting follower of that leader
        ends its lease and campaigns within `ElectionConfig.lost_leader_ticks`
        ticks (`Elector.leader_lost`) instead of an election timeout. Returns
        whether it did; ignored by any other node, by a node that is not a
        voter, and without pre-vote and check-quorum. Nothing of safety rests
        on the notice being true: it only starts an election sooner, and
        pre-vote with the others' leases keeps a follower that alone lost its
        connections from deposing a healthy leader."""
        if not self._may_campaign():
            return False
        return self.elector.leader_lost(leader_id)

    def transfer_leadership(self, to: int) -> bool:
        """Hand leadership to `to` once it is caught up; proposals fail until done or aborted."""
        if self.role is not Role.LEADER or to == self.id or to not in self.progress:
            return False
        if to not in self.elector.voters:
            return False  # a learner cannot be elected
        self.elector.transferee = to
        self._reserves -= {to}
        pr = self.progress[to]
        if pr.match == self.log.last_index:
            self._outbox.append(TimeoutNow(self.id, to, self.term, directory_id=self._dir))
        else:
            self._send_append(to)
        return True

    def report_snapshot(self, peer: int, ok: bool) -> None:
        """The driver's word on the snapshot transfer to `peer` (leader only).

        ok=False: the transfer failed; `peer` goes back to PROBE and is sent a
        new snapshot once it answers a heartbeat. ok=True: the InstallSnapshot
        was delivered; replication resumes after the snapshot once `peer`
        acknowledges it (or answers a heartbeat). Ignored unless `peer` waits
        for a snapshot.
        """
        pr = self.progress.get(peer)
        if self.role is not Role.LEADER or pr is None or pr.state is not ProgressState.SNAPSHOT:
            return
        pending = pr.pending_snapshot
        pr.become_probe()
        if ok:
            pr.next = max(pr.next, pending + 1)
        # Wait for a sign of life (an answer or a heartbeat response) before the
        # next attempt: an immediate retry would spin on a follower that is down.
        pr.probe_sent = True

    def step(self, msg: Message) -> None:
        """Feed one incoming message."""
        # The hot methods (step, has_ready, ready, advance) read the elector's
        # fields directly and raise their invariants inline: they run a few
        # times per message, where every call and formatted message counts.
        if msg.dst != self.id:
            raise InvariantViolation(f"message for {msg.dst} stepped into {self.id}")
        if msg.directory_id:
            self._heard[msg.src] = msg.directory_id
        process, reply = self.elector.filter_term(msg)
        if not process and reply is None and msg.from_leader and msg.term < self.elector.term \
                and self._asks_first():
            # A stale leader's message is answered with our term only with
            # pre-vote or check-quorum on; without them the elector leaves it
            # to our next campaign, which carries our term. A node that asks
            # first (an empty log: a wiped one) campaigns by pre-vote, whose
            # term nobody adopts: unanswered, a leader below our term never
            # learns of it and we never take its appends (the simulator,
            # seed 18503113, pre-vote and check-quorum off: a wiped learner
            # whose term a removed node's campaign had raised, stuck).
            reply = HeartbeatResponse(self.id, msg.src, self.elector.term,
                                      directory_id=self._dir)
        if reply is not None:
            self._outbox.append(reply)
        if self.elector.role is not Role.LEADER:
            self.progress = {}
        if not process:
            return
        match msg:
            case AppendRequest():
                self._handle_append(msg)
            case AppendResponse():
                self._handle_append_response(msg)
            case InstallSnapshot():
                self._handle_install_snapshot(msg)
            case Heartbeat():
                self._handle_heartbeat(msg)
            case HeartbeatResponse():
                self._handle_heartbeat_response(msg)
            case VoteRequest():
                self._handle_vote_request(msg)
            case VoteResponse():
                self._handle_vote_response(msg)
            case TimeoutNow():
                if self.role is not Role.LEADER:
                    self.campaign(transfer=True)
            case _:
                raise TypeError(f"unknown message type {type(msg).__name__}")

    # ---------------------------------------------------------------- outputs

    def has_ready(self) -> bool:
        if self._in_flight is not None:
            return False
        # Field by field: called a few times per message, so it builds no
        # HardState or SoftState to compare (ready() does, once).
        hard, soft, elector, log = (self._last_hard_state, self._last_soft_state,
                                    self.elector, self.log)
        return bool(
            self._outbox
            or log.in_progress < log.last_index  # log.has_unpersisted()
            or self.commit != hard.commit
            or elector.term != hard.term
            or elector.vote != hard.vote
            or elector.role is not soft.role
            or elector.leader_id != soft.leader_id
            or elector.term != soft.term
            # The limit never passes the commit: most passes skip the call.
            or (self.applied < self.commit and self.applied < self._apply_limit())
            or (log.unstable_snapshot is not None and log.has_unpersisted_snapshot())
        )

    def ready(self) -> Ready:
        """Collect pending work; call `advance` with it once it is done."""
        if self._in_flight is not None:
            raise InvariantViolation("ready() called before advance() of the previous Ready")
        elector, last, last_soft = self.elector, self._last_hard_state, self._last_soft_state
        term = elector.term
        term_or_vote_changed = term != last.term or elector.vote != last.vote
        # The states are built only when they changed (most Readies carry
        # neither: a Ready per request, these only at a commit or an election).
        hard = (last if not term_or_vote_changed and self.commit == last.commit
                else self._hard_state())
        soft = (last_soft if (elector.role is last_soft.role and elector.leader_id
                              == last_soft.leader_id and term == last_soft.term)
                else self._soft_state())
        snapshot = self.log.take_snapshot()
        entries = self.log.take_unpersisted()
        now: list[Message] = []
        after: list[Message] = []
        for msg in self._outbox:
            if type(msg) is AppendRequest:  # a leader's, the most frequent: no case applies
                (after if term_or_vote_changed else now).append(msg)
                continue
            match msg:
                case AppendResponse() if msg.success and msg.term != term:
                    # Acked before a newer leader may have cut those entries
                    # (the ack waited behind a slow fsync): drop, never mislead.
                    continue
                case AppendResponse() if msg is self._snapshot_ack:
                    wait = not self.bugs.ack_snapshot_before_persist
                case AppendResponse():
                    wait = not self.bugs.ack_before_persist
                case VoteResponse() if msg.granted and not msg.pre_vote:
                    wait = not self.bugs.vote_before_persist
                case _:
                    wait = term_or_vote_changed
            (after if wait else now).append(msg)
        self._outbox = []
        self._snapshot_ack = None
        limit = self._apply_limit()
        committed = (tuple(self.log.entries(self.applied + 1, limit + 1, UNLIMITED, UNLIMITED))
                     if limit > self.applied else ())
        ready = Ready(
            hard_state=hard if hard is not last else None,
            must_sync=term_or_vote_changed or bool(entries) or snapshot is not None,
            entries=entries,
            messages=tuple(now),
            messages_after_persist=tuple(after),
            committed_entries=committed,
            soft_state=soft if soft is not last_soft else None,
            snapshot=snapshot,
        )
        self._last_hard_state = hard
        self._last_soft_state = soft
        self._in_flight = ready
        return ready

    def advance(self, ready: Ready, durable: bool = True) -> None:
        """The driver persisted, sent and applied everything in `ready`.

        `durable=False`: its entries are written but their fsync still runs
        (a leader's Ready under flush=sync whose only wait was that fsync,
        and which had no `messages_after_persist`): the driver reports the
        fsync's end with `durable_to`, and until then this node does not
        count them toward a commit (rule 2). The next Ready may go out
        meanwhile, so the leader's appends and answers do not queue behind
        its own disk."""
        if ready is not self._in_flight:
            raise InvariantViolation("advance() with a Ready this node did not hand out")
        self._in_flight = None
        if ready.snapshot is not None and self.log.snapshot_persisted(ready.snapshot):
            self.stable_index = max(self.stable_index, ready.snapshot.index)
        if ready.entries:
            last = ready.entries[-1]
            if self.log.stable_to(last.index, last.term) and durable:
                self.stable_index = max(self.stable_index, last.index)
        if ready.committed_entries:
            # max: a snapshot restored while this Ready was out moved applied past it.
            self.applied = max(self.applied, ready.committed_entries[-1].index)
        if self.elector.role is Role.LEADER and self._maybe_commit():  # told as rule 6 says
            self._after_commit()

    def durable_to(self, index: int) -> None:
        """The storage made the current log durable up to `index` (an fsync
        of entries advanced with `durable=False` ended; the driver reads the
        index from its storage, which drops what a truncation cut). Counted
        only over entries already advanced (written)."""
        index = min(index, self.log.offset - 1)
        if index <= self.stable_index:
            return
        self.stable_index = index
        if self.elector.role is Role.LEADER and self._maybe_commit():
            self._after_commit()

    # -------------------------------------------------------------- internals

    def _hard_state(self) -> HardState:
        elector = self.elector
        return HardState(elector.term, elector.vote, self.commit)

    def _soft_state(self) -> SoftState:
        elector = self.elector
        return SoftState(elector.role, elector.leader_id, elector.term)

    def _apply_limit(self) -> int:
        if self.bugs.apply_before_commit:
            return self.stable_index
        if self.elector.role is Role.LEADER:
            # Rule 3's exception: a leader's commit counts itself only for
            # what it synced (rule 2), so a committed entry is durable on a
            # quorum even when this node's own fsync of it still runs.
            return self.commit
        return min(self.commit, self.stable_index)

    def _append_as_leader(self, kind: int, data: bytes,
                          membership: Membership | None = None) -> Entry:
        size = ENTRY_HEADER_BYTES + len(data)
        entry = Entry(self.log.last_index + 1, self.term, kind, data, self.log.next_position(size))
        self.log.append([entry], self.commit)
        if kind == EntryKind.CONFIG:
            self.configs.add(entry.index, membership or decode(entry.data))
            self._sync_membership()
        return entry

    def _append_log(self, entries: tuple[Entry, ...]) -> None:
        """Follower: append (maybe replacing a suffix) and track the configurations."""
        self.log.append(entries, self.commit)
        changed = self.configs.truncate_from(entries[0].index)
        for entry in entries:
            if entry.kind == EntryKind.CONFIG:
                self.configs.add(entry.index, _decode(entry))
                changed = True
        if changed:
            self.configs.prune(self.log.first_index() - 1)
            self._sync_membership()

    # -- membership

    def _sync_membership(self) -> None:
        """Make the elector and the progress map follow the configuration in effect."""
        if self.bugs.config_on_commit:
            index, membership = self.configs.at(self.commit)
        else:
            index, membership = self.configs.current
        if membership is self._membership and index == self._membership_index:
            return
        self._membership, self._membership_index = membership, index
        pinned = {} if self.bugs.ignore_directory_id else {
            m.node_id: m.directory_id for m in membership.voters + membership.learners}
        self.elector.configure(membership.voter_ids, pinned)
        self._voter_pins = tuple((m.node_id, m.directory_id) for m in membership.voters)
        self._unpinned = frozenset(membership.unpinned())
        # A node that left the configuration forgets its directory: the same
        # id added again later is a new machine, to be pinned to what it
        # answers from then, not to its previous life's directory.
        for gone in set(self._heard) - membership.node_ids:
            del self._heard[gone]
        if self.role is Role.LEADER:
            members = membership.node_ids - {self.id}
            for gone in set(self.progress) - members:
                del self.progress[gone]
            for new in members - set(self.progress):
                self.progress[new] = Progress(self.log.last_index + 1, self.config.inflight_max)
            if self.elector.transferee not in membership.voter_ids:
                self.elector.transferee = 0

    def _may_campaign(self) -> bool:
        return self.elector.is_voter()

    def _refuse_change(self, current: Membership,
                       new: Membership) -> MembershipChangeRefused | None:
        """Why `new` may not follow `current` now, or None."""
        refused = MembershipChangeRefused
        if self.commit < self._term_start:
            return refused("the leader has not committed an entry of its term yet",
                           transient=True)
        if self.membership_pending and not self.bugs.two_changes_at_once:
            return refused(f"a configuration change is pending (entry "
                           f"{self.configs.current[0]}, commit {self.commit})", transient=True)
        if new == current:
            return refused("the new configuration equals the current one")
        if not single_server_change(current, new):
            return refused("more than one voter would change (single-server changes only)")
        if self.id in current.voter_ids and self.id not in new.voter_ids:
            return refused("the leader cannot remove or demote itself: transfer leadership "
                           "first, then remove it from the new leader")
        for node_id in sorted(new.voter_ids - current.voter_ids):
            if node_id not in current.learner_ids:
                return refused(f"node {node_id} must join as a learner first")
            learner = current.member(node_id)
            voter = new.member(node_id)
            assert learner is not None and voter is not None
            if learner.directory_id not in (UNPINNED, voter.directory_id):
                return refused(f"node {node_id} would change its directory while promoted")
            pr = self.progress.get(node_id)
            match = pr.match if pr is not None else 0
            if self.commit - match > self.config.promote_lag_max:
                return refused(f"learner {node_id} has not caught up (match {match}, "
                               f"commit {self.commit})", transient=True)
            if self._dir and voter.directory_id == UNPINNED:
                # Its votes would not count (election.VoteTally) until pinned,
                # which the leader does as soon as it hears from it.
                return refused(f"learner {node_id} is not pinned yet", transient=True)
            heard = self._heard.get(node_id, 0)
            if voter.directory_id not in (UNPINNED, heard):
                return refused(f"learner {node_id} answers from directory {heard}, "
                               f"not {voter.directory_id}")
        if self._dir and _strict(current) and not _strict(new):
            return refused("fewer than a quorum of the new voters would be pinned (votes would "
                           "not count): remove unpinned voters first, or wait for them to be"
                           " pinned")
        for node_id in sorted(new.voter_ids & current.voter_ids):
            old_dir = current.member(node_id).directory_id  # type: ignore[union-attr]
            new_dir = new.member(node_id).directory_id  # type: ignore[union-attr]
            if old_dir not in (UNPINNED, new_dir):
                return refused(f"voter {node_id}'s directory can change only through a rejoin "
                               "(as a learner)")
        return None

    def _pins_due(self) -> Membership | None:
        """The configuration with every unpinned member we heard from pinned, or None."""
        current = self._membership
        new = current
        for node_id in current.unpinned():
            heard = self._dir if node_id == self.id else self._heard.get(node_id, 0)
            if heard:
                new = pin(new, node_id, heard)
        return None if new is current else new

    def _maybe_pin(self) -> None:
        """Leader: pin the unpinned members it has heard from (one entry at a time)."""
        if (not self._dir or self.elector.transferee or self.commit < self._term_start
                or self.membership_pending or not self._unpinned):
            return
        new = self._pins_due()
        if new is not None:
            self._append_as_leader(EntryKind.CONFIG, encode(new), new)
            self._broadcast_append()

    def _after_commit(self) -> None:
        """Leader: the commit index moved."""
        if self.bugs.config_on_commit:
            self._sync_membership()
        if self.id not in self.committed_membership.voter_ids:
            # Defensive: a leader never removes itself, so this takes a
            # configuration it did not propose. It must not lead a group it
            # does not vote in.
            self.elector.become_follower(self.term, 0)
            self.progress = {}
            return
        self._maybe_pin()

    def _won_round(self) -> None:
        if self.role is Role.PRE_CANDIDATE:
            self._campaign_for_real()
        else:
            self._become_leader()

    def _campaign_for_real(self, transfer: bool = False) -> None:
        self.elector.become_candidate()
        if self.elector.tally is not None and self.elector.tally.outcome() is VoteOutcome.WON:
            self._become_leader()
            return
        last_index, last_term = self.log.last_index, self.log.last_term()
        # The learners are asked too, though their answers count for nothing
        # (`VoteTally`): a learner in this node's configuration may be a voter
        # in a later one this node has not seen yet, and only a request tells
        # it the term. Asked nothing, such a voter campaigns a term behind
        # this node every time, learns the term from the refusal, and never
        # wins while this node, unable to win itself, keeps raising it (core
        # simulator, seed 19401942: pre-vote off, the stale node's other
        # voter wiped).
        for peer in (*self.elector.peers, *sorted(self._membership.learner_ids - {self.id})):
            self._outbox.append(
                VoteRequest(self.id, peer, self.term, last_index, last_term, transfer=transfer,
                            directory_id=self._dir)
            )

    def _become_leader(self) -> None:
        self.elector.become_leader()
        self.elections_won += 1
        next_index = self.log.last_index + 1
        self.progress = {
            peer: Progress(next_index, self.config.inflight_max)
            for peer in self._membership.node_ids - {self.id}
        }
        self._reserves = frozenset()  # chosen at the first tick, from the acks by then
        self._reserves_chosen = False
        self._reserve_marks = {}
        # The NOOP gives the new term an entry of its own: committing it
        # commits every earlier entry (§5.4.2), which counting cannot. When
        # members wait to be pinned (and no change is pending) the first entry
        # pins them instead: a log's first entries then already say which disk
        # each member is, so a wiped node that re-reads them knows it was wiped.
        pins = self._pins_due() if self._dir and not self.membership_pending else None
        if pins is not None:
            first = self._append_as_leader(EntryKind.CONFIG, encode(pins), pins)
        else:
            first = self._append_as_leader(EntryKind.NOOP, b"")
        self._term_start = first.index
        self._broadcast_append()

    # -- votes

    def _handle_vote_request(self, msg: VoteRequest) -> None:
        last_index, last_term = self.log.last_index, self.log.last_term()
        response = self.elector.decide_vote(
            msg, last_index, last_term, check_log=not self.bugs.skip_log_up_to_date_check)
        self._outbox.append(response)
        if not response.granted and self.elector.hurry_after_refusal(msg, last_index, last_term):
            # Our log is longer than the candidate's and our leader is gone:
            # we can win and it cannot, so do not wait for our own timer.
            self.campaign()

    def _handle_vote_response(self, msg: VoteResponse) -> None:
        if self.role not in (Role.PRE_CANDIDATE, Role.CANDIDATE):
            return
        outcome = self.elector.record_vote(msg)
        if outcome is VoteOutcome.WON:
            self._won_round()
        elif outcome is VoteOutcome.LOST:
            self.elector.become_follower(self.term, 0)

    # -- follower side

    def _follow(self, leader_id: int) -> None:
        if self.role is not Role.FOLLOWER:
            invariant(self.role is not Role.LEADER, f"two leaders in term {self.term}")
            self.elector.become_follower(self.term, leader_id)
        self.elector.heard_from_leader(leader_id)

    def _handle_append(self, msg: AppendRequest) -> None:
        self._follow(msg.src)
        prev_index, prev_term, entries = msg.prev_index, msg.prev_term, msg.entries
        if prev_index < self.commit:
            # Entries up to commit must already equal the leader's: check that
            # they do (every term the message names at or below our commit),
            # then keep only what lies beyond and re-anchor at our commit.
            # Re-anchored, prev matches by definition, also where the entry
            # is no longer stored (a snapshot covers it).
            self._check_committed_prefix(prev_index, prev_term, entries)
            skip = min(self.commit - prev_index, len(entries))
            entries = entries[skip:]
            prev_index = prev_index + skip
            matches = True
        else:
            matches = self.bugs.skip_consistency_check or self.log.match_term(
                prev_index, prev_term)
        if prev_index <= self.log.last_index and matches:
            self._accept_entries(prev_index, entries, msg.commit)
            last_new = prev_index + len(entries)
            self._outbox.append(AppendResponse(self.id, msg.src, self.term, True, last_new,
                                               directory_id=self._dir))
            return
        hint_index = self.log.find_conflict_by_term(min(prev_index, self.log.last_index), prev_term)
        hint_term = self.log.term_or_none(hint_index) or 0
        reject = AppendResponse(
            self.id, msg.src, self.term, False, msg.prev_index, hint_index, hint_term,
            directory_id=self._dir,
        )
        self._outbox.append(reject)

    def _check_committed_prefix(self, prev_index: int, prev_term: int,
                                entries: tuple[Entry, ...]) -> None:
        """Raise `CommittedDivergence` if the leader's (prev, entries) disagree
        with a term of our committed prefix. An index no longer stored here
        (compacted into a snapshot) is compared with the snapshot: terms never
        decrease along a log, so a leader's term there above the snapshot's
        term means the leader lacks our committed entry at the snapshot."""
        claims = [(prev_index, prev_term)] + [(e.index, e.term) for e in entries
                                              if e.index <= self.commit]
        for index, term in claims:
            if index == 0:
                continue
            ours = self.log.term_or_none(index)
            if ours is not None:
                if ours != term:
                    raise CommittedDivergence(index, ours, term)
                continue
            snap = self.log.snapshot_covering(index)
            if snap is not None and term > snap.term:
                raise CommittedDivergence(index, snap.term, term, anchor=snap.index)

    def _accept_entries(self, prev_index: int, entries: tuple[Entry, ...], commit: int) -> None:
        new_entries: tuple[Entry, ...] = ()
        for i, entry in enumerate(entries):
            if not self.log.match_term(entry.index, entry.term):
                new_entries = entries[i:]
                break
        if new_entries:
            first = new_entries[0].index
            if first <= self.stable_index:
                self.stable_index = first - 1  # the durable suffix is being replaced
            self._append_log(new_entries)
        last_new = prev_index + len(entries)
        if self.bugs.follower_commit_to_last_index:
            last_new = self.log.last_index
        self._commit_to(min(commit, last_new))

    def _commit_to(self, index: int) -> None:
        index = min(index, self.log.last_index)
        if index > self.commit:
            self.commit = index
            if self.bugs.config_on_commit:
                self._sync_membership()

    def _handle_heartbeat(self, msg: Heartbeat) -> None:
        self._follow(msg.src)
        # The leader sends min(commit, our match), so our log agrees up to it.
        self._commit_to(msg.commit)
        # ... unless our log ends below it: we lost entries we acknowledged
        # (flush=async power cut). Say where it ends, or an idle leader never
        # resends them.
        lost = msg.commit > self.log.last_index
        self._outbox.append(HeartbeatResponse(self.id, msg.src, self.term,
                                              self.log.last_index if lost else -1,
                                              directory_id=self._dir))

    def _handle_install_snapshot(self, msg: InstallSnapshot) -> None:
        self._follow(msg.src)
        if msg.index <= self.commit:
            # Stale or duplicate: our committed prefix already covers it (and
            # must agree with it: a lost committed entry shows here too).
            self._check_committed_prefix(msg.index, msg.snap_term, ())
            self._outbox.append(AppendResponse(self.id, msg.src, self.term, True, self.commit,
                                               directory_id=self._dir))
            return
        if self.bugs.snapshot_ignores_term:
            holds = msg.index <= self.log.last_index
        else:
            holds = self.log.match_term(msg.index, msg.snap_term)
        if holds:
            # Log matching: our prefix up to it is the leader's; keep what follows.
            self._commit_to(msg.index)
            self._outbox.append(AppendResponse(self.id, msg.src, self.term, True, msg.index,
                                               directory_id=self._dir))
            return
        self.log.restore(SnapshotMeta(msg.index, msg.snap_term, msg.end_position,
                                      msg.membership))
        self.commit = self.applied = self.stable_index = msg.index
        # The snapshot's configuration replaces the whole history (None: the
        # bootstrap one, from a snapshot older than membership changes).
        self.configs.reset(msg.index, msg.membership or self._bootstrap)
        self._sync_membership()
        self.snapshots_restored += 1
        ack = AppendResponse(self.id, msg.src, self.term, True, msg.index,
                             directory_id=self._dir)
        self._snapshot_ack = ack
        self._outbox.append(ack)

    # -- leader side

    def _broadcast_heartbeat(self) -> None:
        for peer, pr in self.progress.items():
            commit = self.commit if self.bugs.heartbeat_full_commit else min(self.commit, pr.match)
            self._outbox.append(Heartbeat(self.id, peer, self.term, commit,
                                          directory_id=self._dir))

    def _broadcast_append(self) -> None:
        reserves = self._reserves
        for peer, pr in self.progress.items():
            if peer in reserves and self._reserve_waits(peer, pr):
                continue
            self._send_append(peer)

    def _reserve_waits(self, peer: int, pr: Progress) -> bool:
        """A reserve's new entries wait until a batch of them is due (rule
        8): `reserve_batch_entries` of them, or `reserve_batch_bytes`."""
        log = self.log
        if log.last_index - pr.next + 1 >= self.config.reserve_batch_entries:
            return False
        # Where the entries it was sent end: looked up once per batch sent.
        sent = pr.next - 1
        mark = self._reserve_marks.get(peer)
        if mark is None or mark[0] != sent:
            try:
                mark = (sent, log.end_of(sent))
            except LogUnavailable:
                return False  # compacted: `_send_append` sends the snapshot
            self._reserve_marks[peer] = mark
        return log.end_position - mark[1] < self.config.reserve_batch_bytes

    def _choose_reserves(self) -> None:
        """Rule 8: all voting followers but the `needed` with the highest
        counted match (ties to the lower id) are reserves."""
        ranked = []
        for node_id, pinned in self._voter_pins:
            pr = self.progress.get(node_id)
            if node_id == self.id or pr is None:
                continue
            counted = pinned == UNPINNED or pr.directory_id == pinned
            ranked.append((counted and pr.state is ProgressState.REPLICATE,
                           pr.match if counted else -1, -node_id))
        ranked.sort(reverse=True)
        needed = len(self._voter_pins) // 2  # a quorum, less the leader
        keep = (self.elector.transferee, self.elector.config.preferred_leader)
        reserves = frozenset(-n for _, _, n in ranked[needed:] if -n not in keep)
        if reserves != self._reserves:
            if self._reserves_chosen:
                self.reserve_changes += 1
            self._reserves = reserves
        self._reserves_chosen = True

    def _send_append(self, peer: int) -> bool:
        """Send the next batch to `peer` unless its window is full; True if entries went."""
        pr = self.progress[peer]
        if pr.paused():
            return False
        last_index = self.log.last_index
        prev_index = pr.next - 1
        try:
            prev_term = self.log.term(prev_index)
            entries = self.log.entries(
                pr.next, last_index + 1, self.config.append_bytes_max,
                self.config.append_entries_max,
            )
        except LogUnavailable:
            self._send_snapshot(peer, pr)
            return False
        msg = AppendRequest(
            self.id, peer, self.elector.term, prev_index, prev_term, tuple(entries), self.commit,
            directory_id=self._dir,
        )
        pr.sent(entries[-1].index if entries else prev_index)
        self._outbox.append(msg)
        if entries and peer in self._reserves:
            self.reserve_appends += 1
        return bool(entries)

    def _send_snapshot(self, peer: int, pr: Progress) -> None:
        """The entries `peer` needs are gone: send the snapshot and pause it."""
        meta = self.log.snapshot_to_send()
        invariant(
            meta is not None and meta.index >= pr.next - 1,
            f"entries from {pr.next} are not stored and storage's snapshot {meta} does not "
            "cover them: the driver deleted log entries no snapshot holds",
        )
        assert meta is not None  # for the type checker; invariant() raised otherwise
        pr.become_snapshot(meta.index)
        self.snapshots_sent += 1
        self._outbox.append(
            InstallSnapshot(self.id, peer, self.term, meta.index, meta.term, meta.end_position,
                            meta.membership, directory_id=self._dir)
        )

    def _fill_window(self, peer: int, flush: bool = False) -> None:
        """Pipelining: keep sending batches while the window has room and
        entries remain (for a reserve, once a batch is due, or on `flush`)."""
        pr = self.progress[peer]
        if not flush and peer in self._reserves and self._reserve_waits(peer, pr):
            return
        while pr.next <= self.log.last_index and not pr.paused():
            if not self._send_append(peer):
                break

    def _handle_append_response(self, msg: AppendResponse) -> None:
        pr = self.progress.get(msg.src)
        if pr is None or self.elector.role is not Role.LEADER:
            return
        self._identify(pr, msg.directory_id)
        self.elector.mark_active(msg.src, msg.directory_id)
        pr.recent_active = True
        if not msg.success:
            match_hint = msg.hint_index
            if msg.hint_term > 0:
                match_hint = self.log.find_conflict_by_term(msg.hint_index, msg.hint_term)
            if pr.decrease(msg.index, match_hint):
                self._send_append(msg.src)
            return
        if msg.directory_id and msg.src in self._unpinned:
            self._maybe_pin()  # first heard from: pin it (when no change is pending)
        if not pr.update(msg.index):
            return
        if pr.state is ProgressState.PROBE or pr.snapshot_done():
            pr.become_replicate()
        # The new commit rides on the next append or heartbeat (rule 6).
        if self._maybe_commit():
            self._after_commit()
            if self.role is not Role.LEADER or msg.src not in self.progress:
                return  # stepped down, or the commit took `msg.src` out of the group
            if msg.src in self._reserves:
                self._choose_reserves()  # the quick ones were slow or gone (rule 8)
        self._fill_window(msg.src)
        if self.elector.transferee == msg.src and pr.match == self.log.last_index:
            self._outbox.append(TimeoutNow(self.id, msg.src, self.term, directory_id=self._dir))

    def _handle_heartbeat_response(self, msg: HeartbeatResponse) -> None:
        pr = self.progress.get(msg.src)
        if pr is None or self.role is not Role.LEADER:
            return
        self._identify(pr, msg.directory_id)
        self.elector.mark_active(msg.src, msg.directory_id)
        pr.recent_active = True
        if msg.directory_id and msg.src in self._unpinned:
            self._maybe_pin()
        if 0 <= msg.last_index < pr.match:
            pr.lost_tail(msg.last_index)
        if pr.state is ProgressState.PROBE:
            pr.probe_sent = False  # the probe may have been lost: allow another
        if pr.match < self.log.last_index:
            self._send_append(msg.src)

    def _identify(self, pr: Progress, directory_id: int) -> None:
        """Another data directory answers for this follower: what the old one
        held tells nothing about the new one, so replication starts over."""
        if directory_id and pr.directory_id != directory_id:
            if pr.directory_id:
                pr.match = 0
                pr.become_probe()
            pr.directory_id = directory_id

    def _maybe_commit(self) -> bool:
        """Commit what a majority of the voters holds (rule 2, rule 7); True if it moved."""
        own = self.log.last_index if self.bugs.leader_counts_unsynced else self.stable_index
        matches = []
        progress = self.progress
        for node_id, pinned in self._voter_pins:
            if node_id == self.id:
                ok = pinned in (UNPINNED, self._dir)
                matches.append(own if ok else 0)
                continue
            pr = progress.get(node_id)
            if pr is None or (pinned != UNPINNED and pr.directory_id != pinned):
                matches.append(0)  # a voter not heard from, or from another disk
            else:
                matches.append(pr.match)
        if self.bugs.learner_in_quorum:
            # The bug: learners' matches compete for the voters' quorum.
            quorum = len(matches) // 2 + 1
            matches += [progress[n].match for n in self._membership.learner_ids if n in progress]
            candidate = sorted(matches, reverse=True)[quorum - 1]
        else:
            candidate = quorum_index(matches)
        if candidate <= self.commit:
            return False
        if self.log.term(candidate) != self.term and not self.bugs.commit_old_term_by_counting:
            return False  # only current-term entries commit by counting (Figure 8)
        self.commit = candidate
        self.commit_voters = self._voter_pins
        return True

    def _tick_resend(self) -> None:
        for peer, pr in self.progress.items():
            if pr.state is ProgressState.SNAPSHOT:
                # A lost InstallSnapshot or acknowledgement: probe again (which
                # sends a new snapshot if the follower still needs one).
                pr.snapshot_ticks += 1
                if pr.snapshot_ticks >= self.config.snapshot_timeout_ticks:
                    pr.become_probe()
                    self._send_append(peer)
            elif pr.state is ProgressState.REPLICATE and pr.inflight:
                pr.stall_ticks += 1
                if pr.stall_ticks >= self.config.resend_ticks:
                    pr.become_probe()
                    self._send_append(peer)

    def _check_preferred_leader(self) -> None:
        preferred = self.elector.config.preferred_leader
        pr = self.progress.get(preferred)
        if pr is not None and not self.elector.transferee:
            healthy = pr.recent_active and pr.state is ProgressState.REPLICATE
            if healthy and self.log.last_index - pr.match <= self.config.preferred_lag_max:
                self.transfer_leadership(preferred)
        for other in self.progress.values():
            other.recent_active = False


# ------------------------------------------------------------------ helpers


def _strict(m: Membership) -> bool:
    """A quorum of `m`'s voters is pinned (`election.strict_identity`)."""
    return strict_identity(m.voter_ids, {v.node_id: v.directory_id for v in m.voters})


def _not_config(kind: int) -> None:
    if kind == EntryKind.CONFIG:
        raise ValueError("configuration entries go through propose_membership")


def _decode(entry: Entry) -> Membership:
    try:
        return decode(entry.data)
    except MembershipError as exc:
        invariant(False, f"CONFIG entry {entry.index}/{entry.term} unreadable: {exc}")
        raise  # unreachable: invariant() raised


def stored_membership(storage: LogStorage, bootstrap: Membership) -> Membership:
    """The configuration a core started on `storage` will have in effect
    (its snapshot's, or `bootstrap`, then the last CONFIG entry stored):
    for a driver or a checker that asks before the core exists. Reads the
    whole stored log without a `config_entries` hook."""
    return _configs_of(storage, bootstrap).current[1]


def _configs_of(storage: LogStorage, bootstrap: Membership) -> ConfigHistory:
    """The configurations of the stored log: its snapshot's (or the bootstrap
    one), then one per CONFIG entry stored after it."""
    first, last = storage.first_index(), storage.last_index()
    snap = storage.snapshot() if first > 1 else None
    if snap is not None and snap.membership is not None:
        history = ConfigHistory(snap.index, snap.membership)
    else:
        history = ConfigHistory(0, bootstrap)
    hook = getattr(storage, CONFIG_ENTRIES_HOOK, None)
    if hook is not None:
        found: list[Entry] = hook(first, last + 1)
    else:
        found = []
        lo = first
        while lo <= last:
            batch = storage.entries(lo, last + 1, _SCAN_BYTES)
            found += [e for e in batch if e.kind == EntryKind.CONFIG]
            lo = batch[-1].index + 1
    base = history.current[0]
    for entry in found:
        # The log may still hold entries below its snapshot (the CommitLog
        # deletes whole segments only): the snapshot's configuration covers
        # the CONFIG entries among them.
        if entry.index > base:
            history.add(entry.index, _decode(entry))
    return history
