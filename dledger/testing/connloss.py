"""Leader-connection notices in the core simulator (`RaftNode.leader_unreachable`).

The runtime tells a follower's core that its leader is unreachable when it
sees every connection to and from the leader close and stay closed for a
grace of a tick or two: the kernel closes a killed process's sockets at
once. The notice only makes an election start sooner, so nothing of safety
may rest on it being true, and `ConnectionLossSim` gives the core both kinds:

- *real*: when a node crashes, each live follower of it is told after a
  grace of 1-3 of its ticks plus up to one more, unless the node is back
  by then (its connections would be too). Only a share of crashes close
  the connections (drawn per seed: a killed process closes them, a machine
  that lost power does not, and the followers then wait out their timeouts);
- *wrong*: during the fault phase, every few hundred units a follower is
  told that its live leader is unreachable: one follower alone (a reset of
  its own connections, a lying transport), or in a share of the notices
  every follower of that leader at once (a blip at the leader's side), which
  may elect another leader (disruption, which is allowed).

Every draw comes from the run's own connection-loss rng, so a seed without
it replays exactly as before it existed. A paused node gets its notice when
it resumes; a scenario (Figure 8, FarBehind) holds off the wrong notices, as
it holds off the random nemesis.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import partial
from typing import Protocol

from dledger.raw_node import RaftNode
from election.roles import Role


class NoticeHost(Protocol):
    """What `ConnectionLossSim` needs of its cluster (`SimCluster`)."""

    node_ids: list[int]
    nodes: dict[int, RaftNode | None]
    now: int
    faults_active: bool
    scenario_active: bool
    paused_until: dict[int, int]
    tick_period: dict[int, int]

    def log(self, text: str) -> None: ...

    def call_at(self, at: int, action: Callable[[], None]) -> None: ...

    def after_step(self, n: int) -> None: ...


class ConnectionLossSim:
    """Tells followers their leader is unreachable, truly or not (module doc)."""

    def __init__(self, host: NoticeHost, rng: random.Random, enabled: bool) -> None:
        self.host = host
        self.rng = rng
        self.enabled = enabled
        # Per seed: how often a crash closes the connections, the runtime's
        # grace in ticks, the mean gap between wrong notices (0: none) and the
        # share of them that reach every follower of the leader at once.
        self.close_probability = rng.choice((0.5, 0.9, 1.0))
        self.grace_ticks = rng.randint(1, 3)
        self.wrong_every = rng.choice((0, 150, 400, 1000))
        self.fanout = rng.choice((0.0, 0.2, 0.5))
        self.notices = 0  # delivered to a live node
        self.taken = 0  # of them, taken by the core (an early election was due)
        self.wrong = 0  # of them, wrong (the leader was up)

    def start(self, fault_units: int) -> None:
        """Schedule the wrong notices of the fault phase."""
        if not self.enabled or not self.wrong_every:
            return
        t = 0
        every = self.wrong_every
        while True:
            t += self.rng.randint(every // 2, every * 3 // 2)
            if t >= fault_units:
                return
            self.host.call_at(t, self._wrong_notice)

    def crashed(self, n: int) -> None:
        """Node `n`'s process died: its followers see its connections close."""
        if not self.enabled or self.rng.random() >= self.close_probability:
            return
        host = self.host
        for f, node in host.nodes.items():
            if node is None or f == n or node.leader_id != n:
                continue
            period = host.tick_period[f]
            delay = self.grace_ticks * period + self.rng.randint(1, period)
            host.call_at(host.now + delay, partial(self._deliver, f, n, True))

    def _wrong_notice(self) -> None:
        host = self.host
        if not host.faults_active or host.scenario_active:
            return
        leaders = [n for n, node in host.nodes.items() if node is not None
                   and node.role is Role.LEADER]
        followers = [n for n, node in host.nodes.items() if node is not None
                     and node.role is Role.FOLLOWER and node.leader_id in leaders]
        if not followers:
            return
        chosen = self.rng.choice(followers)
        leader = self._node(chosen).leader_id
        if self.rng.random() < self.fanout:
            targets = [f for f in followers if self._node(f).leader_id == leader]
        else:
            targets = [chosen]
        for f in targets:
            self._deliver(f, leader, real=False)

    def _node(self, n: int) -> RaftNode:
        node = self.host.nodes[n]
        assert node is not None
        return node

    def _deliver(self, f: int, leader: int, real: bool) -> None:
        host = self.host
        node = host.nodes[f]
        if node is None:
            return  # the follower died meanwhile
        if real and host.nodes[leader] is not None:
            return  # the leader restarted within the grace: its connections are back
        if host.now < host.paused_until[f]:
            host.call_at(host.paused_until[f], partial(self._deliver, f, leader, real))
            return
        taken = node.leader_unreachable(leader)
        self.notices += 1
        self.taken += taken
        self.wrong += not real
        host.log(f"notice {f}: leader {leader} unreachable ({'real' if real else 'wrong'}, "
                 f"{'taken' if taken else 'ignored'})")
        host.after_step(f)
