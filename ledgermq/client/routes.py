"""Routes from the NameServers, broker connections, and leader hints.

`Cluster` is what producers and consumers share: it asks any NameServer for a
topic's route (which broker groups serve it, their queue counts and who leads
each), keeps one connection per broker address, and remembers the leader a
NOT_LEADER answer named, so the next request goes straight there instead of
waiting for the NameServer to learn about the new leader.

Security (docs/security.md): with `credentials` every broker connection
authenticates (AUTH) and checks the broker's proof in return, so a broker
that does not know the secret — an impostor a forged route pointed at — is
refused with UnauthenticatedError. NameServers only know the cluster key, so
routes are read anonymously (their authenticity does not matter: a route to
an impostor ends at that check). `tls`: every connection, NameServers and
brokers, uses TLS and verifies the server's certificate.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from dataclasses import dataclass, field
from typing import Any

from ledgermq.base.address import split_host_port
from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import (
    ConnectionClosedError,
    LedgerMQError,
    RequestTimeoutError,
    UnknownTopicError,
)
from ledgermq.client.model import MessageQueue
from ledgermq.wire import RpcClient
from ledgermq.wire.auth import Credentials

log = logging.getLogger(__name__)

PERM_READ = 4
PERM_WRITE = 2

# Errors after which the same request may succeed elsewhere or later.
RETRIABLE = (ConnectionClosedError, ConnectionError, OSError, RequestTimeoutError)
SUSPECT_SECONDS = 2.0


@dataclass
class GroupRoute:
    group: str
    queues: int
    perm: int
    leader: str | None
    nodes: list[str] = field(default_factory=list)


class Cluster:
    """NameServer lookups and broker connections for one client."""

    def __init__(self, namesrv: list[str] | tuple[str, ...], *, name: str = "client",
                 timeout: float = 3.0, route_ttl: float = 5.0,
                 credentials: Credentials | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        if not namesrv:
            raise ValueError("at least one NameServer address is required")
        self.namesrv = list(namesrv)
        self.credentials = credentials
        self.tls = tls
        self.name = name
        self.timeout = timeout
        self.route_ttl = route_ttl
        self._routes: dict[str, tuple[float, list[GroupRoute]]] = {}
        self._hints: dict[str, str] = {}
        self._conns: dict[str, RpcClient] = {}
        self._connecting: dict[str, asyncio.Future[RpcClient]] = {}
        self._ns_next = 0
        # Addresses that just failed (connection refused, reset, timed out):
        # skipped for a moment when choosing where writes go, so a dead
        # leader's followers are asked instead and answer with the new leader.
        self._suspects: dict[str, float] = {}

    # ------------------------------------------------------------ connections

    async def connection(self, address: str) -> RpcClient:
        conn = self._conns.get(address)
        if conn is not None and not conn.closed:
            return conn
        pending = self._connecting.get(address)
        if pending is None:
            host, port = split_host_port(address)
            pending = asyncio.ensure_future(
                RpcClient.connect(host, port, role="client", name=self.name,
                                  timeout=self.timeout, ssl=self.tls,
                                  credentials=(None if address in self.namesrv
                                               else self.credentials)))
            self._connecting[address] = pending

            def settled(future: asyncio.Future[RpcClient], address: str = address) -> None:
                self._connecting.pop(address, None)
                if not future.cancelled():
                    # Observe a failure here: every waiter may have given up
                    # (timed out) before the connect failed, and asyncio would
                    # then log "exception was never retrieved".
                    future.exception()

            pending.add_done_callback(settled)
        conn = await asyncio.shield(pending)
        self._conns[address] = conn
        return conn

    async def request(self, address: str, code: int, body: Any = None,
                      timeout: float | None = None) -> Any:
        """One request to a broker; a broken connection is dropped for next time."""
        try:
            conn = await self.connection(address)
            return await conn.request(code, body, timeout=timeout or self.timeout)
        except RETRIABLE:
            self._suspects[address] = time.monotonic() + SUSPECT_SECONDS
            await self.drop(address)
            raise

    async def drop(self, address: str) -> None:
        conn = self._conns.pop(address, None)
        if conn is not None:
            await conn.close()

    async def close(self) -> None:
        for address in list(self._conns):
            await self.drop(address)

    # ---------------------------------------------------------------- routes

    async def namesrv_request(self, code: int, body: Any) -> Any:
        """Ask the NameServers in turn; the first answer (or typed error) wins."""
        last: BaseException | None = None
        for _ in range(len(self.namesrv)):
            address = self.namesrv[self._ns_next % len(self.namesrv)]
            try:
                return await self.request(address, code, body)
            except RETRIABLE as exc:
                last = exc
                self._ns_next += 1
        raise ConnectionClosedError(f"no NameServer reachable: {last}")

    async def route(self, topic: str, refresh: bool = False) -> list[GroupRoute]:
        cached = self._routes.get(topic)
        if cached is not None and not refresh and time.monotonic() - cached[0] < self.route_ttl:
            return cached[1]
        raw = await self.namesrv_request(RequestCode.GET_ROUTE, {"topic": topic})
        groups = []
        for g in raw.get("groups", []):
            leader = g.get("leader")
            groups.append(GroupRoute(
                g["group"], int(g["queues"]), int(g.get("perm", 6)),
                leader["address"] if leader else None,
                [n["address"] for n in g.get("nodes", [])]))
            if leader:
                # A fresher NameServer view replaces an older hint.
                self._hints.pop(g["group"], None)
        self._routes[topic] = (time.monotonic(), groups)
        return groups

    def cached_route(self, topic: str, now: float) -> list[GroupRoute] | None:
        """The cached route if still fresh at `now` (time.monotonic()), else None:
        lets a producer pick a queue without awaiting anything."""
        cached = self._routes.get(topic)
        if cached is not None and now - cached[0] < self.route_ttl:
            return cached[1]
        return None

    async def try_route(self, topic: str, refresh: bool = False) -> list[GroupRoute]:
        with contextlib.suppress(UnknownTopicError):
            return await self.route(topic, refresh)
        return []

    async def any_group(self) -> list[GroupRoute]:
        """Every broker group the NameServers know (for topics not routed yet)."""
        raw = await self.namesrv_request(RequestCode.GET_CLUSTER, None)
        groups = []
        for name, g in sorted(raw.get("groups", {}).items()):
            nodes = [n["address"] for n in g.get("nodes", [])]
            leader = next((n["address"] for n in g.get("nodes", [])
                           if n.get("node_id") == g.get("leader")), None)
            groups.append(GroupRoute(name, 1, 6, leader, nodes))
        return groups

    async def queues(self, topic: str, perm: int = PERM_READ,
                     refresh: bool = False) -> list[MessageQueue]:
        groups = await self.route(topic, refresh)
        return [MessageQueue(topic, g.group, q) for g in groups if g.perm & perm
                for q in range(g.queues)]

    def group_route(self, topic: str, group: str) -> GroupRoute | None:
        cached = self._routes.get(topic)
        if cached is None:
            return None
        return next((g for g in cached[1] if g.group == group), None)

    def note_leader(self, group: str, address: str | None) -> None:
        if address:
            self._hints[group] = address

    def is_suspect(self, address: str) -> bool:
        return self._suspects.get(address, 0) >= time.monotonic()

    def failed_since(self, address: str, since: float) -> bool:
        """Whether `address` failed at or after `since` (time.monotonic()) and
        is still suspect."""
        until = self._suspects.get(address, 0.0)
        return until >= time.monotonic() and until - SUSPECT_SECONDS >= since

    def trust_leader(self, group: str, address: str) -> None:
        """A node named `address` the group's leader: write there next, even
        if it failed a while ago (a node restarted since, then elected)."""
        self._suspects.pop(address, None)
        self._hints[group] = address

    def forget_leader(self, group: str) -> None:
        self._hints.pop(group, None)

    def leader_address(self, route: GroupRoute, attempt: int = 0) -> str:
        """Where writes for the group go: the hint, the route's leader, or (no
        leader known) the nodes in turn, which answer NOT_LEADER with a hint."""
        suspects = self._suspects
        if not suspects:  # the common case: nothing failed lately
            known = self._hints.get(route.group) or route.leader
            if known:
                return known
        now = time.monotonic()
        for address in [a for a, until in suspects.items() if until < now]:
            del suspects[address]  # expired: keeps the common case above common
        for known in (self._hints.get(route.group), route.leader):
            if known and suspects.get(known, 0) < now:
                return known
        if not route.nodes:
            raise LedgerMQError(f"group {route.group} has no known nodes")
        healthy = [n for n in route.nodes if self._suspects.get(n, 0) < now] or route.nodes
        return healthy[attempt % len(healthy)]

    def read_addresses(self, route: GroupRoute) -> list[str]:
        """Nodes to read from, the leader first (freshest), then the others."""
        first = self._hints.get(route.group) or route.leader
        rest = [n for n in route.nodes if n != first]
        return ([first] if first else []) + rest
