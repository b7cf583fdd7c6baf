"""Raft roles and the table of legal transitions between them.

Rules: every role change in `Elector` goes through `check_transition`, so an
illegal change (say follower -> leader without an election) fails loudly at
the point it happens instead of corrupting the cluster later.

    FOLLOWER --timeout--> PRE_CANDIDATE --prevote quorum--> CANDIDATE --vote quorum--> LEADER
       ^                        |                              |                           |
       +------ higher term / lost vote / leader seen ---------+---- check-quorum fails ---+
"""

from __future__ import annotations

import enum


class Role(enum.IntEnum):
    """What a node currently is; values are stable so they can be exported as metrics."""

    FOLLOWER = 0
    PRE_CANDIDATE = 1
    CANDIDATE = 2
    LEADER = 3


# Transitions are data (h11 style): role -> roles it may become next.
# A follower may become candidate directly when pre-vote is off or when it was
# told to by a leadership transfer (TimeoutNow).
TRANSITIONS: dict[Role, frozenset[Role]] = {
    Role.FOLLOWER: frozenset({Role.FOLLOWER, Role.PRE_CANDIDATE, Role.CANDIDATE}),
    Role.PRE_CANDIDATE: frozenset({Role.FOLLOWER, Role.PRE_CANDIDATE, Role.CANDIDATE}),
    # A candidate whose election timed out starts over with a pre-vote round.
    Role.CANDIDATE: frozenset({Role.FOLLOWER, Role.PRE_CANDIDATE, Role.CANDIDATE, Role.LEADER}),
    Role.LEADER: frozenset({Role.FOLLOWER}),
}


class IllegalTransition(RuntimeError):
    """Raised when code tries a role change the table forbids: always a bug."""


def check_transition(current: Role, new: Role) -> None:
    """Raise `IllegalTransition` unless `current -> new` is in `TRANSITIONS`."""
    if new not in TRANSITIONS[current]:
        raise IllegalTransition(f"illegal role transition {current.name} -> {new.name}")
