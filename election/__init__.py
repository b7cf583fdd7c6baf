"""Raft leader election as a sans-I/O state machine.

`Elector` owns a node's term, vote, role and election timers; `dledger`'s
replication core (`dledger.raw_node.RaftNode`) drives it with ticks and
messages and turns its decisions into outbound messages. Nothing here touches
sockets, files or clocks: time is a tick count and randomness is an injected
object with a `randint` method (a seeded `random.Random` in tests).
"""

from election.config import ElectionConfig
from election.elector import Elector, TickAction, VoteOutcome
from election.messages import (
    CHANNEL_CONTROL,
    CHANNEL_REPLICATION,
    Heartbeat,
    HeartbeatResponse,
    Message,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from election.roles import Role, check_transition
from election.votes import VoteTally, log_up_to_date, quorum_size

__all__ = [
    "CHANNEL_CONTROL",
    "CHANNEL_REPLICATION",
    "ElectionConfig",
    "Elector",
    "Heartbeat",
    "HeartbeatResponse",
    "Message",
    "Role",
    "TickAction",
    "TimeoutNow",
    "VoteOutcome",
    "VoteRequest",
    "VoteResponse",
    "VoteTally",
    "check_transition",
    "log_up_to_date",
    "quorum_size",
    "strict_identity",
]
