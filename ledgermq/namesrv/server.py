"""The NameServer process: a RouteRegistry behind an RpcServer.

Requests (codes in ledgermq.base.codes, shapes in docs/protocol.md):

- REGISTER_BROKER: a full registration; answered with the registry's view of
  the node's group (see RegisterResult), so a deposed leader learns it at once.
- BROKER_HEARTBEAT {group, node_id}: refreshes liveness; UNKNOWN_BROKER if the
  node is not registered here (expired, or this NameServer restarted), telling
  the broker to register again now instead of at its next full registration.
  This is what keeps a restarted NameServer from losing a route
  (rocketmq #1464).
- UNREGISTER_BROKER {group, node_id}.
- GET_ROUTE {topic}: the route, or UNKNOWN_TOPIC.
- GET_CLUSTER: every cluster, group and node.

Expiry runs on a timer using the monotonic clock; the registry itself never
reads a clock.

With a cluster secret (`--cluster-secret-file`) the NameServer offers the
AUTH handshake with the cluster key only: REGISTER_BROKER, UNREGISTER_BROKER
and BROKER_HEARTBEAT need a connection authenticated as a cluster member
(NO_PERMISSION otherwise, logged and counted), while anonymous clients may
still read routes (GET_ROUTE, GET_CLUSTER). Without one it runs open, which
`load_security` refuses off loopback unless told `allow_open`
(docs/security.md).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ledgermq.base.address import AddressError, split_host_port
from ledgermq.base.clock import monotonic_ms
from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import InvalidRequestError, NoPermissionError, UnknownBrokerError
from ledgermq.base.exposure import ExposureError, check_exposure
from ledgermq.base.tasks import cancel_and_wait
from ledgermq.namesrv.admin_http import AdminSecurity, NameServerAdmin
from ledgermq.namesrv.audit_verdict import DEFAULT_STALE_AFTER_S
from ledgermq.namesrv.registry import DEFAULT_EXPIRY_MS, BrokerRegistration, RouteRegistry
from ledgermq.wire import Connection, RpcServer
from ledgermq.wire.auth import (
    CLUSTER_KEY,
    CLUSTER_MEMBER,
    Credentials,
    Principal,
    SecretFileError,
    read_secret_file,
)
from ledgermq.wire.codec import DEFAULT_MAX_FRAME_BYTES
from ledgermq.wire.tls import client_context, server_context

log = logging.getLogger(__name__)



class NameServerConfigError(ValueError):
    """A refused start: an unreadable secret file, bad TLS files, or running
    open off loopback without `allow_open`."""


class ClusterKey:
    """The NameServer's KeyStore: the cluster key and nothing else (users
    are the brokers' business; they read routes anonymously)."""

    def __init__(self, secret: bytes) -> None:
        self.secret = secret

    def lookup(self, access_key: str) -> tuple[bytes, Principal] | None:
        return (self.secret, CLUSTER_MEMBER) if access_key == CLUSTER_KEY else None


@dataclass(frozen=True)
class NameServerSecurity:
    cluster_secret: bytes | None = None
    tls: ssl.SSLContext | None = None  # served on the client port
    broker_tls: ssl.SSLContext | None = None  # verifies brokers (the admin app's queries)

    @property
    def credentials(self) -> Credentials | None:
        """What this NameServer proves cluster membership with to brokers."""
        if self.cluster_secret is None:
            return None
        return Credentials(CLUSTER_KEY, self.cluster_secret)


def load_security(listen: Mapping[str, str], *, cluster_secret_file: str = "",
                  allow_open: bool = False, tls_cert_file: str = "", tls_key_file: str = "",
                  tls_ca_file: str = "") -> NameServerSecurity:
    """Read the secret and TLS files and apply the start-up rule to the
    `listen` addresses (what -> HOST:PORT); NameServerConfigError if refused."""
    secret = None
    if cluster_secret_file:
        try:
            secret = read_secret_file(cluster_secret_file)
        except SecretFileError as exc:
            raise NameServerConfigError(f"--cluster-secret-file: {exc}") from None
    try:
        hosts = {what: split_host_port(address)[0] for what, address in listen.items()}
        check_exposure(hosts, authenticated=secret is not None, allow_open=allow_open,
                       remedy="give --cluster-secret-file (docs/security.md), or --allow-open "
                              "to run open on purpose")
    except (AddressError, ExposureError) as exc:
        raise NameServerConfigError(str(exc)) from None
    if bool(tls_cert_file) != bool(tls_key_file):
        raise NameServerConfigError("--tls-cert-file and --tls-key-file are given together")
    try:
        tls = server_context(tls_cert_file, tls_key_file) if tls_cert_file else None
        broker_tls = client_context(tls_ca_file) if tls_ca_file else None
    except (OSError, ssl.SSLError) as exc:
        raise NameServerConfigError(f"TLS files: {exc}") from None
    return NameServerSecurity(secret, tls, broker_tls)


class NameServer:
    """One NameServer: `await start(host, port)`, later `await close()`."""

    def __init__(
        self,
        *,
        expiry_ms: int = DEFAULT_EXPIRY_MS,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        security: NameServerSecurity | None = None,
    ) -> None:
        self.registry = RouteRegistry(expiry_ms)
        self.security = security or NameServerSecurity()
        secret = self.security.cluster_secret
        # Sweep several times per expiry period so a dead broker leaves the
        # routes within about expiry_ms * 1.25, but not more often than needed.
        self.sweep_interval = max(0.01, min(1.0, expiry_ms / 4000))
        self.rpc = RpcServer(
            "namesrv",
            {
                RequestCode.REGISTER_BROKER: self._register,
                RequestCode.BROKER_HEARTBEAT: self._heartbeat,
                RequestCode.UNREGISTER_BROKER: self._unregister,
                RequestCode.GET_ROUTE: self._get_route,
                RequestCode.GET_CLUSTER: self._get_cluster,
            },
            max_frame_bytes=max_frame_bytes,
            # Anonymous clients keep reading routes; the handlers of the
            # broker-only requests check the principal.
            key_store=ClusterKey(secret) if secret is not None else None,
            ssl=self.security.tls,
        )
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int) -> tuple[str, int]:
        address = await self.rpc.start(host, port)
        self._sweeper = asyncio.create_task(self._sweep())
        return address

    async def close(self) -> None:
        if self._sweeper is not None:
            await cancel_and_wait([self._sweeper])
        await self.rpc.close()

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_interval)
            for group, node_id in self.registry.expire(monotonic_ms()):
                log.info("expired broker %s/%s", group, node_id)

    # ---------------------------------------------------------------- handlers

    def _require_member(self, conn: Connection, what: str) -> None:
        """Broker-only requests: refused, before the registry sees them,
        unless the connection proved the cluster secret."""
        if self.security.cluster_secret is None:
            return
        principal = conn.principal
        if principal is not None and principal.cluster_member:
            return
        self.rpc.auth_failures["not_member"] += 1
        log.warning("refused %s from %s (%s): not authenticated as a cluster member",
                    what, conn.peer, principal.name if principal else "unauthenticated")
        raise NoPermissionError(f"{what} needs a connection authenticated with the cluster "
                                f"secret (AUTH with access key {CLUSTER_KEY!r})")

    async def _register(self, body: Any, conn: Connection) -> dict[str, Any]:
        self._require_member(conn, "REGISTER_BROKER")
        reg = BrokerRegistration.from_wire(body)
        result = self.registry.register(reg, monotonic_ms())
        if result.stale:
            log.info(
                "stale registration from %s/%s (%s, term %d); leader is %s at term %d",
                reg.group,
                reg.node_id,
                reg.role.value,
                reg.term,
                result.leader,
                result.leader_term,
            )
        return result.to_wire()

    async def _heartbeat(self, body: Any, conn: Connection) -> dict[str, Any]:
        self._require_member(conn, "BROKER_HEARTBEAT")
        group, node_id = _node_key(body)
        if not self.registry.heartbeat(group, node_id, monotonic_ms()):
            raise UnknownBrokerError(
                f"broker {group}/{node_id} is not registered here; register again",
                data={"group": group, "node_id": node_id},
            )
        return {}

    async def _unregister(self, body: Any, conn: Connection) -> dict[str, Any]:
        self._require_member(conn, "UNREGISTER_BROKER")
        group, node_id = _node_key(body)
        return {"removed": self.registry.unregister(group, node_id)}

    async def _get_route(self, body: Any, conn: Connection) -> dict[str, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("topic"), str):
            raise InvalidRequestError("GET_ROUTE body must be {topic: str}")
        return self.registry.route(body["topic"])

    async def _get_cluster(self, body: Any, conn: Connection) -> dict[str, Any]:
        return self.registry.cluster(monotonic_ms())


def _node_key(body: Any) -> tuple[str, str]:
    if (
        not isinstance(body, dict)
        or not isinstance(body.get("group"), str)
        or not isinstance(body.get("node_id"), str)
    ):
        raise InvalidRequestError("body must be {group: str, node_id: str}")
    return body["group"], body["node_id"]


async def serve(
    host: str,
    port: int,
    *,
    expiry_ms: int = DEFAULT_EXPIRY_MS,
    stop: asyncio.Event,
    on_ready: Any = None,
    admin_listen: str = "",
    admin_security: AdminSecurity | None = None,
    reports_dir: str = "",
    on_admin_ready: Any = None,
    security: NameServerSecurity | None = None,
    audit_stale_after_s: float = DEFAULT_STALE_AFTER_S,
) -> None:
    """Run a NameServer until `stop` is set; `on_ready(host, port)` is called
    once it is listening. With `admin_listen`, the HTTP admin app
    (namesrv/admin_http.py) runs too, authenticating as `admin_security`
    says, and `on_admin_ready(url)` is called. `security`: the client port's,
    from `load_security` (default: open). `audit_stale_after_s`: when the
    audit's latest verdict in `reports_dir` counts as stale."""
    server = NameServer(expiry_ms=expiry_ms, security=security)
    bound = await server.start(host, port)
    admin = None
    try:
        if admin_listen:
            admin = NameServerAdmin(server, admin_listen, reports_dir=reports_dir,
                                    security=admin_security,
                                    wire_tls=server.security.broker_tls,
                                    audit_stale_after_s=audit_stale_after_s)
            url = await admin.start()
            if on_admin_ready is not None:
                on_admin_ready(url)
        if on_ready is not None:
            on_ready(*bound)
        await stop.wait()
    finally:
        if admin is not None:
            await admin.close()
        await server.close()
