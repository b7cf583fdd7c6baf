"""Scripted scenarios on the real-node simulator: the three durability defects
fixed in 8bfae42, each replayed on the real runtime and storage code over the
simulated disk (each test fails on the code before that fix)."""

from __future__ import annotations

import errno
import random

import commitlog
from commitlog import CommitLog, CommitLogConfig, Flusher, fileio
from commitlog.checkpoint import read_checkpoint
from dledger.runtime.node import NotLeaderError
from dledger.testing.nodesim.harness import Harness, NodeSimOptions
from dledger.testing.nodesim.simfs import DiskFaults, SimFileSystem
from dledger.testing.nodesim.vtime import Scheduler, SimLoop, VirtualClock
from dledger.testing.nodesim.worker import SimWorker


class _LoseAll(random.Random):
    """A power cut that keeps nothing that was not fsynced (no torn pages)."""

    def randint(self, a: int, b: int) -> int:
        return a

    def random(self) -> float:
        return 0.99


def _items(n: int, tag: str) -> list[tuple[int, bytes]]:
    return [(commitlog.KIND_NOOP, f"{tag}{i}".encode() * 8) for i in range(n)]


def test_a_checkpoint_captured_before_a_truncation_is_not_written_after_it() -> None:
    fs = SimFileSystem(random.Random(1))
    clock = VirtualClock()
    loop = SimLoop(clock, "storage")
    scheduler = Scheduler(clock)
    scheduler.loops.append(loop)
    config = CommitLogConfig(segment_size_bytes=16384, index_file_records=64, flush="sync")
    with fileio.use(fs):
        fs.set_faults("/sim/a", DiskFaults())
        log = CommitLog.open("/sim/a", config)
        log.append(log.build_entries(1, _items(10, "a")))
        log.flush()
        # The Flusher's checkpoint job captures "10 is durable", then waits
        # 50 ms in its worker; the truncation runs meanwhile.
        flusher = Flusher(log, worker=SimWorker(loop, lambda: 0.05), clock=loop.time)
        loop.create_task(flusher._checkpoint())
        scheduler.run_until(0.01)
        loop.run_sync(lambda: log.truncate_after(4))
        log.append(log.build_entries(2, _items(2, "b")))  # 5..6
        log.flush()  # the cut and the new entries are durable
        scheduler.run_until(0.2)
        checkpoint = read_checkpoint("/sim/a")
        assert checkpoint is not None and checkpoint.durable_index <= 4
        fs.crash("/sim/a", _LoseAll())
        # A checkpoint claiming 10 would make recovery refuse the log (1..6).
        reopened = CommitLog.open("/sim/a", config)
        assert reopened.last_index == 6 and reopened.term_at(6) == 2
        reopened.close()
        loop.bury()


def _cluster(seed: int, flush: str) -> Harness:
    h = Harness(seed, NodeSimOptions(nodes=3, flush=flush), None)
    h.fs.on_replace = None  # scripted: no background checks needed beyond the asserts
    return h


def _leader(h: Harness, until: float) -> object:
    h.scheduler.run_until(until, lambda: h.leader() is not None
                          and h.leader().node.leader_ready)  # type: ignore[union-attr]
    leader = h.leader()
    assert leader is not None and leader.node is not None and leader.node.leader_ready
    return leader


def test_enospc_on_a_state_file_fails_the_node_loudly() -> None:
    """Every atomic replace fails with ENOSPC: the first of the node's
    state files to be replaced (the CommitLog checkpoint, or the hard state
    with its commit index, whichever comes first: flush=sync rounds of
    small entries now sync in place and wake the flusher for the
    checkpoint) fails the node, which stops leading and takes no proposal.
    The checkpoint alone: tests/commitlog/test_disk_full.py."""
    h = _cluster(7, "sync")
    with fileio.use(h.fs):
        try:
            for slot in h.slots.values():
                h.start(slot)
            leader = _leader(h, 5.0)
            h.fs.set_faults(leader.data_dir, DiskFaults(enospc_rename=1.0))
            for _ in range(3):
                h.propose(leader)
            h.scheduler.run_until(h.clock.now + 2.0,
                                  lambda: leader.node is not None
                                  and leader.node.failed is not None)
            failed = leader.node.failed
            assert failed is not None, "the node kept serving after a failed checkpoint"
            assert isinstance(failed, OSError) and failed.errno == errno.ENOSPC
            assert str(failed.filename).endswith(("/checkpoint", "/hardstate")), failed.filename
            assert leader.node.role == "follower"
            try:
                leader.loop.run_sync(lambda: leader.node.propose(1, b"x").send(None))
            except NotLeaderError:
                pass
            else:
                raise AssertionError("a failed node took a proposal")
            # The others elect a leader without it.
            h.scheduler.run_until(h.clock.now + 5.0,
                                  lambda: h.leader() not in (None, leader))
            assert h.leader() not in (None, leader)
        finally:
            for loop in [*h.dead_loops, *h.scheduler.loops]:
                loop.bury()


def test_a_follower_that_lost_its_tail_under_flush_async_catches_up() -> None:
    h = _cluster(11, "async")
    with fileio.use(h.fs):
        try:
            for slot in h.slots.values():
                h.start(slot)
            leader = _leader(h, 5.0)
            follower = next(s for s in h.slots.values() if s is not leader)
            for _ in range(40):
                h.propose(leader)
            h.scheduler.run_until(h.clock.now + 0.05)
            assert follower.node is not None and follower.node.last_index > 20
            # Power cut that keeps nothing unsynced: the follower loses the tail
            # the leader recorded as matched.
            h._abandon(follower)
            h.net.detach_node(follower.nid)
            h.fs.crash(follower.data_dir, _LoseAll())
            for _ in range(20):
                h.propose(leader)
            h.scheduler.run_until(h.clock.now + 0.5)
            h.restart(follower)
            h.scheduler.run_until(h.clock.now + 5.0, lambda: follower.node is not None
                                  and follower.node.applied_index
                                  == leader.node.commit_index == leader.node.last_index)
            assert follower.node is not None and leader.node is not None
            assert follower.node.failed is None
            assert follower.node.last_index == leader.node.last_index
            assert follower.node.applied_index == leader.node.commit_index
        finally:
            for loop in [*h.dead_loops, *h.scheduler.loops]:
                loop.bury()


def _watched(seed: int) -> Harness:
    """Three real nodes on a network that models connections (the leader watch)."""
    h = Harness(seed, NodeSimOptions(nodes=3, flush="sync", connection_loss=1.0), None)
    h.fs.on_replace = None
    assert h.net.model_connections
    return h


def _terms(h: Harness) -> dict[int, int]:
    return {s.nid: s.node.term for s in h.slots.values() if s.node is not None}


def test_a_lone_followers_lost_connections_do_not_depose_a_healthy_leader() -> None:
    h = _watched(5)
    with fileio.use(h.fs):
        try:
            for slot in h.slots.values():
                h.start(slot)
            leader = _leader(h, 5.0)
            h.scheduler.run_until(h.clock.now + 0.5)
            terms = _terms(h)
            lone, other = (s for s in h.slots.values() if s is not leader)
            # Its transport says the leader's connections closed while they
            # did not (2 s: four election timeouts' worth of notices), then
            # they really are reset for 1.5 s (its messages lost both ways).
            h.net.phantom(lone.nid, leader.nid, 2.0)
            for _ in range(20):
                h.propose(leader)
            h.scheduler.run_until(h.clock.now + 2.5)
            h.net.reset(lone.nid, leader.nid, 1.5)
            h.scheduler.run_until(h.clock.now + 3.0)
            assert lone.node is not None and other.node is not None
            assert lone.node.counters.leader_lost_notices >= 2
            assert other.node.counters.leader_lost_notices == 0
            assert h.leader() is leader and _terms(h) == terms  # pre-vote: no term moved
            assert lone.node.leader_id == leader.nid
            h.scheduler.run_until(h.clock.now + 1.0, lambda: lone.node is not None and
                                  lone.node.applied_index == leader.node.commit_index)
            assert lone.node.applied_index == leader.node.commit_index
        finally:
            for loop in [*h.dead_loops, *h.scheduler.loops]:
                loop.bury()


def test_a_killed_leader_is_replaced_before_an_election_timeout() -> None:
    h = _watched(6)
    with fileio.use(h.fs):
        try:
            for slot in h.slots.values():
                h.start(slot)
            leader = _leader(h, 5.0)
            h.scheduler.run_until(h.clock.now + 0.5)
            survivors = [s for s in h.slots.values() if s is not leader]
            h._abandon(leader)
            h.net.detach_node(leader.nid, closes=True)  # a killed process
            killed = h.clock.now
            h.scheduler.run_until(killed + 5.0, lambda: h.leader() not in (None, leader)
                                  and h.leader().node.leader_ready)  # type: ignore[union-attr]
            new = h.leader()
            assert new is not None and new is not leader and new.node is not None
            assert sum(s.node.counters.leader_lost_notices for s in survivors
                       if s.node is not None) >= 1
            # Virtual time: no follower's election timeout (10 ticks of 50 ms)
            # can have fired; the notice after 2 ticks started the election.
            assert h.clock.now - killed < 0.5
        finally:
            for loop in [*h.dead_loops, *h.scheduler.loops]:
                loop.bury()
