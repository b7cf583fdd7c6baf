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
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ledgermq.base.clock import monotonic_ms
from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import InvalidRequestError, UnknownBrokerError
from ledgermq.base.tasks import cancel_and_wait
from ledgermq.namesrv.admin_http import AdminSecurity, NameServerAdmin
from ledgermq.namesrv.registry import DEFAULT_EXPIRY_MS, BrokerRegistration, RouteRegistry
from ledgermq.wire import Connection, RpcServer
from ledgermq.wire.codec import DEFAULT_MAX_FRAME_BYTES

log = logging.getLogger(__name__)


class NameServer:
    """One NameServer: `await start(host, port)`, later `await close()`."""

    def __init__(
        self,
        *,
        expiry_ms: int = DEFAULT_EXPIRY_MS,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        self.registry = RouteRegistry(expiry_ms)
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

    async def _register(self, body: Any, conn: Connection) -> dict[str, Any]:
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
        group, node_id = _node_key(body)
        if not self.registry.heartbeat(group, node_id, monotonic_ms()):
            raise UnknownBrokerError(
                f"broker {group}/{node_id} is not registered here; register again",
                data={"group": group, "node_id": node_id},
            )
        return {}

    async def _unregister(self, body: Any, conn: Connection) -> dict[str, Any]:
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
) -> None:
    """Run a NameServer until `stop` is set; `on_ready(host, port)` is called
    once it is listening. With `admin_listen`, the HTTP admin app
    (namesrv/admin_http.py) runs too, authenticating as `admin_security`
    says, and `on_admin_ready(url)` is called."""
    server = NameServer(expiry_ms=expiry_ms)
    bound = await server.start(host, port)
    admin = None
    try:
        if admin_listen:
            admin = NameServerAdmin(server, admin_listen, reports_dir=reports_dir,
                                    security=admin_security)
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
