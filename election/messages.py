"""Election messages and the base class every Raft message shares.

Every message names its sender (`src`), recipient (`dst`) and the sender's
`term`. Two class-level attributes tell the driver how to treat it:

- `channel`: `CHANNEL_CONTROL` messages (heartbeats, votes, TimeoutNow) are
  tiny and time-critical; the driver sends them on their own connection or
  ahead of bulk traffic, so replication batches cannot starve them and cause
  spurious elections (DLedger issue #63). `CHANNEL_REPLICATION` carries
  append traffic.
- `from_leader`: sent only by a leader of `term`; receiving one tells a node
  who leads and resets its election timer.

Replication messages (`AppendRequest`, `AppendResponse`) live in
`dledger.messages` and subclass `Message`.

Messages are values: never changed once built. They are not `frozen=True`
dataclasses only because a frozen dataclass's `__init__` sets each field
through `object.__setattr__`, which tripled the cost of building one (about
0.8 µs more for an append's nine fields, paid for every message sent and
received); `unsafe_hash=True` keeps them hashable by value as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

CHANNEL_CONTROL = "control"
CHANNEL_REPLICATION = "replication"


@dataclass(slots=True, unsafe_hash=True)
class Message:
    """Fields common to all messages."""

    src: int
    dst: int
    term: int
    # The sender's data-directory id (`dledger.membership`): a node that lost
    # its disk comes back under a new one, and its votes no longer count.
    # 0 when unknown (drivers and tests that do not track identity).
    directory_id: int = field(default=0, kw_only=True)

    channel: ClassVar[str] = CHANNEL_CONTROL
    from_leader: ClassVar[bool] = False

    @property
    def is_heartbeat(self) -> bool:
        """True for leader liveness traffic the driver must never delay."""
        return False


@dataclass(slots=True, unsafe_hash=True)
class VoteRequest(Message):
    """Ask for a vote (or, with `pre_vote`, whether a vote would be granted).

    A pre-vote carries the term the sender *would* campaign in (its term + 1)
    without the sender having moved to it. `transfer` marks a campaign started
    by a leadership transfer, which may override a follower's leader lease.
    """

    last_index: int
    last_term: int
    pre_vote: bool = False
    transfer: bool = False


@dataclass(slots=True, unsafe_hash=True)
class VoteResponse(Message):
    """Answer to a `VoteRequest`; `pre_vote` echoes the request's flag."""

    granted: bool
    pre_vote: bool = False


@dataclass(slots=True, unsafe_hash=True)
class TimeoutNow(Message):
    """Leadership transfer: the leader tells a caught-up follower to campaign now."""

    from_leader: ClassVar[bool] = True


@dataclass(slots=True, unsafe_hash=True)
class Heartbeat(Message):
    """Leader liveness; `commit` is min(leader commit, the follower's match index)."""

    commit: int

    from_leader: ClassVar[bool] = True

    @property
    def is_heartbeat(self) -> bool:
        return True


@dataclass(slots=True, unsafe_hash=True)
class HeartbeatResponse(Message):
    """Follower liveness, counted by check-quorum; also tells a stale leader its term is over.

    `last_index` is -1 normally. A follower sets it to its log's last index
    when the heartbeat named a commit beyond that end: the leader believes the
    follower matches entries it no longer has (lost to a power cut under
    flush=async) and, told so, resends from there even when no write comes.
    """

    last_index: int = -1

    @property
    def is_heartbeat(self) -> bool:
        return True
