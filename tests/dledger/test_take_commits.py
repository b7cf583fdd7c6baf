"""A leader applies entries a quorum of the others made durable while its
own fsync of them still runs (`RaftNode.take_commits`, rule 3's exception).

Driven with real `RaftNode`s (`core_group.Group`); the leader's Ready is
held out as a driver waiting for its fsync would hold it.
"""

from __future__ import annotations

from core_group import Group

from dledger import EntryKind, Message, RaftNode, Ready


def _send_out(g: Group, leader: RaftNode) -> Ready:
    """The leader's next Ready, written but not durable: its appends leave."""
    ready = leader.ready()
    assert ready.entries
    g.persist(1, ready)  # written; durable only once advanced
    g.queue.extend(ready.messages)
    return ready


def _followers_answer(g: Group, *followers: int) -> None:
    g.queue = [m for m in g.queue if m.dst in followers]
    g.deliver()
    for i in followers:
        g.process(i)
    g.queue = [m for m in g.queue if m.dst == 1]
    g.deliver()


def test_a_quorum_of_followers_commits_what_the_leader_has_not_synced() -> None:
    g = Group()
    leader = g.elect(1)
    index, _ = leader.propose(EntryKind.MESSAGES, b"first")
    out = _send_out(g, leader)
    assert leader.take_commits() == ()  # nothing committed yet
    _followers_answer(g, 2, 3)
    assert leader.commit == index and leader.stable_index < index
    assert not leader.has_ready()  # the Ready is out: no other until advance
    taken = leader.take_commits()
    assert [(e.index, e.data) for e in taken] == [(index, b"first")]
    assert leader.applied == index
    assert leader.take_commits() == ()  # handed out once
    leader.advance(out)
    assert leader.stable_index == index
    assert all(not r.committed_entries or r.committed_entries[-1].index < index
               for r in _drain(leader))


def test_one_follower_is_not_enough_while_the_leader_is_not_durable() -> None:
    g = Group()
    leader = g.elect(1)
    before = leader.commit
    index, _ = leader.propose(EntryKind.MESSAGES, b"one")
    out = _send_out(g, leader)
    _followers_answer(g, 2)
    # The leader counts itself only for what it synced (rule 2): one
    # follower's copy is not a quorum.
    assert leader.commit == before
    assert leader.take_commits() == ()
    leader.advance(out)  # its fsync ends: now two copies
    assert leader.commit == index


def test_the_out_readys_own_committed_entries_come_first() -> None:
    g = Group()
    leader = g.elect(1)
    first, _ = leader.propose(EntryKind.MESSAGES, b"a")
    out = _send_out(g, leader)
    _followers_answer(g, 2, 3)
    leader.advance(out)  # committed, not taken: the next Ready carries it
    second, _ = leader.propose(EntryKind.MESSAGES, b"b")
    out = _send_out(g, leader)
    assert [e.index for e in out.committed_entries] == [first]
    _followers_answer(g, 2, 3)
    # The driver applied `out.committed_entries` first; these follow them.
    assert [e.index for e in leader.take_commits()] == [second]
    leader.advance(out)
    assert leader.applied == second


def test_followers_take_nothing() -> None:
    g = Group()
    g.elect(1)
    g.nodes[1].propose(EntryKind.MESSAGES, b"x")
    g.process(1)
    g.deliver()
    follower = g.nodes[2]
    out = follower.ready()
    assert out.entries
    g.persist(2, out)
    follower.step(_heartbeat_commit(g))
    assert follower.take_commits() == ()
    follower.advance(out)


def _heartbeat_commit(g: Group) -> Message:
    """The leader's next heartbeat to node 2 (it carries the commit)."""
    g.tick(1)
    g.process(1)
    msg = next(m for m in g.queue if m.dst == 2)
    g.queue.remove(msg)
    return msg


def _drain(node: RaftNode) -> list[Ready]:
    out = []
    while node.has_ready():
        ready = node.ready()
        out.append(ready)
        node.advance(ready)
    return out
