"""The election state machine: term, vote, role, leader and election timers.

Theory of operation
-------------------
`Elector` is driven by its owner (`dledger.raw_node.RaftNode`):

- `tick()` advances the timers and returns a `TickAction` telling the owner
  what is due: campaign, broadcast heartbeats, or check whether the preferred
  leader should take over. Check-quorum step-down happens inside `tick()`.
- `filter_term(msg)` applies Raft's term rules to every incoming message
  before the owner looks at it (adopt a higher term, drop stale messages,
  honour the leader lease). It may return a reply for the sender.
- `decide_vote()` answers a `VoteRequest`; `record_vote()` counts answers;
  `hurry_after_refusal()` says when a refusal should be followed by our own
  campaign (a leader-lost follower whose log is longer than the candidate's).
- `become_*()` change role through the table in `election.roles`.
- `leader_lost(leader)` is the owner's word that the leader's process looks
  gone (every connection to and from it closed): a follower ends its lease
  and campaigns within a few ticks instead of an election timeout.

Rules
-----
1. `term` and `vote` are *hard state*: the owner must persist them durably
   before any message produced in the new term, and before a granted vote,
   leaves the node. The elector only changes them; `dledger` enforces the
   ordering through `Ready.messages_after_persist`.
2. A node votes at most once per term: `vote` is reset only when `term` grows.
3. Randomness comes only from the injected `rng` (anything with `randint`), so
   a seeded run is reproducible.
4. Membership: `voters` is the voter set of the configuration in effect, which
   the owner changes with `configure` (the replication core replicates
   configurations through the log). Votes are counted from `peers` (the
   voters but this node; the replication core also tells its learners the
   term of a real campaign, and their answers are not counted); a node need
   not be a voter itself (a learner, a joining node), and then the owner
   does not campaign. `pinned` maps a voter to the
   data directory it is known by (`dledger.membership`): a grant, or a
   check-quorum answer, from another directory is not counted, and once a
   quorum of voters is pinned only pinned voters' grants count (`VoteTally`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Protocol

from election.config import ElectionConfig
from election.messages import HeartbeatResponse, Message, VoteRequest, VoteResponse
from election.roles import Role, check_transition
from election.votes import (
    VoteOutcome,
    VoteTally,
    identity_matches,
    log_up_to_date,
    quorum_size,
)

__all__ = ["LOST_LEADER_ROUNDS", "Elector", "RandomSource", "TickAction", "VoteOutcome"]

# Election timer draws from the short range after `leader_lost`: the notice's
# own and the retries (a split vote, a pre-vote that met a lease not yet ended,
# or no quorum yet: the other survivor may be a node still starting up). About
# 20 ticks in all, an election timeout or two; then the full timeout again.
LOST_LEADER_ROUNDS = 8


class RandomSource(Protocol):
    """The slice of `random.Random` the elector needs; injected for determinism."""

    def randint(self, a: int, b: int) -> int: ...


class TickAction(enum.IntFlag):
    """What a tick made due; the owner acts on each set flag."""

    NONE = 0
    CAMPAIGN = 1  # election timeout elapsed: start a (pre-)election
    HEARTBEAT = 2  # leader: broadcast heartbeats
    STEPPED_DOWN = 4  # leader: check-quorum failed, now a follower
    LEADER_CHECK = 8  # leader: an election timeout passed (transfer abort, preferred leader)


class Elector:
    """Election state of one node. See the module docstring for the rules."""

    def __init__(
        self,
        node_id: int,
        voters: frozenset[int],
        config: ElectionConfig,
        rng: RandomSource,
        term: int = 0,
        vote: int = 0,
        *,
        pinned: Mapping[int, int] | None = None,
        directory_id: int = 0,
    ) -> None:
        if node_id <= 0:
            raise ValueError("node ids are positive integers (0 means 'none')")
        self.node_id = node_id
        # This node's data-directory id, carried by every message it builds.
        self.directory_id = directory_id
        self.voters: frozenset[int] = frozenset()
        self.peers: tuple[int, ...] = ()
        self.pinned: Mapping[int, int] = {}
        self.configure(voters, pinned)
        self.config = config
        self._rng = rng
        # Hard state. Invariant: vote != 0 only for a vote cast in `term`.
        self.term = term
        self.vote = vote
        self.role = Role.FOLLOWER
        # Leader of `term` as far as we know; 0 = unknown.
        self.leader_id = 0
        # Ticks since we last heard from the leader (follower) or since the
        # last check-quorum round (leader).
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        # Invariant: election_timeout <= randomized_timeout < 2 * election_timeout,
        # except in the short rounds after `leader_lost` (1..lost_leader_ticks,
        # or the next tick after `hurry_after_refusal`).
        self.randomized_timeout = config.election_timeout_ticks
        # Timer draws left from the short range (`leader_lost`).
        self._hasty = 0
        self.tally: VoteTally | None = None
        # Peers heard from since the last check-quorum round (leader only).
        self.recent_active: set[int] = set()
        # Leadership transfer target (leader only); 0 = none.
        self.transferee = 0
        # The voters whose grants made this node leader (observability, checks).
        self.elected_by: frozenset[int] = frozenset()
        self._reset_randomized_timeout()

    def configure(self, voters: frozenset[int], pinned: Mapping[int, int] | None = None) -> None:
        """Adopt the voter set (and the directories voters are pinned to) of a
        new configuration. A round in progress keeps the tally it started with."""
        if not voters or any(v <= 0 for v in voters):
            raise ValueError("voters: a non-empty set of positive node ids")
        self.voters = voters
        self.peers = tuple(sorted(voters - {self.node_id}))
        self.pinned = dict(pinned or {})

    # ----------------------------------------------------------------- queries

    @property
    def quorum(self) -> int:
        return quorum_size(len(self.voters))

    def is_voter(self) -> bool:
        """A voter of the configuration, under the directory it is known by."""
        return self.node_id in self.voters and identity_matches(
            self.pinned, self.node_id, self.directory_id)

    def in_lease(self) -> bool:
        """A follower in contact with a live leader refuses to help depose it."""
        return (
            self.config.check_quorum
            and self.leader_id != 0
            and self.election_elapsed < self.config.election_timeout_ticks
        )

    # ------------------------------------------------------------ transitions

    def _reset_randomized_timeout(self) -> None:
        t = self.config.election_timeout_ticks
        if self._hasty:
            # The leader is gone (leader_lost): a split vote or a pre-vote
            # round that met a lease not yet ended is retried within a few
            # ticks, not after a whole timeout.
            self._hasty -= 1
            self.randomized_timeout = self._rng.randint(1, min(self.config.lost_leader_ticks, t))
        else:
            self.randomized_timeout = t + self._rng.randint(0, t - 1)

    def _reset(self, term: int, keep_timer: bool = False) -> None:
        if term != self.term:
            if term < self.term:
                raise ValueError(f"term may not go backwards ({self.term} -> {term})")
            self.term = term
            self.vote = 0
        self.leader_id = 0
        self.heartbeat_elapsed = 0
        self.tally = None
        self.transferee = 0
        self.recent_active = set()
        if not keep_timer:
            self.election_elapsed = 0
            self._reset_randomized_timeout()

    def become_follower(self, term: int, leader_id: int, keep_timer: bool = False) -> None:
        """`keep_timer`: the election timer runs on (see `filter_term`)."""
        check_transition(self.role, Role.FOLLOWER)
        self._reset(term, keep_timer)
        self.role = Role.FOLLOWER
        self.leader_id = leader_id

    def become_pre_candidate(self) -> None:
        """Start a pre-vote round; term and vote stay untouched (thesis §9.6)."""
        check_transition(self.role, Role.PRE_CANDIDATE)
        # Only the timers and tally reset: the pre-candidate keeps its term and
        # vote so that a failed pre-vote leaves no trace in hard state.
        self.election_elapsed = 0
        self.leader_id = 0
        self._reset_randomized_timeout()
        self.role = Role.PRE_CANDIDATE
        self.tally = VoteTally(self.voters, self.pinned)
        self.tally.record(self.node_id, True, self.directory_id)

    def become_candidate(self) -> None:
        check_transition(self.role, Role.CANDIDATE)
        self._reset(self.term + 1)
        self.role = Role.CANDIDATE
        self.vote = self.node_id
        self.tally = VoteTally(self.voters, self.pinned)
        self.tally.record(self.node_id, True, self.directory_id)

    def become_leader(self) -> None:
        check_transition(self.role, Role.LEADER)
        self._hasty = 0
        self.elected_by = self.tally.granted_by() if self.tally is not None else frozenset()
        self._reset(self.term)
        self.role = Role.LEADER
        self.leader_id = self.node_id
        self.recent_active = {self.node_id}

    # ------------------------------------------------------------------ time

    def tick(self) -> TickAction:
        """Advance the timers by one tick and report what became due."""
        if self.role is Role.LEADER:
            return self._tick_leader()
        self.election_elapsed += 1
        if self.election_elapsed >= self.randomized_timeout:
            self.election_elapsed = 0
            return TickAction.CAMPAIGN
        return TickAction.NONE

    def _tick_leader(self) -> TickAction:
        action = TickAction.NONE
        self.heartbeat_elapsed += 1
        self.election_elapsed += 1
        if self.election_elapsed >= self.config.election_timeout_ticks:
            self.election_elapsed = 0
            active = len(self.recent_active & self.voters)
            if self.config.check_quorum and active < self.quorum:
                # We could be on the minority side of a partition: a leader
                # that cannot reach a quorum must not keep accepting writes.
                self.become_follower(self.term, 0)
                return TickAction.STEPPED_DOWN
            self.recent_active = {self.node_id}
            # A transfer that has not completed within an election timeout
            # is abandoned so that proposals are accepted again.
            self.transferee = 0
            action |= TickAction.LEADER_CHECK
        if self.heartbeat_elapsed >= self.config.heartbeat_interval_ticks:
            self.heartbeat_elapsed = 0
            action |= TickAction.HEARTBEAT
        return action

    def heard_from_leader(self, leader_id: int) -> None:
        """A message from the current leader arrived: reset the election timer."""
        self.leader_id = leader_id
        self.election_elapsed = 0
        if self.randomized_timeout < self.config.election_timeout_ticks:
            # A leader again after `leader_lost`: back to the full timeout.
            self._hasty = 0
            self._reset_randomized_timeout()

    def leader_lost(self, leader_id: int) -> bool:
        """The owner saw every connection to and from `leader_id` close and stay
        closed (a killed process's sockets are closed by its kernel at once).

        A follower of that leader forgets it, which ends its lease (it grants
        pre-votes again), and campaigns after a random 1..`lost_leader_ticks`
        ticks instead of waiting out the election timeout; the spread keeps
        two followers told at once from splitting the vote, and should they
        split it (or should a pre-vote meet the other's lease before that one
        was told), the next `LOST_LEADER_ROUNDS - 1` attempts are drawn from
        the same short range, until a leader is heard. Returns whether it
        took the notice: only a follower of `leader_id`, and only with
        pre-vote and check-quorum on. Those keep a wrong notice harmless: a
        follower that alone lost its connections asks for pre-votes that the
        others, still in their leases, ignore, and it rejoins the leader at
        its next heartbeat without having raised its term. Without them a
        wrong notice would depose a healthy leader, so it is ignored.
        """
        if (self.role is not Role.FOLLOWER or leader_id == 0 or leader_id != self.leader_id
                or not (self.config.pre_vote and self.config.check_quorum)):
            return False
        self.leader_id = 0
        remaining = self.randomized_timeout - self.election_elapsed
        self._hasty = LOST_LEADER_ROUNDS
        self._reset_randomized_timeout()
        # The timer fires within the short draw, or sooner if it was due anyway.
        self.randomized_timeout = min(self.randomized_timeout, remaining)
        self.election_elapsed = 0
        return True

    def mark_active(self, peer: int, directory_id: int = 0) -> None:
        """Leader: `peer` answered within this check-quorum round (from
        `directory_id`; an answer from another directory than the pinned one
        does not count: that node lost its disk)."""
        if identity_matches(self.pinned, peer, directory_id):
            self.recent_active.add(peer)

    # ------------------------------------------------------------- term rules

    def filter_term(self, msg: Message) -> tuple[bool, Message | None]:
        """Apply Raft's term rules to `msg`.

        Returns (process, reply): `process` is False when the message must be
        dropped; `reply` is an answer to send regardless.
        """
        if msg.term > self.term:
            if isinstance(msg, VoteRequest):
                # Leader lease: while we hear from a leader, a higher-term vote
                # request comes from a node that was cut off; ignoring it
                # (without adopting its term) keeps the healthy leader in place.
                if not msg.transfer and self.in_lease():
                    return False, None
                if msg.pre_vote:
                    return True, None  # pre-votes never change our term
            elif isinstance(msg, VoteResponse) and msg.pre_vote and msg.granted:
                return True, None  # carries the term we are about to campaign in
            # Figure 2 of the Raft paper: only a leader's message or a
            # *granted* vote restarts the election timer (`decide_vote` does
            # the latter). Adopting a candidate's term must not: a node with a
            # stale log and a fast clock would otherwise keep every up-to-date
            # node's timer at zero, campaign forever and never win (found by
            # the simulator with pre-vote off, seed 1638280297).
            self.become_follower(
                msg.term, msg.src if msg.from_leader else 0,
                keep_timer=isinstance(msg, VoteRequest),
            )
            return True, None
        if msg.term < self.term:
            if msg.from_leader and (self.config.check_quorum or self.config.pre_vote
                                    or not self.is_voter()):
                # A deposed leader (or one cut off by pre-vote) would otherwise
                # never learn of the new term; tell it so it steps down. Without
                # either, a voter's next campaign carries its term to the
                # group, but a learner never campaigns: it must answer, or a
                # learner whose term ran ahead (stale candidates' requests)
                # is never replicated to again (simulator, seed 1839 on 5 nodes).
                return False, HeartbeatResponse(src=self.node_id, dst=msg.src, term=self.term,
                                                directory_id=self.directory_id)
            if isinstance(msg, VoteRequest):
                # Tell a candidate of an older term about ours (Figure 2: reply
                # false with currentTerm). Without it a candidate that only
                # nodes of newer terms can hear (their configurations no longer
                # list it, so they never ask it for votes) campaigns forever in
                # its old term (found by the simulator with membership changes).
                return False, VoteResponse(
                    src=self.node_id, dst=msg.src, term=self.term, granted=False,
                    pre_vote=msg.pre_vote, directory_id=self.directory_id,
                )
            return False, None
        return True, None

    # ----------------------------------------------------------------- votes

    def decide_vote(
        self,
        request: VoteRequest,
        own_last_index: int,
        own_last_term: int,
        check_log: bool = True,
    ) -> VoteResponse:
        """Answer a vote request that passed `filter_term`, recording a real vote.

        `check_log=False` exists only for bug injection (a vote without the
        up-to-date check lets a stale node win and lose committed entries).
        Identity is not checked here: the candidate counts only the votes of
        the directories it knows (`VoteTally`).
        """
        can_vote = (
            self.vote == request.src
            or (self.vote == 0 and self.leader_id == 0)
            or (request.pre_vote and request.term > self.term)
        )
        if can_vote and (
            not check_log
            or log_up_to_date(request.last_term, request.last_index, own_last_term, own_last_index)
        ):
            if not request.pre_vote:
                self.vote = request.src
                self.election_elapsed = 0
            return VoteResponse(
                src=self.node_id,
                dst=request.src,
                term=request.term,
                granted=True,
                pre_vote=request.pre_vote,
                directory_id=self.directory_id,
            )
        return VoteResponse(
            src=self.node_id,
            dst=request.src,
            term=self.term,
            granted=False,
            pre_vote=request.pre_vote,
            directory_id=self.directory_id,
        )

    def hurry_after_refusal(self, request: VoteRequest, own_last_index: int,
                            own_last_term: int) -> bool:
        """A follower that has just refused `request` may be the node that
        should lead: the request is a pre-vote, the candidate's log is behind
        ours (so it cannot win while we live: that was the refusal's reason),
        and we are in a `leader_lost` episode (no leader since the notice).
        The candidate's timer fired first, but without this the group would
        wait for ours. The case is common with reserves (RaftNode rule 8): a
        dead leader's reserve is a few entries behind its quick followers.

        Returns True to campaign now: in a group of three (quorum 2) we are
        the only quick follower, so no other node hurries with us. In larger
        groups every quick follower refused the same request at the same
        moment, and campaigning at once they would split the vote; each sets
        its timer to its next tick instead, and the ticks of separate
        processes fall at independent moments. Nothing of safety rests on
        this (any node may campaign at any time); outside a `leader_lost`
        episode (a pause, a partition) nothing is hurried."""
        if not (request.pre_vote and self._hasty > 0 and self.role is Role.FOLLOWER
                and self.leader_id == 0
                and not log_up_to_date(request.last_term, request.last_index,
                                       own_last_term, own_last_index)):
            return False
        if self.quorum <= 2:
            return True
        self.randomized_timeout = min(self.randomized_timeout, self.election_elapsed + 1)
        return False

    def record_vote(self, response: VoteResponse) -> VoteOutcome:
        """Count an answer for the round we are in; stray answers are PENDING."""
        if self.tally is None:
            return VoteOutcome.PENDING
        if response.pre_vote != (self.role is Role.PRE_CANDIDATE):
            return VoteOutcome.PENDING  # answer to a round we already left
        return self.tally.record(response.src, response.granted, response.directory_id)
