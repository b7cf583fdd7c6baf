"""Sans-I/O route registry: broker registrations in, topic routes out.

Brokers register (and re-register on every leadership change) with their
cluster, group, node id, address, Raft role and term, and the full set of
topics they serve. The registry keeps one entry per (group, node id) and one
leader per group, and answers "where does topic T live?" with each group's
queues and current leader. Nothing here reads a clock: every call that needs
the time takes `now_ms`, so tests and the simulator drive time themselves.

Leadership is ordered by Raft term, because registrations from different nodes
race and a deposed leader may keep registering (partitioned from its group but
not from us):

- A leader claim with a term lower than the group's known leader term is
  stale: the node is recorded as a follower and the current leader is kept.
- A leader claim with the same term from a different node cannot be a second
  legitimate leader (Raft elects at most one per term), so the first holder is
  kept while it is alive.
- A leader claim with a higher term wins, and the previous leader's entry is
  demoted to follower at once, before it next registers.
- A node never goes back to an older term: a registration carrying a term
  lower than the node's own last one (a delayed message) only refreshes its
  liveness and topics.
- A follower or candidate at a higher term does not demote the leader: an
  isolated node inflating its term (dledger #247) must not take the route away
  from a leader that still has its majority.

The group's leader term survives the leader's expiry, so a stale leader cannot
sneak back in the gap; it is forgotten only when the whole group is gone.

Membership: a registration may carry the node's view of its group's
configuration (voter and learner ids and the index of the CONFIG entry in
effect). The group keeps the one with the highest index heard from the
current leader's term or later, and routes list only its members: a node
removed from the group but still running (and registering) is not offered to
clients.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from ledgermq.base.errors import InvalidRequestError, UnknownTopicError

# Permission bits, as in RocketMQ's PermName.
PERM_WRITE = 2
PERM_READ = 4
PERM_RW = PERM_READ | PERM_WRITE

DEFAULT_CLUSTER = "DefaultCluster"
DEFAULT_EXPIRY_MS = 30_000
MAX_QUEUES = 1024
# At most this many voters and learners in a registered configuration.
MAX_MEMBERS = 64


class Role(StrEnum):
    LEADER = "leader"
    FOLLOWER = "follower"
    CANDIDATE = "candidate"


@dataclass(frozen=True, slots=True)
class TopicConfig:
    queues: int
    perm: int = PERM_RW

    def to_wire(self) -> dict[str, int]:
        return {"queues": self.queues, "perm": self.perm}


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    """What a broker node tells the NameServer about itself."""

    group: str
    node_id: str
    address: str
    role: Role
    term: int
    topics: Mapping[str, TopicConfig] = field(default_factory=dict)
    cluster: str = DEFAULT_CLUSTER
    membership: GroupMembership | None = None

    @classmethod
    def from_wire(cls, body: Any) -> BrokerRegistration:
        """Validate a REGISTER_BROKER body; InvalidRequestError names the bad field."""
        if not isinstance(body, dict):
            raise InvalidRequestError("registration must be a map")
        group = _str(body, "group")
        node_id = _str(body, "node_id")
        address = _str(body, "address")
        if ":" not in address:
            raise InvalidRequestError(f"address {address!r} must be host:port")
        cluster = body.get("cluster", DEFAULT_CLUSTER)
        if not isinstance(cluster, str) or not cluster:
            raise InvalidRequestError("field 'cluster' must be a non-empty string")
        try:
            role = Role(str(body.get("role")))  # not a str: no Role either
        except ValueError:
            raise InvalidRequestError(
                f"field 'role' must be one of {[r.value for r in Role]}"
            ) from None
        term = _int(body, "term", 0, 2**63 - 1)
        raw_topics = body.get("topics", {})
        if not isinstance(raw_topics, dict):
            raise InvalidRequestError("field 'topics' must be a map of topic -> {queues, perm}")
        topics: dict[str, TopicConfig] = {}
        for name, cfg in raw_topics.items():
            if not isinstance(name, str) or not name:
                raise InvalidRequestError("topic names must be non-empty strings")
            if not isinstance(cfg, dict):
                raise InvalidRequestError(f"topic {name!r}: config must be a map")
            queues = _int(cfg, "queues", 1, MAX_QUEUES, where=f"topic {name!r}: ")
            perm = cfg.get("perm", PERM_RW)
            if not isinstance(perm, int) or isinstance(perm, bool) or perm & ~PERM_RW:
                raise InvalidRequestError(f"topic {name!r}: 'perm' must be a subset of {PERM_RW}")
            topics[name] = TopicConfig(queues, perm)
        membership = GroupMembership.from_wire(body["membership"]) \
            if body.get("membership") is not None else None
        return cls(group, node_id, address, role, term, topics, cluster, membership)

    def to_wire(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "group": self.group,
            "node_id": self.node_id,
            "address": self.address,
            "role": self.role.value,
            "term": self.term,
            "topics": {t: c.to_wire() for t, c in self.topics.items()},
            **({"membership": self.membership.to_wire()} if self.membership else {}),
        }


@dataclass(frozen=True, slots=True)
class GroupMembership:
    """A node's view of its group's configuration (`dledger.membership`)."""

    index: int
    voters: tuple[int, ...]
    learners: tuple[int, ...] = ()

    @classmethod
    def from_wire(cls, body: Any) -> GroupMembership:
        if not isinstance(body, dict):
            raise InvalidRequestError("field 'membership' must be a map")
        index = _int(body, "index", 0, 2**63 - 1, where="membership: ")
        voters = _ids(body, "voters")
        learners = _ids(body, "learners")
        if not voters or set(voters) & set(learners):
            raise InvalidRequestError("membership: voters must be non-empty and disjoint "
                                      "from learners")
        return cls(index, voters, learners)

    def to_wire(self) -> dict[str, Any]:
        return {"index": self.index, "voters": list(self.voters),
                "learners": list(self.learners)}

    def node_ids(self) -> frozenset[str]:
        """Members as the registry names nodes ("n1")."""
        return frozenset(f"n{i}" for i in self.voters + self.learners)


def _ids(body: Mapping[str, Any], key: str) -> tuple[int, ...]:
    value = body.get(key, [])
    if not isinstance(value, list) or len(value) > MAX_MEMBERS or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 < i < 2**63 for i in value):
        raise InvalidRequestError(f"membership: field {key!r} must be a list of at most "
                                  f"{MAX_MEMBERS} node ids")
    return tuple(sorted(set(value)))


def _str(body: Mapping[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"field {key!r} must be a non-empty string")
    return value


def _int(body: Mapping[str, Any], key: str, lo: int, hi: int, *, where: str = "") -> int:
    value = body.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise InvalidRequestError(f"{where}field {key!r} must be an integer in [{lo}, {hi}]")
    return value


@dataclass(slots=True)
class _Node:
    reg: BrokerRegistration
    last_seen_ms: int


@dataclass(slots=True)
class _Group:
    cluster: str
    nodes: dict[str, _Node] = field(default_factory=dict)
    leader: str | None = None  # node id
    leader_term: int = -1
    # The newest configuration a node of the leader's term (or later) reported.
    membership: GroupMembership | None = None
    membership_term: int = -1


@dataclass(frozen=True, slots=True)
class RegisterResult:
    """The registry's view after a registration, returned to the broker.

    `accepted_role` differs from the claimed role when a leader claim was
    refused (`stale` is then True): the broker learns who the registry
    believes leads its group, and at which term.
    """

    accepted_role: Role
    stale: bool
    leader: str | None
    leader_address: str | None
    leader_term: int

    def to_wire(self) -> dict[str, Any]:
        return {
            "accepted_role": self.accepted_role.value,
            "stale": self.stale,
            "leader": self.leader,
            "leader_address": self.leader_address,
            "leader_term": self.leader_term,
        }


class RouteRegistry:
    """The route table. Not thread-safe; one event loop owns it."""

    def __init__(self, expiry_ms: int = DEFAULT_EXPIRY_MS) -> None:
        if expiry_ms <= 0:
            raise ValueError("expiry_ms must be positive")
        self.expiry_ms = expiry_ms
        self._groups: dict[str, _Group] = {}

    # --------------------------------------------------------------- updates

    def register(self, reg: BrokerRegistration, now_ms: int) -> RegisterResult:
        """Add or refresh a node; apply the term-ordering rules of the module doc."""
        group = self._groups.get(reg.group)
        if group is None:
            group = self._groups[reg.group] = _Group(cluster=reg.cluster)
        group.cluster = reg.cluster
        prev = group.nodes.get(reg.node_id)
        stale = False
        if prev is not None and reg.term < prev.reg.term:
            # A delayed registration from the node's past: proof of life and
            # topics, but its role and term are out of date.
            reg = replace(reg, role=prev.reg.role, term=prev.reg.term)
            stale = True
        elif reg.role is Role.LEADER:
            holder = group.leader
            if reg.term < group.leader_term or (
                reg.term == group.leader_term and holder is not None and holder != reg.node_id
            ):
                reg = replace(reg, role=Role.FOLLOWER)
                stale = True
            else:
                if holder is not None and holder != reg.node_id:
                    old = group.nodes[holder]
                    old.reg = replace(old.reg, role=Role.FOLLOWER)
                group.leader = reg.node_id
                group.leader_term = reg.term
        elif group.leader == reg.node_id:
            # The leader itself says it stepped down.
            group.leader = None
        group.nodes[reg.node_id] = _Node(reg, now_ms)
        self._note_membership(group, reg, stale)
        return self._result(group, reg.role, stale)

    @staticmethod
    def _note_membership(group: _Group, reg: BrokerRegistration, stale: bool) -> None:
        """Keep the newest configuration: a later term, or the same term and a
        later CONFIG index (a deposed or delayed node's older view never wins)."""
        m = reg.membership
        if m is None or stale or reg.term < group.leader_term:
            return
        current = group.membership
        if current is None or (reg.term, m.index) > (group.membership_term, current.index):
            group.membership = m
            group.membership_term = reg.term

    def heartbeat(self, group_name: str, node_id: str, now_ms: int) -> bool:
        """Refresh a node's liveness. False if the node is unknown (expired, or
        this NameServer restarted): the broker must register again, at once."""
        group = self._groups.get(group_name)
        node = group.nodes.get(node_id) if group else None
        if node is None:
            return False
        node.last_seen_ms = max(node.last_seen_ms, now_ms)
        return True

    def unregister(self, group_name: str, node_id: str) -> bool:
        """Remove a node (clean shutdown). False if it was not registered."""
        group = self._groups.get(group_name)
        if group is None or group.nodes.pop(node_id, None) is None:
            return False
        self._drop_if_leader(group_name, group, node_id)
        return True

    def expire(self, now_ms: int) -> list[tuple[str, str]]:
        """Drop nodes not heard from for longer than expiry_ms; return their
        (group, node id)."""
        gone: list[tuple[str, str]] = []
        for name, group in list(self._groups.items()):
            for node_id, node in list(group.nodes.items()):
                if now_ms - node.last_seen_ms > self.expiry_ms:
                    del group.nodes[node_id]
                    gone.append((name, node_id))
                    self._drop_if_leader(name, group, node_id)
        return gone

    def _drop_if_leader(self, name: str, group: _Group, node_id: str) -> None:
        if group.leader == node_id:
            group.leader = None
        if not group.nodes:
            del self._groups[name]

    def _result(self, group: _Group, role: Role, stale: bool) -> RegisterResult:
        leader = group.nodes.get(group.leader) if group.leader else None
        return RegisterResult(
            accepted_role=role,
            stale=stale,
            leader=group.leader,
            leader_address=leader.reg.address if leader else None,
            leader_term=group.leader_term,
        )

    # --------------------------------------------------------------- queries

    def route(self, topic: str) -> dict[str, Any]:
        """The topic's route: every group serving it, with its queues, permission,
        leader (None while the group has none) and nodes. UnknownTopicError if
        no live node serves the topic."""
        groups = []
        for name in sorted(self._groups):
            group = self._groups[name]
            holders = [n for n in group.nodes.values() if topic in n.reg.topics]
            if not holders:
                continue
            leader = group.nodes.get(group.leader) if group.leader else None
            # The leader's view of the topic is authoritative; without a leader,
            # the freshest registration is the best guess.
            source = (
                leader
                if leader is not None and topic in leader.reg.topics
                else max(holders, key=lambda n: (n.reg.term, n.last_seen_ms))
            )
            cfg = source.reg.topics[topic]
            groups.append(
                {
                    "cluster": group.cluster,
                    "group": name,
                    "queues": cfg.queues,
                    "perm": cfg.perm,
                    "leader": _node_view(leader) if leader else None,
                    "nodes": [_node_view(n) for n in _member_nodes(group)],
                    **_membership_view(group),
                }
            )
        if not groups:
            raise UnknownTopicError(f"no broker serves topic {topic!r}", data={"topic": topic})
        return {"topic": topic, "groups": groups}

    def cluster(self, now_ms: int) -> dict[str, Any]:
        """Everything registered: clusters -> groups, each with leader, term and
        nodes (with how long ago each was heard from)."""
        clusters: dict[str, list[str]] = {}
        groups: dict[str, Any] = {}
        for name in sorted(self._groups):
            group = self._groups[name]
            clusters.setdefault(group.cluster, []).append(name)
            groups[name] = {
                "cluster": group.cluster,
                "leader": group.leader,
                "leader_term": group.leader_term,
                "nodes": [
                    {
                        **_node_view(n),
                        "topics": sorted(n.reg.topics),
                        "age_ms": max(0, now_ms - n.last_seen_ms),
                    }
                    for n in _sorted_nodes(group)
                ],
                **_membership_view(group),
            }
        return {"clusters": clusters, "groups": groups}

    def leader_of(self, group_name: str) -> tuple[str, int] | None:
        """(leader node id, term) of a group, or None."""
        group = self._groups.get(group_name)
        if group is None or group.leader is None:
            return None
        return group.leader, group.leader_term

    def role_of(self, group_name: str, node_id: str) -> Role | None:
        group = self._groups.get(group_name)
        node = group.nodes.get(node_id) if group else None
        return node.reg.role if node else None


def _sorted_nodes(group: _Group) -> list[_Node]:
    return [group.nodes[k] for k in sorted(group.nodes)]


def _member_nodes(group: _Group) -> list[_Node]:
    """The registered nodes that belong to the group's configuration (all of
    them while no configuration is known)."""
    nodes = _sorted_nodes(group)
    if group.membership is None:
        return nodes
    members = group.membership.node_ids()
    return [n for n in nodes if n.reg.node_id in members]


def _membership_view(group: _Group) -> dict[str, Any]:
    m = group.membership
    if m is None:
        return {}
    return {"membership": m.to_wire()}


def _node_view(node: _Node) -> dict[str, Any]:
    return {
        "node_id": node.reg.node_id,
        "address": node.reg.address,
        "role": node.reg.role.value,
        "term": node.reg.term,
    }
