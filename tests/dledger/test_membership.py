"""Membership changes in the Raft core: the configuration in effect, the change rules,
voter-only quorums, identity pinning, snapshots carrying the configuration.

The scripted stories (add, promote, remove, a refused self-removal, a change
refused while one is pending, a truncated CONFIG entry reverting, a wiped
node that cannot vote until it rejoins) are the transcripts
tests/dledger/testdata/membership_*.txt; these tests pin down the rules one
at a time.
"""

from __future__ import annotations

import random

import pytest

from dledger import (
    Config,
    Entry,
    EntryKind,
    HardState,
    Member,
    Membership,
    MembershipChangeRefused,
    MemoryLogStorage,
    NotLeader,
    RaftNode,
    SnapshotMeta,
)
from dledger.entry import ENTRY_HEADER_BYTES, segment_placement
from dledger.membership import (
    ConfigHistory,
    add_learner,
    bootstrap,
    encode,
    pin,
    promote,
    rejoin,
    remove,
)
from dledger.messages import (
    AppendRequest,
    AppendResponse,
    Heartbeat,
    InstallSnapshot,
    VoteRequest,
    VoteResponse,
)
from dledger.testing.interaction import InteractionEnv
from election import VoteOutcome, VoteTally
from election.config import ElectionConfig
from election.roles import Role

PLACE = segment_placement(1 << 20)
ELECTION = ElectionConfig(election_timeout_ticks=10, heartbeat_interval_ticks=1,
                          pre_vote=False, check_quorum=False)


def cluster(nodes: int = 3, identity: bool = True) -> InteractionEnv:
    """A group whose node 1 leads and has committed its first entries."""
    env = InteractionEnv()
    env.handle(f"add-nodes {nodes} pre_vote=false check_quorum=false segment=65536 "
               f"identity={'true' if identity else 'false'}")
    env.handle("campaign 1")
    env.handle("stabilize")
    return env


def leader(env: InteractionEnv) -> RaftNode:
    node = env.nodes[1]
    assert node is not None and node.role is Role.LEADER
    return node


def log_of(*items: tuple[int, int, bytes]) -> list[Entry]:
    """Entries (term, kind, data) from index 1, placed by PLACE."""
    out, end = [], 0
    for index, (term, kind, data) in enumerate(items, 1):
        position = PLACE(end, ENTRY_HEADER_BYTES + len(data))
        out.append(Entry(index, term, kind, data, position))
        end = position + ENTRY_HEADER_BYTES + len(data)
    return out


THREE = bootstrap({1: "", 2: "", 3: ""})
PINNED = pin(pin(pin(THREE, 1, 11), 2, 22), 3, 33)


# ------------------------------------------------------------ configuration


def test_config_bootstrap_and_joining_node() -> None:
    assert Config(1, frozenset({1, 2, 3})).bootstrap_membership() == THREE
    joining = Config(4, frozenset({1, 2, 3}))  # a node need not be a voter
    assert 4 not in joining.bootstrap_membership().node_ids
    given = Config(1, frozenset(), membership=PINNED, directory_id=11)
    assert given.bootstrap_membership() is PINNED
    with pytest.raises(ValueError):
        Config(1, frozenset())
    with pytest.raises(ValueError):
        Config(0, frozenset({1}))
    with pytest.raises(ValueError):
        Config(1, frozenset({1}), promote_lag_max=-1)


def test_config_history_follows_appends_truncations_and_snapshots() -> None:
    history = ConfigHistory(0, THREE)
    four = add_learner(THREE, Member(4))
    history.add(5, PINNED)
    history.add(9, four)
    assert history.current == (9, four)
    assert history.at(4) == (0, THREE) and history.at(5) == (5, PINNED)
    assert history.at(8) == (5, PINNED) and history.at(100) == (9, four)
    assert history.truncate_from(9) and history.current == (5, PINNED)
    assert not history.truncate_from(6)
    history.add(7, four)
    history.prune(7)
    assert history.items() == ((7, four),)
    history.reset(20, THREE)
    assert history.current == (20, THREE) and len(history) == 1


def test_start_scans_the_stored_log_and_the_snapshot() -> None:
    pinned = encode(PINNED)
    four = add_learner(PINNED, Member(4, "", 44))
    entries = log_of((1, EntryKind.CONFIG, pinned), (1, EntryKind.MESSAGES, b"a"),
                     (2, EntryKind.CONFIG, encode(four)), (2, EntryKind.MESSAGES, b"b"))
    storage = MemoryLogStorage(HardState(2, 0, 2), entries)
    node = RaftNode(Config(1, frozenset({1, 2, 3}), election=ELECTION, directory_id=11),
                    storage, random.Random(1), PLACE)
    assert node.membership == four and node.membership_index == 3
    assert node.membership_pending and node.committed_membership == PINNED
    assert node.membership_at(1) == PINNED and node.membership_at(2) == PINNED
    assert node.elector.voters == frozenset({1, 2, 3})
    # Compaction records the configuration at the snapshot index...
    meta = storage.compact(3)
    assert meta.membership == four
    # ...and a node restarted on the compacted log starts from it.
    again = RaftNode(Config(1, frozenset({1, 2, 3}), election=ELECTION), storage,
                     random.Random(1), PLACE, applied=3)
    assert again.membership == four and again.membership_index == 3
    # An old snapshot without a configuration: the bootstrap one.
    old = MemoryLogStorage(snapshot=SnapshotMeta(7, 1, 500))
    node = RaftNode(Config(1, frozenset({1, 2, 3})), old, random.Random(1), PLACE, applied=7)
    assert node.membership == THREE and node.membership_index == 0


def test_install_snapshot_carries_and_restores_the_configuration() -> None:
    four = add_learner(PINNED, Member(4, "", 44))
    follower = RaftNode(Config(4, frozenset({1, 2, 3}), election=ELECTION, directory_id=44),
                        MemoryLogStorage(), random.Random(4), PLACE)
    assert follower.membership == THREE and not follower.elector.is_voter()
    follower.step(InstallSnapshot(1, 4, 3, 10, 2, 900, four, directory_id=11))
    assert follower.membership == four and follower.membership_index == 10
    ready = follower.ready()
    assert ready.snapshot is not None and ready.snapshot.membership == four


# ------------------------------------------------------------------ changes


def test_change_rules_refuse_with_a_reason() -> None:
    env = cluster()
    node = leader(env)
    current = node.membership
    assert current.voter_ids == {1, 2, 3} and not current.unpinned()

    def refused(new: Membership, why: str, transient: bool = False) -> None:
        """Refused for `why`; `transient`: a refusal that passes by itself
        (asking again later may succeed), which callers retry on."""
        with pytest.raises(MembershipChangeRefused) as exc:
            node.propose_membership(new)
        assert why in exc.value.reason
        assert exc.value.transient is transient

    refused(current, "equals the current one")
    refused(remove(current, 1), "cannot remove or demote itself")
    refused(rejoin(current, 1, 999), "cannot remove or demote itself")
    two = add_learner(add_learner(current, Member(4, "", 401)), Member(5, "", 501))
    refused(Membership(two.voters + two.learners), "more than one voter")
    refused(Membership((*current.voters, Member(4, "", 401))), "join as a learner first")
    pinned_elsewhere = Membership(tuple(
        Member(m.node_id, m.address, 999 if m.node_id == 2 else m.directory_id)
        for m in current.voters))
    refused(pinned_elsewhere, "only through a rejoin")
    with pytest.raises(ValueError):
        node.propose(EntryKind.CONFIG, encode(current))  # not through propose
    env.handle("add-node 4")
    index, _ = node.propose_membership(add_learner(current, Member(4, "", 401)))
    refused(promote(node.membership, 4), "pending", transient=True)
    assert node.membership_pending and node.membership_index == index
    assert node.membership.learner_ids == {4}
    env.handle("isolate 4")
    env.handle("stabilize")
    assert not node.membership_pending
    refused(promote(node.membership, 4), "has not caught up", transient=True)
    env.handle("heal")
    env.handle("tick 1")  # a heartbeat: 4 answers and is caught up
    env.handle("stabilize")
    node.propose_membership(promote(node.membership, 4))
    env.handle("stabilize")
    assert node.membership.voter_ids == {1, 2, 3, 4} and node.committed_membership.voter_ids == {
        1, 2, 3, 4}
    with pytest.raises(NotLeader):
        follower = env.nodes[2]
        assert follower is not None
        follower.propose_membership(remove(node.membership, 3))


def test_a_new_leader_changes_nothing_before_its_first_commit() -> None:
    env = cluster()
    env.handle("isolate 1")
    env.handle("campaign 2")
    env.handle("process-ready 2")
    env.handle("deliver-msgs 3")
    env.handle("process-ready 3")
    env.handle("deliver-msgs 2")
    env.handle("process-ready 2")  # leader of term 2, its first entry not committed
    node = env.nodes[2]
    assert node is not None and node.role is Role.LEADER
    with pytest.raises(MembershipChangeRefused) as exc:
        node.propose_membership(remove(node.membership, 1))
    assert "has not committed an entry of its term" in exc.value.reason
    assert exc.value.transient


def test_the_leader_pins_a_learner_once_it_hears_from_it() -> None:
    env = cluster()
    node = leader(env)
    env.handle("add-node 4")
    env.handle("isolate 4")
    node.propose_membership(add_learner(node.membership, Member(4)))  # unpinned
    env.handle("stabilize")
    member = node.membership.member(4)
    assert member is not None and member.directory_id == 0
    env.handle("heal")
    env.handle("tick 1")
    env.handle("stabilize")  # 4 answers: the leader pins it on its own
    member = node.membership.member(4)
    assert member is not None and member.directory_id == 401
    node.propose_membership(promote(node.membership, 4))
    env.handle("stabilize")
    assert 4 in node.membership.voter_ids


def test_no_change_leaves_fewer_than_a_quorum_pinned_nor_promotes_an_unpinned_learner() -> None:
    voters = Membership((Member(1, "", 11), Member(2, "", 22), Member(3, "", 33), Member(4),
                         Member(5)), (Member(6),))
    storage = MemoryLogStorage(HardState(1, 1, 1), log_of((1, EntryKind.CONFIG, encode(voters))))
    node = RaftNode(Config(1, frozenset({1}), election=ELECTION, directory_id=11,
                           membership=voters, promote_lag_max=100),
                    storage, random.Random(1), PLACE)
    node.campaign()
    node.advance(node.ready())
    for peer, directory in ((2, 22), (3, 33)):  # a pinned quorum: only pinned votes count
        node.step(VoteResponse(peer, 1, 2, True, directory_id=directory))
    assert node.role is Role.LEADER and node.log.entry(2).kind == EntryKind.NOOP
    ready = node.ready()
    storage.append(ready.entries)
    node.advance(ready)
    node.step(AppendResponse(2, 1, 2, True, 2, directory_id=22))
    node.step(AppendResponse(3, 1, 2, True, 2, directory_id=33))
    assert node.commit == 2
    with pytest.raises(MembershipChangeRefused) as exc:
        node.propose_membership(remove(node.membership, 2))
    assert "fewer than a quorum" in exc.value.reason and not exc.value.transient
    with pytest.raises(MembershipChangeRefused) as exc:
        node.propose_membership(promote(node.membership, 6))
    assert "not pinned yet" in exc.value.reason and exc.value.transient
    node.propose_membership(remove(node.membership, 4))  # three of four still pinned


# ------------------------------------------------------------------ quorums


def test_learners_are_replicated_but_never_counted() -> None:
    env = cluster()
    node = leader(env)
    env.handle("add-node 4")
    node.propose_membership(add_learner(node.membership, Member(4, "", 401)))
    env.handle("stabilize")
    assert set(node.progress) == {2, 3, 4} and node.elector.peers == (2, 3)
    status = node.status()
    assert status.progress[4].learner and not status.progress[2].learner
    assert status.membership == node.membership and not status.membership_pending
    env.handle("partition 1,4 2,3")
    index, _ = node.propose(EntryKind.MESSAGES, b"x")
    env.handle("stabilize")
    learner = env.nodes[4]
    assert learner is not None and learner.log.last_index == index
    assert node.commit < index  # the learner holds it; no voter but the leader does
    # A learner never campaigns, even told to.
    learner.campaign()
    learner.tick()
    assert learner.role is Role.FOLLOWER and not learner.has_ready()


def test_a_candidate_tells_its_learners_the_term_and_does_not_count_them() -> None:
    """A learner in the candidate's configuration may be a voter in a later
    one the candidate has not seen: asked too, it learns the term (asked
    nothing, it campaigned a term behind a stale node forever, core
    simulator seed 19401942). Its answer counts for nothing."""
    env = cluster()
    node = leader(env)
    env.handle("add-node 4")
    node.propose_membership(add_learner(node.membership, Member(4, "", 401)))
    env.handle("stabilize")
    env.handle("partition 2,4 1,3")
    env.handle("campaign 2")
    env.handle("stabilize")
    candidate, learner = env.nodes[2], env.nodes[4]
    assert candidate is not None and learner is not None
    assert learner.term == candidate.term == node.term + 1
    assert candidate.role is Role.CANDIDATE  # the learner's answer is not a vote


def test_a_voter_answering_from_another_directory_is_not_counted() -> None:
    env = cluster()
    node = leader(env)
    index, _ = node.propose(EntryKind.MESSAGES, b"y")
    env.handle("process-ready 1")
    term = node.term
    # 2 answers from another disk (wiped, caught up): its ack does not commit.
    node.step(AppendResponse(2, 1, term, True, index, directory_id=202))
    assert node.commit < index
    assert node.status().progress[2].identity_mismatch
    node.step(AppendResponse(3, 1, term, True, index, directory_id=301))
    assert node.commit == index


def test_vote_tally_counts_identities() -> None:
    pins = {1: 11, 2: 22, 3: 0}
    tally = VoteTally(frozenset({1, 2, 3}), pins)
    assert tally.record(1, True, 11) is VoteOutcome.PENDING
    assert tally.record(2, True, 99) is VoteOutcome.PENDING  # another directory: refused
    # An unpinned voter's grant counts, even with a quorum pinned: a voter the
    # leader never heard from before it died (slow to start) must be able to
    # elect the next leader (found by tests/dledger/test_node_process.py).
    assert tally.record(3, True, 33) is VoteOutcome.WON
    loose = VoteTally(frozenset({1, 2, 3}), {1: 11, 2: 0, 3: 0})  # one pinned: not strict
    loose.record(1, True, 11)
    assert loose.record(3, True, 33) is VoteOutcome.WON
    assert loose.granted_by() == {1, 3}


def test_a_candidate_is_judged_by_its_log_not_by_a_pin_this_voter_may_lag() -> None:
    """A wiped candidate campaigns from an empty log and the log rule refuses it;
    a rejoined and promoted one this voter lags behind (it still has the old
    pin) gets the vote: refusing it could leave the group without a leader."""

    def vote(request: VoteRequest) -> VoteResponse:
        storage = MemoryLogStorage(HardState(1, 0, 0),
                                   log_of((1, EntryKind.CONFIG, encode(PINNED))))
        node = RaftNode(Config(2, frozenset({1, 2, 3}), election=ELECTION, directory_id=22),
                        storage, random.Random(2), PLACE)
        node.step(request)
        ready = node.ready()
        votes = [m for m in ready.messages + ready.messages_after_persist
                 if isinstance(m, VoteResponse)]
        assert len(votes) == 1 and votes[0].directory_id == 22
        return votes[0]

    assert not vote(VoteRequest(3, 2, 2, 0, 0, directory_id=34)).granted
    assert vote(VoteRequest(3, 2, 2, 9, 2, directory_id=34)).granted


def test_a_node_pinned_to_another_directory_does_not_campaign() -> None:
    """A wiped node that re-read the log's pins knows it: it never campaigns.
    It may still grant votes (its log decides), and they carry its new
    directory, which no candidate that knows the pin counts."""
    storage = MemoryLogStorage(HardState(1, 0, 0), log_of((1, EntryKind.CONFIG, encode(PINNED))))
    wiped = RaftNode(Config(3, frozenset({1, 2, 3}), election=ELECTION, directory_id=34),
                     storage, random.Random(3), PLACE)
    assert not wiped.elector.is_voter()
    wiped.campaign()
    for _ in range(40):
        wiped.tick()
    assert wiped.role is Role.FOLLOWER and wiped.term == 1
    wiped.step(VoteRequest(2, 3, 2, 5, 1, directory_id=22))
    ready = wiped.ready()
    votes = [m for m in ready.messages + ready.messages_after_persist
             if isinstance(m, VoteResponse)]
    assert votes and votes[0].granted and votes[0].directory_id == 34
    tally = VoteTally(PINNED.voter_ids, {m.node_id: m.directory_id for m in PINNED.voters})
    tally.record(2, True, 22)
    assert tally.record(3, True, 34) is VoteOutcome.PENDING


def test_an_empty_log_asks_before_it_raises_its_term() -> None:
    """With identity tracked, a node with an empty log pre-votes even with pre-vote off."""
    storage = MemoryLogStorage()
    node = RaftNode(Config(3, frozenset({1, 2, 3}), election=ELECTION, directory_id=34),
                    storage, random.Random(3), PLACE)
    node.campaign()
    assert node.role is Role.PRE_CANDIDATE and node.term == 0
    plain = RaftNode(Config(3, frozenset({1, 2, 3}), election=ELECTION), MemoryLogStorage(),
                     random.Random(3), PLACE)
    plain.campaign()
    assert plain.role is Role.CANDIDATE and plain.term == 1


def test_every_message_carries_the_directory_id() -> None:
    env = cluster()
    node = leader(env)
    node.propose(EntryKind.MESSAGES, b"z")
    node.tick()
    ready = node.ready()
    sent = ready.messages + ready.messages_after_persist
    assert sent and {type(m) for m in sent} >= {AppendRequest, Heartbeat}
    assert all(m.directory_id == 101 for m in sent)


def test_without_identity_nothing_is_pinned() -> None:
    env = cluster(identity=False)
    node = leader(env)
    assert not node.membership.voters[0].directory_id
    first = node.log.entry(1)
    assert first.kind == EntryKind.NOOP  # no pins: the first entry stays a NOOP


def test_a_removed_node_added_again_is_pinned_to_its_new_directory() -> None:
    """Found by the chaos harness's churn: the leader remembered the directory a
    removed node had answered from, pinned the same id re-added as a new
    machine to it, and refused every promotion of it."""
    env = cluster()
    node = leader(env)
    env.handle("add-node 4")
    node.propose_membership(add_learner(node.membership, Member(4)))
    env.handle("stabilize")
    first = node.membership.member(4)
    assert first is not None and first.directory_id == 401
    node.propose_membership(remove(node.membership, 4))
    env.handle("stabilize")
    assert 4 not in node.membership.node_ids
    env.handle("wipe 4")  # the same id comes back as a new machine
    env.handle("isolate 4")
    node.propose_membership(add_learner(node.membership, Member(4)))
    env.handle("stabilize")
    member = node.membership.member(4)
    assert member is not None and member.directory_id == 0  # not its old directory
    env.handle("heal")
    env.handle("tick 1")
    env.handle("stabilize")
    member = node.membership.member(4)
    assert member is not None and member.directory_id not in (0, 401)
    node.propose_membership(promote(node.membership, 4))
    env.handle("stabilize")
    assert 4 in node.membership.voter_ids
