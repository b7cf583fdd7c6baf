"""Scenario nemeses: fault schedules steered by the cluster's state, not drawn blind.

Random partitions and crashes reach the Figure-8 schedule of the Raft paper
(§5.4.2) rarely: it needs an entry stranded on a minority, a later leader
stranded alone with a conflicting entry at the same index, and the first
side winning again and spreading the old entry. `Figure8` drives exactly
that, reacting to elections as they happen:

1. a leader A (term U) is cut off with a minority (A alone on 3 nodes, A and
   one peer on 5) and gets client writes: entry X at index i exists only there;
2. the majority elects Z (term V > U); Z is cut off alone the moment it
   wins, before its NOOP leaves, and gets a write: Z holds (i, V);
3. everyone but Z is joined: only a node holding X can win (its log is more
   up to date), and as leader of term T > V it replicates X. Correct Raft
   commits X only through an entry of term T; a leader that counts replicas
   of X commits it while Z, whose last term V beats X's, could still win;
4. after a while the network heals and the run continues.

Each step waits for its election up to a deadline; a step that times out
(the cluster took another path) heals the network and ends the scenario, so
it never wedges a run. The random nemesis and the leader killer hold off
while a scenario runs. Every choice comes from the cluster's seeded rng.

`FarBehind` (runs with compaction only) cuts a follower off, lets the others
write and compact past its log end, then heals: the follower can only catch
up by installing a snapshot.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from dledger.testing.cluster import SimCluster
from election.roles import Role

POLL_UNITS = 10
STEP_DEADLINE_UNITS = 900


def _begin(cluster: SimCluster, name: str) -> bool:
    """Take `cluster` for scenario `name`, from a whole group (every step
    needs elections to succeed): False when one already runs or faults are off."""
    if cluster.scenario_active or not cluster.faults_active:
        return False
    cluster.scenario_active = True
    cluster.network.heal()
    for n in cluster.running_ids():
        cluster.restart(n)
    cluster.log(f"scenario {name}: begin")
    return True


class Figure8:
    """One run of the Figure-8 schedule on `cluster`; `start()` begins it."""

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        self.side_a: set[int] = set()
        self.z = 0
        self.term_z = 0
        self.writes = 0

    def start(self) -> None:
        if _begin(self.cluster, "figure8"):
            self._wait(self._leader_a, self._strand_a)

    # -- steps

    def _leader_a(self) -> int | None:
        leaders = [n.id for n in self.cluster.alive() if n.role is Role.LEADER]
        return leaders[0] if len(leaders) == 1 else None

    def _strand_a(self, a: int) -> None:
        cluster = self.cluster
        ids = cluster.node_ids
        others = [n for n in ids if n != a]
        partners = cluster.rng.sample(others, len(ids) // 2 - 1)
        self.side_a = {a, *partners}
        rest = set(ids) - self.side_a
        cluster.network.groups([self.side_a, rest])
        cluster.log(f"scenario figure8: strand leader {a} with {sorted(self.side_a)}")
        for _ in range(cluster.rng.randint(1, 2)):
            self._write(a)
        node_a = cluster.nodes[a]
        assert node_a is not None, "the stranded leader is up: it was just chosen as leader"
        term_a = node_a.term
        cluster.on_new_leader = lambda n: self._on_leader_z(n, term_a, rest)
        self._wait(lambda: self.z or None, self._after_z)

    def _on_leader_z(self, n: int, term_a: int, rest: set[int]) -> None:
        node = self.cluster.nodes[n]
        if n in rest and node is not None and node.term > term_a and not self.z:
            # Cut Z off before the NOOP of its election leaves.
            self.z, self.term_z = n, node.term
            self.cluster.network.groups([self.side_a, {n}, rest - {n}])
            self.cluster.on_new_leader = None
            self.cluster.log(f"scenario figure8: strand new leader {n} alone")

    def _after_z(self, z: int) -> None:
        cluster = self.cluster
        self._write(z)
        others = set(cluster.node_ids) - {z}
        cluster.network.groups([others, {z}])
        cluster.log(f"scenario figure8: join {sorted(others)}")
        self._wait(lambda: self._leader_above(others), self._spread)

    def _leader_above(self, group: set[int]) -> int | None:
        for node in self.cluster.alive():
            if node.id in group and node.role is Role.LEADER and node.term > self.term_z:
                return node.id
        return None

    def _spread(self, leader: int) -> None:
        cluster = self.cluster
        cluster.log(f"scenario figure8: leader {leader} spreads the old entry")
        self._write(leader)
        cluster.call_at(cluster.now + cluster.rng.randint(100, 300), self._end)

    def _end(self) -> None:
        cluster = self.cluster
        cluster.on_new_leader = None
        cluster.network.heal()
        cluster.scenario_active = False
        cluster.log("scenario figure8: end, network healed")

    # -- helpers

    def _write(self, node_id: int) -> None:
        self.writes += 1
        self.cluster.propose(f"f8-{self.writes}".encode(), to=node_id)

    def _wait(self, ready: Callable[[], int | None], then: Callable[[int], None]) -> None:
        deadline = self.cluster.now + STEP_DEADLINE_UNITS

        def poll() -> None:
            if not self.cluster.faults_active:
                self._end()
                return
            found = ready()
            if found:
                then(found)
            elif self.cluster.now >= deadline:
                self.cluster.log("scenario figure8: step timed out")
                self._end()
            else:
                self.cluster.call_at(self.cluster.now + POLL_UNITS, poll)

        self.cluster.call_at(self.cluster.now + POLL_UNITS, poll)


class FarBehind:
    """A follower falls behind the others' compacted logs and must install a snapshot.

    1. once there is a leader L, one follower F is cut off alone;
    2. L gets a few client writes, which commit on the rest;
    3. every node but F compacts right up to what it applied, so nothing
       after F's log end is left in any log but F's;
    4. the network heals: L can only catch F up with a snapshot.

    Like `Figure8` it holds off the random nemesis while it runs and ends
    (healing the network) when a step times out. Its choices come from the
    compaction rng (`dledger.testing.compaction`).
    """

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        self.rng = cluster.snapshots.rng
        self.victim = 0
        self.writes = 0

    def start(self) -> None:
        if _begin(self.cluster, "far-behind"):
            _poll(self.cluster, self._leader, self._cut_off, self._end)

    def _leader(self) -> int | None:
        leaders = [n.id for n in self.cluster.alive() if n.role is Role.LEADER]
        return leaders[0] if len(leaders) == 1 else None

    def _cut_off(self, leader: int) -> None:
        cluster = self.cluster
        self.victim = self.rng.choice([n for n in cluster.node_ids if n != leader])
        cluster.network.split({self.victim})
        cluster.log(f"scenario far-behind: cut off {self.victim}")
        for k in range(self.rng.randint(2, 8)):
            self.writes += 1
            data = f"fb-{self.writes}".encode()
            cluster.call_at(cluster.now + 10 * (k + 1), partial(cluster.propose, data, leader))
        cluster.call_at(cluster.now + self.rng.randint(150, 400), self._compact_and_heal)

    def _compact_and_heal(self) -> None:
        cluster = self.cluster
        for n in cluster.node_ids:
            if n != self.victim:
                cluster.snapshots.compact(n, to_applied=True)
        cluster.network.heal()
        cluster.log(f"scenario far-behind: others compacted, {self.victim} rejoins")
        cluster.call_at(cluster.now + self.rng.randint(200, 500), self._end)

    def _end(self) -> None:
        cluster = self.cluster
        cluster.network.heal()
        cluster.scenario_active = False
        cluster.log("scenario far-behind: end")


def _poll(cluster: SimCluster, ready: Callable[[], int | None], then: Callable[[int], None],
          give_up: Callable[[], None]) -> None:
    """Call `then(found)` once `ready()` finds something, or `give_up()` at the deadline."""
    deadline = cluster.now + STEP_DEADLINE_UNITS

    def poll() -> None:
        if not cluster.faults_active:
            give_up()
            return
        found = ready()
        if found:
            then(found)
        elif cluster.now >= deadline:
            cluster.log("scenario: step timed out")
            give_up()
        else:
            cluster.call_at(cluster.now + POLL_UNITS, poll)

    cluster.call_at(cluster.now + POLL_UNITS, poll)
