"""Failover time of real node processes: SIGKILL the leader, time until a new one serves.

Starts a 3-node group (`dledger.runtime.process`) in a temporary directory,
then N times: write a little, SIGKILL the leader, poll the survivors every
`--poll-ms` until one reports `leader_ready` (its NOOP committed and applied,
so it can take writes), restart the killed node and wait for it to catch up.
Prints one JSON line: p50 / p90 / max of kill -> new leader elected and
kill -> leader ready, in milliseconds.

    .venv/bin/python bench/failover.py [--kills 10] [--tick-ms 50] [--election-ticks 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import tempfile
from pathlib import Path

from dledger.testing.node_processes import ProcessCluster
from ledgermq.base.loop import run


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def measure(root: Path, kills: int, knobs: dict[str, object], poll_s: float,
                  nodes: int = 3) -> dict:
    cluster = ProcessCluster(root, nodes, **knobs)
    for node_id in cluster.peers:
        cluster.start(node_id)
    elected: list[float] = []
    ready: list[float] = []
    loop = asyncio.get_running_loop()
    try:
        leader = await cluster.wait_leader(timeout=30)
        for k in range(kills):
            for i in range(20):
                await cluster.propose(leader, b"k%d-%d" % (k, i))
            await cluster.kill(leader, signal.SIGKILL)
            killed_at = loop.time()
            survivors = list(cluster.procs)
            first_elected = 0.0
            new_leader = 0
            while not new_leader:
                for node_id in survivors:
                    st = await cluster.status(node_id)
                    if not st or st["role"] != "leader":
                        continue
                    if not first_elected:
                        first_elected = loop.time() - killed_at
                    if st["leader_ready"]:
                        new_leader = node_id
                await asyncio.sleep(poll_s)
            ready.append(loop.time() - killed_at)
            elected.append(first_elected)
            cluster.start(leader)
            leader = new_leader
            # Let the restarted node catch up before the next kill.
            while True:
                st_leader = await cluster.status(leader)
                sts = [await cluster.status(n) for n in cluster.procs]
                if st_leader and all(s and s["applied_index"] >= st_leader["commit_index"]
                                     for s in sts):
                    break
                await asyncio.sleep(0.05)
    finally:
        await cluster.close_clients()
        await cluster.stop_all()

    def summary(values: list[float]) -> dict[str, float]:
        ms = [v * 1000 for v in values]
        return {"p50_ms": round(statistics.median(ms), 1), "p90_ms": round(percentile(ms, 0.9), 1),
                "max_ms": round(max(ms), 1), "min_ms": round(min(ms), 1)}

    return {"bench": "failover", "kills": kills, "nodes": nodes, **knobs,
            "elected": summary(elected), "leader_ready": summary(ready)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--tick-ms", type=int, default=50)
    parser.add_argument("--election-ticks", type=int, default=10)
    parser.add_argument("--flush", default="sync", choices=("sync", "async"))
    parser.add_argument("--poll-ms", type=float, default=5.0)
    parser.add_argument("--nodes", type=int, default=3, choices=(3, 5))
    parser.add_argument("--reserve-batch", type=int, default=8,
                        help="reserve_batch_entries (0: every follower gets every entry at once)")
    args = parser.parse_args()
    knobs: dict[str, object] = {"tick_ms": args.tick_ms,
                                "election_timeout_ticks": args.election_ticks,
                                "flush": args.flush, "reserve_batch_entries": args.reserve_batch}
    with tempfile.TemporaryDirectory(prefix="ledgermq-failover-") as root:
        result = run(measure(Path(root), args.kills, knobs, args.poll_ms / 1000, args.nodes))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
