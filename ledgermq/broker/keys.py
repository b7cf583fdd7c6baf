"""The broker's KeyStore: whom its client port authenticates (docs/security.md).

Three sources, looked up in this order: the cluster key (CLUSTER_KEY with the
cluster secret: a cluster member), the bootstrap administrator (configured
outside the replicated ACL, so a fresh cluster can be administered at all)
and the replicated ACL users (`users`, which the broker points at its state
machine's `Acl.lookup`).
"""

from __future__ import annotations

from collections.abc import Callable

from ledgermq.wire.auth import CLUSTER_KEY, Credentials, Principal

UserLookup = Callable[[str], tuple[bytes, Principal] | None]


def _no_users(access_key: str) -> tuple[bytes, Principal] | None:
    return None


class BrokerKeys:
    """A KeyStore of the cluster key, the bootstrap admin and the users."""

    def __init__(self, cluster_secret: bytes, admin: Credentials | None = None,
                 users: UserLookup = _no_users) -> None:
        self.cluster_secret = cluster_secret
        self.admin = admin
        self.users = users

    def lookup(self, access_key: str) -> tuple[bytes, Principal] | None:
        if access_key == CLUSTER_KEY:
            return self.cluster_secret, Principal(CLUSTER_KEY, cluster_member=True)
        if self.admin is not None and access_key == self.admin.access_key:
            return self.admin.secret, Principal(access_key, admin=True)
        return self.users(access_key)
