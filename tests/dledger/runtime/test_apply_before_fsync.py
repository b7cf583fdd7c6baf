"""flush=sync: a leader answers what a quorum of the others holds durably
without waiting for its own fsync (RaftNode rule 3: the runtime advances
its Ready before that fsync ends and reports the end with `durable_to`),
and never with fewer copies.

Three `RaftGroupNode`s on one loop over real TCP and real CommitLogs; the
leader's fsyncs run on a real fsync thread whose jobs a test holds back
(`HeldWorker`), as a slow disk would.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from node_harness import Cluster, wait_until

import commitlog
from commitlog.sync_thread import SyncThread
from dledger.runtime.node import INLINE_SYNC_MAX_BYTES, NodeIO, RaftGroupNode
from ledgermq.base.loop import run

pytestmark = pytest.mark.timeout(120)

T = TypeVar("T")
# Above the in-place fsync's limit: the leader hands its fsync to its thread.
BIG = b"b" * (INLINE_SYNC_MAX_BYTES + 1024)


class HeldWorker:
    """The node's fsync thread; its jobs wait while `release` is clear."""

    def __init__(self) -> None:
        self.thread = SyncThread("held-fsync")
        self.release = threading.Event()
        self.release.set()

    def submit(self, fn: Callable[[Any], T], arg: Any) -> asyncio.Future[T]:
        def held(value: Any) -> T:
            self.release.wait(60)
            return fn(value)
        return self.thread.submit(held, arg)

    def shutdown(self) -> None:
        self.release.set()
        self.thread.shutdown()


async def start(cluster: Cluster) -> dict[int, HeldWorker]:
    workers = {i: HeldWorker() for i in cluster.peers}
    for i, worker in workers.items():
        node = RaftGroupNode(cluster.config(i), lambda _entries: None, lambda _soft: None,
                             io=NodeIO(fsync_worker=worker))
        await cluster.start(i, node=node)
    return workers


async def stop(cluster: Cluster, workers: dict[int, HeldWorker]) -> None:
    for worker in workers.values():
        worker.release.set()
    await cluster.stop_all()
    for worker in workers.values():
        worker.shutdown()


def test_a_quorum_of_followers_answers_while_the_leaders_fsync_is_held(tmp_path: Path) -> None:
    async def main() -> None:
        cluster = Cluster(tmp_path, flush="sync")
        workers = await start(cluster)
        try:
            leader = await cluster.wait_leader()
            lid = leader.config.node_id
            workers[lid].release.clear()
            async with asyncio.timeout(30):
                entry = await leader.propose(commitlog.KIND_MESSAGES, BIG)
            # Answered and applied while the leader's own copy is not durable.
            assert leader.log.durable_index < entry.index
            assert not workers[lid].release.is_set()
            assert leader.status().counters.applied_before_fsync >= 1
            assert entry.index in {e.index for e in cluster.applied[lid]}
            # ... because both followers hold it durably (flush=sync: they
            # acknowledge only after their fsync).
            for nid, node in cluster.nodes.items():
                if nid != lid:
                    assert node.log.durable_index >= entry.index, nid
            workers[lid].release.set()
            await wait_until(lambda: leader.log.durable_index >= entry.index, 20,
                             "the leader's held fsync to end")
            assert await cluster.wait_converged() >= entry.index
        finally:
            await stop(cluster, workers)

    run(main())


def test_one_follower_and_a_held_leader_answer_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        cluster = Cluster(tmp_path, flush="sync")
        workers = await start(cluster)
        try:
            leader = await cluster.wait_leader()
            lid = leader.config.node_id
            await cluster.stop(next(i for i in cluster.peers if i != lid))
            workers[lid].release.clear()
            before = leader.log.last_index
            proposal = asyncio.ensure_future(leader.propose(commitlog.KIND_MESSAGES, BIG))
            await wait_until(lambda: leader.log.last_index > before, 20, "the entry's write")
            fid = next(i for i in cluster.nodes if i != lid)
            last = leader.log.last_index

            def acked() -> bool:
                core = leader.status().core
                return core is not None and core.followers[fid].match >= last

            await wait_until(acked, 20, "the leader to hear the follower's acknowledgement")
            # One durable copy of three, acknowledged: the leader counts
            # itself only once its own fsync ends, so nothing is committed
            # or answered yet.
            assert cluster.nodes[fid].log.durable_index >= last
            assert not proposal.done()
            assert leader.commit_index < leader.log.last_index
            workers[lid].release.set()
            async with asyncio.timeout(30):
                entry = await proposal
            assert leader.log.durable_index >= entry.index
        finally:
            await stop(cluster, workers)

    run(main())
