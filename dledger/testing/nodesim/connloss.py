"""Connection loss in the real-node simulator: what the leader watch sees.

The runtime's leader watch (`RaftGroupNode._watch_leader`) tells a
follower's core that its leader is unreachable once every connection with
it stayed closed for a grace of two ticks. In the seeds that model
connections (`NodeSimOptions.connection_loss`, drawn from the run's own
`connloss` stream, so the other seeds replay exactly as before), the
simulated network answers `peer_lost` (see `network.py`) and this module
makes the notices both true and wrong:

- *true*: a crashed node's connections close in a share of the crashes
  (drawn per seed: a killed process; the rest are machines without power,
  whose connections hang until the followers' timeouts); a node that fails
  and stops its transport closes them too;
- *wrong or transient* (`connection_faults`, during the fault phase, every
  0.3-2 s on average, drawn per seed): a reset of the connections between
  the leader and one follower, or between the leader and everyone (a blip at
  the leader's side), lasting 10-300 ms, shorter or longer than the grace;
  or a *phantom*: one follower's transport reports the leader lost for
  50-500 ms while its messages still flow. They hold off while the Figure-8
  scenario steers the elections.

Nothing of safety may rest on the notices; the run's checks stay as they
are, and the liveness phase (every fault healed) must still converge.
"""

from __future__ import annotations

import asyncio

from dledger.testing.nodesim.world import World

# Share of crashes that close the crashed node's connections, one per seed.
CLOSE_SHARES = (0.5, 0.9, 1.0)


async def connection_faults(h: World, until: float) -> None:
    rng = h.connloss_rng
    every = rng.choice((0.3, 0.8, 2.0))
    kinds = ("reset", "reset_leader", "phantom")
    h.trace(f"connection faults every ~{every} s")
    while h.clock.now < until - 0.5 and not h.violation:
        await asyncio.sleep(rng.uniform(every / 2, every * 3 / 2))
        if h.healing or h.violation:
            return
        if h.scenario:
            continue  # Figure 8 steers the elections itself
        leader = h.leader()
        up = [s.nid for s in h.in_play() if s.state == "up"]
        if leader is None or len(up) < 2:
            continue
        others = [n for n in up if n != leader.nid]
        if not others:
            continue
        kind = rng.choice(kinds)
        if kind == "phantom":
            observer = rng.choice(others)
            span = rng.uniform(0.05, 0.5)
            h.net.phantom(observer, leader.nid, span)
            h.counts["phantom_losses"] += 1
            h.trace(f"connections: n{observer} wrongly sees n{leader.nid} lost for "
                    f"{span:.3f} s")
            continue
        span = rng.uniform(0.01, 0.3)
        peers = others if kind == "reset_leader" else [rng.choice(others)]
        for peer in peers:
            h.net.reset(leader.nid, peer, span)
        h.counts["connection_resets"] += 1
        h.trace(f"connections: n{leader.nid} <-> {[f'n{p}' for p in peers]} reset for "
                f"{span:.3f} s")
