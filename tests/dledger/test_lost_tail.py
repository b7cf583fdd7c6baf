"""A follower that lost acknowledged entries (flush=async power cut) is repaired, or stops.

Two outcomes are possible when a replica loses entries it had acknowledged:
- only its uncommitted-to-it tail is gone: the leader must notice from the
  follower's rejects and resend from the follower's real end (it used to keep
  probing at its recorded match + 1 forever);
- the leader's log disagrees with an entry the follower has committed: the
  follower must stop with `CommittedDivergence`, never re-anchor at its own
  commit and acknowledge entries on top of a different history.
"""

from __future__ import annotations

import pytest

from dledger.entry import Entry, EntryKind, HardState
from dledger.log import CommittedDivergence
from dledger.messages import AppendRequest
from dledger.progress import Progress, ProgressState
from dledger.testing.interaction import InteractionEnv


def test_probe_below_recorded_match_moves_to_the_followers_end() -> None:
    pr = Progress(next_index=16, inflight_max=4)
    pr.match = 15
    pr.become_probe()  # next = 16: the probe goes out at prev_index 15
    assert pr.decrease(rejected=15, match_hint=14)
    assert (pr.match, pr.next) == (14, 15)


def test_replicate_reject_at_match_is_believed() -> None:
    pr = Progress(next_index=11, inflight_max=4)
    pr.match = 10
    pr.become_replicate()
    pr.sent(12)
    assert pr.decrease(rejected=10, match_hint=7)
    assert pr.state is ProgressState.PROBE and (pr.match, pr.next) == (7, 8)
    assert not pr.decrease(rejected=6, match_hint=3)  # older than the (new) match: stale


def _cluster_with_entries(count: int) -> InteractionEnv:
    env = InteractionEnv()
    env.handle("add-nodes 3")
    env.handle("campaign 1")
    env.handle("stabilize")
    for i in range(count):
        env.handle(f"propose 1 m{i}")
    env.handle("stabilize")
    # The leader's next heartbeat tells the followers its last commit (RaftNode rule 6).
    env.handle("tick 1 1")
    env.handle("stabilize")
    return env


def _power_cut(env: InteractionEnv, node: int, keep: int) -> None:
    """Node `node` loses every entry after `keep` (never fsynced under
    flush=async); the commit it persisted covers no more than that."""
    env.handle(f"crash {node}")
    storage = env.storages[node]
    storage.truncate_after(keep)
    state = storage.hard_state
    storage.set_hard_state(HardState(state.term, state.vote, min(state.commit, keep)))
    env.handle(f"restart {node}")


def test_follower_that_lost_its_tail_catches_up() -> None:
    env = _cluster_with_entries(6)
    leader = env.nodes[1]
    assert leader is not None and leader.progress[3].match == leader.log.last_index == 7
    # Power cut on node 3 under flush=async: its last three acknowledged
    # entries were never fsynced. The commit it persisted covers less.
    _power_cut(env, 3, keep=4)
    env.handle("propose 1 after-restart")
    env.handle("stabilize")
    env.handle("tick 1 2")  # heartbeats: a probe lost on the way is retried
    env.handle("stabilize")
    follower = env.nodes[3]
    assert follower is not None
    assert follower.log.last_index == leader.log.last_index == 8
    assert [follower.log.term(i) for i in range(1, 9)] == [leader.log.term(i) for i in range(1, 9)]
    assert leader.progress[3].match == 8


def test_conflict_below_commit_stops_the_follower() -> None:
    env = _cluster_with_entries(3)
    follower = env.nodes[2]
    assert follower is not None and follower.commit == 4
    term = follower.term
    # A leader (same term, as after data loss elsewhere) claims index 3 has
    # another term than the one this follower committed there.
    forged = Entry(3, term + 0, EntryKind.MESSAGES, b"other", 0)
    msg = AppendRequest(1, 2, term, 2, follower.log.term(2) + 5, (forged,), 4)
    with pytest.raises(CommittedDivergence) as info:
        follower.step(msg)
    assert info.value.index == 2
    # A matching resend of committed entries is still accepted.
    same = follower.log.entries(3, 5, 1 << 20, 10)
    follower.step(AppendRequest(1, 2, term, 2, follower.log.term(2), tuple(same), 4))
    assert follower.log.last_index == 4


def test_committed_entry_with_another_term_stops_the_follower() -> None:
    env = _cluster_with_entries(3)
    follower = env.nodes[2]
    assert follower is not None
    term = follower.term
    original = follower.log.entry(3)
    changed = Entry(3, original.term + 1, original.kind, original.data, original.position)
    msg = AppendRequest(1, 2, term + 1, 2, follower.log.term(2), (changed,), 4)
    with pytest.raises(CommittedDivergence) as info:
        follower.step(msg)
    assert info.value.index == 3


def test_idle_group_resends_a_lost_tail_on_heartbeats() -> None:
    """No write follows the power cut: the follower's heartbeat answer says
    where its log ends, and the leader resends from there."""
    env = _cluster_with_entries(6)
    leader = env.nodes[1]
    assert leader is not None
    _power_cut(env, 3, keep=4)
    env.handle("tick 1 2")
    env.handle("stabilize")
    follower = env.nodes[3]
    assert follower is not None
    assert follower.log.last_index == leader.log.last_index == 7
    assert follower.commit == 7 and leader.progress[3].match == 7
