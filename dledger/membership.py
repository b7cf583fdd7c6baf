"""A group's membership: who votes, who only replicates, and the one-step changes between them.

The configuration of a group is replicated through its own log, as the
Raft dissertation (chapter 4) describes it: a `EntryKind.CONFIG` entry holds
the *whole* new configuration (a `Membership`, encoded by `encode`), takes
effect on every replica as soon as it is appended (not when committed), and
is undone if a new leader truncates it away. Changes are single-server:
between a configuration and the next, the set of voters differs by at most
one node, so any majority of the old voters and any majority of the new
voters share a node and no two leaders can be elected for one term.

Learners replicate the log but do not vote and are not counted in any
quorum; a node joins as a learner and is promoted once it has caught up, so
adding a node never stalls commits while it copies the log.

Identity: each member carries the `directory_id` of its data directory (a
random number chosen when the directory is created). A vote or a campaign
from a node whose directory id differs from the pinned one is not counted:
a node that lost its disk has forgotten its votes, so it must rejoin
(`rejoin`) before it can vote again. Bootstrap members start unpinned
(`directory_id == 0`) and are pinned by the first leader (`pin`).

Pure data, no I/O: the core (`dledger.raw_node`), the runtime, the broker and
the audit all read configurations with this module.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, replace

__all__ = [
    "FORMAT_VERSION",
    "UNPINNED",
    "ConfigHistory",
    "Member",
    "MemberRole",
    "Membership",
    "MembershipError",
    "add_learner",
    "bootstrap",
    "decode",
    "encode",
    "pin",
    "promote",
    "rejoin",
    "remove",
    "single_server_change",
]

# Version of the CONFIG entry's encoding (the "v" field).
FORMAT_VERSION = 1
# Directory id of a member not pinned yet (a bootstrap member never heard from).
UNPINNED = 0
_MAX_ID = (1 << 63) - 1
_MAX_ADDRESS = 255


class MembershipError(ValueError):
    """A configuration that cannot be decoded, or a change the rules forbid."""


class MemberRole:
    VOTER = "voter"
    LEARNER = "learner"


@dataclass(frozen=True, slots=True)
class Member:
    """One node of the group: its id, where its Raft transport listens
    ("host:port", empty when unknown, e.g. in the simulator), the id of the
    data directory it holds (`UNPINNED` until pinned) and, opaque to Raft,
    where its clients connect (the broker's leader hints; may be empty)."""

    node_id: int
    address: str = ""
    directory_id: int = UNPINNED
    client_address: str = ""

    def __post_init__(self) -> None:
        if not 0 < self.node_id <= _MAX_ID:
            raise MembershipError(f"node id {self.node_id} out of range")
        if not 0 <= self.directory_id <= _MAX_ID:
            raise MembershipError(f"directory id {self.directory_id} out of range")
        if len(self.address) > _MAX_ADDRESS or len(self.client_address) > _MAX_ADDRESS:
            raise MembershipError("address too long")


@dataclass(frozen=True, slots=True)
class Membership:
    """A configuration: voters and learners, each sorted by node id, disjoint."""

    voters: tuple[Member, ...]
    learners: tuple[Member, ...] = ()

    def __post_init__(self) -> None:
        if not self.voters:
            raise MembershipError("a configuration needs at least one voter")
        ids = [m.node_id for m in self.voters + self.learners]
        if len(ids) != len(set(ids)):
            raise MembershipError(f"a node is listed twice: {sorted(ids)}")
        if list(self.voters) != sorted(self.voters, key=_node_id) or list(
            self.learners
        ) != sorted(self.learners, key=_node_id):
            raise MembershipError("members must be sorted by node id")

    @property
    def voter_ids(self) -> frozenset[int]:
        return frozenset(m.node_id for m in self.voters)

    @property
    def learner_ids(self) -> frozenset[int]:
        return frozenset(m.node_id for m in self.learners)

    @property
    def node_ids(self) -> frozenset[int]:
        return self.voter_ids | self.learner_ids

    def member(self, node_id: int) -> Member | None:
        for m in self.voters + self.learners:
            if m.node_id == node_id:
                return m
        return None

    def role_of(self, node_id: int) -> str | None:
        """`MemberRole.VOTER`, `MemberRole.LEARNER`, or None for a non-member."""
        if node_id in self.voter_ids:
            return MemberRole.VOTER
        if node_id in self.learner_ids:
            return MemberRole.LEARNER
        return None

    def identity_matches(self, node_id: int, directory_id: int) -> bool:
        """False only when `node_id` is a member pinned to another directory:
        its votes and campaigns are then not counted (a wiped or foreign disk)."""
        m = self.member(node_id)
        if m is None or m.directory_id == UNPINNED:
            return True
        return m.directory_id == directory_id

    def can_vote(self, node_id: int, directory_id: int) -> bool:
        """A voter of this configuration whose directory is the pinned one (or unpinned)."""
        return node_id in self.voter_ids and self.identity_matches(node_id, directory_id)

    def unpinned(self) -> tuple[int, ...]:
        return tuple(m.node_id for m in self.voters + self.learners
                     if m.directory_id == UNPINNED)

    def fault_tolerance(self) -> int:
        """Voters that may fail while a majority remains."""
        return (len(self.voters) - 1) // 2

    def to_dict(self) -> dict[str, object]:
        """The JSON-ready form used by status pages and the admin API."""
        return {
            "voters": [_member_dict(m) for m in self.voters],
            "learners": [_member_dict(m) for m in self.learners],
        }


def _node_id(m: Member) -> int:
    return m.node_id


def _member_dict(m: Member) -> dict[str, object]:
    return {"node_id": m.node_id, "address": m.address, "directory_id": m.directory_id,
            "client_address": m.client_address}


def _sorted(members: Iterable[Member]) -> tuple[Member, ...]:
    return tuple(sorted(members, key=_node_id))


def bootstrap(addresses: dict[int, str],
              client_addresses: dict[int, str] | None = None) -> Membership:
    """The configuration a group starts with: every listed node a voter, unpinned."""
    clients = client_addresses or {}
    return Membership(_sorted(Member(n, a, UNPINNED, clients.get(n, ""))
                              for n, a in addresses.items()))


# ------------------------------------------------------------------ changes
# Each returns the whole next configuration; `single_server_change` checks
# the rule every one of them keeps (at most one voter added or removed).


def add_learner(current: Membership, member: Member) -> Membership:
    """Add a new node that replicates but does not vote."""
    if current.member(member.node_id) is not None:
        raise MembershipError(f"node {member.node_id} is already a member")
    return replace(current, learners=_sorted((*current.learners, member)))


def promote(current: Membership, node_id: int) -> Membership:
    """Make a learner a voter (the caller checks it has caught up)."""
    m = current.member(node_id)
    if m is None or node_id not in current.learner_ids:
        raise MembershipError(f"node {node_id} is not a learner")
    return Membership(
        _sorted((*current.voters, m)),
        tuple(x for x in current.learners if x.node_id != node_id),
    )


def remove(current: Membership, node_id: int) -> Membership:
    """Remove a voter or a learner."""
    if current.member(node_id) is None:
        raise MembershipError(f"node {node_id} is not a member")
    voters = tuple(x for x in current.voters if x.node_id != node_id)
    if not voters:
        raise MembershipError("cannot remove the last voter")
    return Membership(voters, tuple(x for x in current.learners if x.node_id != node_id))


def rejoin(current: Membership, node_id: int, directory_id: int,
           address: str | None = None) -> Membership:
    """A member whose data directory is new (wiped, or repaired) becomes a
    learner under its new directory id; it is promoted again once caught up."""
    m = current.member(node_id)
    if m is None:
        raise MembershipError(f"node {node_id} is not a member")
    if directory_id == UNPINNED:
        raise MembershipError("rejoin needs the node's new directory id")
    if directory_id == m.directory_id and node_id in current.learner_ids:
        raise MembershipError(f"node {node_id} is already a learner with that directory")
    new = Member(node_id, m.address if address is None else address, directory_id,
                 m.client_address)
    voters = tuple(x for x in current.voters if x.node_id != node_id)
    if not voters:
        raise MembershipError("cannot demote the last voter")
    learners = _sorted([x for x in current.learners if x.node_id != node_id] + [new])
    return Membership(voters, learners)


def pin(current: Membership, node_id: int, directory_id: int) -> Membership:
    """Record the directory id of a member that was unpinned."""
    m = current.member(node_id)
    if m is None:
        raise MembershipError(f"node {node_id} is not a member")
    if m.directory_id != UNPINNED:
        raise MembershipError(f"node {node_id} is already pinned")
    if directory_id == UNPINNED:
        raise MembershipError("cannot pin to the unpinned id")
    new = Member(node_id, m.address, directory_id, m.client_address)

    def swap(group: tuple[Member, ...]) -> tuple[Member, ...]:
        return tuple(new if x.node_id == node_id else x for x in group)

    return Membership(swap(current.voters), swap(current.learners))


def single_server_change(old: Membership, new: Membership) -> bool:
    """True when the voter sets differ by at most one node (dissertation §4.1)."""
    return len(old.voter_ids ^ new.voter_ids) <= 1


# ------------------------------------------------------------------ history


class ConfigHistory:
    """The configurations a replica's log holds, oldest first, as (index, Membership).

    The first item is the base: the configuration the log starts with (a
    snapshot's, at the snapshot index, or the bootstrap one at 0); then one
    item per CONFIG entry of the log. Appending a CONFIG entry adds an item,
    truncating the log removes those at or above the cut, restoring a snapshot
    resets the history. Configurations change rarely, so the list stays short;
    `prune` drops what lies below a compacted log's start.
    """

    __slots__ = ("_items",)

    def __init__(self, base_index: int, base: Membership) -> None:
        self._items: list[tuple[int, Membership]] = [(base_index, base)]

    @property
    def current(self) -> tuple[int, Membership]:
        """(index, configuration) of the newest one: the configuration in effect."""
        return self._items[-1]

    def at(self, index: int) -> tuple[int, Membership]:
        """(index, configuration) in effect at log index `index` (the base's if older)."""
        for item in reversed(self._items):
            if item[0] <= index:
                return item
        return self._items[0]

    def add(self, index: int, membership: Membership) -> None:
        if index <= self._items[-1][0]:
            raise MembershipError(f"configuration at {index} not after {self._items[-1][0]}")
        self._items.append((index, membership))

    def truncate_from(self, index: int) -> bool:
        """Forget the configurations of entries at or above `index`; True if any went."""
        keep = len(self._items)
        while keep > 1 and self._items[keep - 1][0] >= index:
            keep -= 1
        changed = keep < len(self._items)
        del self._items[keep:]
        return changed

    def reset(self, base_index: int, base: Membership) -> None:
        """The log was replaced by a snapshot at `base_index` holding `base`."""
        self._items = [(base_index, base)]

    def prune(self, below: int) -> None:
        """Drop configurations no longer needed to answer `at(i)` for i >= `below`."""
        first = 0
        while first + 1 < len(self._items) and self._items[first + 1][0] <= below:
            first += 1
        if first:
            del self._items[:first]

    def __len__(self) -> int:
        return len(self._items)

    def items(self) -> tuple[tuple[int, Membership], ...]:
        return tuple(self._items)


# ----------------------------------------------------------------- encoding


def encode(membership: Membership) -> bytes:
    """The CONFIG entry's bytes: canonical JSON (sorted keys, no spaces)."""
    doc = {"v": FORMAT_VERSION, **membership.to_dict()}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def decode(data: bytes) -> Membership:
    """Parse a CONFIG entry; `MembershipError` for anything malformed."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MembershipError(f"configuration is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("v") != FORMAT_VERSION:
        raise MembershipError("configuration has no supported version")
    try:
        voters = tuple(_member(x) for x in doc["voters"])
        learners = tuple(_member(x) for x in doc["learners"])
    except (KeyError, TypeError) as exc:
        raise MembershipError(f"configuration malformed: {exc!r}") from None
    return Membership(voters, learners)


def _member(doc: object) -> Member:
    if not isinstance(doc, dict):
        raise MembershipError("member is not an object")
    node_id, address, directory_id = doc["node_id"], doc["address"], doc["directory_id"]
    client_address = doc.get("client_address", "")
    if (type(node_id) is not int or type(directory_id) is not int
            or not isinstance(address, str) or not isinstance(client_address, str)):
        raise MembershipError("member fields have the wrong types")
    return Member(node_id, address, directory_id, client_address)
