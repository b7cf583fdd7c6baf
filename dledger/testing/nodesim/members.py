"""Membership changes in the real-node simulator: an operator changing the group under load.

`MembershipDriver` does to the simulated group what an operator does through
the broker's member commands: it runs *plans*, each a list of single-server
steps, and asks the current leader to carry out one at a time with
`RaftGroupNode.change_membership` (the runtime's API, on the leader's own
loop), while the client writes and the nemesis cuts power, partitions,
pauses and compacts:

- add a learner (a spare node, running as a non-member since the start),
  sometimes unpinned (the leader pins it once it hears from it);
- add a voter: add a learner, then promote it once it has caught up (the
  core refuses before; the driver retries on its next poll);
- promote a learner; remove a learner; remove a voter (never below three);
  removing the leader hands leadership to another voter first
  (`transfer_leadership`), as the core refuses to remove itself; a removed
  node keeps running and sending;
- replace a voter (add a learner, promote it, remove the old one);
- grow 3 -> 5 and shrink 5 -> 3 voters, one voter per step;
- wipe: a member loses its disk and restarts empty under a new directory id
  (`World.wipe`); a repair plan then rejoins it as a learner under its new
  id (`dledger.membership.rejoin`) and promotes it again if it was a voter.

A step is a target ("node 4 is a learner"): each poll compares it with the
leader's committed configuration, proposes the change that brings it one
step closer, and moves on once it is committed; a refusal (a change pending,
a learner not caught up, no leader) is retried. Now and then the driver
proposes the next step while the previous one is still pending, which the
core must refuse (one change in flight). A plan that makes no progress
within `PLAN_DEADLINE_S` is abandoned (partitions may make it impossible).
When the group is healed, ordinary plans stop and repairs go on: the run
converges only once every wiped node is repaired.

Wipes pick a member pinned to the disk it holds, and only while every voter
of the committed configuration is up, pinned to its disk, and holds that
configuration durably, every other bootstrap node is up with a durable
entry, no node outside those voters (a removed one still running) holds a
configuration in which the member is an unpinned voter, and no other wiped
node waits for its repair: a wipe is one fault,
and the group is built to survive one. With a majority of empty disks
nothing can tell a wiped node from a fresh one: an empty log reads as the
bootstrap configuration, whose voters then include the wiped node and any
other bootstrap node with an empty disk, removed or not (docs/raft.md,
"Identity"). No wipes under flush=async: there a power cut of a quorum may
take committed entries, which stops a node on the divergence for good, and
with a wiped voter besides, a three-voter group has no quorum left to repair
either. Every draw comes from the run's membership rng.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

from dledger.membership import (
    UNPINNED,
    Member,
    Membership,
    MembershipError,
    add_learner,
    promote,
    rejoin,
    remove,
)
from dledger.raw_node import MembershipChangeRefused
from dledger.runtime.node import NotLeaderError, ProposalUnknown, RaftGroupNode
from dledger.testing.nodesim.durability import durable, durable_last
from dledger.testing.nodesim.world import Slot, World

# Plan kinds and their weights ("wipe" weighs what the seed draws).
OPS: tuple[tuple[str, int], ...] = (
    ("add_learner", 2),
    ("add_voter", 3),
    ("promote", 2),
    ("remove_learner", 1),
    ("remove_voter", 2),
    ("replace", 3),
    ("resize", 3),
)
MIN_VOTERS = 3
MAX_VOTERS = 5
PLAN_DEADLINE_S = 4.0
# How long `change_membership` waits for its entry to commit.
CHANGE_TIMEOUT_S = 2.0
TRANSFER_TIMEOUT_S = 1.0


@dataclass(frozen=True, slots=True)
class Step:
    """One target state of one node: "learner", "voter", "gone" or "rejoined"."""

    kind: str
    node: int
    pinned: bool = True  # learner: added with its directory id (else unpinned)

    def describe(self) -> str:
        return f"{self.kind} n{self.node}"


@dataclass
class Plan:
    name: str
    steps: list[Step]
    repair: bool = False
    pos: int = 0
    deadline: float = 0.0
    not_before: float = 0.0
    transferred: set[int] = field(default_factory=set)

    @property
    def step(self) -> Step:
        return self.steps[self.pos]


@dataclass
class _Attempt:
    """A change (or transfer) running on a leader's loop."""

    slot: Slot
    incarnation: int
    deadline: float
    outcome: str = ""  # "" while running


class _Abort(Exception):
    """The plan cannot go on (its node is gone, or the step makes no sense any more)."""


class MembershipDriver:
    """Random membership plans and wipes for one run (see the module docstring)."""

    def __init__(self, h: World, rng: random.Random, bootstrap_nodes: int,
                 spares: int) -> None:
        self.h = h
        self.rng = rng
        self.queue: list[Plan] = []
        self.plan: Plan | None = None
        self.attempt: _Attempt | None = None
        self._next_id = bootstrap_nodes + 1
        self._max_id = bootstrap_nodes + spares
        self.every_s = rng.choice((0.4, 0.8, 1.5))
        self.poll_s = rng.choice((0.05, 0.15))
        self.impatience = rng.choice((0.0, 0.1, 0.3))
        self.repair_delay = rng.choice(((0.0, 0.2), (0.2, 1.5), (1.0, 3.0)))
        self.wipe_weight = rng.choice((0, 3, 6))
        h.trace(f"membership: a plan every ~{self.every_s} s, poll {self.poll_s} s, "
                f"impatience {self.impatience}, wipe weight {self.wipe_weight}, repair "
                f"delay {self.repair_delay}")

    # ---------------------------------------------------------------- phases

    async def run(self, until: float) -> None:
        """Plans until `until` (the end of the faults); repairs until the run ends."""
        h, rng = self.h, self.rng
        next_plan = h.clock.now + rng.uniform(0.2, self.every_s)
        healed = False
        while not h.violation:
            await asyncio.sleep(rng.uniform(self.poll_s / 2, self.poll_s * 1.5))
            if h.violation:
                return
            if h.healing and not healed:
                healed = True
                self._heal()
            if not healed and h.clock.now >= next_plan and h.clock.now < until - 0.5:
                next_plan = h.clock.now + rng.uniform(self.every_s / 2, self.every_s * 1.5)
                self._new_plan()
            self._drive()

    def _heal(self) -> None:
        """The liveness phase: ordinary plans are abandoned, repairs go on."""
        if self.plan is not None and not self.plan.repair:
            self._abandon("the group is healed")
        self.queue = [p for p in self.queue if p.repair]

    # ----------------------------------------------------------------- plans

    def _leader(self) -> tuple[Slot, RaftGroupNode] | None:
        slot = self.h.leader()
        if slot is None or slot.node is None or not slot.node.leader_ready:
            return None
        return slot, slot.node

    def _new_plan(self) -> None:
        if self.plan is not None or self.queue:
            return
        found = self._leader()
        if found is None:
            return
        leader = found[1]
        core = leader.core
        assert core is not None
        current = core.committed_membership
        voters = sorted(current.voter_ids - self.h.repairs_pending)
        learners = sorted(current.learner_ids - self.h.repairs_pending)
        room = self._max_id - self._next_id + 1
        choices: list[str] = []
        for op, weight in (*OPS, ("wipe", self.wipe_weight)):
            if weight and self._possible(op, voters, learners, room, current, leader):
                choices += [op] * weight
        if not choices:
            return
        op = self.rng.choice(choices)
        if op == "wipe":
            self._wipe(current)
            return
        self._enqueue(self._plan_for(op, voters, learners))

    def _possible(self, op: str, voters: list[int], learners: list[int], room: int,
                  current: Membership, leader: RaftGroupNode) -> bool:
        count = len(current.voter_ids)
        if op == "add_learner":
            return room >= 1
        if op == "add_voter":
            return room >= 1 and count < MAX_VOTERS
        if op == "promote":
            return bool(learners) and count < MAX_VOTERS
        if op == "remove_learner":
            return bool(learners)
        if op == "remove_voter":
            return count > MIN_VOTERS and bool(voters)
        if op == "replace":
            return room >= 1 and count < MAX_VOTERS and bool(voters)
        if op == "resize":
            return (count <= MIN_VOTERS and room >= MAX_VOTERS - count) or count > MIN_VOTERS
        return bool(self._wipe_targets(current, leader))

    def _plan_for(self, op: str, voters: list[int], learners: list[int]) -> Plan:
        rng = self.rng
        if op == "add_learner":
            return Plan(op, [Step("learner", self._new_id(), rng.random() < 0.7)])
        if op == "add_voter":
            n = self._new_id()
            return Plan(op, [Step("learner", n, rng.random() < 0.7), Step("voter", n)])
        if op == "promote":
            return Plan(op, [Step("voter", rng.choice(learners))])
        if op == "remove_learner":
            return Plan(op, [Step("gone", rng.choice(learners))])
        if op == "remove_voter":
            return Plan(op, [Step("gone", rng.choice(voters))])
        if op == "replace":
            n = self._new_id()
            return Plan(op, [Step("learner", n, rng.random() < 0.7), Step("voter", n),
                             Step("gone", rng.choice(voters))])
        if len(voters) <= MIN_VOTERS:
            steps: list[Step] = []
            for _ in range(MAX_VOTERS - len(voters)):
                n = self._new_id()
                steps += [Step("learner", n), Step("voter", n)]
            return Plan("grow", steps)
        return Plan("shrink", [Step("gone", n)
                               for n in rng.sample(voters, len(voters) - MIN_VOTERS)])

    def _new_id(self) -> int:
        n = self._next_id
        self._next_id += 1
        return n

    def _enqueue(self, plan: Plan) -> None:
        self.h.counts[f"plan_{plan.name}"] += 1
        self.queue.append(plan)
        self.h.trace(f"membership plan {plan.name}: "
                     + ", ".join(s.describe() for s in plan.steps))

    def _abandon(self, why: str) -> None:
        assert self.plan is not None
        self.h.trace(f"membership plan {self.plan.name} abandoned: {why}")
        self.h.counts["plans_abandoned"] += 1
        if self.plan.repair:
            self.h.repairs_pending.discard(self.plan.steps[0].node)
        self.plan = None

    # ----------------------------------------------------------------- wipes

    def _wipe_targets(self, current: Membership, leader: RaftGroupNode) -> list[Slot]:
        """The members a wipe may hit now (see the module docstring)."""
        h = self.h
        core = leader.core
        if h.flush != "sync" or h.repairs_pending or core is None or core.membership_pending:
            return []
        for m in current.voters:
            slot = h.slots[m.node_id]
            if slot.state != "up" or slot.node is None or m.directory_id != slot.directory_id \
                    or not durable(h, slot, core.membership_index):
                return []  # a voter that is down, unpinned, or could lose the pins
        # A node whose log is empty (or may be: it is down) sees the bootstrap
        # configuration, and so would the wiped node: two empty logs of it
        # are a quorum that looks like a fresh group to each other, even when
        # one of them was removed long ago.
        blank = {slot.nid for slot in h.slots.values()
                 if slot.nid in h.configs.bootstrap.voter_ids
                 and (slot.state != "up" or slot.node is None
                      or durable_last(h, slot) == (0, 0))}
        # A node outside the committed configuration's voters (one removed
        # while cut off, which keeps running) campaigns with whatever
        # configuration it holds; where that lists the target as an unpinned
        # voter, it would count the wiped node's vote (seed 21404681: a
        # removed n2 elected with the vote of n1, wiped after n2 lost
        # touch, unpinned in n2's configuration). Identity cannot refuse
        # that vote (docs/raft.md, "Identity"), so the wipe is not injected.
        unpinned_elsewhere: set[int] = set()
        for slot in h.slots.values():
            if slot.nid in current.voter_ids:
                continue
            if slot.state != "up" or slot.node is None:
                if slot.nid in h.removed:
                    return []  # its configuration cannot be read while it is down
                continue
            node = slot.node
            for seen in (node.membership, node.membership_at(durable_last(h, slot)[1])):
                if slot.nid in seen.voter_ids:
                    unpinned_elsewhere.update(m.node_id for m in seen.voters
                                              if m.directory_id == UNPINNED)
        return [h.slots[m.node_id] for m in current.voters + current.learners
                if m.directory_id == h.slots[m.node_id].directory_id
                and h.slots[m.node_id].state == "up" and not blank - {m.node_id}
                and m.node_id not in unpinned_elsewhere]

    def _wipe(self, current: Membership) -> None:
        found = self._leader()
        if found is None:
            return
        targets = self._wipe_targets(current, found[1])
        if not targets:
            return
        target = self.rng.choice(targets)
        was_voter = target.nid in current.voter_ids
        self.h.wipe(target)
        self.h.repairs_pending.add(target.nid)
        steps = [Step("rejoined", target.nid)]
        if was_voter:
            steps.append(Step("voter", target.nid))
        low, high = self.repair_delay
        plan = Plan("repair", steps, repair=True,
                    not_before=self.h.clock.now + self.rng.uniform(low, high))
        self.h.counts["plan_repair"] += 1
        self.queue.insert(0, plan)
        self.h.trace(f"membership plan repair n{target.nid}: "
                     + ", ".join(s.describe() for s in steps))

    # ---------------------------------------------------------------- driver

    def _drive(self) -> None:
        h = self.h
        if self.plan is None:
            if not self.queue or self.queue[0].not_before > h.clock.now:
                return
            self.plan = self.queue.pop(0)
            self.plan.deadline = h.clock.now + PLAN_DEADLINE_S
        plan = self.plan
        if not self._attempt_over():
            if self.rng.random() < self.impatience:
                self._impatient(plan)
            return
        found = self._leader()
        if found is None:
            self._check_deadline(plan)
            return
        lslot, leader = found
        core = leader.core
        assert core is not None
        committed = core.committed_membership
        try:
            while self._done(plan.step, committed):
                self._step_done(plan, plan.step)
                plan.pos += 1
                if plan.pos == len(plan.steps):
                    self._plan_done(plan)
                    return
            if core.membership_pending:
                if self.rng.random() < self.impatience:
                    self._impatient(plan)
                self._check_deadline(plan)
                return
            self._propose(lslot, leader, plan, plan.step)
        except _Abort as exc:
            self._abandon(str(exc))
            return
        self._check_deadline(plan)

    def _attempt_over(self) -> bool:
        attempt = self.attempt
        if attempt is None:
            return True
        slot = attempt.slot
        if attempt.outcome or slot.incarnation != attempt.incarnation \
                or slot.state != "up" or self.h.clock.now > attempt.deadline:
            self.attempt = None
            return True
        return False

    def _impatient(self, plan: Plan) -> None:
        """Propose the step after the pending one (or the pending one again):
        the leader must refuse while a change is uncommitted."""
        found = self._leader()
        if found is None:
            return
        lslot, leader = found
        step = plan.steps[min(plan.pos + 1, len(plan.steps) - 1)]
        try:
            new = self._target(step, leader.membership)
        except _Abort:
            return
        if new == leader.membership:
            return
        self.h.counts["impatient_proposals"] += 1
        self._start_change(lslot, leader, new, step, impatient=True)

    def _check_deadline(self, plan: Plan) -> None:
        if self.plan is plan and not plan.repair and self.h.clock.now > plan.deadline:
            self._abandon("deadline")

    def _plan_done(self, plan: Plan) -> None:
        self.h.trace(f"membership plan {plan.name} done")
        self.h.counts[f"done_{plan.name}"] += 1
        if plan.repair:
            self.h.repairs_pending.discard(plan.steps[0].node)
        self.plan = None

    def _step_done(self, plan: Plan, step: Step) -> None:
        h = self.h
        h.trace(f"membership: {step.describe()} committed")
        if step.kind == "learner":
            h.counts["learners_added"] += 1
        elif step.kind == "voter":
            h.counts["promotions"] += 1
        elif step.kind == "rejoined":
            h.counts["rejoins"] += 1
        else:
            h.counts["removals"] += 1
            h.counts["leader_removals"] += step.node in plan.transferred
            h.removed.add(step.node)
            if h.slots[step.node].state == "up":
                h.counts["removed_running"] += 1

    def _done(self, step: Step, config: Membership) -> bool:
        n = step.node
        if step.kind == "learner":
            return n in config.node_ids
        if step.kind == "voter":
            return n in config.voter_ids
        if step.kind == "gone":
            return n not in config.node_ids
        member = config.member(n)
        return member is not None and member.directory_id == self.h.slots[n].directory_id

    def _target(self, step: Step, current: Membership) -> Membership:
        """The configuration one change closer to `step` than `current`."""
        n = step.node
        slot = self.h.slots[n]
        try:
            if step.kind == "learner":
                directory = slot.directory_id if step.pinned else 0
                return add_learner(current, Member(n, f"sim:{n}", directory))
            if step.kind == "voter":
                if n not in current.learner_ids:
                    raise _Abort(f"n{n} is not a learner")
                return promote(current, n)
            if step.kind == "gone":
                return remove(current, n)
            return rejoin(current, n, slot.directory_id)
        except MembershipError as exc:
            raise _Abort(str(exc)) from None

    def _propose(self, lslot: Slot, leader: RaftGroupNode, plan: Plan, step: Step) -> None:
        if step.kind == "gone" and step.node == lslot.nid:
            # The core refuses to remove itself: hand leadership over first.
            others = sorted(leader.membership.voter_ids - {lslot.nid} - self.h.repairs_pending)
            if not others:
                raise _Abort("the leader is the only voter")
            to = self.rng.choice(others)
            plan.transferred.add(lslot.nid)
            self.h.counts["transfers"] += 1
            self.h.trace(f"membership: n{lslot.nid} hands leadership to n{to} before its "
                         "removal")
            assert lslot.loop is not None
            attempt = _Attempt(lslot, lslot.incarnation, self.h.clock.now + TRANSFER_TIMEOUT_S)
            self.attempt = attempt
            lslot.loop.create_task(self._transfer(leader, to, attempt))
            return
        new = self._target(step, leader.membership)
        self._start_change(lslot, leader, new, step, impatient=False)

    def _start_change(self, lslot: Slot, leader: RaftGroupNode, new: Membership, step: Step,
                      impatient: bool) -> None:
        h = self.h
        assert lslot.loop is not None
        attempt = _Attempt(lslot, lslot.incarnation,
                           h.clock.now + CHANGE_TIMEOUT_S + 0.5)
        if not impatient:
            self.attempt = attempt
        h.trace(f"membership: n{lslot.nid} proposes {step.describe()}"
                f"{' (impatient)' if impatient else ''}: voters {sorted(new.voter_ids)} "
                f"learners {sorted(new.learner_ids)}")
        lslot.loop.create_task(self._change(leader, new, attempt))

    async def _change(self, leader: RaftGroupNode, new: Membership, attempt: _Attempt) -> None:
        h = self.h
        try:
            index = await leader.change_membership(new, timeout=CHANGE_TIMEOUT_S)
        except MembershipChangeRefused as exc:
            attempt.outcome = "refused"
            if "caught up" in exc.reason:
                h.counts["refused_not_caught_up"] += 1
            elif "answers from directory" in exc.reason:
                h.counts["refused_not_heard"] += 1  # (not heard from it since it joined)
            elif "pending" in exc.reason:
                h.counts["refused_pending"] += 1
            else:
                h.counts["refused_changes"] += 1
            h.trace(f"membership: n{leader.node_id} refused: {exc.reason}")
        except NotLeaderError:
            attempt.outcome = "not leader"
        except ProposalUnknown:
            attempt.outcome = "unknown"
        except TimeoutError:
            attempt.outcome = "timeout"
            h.counts["change_timeouts"] += 1
        except Exception as exc:
            h.fail(f"change_membership on n{leader.node_id} raised {exc!r}")
        else:
            attempt.outcome = "committed"
            h.counts["changes_committed"] += 1
            h.trace(f"membership: n{leader.node_id} committed configuration {index}")

    async def _transfer(self, leader: RaftGroupNode, to: int, attempt: _Attempt) -> None:
        try:
            ok = await leader.transfer_leadership(to, timeout=TRANSFER_TIMEOUT_S)
        except Exception as exc:
            self.h.fail(f"transfer_leadership on n{leader.node_id} raised {exc!r}")
            return
        attempt.outcome = "transferred" if ok else "not transferred"
