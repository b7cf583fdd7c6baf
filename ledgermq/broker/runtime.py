"""The broker-runtime seam: what a broker needs of the Raft runtime it runs on.

`dledger.runtime.node.RaftGroupNode` satisfies both Protocols (the class is
the default `RuntimeFactory`); a test can pass its own factory to `Broker`.
The runtime's errors are part of the contract: `propose` raises
`dledger.runtime.node.NotLeaderError` when this node cannot take the entry
and `ProposalUnknown` when its outcome cannot be known.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Protocol

from commitlog import CommitLog, Entry
from dledger.membership import Membership
from dledger.runtime.node import (
    ApplyRest,
    Completion,
    NodeConfig,
    NodeCounters,
    NodeObserver,
    NodeStatus,
    SoftStateInfo,
)


class RaftRuntime(Protocol):
    """One replica of the broker's group, whose log is the CommitLog."""

    @property
    def log(self) -> CommitLog:
        """The replicated CommitLog (open, and recovered, before `start`)."""

    @property
    def failed(self) -> BaseException | None:
        """Why this replica stopped taking part, or None."""

    @property
    def counters(self) -> NodeCounters: ...

    @property
    def role(self) -> str:
        """"leader", "follower", "candidate" or "pre_candidate"."""

    @property
    def term(self) -> int: ...

    @property
    def leader_id(self) -> int:
        """The known leader's node id (0: none)."""

    @property
    def leader_ready(self) -> bool:
        """Leads, and its current-term entry is applied: it can serve writes."""

    @property
    def last_index(self) -> int: ...

    @property
    def commit_index(self) -> int: ...

    def status(self) -> NodeStatus: ...

    async def start(self, applied_index: int) -> None:
        """Start replicating; committed entries after `applied_index` go to `apply`."""

    async def stop(self) -> None: ...

    async def propose(self, kind: int, body: bytes, timeout: float = 3.0) -> Entry:
        """Append an entry as leader; return it (with its index and position)
        once the configured guarantee (`replicate`, `flush`) holds."""

    def propose_nowait(self, kind: int, body: bytes,
                       timeout: float = 3.0) -> asyncio.Future[Entry]:
        """`propose` as a future: what it raises at once is raised here, the
        entry or the later error comes in the future."""

    def propose_then(self, kind: int, body: bytes, then: Completion,
                     timeout: float = 3.0) -> None:
        """`propose` for the per-message path: what it raises at once is
        raised here, the outcome goes to `then(entry, error)`, called once
        from the node's loop when no Ready is being carried out (maybe before
        this returns)."""

    async def wait_leader_ready(self, timeout: float) -> bool: ...

    async def wait_durable(self, index: int) -> None: ...

    async def transfer_leadership(self, to: int, timeout: float = 3.0) -> bool: ...

    @property
    def node_id(self) -> int: ...

    @property
    def directory_id(self) -> int:
        """The id of this replica's data directory (identity pinning)."""

    @property
    def membership(self) -> Membership:
        """The group's configuration in effect (docs/raft.md, "Membership changes")."""

    def membership_at(self, index: int) -> Membership:
        """The configuration in effect at log index `index` (for snapshots);
        LookupError if no longer known (an install of a later snapshot pending)."""

    async def change_membership(self, new: Membership, timeout: float = 10.0) -> int:
        """Propose `new` as the next configuration (leader only); the index of
        its CONFIG entry once committed. Raises `dledger.MembershipChangeRefused`,
        NotLeaderError, ProposalUnknown or TimeoutError."""


class RuntimeFactory(Protocol):
    """Builds the runtime of one replica (`RaftGroupNode` by default)."""

    def __call__(
        self,
        config: NodeConfig,
        apply: Callable[[Sequence[Entry]], ApplyRest | None],
        *,
        on_soft_state: Callable[[SoftStateInfo], None],
        on_failure: Callable[[BaseException], None],
        observer: NodeObserver,
    ) -> RaftRuntime: ...
