"""Configuration of the replication core, including the bug-injection switches."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from dledger.membership import Member, Membership
from election.config import ElectionConfig


@dataclass(frozen=True, slots=True)
class Bugs:
    """Deliberate bugs, all off by default, to prove the simulator's checks bite.

    Each switch breaks one rule Raft depends on; `tests/dledger/test_bug_injection.py`
    turns them on one at a time and expects the simulator to report a violation.
    """

    # Count replicas of an old-term entry to commit it (Raft Figure 8, DLedger #4).
    commit_old_term_by_counting: bool = False
    # Send a granted vote before the new vote is durable.
    vote_before_persist: bool = False
    # Grant votes without the log up-to-date check (DLedger #52's effect).
    skip_log_up_to_date_check: bool = False
    # Acknowledge appended entries before they are durable.
    ack_before_persist: bool = False
    # Hand entries to the state machine before they are committed.
    apply_before_commit: bool = False
    # Follower accepts entries without checking (prev_index, prev_term).
    skip_consistency_check: bool = False
    # Leader counts its whole log (last_index) toward commit, not only what
    # the driver reported durable (stable_index).
    leader_counts_unsynced: bool = False
    # Follower sets commit to min(leaderCommit, its last index) instead of
    # min(leaderCommit, index of the last new entry) (Raft Figure 2).
    follower_commit_to_last_index: bool = False
    # Leader sends its full commit index in heartbeats instead of
    # min(commit, follower's match), so a follower with a stale suffix commits it.
    heartbeat_full_commit: bool = False
    # Follower acknowledges an installed snapshot before it is durable.
    ack_snapshot_before_persist: bool = False
    # Follower takes InstallSnapshot(index, term) as already held whenever its
    # log reaches `index`, whatever the term there: it commits its own entry.
    snapshot_ignores_term: bool = False
    # Membership (dledger.membership): the leader counts learners' matches
    # toward the voters' commit quorum.
    learner_in_quorum: bool = False
    # The leader accepts a configuration change while an earlier one is
    # uncommitted (no "one change in flight" rule).
    two_changes_at_once: bool = False
    # Identity is ignored in elections: votes from a node whose data directory
    # is not the pinned one count, and such a node votes and campaigns.
    ignore_directory_id: bool = False
    # A configuration takes effect when its entry is committed, not when it
    # is appended.
    config_on_commit: bool = False

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def only(cls, name: str) -> Bugs:
        if name not in cls.names():
            raise ValueError(f"unknown bug {name!r}; known: {', '.join(cls.names())}")
        return cls(**{name: True})


NO_BUGS = Bugs()

# A reserve's batch is due at this many bytes of entries (rule 8), whatever
# their count: the core's default and the runtime's.
RESERVE_BATCH_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Config:
    """Settings of one `RaftNode`. Sizes and windows bound every batch and queue."""

    node_id: int
    # The BOOTSTRAP voters: the configuration used only while neither the log
    # nor the snapshot holds one (and `membership` is None). `node_id` need
    # not be among them (a node that joins an existing group).
    voters: frozenset[int]
    election: ElectionConfig = field(default_factory=ElectionConfig)
    # Batching: one AppendRequest carries at most this many entries / bytes
    # (at least one entry, however large).
    append_entries_max: int = 64
    append_bytes_max: int = 1 << 20
    # Pipelining: unanswered AppendRequests per follower in REPLICATE state.
    inflight_max: int = 16
    # A follower in REPLICATE with batches in flight but no accepted answer for
    # this many ticks is re-probed from its match index (lost-message recovery).
    resend_ticks: int = 5
    # Rule 8 of RaftNode (reserves): a voting follower the commit does not need
    # is sent new entries once this many wait (or at the next tick); 0 (the
    # core's default, classic Raft) sends every follower every entry at once.
    # The runtime's default is on (`NodeConfig.reserve_batch_entries`).
    reserve_batch_entries: int = 0
    # ... or once this many bytes of them wait: large entries (a client's
    # merged batches) go at once, not as bursts the reserve then takes the
    # CPU for (docs/broker.md, "Reserves").
    reserve_batch_bytes: int = RESERVE_BATCH_BYTES
    # Preferred leader must be within this many entries of the leader's log
    # end to be handed leadership.
    preferred_lag_max: int = 0
    # A follower in SNAPSHOT state (an InstallSnapshot sent, no answer yet) is
    # probed again after this many ticks, which sends a new snapshot if it still
    # needs one. A driver that streams snapshot data for longer keeps its
    # transfer running and ignores the repeated InstallSnapshot for the same
    # index (or reports a failed transfer with `RaftNode.report_snapshot`).
    snapshot_timeout_ticks: int = 100
    bugs: Bugs = NO_BUGS
    # The bootstrap configuration with addresses and directory ids; wins over
    # `voters` when given.
    membership: Membership | None = None
    # This node's data-directory id (random, nonzero, chosen when the data
    # directory was created); 0 = identity not tracked (tests, old drivers):
    # the node then never pins members and applies no identity rule of its own.
    directory_id: int = 0
    # A learner may be promoted once leader commit - learner match <= this.
    promote_lag_max: int = 0

    def __post_init__(self) -> None:
        if self.node_id <= 0:
            raise ValueError("node_id must be a positive integer")
        if self.membership is None and (not self.voters or min(self.voters) <= 0):
            raise ValueError("voters: a non-empty set of positive node ids")
        if not 0 <= self.directory_id < 1 << 63:
            raise ValueError("directory_id must be in [0, 2**63)")
        if self.promote_lag_max < 0:
            raise ValueError("promote_lag_max must be >= 0")
        if self.append_entries_max < 1 or self.append_bytes_max < 1 or self.inflight_max < 1:
            raise ValueError("batch and window limits must be >= 1")
        if self.reserve_batch_entries < 0 or self.reserve_batch_bytes < 1:
            raise ValueError("reserve_batch_entries must be >= 0, reserve_batch_bytes >= 1")
        if self.resend_ticks < 1:
            raise ValueError("resend_ticks must be >= 1")
        if self.snapshot_timeout_ticks < 1:
            raise ValueError("snapshot_timeout_ticks must be >= 1")

    def bootstrap_membership(self) -> Membership:
        """The configuration in effect while the log and the snapshot hold none."""
        if self.membership is not None:
            return self.membership
        return Membership(tuple(Member(v) for v in sorted(self.voters)))
