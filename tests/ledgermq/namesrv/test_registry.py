"""The sans-I/O RouteRegistry: registration, expiry, routes and term ordering."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledgermq.base.errors import InvalidRequestError, UnknownTopicError
from ledgermq.namesrv.registry import (
    PERM_READ,
    PERM_RW,
    BrokerRegistration,
    Role,
    RouteRegistry,
    TopicConfig,
)

TOPICS = {"orders": TopicConfig(8), "audit": TopicConfig(2, PERM_READ)}


def reg(
    node: str,
    role: Role = Role.FOLLOWER,
    term: int = 1,
    group: str = "g1",
    topics: dict[str, TopicConfig] | None = None,
) -> BrokerRegistration:
    port = 10000 + int(node.lstrip("n"))
    return BrokerRegistration(
        group, node, f"127.0.0.1:{port}", role, term, TOPICS if topics is None else topics
    )


def leader_id(route: dict[str, Any], group: str = "g1") -> str | None:
    [g] = [g for g in route["groups"] if g["group"] == group]
    return g["leader"]["node_id"] if g["leader"] else None


def roles(r: RouteRegistry, group: str = "g1") -> dict[str, str]:
    return {n["node_id"]: n["role"] for n in r.cluster(0)["groups"][group]["nodes"]}


def test_route_lists_groups_queues_leader_and_nodes() -> None:
    r = RouteRegistry(expiry_ms=1000)
    r.register(reg("n0", Role.LEADER, 3), 0)
    r.register(reg("n1", Role.FOLLOWER, 3), 0)
    r.register(reg("n5", Role.LEADER, 1, group="g2", topics={"orders": TopicConfig(4)}), 0)
    route = r.route("orders")
    assert route["topic"] == "orders"
    g1, g2 = route["groups"]
    assert g1 == {
        "cluster": "DefaultCluster",
        "group": "g1",
        "queues": 8,
        "perm": PERM_RW,
        "leader": {"node_id": "n0", "address": "127.0.0.1:10000", "role": "leader", "term": 3},
        "nodes": [
            {"node_id": "n0", "address": "127.0.0.1:10000", "role": "leader", "term": 3},
            {"node_id": "n1", "address": "127.0.0.1:10001", "role": "follower", "term": 3},
        ],
    }
    assert (g2["group"], g2["queues"], leader_id(route, "g2")) == ("g2", 4, "n5")
    assert [g["group"] for g in r.route("audit")["groups"]] == ["g1"]
    assert r.route("audit")["groups"][0]["perm"] == PERM_READ
    with pytest.raises(UnknownTopicError, match="nope"):
        r.route("nope")


def test_expiry_drops_silent_nodes_and_heartbeat_keeps_them() -> None:
    r = RouteRegistry(expiry_ms=1000)
    r.register(reg("n0", Role.LEADER, 1), 0)
    r.register(reg("n1"), 0)
    assert r.heartbeat("g1", "n0", 900)
    assert r.expire(1000) == []  # exactly expiry_ms old: still alive
    assert r.expire(1001) == [("g1", "n1")]
    assert leader_id(r.route("orders")) == "n0"
    assert r.expire(1901) == [("g1", "n0")]
    with pytest.raises(UnknownTopicError):
        r.route("orders")
    assert not r.heartbeat("g1", "n0", 2000)  # must register again
    assert r.cluster(2000) == {"clusters": {}, "groups": {}}


def test_higher_term_leader_demotes_previous_leader() -> None:
    r = RouteRegistry()
    r.register(reg("n0", Role.LEADER, 2), 0)
    r.register(reg("n1", Role.FOLLOWER, 2), 0)
    result = r.register(reg("n1", Role.LEADER, 3), 1)
    assert not result.stale and result.leader == "n1" and result.leader_term == 3
    assert leader_id(r.route("orders")) == "n1"
    assert roles(r) == {"n0": "follower", "n1": "leader"}


def test_lower_term_leader_claim_does_not_overwrite_newer_leader() -> None:
    r = RouteRegistry()
    r.register(reg("n1", Role.LEADER, 5), 0)
    result = r.register(reg("n0", Role.LEADER, 4), 1)  # deposed leader, still registering
    assert result.stale and result.accepted_role is Role.FOLLOWER
    assert (result.leader, result.leader_address, result.leader_term) == (
        "n1",
        "127.0.0.1:10001",
        5,
    )
    assert leader_id(r.route("orders")) == "n1"
    assert roles(r) == {"n0": "follower", "n1": "leader"}


def test_same_term_second_leader_is_refused_while_the_first_lives() -> None:
    r = RouteRegistry(expiry_ms=100)
    r.register(reg("n0", Role.LEADER, 2), 0)
    assert r.register(reg("n1", Role.LEADER, 2), 10).stale
    assert r.leader_of("g1") == ("n0", 2)
    r.register(reg("n1", Role.LEADER, 2), 150)  # keeps n1 alive; n0 is silent
    r.expire(150)
    assert r.leader_of("g1") is None  # the leader expired, its term is remembered
    assert r.register(reg("n2", Role.LEADER, 1), 151).stale
    assert not r.register(reg("n1", Role.LEADER, 2), 152).stale
    assert r.leader_of("g1") == ("n1", 2)


def test_delayed_registration_from_a_nodes_past_does_not_change_its_role() -> None:
    r = RouteRegistry()
    r.register(reg("n0", Role.LEADER, 7), 0)
    result = r.register(reg("n0", Role.FOLLOWER, 6), 5)
    assert result.stale and r.role_of("g1", "n0") is Role.LEADER
    assert r.leader_of("g1") == ("n0", 7)


def test_follower_with_higher_term_does_not_demote_leader() -> None:
    # An isolated node that inflated its term (dledger #247) has no majority.
    r = RouteRegistry()
    r.register(reg("n0", Role.LEADER, 3), 0)
    r.register(reg("n2", Role.CANDIDATE, 9), 1)
    assert r.leader_of("g1") == ("n0", 3)


def test_leader_stepping_down_or_unregistering_clears_the_leader() -> None:
    r = RouteRegistry()
    r.register(reg("n0", Role.LEADER, 3), 0)
    r.register(reg("n1"), 0)
    r.register(reg("n0", Role.FOLLOWER, 3), 1)
    assert r.leader_of("g1") is None and leader_id(r.route("orders")) is None
    r.register(reg("n1", Role.LEADER, 4), 2)
    assert r.unregister("g1", "n1") and r.leader_of("g1") is None
    assert not r.unregister("g1", "n1")
    assert r.unregister("g1", "n0") and r.cluster(3)["groups"] == {}


def test_topics_come_from_the_leader_and_are_replaced_on_registration() -> None:
    r = RouteRegistry()
    r.register(reg("n0", Role.LEADER, 1, topics={"t": TopicConfig(8)}), 0)
    r.register(reg("n1", Role.FOLLOWER, 1, topics={"t": TopicConfig(4)}), 0)
    assert r.route("t")["groups"][0]["queues"] == 8
    r.register(reg("n0", Role.LEADER, 1, topics={}), 1)
    r.register(reg("n1", Role.FOLLOWER, 1, topics={}), 1)
    with pytest.raises(UnknownTopicError):
        r.route("t")


def test_cluster_view_groups_by_cluster_with_ages() -> None:
    r = RouteRegistry()
    r.register(reg("n0", Role.LEADER, 2), 100)
    view = r.cluster(350)
    assert view["clusters"] == {"DefaultCluster": ["g1"]}
    g = view["groups"]["g1"]
    assert (g["leader"], g["leader_term"]) == ("n0", 2)
    assert g["nodes"][0]["age_ms"] == 250 and g["nodes"][0]["topics"] == ["audit", "orders"]


def test_from_wire_round_trip_and_validation() -> None:
    original = reg("n3", Role.LEADER, 12)
    assert BrokerRegistration.from_wire(original.to_wire()) == original
    good = original.to_wire()
    for key, bad in [
        ("group", ""),
        ("node_id", 3),
        ("address", "nohostport"),
        ("role", "king"),
        ("term", -1),
        ("term", True),
        ("topics", ["orders"]),
        ("topics", {"t": {"queues": 0}}),
        ("topics", {"t": {"queues": 4, "perm": 8}}),
        ("cluster", ""),
    ]:
        with pytest.raises(InvalidRequestError):
            BrokerRegistration.from_wire({**good, key: bad})
    with pytest.raises(InvalidRequestError):
        BrokerRegistration.from_wire(["not", "a", "map"])


events = st.lists(
    st.tuples(
        st.sampled_from(["n0", "n1", "n2"]),
        st.sampled_from(list(Role)),
        st.integers(0, 6),
        st.sampled_from(["register", "unregister", "tick"]),
    ),
    max_size=40,
)


@given(events)
def test_leadership_invariants_under_any_registration_order(evs: list[Any]) -> None:
    r = RouteRegistry(expiry_ms=3)
    now = 0
    floor = -1  # highest accepted leader term while the group exists
    for node, role, term, kind in evs:
        if kind == "tick":
            now += 1
            r.expire(now)
        elif kind == "unregister":
            r.unregister("g1", node)
        else:
            result = r.register(reg(node, role, term), now)
            if role is Role.LEADER and not result.stale:
                assert term >= floor
                floor = term
        view = r.cluster(now)["groups"].get("g1")
        if view is None:
            floor = -1  # group forgotten
            continue
        leaders = [n["node_id"] for n in view["nodes"] if n["role"] == "leader"]
        # At most one node is shown as leader, and it is the group's leader.
        assert len(leaders) <= 1
        assert leaders == ([view["leader"]] if view["leader"] else [])
        assert view["leader_term"] == floor


def test_routes_follow_the_newest_configuration_and_hide_removed_nodes() -> None:
    from dataclasses import replace

    from ledgermq.namesrv.registry import GroupMembership

    r = RouteRegistry(expiry_ms=1000)
    three = GroupMembership(5, (1, 2, 3))
    r.register(replace(reg("n1", Role.LEADER, 2), membership=three), 0)
    r.register(replace(reg("n2", Role.FOLLOWER, 2), membership=three), 0)
    r.register(replace(reg("n3", Role.FOLLOWER, 2), membership=three), 0)
    r.register(replace(reg("n4", Role.FOLLOWER, 2)), 0)  # not a member yet
    group = r.route("orders")["groups"][0]
    assert group["membership"] == {"index": 5, "voters": [1, 2, 3], "learners": []}
    assert [n["node_id"] for n in group["nodes"]] == ["n1", "n2", "n3"]
    # n4 joins as a learner, then n3 is removed: n3 keeps registering with
    # its older view, which must not win over the leader's newer one.
    r.register(replace(reg("n1", Role.LEADER, 2),
                       membership=GroupMembership(9, (1, 2), (4,))), 0)
    r.register(replace(reg("n3", Role.FOLLOWER, 2), membership=three), 0)
    group = r.route("orders")["groups"][0]
    assert group["membership"] == {"index": 9, "voters": [1, 2], "learners": [4]}
    assert [n["node_id"] for n in group["nodes"]] == ["n1", "n2", "n4"]
    assert r.cluster(0)["groups"]["g1"]["membership"]["index"] == 9
    # A deposed leader's older term never brings its view back.
    r.register(replace(reg("n2", Role.LEADER, 3),
                       membership=GroupMembership(9, (1, 2), (4,))), 0)
    r.register(replace(reg("n1", Role.LEADER, 2), membership=three), 0)
    assert r.route("orders")["groups"][0]["membership"]["index"] == 9


@pytest.mark.parametrize("membership", [
    "x", {"index": -1, "voters": [1]}, {"index": 1, "voters": []},
    {"index": 1, "voters": [1], "learners": [1]}, {"index": 1, "voters": [True]},
    {"index": 1, "voters": [2**63]}, {"index": 1, "voters": list(range(1, 100))},
    {"index": 2**64, "voters": [1]},
])
def test_malformed_membership_in_a_registration_is_refused(membership: Any) -> None:
    body = {**reg("n1").to_wire(), "membership": membership}
    with pytest.raises(InvalidRequestError, match="membership"):
        BrokerRegistration.from_wire(body)


def test_membership_round_trips_through_the_wire() -> None:
    from dataclasses import replace

    from ledgermq.namesrv.registry import GroupMembership
    r1 = replace(reg("n1"), membership=GroupMembership(3, (1, 2, 3), (4,)))
    assert BrokerRegistration.from_wire(r1.to_wire()) == r1
