"""The pure safety predicates flag what they must and nothing else."""

from __future__ import annotations

import pytest

from dledger import AppendResponse, Entry, HardState, VoteRequest, VoteResponse
from dledger.invariants import (
    SafetyChecker,
    SafetyViolation,
    check_acked_exactly_once,
    check_electable_complete,
    check_final_state,
    check_leader_complete,
    check_leader_unique,
    check_log_matching,
    check_message_durable,
    check_prefixes_identical,
    check_snapshot_matching,
    check_state_matches,
)


def e(index: int, term: int, data: bytes = b"", position: int = 0) -> Entry:
    return Entry(index, term, 1, data, position)


def test_leader_unique() -> None:
    assert check_leader_unique({3: 1}, 3, 1) is None
    assert check_leader_unique({3: 1}, 4, 2) is None
    assert check_leader_unique({3: 1}, 3, 2) is not None


def test_log_matching_compares_entry_and_predecessor() -> None:
    seen = {(2, 1): (e(2, 1, b"a", 48), 1)}
    assert check_log_matching(seen, e(2, 1, b"a", 48), 1) is None
    assert check_log_matching(seen, e(2, 1, b"b", 48), 1) is not None  # other data
    assert check_log_matching(seen, e(2, 1, b"a", 96), 1) is not None  # other position
    assert check_log_matching(seen, e(2, 1, b"a", 48), 0) is not None  # other predecessor


def test_message_durability() -> None:
    def no_entries(index: int) -> int | None:
        return None

    durable = HardState(term=2, vote=3)
    granted = VoteResponse(1, 3, 2, True)
    assert check_message_durable(granted, durable, no_entries) is None
    assert check_message_durable(VoteResponse(1, 4, 2, True), durable, no_entries) is not None
    assert check_message_durable(VoteResponse(1, 4, 1, True), durable, no_entries) is None  # stale
    assert check_message_durable(VoteRequest(1, 2, 3, 0, 0), durable, no_entries) is not None
    pre_vote = VoteRequest(1, 2, 3, 0, 0, pre_vote=True)
    assert check_message_durable(pre_vote, durable, no_entries) is None
    assert check_message_durable(AppendResponse(1, 2, 2, True, 5), durable, no_entries) is not None
    assert check_message_durable(AppendResponse(1, 2, 2, True, 5), durable, lambda i: 2) is None


def test_electable_complete_catches_figure_8() -> None:
    committed = e(2, 1)
    # Node 2 lacks 2/1 but its last term (2) beats node 3's durable last 2/1.
    candidates = {1: (True, 1, 2), 2: (False, 2, 2), 3: (True, 1, 2)}
    voters = {1: (3, 3), 2: (2, 2), 3: (1, 2)}
    assert check_electable_complete(committed, candidates, voters) is not None
    voters[3] = (3, 3)  # once node 3 holds the new leader's entry, 2 cannot win
    assert check_electable_complete(committed, candidates, voters) is None


def test_final_log_checks() -> None:
    log = [e(1, 1), e(2, 1, b"x")]
    assert check_prefixes_identical({1: log, 2: list(log)}, 2) is None
    assert check_prefixes_identical({1: log, 2: [e(1, 1), e(2, 2, b"x")]}, 2) is not None
    assert check_prefixes_identical({1: log, 2: log[:1]}, 2) is not None
    assert check_acked_exactly_once([b"x"], log) is None
    assert check_acked_exactly_once([b"x"], [*log, e(3, 1, b"x")]) is not None


def test_checker_refuses_changed_commit() -> None:
    checker = SafetyChecker()
    checker.observe_committed([e(1, 1)])
    with pytest.raises(SafetyViolation):
        checker.observe_committed([e(1, 2)])


def test_leader_complete_counts_the_term_of_the_commit() -> None:
    committed = {14: e(14, 17)}
    lacks = {14: 9}.get
    # Committed in term 26: a leader of term 24 (late votes) need not hold it.
    assert check_leader_complete(committed, lacks, 1, 24, {14: 26}) is None
    assert check_leader_complete(committed, lacks, 1, 27, {14: 26}) is not None
    assert check_leader_complete(committed, lacks, 1, 24) is not None  # entry term only


def test_async_checker_counts_lost_commits_instead_of_failing() -> None:
    checker = SafetyChecker(flush_async=True)
    checker.observe_committed([e(1, 1)])
    checker.observe_committed([e(1, 2)])
    assert checker.committed_lost == 1 and checker.committed[1] == e(1, 2)


def test_snapshot_matching_and_state_safety() -> None:
    assert check_snapshot_matching({(5, 2): 0xAB}, 5, 2, 0xAB) is None
    assert check_snapshot_matching({(5, 2): 0xAB}, 5, 3, 0xCD) is None  # another term
    assert check_snapshot_matching({(5, 2): 0xAB}, 5, 2, 0xCD) is not None
    assert check_state_matches({7: (0x1, 2)}, 3, 7, 0x1) is None
    assert check_state_matches({7: (0x1, 2)}, 3, 8, 0x2) is None
    assert check_state_matches({7: (0x1, 2)}, 3, 7, 0x2) is not None
    assert check_final_state(1, 4, 0x9, 0x9) is None
    assert check_final_state(1, 4, 0x9, 0x8) is not None
    assert check_final_state(1, 4, 0x9, None) is not None


def test_checker_raises_on_state_divergence_under_sync_and_counts_it_under_async() -> None:
    sync = SafetyChecker()
    sync.observe_state(1, 3, 0x10)
    sync.observe_snapshot(3, 1, 0x10)
    with pytest.raises(SafetyViolation):
        sync.observe_state(2, 3, 0x11)
    with pytest.raises(SafetyViolation):
        sync.observe_snapshot(3, 1, 0x11)
    relaxed = SafetyChecker(flush_async=True)
    relaxed.observe_state(1, 3, 0x10)
    relaxed.observe_state(2, 3, 0x11)
    relaxed.observe_snapshot(3, 1, 0x10)
    relaxed.observe_snapshot(3, 1, 0x11)
    assert relaxed.state_divergences == 2
