"""A leader's Ready advanced before its fsync ended (`advance(ready,
durable=False)`, then `durable_to`): the next Ready goes out meanwhile, the
leader applies what a quorum of the others holds durably, and never counts
its own unsynced copy (RaftNode rules 2 and 3).

Driven with real `RaftNode`s (`core_group.Group`).
"""

from __future__ import annotations

from core_group import Group

from dledger import EntryKind, RaftNode, Ready


def _send_out(g: Group, leader: RaftNode) -> Ready:
    """The leader's next Ready carried out without its fsync: written, its
    appends queued, advanced with durable=False."""
    ready = leader.ready()
    assert ready.entries and not ready.messages_after_persist
    g.persist(1, ready)  # written; durable only once reported
    g.queue.extend(ready.messages)
    leader.advance(ready, durable=False)
    return ready


def _followers_answer(g: Group, *followers: int) -> None:
    g.queue = [m for m in g.queue if m.dst in followers]
    g.deliver()
    for i in followers:
        g.process(i)
    g.queue = [m for m in g.queue if m.dst == 1]
    g.deliver()


def test_the_next_ready_leaves_before_the_fsync_and_a_quorum_of_others_commits() -> None:
    g = Group()
    leader = g.elect(1)
    stable = leader.stable_index
    first, _ = leader.propose(EntryKind.MESSAGES, b"first")
    _send_out(g, leader)
    assert leader.stable_index == stable  # not counted before its fsync
    second, _ = leader.propose(EntryKind.MESSAGES, b"second")
    assert leader.has_ready()  # the next Ready does not wait for that fsync
    _send_out(g, leader)
    _followers_answer(g, 2, 3)
    assert leader.commit == second and leader.stable_index == stable
    ready = leader.ready()
    assert [(e.index, e.data) for e in ready.committed_entries] == [
        (first, b"first"), (second, b"second")]
    leader.advance(ready)
    leader.durable_to(second)
    assert leader.stable_index == second


def test_one_follower_is_not_enough_until_the_leaders_fsync_ends() -> None:
    g = Group()
    leader = g.elect(1)
    before = leader.commit
    index, _ = leader.propose(EntryKind.MESSAGES, b"one")
    _send_out(g, leader)
    _followers_answer(g, 2)
    assert leader.commit == before  # one copy of three is durable
    assert not any(r.committed_entries and r.committed_entries[-1].index >= index
                   for r in _drain(leader))
    leader.durable_to(index)  # now two
    assert leader.commit == index


def test_durable_to_counts_only_what_was_written() -> None:
    g = Group()
    leader = g.elect(1)
    stable = leader.stable_index
    index, _ = leader.propose(EntryKind.MESSAGES, b"not yet in a Ready")
    leader.durable_to(index + 5)
    assert leader.stable_index == stable  # nothing beyond the advanced entries
    _send_out(g, leader)
    leader.durable_to(index + 5)
    assert leader.stable_index == index


def _drain(node: RaftNode) -> list[Ready]:
    out = []
    while node.has_ready():
        ready = node.ready()
        out.append(ready)
        node.advance(ready)
    return out
