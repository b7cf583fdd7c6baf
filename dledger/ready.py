"""`Ready`: everything the driver must do after feeding the core, and in which order.

The contract (etcd's, in our words):

0. If `snapshot` is not None, install it FIRST, before anything else of
   this Ready: the node restored a leader's snapshot, so replace the whole
   log by it (afterwards the log starts at snapshot.index + 1 and the next
   entry is placed at snapshot.end_position) and reset the state machine to
   the snapshot's state (it is applied up to snapshot.index). The hard state
   of this Ready carries commit = snapshot.index. `must_sync` is True: the
   install must be durable before `messages_after_persist` (its
   acknowledgement) leave. `entries`, if any, follow snapshot.index.
1. Write `entries` to the log (truncating the stored log after
   `entries[0].index - 1` first, since they may replace a suffix) and write
   `hard_state` if not None. If `must_sync`, make both durable (fsync) now.
2. `messages` may be sent at once, even before step 1 completes.
3. `messages_after_persist` may be sent ONLY AFTER step 1 is durable: they
   acknowledge entries or grant votes, or belong to a term not yet on disk.
4. Apply `committed_entries` (dispatch to ConsumeQueues, answer clients). They
   are committed and durable locally.
5. Call `RaftNode.advance(ready)`. No new Ready is produced before that.

`Ready` and `SoftState` (like `HardState` and the messages) are values, not
`frozen=True` dataclasses only for the cost of a frozen `__init__` (see
`election.messages`): a leader builds a few of them per request.
"""

from __future__ import annotations

from dataclasses import dataclass

from dledger.entry import Entry, HardState
from dledger.storage import SnapshotMeta
from election.messages import Message
from election.roles import Role


@dataclass(slots=True, unsafe_hash=True)
class SoftState:
    """Volatile state the broker reacts to (role switch, routes); never persisted."""

    role: Role
    leader_id: int
    term: int


@dataclass(slots=True, unsafe_hash=True)
class Ready:
    """One batch of work for the driver; see the module docstring for the order."""

    # New hard state to write, or None if unchanged since the last Ready.
    hard_state: HardState | None
    # True when entries or a new term/vote must be fsynced before
    # messages_after_persist go out; False when only the commit index moved
    # (commit is a lazily persisted lower bound).
    must_sync: bool
    # Entries to append, possibly replacing a stored suffix from entries[0].index.
    entries: tuple[Entry, ...]
    # Sendable now.
    messages: tuple[Message, ...]
    # Sendable only after entries and hard_state are durable.
    messages_after_persist: tuple[Message, ...]
    # Newly committed entries to apply, in index order.
    committed_entries: tuple[Entry, ...]
    # Role/leader/term if changed since the last Ready, else None.
    soft_state: SoftState | None
    # A leader's snapshot this node restored: install it before anything else.
    snapshot: SnapshotMeta | None = None

    def is_empty(self) -> bool:
        return not (
            self.snapshot
            or self.hard_state
            or self.entries
            or self.messages
            or self.messages_after_persist
            or self.committed_entries
            or self.soft_state
        )
