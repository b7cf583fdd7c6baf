"""Reserves (RaftNode rule 8): the leader sends each new entry at once only
to the voting followers its commit needs; the others get them in batches
(once `reserve_batch_entries` wait, at every tick, after a heartbeat
answer). A reserve that moves the commit becomes quick at once.

Driven with real `RaftNode`s (`core_group.Group`).
"""

from __future__ import annotations

from core_group import Group

from dledger import AppendRequest, EntryKind, TimeoutNow
from election.roles import Role

BATCH = 4


def _appends_to(g: Group, peer: int) -> list[AppendRequest]:
    """AppendRequests with entries queued for `peer` (taken off the queue)."""
    sent = [m for m in g.sent(AppendRequest, peer) if isinstance(m, AppendRequest) and m.entries]
    return sent


def _propose_one(g: Group, leader: int, k: int) -> None:
    g.nodes[leader].propose(EntryKind.MESSAGES, b"m%d" % k)
    g.process(leader)


def test_a_reserve_gets_new_entries_in_batches_and_the_quick_follower_each_at_once() -> None:
    g = Group(reserve_batch_entries=BATCH)
    g.elect(1)  # its settle ticks: node 3 is the reserve (ties go to the lower id)
    progress = g.nodes[1].status().progress
    assert (progress[2].reserve, progress[3].reserve) == (False, True)
    for k in range(BATCH - 1):
        _propose_one(g, 1, k)
        assert len(_appends_to(g, 2)) == 1, "the quick follower gets each entry at once"
        assert _appends_to(g, 3) == [], "the reserve waits for a batch"
        g.stabilize()
        assert g.nodes[1].commit == g.nodes[1].log.last_index  # committed with node 2 alone
    _propose_one(g, 1, BATCH)
    batch = _appends_to(g, 3)
    assert len(batch) == 1 and len(batch[0].entries) == BATCH
    g.stabilize()
    assert g.nodes[3].log.last_index == g.nodes[1].log.last_index
    assert g.nodes[1].reserve_appends == 1 and g.nodes[1].reserve_changes == 0


def test_a_tick_sends_a_reserve_what_waits() -> None:
    g = Group(reserve_batch_entries=BATCH)
    g.elect(1)
    _propose_one(g, 1, 0)
    assert _appends_to(g, 3) == []
    g.stabilize()
    g.tick(1)
    g.process(1)
    [append] = _appends_to(g, 3)
    assert [e.data for e in append.entries] == [b"m0"]


def test_without_the_quick_follower_the_reserve_commits_after_a_tick_and_becomes_quick() -> None:
    g = Group(reserve_batch_entries=BATCH)
    leader = g.elect(1)
    g.isolated.add(2)
    _propose_one(g, 1, 0)
    g.stabilize()
    index = leader.log.last_index
    assert leader.commit < index  # node 2's ack never comes; node 3 has nothing yet
    g.tick(1)
    g.stabilize()
    assert leader.commit == index  # the tick's batch to node 3, acked, committed it
    progress = leader.status().progress
    assert (progress[2].reserve, progress[3].reserve) == (True, False)
    assert leader.reserve_changes == 1
    _propose_one(g, 1, 1)
    assert len(_appends_to(g, 3)) == 1, "node 3 is quick now: each entry at once"
    g.stabilize()
    assert leader.commit == leader.log.last_index


def test_five_nodes_have_two_quick_followers_and_two_reserves() -> None:
    g = Group(5, reserve_batch_entries=BATCH)
    g.elect(1)
    _propose_one(g, 1, 0)
    assert [len(_appends_to(g, p)) for p in (2, 3, 4, 5)] == [1, 1, 0, 0]
    g.stabilize()
    assert g.nodes[1].commit == g.nodes[1].log.last_index


def test_a_transfer_to_a_reserve_does_not_wait_for_a_batch() -> None:
    g = Group(reserve_batch_entries=BATCH)
    leader = g.elect(1)
    _propose_one(g, 1, 0)
    g.stabilize()
    assert g.nodes[3].log.last_index < leader.log.last_index
    assert leader.transfer_leadership(3)
    g.process(1)
    g.deliver()
    g.process(3)
    g.deliver()
    g.process(1)
    assert g.sent(TimeoutNow, 3), "caught up without a tick, then told to campaign"
    g.stabilize()
    assert g.nodes[3].role is Role.LEADER


def test_zero_sends_every_follower_every_entry_at_once() -> None:
    g = Group(reserve_batch_entries=0)
    g.elect(1)
    _propose_one(g, 1, 0)
    assert [len(_appends_to(g, p)) for p in (2, 3)] == [1, 1]


def test_a_large_entry_goes_to_the_reserve_at_once() -> None:
    g = Group(reserve_batch_entries=BATCH, reserve_batch_bytes=100)
    g.elect(1)
    _propose_one(g, 1, 0)
    assert _appends_to(g, 3) == [], "a small entry waits"
    g.stabilize()
    g.nodes[1].propose(EntryKind.MESSAGES, b"x" * 100)
    g.process(1)
    [append] = _appends_to(g, 3)
    assert [len(e.data) for e in append.entries] == [2, 100]  # what waited, with it


def _leader_gone_and_the_reserve_campaigns(g: Group, reserve: int) -> None:
    g.isolated.add(1)
    for follower in g.ids[1:]:
        assert g.nodes[follower].leader_unreachable(1)
    g.nodes[reserve].campaign()  # the reserve's short timer fired first
    g.stabilize()


def test_when_the_leader_dies_the_quick_follower_does_not_wait_for_its_timer() -> None:
    # The reserve is behind, so its pre-vote is refused; the quick follower,
    # whose log is the longest, campaigns as it refuses, without a tick.
    g = Group(reserve_batch_entries=BATCH)
    g.elect(1)
    _propose_one(g, 1, 0)
    g.stabilize()
    assert g.nodes[3].log.last_index < g.nodes[2].log.last_index
    _leader_gone_and_the_reserve_campaigns(g, 3)
    assert g.nodes[2].role is Role.LEADER
    assert g.nodes[3].role is Role.FOLLOWER and g.nodes[3].leader_id == 2


def test_five_nodes_the_quick_followers_campaign_at_their_next_tick() -> None:
    g = Group(5, reserve_batch_entries=BATCH)
    g.elect(1)
    _propose_one(g, 1, 0)
    g.stabilize()
    _leader_gone_and_the_reserve_campaigns(g, 4)
    assert [g.nodes[i].role for i in (2, 3)] == [Role.FOLLOWER, Role.FOLLOWER]
    g.tick(3)  # node 3's next tick, before node 2's
    g.stabilize()
    assert g.nodes[3].role is Role.LEADER
