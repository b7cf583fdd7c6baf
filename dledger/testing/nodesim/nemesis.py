"""The fault schedule of a run's first phase (swarm testing: each seed enables
its own subset of fault kinds, with its own intensities).

Fault kinds, by the names the trace uses:

- `power_cut` / `power_cut_leader`: the node's process dies and its disk
  keeps only what was fsynced plus a seeded, possibly torn, part of the rest
  (`SimFileSystem.crash`); `restart` brings it back with the real recovery;
- `pause`: the node's loop is not run for 0.1-1.5 s (past the 0.5-1.0 s
  election timeout at the upper end), then catches up in a burst;
- `partition`: one node cut off both ways, a random split, or one direction
  of one link; healed by a later `partition` action;
- `slow_disk`: that node's fsyncs take 5-80 ms (longer than a network round
  trip), 3% of them stall 0.3-1.2 s;
- `disk_faults`: ENOSPC (sometimes after a short write) and EIO on write, EIO
  on fsync, ENOSPC and EIO on rename, each at its own small rate;
- `net_delay`: 1-5% of messages are delayed 0.6-2 s (past an election timeout);
- `net_loss`: 2-10% of messages lost, 1-5% duplicated;
- `stale_append`: 5-40% of a leader's AppendRequests are followed by an
  older, still legal slice of its log with its commit of now
  (`Harness.stale_appends`);
- `figure8`: the Figure-8 schedule, steered by the elections it sees
  (`figure8.py`); the other kinds wait for it;
- `leader_killer`: while on, every new leader loses power 0-0.3 s after it is
  seen leading (the Figure 8 pattern: short reigns leave uncommitted entries
  of several terms behind).

Membership runs (members.py): faults land on the nodes in play (members and
former members, `World.in_play`), not on spares never added, and `figure8`
is left out (its minority and majority sides assume a fixed voter set; the
seeds without membership changes keep it).
"""

from __future__ import annotations

import asyncio
import random

from dledger.testing.nodesim.figure8 import figure8
from dledger.testing.nodesim.simfs import NO_FAULTS, DiskFaults
from dledger.testing.nodesim.world import World

KINDS = ("power_cut", "power_cut_leader", "pause", "partition", "slow_disk", "disk_faults",
         "net_delay", "net_loss", "leader_killer", "stale_append", "figure8")


async def nemesis(h: World, until: float) -> None:
    rng = h.nemesis_rng
    enabled = [k for k in KINDS if rng.random() < 0.6] or ["power_cut"]
    if h.membership:
        enabled = [k for k in enabled if k != "figure8"] or ["power_cut"]
    h.trace(f"nemesis: {', '.join(enabled)}")
    while h.clock.now < until - 0.5 and not h.violation:
        await asyncio.sleep(rng.uniform(0.15, 0.8))
        if h.healing or h.violation:
            return
        h.watch()
        slots = h.in_play()
        tolerated = (len(slots) - 1) // 2
        down = [s for s in slots if s.state == "down"]
        if down and (len(down) > tolerated or rng.random() < 0.4):
            slot = rng.choice(down)
            h.trace(f"nemesis: restart n{slot.nid}")
            h.restart(slot)
            continue
        kind = rng.choice(enabled)
        up = [s for s in slots if s.state == "up"]
        if not up:
            continue
        if kind == "power_cut":
            h.crash(rng.choice(up))
        elif kind == "power_cut_leader":
            leader = h.leader()
            if leader is not None:
                h.crash(leader)
        elif kind == "pause":
            slot = rng.choice(up)
            assert slot.loop is not None
            span = rng.uniform(0.1, 1.5)
            slot.loop.paused_until = h.clock.now + span
            h.counts["pauses"] += 1
            h.trace(f"nemesis: pause n{slot.nid} for {span:.3f} s")
        elif kind == "partition":
            _partition(h, rng)
        elif kind == "slow_disk":
            slot = rng.choice(slots)
            slot.disk_mode = "normal" if slot.disk_mode == "slow" else "slow"
            h.trace(f"nemesis: n{slot.nid} disk {slot.disk_mode}")
        elif kind == "disk_faults":
            slot = rng.choice(slots)
            if rng.random() < 0.4:
                h.fs.set_faults(slot.data_dir, NO_FAULTS)
                h.trace(f"nemesis: n{slot.nid} disk faults off")
            else:
                rate = rng.uniform(0.002, 0.03)
                disk = DiskFaults(
                    enospc_write=rate * rng.random(), eio_write=rate * rng.random(),
                    eio_fsync=rate * rng.random(), enospc_rename=rate * rng.random(),
                    eio_rename=rate * rng.random())
                h.fs.set_faults(slot.data_dir, disk)
                h.trace(f"nemesis: n{slot.nid} disk faults {disk}")
        elif kind == "net_delay":
            faults = h.net.faults
            faults.long_delay = 0.0 if faults.long_delay else rng.uniform(0.01, 0.05)
            h.trace(f"nemesis: long delays {faults.long_delay:.3f}")
        elif kind == "leader_killer":
            h.leader_killer = not h.leader_killer
            h.trace(f"nemesis: leader killer {'on' if h.leader_killer else 'off'}")
        elif kind == "figure8":
            await figure8(h, rng)
        elif kind == "stale_append":
            h.stale_rate = 0.0 if h.stale_rate else rng.uniform(0.05, 0.4)
            h.trace(f"nemesis: stale appends {h.stale_rate:.3f}")
        elif kind == "net_loss":
            faults = h.net.faults
            if faults.loss:
                faults.loss = faults.duplicate = 0.0
            else:
                faults.loss, faults.duplicate = rng.uniform(0.02, 0.1), rng.uniform(0.01, 0.05)
            h.trace(f"nemesis: loss {faults.loss:.3f} duplicate {faults.duplicate:.3f}")


def _partition(h: World, rng: random.Random) -> None:
    blocked = h.net.blocked
    if blocked:
        blocked.clear()
        h.trace("nemesis: partition healed")
        return
    ids = sorted(s.nid for s in h.in_play())
    shape = rng.choice(("isolate", "isolate_leader", "split", "one_way"))
    leader = h.leader()
    if shape == "isolate_leader" and leader is not None:
        alone = [leader.nid]
    elif shape == "split":
        alone = rng.sample(ids, rng.randint(1, len(ids) // 2))
    elif shape == "one_way":
        a, b = rng.sample(ids, 2)
        blocked.add((a, b))
        h.counts["partitions"] += 1
        h.trace(f"nemesis: link n{a}->n{b} cut")
        return
    else:
        alone = [rng.choice(ids)]
    rest = [n for n in ids if n not in alone]
    for a in alone:
        for b in rest:
            blocked.add((a, b))
            blocked.add((b, a))
    h.counts["partitions"] += 1
    h.trace(f"nemesis: partition {sorted(alone)} | {rest}")
