"""Membership changes on the real runtime: RaftGroupNodes over TCP, real CommitLogs.

The core's rules are checked by the simulator; these tests show the runtime
carries them out: the transport follows the configuration (a learner added
at run time is dialled and caught up, a removed node is cut off), CONFIG
entries are stored and replayed like any entry, and a node whose data
directory was wiped cannot vote or get itself elected until it rejoins.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from node_harness import Cluster, log_entries, wait_until

import commitlog
from dledger import MembershipChangeRefused
from dledger.membership import Member, add_learner, promote, rejoin, remove
from dledger.runtime.codec import format_address
from dledger.runtime.node import RaftGroupNode
from ledgermq.base.loop import run


async def _fill(leader: RaftGroupNode, n: int, tag: bytes) -> None:
    for i in range(n):
        await leader.propose(commitlog.KIND_MESSAGES, tag + b"-%d" % i)


def _voters(node: RaftGroupNode) -> list[int]:
    return sorted(node.membership.voter_ids)


def test_a_spare_joins_as_learner_is_promoted_and_a_voter_is_removed(tmp_path: Path) -> None:
    async def main() -> None:
        cluster = Cluster(tmp_path, n=4, tick_ms=20, initial_voters=frozenset({1, 2, 3}))
        await cluster.start_all(only=[1, 2, 3, 4])
        try:
            leader = await cluster.wait_leader()
            await _fill(leader, 20, b"before")
            spare = cluster.nodes[4]
            # A spare never campaigns and hears from nobody: it is no member.
            await asyncio.sleep(0.5)
            assert spare.role == "follower" and spare.leader_id == 0
            assert spare.last_index == 0

            address = format_address(cluster.peers[4])
            index = await leader.change_membership(
                add_learner(leader.membership, Member(4, address)))
            assert leader.membership.learner_ids == {4}
            await wait_until(lambda: spare.applied_index >= index, 10.0, "the learner caught up")
            # A learner is not counted: two voters of three still commit
            # without it, and it never leads.
            await _fill(leader, 10, b"learner")
            await wait_until(lambda: spare.applied_index >= leader.commit_index, 10.0,
                             "the learner follows")
            assert spare.membership.learner_ids == {4}
            with pytest.raises(MembershipChangeRefused):
                # A voter is added only by promoting a caught-up learner,
                # never directly.
                await leader.change_membership(
                    promote(add_learner(leader.membership, Member(5, "127.0.0.1:1")), 5))
            assert leader.membership.node_ids == {1, 2, 3, 4}

            await leader.change_membership(promote(leader.membership, 4))
            assert _voters(leader) == [1, 2, 3, 4]
            victim = next(n for n in (1, 2, 3) if n != leader.config.node_id)
            await leader.change_membership(remove(leader.membership, victim))
            assert _voters(leader) == sorted({1, 2, 3, 4} - {victim})
            await _fill(leader, 10, b"after")
            removed = cluster.nodes[victim]
            frozen = removed.last_index
            await _fill(leader, 10, b"more")
            # The removed node is cut off: it receives nothing more.
            await asyncio.sleep(0.3)
            assert removed.last_index == frozen < leader.last_index
            await cluster.stop(victim)
            commit = await cluster.wait_converged()
            reference = log_entries(leader, commit)
            for node in cluster.nodes.values():
                assert log_entries(node, commit) == reference
                assert _voters(node) == _voters(leader)
            # The configuration survives a restart of the new voter (it is in
            # its log), and the group still commits with it counted.
            await cluster.stop(4)
            # Before it starts, a node already reports what its log says.
            reopened = RaftGroupNode(cluster.config(4), lambda entries: None)
            assert _voters(reopened) == _voters(leader) != [1, 2, 3]
            await cluster.start(4, applied_index=0, node=reopened)
            assert _voters(cluster.nodes[4]) == _voters(leader)
            await _fill(leader, 5, b"restarted")
            await cluster.wait_converged()
        finally:
            await cluster.stop_all()

    run(main())


def test_a_wiped_node_cannot_vote_or_win_until_it_rejoins(tmp_path: Path) -> None:
    async def main() -> None:
        cluster = Cluster(tmp_path, n=3, tick_ms=20)
        try:
            # The leader pins every member's directory once it heard it.
            leader = await cluster.start_pinned()
            await _fill(leader, 20, b"before")
            await cluster.wait_converged()
            lid = leader.config.node_id
            wiped, other = [n for n in (1, 2, 3) if n != lid]

            # Wipe a follower's disk; it comes back under a new directory.
            await cluster.wipe(wiped, 999, leader)

            # Without the leader, the wiped node's vote does not count for the
            # healthy follower, and its own campaign is refused: no leader.
            await cluster.stop(lid)
            await asyncio.sleep(2.0)  # ~ 50 election timeouts of 20 ms ticks
            assert all(not n.leader_ready for n in cluster.nodes.values())
            assert cluster.nodes[wiped].role != "leader"
            assert cluster.nodes[other].role != "leader"

            # The old leader returns: the two intact nodes elect a leader, and
            # the wiped node rejoins as a learner, catches up, is promoted.
            await cluster.start(lid)
            leader = await cluster.wait_leader()
            assert leader.config.node_id in (lid, other)
            await leader.change_membership(rejoin(leader.membership, wiped, 999))
            assert leader.membership.learner_ids == {wiped}
            await wait_until(
                lambda: cluster.nodes[wiped].applied_index >= leader.commit_index, 10.0,
                "the rejoined node caught up")
            await leader.change_membership(promote(leader.membership, wiped))
            member = leader.membership.member(wiped)
            assert member is not None and member.directory_id == 999
            assert _voters(leader) == [1, 2, 3]
            commit = await cluster.wait_converged()
            reference = log_entries(leader, commit)
            assert log_entries(cluster.nodes[wiped], commit) == reference
        finally:
            await cluster.stop_all()

    run(main())
