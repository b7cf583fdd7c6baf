"""Election settings, all in ticks so the driver alone decides what a tick is."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ElectionConfig:
    """Timeouts and switches of the election protocol.

    With the planned 10-50 ms ticks, `election_timeout_ticks=10` detects a dead
    leader in 10-20 ticks (the timeout is randomised in [t, 2t)).
    """

    # A follower campaigns after hearing nothing from a leader for a random
    # number of ticks in [election_timeout_ticks, 2 * election_timeout_ticks).
    election_timeout_ticks: int = 10
    # A leader sends heartbeats this often; must be well below the timeout.
    heartbeat_interval_ticks: int = 1
    # Pre-vote (Raft thesis §9.6): a node asks whether it *could* win before
    # bumping its term, so a partitioned node cannot inflate terms.
    pre_vote: bool = True
    # Check-quorum: a leader that has not heard from a quorum within an
    # election timeout steps down; followers in contact with a leader ignore
    # vote requests (leader lease), so a returning node cannot disrupt it.
    check_quorum: bool = True
    # Node to hand leadership to when it is healthy and caught up; 0 = none.
    preferred_leader: int = 0
    # A follower told that its leader is unreachable (`Elector.leader_lost`:
    # the driver saw every connection to and from it close) campaigns after a
    # random 1..lost_leader_ticks ticks (at most an election timeout) instead
    # of an election timeout. The spread keeps two followers told at once
    # from splitting the vote.
    lost_leader_ticks: int = 4

    def __post_init__(self) -> None:
        if self.election_timeout_ticks < 2:
            raise ValueError("election_timeout_ticks must be >= 2")
        if not 1 <= self.heartbeat_interval_ticks < self.election_timeout_ticks:
            raise ValueError("heartbeat_interval_ticks must be in [1, election_timeout_ticks)")
        if self.lost_leader_ticks < 1:
            raise ValueError("lost_leader_ticks must be >= 1")
        if self.preferred_leader < 0:
            raise ValueError("preferred_leader must be a node id or 0")
