"""`SimNetwork`: delay, loss, duplication, reordering and partitions between simulated nodes.

Reordering comes from independent random delays. Partitions are sets of
blocked *directed* links, so one-way cuts are as easy as symmetric ones. The
control channel (heartbeats, votes) gets its own, shorter delay range, which
is how a real driver keeps heartbeats from queueing behind bulk appends.
The delay ranges and the long-delay tail come from the run's
`dledger.testing.faults.FaultProfile`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from dledger.messages import CHANNEL_CONTROL, Message


@dataclass
class NetworkFaults:
    """Fault rates in force; the simulator changes them between phases."""

    loss: float = 0.0
    duplication: float = 0.0
    delay_control: tuple[int, int] = (1, 4)
    delay_replication: tuple[int, int] = (1, 10)
    # A share of messages takes far longer (past an election timeout).
    long_delay_probability: float = 0.0
    long_delay_units: tuple[int, int] = (100, 400)


class SimNetwork:
    """Decides when (if ever) each sent message arrives."""

    def __init__(self, rng: random.Random, node_ids: list[int]) -> None:
        self._rng = rng
        self.node_ids = node_ids
        self.faults = NetworkFaults()
        # Directed links (src, dst) that currently drop everything.
        self.blocked: set[tuple[int, int]] = set()
        self.shape = "healed"
        self.sent = 0
        self.dropped = 0

    def arrivals(self, msg: Message, now: int) -> list[int]:
        """Delivery times for `msg` sent at `now`: none if lost, two if duplicated."""
        self.sent += 1
        if (msg.src, msg.dst) in self.blocked or self._rng.random() < self.faults.loss:
            self.dropped += 1
            return []
        low, high = (
            self.faults.delay_control
            if msg.channel == CHANNEL_CONTROL
            else self.faults.delay_replication
        )
        times = [now + self._delay(low, high)]
        if self._rng.random() < self.faults.duplication:
            times.append(now + self._delay(low, high * 3))
        return times

    def _delay(self, low: int, high: int) -> int:
        faults = self.faults
        if faults.long_delay_probability and self._rng.random() < faults.long_delay_probability:
            return self._rng.randint(*faults.long_delay_units)
        return self._rng.randint(low, high)

    def can_reach(self, src: int, dst: int) -> bool:
        return (src, dst) not in self.blocked

    # -- partition shapes
    def heal(self) -> None:
        self.blocked = set()
        self.shape = "healed"

    def split(self, side: set[int]) -> None:
        """Symmetric cut between `side` and everyone else."""
        self.blocked = {
            (a, b) for a in self.node_ids for b in self.node_ids if (a in side) != (b in side)
        }
        self.shape = f"split {sorted(side)}|{sorted(set(self.node_ids) - side)}"

    def one_way(self, src: int, dsts: list[int]) -> None:
        """Messages from `src` to `dsts` are lost; the reverse direction still works."""
        self.blocked = {(src, d) for d in dsts}
        self.shape = f"one-way {src}->{dsts}"

    def bridge(self, middle: int) -> None:
        """Two halves that only `middle` can talk to (Jepsen's bridge)."""
        others = [n for n in self.node_ids if n != middle]
        left = set(others[: len(others) // 2])
        right = set(others[len(others) // 2 :])
        self.blocked = {(a, b) for a in left for b in right} | {(b, a) for a in left for b in right}
        self.shape = f"bridge via {middle}: {sorted(left)}|{sorted(right)}"

    def groups(self, groups: list[set[int]]) -> None:
        """Only nodes of the same group reach each other (a scenario's exact partition)."""
        side = {n: i for i, group in enumerate(groups) for n in group}
        self.blocked = {
            (a, b)
            for a in self.node_ids
            for b in self.node_ids
            if a != b and side.get(a, -1 - a) != side.get(b, -1 - b)
        }
        self.shape = "groups " + "|".join(str(sorted(g)) for g in groups)

    def ring(self) -> None:
        """Each node reaches only its ring neighbours (majorities ring for 5 nodes)."""
        n = len(self.node_ids)
        allowed = set()
        for i, a in enumerate(self.node_ids):
            for step in (-1, 0, 1):
                allowed.add((a, self.node_ids[(i + step) % n]))
        self.blocked = {
            (a, b) for a in self.node_ids for b in self.node_ids if (a, b) not in allowed
        }
        self.shape = "ring"
