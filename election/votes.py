"""Pure vote arithmetic: quorum size, the log up-to-date rule, vote tallies.

Kept free of any node state so each rule can be read (and tested) on its own.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping


def quorum_size(voters: int) -> int:
    """Smallest majority of `voters`: any two quorums intersect."""
    return voters // 2 + 1


def log_up_to_date(
    candidate_last_term: int,
    candidate_last_index: int,
    own_last_term: int,
    own_last_index: int,
) -> bool:
    """Raft §5.4.1: the candidate's log is at least as up to date as ours.

    Compare the terms of the last entries first; only on a tie does length
    decide. Using the *current* term instead of the last entry's term is
    DLedger bug #52 and lets a stale node win.
    """
    if candidate_last_term != own_last_term:
        return candidate_last_term > own_last_term
    return candidate_last_index >= own_last_index


class VoteOutcome(enum.Enum):
    """State of an election round from the candidate's point of view."""

    PENDING = "pending"
    WON = "won"
    LOST = "lost"


def identity_matches(pinned: Mapping[int, int], node_id: int, directory_id: int) -> bool:
    """False only when `node_id` is pinned to another data directory than the
    one its message came from (0 in `pinned`: not pinned, anything matches)."""
    expected = pinned.get(node_id, 0)
    return expected == 0 or expected == directory_id


def strict_identity(voters: frozenset[int], pinned: Mapping[int, int]) -> bool:
    """A quorum of `voters` is pinned: from then on only pinned voters' votes count."""
    return sum(1 for v in voters if pinned.get(v, 0)) >= quorum_size(len(voters))


class VoteTally:
    """Votes received in one round (pre-vote or real vote).

    Invariant: each voter is counted once; a duplicated or re-ordered response
    cannot change a recorded answer. Identity (`pinned`: voter -> data
    directory, 0 = unpinned): a grant from another directory than the pinned
    one counts as a refusal (that node lost its disk, and with it the memory
    of the votes it cast). An unpinned voter's grant counts: refusing it once
    a quorum is pinned (as this tally once did) left a 3-node group unable to
    ever elect again when its leader died before hearing from the third
    node (slow to start: `tests/dledger/test_node_process.py`). The cost, in
    docs/raft.md "Identity": a node wiped before any configuration the
    candidate holds pinned it can lend that candidate a vote.
    """

    __slots__ = ("_answers", "_pinned", "_voters")

    def __init__(self, voters: frozenset[int], pinned: Mapping[int, int] | None = None) -> None:
        self._voters = voters
        self._pinned: Mapping[int, int] = pinned or {}
        self._answers: dict[int, bool] = {}

    def counts(self, voter: int, directory_id: int) -> bool:
        """Would a grant of `voter` from `directory_id` count?"""
        expected = self._pinned.get(voter, 0)
        return expected == 0 or expected == directory_id

    def record(self, voter: int, granted: bool, directory_id: int = 0) -> VoteOutcome:
        """Record one answer (first one wins) and return the round's outcome."""
        if voter in self._voters and voter not in self._answers:
            self._answers[voter] = granted and self.counts(voter, directory_id)
        return self.outcome()

    def outcome(self) -> VoteOutcome:
        need = quorum_size(len(self._voters))
        granted = sum(1 for g in self._answers.values() if g)
        if granted >= need:
            return VoteOutcome.WON
        rejected = len(self._answers) - granted
        if rejected > len(self._voters) - need:
            return VoteOutcome.LOST
        return VoteOutcome.PENDING

    def granted(self) -> int:
        return sum(1 for g in self._answers.values() if g)

    def granted_by(self) -> frozenset[int]:
        """The voters whose grants were counted."""
        return frozenset(v for v, g in self._answers.items() if g)
