"""Replication messages, plus re-exports of the election messages.

`AppendRequest` is the only message on `CHANNEL_REPLICATION` with a body that
can be large; everything else is small and time-critical. `InstallSnapshot`
names a snapshot only: the driver moves the snapshot's bytes itself (the
runtime streams them before it delivers the message, see
`dledger.runtime.snapshot_transfer`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dledger.entry import Entry
from dledger.membership import Membership
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

__all__ = [
    "CHANNEL_CONTROL",
    "CHANNEL_REPLICATION",
    "AppendRequest",
    "AppendResponse",
    "Heartbeat",
    "HeartbeatResponse",
    "InstallSnapshot",
    "Message",
    "TimeoutNow",
    "VoteRequest",
    "VoteResponse",
]


@dataclass(slots=True, unsafe_hash=True)
class AppendRequest(Message):
    """Entries following (prev_index, prev_term) in the leader's log, and its commit index.

    An empty `entries` is a probe: it only asks whether the follower's log
    matches at `prev_index`.
    """

    prev_index: int
    prev_term: int
    entries: tuple[Entry, ...]
    commit: int

    channel: ClassVar[str] = CHANNEL_REPLICATION
    from_leader: ClassVar[bool] = True


@dataclass(slots=True, unsafe_hash=True)
class AppendResponse(Message):
    """A follower's answer to an `AppendRequest`.

    On success `index` is the last index now known to match the leader's log.
    On rejection `index` is the request's prev_index and (hint_index,
    hint_term) is the follower's guess of the last index where the logs may
    agree (fast backtracking: one round trip per divergent term, not per entry).
    """

    success: bool
    index: int
    hint_index: int = 0
    hint_term: int = 0

    channel: ClassVar[str] = CHANNEL_REPLICATION


@dataclass(slots=True, unsafe_hash=True)
class InstallSnapshot(Message):
    """The leader no longer holds the entries this follower needs: replace your log
    by the snapshot of the state up to (index, snap_term), whose CommitLog bytes
    end at `end_position`.

    The follower answers with an `AppendResponse`: success with `index` once the
    snapshot is durable (or at once with its commit index if that already
    covers `index`). Delivered only when the driver has the snapshot's data
    at hand; the core never sees the bytes.
    """

    index: int
    snap_term: int
    end_position: int
    # The configuration in effect at `index` (None: the bootstrap one).
    membership: Membership | None = None

    channel: ClassVar[str] = CHANNEL_REPLICATION
    from_leader: ClassVar[bool] = True
