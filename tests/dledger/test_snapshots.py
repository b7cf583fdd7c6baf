"""Snapshots in the Raft core: compaction, InstallSnapshot, restore, a moving first index.

Each test drives real `RaftNode`s over `MemoryLogStorage` with a small
synchronous driver (`Group`): a Ready is persisted (snapshot first, then
entries and hard state) before its messages are queued, as the Ready
contract asks.
"""

from __future__ import annotations

import random

import pytest
from core_group import PLACE, Group

from dledger import (
    AppendRequest,
    AppendResponse,
    Bugs,
    Config,
    EntryKind,
    HardState,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    InvariantViolation,
    LogUnavailable,
    MemoryLogStorage,
    ProgressState,
    RaftNode,
    SnapshotMeta,
)
from dledger.log import CommittedDivergence, RaftLog
from election.roles import Role


def far_behind(count: int = 12) -> tuple[Group, RaftNode]:
    """Leader 1 committed `count` entries while 3 was cut off, then compacted its log."""
    g = Group()
    leader = g.elect(1)
    g.isolated = {3}
    g.propose(1, count)
    assert leader.commit == leader.log.last_index == count + 1
    g.storages[1].compact(leader.applied)
    assert g.storages[1].first_index() == leader.applied + 1
    g.isolated = set()
    return g, leader


def install_message(g: Group, leader: RaftNode) -> InstallSnapshot:
    """Heartbeat round until the leader gives up appends to 3 and sends a snapshot."""
    for _ in range(20):
        g.tick(1)
        g.process(1)
        snaps = g.sent(InstallSnapshot, dst=3)
        if snaps:
            msg = snaps[0]
            assert isinstance(msg, InstallSnapshot)
            return msg
        g.deliver()
        g.process(3)
    raise AssertionError("no InstallSnapshot sent")


# ---------------------------------------------------------------- storage and log


def test_memory_storage_compact_and_install_move_the_first_index() -> None:
    g = Group(1)
    g.elect(1)
    g.propose(1, 5)
    storage = g.storages[1]
    entries = storage.all_entries()
    meta = storage.compact(3)
    assert meta == SnapshotMeta(3, entries[2].term, entries[2].end_position)
    assert (storage.first_index(), storage.last_index(), storage.snapshot()) == (4, 6, meta)
    assert storage.term(3) == meta.term  # first_index - 1 answers the snapshot's term
    with pytest.raises(LogUnavailable):
        storage.term(2)
    with pytest.raises(LogUnavailable):
        storage.entries(3, 5, 1 << 20)
    assert [e.index for e in storage.entries(4, 7, 1 << 20)] == [4, 5, 6]
    assert storage.compact(2) == meta  # already compacted: no-op
    with pytest.raises(ValueError):
        storage.truncate_after(2)  # below the snapshot
    storage.compact(6)
    assert storage.all_entries() == [] and storage.last_index() == 6
    assert storage.end_position() == entries[5].end_position
    other = SnapshotMeta(40, 7, 9000)
    storage.install(other)
    assert (storage.first_index(), storage.last_index(), storage.term(40)) == (41, 40, 7)
    assert storage.end_position() == 9000


def test_raft_log_restore_hides_stale_storage_until_persisted() -> None:
    g = Group(1)
    g.elect(1)
    g.propose(1, 3)
    log = RaftLog(g.storages[1], PLACE)
    meta = SnapshotMeta(10, 5, 2000)
    log.restore(meta)
    assert (log.last_index, log.last_term(), log.first_index()) == (10, 5, 11)
    with pytest.raises(LogUnavailable):
        log.term(2)  # storage still holds it, but it predates the snapshot
    assert log.term_or_none(2) is None
    assert log.next_position(48) == 2000
    assert log.take_snapshot() == meta and log.take_snapshot() is None
    g.storages[1].install(meta)
    assert log.snapshot_persisted(meta)
    assert log.term(10) == 5 and log.first_index() == 11


# ------------------------------------------------------------------ leader side


def test_leader_sends_snapshot_when_entries_are_gone_and_pauses_the_follower() -> None:
    g, leader = far_behind()
    msg = install_message(g, leader)
    snap = g.storages[1].snapshot()
    assert snap is not None
    assert (msg.index, msg.snap_term, msg.end_position) == (snap.index, snap.term,
                                                          snap.end_position)
    assert msg.term == leader.term
    pr = leader.status().progress[3]
    assert pr.state == "SNAPSHOT" and pr.pending_snapshot == snap.index
    # Paused: new proposals replicate to 2, nothing but heartbeats goes to 3.
    g.queue = []
    leader.propose(EntryKind.MESSAGES, b"more")
    g.process(1)
    assert g.sent(AppendRequest, dst=2) and not g.sent(AppendRequest, dst=3)
    assert not g.sent(InstallSnapshot, dst=3)


def test_follower_restores_acks_after_persist_and_leader_resumes_after_the_snapshot() -> None:
    g, leader = far_behind()
    msg = install_message(g, leader)
    g.queue = [msg]
    g.deliver()
    follower = g.nodes[3]
    assert follower.has_ready()
    ready = follower.ready()
    assert ready.snapshot == SnapshotMeta(msg.index, msg.snap_term, msg.end_position)
    assert ready.must_sync
    assert ready.hard_state is not None and ready.hard_state.commit == msg.index
    acks = [m for m in ready.messages_after_persist if isinstance(m, AppendResponse)]
    assert acks and acks[0].success and acks[0].index == msg.index
    assert not any(isinstance(m, AppendResponse) for m in ready.messages)
    assert not ready.committed_entries  # the state arrives with the snapshot
    g.persist(3, ready)
    g.queue.extend(ready.messages + ready.messages_after_persist)
    follower.advance(ready)
    status = follower.status()
    assert (status.commit_index, status.applied_index, status.last_index) == (msg.index,) * 3
    assert status.first_index == msg.index + 1
    g.stabilize()
    pr = leader.status().progress[3]
    assert pr.state == "REPLICATE" and pr.match == leader.log.last_index
    # Replication resumed at index + 1: 3 holds exactly the leader's entries after it.
    assert g.storages[3].first_index() == msg.index + 1
    assert g.storages[3].all_entries() == g.storages[1].all_entries()[
        msg.index + 1 - g.storages[1].first_index():]
    leader.propose(EntryKind.MESSAGES, b"after")
    g.settle(1)
    assert g.nodes[3].commit == leader.commit == leader.log.last_index


def test_snapshot_timeout_resends() -> None:
    g, leader = far_behind()
    install_message(g, leader)
    timeout = leader.config.snapshot_timeout_ticks - leader.progress[3].snapshot_ticks
    resent_at = []
    for tick in range(1, timeout + 1):
        # Every InstallSnapshot is lost; heartbeats keep the leader in office.
        g.queue = [m for m in g.queue if not isinstance(m, InstallSnapshot)]
        g.tick(1)
        g.process(1)
        if g.sent(InstallSnapshot, dst=3):
            resent_at.append(tick)
        g.deliver()
        for i in g.ids:
            g.process(i)
    assert leader.role is Role.LEADER
    assert resent_at == [timeout]


def test_report_snapshot_failure_probes_again_on_the_next_heartbeat_answer() -> None:
    g, leader = far_behind()
    install_message(g, leader)
    g.queue = []
    leader.report_snapshot(3, ok=False)
    pr = leader.progress[3]
    assert pr.state is ProgressState.PROBE and pr.paused()
    g.process(1)
    assert not g.sent(InstallSnapshot, dst=3)  # no retry until 3 shows it is alive
    leader.step(HeartbeatResponse(3, 1, leader.term))
    g.process(1)
    assert g.sent(InstallSnapshot, dst=3)


def test_report_snapshot_success_resumes_after_the_snapshot() -> None:
    g, leader = far_behind()
    msg = install_message(g, leader)
    leader.report_snapshot(3, ok=True)
    pr = leader.progress[3]
    assert pr.state is ProgressState.PROBE and pr.next == msg.index + 1
    g.stabilize()
    assert leader.progress[3].state is ProgressState.REPLICATE
    assert g.nodes[3].commit == leader.commit


def test_report_snapshot_is_ignored_outside_snapshot_state() -> None:
    g = Group()
    leader = g.elect(1)
    before = leader.progress[2].state
    leader.report_snapshot(2, ok=False)
    leader.report_snapshot(9, ok=True)
    assert leader.progress[2].state is before


def test_leader_without_a_snapshot_for_deleted_entries_is_an_invariant_violation() -> None:
    """A driver that deletes entries no snapshot holds breaks the storage contract."""

    class NoSnapshot(MemoryLogStorage):
        def snapshot(self) -> SnapshotMeta | None:
            return None

    g = Group()
    g.storages[1] = NoSnapshot()
    g.start(1)
    leader = g.elect(1)
    g.isolated = {3}
    g.propose(1, 5)
    g.storages[1].compact(leader.applied)
    g.isolated = set()
    with pytest.raises(InvariantViolation):
        for _ in range(20):
            g.tick(1)
            g.process(1)
            g.deliver()
            g.process(3)


# ---------------------------------------------------------------- follower side


def test_stale_and_duplicate_install_snapshot_are_harmless() -> None:
    g, leader = far_behind()
    msg = install_message(g, leader)
    g.queue = [msg, msg]  # duplicated on the wire
    g.stabilize()
    follower = g.nodes[3]
    restores = [r for r in g.readies[3] if r.snapshot is not None]
    assert len(restores) == 1
    assert follower.commit == leader.commit
    # A late copy (and an older snapshot) once 3 is caught up: acked with its commit.
    g.readies[3] = []
    old = InstallSnapshot(1, 3, leader.term, msg.index - 2, msg.snap_term, 0)
    for late in (msg, old):
        follower.step(late)
        ready = follower.ready()
        assert ready.snapshot is None and not ready.entries
        acks = [m for m in ready.messages_after_persist if isinstance(m, AppendResponse)]
        assert acks[0].success and acks[0].index == follower.commit
        follower.advance(ready)
    assert follower.log.last_index == leader.log.last_index


def test_install_snapshot_term_rules() -> None:
    g, leader = far_behind()
    msg = install_message(g, leader)
    follower = g.nodes[3]
    # From a deposed leader (lower term): dropped, answered with our term.
    g.queue = []
    stale = InstallSnapshot(2, 3, msg.term - 1, msg.index, msg.snap_term, msg.end_position)
    follower.step(stale)
    ready = follower.ready()
    assert ready.snapshot is None
    assert [type(m) for m in ready.messages + ready.messages_after_persist] == [HeartbeatResponse]
    follower.advance(ready)
    # From a leader of a higher term: adopted term and leader, then restored.
    newer = InstallSnapshot(2, 3, msg.term + 1, msg.index, msg.snap_term, msg.end_position)
    follower.step(newer)
    assert follower.term == msg.term + 1 and follower.leader_id == 2
    ready = follower.ready()
    assert ready.snapshot is not None and ready.hard_state is not None
    assert ready.hard_state.term == msg.term + 1
    # The new term is on disk before anything is said in it.
    assert not ready.messages and ready.messages_after_persist


def test_candidate_steps_down_on_install_snapshot_of_its_term() -> None:
    g, leader = far_behind()
    msg = install_message(g, leader)
    follower = g.nodes[3]
    follower.step(InstallSnapshot(1, 3, msg.term, msg.index, msg.snap_term, msg.end_position))
    assert follower.role is Role.FOLLOWER and follower.leader_id == 1


def test_follower_that_holds_the_entry_just_commits() -> None:
    g = Group()
    leader = g.elect(1)
    g.propose(1, 4)
    follower = g.nodes[3]
    # 3 appends a new entry, but the commit that follows never reaches it.
    leader.propose(EntryKind.MESSAGES, b"x")
    g.process(1)
    g.deliver()
    g.process(3)
    g.queue = []
    index = follower.log.last_index
    assert follower.commit < index
    last_before = follower.log.last_index
    follower.step(InstallSnapshot(1, 3, leader.term, index, follower.log.term(index),
                                  follower.log.entry(index).end_position))
    ready = follower.ready()
    assert ready.snapshot is None and follower.commit == index
    assert follower.log.last_index == last_before  # nothing dropped
    acks = [m for m in ready.messages_after_persist if isinstance(m, AppendResponse)]
    assert acks[0].success and acks[0].index == index
    assert [e.index for e in ready.committed_entries][-1] == index
    follower.advance(ready)


def test_follower_with_a_conflicting_entry_at_the_index_restores() -> None:
    """Holding the index with another term is not holding the snapshot's entry."""
    g = Group()
    g.elect(1)
    follower = g.nodes[3]
    # 3 has an uncommitted entry of an old term at index 2 (written by deposed leader 1).
    g.isolated = {2, 3}
    g.nodes[1].propose(EntryKind.MESSAGES, b"lost")
    g.process(1)
    g.isolated = set()
    g.queue = [m for m in g.queue if m.dst == 3]
    g.deliver()
    g.process(3)
    assert follower.log.last_index == 2
    old_term = follower.log.term(2)
    g.queue = []
    follower.step(InstallSnapshot(2, 3, old_term + 1, 5, old_term + 1, 700))
    ready = follower.ready()
    assert ready.snapshot == SnapshotMeta(5, old_term + 1, 700)
    assert follower.log.last_index == 5 and follower.log.term(5) == old_term + 1


def test_snapshot_ignores_term_bug_commits_the_wrong_entry() -> None:
    g = Group(bugs=Bugs.only("snapshot_ignores_term"))
    g.elect(1)
    follower = g.nodes[3]
    g.isolated = {2, 3}
    g.nodes[1].propose(EntryKind.MESSAGES, b"lost")
    g.process(1)
    g.isolated = set()
    g.queue = [m for m in g.queue if m.dst == 3]
    g.deliver()
    g.process(3)
    old_term = follower.log.term(2)
    follower.step(InstallSnapshot(2, 3, old_term + 1, 2, old_term + 1, 700))
    assert follower.ready().snapshot is None
    assert follower.commit == 2 and follower.log.term(2) == old_term  # the wrong entry


def test_ack_snapshot_before_persist_bug_sends_the_ack_at_once() -> None:
    g, leader = far_behind()
    g.bugs = Bugs.only("ack_snapshot_before_persist")
    g.start(3)
    msg = install_message(g, leader)
    g.nodes[3].step(msg)
    ready = g.nodes[3].ready()
    assert ready.snapshot is not None
    assert any(isinstance(m, AppendResponse) and m.index == msg.index for m in ready.messages)


def test_restore_while_a_ready_is_out_does_not_regress() -> None:
    g, leader = far_behind()
    msg = install_message(g, leader)
    follower = g.nodes[3]
    # 3 got the commit index of a heartbeat in flight: applies entry 1 in a Ready...
    follower.step(Heartbeat(1, 3, leader.term, 1))
    first = follower.ready()
    # ... and the snapshot arrives before that Ready is advanced.
    follower.step(msg)
    g.persist(3, first)
    follower.advance(first)
    assert follower.applied == msg.index and follower.commit == msg.index
    second = follower.ready()
    assert second.snapshot is not None and not second.committed_entries
    g.persist(3, second)
    follower.advance(second)
    assert follower.status().first_index == msg.index + 1


def test_newer_snapshot_while_one_is_out() -> None:
    g, leader = far_behind()
    msg = install_message(g, leader)
    follower = g.nodes[3]
    follower.step(msg)
    first = follower.ready()
    newer = InstallSnapshot(1, 3, msg.term, msg.index + 3, msg.snap_term, msg.end_position + 300)
    follower.step(newer)
    g.persist(3, first)
    follower.advance(first)
    second = follower.ready()
    assert second.snapshot is not None and second.snapshot.index == msg.index + 3
    g.persist(3, second)
    follower.advance(second)
    assert follower.log.snapshot == second.snapshot and follower.log.unstable_snapshot is None


# ---------------------------------------------------------------- restart


def test_restart_from_storage_that_starts_after_a_snapshot() -> None:
    g = Group()
    leader = g.elect(1)
    g.propose(1, 6)
    for i in g.ids:
        g.storages[i].compact(g.nodes[i].applied - 2)
    # Hard state commit is a lazy lower bound: it may be behind the snapshot.
    g.storages[2].set_hard_state(HardState(leader.term, 1, 1))
    g.readies[2] = []
    node = g.start(2)
    snap = g.storages[2].snapshot()
    assert snap is not None
    assert node.commit >= snap.index and node.applied == snap.index
    assert node.log.first_index() == snap.index + 1
    assert node.log.term(snap.index) == snap.term
    # It applies only what follows the snapshot, and replication goes on.
    g.stabilize()
    applied = [e.index for r in g.readies[2] for e in r.committed_entries]
    assert all(index > snap.index for index in applied)
    leader.propose(EntryKind.MESSAGES, b"after restart")
    g.settle(1)
    assert node.commit == leader.commit


def test_node_whose_whole_log_is_compacted_can_lead() -> None:
    g = Group()
    leader = g.elect(1)
    g.propose(1, 3)
    for i in g.ids:
        g.storages[i].compact(g.nodes[i].applied)
        g.start(i, applied=g.nodes[i].applied)
    node = g.nodes[2]
    assert node.log.last_index == g.storages[2].snapshot().index  # type: ignore[union-attr]
    assert node.log.last_term() == leader.term
    g.elect(2)
    g.nodes[2].propose(EntryKind.MESSAGES, b"new")
    g.settle(2)
    assert all(g.nodes[i].commit == g.nodes[2].log.last_index for i in g.ids)


def test_stale_append_below_a_compacted_commit_is_reanchored() -> None:
    """An old append whose prev lies below the follower's first index must not crash it."""
    g = Group()
    leader = g.elect(1)
    g.propose(1, 8)
    follower = g.nodes[2]
    g.storages[2].compact(follower.applied)
    g.start(2, applied=follower.applied)
    follower = g.nodes[2]
    early = g.storages[1].all_entries()[1:3]
    follower.step(AppendRequest(1, 2, leader.term, 1, early[0].term, tuple(early),
                                leader.commit))
    ready = follower.ready()
    acks = [m for m in ready.messages_after_persist if isinstance(m, AppendResponse)]
    assert acks and acks[0].success
    follower.advance(ready)


def test_leader_lacking_an_entry_of_our_snapshot_is_a_committed_divergence() -> None:
    """flush=async may lose a committed entry on a quorum; a replica whose snapshot
    holds it must notice even though the entry's own term is compacted away."""
    storage = MemoryLogStorage(HardState(4, 0, 9), snapshot=SnapshotMeta(9, 2, 900))
    node = RaftNode(Config(3, frozenset({1, 2, 3})), storage, random.Random(3), PLACE)
    assert node.commit == 9
    # The leader of term 5 ends at 8 with its NOOP: it cannot hold our 9 of term 2.
    with pytest.raises(CommittedDivergence) as caught:
        node.step(AppendRequest(1, 3, 5, 8, 5, (), 8))
    assert caught.value.anchor == 9 and caught.value.index == 8
    node = RaftNode(Config(3, frozenset({1, 2, 3})), storage, random.Random(3), PLACE)
    with pytest.raises(CommittedDivergence):
        node.step(InstallSnapshot(1, 3, 5, 8, 5, 800))
    # Terms at or below the snapshot's say nothing: accepted as before.
    node = RaftNode(Config(3, frozenset({1, 2, 3})), storage, random.Random(3), PLACE)
    node.step(AppendRequest(1, 3, 5, 7, 2, (), 9))
    node.step(InstallSnapshot(1, 3, 5, 9, 2, 900))
    assert node.commit == 9
