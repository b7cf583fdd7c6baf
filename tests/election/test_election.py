"""Unit tests of the election rules: quorum, up-to-date check, tallies, transitions, timers."""

from __future__ import annotations

import random

import pytest

from election import (
    ElectionConfig,
    Elector,
    Heartbeat,
    HeartbeatResponse,
    Role,
    TickAction,
    VoteOutcome,
    VoteRequest,
    VoteResponse,
    VoteTally,
    log_up_to_date,
    quorum_size,
)
from election.roles import IllegalTransition, check_transition


def make(node_id: int = 1, voters: int = 3, **kw: object) -> Elector:
    config = ElectionConfig(**kw)  # type: ignore[arg-type]
    return Elector(node_id, frozenset(range(1, voters + 1)), config, random.Random(node_id))


def test_quorum_sizes() -> None:
    assert [quorum_size(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]


def test_up_to_date_compares_last_term_before_length() -> None:
    assert log_up_to_date(3, 1, 2, 100)  # higher last term wins despite a shorter log
    assert not log_up_to_date(2, 100, 3, 1)
    assert log_up_to_date(2, 5, 2, 5)
    assert not log_up_to_date(2, 4, 2, 5)


def test_tally_counts_each_voter_once() -> None:
    tally = VoteTally(frozenset({1, 2, 3, 4, 5}))
    assert tally.record(1, True) is VoteOutcome.PENDING
    assert tally.record(2, True) is VoteOutcome.PENDING
    assert tally.record(2, True) is VoteOutcome.PENDING  # duplicate ignored
    assert tally.record(3, False) is VoteOutcome.PENDING
    assert tally.record(4, False) is VoteOutcome.PENDING
    assert tally.record(5, False) is VoteOutcome.LOST
    assert tally.record(9, True) is VoteOutcome.LOST  # not a voter


def test_illegal_transition_raises() -> None:
    with pytest.raises(IllegalTransition):
        check_transition(Role.FOLLOWER, Role.LEADER)
    with pytest.raises(IllegalTransition):
        check_transition(Role.LEADER, Role.CANDIDATE)


def test_randomized_timeout_in_range_and_campaign_due() -> None:
    e = make(election_timeout_ticks=10)
    assert 10 <= e.randomized_timeout < 20
    actions = [e.tick() for _ in range(e.randomized_timeout)]
    assert actions[-1] is TickAction.CAMPAIGN
    assert all(a is TickAction.NONE for a in actions[:-1])


def test_one_vote_per_term() -> None:
    e = make(node_id=3, check_quorum=False)
    e.filter_term(VoteRequest(1, 3, 5, 0, 0))
    first = e.decide_vote(VoteRequest(1, 3, 5, 0, 0), 0, 0)
    second = e.decide_vote(VoteRequest(2, 3, 5, 0, 0), 0, 0)
    assert first.granted and not second.granted
    assert (e.term, e.vote) == (5, 1)


def test_pre_vote_does_not_change_term() -> None:
    e = make(node_id=2, check_quorum=False)
    process, _ = e.filter_term(VoteRequest(1, 2, 7, 0, 0, pre_vote=True))
    assert process
    answer = e.decide_vote(VoteRequest(1, 2, 7, 0, 0, pre_vote=True), 0, 0)
    assert answer.granted and answer.term == 7
    assert (e.term, e.vote) == (0, 0)


def test_lease_ignores_vote_requests_but_not_transfers() -> None:
    e = make(node_id=2)
    e.become_follower(1, 1)
    process, reply = e.filter_term(VoteRequest(3, 2, 2, 0, 0))
    assert (process, reply, e.term) == (False, None, 1)
    process, _ = e.filter_term(VoteRequest(3, 2, 2, 0, 0, transfer=True))
    assert process and e.term == 2


def test_stale_leader_is_told_the_new_term() -> None:
    e = make(node_id=2)
    e.become_follower(4, 3)
    process, reply = e.filter_term(Heartbeat(1, 2, 3, 0))
    assert not process
    assert reply == HeartbeatResponse(2, 1, 4)


def test_check_quorum_steps_down_alone() -> None:
    e = make(node_id=1, election_timeout_ticks=4)
    e.become_candidate()
    e.become_leader()
    for _ in range(3):
        assert not e.tick() & TickAction.STEPPED_DOWN
    assert e.tick() & TickAction.STEPPED_DOWN
    assert e.role is Role.FOLLOWER


def test_stray_prevote_answer_not_counted_in_real_round() -> None:
    e = make(node_id=1)
    e.become_candidate()
    assert e.record_vote(VoteResponse(2, 1, e.term, True, pre_vote=True)) is VoteOutcome.PENDING
    assert e.record_vote(VoteResponse(2, 1, e.term, True)) is VoteOutcome.WON


def test_refused_candidate_does_not_reset_the_election_timer() -> None:
    # Raft paper, Figure 2: the timer restarts on a leader's message or a
    # granted vote. A stale candidate whose term we adopt but whose log we
    # refuse must not keep our timer at zero (a seed of the simulator
    # livelocked that way: the stale node campaigned forever, nobody else did).
    e = make(node_id=2, check_quorum=False, pre_vote=False)
    for _ in range(e.randomized_timeout - 1):
        assert e.tick() is TickAction.NONE
    stale = VoteRequest(1, 2, 5, last_index=3, last_term=1)
    process, _ = e.filter_term(stale)
    assert process and e.term == 5
    assert not e.decide_vote(stale, own_last_index=9, own_last_term=2).granted
    assert e.tick() is TickAction.CAMPAIGN  # the timer ran on through the refusal


def test_granted_vote_resets_the_election_timer() -> None:
    e = make(node_id=2, check_quorum=False, pre_vote=False)
    for _ in range(e.randomized_timeout - 1):
        e.tick()
    request = VoteRequest(1, 2, 5, last_index=9, last_term=2)
    e.filter_term(request)
    assert e.decide_vote(request, own_last_index=9, own_last_term=2).granted
    assert e.election_elapsed == 0


def _following(leader: int = 2, **kw: object) -> Elector:
    e = make(1, **kw)
    e.become_follower(3, leader)
    e.heard_from_leader(leader)
    return e


def _ticks_to_campaign(e: Elector, limit: int = 100) -> int:
    for n in range(1, limit + 1):
        if e.tick() & TickAction.CAMPAIGN:
            return n
    raise AssertionError("no campaign")


def test_leader_lost_ends_the_lease_and_campaigns_within_a_few_ticks() -> None:
    delays = set()
    for seed in range(40):
        e = Elector(1, frozenset({1, 2, 3}), ElectionConfig(lost_leader_ticks=4),
                    random.Random(seed))
        e.become_follower(3, 2)
        e.heard_from_leader(2)
        assert e.in_lease()
        assert e.leader_lost(2)
        assert not e.in_lease() and e.leader_id == 0
        delays.add(_ticks_to_campaign(e))
    assert delays == {1, 2, 3, 4}  # randomised, so two followers rarely collide


def test_leader_lost_is_ignored_unless_a_follower_of_that_leader() -> None:
    e = _following(2)
    assert not e.leader_lost(3)  # another node
    assert not e.leader_lost(0)
    assert e.in_lease() and e.leader_id == 2
    leader = make(1)
    leader.become_pre_candidate()
    assert not leader.leader_lost(2)  # a pre-candidate has no leader to lose


@pytest.mark.parametrize("switch", ["pre_vote", "check_quorum"])
def test_leader_lost_needs_pre_vote_and_check_quorum(switch: str) -> None:
    # Without them a wrong notice would let a lone follower depose a healthy leader.
    e = _following(2, **{switch: False})
    assert not e.leader_lost(2)
    assert e.leader_id == 2
    assert _ticks_to_campaign(e) >= e.config.election_timeout_ticks


def test_hearing_the_leader_again_restores_the_full_timeout() -> None:
    e = _following(2)
    assert e.leader_lost(2)
    e.tick()
    e.heard_from_leader(2)  # the notice was wrong: the leader is still there
    assert e.in_lease()
    assert _ticks_to_campaign(e) >= e.config.election_timeout_ticks


def test_lost_leader_ticks_is_validated() -> None:
    with pytest.raises(ValueError):
        ElectionConfig(lost_leader_ticks=0)
    # Never later than the election timeout would have fired anyway.
    e = Elector(1, frozenset({1, 2, 3}), ElectionConfig(election_timeout_ticks=2,
                                                         heartbeat_interval_ticks=1),
                random.Random(1))
    e.become_follower(3, 2)
    e.heard_from_leader(2)
    assert e.leader_lost(2) and _ticks_to_campaign(e) <= 2


def test_after_leader_lost_a_split_vote_is_retried_within_a_few_ticks() -> None:
    from election.elector import LOST_LEADER_ROUNDS

    e = _following(2)
    assert e.leader_lost(2)
    waits = []
    for _ in range(LOST_LEADER_ROUNDS + 1):
        waits.append(_ticks_to_campaign(e))
        e.become_pre_candidate()  # its round goes unanswered (a split, a lease)
    # The notice's own wait and the retries are short; then a full timeout.
    assert all(w <= 4 for w in waits[:LOST_LEADER_ROUNDS])
    assert waits[LOST_LEADER_ROUNDS] >= e.config.election_timeout_ticks


def _pre_vote(src: int, last_index: int, last_term: int = 3) -> VoteRequest:
    return VoteRequest(src, 1, 4, last_index, last_term, pre_vote=True)


def test_a_leader_lost_follower_with_the_longer_log_hurries_after_refusing() -> None:
    # Reserves (RaftNode rule 8) leave a dead leader's reserve a few entries
    # behind its quick follower: the reserve's timer may fire first, but only
    # the quick follower can win, so it campaigns as soon as it refuses.
    e = _following(2)
    assert e.leader_lost(2)
    behind = _pre_vote(3, last_index=7)
    assert not e.decide_vote(behind, 10, 3).granted
    assert e.hurry_after_refusal(behind, 10, 3)


@pytest.mark.parametrize("case", ["equal log", "longer log", "real vote", "no notice",
                                  "pre-candidate"])
def test_no_hurry_where_the_refuser_could_not_be_the_one_to_lead(case: str) -> None:
    e = _following(2)
    if case != "no notice":
        assert e.leader_lost(2)
    request = _pre_vote(3, last_index=7)
    own_index = 10
    if case == "equal log":
        own_index = 7  # the candidate can win too: nothing to hurry for
    elif case == "longer log":
        own_index = 5
    elif case == "real vote":
        request = VoteRequest(3, 1, 4, 7, 3)
    elif case == "pre-candidate":
        e.become_pre_candidate()  # already campaigning
    timeout = e.randomized_timeout
    assert not e.hurry_after_refusal(request, own_index, 3)
    assert e.randomized_timeout == timeout  # and its timer unchanged


def test_with_five_voters_the_quick_followers_hurry_to_their_next_tick() -> None:
    # Two quick followers refuse the same reserve at once: campaigning at once
    # they would split the vote; each campaigns at its own next tick instead.
    e = _following(2, voters=5, lost_leader_ticks=4)
    assert e.leader_lost(2)
    e.randomized_timeout = 4
    assert not e.hurry_after_refusal(_pre_vote(3, last_index=7), 10, 3)
    assert _ticks_to_campaign(e) == 1
