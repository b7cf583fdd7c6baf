"""Membership changes in the core simulator: an operator changing the group under load.

`MembershipSim` does for a `SimCluster` what an operator (through the
broker's member commands) does for a real group: it runs *plans*, each a
list of single-server steps that the current leader is asked to carry out
one at a time with `RaftNode.propose_membership`:

- add a learner (a new node, started empty) and maybe promote it;
- promote a learner once it has caught up (the core refuses before);
- remove a learner or a voter (never below three voters; removing the
  leader transfers leadership to a caught-up voter first, as the core
  refuses to remove itself); the removed node keeps running and sending
  until the group is healed, then it is decommissioned (under flush=async,
  once the healed group's leader shows the removal stands: a crash may
  have taken it);
- replace a voter (add a learner, promote it, remove the old one);
- grow 3 -> 5 and shrink 5 -> 3 voters, one voter per step;
- wipe: a member loses its disk and restarts empty under a new data
  directory (`SimCluster.wipe`); after a while a repair plan rejoins it as a
  learner under its new directory id and promotes it once it caught up.

A step is declarative ("node 4 is a learner"): the driver compares it with
the leader's committed configuration, proposes the change that brings it
closer, and moves on once it is committed; a refusal (a change pending, a
learner not caught up, no leader) is retried on the next poll. Now and then
the driver proposes the next step while the previous one is still pending,
which a correct core refuses ("one change in flight") and the
`two_changes_at_once` bug accepts. A plan that makes no progress within its
deadline is abandoned (partitions may make it impossible), except repairs.

Wipes pick a member pinned in the committed configuration and in every
other voter's durable one, only while every
voter is pinned to the disk it has, never while another wiped node awaits
repair, and never while another running node holds no durable entry: a wipe is one
fault, and the group is built to survive one (docs/raft.md, "Identity":
with a majority of empty disks nothing can tell a wiped node from a fresh
one, and once a voter is pinned only pinned voters' votes count, so a wipe
next to a voter never pinned leaves no quorum to repair it). Every draw comes from the
run's membership rng, so seeds without membership changes replay as before.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from dledger.invariants import SafetyChecker
from dledger.membership import (
    Member,
    Membership,
    MembershipError,
    add_learner,
    promote,
    rejoin,
    remove,
)
from dledger.raw_node import MembershipChangeRefused, NotLeader, RaftNode
from dledger.testing.disk import SimDisk
from election.roles import Role

# Kinds of plan, drawn with these weights ("wipe" only where allowed).
OPS: tuple[tuple[str, int], ...] = (
    ("add_learner", 2),
    ("add_voter", 3),
    ("promote", 2),
    ("remove_learner", 1),
    ("remove_voter", 2),
    ("replace", 3),
    ("resize", 2),
    ("wipe", 3),
)
MIN_VOTERS = 3
MAX_VOTERS = 5
# Node ids a run may add on top of the bootstrap ones.
MAX_ADDED = 4
# A plan not done this long after it started (per step) is abandoned.
STEP_DEADLINE_UNITS = 1200


class MembershipHost(Protocol):
    """What `MembershipSim` needs of its cluster (`dledger.testing.cluster.SimCluster`)."""

    node_ids: list[int]
    nodes: dict[int, RaftNode | None]
    disks: dict[int, SimDisk]
    directory: dict[int, int]
    checker: SafetyChecker
    stopped: dict[int, str]
    decommissioned: set[int]
    paused_until: dict[int, int]
    now: int
    faults_active: bool
    flush_async: bool

    def log(self, text: str) -> None: ...

    def call_at(self, at: int, action: Callable[[], None]) -> None: ...

    def after_step(self, n: int) -> None: ...

    def add_node(self, n: int) -> None: ...

    def wipe(self, n: int) -> None: ...

    def decommission(self, n: int) -> None: ...

    def alive(self) -> list[RaftNode]: ...


@dataclass(frozen=True, slots=True)
class Step:
    """One target state of one node: "learner", "voter", "gone" or "rejoined"."""

    kind: str
    node: int
    pinned: bool = True  # add_learner: add with its directory id (else unpinned)

    def describe(self) -> str:
        return f"{self.kind} {self.node}"


@dataclass
class Plan:
    name: str
    steps: list[Step]
    repair: bool = False
    pos: int = 0
    deadline: int = 0
    not_before: int = 0

    @property
    def step(self) -> Step:
        return self.steps[self.pos]


@dataclass
class MembershipStats:
    plans: Counter[str] = field(default_factory=Counter)
    plans_done: int = 0
    plans_abandoned: int = 0
    proposed: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    impatient: int = 0
    transfers: int = 0
    nodes_added: int = 0
    removed: int = 0
    repairs_done: int = 0


class _Abort(Exception):
    """The plan cannot go on (its node is gone, or the step makes no sense any more)."""


class MembershipSim:
    """Random membership plans and wipes for one `SimCluster` (see the module docstring)."""

    def __init__(self, cluster: MembershipHost, rng: random.Random, enabled: bool,
                 bootstrap_nodes: int) -> None:
        self.cluster = cluster
        self.rng = rng
        self.enabled = enabled
        self.stats = MembershipStats()
        self.queue: list[Plan] = []
        self.plan: Plan | None = None
        # Nodes whose removal committed: they keep running until the heal.
        self.removed: set[int] = set()
        # flush=async: removed nodes kept running at the heal until the healed
        # group's leader shows whether their removal stands.
        self.undecided: set[int] = set()
        # Wiped nodes not yet repaired (rejoined and promoted, or removed).
        self.awaiting_repair: set[int] = set()
        self._next_id = bootstrap_nodes + 1
        self._max_id = bootstrap_nodes + MAX_ADDED
        self.random_ops = True
        self.healed = False
        if enabled:
            self.every_units = rng.choice((150, 300, 600))
            self.poll_units = rng.choice((20, 50))
            self.impatience = rng.choice((0.0, 0.1, 0.3))
            self.repair_delay = rng.choice(((0, 50), (50, 400), (300, 900)))
            self.wipe_weight = rng.choice((0, 3, 6))

    # ---------------------------------------------------------------- phases

    def start(self, until: int) -> None:
        """Schedule random plans up to time `until` and start the driver."""
        if not self.enabled:
            return
        t = 0
        while True:
            t += self.rng.randint(self.every_units // 2, self.every_units * 3 // 2)
            if t >= until:
                break
            self.cluster.call_at(t, self._new_plan)
        self.cluster.call_at(self.rng.randint(1, self.poll_units), self._poll)

    def heal(self) -> None:
        """The liveness phase: no new plans; the plans begun or queued finish (or
        hit their deadline) on the healed group; removed nodes are decommissioned,
        now and as later plans remove them."""
        self.random_ops = False
        self.healed = True
        if self.cluster.flush_async:
            # flush=async lets a crash take acknowledged entries, a removal's
            # CONFIG entry among them: the group may then commit a
            # configuration that lists the node again, and decommissioning it
            # would take a voter the group needs (seed 2098137257, 5 nodes: a
            # removed voter elected leader later; seed 90121: the only quorum
            # left needed a removed node). No node's view at the heal tells
            # which removals stand (the one that knows most may itself have
            # lost committed entries), so the healed group's leader decides:
            # see `_settle_removals`. Under flush=sync a committed removal stays.
            self.undecided = set(self.removed)
            return
        for n in sorted(self.removed):
            self.cluster.decommission(n)

    def _settle_removals(self) -> None:
        """flush=async, after the heal: once a leader has committed an entry of
        its own term (so its committed configuration is the one every later
        leader starts from) and has no change pending, a removed node it still
        lists stays a member and the others are decommissioned."""
        leader = self._leader()
        if (leader is None or leader.membership_pending
                or leader.log.term(leader.commit) != leader.term):
            return
        config = leader.committed_membership
        for n in sorted(self.undecided):
            if n in config.node_ids:
                self.removed.discard(n)
                self.cluster.log(f"membership: removal of {n} lost, {n} stays a member")
            else:
                self.cluster.decommission(n)
        self.undecided.clear()

    def settled(self) -> bool:
        """No plan running or queued, every wiped node repaired and every
        removal decided (flush=async, `_settle_removals`)."""
        return (self.plan is None and not self.queue and not self.awaiting_repair
                and not self.undecided)

    # ----------------------------------------------------------------- plans

    def _new_plan(self) -> None:
        if not self.random_ops or self.plan is not None or self.queue:
            return
        leader = self._leader()
        if leader is None:
            return
        current = leader.committed_membership
        voters = sorted(current.voter_ids)
        learners = sorted(current.learner_ids)
        room = self._max_id - self._next_id + 1
        weights = dict(OPS)
        weights["wipe"] = self.wipe_weight
        choices: list[str] = []
        for op, weight in weights.items():
            if weight and self._possible(op, voters, learners, room, current):
                choices += [op] * weight
        if not choices:
            return
        op = self.rng.choice(choices)
        plan = self._plan_for(op, voters, learners, leader)
        if plan is not None:
            self._enqueue(plan)

    def _possible(self, op: str, voters: list[int], learners: list[int], room: int,
                  current: Membership) -> bool:
        if op == "add_learner":
            return room >= 1
        if op == "add_voter":
            return room >= 1 and len(voters) < MAX_VOTERS
        if op in ("promote", "remove_learner"):
            return bool(learners) and (op != "promote" or len(voters) < MAX_VOTERS)
        if op == "remove_voter":
            return len(voters) > MIN_VOTERS
        if op == "replace":
            return room >= 1 and len(voters) < MAX_VOTERS + 1
        if op == "resize":
            return (len(voters) <= MIN_VOTERS and room >= 2) or len(voters) > MIN_VOTERS
        return self._wipe_target(current) is not None

    def _plan_for(self, op: str, voters: list[int], learners: list[int],
                  leader: RaftNode) -> Plan | None:
        rng = self.rng
        if op == "add_learner":
            return Plan(op, [Step("learner", self._new_node_id(), rng.random() < 0.7)])
        if op == "add_voter":
            n = self._new_node_id()
            return Plan(op, [Step("learner", n, rng.random() < 0.7), Step("voter", n)])
        if op == "promote":
            return Plan(op, [Step("voter", rng.choice(learners))])
        if op == "remove_learner":
            return Plan(op, [Step("gone", rng.choice(learners))])
        if op == "remove_voter":
            return Plan(op, [Step("gone", rng.choice(voters))])
        if op == "replace":
            n = self._new_node_id()
            old = rng.choice(voters)
            return Plan(op, [Step("learner", n, rng.random() < 0.7), Step("voter", n),
                             Step("gone", old)])
        if op == "resize":
            if len(voters) <= MIN_VOTERS:
                a, b = self._new_node_id(), self._new_node_id()
                return Plan("grow", [Step("learner", a), Step("voter", a),
                                     Step("learner", b), Step("voter", b)])
            out = rng.sample(voters, len(voters) - MIN_VOTERS)
            return Plan("shrink", [Step("gone", n) for n in out])
        target = self._wipe_target(leader.committed_membership)
        if target is None:
            return None
        self.cluster.wipe(target)
        self.awaiting_repair.add(target)
        steps = [Step("rejoined", target)]
        if target in voters:
            steps.append(Step("voter", target))
        low, high = self.repair_delay
        plan = Plan(f"repair {target}", steps, repair=True,
                    not_before=self.cluster.now + self.rng.randint(low, high))
        self.queue.insert(0, plan)
        self.stats.plans["wipe"] += 1
        return None

    def _new_node_id(self) -> int:
        n = self._next_id
        self._next_id += 1
        return n

    def _wipe_target(self, current: Membership) -> int | None:
        cluster = self.cluster
        if self.awaiting_repair:
            return None
        for m in current.voters:
            if m.node_id in cluster.stopped or m.directory_id != cluster.directory.get(m.node_id):
                return None  # a voter not pinned (to the disk it has) counts for nothing
        for n in cluster.node_ids:
            if (n not in cluster.stopped and n not in cluster.decommissioned
                    and cluster.disks[n].durable_last() == (0, 0)):
                # An empty disk next to a wiped one: two nodes that look like
                # a fresh group to each other (even a removed node whose
                # stale configuration lists them both).
                return None
        # A voter only while the others are a quorum without it: a wiped
        # voter counts for nothing until repaired, and its repair needs a
        # leader (a shrink planned while a removal was still pending had
        # left two voters, and wiping one of them no group can survive;
        # seed 20204655, 5 nodes).
        spare_voter = len(current.voters) - 1 >= len(current.voters) // 2 + 1
        pinned = [m.node_id for m in current.voters + current.learners
                  if m.directory_id and m.directory_id == cluster.directory.get(m.node_id)
                  and m.node_id not in cluster.stopped
                  and (spare_voter or m.node_id not in current.voter_ids)
                  and self._pinned_on_every_voters_disk(current, m.node_id)]
        return self.rng.choice(sorted(pinned)) if pinned else None

    def _pinned_on_every_voters_disk(self, current: Membership, target: int) -> bool:
        """Every other voter's durable configuration pins `target` to the
        disk it has. A voter whose log lacks the pin (it fell behind, and
        may restart from that log) counts by a configuration in which the
        target is unpinned: it would count the wiped node's vote (seed
        402896190: a stale node elected with the vote of the leader just
        wiped, while the pins were committed only on the others)."""
        cluster = self.cluster
        for voter in current.voter_ids - {target}:
            seen = cluster.disks[voter].durable_membership()
            member = None if seen is None else seen.member(target)
            if member is None or member.directory_id != cluster.directory.get(target):
                return False
        return True

    def _enqueue(self, plan: Plan) -> None:
        self.stats.plans[plan.name] += 1
        self.queue.append(plan)
        self.cluster.log(f"membership plan {plan.name}: "
                         + ", ".join(s.describe() for s in plan.steps))

    def _abandon(self, why: str) -> None:
        assert self.plan is not None
        self.cluster.log(f"membership plan {self.plan.name} abandoned: {why}")
        self.stats.plans_abandoned += 1
        self.plan = None

    # ---------------------------------------------------------------- driver

    def _poll(self) -> None:
        self._drive()
        self.cluster.call_at(self.cluster.now + self.rng.randint(1, 2 * self.poll_units),
                             self._poll)

    def _drive(self) -> None:
        cluster = self.cluster
        if self.undecided:
            self._settle_removals()
        if self.plan is None:
            if not self.queue or self.queue[0].not_before > cluster.now:
                return
            self.plan = self.queue.pop(0)
            self.plan.deadline = cluster.now + STEP_DEADLINE_UNITS * len(self.plan.steps)
        plan = self.plan
        if plan.repair and plan.steps[0].node in cluster.stopped:
            # The wiped node went on to stop for good (flush=async: it found
            # its committed log contradicted; seeds 19003225, 19004198): it
            # never comes back to be rejoined here, and waiting for it kept
            # the group from counting as settled.
            self.awaiting_repair.discard(plan.steps[0].node)
            self._abandon("the node stopped for good (lost committed data)")
            return
        leader = self._leader()
        if leader is None:
            self._check_deadline(plan)
            return
        committed = leader.committed_membership
        try:
            while self._done(plan.step, committed):
                self._step_done(plan, plan.step)
                plan.pos += 1
                if plan.pos == len(plan.steps):
                    self._plan_done(plan)
                    return
            if leader.membership_pending:
                if self.rng.random() >= self.impatience:
                    self._check_deadline(plan)
                    return
                self.stats.impatient += 1
            step = plan.step
            if self._done(step, leader.membership):
                # Pending, and the pending entry is this step: propose the next.
                if plan.pos + 1 == len(plan.steps):
                    return
                step = plan.steps[plan.pos + 1]
            self._propose(leader, step)
        except _Abort as exc:
            if plan.repair:
                self.awaiting_repair.discard(plan.steps[0].node)
            self._abandon(str(exc))
            return
        self._check_deadline(plan)

    def _check_deadline(self, plan: Plan) -> None:
        if self.plan is plan and not plan.repair and self.cluster.now > plan.deadline:
            self._abandon("deadline")

    def _plan_done(self, plan: Plan) -> None:
        self.cluster.log(f"membership plan {plan.name} done")
        self.stats.plans_done += 1
        if plan.repair:
            self.stats.repairs_done += 1
            self.awaiting_repair.discard(plan.steps[0].node)
        self.plan = None

    def _step_done(self, plan: Plan, step: Step) -> None:
        if step.kind == "gone":
            self.removed.add(step.node)
            self.stats.removed += 1
            self.awaiting_repair.discard(step.node)
            if self.healed:
                self.cluster.decommission(step.node)

    def _done(self, step: Step, config: Membership) -> bool:
        n = step.node
        if step.kind == "learner":
            return n in config.node_ids
        if step.kind == "voter":
            return n in config.voter_ids
        if step.kind == "gone":
            return n not in config.node_ids
        member = config.member(n)
        return member is not None and member.directory_id == self.cluster.directory[n]

    def _target(self, step: Step, current: Membership) -> Membership:
        """The configuration one change closer to `step` than `current`."""
        n = step.node
        cluster = self.cluster
        try:
            if step.kind == "learner":
                if n not in cluster.directory:
                    cluster.add_node(n)
                    self.stats.nodes_added += 1
                directory = cluster.directory[n] if step.pinned else 0
                return add_learner(current, Member(n, "", directory))
            if step.kind == "voter":
                if n not in current.learner_ids:
                    raise _Abort(f"node {n} is not a learner")
                return promote(current, n)
            if step.kind == "gone":
                return remove(current, n)
            return rejoin(current, n, cluster.directory[n])
        except MembershipError as exc:
            raise _Abort(str(exc)) from None

    def _propose(self, leader: RaftNode, step: Step) -> None:
        cluster = self.cluster
        if step.kind == "gone" and step.node == leader.id:
            # The core refuses to remove itself: hand leadership over first.
            others = sorted(leader.membership.voter_ids - {leader.id})
            if not others:
                raise _Abort("the leader is the only voter")
            if leader.transfer_leadership(self.rng.choice(others)):
                self.stats.transfers += 1
                cluster.log(f"membership: transfer leadership away from {leader.id}")
                cluster.after_step(leader.id)
            return
        new = self._target(step, leader.membership)
        try:
            index, term = leader.propose_membership(new)
        except NotLeader:
            self.stats.refused["not leader"] += 1
            return
        except MembershipChangeRefused as exc:
            self.stats.refused[exc.reason.split(" (")[0].split(":")[0]] += 1
            return
        self.stats.proposed += 1
        cluster.log(f"membership: leader {leader.id} proposed {step.describe()} at "
                    f"{index}/{term}: voters {sorted(new.voter_ids)} "
                    f"learners {sorted(new.learner_ids)}")
        cluster.after_step(leader.id)

    def _leader(self) -> RaftNode | None:
        cluster = self.cluster
        leaders = [n for n in cluster.alive()
                   if n.role is Role.LEADER and cluster.now >= cluster.paused_until[n.id]]
        return max(leaders, key=lambda n: n.term) if leaders else None
