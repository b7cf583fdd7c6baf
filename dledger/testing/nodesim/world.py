"""The simulated world as the modules that check or steer it see it.

`durability`, `figure8`, `nemesis` and `checks` read and change the state of
a run through `World`, a `Protocol` that `harness.Harness` satisfies, and the
two records it holds per node and per client write (`Slot`, `Proposal`). They
never import `harness`, which imports `durability`: the import graph stays a
tree (harness -> durability -> world, run -> nemesis -> figure8 -> world).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from dledger.messages import Message
from dledger.runtime.node import RaftGroupNode
from dledger.testing.nodesim.apply import Applier
from dledger.testing.nodesim.configs import ConfigBook
from dledger.testing.nodesim.network import SimNetwork
from dledger.testing.nodesim.simfs import SimFileSystem
from dledger.testing.nodesim.vtime import SimLoop, VirtualClock


@dataclass
class Slot:
    """One simulated node across its incarnations."""

    nid: int
    data_dir: str
    state: str = "down"  # up | down | diverged
    incarnation: int = 0
    loop: SimLoop | None = None
    node: RaftGroupNode | None = None
    applier: Applier | None = None
    faults_at_start: int = 0
    failure_seen: bool = False
    disk_mode: str = "normal"  # normal | slow
    # The id of the data directory the node holds now (membership runs: a
    # wipe gives it a new one; 0 elsewhere: identity not tracked).
    directory_id: int = 0
    # (index, term, digest) applied by each incarnation
    applied: dict[int, list[tuple[int, int, str]]] = field(default_factory=dict)
    # Incarnation -> how many of its `applied` records came before its last
    # snapshot install (which replaced the state they built).
    installed_after: dict[int, int] = field(default_factory=dict)


@dataclass
class Proposal:
    """One client write and what the client was told about it."""

    seq: int
    body: bytes
    node: int
    outcome: str = "pending"  # pending | acked | refused | unknown
    index: int = 0
    term: int = 0


class World(Protocol):
    """What of a run's `Harness` the checks, the nemesis and Figure 8 use."""

    # The simulated machinery.
    clock: VirtualClock
    fs: SimFileSystem
    net: SimNetwork
    nemesis_rng: random.Random
    slots: dict[int, Slot]
    # The run's mode and phase.
    flush: str
    healing: bool
    violation: str | None
    # Knobs the nemesis turns.
    leader_killer: bool
    stale_rate: float
    # A scripted scenario (figure8.py) runs: other faults hold off.
    scenario: bool
    on_send: Callable[[int, Sequence[Message]], None] | None
    counts: dict[str, int]
    # The client's writes.
    proposals: list[Proposal]
    by_digest: dict[str, Proposal]
    # Bookkeeping of the durability checks.
    committed_terms: dict[int, int]
    commit_checked: dict[int, int]
    claimed: dict[tuple[int, int], int]
    # Compaction (compaction.py): its random stream, the committed entries
    # some node deleted, index -> (term, body digest), the first record of
    # each, and each node's own records (since its last install or wipe).
    compact_rng: random.Random
    compacted: dict[int, tuple[int, str]]
    compacted_by: dict[int, dict[int, tuple[int, str]]]
    # Connection loss (connloss.py): its random stream.
    connloss_rng: random.Random
    # Membership (members.py): whether this run changes its group, the
    # configurations and identities seen (configs.py), the nodes whose
    # removal committed (they keep running), and the wiped nodes that wait
    # for their repair (rejoin, then promote).
    membership: bool
    configs: ConfigBook
    removed: set[int]
    repairs_pending: set[int]

    def trace(self, text: str) -> None: ...

    def fail(self, text: str) -> None: ...

    def watch(self) -> None: ...

    def leader(self) -> Slot | None: ...

    def propose(self, slot: Slot) -> None: ...

    def crash(self, slot: Slot) -> None: ...

    def restart(self, slot: Slot) -> None: ...

    def wipe(self, slot: Slot) -> None: ...

    def in_play(self) -> list[Slot]: ...

    def members(self) -> frozenset[int]: ...

    def check_snapshot_membership(self, slot: Slot, index: int, raw: bytes | None,
                                  what: str) -> None: ...
