"""Who may talk to a broker: its KeyStore and its start-up security rules.

`BrokerKeys` is the broker's `ledgermq.wire.auth.KeyStore`:

- `CLUSTER_KEY` with the cluster secret -> the cluster member principal (the
  other brokers of the group, the NameServers' admin apps): member and admin;
- the bootstrap administrator (`admin_access_key` and the secret in
  `admin_secret_file`) -> an admin principal that exists outside the
  replicated ACL, so that the first users can be created;
- every other key -> `users(access_key)`, which the ACL plugs in (the users
  of the replicated state); by default there are none.

`BrokerSecurity.load(config)` reads the secret files and applies the
start-up rule of docs/security.md: authentication is on exactly when a
cluster secret is configured; without one, a broker listening on anything but
loopback refuses to start unless `allow_open` is set.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass

from ledgermq.base.exposure import ExposureError, check_exposure
from ledgermq.broker.config import BrokerConfig, BrokerConfigError, split_address
from ledgermq.wire.auth import (
    CLUSTER_KEY,
    CLUSTER_MEMBER,
    Credentials,
    Principal,
    SecretFileError,
    read_secret_file,
)
from ledgermq.wire.tls import client_context, server_context

log = logging.getLogger(__name__)


UserLookup = Callable[[str], "tuple[bytes, Principal] | None"]


def no_users(access_key: str) -> tuple[bytes, Principal] | None:
    return None


class BrokerKeys:
    """The cluster key, the bootstrap admin, then the ACL's users."""

    def __init__(self, cluster_secret: bytes, *, admin_access_key: str = "admin",
                 admin_secret: bytes | None = None, users: UserLookup = no_users) -> None:
        if admin_secret is not None and admin_access_key == CLUSTER_KEY:
            raise ValueError(f"the admin access key cannot be {CLUSTER_KEY!r}")
        self.cluster_secret = cluster_secret
        self.admin_access_key = admin_access_key
        self.admin_secret = admin_secret
        self.users = users

    def lookup(self, access_key: str) -> tuple[bytes, Principal] | None:
        if access_key == CLUSTER_KEY:
            return self.cluster_secret, CLUSTER_MEMBER
        if self.admin_secret is not None and access_key == self.admin_access_key:
            return self.admin_secret, Principal(access_key, admin=True)
        found = self.users(access_key)
        if found is not None and found[1].cluster_member:
            # A user is never a cluster member, whatever the ACL says.
            return None
        return found


def listen_hosts(config: BrokerConfig) -> dict[str, str]:
    """Every host this broker listens on, by what listens there."""
    hosts = {"client port": split_address(config.client_address)[0],
             "Raft port": config.raft_bind_host or split_address(
                 config.peers[config.node_id].raft)[0]}
    if config.admin_listen:
        hosts["admin app"] = split_address(config.admin_listen)[0]
    return hosts


@dataclass(frozen=True)
class BrokerSecurity:
    """What a broker authenticates with, decided once at start-up."""

    keys: BrokerKeys | None  # None: runs open (everyone is ANONYMOUS)
    cluster: Credentials | None  # what it proves membership with (NameServers)
    client_tls: ssl.SSLContext | None  # served on the client port
    # The cluster CA: verifies NameServers and the other brokers' client ports.
    namesrv_tls: ssl.SSLContext | None

    @classmethod
    def load(cls, config: BrokerConfig) -> BrokerSecurity:
        """Read the secret files and apply the start-up rule; BrokerConfigError
        (naming the key and the file) when a file is refused or the broker
        would listen off loopback without authentication."""
        secret = _read(config.cluster_secret_file, "cluster_secret_file")
        admin = _read(config.admin_secret_file, "admin_secret_file")
        if admin is not None and secret is None:
            raise BrokerConfigError("admin_secret_file needs cluster_secret_file: without a "
                                    "cluster secret the broker does not authenticate anyone")
        if admin is not None and config.admin_access_key == CLUSTER_KEY:
            raise BrokerConfigError(f"admin_access_key cannot be {CLUSTER_KEY!r}")
        try:
            check_exposure(listen_hosts(config), authenticated=secret is not None,
                           allow_open=config.allow_open,
                           remedy="set cluster_secret_file (docs/security.md), or allow_open = "
                                  "true to run open on purpose")
        except ExposureError as exc:
            raise BrokerConfigError(str(exc)) from None
        keys = cluster = None
        if secret is not None:
            keys = BrokerKeys(secret, admin_access_key=config.admin_access_key,
                              admin_secret=admin)
            cluster = Credentials(CLUSTER_KEY, secret)
        client_tls = namesrv_tls = None
        try:
            if config.tls_cert_file:
                # Clients authenticate with AUTH; the certificate proves the
                # broker to them (no client certificates on this port).
                client_tls = server_context(config.tls_cert_file, config.tls_key_file)
            if config.tls_ca_file:
                namesrv_tls = client_context(config.tls_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise BrokerConfigError(f"TLS files: {exc}") from None
        return cls(keys, cluster, client_tls, namesrv_tls)


def _read(path: str, key: str) -> bytes | None:
    if not path:
        return None
    try:
        return read_secret_file(path)
    except SecretFileError as exc:
        raise BrokerConfigError(f"{key}: {exc}") from None
