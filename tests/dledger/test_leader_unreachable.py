"""`RaftNode.leader_unreachable`: the runtime's word that the leader's
connections all closed. A follower that alone gets it (a wrong notice, or
it alone lost its connections) must not depose a healthy leader; followers
that all get it elect a new leader within a few ticks."""

from __future__ import annotations

from dledger.testing.interaction import InteractionEnv
from election.roles import Role


def _group(**options: str) -> InteractionEnv:
    env = InteractionEnv()
    extra = " ".join(f"{k}={v}" for k, v in options.items())
    env.handle(f"add-nodes 3 {extra}")
    env.handle("campaign 1")
    env.handle("stabilize")
    assert env.nodes[1] is not None and env.nodes[1].role is Role.LEADER
    return env


def _terms(env: InteractionEnv) -> dict[int, int]:
    return {n: node.term for n, node in env.nodes.items() if node is not None}


def _round(env: InteractionEnv, ticks: int = 1) -> None:
    for n in sorted(env.nodes):
        if env.nodes[n] is not None:
            env.handle(f"tick {n} {ticks}")
    env.handle("stabilize")


def test_a_lone_followers_notices_never_depose_a_healthy_leader() -> None:
    env = _group()
    for _ in range(60):  # wrong notices, every tick, for six election timeouts
        env.handle("leader-unreachable 3 1")
        _round(env)
    leader = env.nodes[1]
    assert leader is not None and leader.role is Role.LEADER
    assert _terms(env) == {1: 1, 2: 1, 3: 1}
    assert env.handle("propose 1 after") == "proposed at 2/1"


def test_a_follower_that_alone_lost_its_connections_cannot_disrupt() -> None:
    env = _group()
    env.handle("isolate 3")
    for _ in range(40):
        env.handle("leader-unreachable 3 1")  # taken once, then ignored (no leader)
        _round(env)
    env.handle("heal")
    for _ in range(12):
        _round(env)
    assert _terms(env) == {1: 1, 2: 1, 3: 1}  # pre-vote: its term never moved
    node3 = env.nodes[3]
    assert node3 is not None and node3.role is Role.FOLLOWER and node3.leader_id == 1


def test_all_followers_told_elect_within_lost_leader_ticks() -> None:
    env = _group()
    env.handle("crash 1")
    assert env.handle("leader-unreachable 2 1") == "taken"
    assert env.handle("leader-unreachable 3 1") == "taken"
    leaders: list[int] = []
    for _ in range(4):  # lost_leader_ticks = 4, election timeout 10
        _round(env)
        leaders = [n for n, node in env.nodes.items() if node is not None
                   and node.role is Role.LEADER]
        if leaders:
            break
    assert leaders
    assert _terms(env)[leaders[0]] == 2


def test_notices_are_ignored_without_pre_vote_or_check_quorum() -> None:
    for option in ("pre_vote=false", "check_quorum=false"):
        key, value = option.split("=")
        env = _group(**{key: value})
        assert env.handle("leader-unreachable 3 1") == "ignored"
        assert env.nodes[3] is not None and env.nodes[3].leader_id == 1
