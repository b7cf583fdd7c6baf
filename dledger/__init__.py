"""Raft log replication for LedgerMQ's CommitLog, as a sans-I/O state machine.

`RaftNode` joins `election.Elector` with replication; drivers feed it ticks,
messages and proposals and carry out its `Ready`s. `dledger.testing` holds the
seeded cluster simulator and the interaction-transcript environment.
"""

from dledger.config import Bugs, Config
from dledger.entry import (
    ENTRY_HEADER_BYTES,
    Entry,
    EntryKind,
    HardState,
    PlaceFunction,
    place_in_segments,
    segment_placement,
)
from dledger.log import InvariantViolation
from dledger.membership import Member, Membership, MembershipError
from dledger.messages import (
    CHANNEL_CONTROL,
    CHANNEL_REPLICATION,
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
from dledger.progress import ProgressState
from dledger.raw_node import (
    FollowerStatus,
    MembershipChangeRefused,
    NotLeader,
    Proposed,
    RaftNode,
    Status,
)
from dledger.ready import Ready, SoftState
from dledger.storage import LogStorage, LogUnavailable, MemoryLogStorage, SnapshotMeta

__all__ = [
    "CHANNEL_CONTROL",
    "CHANNEL_REPLICATION",
    "ENTRY_HEADER_BYTES",
    "AppendRequest",
    "AppendResponse",
    "Bugs",
    "Config",
    "Entry",
    "EntryKind",
    "FollowerStatus",
    "HardState",
    "Heartbeat",
    "HeartbeatResponse",
    "InstallSnapshot",
    "InvariantViolation",
    "LogStorage",
    "LogUnavailable",
    "Member",
    "Membership",
    "MembershipChangeRefused",
    "MembershipError",
    "MemoryLogStorage",
    "Message",
    "NotLeader",
    "PlaceFunction",
    "ProgressState",
    "Proposed",
    "RaftNode",
    "Ready",
    "SnapshotMeta",
    "SoftState",
    "Status",
    "TimeoutNow",
    "VoteRequest",
    "VoteResponse",
    "place_in_segments",
    "segment_placement",
]
