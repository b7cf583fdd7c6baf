"""Reserves on the real runtime (RaftNode rule 8, `NodeConfig.reserve_batch_entries`,
on by default): with proposals one at a time, one follower of three takes
a Ready round per entry and the other one per batch; when the quick
follower stops, the reserve carries the commit and the group answers on."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from node_harness import Cluster

import commitlog
from ledgermq.base.loop import run

pytestmark = pytest.mark.timeout(120)

PROPOSALS = 64


async def _rounds_per_follower(cluster: Cluster) -> dict[int, int]:
    """The Ready rounds each follower takes while the leader's PROPOSALS
    proposals go one at a time."""
    leader = await cluster.wait_leader()
    await cluster.wait_converged()
    followers = [n for n in cluster.nodes if n != leader.config.node_id]
    before = {n: cluster.nodes[n].status().counters.readies for n in followers}
    for i in range(PROPOSALS):
        await leader.propose(commitlog.KIND_MESSAGES, b"one-%d" % i)
    return {n: cluster.nodes[n].status().counters.readies - before[n] for n in followers}


def test_the_reserve_takes_a_round_per_batch_and_carries_the_commit_when_needed(
        tmp_path: Path) -> None:
    async def main() -> None:
        cluster = Cluster(tmp_path, flush="async")
        await cluster.start_all()
        try:
            gained = await _rounds_per_follower(cluster)
            quick, reserve = sorted(gained, key=lambda n: -gained[n])
            assert gained[quick] >= PROPOSALS, gained
            leader = await cluster.wait_leader()
            core = leader.status().core
            assert core is not None and core.reserve_appends > 0
            assert {n for n, f in core.followers.items() if f.reserve} == {reserve}
            # A batch of 8 entries, and a round per tick (heartbeats) meanwhile.
            assert gained[reserve] <= gained[quick] // 2, gained
            await cluster.wait_converged()  # the reserve catches up at the next tick

            await cluster.stop(quick)
            for i in range(5):
                async with asyncio.timeout(10):
                    entry = await leader.propose(commitlog.KIND_MESSAGES, b"after-%d" % i)
                assert entry.index <= cluster.nodes[reserve].log.last_index
        finally:
            await cluster.stop_all()

    run(main())


@pytest.mark.parametrize("knobs", [
    {"reserve_batch_entries": 0},
    # `reserve_batch_bytes` reaches the core: one small entry is a batch.
    {"reserve_batch_bytes": 16},
], ids=["no-reserves", "byte-limit-below-one-entry"])
def test_every_follower_takes_a_round_per_entry(tmp_path: Path, knobs: dict[str, int]) -> None:
    async def main() -> None:
        cluster = Cluster(tmp_path, flush="async", **knobs)
        await cluster.start_all()
        try:
            gained = await _rounds_per_follower(cluster)
            assert min(gained.values()) >= PROPOSALS, gained
        finally:
            await cluster.stop_all()

    run(main())
