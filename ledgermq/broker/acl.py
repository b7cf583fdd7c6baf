"""RocketMQ's ACL model for the broker's client protocol (docs/security.md,
"Authorisation: the ACL").

A user is an access key with its secret, an admin flag, an optional IP
allow-list and grants: per topic (PUB, SUB, PUB|SUB or DENY) and per consumer
group (SUB or DENY), each keyed by a name or by "*" (the user's default for
names it has no grant of its own for). A name with no grant and no "*" grant
is denied: deny by default.

`Acl` holds the users of one broker group. It is part of the replicated state
machine (`broker.state`): changed only by control operations applied from the
Raft log, so every replica holds the same users and decides the same way after
a failover. The secrets are in it, and so in the log, because verifying an
AUTH proof (an HMAC) needs the secret itself.

`Acl.authorize` is the one decision: pure, no I/O, raising NoPermissionError
naming the missing permission. Cluster members and administrators may do
everything; a user's IP allow-list applies to it whatever its flags.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum, IntFlag
from typing import Any

from commitlog.message import valid_topic
from ledgermq.base.errors import NoPermissionError, UnauthenticatedError
from ledgermq.wire.auth import CLUSTER_KEY, SECRET_BYTES_MIN, Principal

ANY_NAME = "*"
_ACCESS_KEY_RE = re.compile(r"[A-Za-z0-9._@-]{1,128}")  # matched whole (fullmatch)
_GROUP_RE = re.compile(r"[A-Za-z0-9_%|.-]{1,255}")
ALLOW_MAX = 64  # CIDRs in one allow-list
GRANTS_MAX = 4096  # topic plus group grants of one user

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class AclError(ValueError):
    """A user record or grant that is not valid (INVALID_REQUEST at the edge;
    skipped by the state machine if one ever reaches the log)."""


class Perm(IntFlag):
    """A grant's value. DENY is the empty set: a grant that says "no"
    explicitly, which beats the user's "*" grant."""

    DENY = 0
    PUB = 1
    SUB = 2


_PERM_NAMES = {"DENY": Perm.DENY, "PUB": Perm.PUB, "SUB": Perm.SUB,
               "PUB|SUB": Perm.PUB | Perm.SUB, "SUB|PUB": Perm.PUB | Perm.SUB}


def perm_name(perm: Perm) -> str:
    """The wire spelling: "DENY", "PUB", "SUB" or "PUB|SUB"."""
    if not perm:
        return "DENY"
    return "|".join(p.name for p in (Perm.PUB, Perm.SUB) if perm & p and p.name)


def parse_perm(value: object, *, group: bool = False) -> Perm:
    """A grant's value from its wire spelling; a group grant is SUB or DENY."""
    perm = _PERM_NAMES.get(value.upper()) if isinstance(value, str) else None
    if perm is None or (group and perm & Perm.PUB):
        allowed = "SUB or DENY" if group else "PUB, SUB, PUB|SUB or DENY"
        raise AclError(f"a {'group' if group else 'topic'} grant is {allowed}, not {value!r}")
    return perm


class Action(Enum):
    """What a request needs. PUB and SUB are checked against the grants of
    the topic and/or group named; ADMIN only admins have; ANY every
    authenticated principal has (from an allowed address)."""

    PUB = "PUB"
    SUB = "SUB"
    ADMIN = "ADMIN"
    ANY = "ANY"


def valid_access_key(access_key: object) -> bool:
    return isinstance(access_key, str) and _ACCESS_KEY_RE.fullmatch(access_key) is not None


def valid_group(group: object) -> bool:
    return isinstance(group, str) and _GROUP_RE.fullmatch(group) is not None


def peer_host(peer: str) -> str:
    """The address part of a connection's "host:port" peer string."""
    host = peer.rsplit(":", 1)[0] if ":" in peer else peer
    return host.strip("[]")


def parse_grants(raw: object, *, group: bool) -> dict[str, Perm]:
    """Grants from their wire form {name or "*": perm}; AclError if invalid."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise AclError(f"{'group' if group else 'topic'} grants must be a map name -> perm")
    out: dict[str, Perm] = {}
    for name, value in raw.items():
        ok = name == ANY_NAME or (valid_group(name) if group else
                                  isinstance(name, str) and valid_topic(name))
        if not ok:
            raise AclError(f"invalid {'group' if group else 'topic'} name {name!r} in grants")
        out[name] = parse_perm(value, group=group)
    return out


def _parse_allow(raw: object) -> tuple[IpNetwork, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list | tuple) or len(raw) > ALLOW_MAX:
        raise AclError(f"an allow-list is a list of at most {ALLOW_MAX} CIDRs")
    nets = []
    for cidr in raw:
        try:
            nets.append(ipaddress.ip_network(cidr, strict=False))
        except (TypeError, ValueError):
            raise AclError(f"invalid CIDR {cidr!r} in the allow-list") from None
    return tuple(nets)


@dataclass(frozen=True, slots=True)
class User:
    """One ACL user. `allow` empty: any address."""

    access_key: str
    secret: bytes = field(repr=False)
    admin: bool = False
    allow: tuple[IpNetwork, ...] = ()
    topics: Mapping[str, Perm] = field(default_factory=dict)
    groups: Mapping[str, Perm] = field(default_factory=dict)

    @classmethod
    def from_record(cls, record: object, *, secret: bytes | None = None) -> User:
        """A user from its replicated (or request) map; `secret` stands in for
        a record without one. AclError names what is wrong."""
        if not isinstance(record, Mapping):
            raise AclError("a user is a map")
        key = record.get("access_key")
        if not valid_access_key(key) or key == CLUSTER_KEY:
            raise AclError(f"invalid access key {key!r}: 1 to 128 of A-Z a-z 0-9 . _ @ -,"
                           f" and not {CLUSTER_KEY!r}")
        assert isinstance(key, str)
        raw_secret = record.get("secret", secret)
        if not isinstance(raw_secret, bytes) or len(raw_secret) < SECRET_BYTES_MIN:
            raise AclError(f"a user's secret is at least {SECRET_BYTES_MIN} bytes")
        admin = record.get("admin", False)
        if not isinstance(admin, bool):
            raise AclError("'admin' must be true or false")
        topics = parse_grants(record.get("topics"), group=False)
        groups = parse_grants(record.get("groups"), group=True)
        if len(topics) + len(groups) > GRANTS_MAX:
            raise AclError(f"a user has at most {GRANTS_MAX} grants")
        return cls(key, raw_secret, admin, _parse_allow(record.get("allow")), topics, groups)

    def to_record(self) -> dict[str, Any]:
        """The replicated form (with the secret)."""
        return {**self.to_public(), "secret": self.secret}

    def to_public(self) -> dict[str, Any]:
        """What ACL_GET_USERS shows: everything but the secret."""
        return {"access_key": self.access_key, "admin": self.admin,
                "allow": [str(n) for n in self.allow],
                "topics": {k: perm_name(v) for k, v in sorted(self.topics.items())},
                "groups": {k: perm_name(v) for k, v in sorted(self.groups.items())}}

    def with_grants(self, topics: Mapping[str, Perm], groups: Mapping[str, Perm]) -> User:
        merged_topics = {**self.topics, **topics}
        merged_groups = {**self.groups, **groups}
        if len(merged_topics) + len(merged_groups) > GRANTS_MAX:
            raise AclError(f"a user has at most {GRANTS_MAX} grants")
        return User(self.access_key, self.secret, self.admin, self.allow, merged_topics,
                    merged_groups)

    def without_grants(self, topics: Iterable[str], groups: Iterable[str]) -> User:
        drop_t, drop_g = set(topics), set(groups)
        return User(self.access_key, self.secret, self.admin, self.allow,
                    {k: v for k, v in self.topics.items() if k not in drop_t},
                    {k: v for k, v in self.groups.items() if k not in drop_g})

    def allows_address(self, host: str) -> bool:
        if not self.allow:
            return True
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return any(ip in net for net in self.allow)


def _granted(grants: Mapping[str, Perm], name: str) -> Perm:
    """The name's own grant, else the "*" grant, else DENY."""
    perm = grants.get(name)
    if perm is None:
        perm = grants.get(ANY_NAME, Perm.DENY)
    return perm


class Acl:
    """The users of one broker group, as the log made them."""

    def __init__(self) -> None:
        self.users: dict[str, User] = {}

    # -------------------------------------------------------- changes (apply)

    def put(self, user: User) -> None:
        self.users[user.access_key] = user

    def delete(self, access_key: str) -> bool:
        return self.users.pop(access_key, None) is not None

    def grant(self, access_key: str, topics: Mapping[str, Perm],
              groups: Mapping[str, Perm]) -> bool:
        user = self.users.get(access_key)
        if user is None:
            return False
        self.users[access_key] = user.with_grants(topics, groups)
        return True

    def revoke(self, access_key: str, topics: Iterable[str], groups: Iterable[str]) -> bool:
        user = self.users.get(access_key)
        if user is None:
            return False
        self.users[access_key] = user.without_grants(topics, groups)
        return True

    # ---------------------------------------------------------------- reads

    def lookup(self, access_key: str) -> tuple[bytes, Principal] | None:
        """A KeyStore lookup over the users (`BrokerKeys.users`)."""
        user = self.users.get(access_key)
        if user is None:
            return None
        return user.secret, Principal(user.access_key, admin=user.admin)

    def authorize(self, principal: Principal | None, peer_ip: str, action: Action,
                  topic: str | None = None, group: str | None = None) -> None:
        """Return if `principal`, connected from `peer_ip`, may do `action` on
        `topic` and/or `group`; else raise NoPermissionError naming what is
        missing (UnauthenticatedError for no principal at all)."""
        if principal is None:
            raise UnauthenticatedError("authenticate first (AUTH)")
        if principal.cluster_member:
            return
        user = self.users.get(principal.name)
        who = f"{principal.name!r}"
        if user is None:
            # Not (or no longer) a user: only the bootstrap administrator,
            # which lives outside the ACL, may still act.
            if principal.admin:
                return
            raise NoPermissionError(f"{who} is not an ACL user of this broker",
                                    data={"permission": action.value})
        if not user.allows_address(peer_ip):
            raise NoPermissionError(
                f"user {who} may not connect from {peer_ip} (its IP allow-list)",
                data={"permission": "ADDRESS", "address": peer_ip})
        if user.admin or action is Action.ANY:
            return
        if action is Action.ADMIN:
            raise NoPermissionError(f"user {who} lacks ADMIN (an administrator's permission)",
                                    data={"permission": "ADMIN"})
        need = Perm.PUB if action is Action.PUB else Perm.SUB
        if topic is not None and not _granted(user.topics, topic) & need:
            raise NoPermissionError(f"user {who} lacks {action.value} on topic {topic!r}",
                                    data={"permission": action.value, "topic": topic})
        if group is not None and not _granted(user.groups, group) & Perm.SUB:
            raise NoPermissionError(f"user {who} lacks SUB on consumer group {group!r}",
                                    data={"permission": "SUB", "group": group})
