"""Secured chaos runs: the run's secrets, its throwaway CA, and the workload's ACL user.

`--secure` runs the same cluster with authentication and TLS on every port
(docs/security.md): the harness makes, under the run's `security/`,

- a cluster secret (brokers prove membership to each other's Raft ports and
  to the NameServer with it), an admin secret (the bootstrap administrator,
  access key `admin`), both 0600 as `read_secret_file` insists;
- a throwaway CA (trustme, over the `cryptography` package) and one node
  certificate naming every address a node or the NameServer is reached at.
  One certificate for all: with proxied links (the delay nemesis) node A
  reaches node B through a proxy on A's own address, so the name a peer
  checks is not B's; the CA is what the run trusts, not the per-node name;
- the workload user's secret. The workload does not run as the admin: the
  harness creates a user through the replicated ACL (ACL_PUT_USER) with PUB
  and SUB on the run's topic and SUB on its consumer groups only, so every
  send, pull and offset commit of the run passes an ACL check, across
  failovers (the user lives in the replicated state, like the messages).

The harness itself (readiness PINGs, BROKER_STATUS for the leader and the
convergence check, topic creation, the user's creation) authenticates as the
bootstrap admin, which exists before any log entry does.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ledgermq.base.address import split_host_port
from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import LedgerMQError
from ledgermq.wire.auth import Credentials, read_secret_file, write_secret_file
from ledgermq.wire.tls import client_context

ADMIN_KEY = "admin"
WORKLOAD_KEY = "chaos-workload"


@dataclass(frozen=True)
class ClientSecurity:
    """What the harness's clients present: None everywhere for an open run."""

    admin: Credentials | None = None
    user: Credentials | None = None
    tls: ssl.SSLContext | None = None

    @property
    def secure(self) -> bool:
        return self.admin is not None

    def as_admin(self) -> dict[str, Any]:
        """RpcClient.connect keyword arguments for the harness's own requests."""
        return {"credentials": self.admin, "ssl": self.tls}

    def as_user(self) -> dict[str, Any]:
        """Producer/consumer keyword arguments for the workload."""
        return {"credentials": self.user, "tls": self.tls}

    def anonymous(self) -> ClientSecurity:
        """TLS without credentials: how anyone reads routes from a NameServer,
        whose client port knows only the cluster key."""
        return ClientSecurity(tls=self.tls)


OPEN = ClientSecurity()


@dataclass(frozen=True)
class SecurityFiles:
    """The files of one secured run (paths as the servers see them)."""

    directory: Path
    cluster_secret_file: Path
    admin_secret_file: Path
    workload_secret_file: Path
    ca_file: Path
    cert_file: Path
    key_file: Path

    def broker_settings(self, root: Path | str | None = None) -> dict[str, str]:
        """Broker configuration keys (docs/configuration.md). `root`: where
        `directory` is mounted for the broker, when not at its own path."""
        def at(path: Path) -> str:
            return str(Path(root) / path.name) if root is not None else str(path)

        return {"cluster_secret_file": at(self.cluster_secret_file),
                "admin_access_key": ADMIN_KEY, "admin_secret_file": at(self.admin_secret_file),
                "tls_cert_file": at(self.cert_file), "tls_key_file": at(self.key_file),
                "tls_ca_file": at(self.ca_file)}

    def namesrv_args(self, root: Path | str | None = None) -> list[str]:
        """`ledgermq namesrv` options: the same cluster secret and certificate."""
        settings = self.broker_settings(root)
        args = []
        for key in ("cluster_secret_file", "admin_access_key", "admin_secret_file",
                    "tls_cert_file", "tls_key_file", "tls_ca_file"):
            args += [f"--{key.replace('_', '-')}", settings[key]]
        return args

    def client(self) -> ClientSecurity:
        admin = Credentials(ADMIN_KEY, read_secret_file(self.admin_secret_file))
        user = Credentials(WORKLOAD_KEY, read_secret_file(self.workload_secret_file))
        return ClientSecurity(admin=admin, user=user, tls=client_context(str(self.ca_file)))


def generate(directory: Path, hosts: Iterable[str]) -> SecurityFiles:
    """Fresh secrets and a throwaway CA with one certificate for `hosts`
    (IP addresses or DNS names) under `directory`, which must not hold a run's
    secrets yet (secret files are never overwritten)."""
    import trustme  # the chaos extra; only secured runs need it

    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    files = SecurityFiles(directory, directory / "cluster.secret", directory / "admin.secret",
                          directory / "workload.secret", directory / "ca.pem",
                          directory / "node.pem", directory / "node.key")
    for path in (files.cluster_secret_file, files.admin_secret_file,
                 files.workload_secret_file):
        write_secret_file(path)
    ca = trustme.CA(organization_name="LedgerMQ chaos run")
    cert = ca.issue_cert(*dict.fromkeys(hosts))
    ca.cert_pem.write_to_path(str(files.ca_file))
    with open(files.cert_file, "wb") as fh:
        for pem in cert.cert_chain_pems:
            fh.write(pem.bytes())
    cert.private_key_pem.write_to_path(str(files.key_file))
    files.key_file.chmod(0o600)
    return files


def workload_user(topic: str, groups: Iterable[str], secret: bytes) -> dict[str, Any]:
    """The ACL_PUT_USER body of the workload's user: PUB|SUB on `topic`, SUB on
    `groups`, nothing else (deny by default), not an admin."""
    return {"access_key": WORKLOAD_KEY, "secret": secret, "admin": False, "allow": [],
            "topics": {topic: "PUB|SUB"}, "groups": dict.fromkeys(groups, "SUB")}


async def put_user(addresses: Iterable[str], security: ClientSecurity, body: dict[str, Any],
                   timeout: float = 60.0) -> dict[str, Any]:
    """ACL_PUT_USER on whichever node is the leader, retrying until one takes
    it (through the log, so every replica has the user) or `timeout` passes."""
    from ledgermq.wire import RpcClient

    deadline = asyncio.get_running_loop().time() + timeout
    last: BaseException | None = None
    while asyncio.get_running_loop().time() < deadline:
        for address in addresses:
            host, port = split_host_port(address)
            try:
                async with asyncio.timeout(10):
                    client = await RpcClient.connect(host, port, role="admin",
                                                     name="chaos-acl", timeout=5.0,
                                                     **security.as_admin())
                    try:
                        reply: dict[str, Any] = await client.request(
                            RequestCode.ACL_PUT_USER, body)
                        return reply
                    finally:
                        await client.close()
            except (OSError, TimeoutError, LedgerMQError) as exc:  # not the leader, down
                last = exc
        await asyncio.sleep(0.3)
    raise RuntimeError(f"could not create the workload's ACL user: {last!r}")
