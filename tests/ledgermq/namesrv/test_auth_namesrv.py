"""The NameServer with a cluster secret, in process over real sockets:
brokers register only with the cluster key, clients read routes
anonymously, refusals are counted in /metrics; a broker's registrar with a
cluster secret will not register with a NameServer that cannot prove it."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from prometheus_client import generate_latest

from ledgermq.base import loop
from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import NoPermissionError, UnauthenticatedError
from ledgermq.broker.registrar import Registrar
from ledgermq.namesrv.metrics import namesrv_registry
from ledgermq.namesrv.server import NameServer, NameServerSecurity
from ledgermq.wire import RpcClient
from ledgermq.wire.auth import CLUSTER_KEY, Credentials

SECRET = b"c" * 32
MEMBER = Credentials(CLUSTER_KEY, SECRET)


def registration(node: str = "n1", role: str = "leader", term: int = 3) -> dict[str, Any]:
    return {"cluster": "c", "group": "g", "node_id": node, "address": "127.0.0.1:20001",
            "role": role, "term": term, "topics": {"t": {"queues": 2, "perm": 6}}}


def test_only_cluster_members_register_and_anyone_reads_routes() -> None:
    async def main() -> None:
        ns = NameServer(security=NameServerSecurity(cluster_secret=SECRET))
        registry = namesrv_registry(ns)
        host, port = await ns.start("127.0.0.1", 0)
        try:
            async with await RpcClient.connect(host, port, role="broker", name="g/n1",
                                               credentials=MEMBER) as member:
                await member.request(RequestCode.REGISTER_BROKER, registration())
                assert await member.request(RequestCode.BROKER_HEARTBEAT,
                                            {"group": "g", "node_id": "n1"}) == {}
            async with await RpcClient.connect(host, port) as anonymous:
                route = await anonymous.request(RequestCode.GET_ROUTE, {"topic": "t"})
                assert route["groups"][0]["leader"]["node_id"] == "n1"
                for code, body in ((RequestCode.REGISTER_BROKER, registration("n9", term=10**12)),
                                   (RequestCode.UNREGISTER_BROKER, {"group": "g", "node_id": "n1"}),
                                   (RequestCode.BROKER_HEARTBEAT, {"group": "g", "node_id": "n1"})):
                    with pytest.raises(NoPermissionError, match="cluster secret"):
                        await anonymous.request(code, body)
                # Refused, not disconnected: it may go on reading routes.
                assert await anonymous.request(RequestCode.GET_ROUTE, {"topic": "t"}) == route
            # A user's access key is unknown here: the NameServer knows only the cluster key.
            with pytest.raises(UnauthenticatedError):
                await RpcClient.connect(host, port, credentials=Credentials("admin", SECRET))
        finally:
            await ns.close()
        text = generate_latest(registry).decode()
        assert 'ledgermq_auth_failures_total{port="client",reason="not_member"} 3.0' in text
        assert 'ledgermq_auth_failures_total{port="client",reason="unknown_key"} 1.0' in text

    loop.run(main())


def test_a_registrar_with_the_cluster_key_refuses_an_open_namesrv(
        caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> tuple[int, int]:
        open_ns = NameServer()
        secured = NameServer(security=NameServerSecurity(cluster_secret=SECRET))
        a = await open_ns.start("127.0.0.1", 0)
        b = await secured.start("127.0.0.1", 0)
        registrar = Registrar((f"{a[0]}:{a[1]}", f"{b[0]}:{b[1]}"), registration, 0.05,
                              "g/n1", credentials=MEMBER)
        registrar.start()
        try:
            for _ in range(200):
                if secured.registry.cluster(0)["groups"]:
                    break
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.2)
        finally:
            await registrar.stop()
            groups = (len(secured.registry.cluster(0)["groups"]),
                      len(open_ns.registry.cluster(0)["groups"]))
            await open_ns.close()
            await secured.close()
        return groups

    with caplog.at_level(logging.WARNING, logger="ledgermq.broker.registrar"):
        assert loop.run(main()) == (1, 0)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "offers no authentication" in warnings[0]
