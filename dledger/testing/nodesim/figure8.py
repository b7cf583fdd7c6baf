"""The Figure-8 schedule (Raft §5.4.2) for the real-node simulator.

Random partitions and power cuts reach it rarely: it needs an entry stranded
on a minority, a later leader stranded alone with a conflicting entry at the
same index, and the first side winning again and spreading the old entry.
`figure8` drives exactly that on real nodes, reacting to elections as they
happen (the core simulator's `dledger.testing.scenarios.Figure8`):

1. a leader A (term U) is cut off with a minority (A alone on 3 nodes, A and
   one peer on 5) and gets client writes: entry X at index i exists only there;
2. the majority elects Z (term V > U); Z is cut off alone the moment its first
   message as leader leaves (`Harness.on_send`, before its NOOP reaches
   anyone) and gets a write: Z holds (i, V);
3. everyone but Z is joined, with the disks of A's side slow (fsync longer
   than a round trip) and mostly with stale appends on: only a node holding
   X can win, and as leader of term T > V it replicates X and its NOOP; a
   stale slice ending at X leaves a follower matching X alone. Correct Raft
   commits X only through the NOOP; a leader that counts replicas of X
   commits it while Z, whose last term V beats X's, could still win (the
   commit-claim check sees this at once);
4. after a while Z rejoins: it holds a stale suffix past what the stale
   slices it gets cover, which a correct follower does not commit.

Each step waits for its election up to a deadline; a step that times out (the
cluster took another path) heals the network and ends the scenario, so it
never wedges a run. The random nemesis waits for the scenario; the leader
killer and the connection faults (connloss.py) are held off meanwhile.
Every choice comes from the nemesis rng.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence

from dledger.messages import Message
from dledger.testing.nodesim.world import Slot, World

POLL_S = 0.02
STEP_DEADLINE_S = 3.0


async def figure8(h: World, rng: random.Random) -> None:
    """Run the schedule once; the network is healed and the disks and the
    leader killer restored when it ends, however it ends."""
    killer, h.leader_killer = h.leader_killer, False
    disks = {slot.nid: slot.disk_mode for slot in h.slots.values()}
    h.scenario = True
    try:
        await _schedule(h, rng)
    finally:
        h.scenario = False
        h.on_send = None
        h.net.blocked.clear()
        h.leader_killer = killer
        for slot in h.slots.values():
            slot.disk_mode = disks[slot.nid]
        h.trace("figure8: end, network healed")


async def _schedule(h: World, rng: random.Random) -> None:
    ids = sorted(h.slots)
    h.net.blocked.clear()
    for slot in h.slots.values():
        h.restart(slot)  # every step needs elections to succeed
    h.trace("figure8: begin")
    a = await _wait(h, h.leader)
    if a is None or a.node is None:
        return
    others = [n for n in ids if n != a.nid]
    side_a = {a.nid, *rng.sample(others, len(ids) // 2 - 1)}
    rest = set(ids) - side_a
    _groups(h, [side_a, rest])
    term_a = a.node.term
    h.trace(f"figure8: strand leader n{a.nid} (term {term_a}) with {sorted(side_a)}")
    for _ in range(rng.randint(1, 2)):
        h.propose(a)
    found: list[Slot] = []

    def on_send(src: int, messages: Sequence[Message]) -> None:
        slot = h.slots[src]
        node = slot.node
        if src in rest and node is not None and node.role == "leader" \
                and node.term > term_a and not found:
            # Before its first message as leader (its NOOP) leaves.
            found.append(slot)
            _groups(h, [side_a, {src}, rest - {src}])
            h.on_send = None
            h.trace(f"figure8: strand new leader n{src} (term {node.term}) alone")

    h.on_send = on_send
    z = await _wait(h, lambda: found[0] if found else None)
    if z is None or z.node is None or z.state != "up":
        return
    term_z = z.node.term
    h.propose(z)
    joined = set(ids) - {z.nid}
    for nid in side_a:
        h.slots[nid].disk_mode = "slow"
    _groups(h, [joined, {z.nid}])
    h.trace(f"figure8: join {sorted(joined)}, disks of {sorted(side_a)} slow")
    if not h.stale_rate and rng.random() < 0.8:
        # The runtime sends a new leader's catch-up appends only after its own
        # fsync of the NOOP, so X and the NOOP travel and are acknowledged
        # together; a slice that ends at X (a legal stale append) is what
        # leaves a follower matching X alone, the state in which counting
        # commits it.
        h.stale_rate = rng.uniform(0.5, 0.9)
        h.trace(f"figure8: stale appends {h.stale_rate:.3f}")

    def leader_above() -> Slot | None:
        leader = h.leader()
        if leader is not None and leader.nid in joined and leader.node is not None \
                and leader.node.term > term_z:
            return leader
        return None

    t = await _wait(h, leader_above)
    if t is None:
        return
    h.trace(f"figure8: leader n{t.nid} spreads the old entry")
    h.propose(t)
    await asyncio.sleep(rng.uniform(0.3, 1.0))
    h.trace(f"figure8: n{z.nid} rejoins")
    h.net.blocked.clear()
    await asyncio.sleep(rng.uniform(0.3, 1.0))


async def _wait(h: World, ready: Callable[[], Slot | None]) -> Slot | None:
    """Poll until `ready` names a node, the deadline passes, or the run heals."""
    deadline = h.clock.now + STEP_DEADLINE_S
    while h.clock.now < deadline:
        if h.healing or h.violation:
            return None
        h.watch()
        found = ready()
        if found is not None:
            return found
        await asyncio.sleep(POLL_S)
    h.trace("figure8: step timed out")
    return None


def _groups(h: World, groups: Sequence[set[int]]) -> None:
    """Only nodes of the same group reach each other."""
    h.net.blocked.clear()
    for g in groups:
        for other in groups:
            if other is not g:
                h.net.blocked.update((x, y) for x in g for y in other)
    h.counts["partitions"] += 1
